"""One classic Kafka consumer group as the group coordinator (groups.py) keeps it: its members
with their parked answers, its state and generation, and the document the group log
(group_log.py) stores.  No I/O; the document's keys are what the log holds."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from txbroker.service.kafka.group_log import b64, unb64
from txbroker.service.kafka.group_state import GroupState, move


@dataclass(eq=False)
class Member:
    member_id: str
    client_id: str
    group_instance_id: str | None
    session_timeout: float            # seconds
    rebalance_timeout: float          # seconds
    protocols: list[tuple[str, bytes]]
    last_seen: float
    assignment: bytes = b""
    client_host: str = ""
    #: The parked JoinGroup / SyncGroup answer, while one is awaited.
    join: asyncio.Future | None = None
    sync: asyncio.Future | None = None

    def awaiting_join(self) -> bool:
        return self.join is not None and not self.join.done()

    def awaiting_sync(self) -> bool:
        return self.sync is not None and not self.sync.done()


@dataclass(eq=False)
class Group:
    group_id: str
    #: Changed through :meth:`move_to` only (the transition table).
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    #: Members in the order they joined (the first one left becomes the leader).
    members: dict[str, Member] = field(default_factory=dict)
    #: Member ids handed out with MEMBER_ID_REQUIRED -> the time they lapse if not used.
    pending: dict[str, float] = field(default_factory=dict)
    #: PreparingRebalance: the join phase ends at ``join_deadline`` at the latest, and not
    #: before ``initial_until`` (the initial delay of a group that was empty).
    join_deadline: float = 0.0
    initial_until: float | None = None
    #: When the group entered its state (clock seconds): an Empty group's offsets expire
    #: ``kafka_offsets_retention`` after it.
    state_since: float = 0.0
    #: A record of the group exists in the log (its removal needs a tombstone).
    persisted: bool = False
    #: The generation whose assignment is being written (the leader's SyncGroup arrived).
    storing: int = -1

    def move_to(self, target: GroupState) -> None:
        """Enter ``target``; a move the table does not allow raises GroupTransitionError."""
        self.state = move(self.state, target)

    def static_member(self, instance_id: str) -> Member | None:
        for m in self.members.values():
            if m.group_instance_id == instance_id:
                return m
        return None

    def doc(self) -> dict:
        """The durable record of the group (group_log.py): what a loaded group needs."""
        proto = self.protocol_name
        return {"group": self.group_id, "generation": self.generation,
                "protocol_type": self.protocol_type, "protocol": proto, "leader": self.leader,
                "state_since": self.state_since,
                "members": [{"id": m.member_id, "instance": m.group_instance_id,
                             "client_id": m.client_id, "client_host": m.client_host,
                             "session": m.session_timeout, "rebalance": m.rebalance_timeout,
                             "metadata": b64(dict(m.protocols).get(proto or "", b"")),
                             "assignment": b64(m.assignment)}
                            for m in self.members.values()]}

    @classmethod
    def from_doc(cls, doc: dict, now: float) -> Group:
        """A loaded group: Stable with its members (each with a whole session timeout from
        ``now``, as Kafka schedules them on load), or Empty."""
        g = cls(doc["group"], generation=doc["generation"], protocol_type=doc["protocol_type"],
                protocol_name=doc["protocol"], leader=doc["leader"],
                state_since=doc["state_since"], persisted=True)
        for d in doc["members"]:
            g.members[d["id"]] = Member(
                d["id"], d["client_id"], d["instance"], d["session"], d["rebalance"],
                [(doc["protocol"], unb64(d["metadata"]))], now,
                assignment=unb64(d["assignment"]), client_host=d["client_host"])
        g.state = GroupState.STABLE if g.members else GroupState.EMPTY
        if not g.members:
            g.protocol_name = g.leader = None
        return g

    def common_protocols(self) -> set[str]:
        """Protocol names every member supports."""
        names: set[str] | None = None
        for m in self.members.values():
            mine = {name for name, _ in m.protocols}
            names = mine if names is None else names & mine
        return names or set()
