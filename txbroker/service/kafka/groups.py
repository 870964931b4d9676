"""Kafka's classic consumer-group coordinator: join, sync, heartbeat, leave, session expiry.

One :class:`~txbroker.service.kafka.group_record.Group` per group id walks Kafka's states
(docs/kafka.md, "Consumer groups"; the table is group_state.py, and a move it does not allow
raises):
Empty -> PreparingRebalance (members (re)join; JoinGroup answers are parked) ->
CompletingRebalance (generation + 1, protocol chosen, the leader got the member list; SyncGroup
answers are parked until the leader's assignment arrives) -> Stable.  Parked answers are futures
the handlers await; closing the coordinator resolves them with COORDINATOR_NOT_AVAILABLE.

Time comes from the injected ``clock`` only: every deadline (session timeouts, rebalance
timeouts, the initial rebalance delay, pending member ids) is checked by :meth:`tick`, which the
coordinator's task runs whenever the next deadline is due.  Unit tests call ``tick()`` after
moving a manual clock, with no task and no sleeping.

Group state is durable (``group_log.py``): a generation's members and assignment are written
when SyncGroup completes it, and a static member's new id, an emptied group and a deletion
too; a restarted broker (or a new master) loads them, so consumers go on heartbeating across
it.  A file over 450 lines because the transitions, their persistence points and the pruning
all read and change one ``Group`` and must be read together (the group and its document are
group_record.py, the states group_state.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.group_log import GroupLog
from txbroker.service.kafka.group_record import Group, Member
from txbroker.service.kafka.group_state import GroupState
from txbroker.service.metrics import BrokerMetrics
from txbroker.store.offsets import ConsumerOffsetStore, OffsetKey

EMPTY, PREPARING, COMPLETING = GroupState.EMPTY, GroupState.PREPARING, GroupState.COMPLETING
STABLE, DEAD = GroupState.STABLE, GroupState.DEAD

log = logging.getLogger(__name__)

#: The longest the timer task sleeps without looking at its deadlines (a safety net only:
#: every change that moves a deadline closer wakes it).
_MAX_SLEEP = 1.0


def _error(code: ErrorCode, member_id: str = "") -> dict:
    """A JoinGroup answer carrying only an error."""
    return {"error_code": code, "generation_id": -1, "protocol_name": "", "leader": "",
            "member_id": member_id, "members": []}


class GroupCoordinator:
    """Every classic consumer group of this broker.  Used from the event loop only."""

    def __init__(self, config: BrokerConfig, metrics: BrokerMetrics, *,
                 clock: Callable[[], float] = time.time, log: GroupLog | None = None,
                 offsets: ConsumerOffsetStore | None = None,
                 forget_offsets: Callable[[list[OffsetKey]], object] | None = None) -> None:
        """``log``: where group metadata is kept (None: memory only, the unit tests);
        ``offsets``: the offset table, for DeleteGroups and offset expiry;
        ``forget_offsets``: removes offsets through the offset log (the store's
        ``forget_offsets_now``, so a slave and a restart forget them too; None: in memory
        only, the unit tests)."""
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.log = log
        self.offsets = offsets
        self._forget_offsets = forget_offsets
        self.groups: dict[str, Group] = {}
        #: Coordinator of the groups: after :meth:`load` (at once without a log); a broker
        #: that is not the master answers NOT_COORDINATOR.
        self.active = log is None
        self._closed = False
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._next_prune = clock() + config.kafka_offsets_retention_check_interval

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        if self.log is not None:
            self.log.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kafka-groups")

    def load(self) -> int:
        """Become the groups' coordinator: every group as the log last recorded it (a broker
        start, or a broker that becomes the master).  A deleted group's offsets were removed
        through the offset log, which the store applied when it opened or replicated it.
        Returns the groups loaded."""
        self._drop_all(ErrorCode.NOT_COORDINATOR)
        now = self.clock()
        docs = self.log.replay() if self.log is not None else {}
        for gid, doc in docs.items():
            if "deleted" in doc:
                continue
            self.groups[gid] = Group.from_doc(doc, now)
        self.active = True
        self._gauge()
        self._wake.set()
        return len(self.groups)

    async def suspend(self) -> None:
        """No longer the master: every group is dropped from memory (the log keeps them) and
        requests are answered NOT_COORDINATOR until :meth:`load`."""
        self.active = False
        self._drop_all(ErrorCode.NOT_COORDINATOR)
        self._gauge()

    def _drop_all(self, code: ErrorCode) -> None:
        """Forget every group; parked answers get ``code``."""
        for group in self.groups.values():
            group.move_to(DEAD)
            for m in group.members.values():
                self._resolve(m.join, _error(code, m.member_id))
                self._resolve(m.sync, {"error_code": code})
        self.groups.clear()

    async def close(self) -> None:
        """Stop the timer task; every parked answer gets COORDINATOR_NOT_AVAILABLE."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for group in self.groups.values():
            group.move_to(DEAD)
            for m in group.members.values():
                self._resolve(m.join, _error(ErrorCode.COORDINATOR_NOT_AVAILABLE, m.member_id))
                self._resolve(m.sync, {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE})
        if self.log is not None:
            await self.log.close()
        self._gauge()

    async def _run(self) -> None:
        # ``_closed`` ends the loop too: Python 3.11's wait_for swallows a cancellation that
        # arrives as the event is set, so cancelling alone may not stop it
        while not self._closed:
            due = self.next_deadline()
            delay = _MAX_SLEEP if due is None else min(_MAX_SLEEP, max(0.0, due - self.clock()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()
            try:
                self.tick()
                if self.active and self.clock() >= self._next_prune:
                    self._next_prune = (self.clock()
                                        + self.config.kafka_offsets_retention_check_interval)
                    self.prune()
                if self.active and self.log is not None and self.log.snapshot_due(
                        len(self.groups)):
                    self.snapshot()
            except Exception:           # a bug in one pass must not stop every later deadline
                log.exception("kafka group deadlines: tick failed")

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`tick` has something to do."""
        times: list[float] = []
        for g in self.groups.values():
            times.extend(g.pending.values())
            if g.state is PREPARING:
                times.append(g.initial_until if g.initial_until is not None else g.join_deadline)
            times.extend(m.last_seen + m.session_timeout for m in g.members.values()
                         if not (m.awaiting_join() or m.awaiting_sync()))
        return min(times, default=None)

    def tick(self) -> None:
        """Apply every deadline that has passed: pending member ids and silent members lapse
        (a rebalance starts), join phases whose time is up complete."""
        now = self.clock()
        for g in list(self.groups.values()):
            if g.state is DEAD:
                continue
            for mid, until in list(g.pending.items()):
                if now >= until:
                    del g.pending[mid]
            for m in list(g.members.values()):
                if (not (m.awaiting_join() or m.awaiting_sync())
                        and now >= m.last_seen + m.session_timeout):
                    self._remove(g, m, ErrorCode.UNKNOWN_MEMBER_ID)
            self._maybe_complete_join(g)
            if g.state is EMPTY and not g.pending and not g.persisted:
                # only member ids were handed out, never used: nothing to keep
                del self.groups[g.group_id]
        self._gauge()

    # --- JoinGroup ------------------------------------------------------------------------
    async def join(self, group_id: str, member_id: str, *, client_id: str, api_version: int,
                   session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]],
                   group_instance_id: str | None = None, client_host: str = "") -> dict:
        """A JoinGroup answer (snake_case JoinGroup response fields), awaited until the join
        phase completes when the member is parked."""
        result = self._join(group_id, member_id, client_id, api_version, session_timeout_ms,
                            rebalance_timeout_ms, protocol_type, protocols, group_instance_id,
                            client_host)
        self._gauge()
        self._wake.set()
        return await result if isinstance(result, asyncio.Future) else result

    def _join(self, group_id: str, member_id: str, client_id: str, api_version: int,
              session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
              protocols: list[tuple[str, bytes]],
              group_instance_id: str | None, client_host: str) -> dict | asyncio.Future:
        if not group_id:
            return _error(ErrorCode.INVALID_GROUP_ID, member_id)
        session = session_timeout_ms / 1000
        if not (self.config.kafka_group_min_session_timeout <= session
                <= self.config.kafka_group_max_session_timeout):
            return _error(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        if self._closed:
            return _error(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        if not self.active:
            return _error(ErrorCode.NOT_COORDINATOR, member_id)
        group = self.groups.get(group_id) or Group(group_id, state_since=self.clock())
        if not self._protocols_fit(group, protocol_type, protocols):
            return _error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        self.groups[group_id] = group
        now = self.clock()
        # rebalance timeout: -1 from old clients means "the session timeout"
        rebalance = rebalance_timeout_ms / 1000 if rebalance_timeout_ms > 0 else session
        static = group.static_member(group_instance_id) if group_instance_id is not None else None
        if not member_id:
            member_id = f"{group_instance_id or client_id}-{uuid.uuid4()}"
            if static is not None:      # KIP-345: the instance's new id replaces its old one
                return self._replace_static(group, static, member_id, protocols, session,
                                            rebalance, client_id, client_host)
            if api_version >= 4 and group_instance_id is None:
                group.pending[member_id] = now + session
                return _error(ErrorCode.MEMBER_ID_REQUIRED, member_id)
        elif static is not None and static.member_id != member_id:
            return _error(ErrorCode.FENCED_INSTANCE_ID, member_id)
        elif member_id in group.pending:
            del group.pending[member_id]
        elif member_id not in group.members:
            return _error(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        else:
            return self._rejoin(group, group.members[member_id], protocols, session, rebalance)
        group.protocol_type = protocol_type
        member = Member(member_id, client_id, group_instance_id, session, rebalance,
                        list(protocols), now, client_host=client_host)
        group.members[member_id] = member
        member.join = asyncio.get_running_loop().create_future()
        if group.state is PREPARING:
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
        if unchanged and (group.state is COMPLETING
                          or (group.state is STABLE and member.member_id != group.leader)):
            return self._join_answer(group, member)
        if member.awaiting_join():       # a duplicate JoinGroup: the newer one is answered
            self._resolve(member.join, _error(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        member.join = asyncio.get_running_loop().create_future()
        if group.state is PREPARING:
            self._maybe_complete_join(group)
        else:
            self._prepare_rebalance(group)
        return member.join

    def _replace_static(self, group: Group, old: Member, new_id: str,
                        protocols: list[tuple[str, bytes]], session: float, rebalance: float,
                        client_id: str, client_host: str) -> dict | asyncio.Future:
        """A static member rejoined with no member id (it restarted): it takes its old id's
        place, assignment included, and the old id is fenced (FENCED_INSTANCE_ID).  In a
        Stable group whose protocol choice does not change this is no rebalance: the new id
        is recorded, then answered from the current generation.  Otherwise the group
        rebalances (in CompletingRebalance the leader may have assigned the old id)."""
        old_id = old.member_id
        self._resolve(old.join, _error(ErrorCode.FENCED_INSTANCE_ID, old_id))
        self._resolve(old.sync, {"error_code": ErrorCode.FENCED_INSTANCE_ID})
        before = (old.protocols, old.session_timeout, old.rebalance_timeout, old.client_id,
                  old.client_host)
        self._rename(group, old, new_id)
        old.protocols, old.session_timeout, old.rebalance_timeout = list(protocols), session, rebalance
        old.client_id, old.client_host, old.last_seen = client_id, client_host, self.clock()
        member = old
        member.join = asyncio.get_running_loop().create_future()
        if group.state is STABLE and self._select_protocol(group) == group.protocol_name:
            generation = group.generation

            def recorded(ok: bool) -> None:
                if ok:
                    self._resolve(member.join, {**self._join_answer(group, member),
                                                "members": []})
                    return
                if group.generation == generation and member.member_id == new_id:
                    (member.protocols, member.session_timeout, member.rebalance_timeout,
                     member.client_id, member.client_host) = before
                    self._rename(group, member, old_id)
                self._resolve(member.join, _error(ErrorCode.COORDINATOR_NOT_AVAILABLE))

            self._record(group, recorded)
        elif group.state is PREPARING:
            self._maybe_complete_join(group)
        else:
            self._prepare_rebalance(group)
        return member.join

    @staticmethod
    def _rename(group: Group, member: Member, new_id: str) -> None:
        """Give ``member`` a new id, keeping its place in the join order (and the lead)."""
        old_id = member.member_id
        group.members = {(new_id if k == old_id else k): m for k, m in group.members.items()}
        member.member_id = new_id
        if group.leader == old_id:
            group.leader = new_id

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
        was_empty = group.state is EMPTY
        group.move_to(PREPARING)
        group.join_deadline = now + max((m.rebalance_timeout for m in group.members.values()),
                                        default=0.0)
        group.initial_until = None
        if was_empty:
            group.initial_until = min(now + self.config.kafka_group_initial_rebalance_delay,
                                      group.join_deadline)
        self._maybe_complete_join(group)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state is not PREPARING:
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
            group.move_to(EMPTY)
            group.protocol_name = group.leader = None
            group.state_since = self.clock()
            if group.persisted:
                self._record(group)
            return
        group.move_to(COMPLETING)
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
    def _check_member(self, group_id: str, generation_id: int, member_id: str,
                      instance_id: str | None = None) -> tuple[ErrorCode, Group | None, Member | None]:
        if not self.active and not self._closed:
            return ErrorCode.NOT_COORDINATOR, None, None
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, None, None
        if group.state is DEAD or self._closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, group, None
        if instance_id is not None:
            static = group.static_member(instance_id)
            if static is not None and static.member_id != member_id:
                return ErrorCode.FENCED_INSTANCE_ID, group, None
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, group, None
        if generation_id != group.generation:
            return ErrorCode.ILLEGAL_GENERATION, group, member
        return ErrorCode.NONE, group, member

    async def sync(self, group_id: str, generation_id: int, member_id: str,
                   assignments: list[tuple[str, bytes]], group_instance_id: str | None = None) -> dict:
        """A SyncGroup answer (``error_code``, ``assignment``); a member's answer waits for
        the leader's assignment while the group is CompletingRebalance, and the leader's
        assignment is answered once it is recorded."""
        result = self._sync(group_id, generation_id, member_id, assignments, group_instance_id)
        self._wake.set()
        return await result if isinstance(result, asyncio.Future) else result

    def _sync(self, group_id: str, generation_id: int, member_id: str,
              assignments: list[tuple[str, bytes]],
              group_instance_id: str | None) -> dict | asyncio.Future:
        err, group, member = self._check_member(group_id, generation_id, member_id,
                                                group_instance_id)
        if err != ErrorCode.NONE:
            return {"error_code": err}
        assert group is not None and member is not None
        member.last_seen = self.clock()
        if group.state is PREPARING:
            return {"error_code": ErrorCode.REBALANCE_IN_PROGRESS}
        if group.state is STABLE:
            return {"error_code": ErrorCode.NONE, "assignment": member.assignment}
        if member.awaiting_sync():
            self._resolve(member.sync, {"error_code": ErrorCode.REBALANCE_IN_PROGRESS})
        member.sync = asyncio.get_running_loop().create_future()
        if member_id == group.leader and group.storing != group.generation:
            given = dict(assignments)
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
            group.storing = generation = group.generation

            def recorded(ok: bool) -> None:
                """Kafka answers SyncGroup once the generation is stored: a restart after
                the answer finds the group as its members know it."""
                if group.generation != generation or group.state is not COMPLETING:
                    return          # a rebalance started meanwhile: the members were told
                group.storing = -1
                if not ok:
                    for m in group.members.values():
                        self._resolve(m.sync, {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE})
                    self._prepare_rebalance(group)
                    return
                now = self.clock()
                group.move_to(STABLE)
                group.state_since = now
                for m in group.members.values():
                    m.last_seen = now
                    self._resolve(m.sync, {"error_code": ErrorCode.NONE,
                                           "assignment": m.assignment})

            self._record(group, recorded)
        return member.sync

    def heartbeat(self, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None = None) -> ErrorCode:
        err, group, member = self._check_member(group_id, generation_id, member_id,
                                                group_instance_id)
        if err != ErrorCode.NONE:
            return err
        assert group is not None and member is not None
        member.last_seen = self.clock()
        if group.state is PREPARING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group_id: str, member_id: str) -> ErrorCode:
        if not self.active and not self._closed:
            return ErrorCode.NOT_COORDINATOR
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.state is DEAD or self._closed:
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
        if group.state is STABLE or group.state is COMPLETING:
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
        if self._closed or (group is not None and group.state is DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not self.active:
            return ErrorCode.NOT_COORDINATOR
        if group is None:
            return ErrorCode.NONE if generation_id < 0 else ErrorCode.ILLEGAL_GENERATION
        if generation_id < 0 and not member_id:
            return ErrorCode.NONE if group.state is EMPTY else ErrorCode.UNKNOWN_MEMBER_ID
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state is COMPLETING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    # --- admin: ListGroups, DescribeGroups, DeleteGroups ---------------------------------------
    def _known(self) -> dict[str, Group | None]:
        """Every group Kafka clients use: those with members or a record, and those known
        only by offsets committed through Kafka (None: a "simple" group, Empty)."""
        known: dict[str, Group | None] = {}
        if self.offsets is not None:
            known = dict.fromkeys(self.offsets.kafka_groups())
        known.update((gid, g) for gid, g in self.groups.items() if g.state is not DEAD)
        return known

    def list_groups(self, states: list[str] | None = None) -> list[dict]:
        """ListGroups rows (``group_id``, ``protocol_type``, ``group_state``, ``group_type``:
        every group here is a classic one), filtered by state names (any case) when
        ``states`` is non-empty."""
        wanted = {s.lower() for s in states or ()}
        rows = []
        for gid, g in sorted(self._known().items()):
            state = (g.state if g is not None else EMPTY).value
            if wanted and state.lower() not in wanted:
                continue
            rows.append({"group_id": gid, "protocol_type": (g.protocol_type if g else "") or "",
                         "group_state": state, "group_type": "classic"})
        return rows

    def describe(self, group_ids: list[str]) -> list[dict]:
        """DescribeGroups entries (the groups are looked up once per request, however many
        it names)."""
        known = self._known() if self.active else {}
        return [self._describe(gid, known) for gid in group_ids]

    def _describe(self, group_id: str, known: dict[str, Group | None]) -> dict:
        """One DescribeGroups entry: an unknown group is Dead with no members, as Kafka
        answers below v6; member metadata and assignments are given in Stable only."""
        if not self.active:
            return {"error_code": ErrorCode.NOT_COORDINATOR, "group_id": group_id}
        if group_id not in known:
            return {"error_code": ErrorCode.NONE, "group_id": group_id, "group_state": DEAD.value}
        g = known[group_id]
        if g is None:
            return {"error_code": ErrorCode.NONE, "group_id": group_id,
                    "group_state": EMPTY.value}
        stable = g.state is STABLE
        return {"error_code": ErrorCode.NONE, "group_id": group_id, "group_state": g.state.value,
                "protocol_type": g.protocol_type or "",
                "protocol_data": (g.protocol_name or "") if stable else "",
                "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                             "client_id": m.client_id, "client_host": m.client_host,
                             "member_metadata": (dict(m.protocols).get(g.protocol_name or "", b"")
                                                 if stable else b""),
                             "member_assignment": m.assignment if stable else b""}
                            for m in g.members.values()]}

    async def delete(self, group_ids: list[str]) -> list[ErrorCode]:
        """DeleteGroups: only an Empty group goes; its record and offsets go for good (a
        tombstone in the group log, the offsets removed through the offset log).  One error
        code per group, in order."""
        known = self._known() if self.active else {}
        verdicts: list[ErrorCode | asyncio.Future[bool] | None] = []
        for gid in group_ids:
            if self._closed:
                verdicts.append(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            elif not self.active:
                verdicts.append(ErrorCode.NOT_COORDINATOR)
            elif not gid:
                verdicts.append(ErrorCode.INVALID_GROUP_ID)
            elif gid not in known:
                verdicts.append(ErrorCode.GROUP_ID_NOT_FOUND)
            elif (g := known[gid]) is not None and (g.members or g.pending or g.state is not EMPTY):
                verdicts.append(ErrorCode.NON_EMPTY_GROUP)
            else:
                del known[gid]
                verdicts.append(self._forget(gid))
        self._gauge()
        out = []
        for v in verdicts:
            if isinstance(v, ErrorCode):
                out.append(v)
            else:   # a tombstone (None: no log to write to)
                out.append(ErrorCode.NONE if v is None or await v
                           else ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return out

    # --- pruning ---------------------------------------------------------------------------------
    def prune(self) -> int:
        """Kafka's offset expiry and group cleanup (docs/kafka.md): offsets of an Empty group
        expire ``kafka_offsets_retention`` after it became Empty; offsets of a group that
        never had members (simple commits), each that long after its commit; an Empty group
        left with no offset is removed.  Offsets written through RocketMQ have no commit time
        and never expire here.  Returns the groups removed."""
        if self.offsets is None:
            return 0
        now = self.clock()
        retention = self.config.kafka_offsets_retention
        table = self.offsets.groups()
        expired: list[OffsetKey] = []
        removed = 0
        for gid, g in self._known().items():
            if g is not None and (g.members or g.pending or g.state is not EMPTY):
                continue
            offsets = table.get(gid, {})
            if g is not None and g.protocol_type:
                if now - g.state_since >= retention:
                    expired += [(gid, topic, q) for topic, queues in offsets.items()
                                for q in queues]
                    offsets = {}
            else:
                kept = 0
                for topic, queues in offsets.items():
                    for q in queues:
                        commit = self.offsets.kafka_commit(gid, topic, q)
                        if commit is not None and now - commit[1] / 1000 >= retention:
                            expired.append((gid, topic, q))
                        else:
                            kept += 1
                offsets = {} if not kept else offsets
            if not offsets:
                self._forget(gid, offsets_left=False)
                removed += 1
        self._drop_offsets(expired)  # one offset record for the pass
        if removed:
            log.info("kafka groups: %d expired group(s) removed", removed)
            self._gauge()
        return removed

    # --- persistence ------------------------------------------------------------------------
    def _record(self, group: Group, then: Callable[[bool], None] | None = None) -> None:
        """Write ``group``'s record as it is now; ``then(stored)`` runs once the log has it
        (at once without a log)."""
        group.persisted = True
        doc = group.doc()
        if self.log is None:
            if then is not None:
                then(True)
            return
        fut = self.log.submit(doc)
        if then is not None:
            fut.add_done_callback(lambda f: then(f.result()))

    def snapshot(self) -> None:
        """Compact the log: every live group's record again (a deleted group's offsets went
        through the offset log, so no tombstone needs carrying)."""
        assert self.log is not None
        self.log.snapshot([g.doc() for g in self.groups.values() if g.persisted])

    def _drop_offsets(self, keys: list[OffsetKey]) -> None:
        if not keys:
            return
        if self._forget_offsets is not None:
            self._forget_offsets(keys)
        elif self.offsets is not None:
            for key in keys:
                self.offsets.forget(*key)

    def _forget(self, group_id: str, *, offsets_left: bool = True) -> asyncio.Future[bool] | None:
        """Remove a group, its offsets (``offsets_left``: some may remain) and metadata, with
        a tombstone.  The future (None without a log) says whether the tombstone is stored."""
        self.groups.pop(group_id, None)
        if self.offsets is not None and offsets_left:
            self._drop_offsets([(group_id, t, q) for t, q in self.offsets.group_offsets(group_id)])
        ms = int(self.clock() * 1000)
        if self.log is None:
            return None
        return self.log.submit({"group": group_id, "deleted": ms})

    # --- helpers -----------------------------------------------------------------------------
    @staticmethod
    def _resolve(fut: asyncio.Future | None, answer: dict) -> None:
        if fut is not None and not fut.done():
            fut.set_result(answer)

    def _gauge(self) -> None:
        self.metrics.kafka_groups.set(sum(1 for g in self.groups.values() if g.members))
