"""Kafka's classic consumer-group coordinator: join, sync, heartbeat, leave, session expiry.

One :class:`Group` per group id walks Kafka's states (docs/kafka.md, "Consumer groups"):
Empty -> PreparingRebalance (members (re)join; JoinGroup answers are parked) ->
CompletingRebalance (generation + 1, protocol chosen, the leader got the member list; SyncGroup
answers are parked until the leader's assignment arrives) -> Stable.  Parked answers are futures
the handlers await; closing the coordinator resolves them with COORDINATOR_NOT_AVAILABLE.

Time comes from the injected ``clock`` only: every deadline (session timeouts, rebalance
timeouts, the initial rebalance delay, pending member ids) is checked by :meth:`tick`, which the
coordinator's task runs whenever the next deadline is due.  Unit tests call ``tick()`` after
moving a manual clock, with no task and no sleeping.

Group state is memory only: after a restart consumers rejoin (offsets are in the store)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.metrics import BrokerMetrics

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"

log = logging.getLogger(__name__)

#: The longest the timer task sleeps without looking at its deadlines (a safety net only:
#: every change that moves a deadline closer wakes it).
_MAX_SLEEP = 1.0


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
    state: str = EMPTY
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

    def common_protocols(self) -> set[str]:
        """Protocol names every member supports."""
        names: set[str] | None = None
        for m in self.members.values():
            mine = {name for name, _ in m.protocols}
            names = mine if names is None else names & mine
        return names or set()


def _error(code: ErrorCode, member_id: str = "") -> dict:
    """A JoinGroup answer carrying only an error."""
    return {"error_code": code, "generation_id": -1, "protocol_name": "", "leader": "",
            "member_id": member_id, "members": []}


class GroupCoordinator:
    """Every classic consumer group of this broker.  Used from the event loop only."""

    def __init__(self, config: BrokerConfig, metrics: BrokerMetrics, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.groups: dict[str, Group] = {}
        self._closed = False
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kafka-groups")

    async def close(self) -> None:
        """Stop the timer task; every parked answer gets COORDINATOR_NOT_AVAILABLE."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for group in self.groups.values():
            group.state = DEAD
            for m in group.members.values():
                self._resolve(m.join, _error(ErrorCode.COORDINATOR_NOT_AVAILABLE, m.member_id))
                self._resolve(m.sync, {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE})
        self._gauge()

    async def _run(self) -> None:
        while True:
            due = self.next_deadline()
            delay = _MAX_SLEEP if due is None else min(_MAX_SLEEP, max(0.0, due - self.clock()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()
            try:
                self.tick()
            except Exception:           # a bug in one pass must not stop every later deadline
                log.exception("kafka group deadlines: tick failed")

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`tick` has something to do."""
        times: list[float] = []
        for g in self.groups.values():
            times.extend(g.pending.values())
            if g.state == PREPARING:
                times.append(g.initial_until if g.initial_until is not None else g.join_deadline)
            times.extend(m.last_seen + m.session_timeout for m in g.members.values()
                         if not (m.awaiting_join() or m.awaiting_sync()))
        return min(times, default=None)

    def tick(self) -> None:
        """Apply every deadline that has passed: pending member ids and silent members lapse
        (a rebalance starts), join phases whose time is up complete."""
        now = self.clock()
        for g in list(self.groups.values()):
            if g.state == DEAD:
                continue
            for mid, until in list(g.pending.items()):
                if now >= until:
                    del g.pending[mid]
            for m in list(g.members.values()):
                if (not (m.awaiting_join() or m.awaiting_sync())
                        and now >= m.last_seen + m.session_timeout):
                    self._remove(g, m, ErrorCode.UNKNOWN_MEMBER_ID)
            self._maybe_complete_join(g)
        self._gauge()

    # --- JoinGroup ------------------------------------------------------------------------
    async def join(self, group_id: str, member_id: str, *, client_id: str, api_version: int,
                   session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]],
                   group_instance_id: str | None = None) -> dict:
        """A JoinGroup answer (snake_case JoinGroup response fields), awaited until the join
        phase completes when the member is parked."""
        result = self._join(group_id, member_id, client_id, api_version, session_timeout_ms,
                            rebalance_timeout_ms, protocol_type, protocols, group_instance_id)
        self._gauge()
        self._wake.set()
        return await result if isinstance(result, asyncio.Future) else result

    def _join(self, group_id: str, member_id: str, client_id: str, api_version: int,
              session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
              protocols: list[tuple[str, bytes]],
              group_instance_id: str | None) -> dict | asyncio.Future:
        if not group_id:
            return _error(ErrorCode.INVALID_GROUP_ID, member_id)
        session = session_timeout_ms / 1000
        if not (self.config.kafka_group_min_session_timeout <= session
                <= self.config.kafka_group_max_session_timeout):
            return _error(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        if self._closed:
            return _error(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        if not self._protocols_fit(group, protocol_type, protocols):
            return _error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        now = self.clock()
        # rebalance timeout: -1 from old clients means "the session timeout"
        rebalance = rebalance_timeout_ms / 1000 if rebalance_timeout_ms > 0 else session
        if not member_id:
            member_id = f"{group_instance_id or client_id}-{uuid.uuid4()}"
            if api_version >= 4:
                group.pending[member_id] = now + session
                return _error(ErrorCode.MEMBER_ID_REQUIRED, member_id)
        elif member_id in group.pending:
            del group.pending[member_id]
        elif member_id not in group.members:
            return _error(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        else:
            return self._rejoin(group, group.members[member_id], protocols, session, rebalance)
        group.protocol_type = protocol_type
        member = Member(member_id, client_id, group_instance_id, session, rebalance,
                        list(protocols), now)
        group.members[member_id] = member
        member.join = asyncio.get_running_loop().create_future()
        if group.state == PREPARING:
            if group.initial_until is not None:
                group.initial_until = min(now + self.config.kafka_group_initial_rebalance_delay,
                                          group.join_deadline)
            self._maybe_complete_join(group)
        else:
            self._prepare_rebalance(group)
        return member.join

    def _rejoin(self, group: Group, member: Member, protocols: list[tuple[str, bytes]],
                session: float, rebalance: float) -> dict | asyncio.Future:
        """A known member's JoinGroup: answered from the current generation when nothing
        changed (a retry, or a follower of a stable group), else it (re)starts a rebalance."""
        member.last_seen = self.clock()
        unchanged = list(protocols) == member.protocols
        member.protocols = list(protocols)
        member.session_timeout, member.rebalance_timeout = session, rebalance
        if unchanged and (group.state == COMPLETING
                          or (group.state == STABLE and member.member_id != group.leader)):
            return self._join_answer(group, member)
        if member.awaiting_join():       # a duplicate JoinGroup: the newer one is answered
            self._resolve(member.join, _error(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        member.join = asyncio.get_running_loop().create_future()
        if group.state == PREPARING:
            self._maybe_complete_join(group)
        else:
            self._prepare_rebalance(group)
        return member.join

    @staticmethod
    def _protocols_fit(group: Group, protocol_type: str,
                       protocols: list[tuple[str, bytes]]) -> bool:
        if not protocol_type or not protocols:
            return False
        if not group.members:
            return True
        return (protocol_type == group.protocol_type
                and bool(group.common_protocols() & {name for name, _ in protocols}))

    # --- the rebalance --------------------------------------------------------------------
    def _prepare_rebalance(self, group: Group) -> None:
        """Enter PreparingRebalance: parked syncs learn of it, and members have until the
        longest rebalance timeout to rejoin (a group that was empty first waits the initial
        delay for more members)."""
        for m in group.members.values():
            self._resolve(m.sync, {"error_code": ErrorCode.REBALANCE_IN_PROGRESS})
            m.assignment = b""
        now = self.clock()
        was_empty = group.state == EMPTY
        group.state = PREPARING
        group.join_deadline = now + max((m.rebalance_timeout for m in group.members.values()),
                                        default=0.0)
        group.initial_until = None
        if was_empty:
            group.initial_until = min(now + self.config.kafka_group_initial_rebalance_delay,
                                      group.join_deadline)
        self._maybe_complete_join(group)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state != PREPARING:
            return
        now = self.clock()
        if group.members:
            if group.initial_until is not None:
                if now < group.initial_until:
                    return
                group.initial_until = None
            all_joined = (not group.pending
                          and all(m.awaiting_join() for m in group.members.values()))
            if not all_joined and now < group.join_deadline:
                return
        elif group.pending and now < group.join_deadline:
            return
        self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """End the join phase: members that did not rejoin are dropped, the generation moves
        on, the protocol is chosen and every parked JoinGroup is answered."""
        for m in list(group.members.values()):
            if not m.awaiting_join():
                del group.members[m.member_id]
                self._resolve(m.sync, {"error_code": ErrorCode.UNKNOWN_MEMBER_ID})
        group.generation += 1
        group.initial_until = None
        if not group.members:
            group.state, group.protocol_type, group.protocol_name, group.leader = (
                EMPTY, None, None, None)
            return
        group.state = COMPLETING
        group.protocol_name = self._select_protocol(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        now = self.clock()
        for m in group.members.values():
            m.last_seen = now
            self._resolve(m.join, self._join_answer(group, m))

    @staticmethod
    def _select_protocol(group: Group) -> str:
        """Kafka's choice: among the protocols every member supports, the one most members
        list first (a tie goes to the leader's, then the first member's, preference)."""
        common = group.common_protocols()
        votes = Counter(next(n for n, _ in m.protocols if n in common)
                        for m in group.members.values())
        first = group.members.get(group.leader or "") or next(iter(group.members.values()))
        order = [n for n, _ in first.protocols if n in common]
        return max(order, key=lambda n: (votes[n], -order.index(n)))

    def _join_answer(self, group: Group, member: Member) -> dict:
        members = []
        if member.member_id == group.leader:
            members = [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                        "metadata": dict(m.protocols)[group.protocol_name]}
                       for m in group.members.values()]
        return {"error_code": ErrorCode.NONE, "generation_id": group.generation,
                "protocol_name": group.protocol_name, "leader": group.leader,
                "member_id": member.member_id, "members": members}

    # --- SyncGroup, Heartbeat, LeaveGroup ---------------------------------------------------
    def _check_member(self, group_id: str, generation_id: int,
                      member_id: str) -> tuple[ErrorCode, Group | None, Member | None]:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, None, None
        if group.state == DEAD or self._closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, group, None
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, group, None
        if generation_id != group.generation:
            return ErrorCode.ILLEGAL_GENERATION, group, member
        return ErrorCode.NONE, group, member

    async def sync(self, group_id: str, generation_id: int, member_id: str,
                   assignments: list[tuple[str, bytes]]) -> dict:
        """A SyncGroup answer (``error_code``, ``assignment``); a member's answer waits for
        the leader's assignment while the group is CompletingRebalance."""
        result = self._sync(group_id, generation_id, member_id, assignments)
        self._wake.set()
        return await result if isinstance(result, asyncio.Future) else result

    def _sync(self, group_id: str, generation_id: int, member_id: str,
              assignments: list[tuple[str, bytes]]) -> dict | asyncio.Future:
        err, group, member = self._check_member(group_id, generation_id, member_id)
        if err != ErrorCode.NONE:
            return {"error_code": err}
        assert group is not None and member is not None
        member.last_seen = self.clock()
        if group.state == PREPARING:
            return {"error_code": ErrorCode.REBALANCE_IN_PROGRESS}
        if group.state == STABLE:
            return {"error_code": ErrorCode.NONE, "assignment": member.assignment}
        if member.awaiting_sync():
            self._resolve(member.sync, {"error_code": ErrorCode.REBALANCE_IN_PROGRESS})
        member.sync = asyncio.get_running_loop().create_future()
        if member_id == group.leader:
            given = dict(assignments)
            now = self.clock()
            group.state = STABLE
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
                m.last_seen = now
                self._resolve(m.sync, {"error_code": ErrorCode.NONE, "assignment": m.assignment})
        return member.sync

    def heartbeat(self, group_id: str, generation_id: int, member_id: str) -> ErrorCode:
        err, group, member = self._check_member(group_id, generation_id, member_id)
        if err != ErrorCode.NONE:
            return err
        assert group is not None and member is not None
        member.last_seen = self.clock()
        if group.state == PREPARING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group_id: str, member_id: str) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.state == DEAD or self._closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group.pending.pop(member_id, None) is not None:
            self._maybe_complete_join(group)
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._remove(group, member, ErrorCode.UNKNOWN_MEMBER_ID)
        self._gauge()
        self._wake.set()
        return ErrorCode.NONE

    def _remove(self, group: Group, member: Member, code: ErrorCode) -> None:
        """Drop a member (left or expired); the others rebalance."""
        del group.members[member.member_id]
        self._resolve(member.join, _error(code, member.member_id))
        self._resolve(member.sync, {"error_code": code})
        if group.leader == member.member_id:
            group.leader = None
        if group.state in (STABLE, COMPLETING):
            self._prepare_rebalance(group)
        else:
            self._maybe_complete_join(group)

    # --- offsets ----------------------------------------------------------------------------
    def validate_commit(self, group_id: str, generation_id: int, member_id: str) -> ErrorCode:
        """May this member commit offsets for the group now?  Kafka's rules: generation -1 with
        no member id is a "simple" commit (manual assignment), allowed while no member is in
        the group; otherwise the member must be known, at the group's generation, and the
        group not waiting for its assignment."""
        group = self.groups.get(group_id)
        if self._closed or (group is not None and group.state == DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group is None:
            return ErrorCode.NONE if generation_id < 0 else ErrorCode.ILLEGAL_GENERATION
        if generation_id < 0 and not member_id:
            return ErrorCode.NONE if group.state == EMPTY else ErrorCode.UNKNOWN_MEMBER_ID
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state == COMPLETING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    # --- helpers -----------------------------------------------------------------------------
    @staticmethod
    def _resolve(fut: asyncio.Future | None, answer: dict) -> None:
        if fut is not None and not fut.done():
            fut.set_result(answer)

    def _gauge(self) -> None:
        self.metrics.kafka_groups.set(sum(1 for g in self.groups.values() if g.members))
