"""The transactional message service: the facade the processors and the broker use for
half messages, decisions, discards and recovery.

The package splits as RocketMQ splits it: this facade (TransactionalMessageService), the
store access in :mod:`.bridge` (TransactionalMessageBridge), the request handlers in
:mod:`txbroker.service.processors.transaction` (EndTransactionProcessor) and the check service
in :mod:`.check` (TransactionalMessageCheckService).  What differs from RocketMQ is how the
broker remembers what happened to a half:

* **An in-memory index.**  Pending and discarded halves are slots of a columnar
  :class:`~.pending.PendingIndex` (~150 bytes per half, looked up by commitlog offset or
  UNIQ_KEY, kept in store-time order so a check pass looks only at the due ones); decided
  halves cost one byte each in :class:`~.index.ResolvedStates` (indexed by half queue offset), so remembering millions of
  decisions stays cheap; who decided the most recent ones and when is kept, bounded, in
  :class:`~.history.TxHistory` (``txbroker txn show``).  A check pass looks at the due
  pending halves only, so its cost follows what is due, not what is pending nor the history of
  the half queue (RocketMQ walks the half and op queues every round).
* **Every decision goes through** :func:`.state.decide` under a per-half lock, so a retried
  commit, or a check answer racing the producer's own commit, writes nothing the second time,
  and a rollback after a commit is refused.
* **A commit usually reads nothing back.**  The halves prepared most recently (bounded by
  ``_RECENT_HALF_BYTES``) are kept as they were stored, so the common commit, moments after its
  half, builds the final message without reading and decoding the half record (~10 % more
  transactions per second in ``bench/broker.py``); older halves are read back from the store.
* **Checks never re-append the half** (RocketMQ 4.x copies it to the half queue on every
  check, which fills disks in check storms).  Check counts are persisted as small records
  (formats in :mod:`.oplog`).

A commit appends the final message *before* its ``d`` record, so a crash between the two
writes leaves a commit that :mod:`.recovery` finds and :meth:`start` completes.  A check count
is recorded after the checks are sent; a crash in between loses at most one count per half
(the safe direction: a count is never burned without a check).

Why this file is over 450 lines: every method left here reads or changes the pending and
discarded index, the decided-state bytes and the per-half locks together,
under one invariant (a half is in exactly one of them, and only under its lock does it move).
What does not touch that state is already out: the transition table, the index types, the op
log, the messages, the store I/O, recovery and the check service.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txbroker.config import BrokerConfig
from txbroker.remoting.codes import ResponseCode
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.transaction import recovery
from txbroker.service.transaction.bridge import TransactionalMessageBridge
from txbroker.service.transaction.check import CheckPassReport, CheckService
from txbroker.service.transaction.history import Decided, TxHistory
from txbroker.service.transaction.index import ResolvedStates, immunity_ms
from txbroker.service.transaction.locks import KeyedLock
from txbroker.service.transaction.messages import (
    discard_copy,
    final_message,
    half_message,
    producer_group,
)
from txbroker.service.transaction.oplog import (
    OP_TAG_CHECKS,
    OP_TAG_DONE,
    OP_TAG_RESUME,
    PROPERTY_OPERATOR,
    PROPERTY_STATE,
    counts_bodies,
    decision_properties,
)
from txbroker.service.transaction.pending import HalfEntry, PendingIndex, stored_row
from txbroker.service.transaction.state import (
    ConflictError,
    Decision,
    HalfState,
    Outcome,
    TransactionError,
    UnknownTransactionError,
    decide,
)
from txbroker.store.message_store import PutResult, PutStatus
from txbroker.store.record import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    StoredMessage,
    decode_offset_msg_id,
)

if TYPE_CHECKING:
    from txbroker.service.clients import ClientRegistry
    from txbroker.service.timer import TimerService
    from txbroker.store.message_store import MessageStore

log = logging.getLogger(__name__)

#: Body bytes of recently prepared halves kept in memory, so that the common commit (within
#: moments of the half) builds the final message without reading the half back and decoding it.
#: 4 MiB holds the last ~16,000 halves of 256 B, far more than are in flight at once; each
#: costs ~1 KB of objects, so a larger bound mostly costs memory (bench.pending measures it).
_RECENT_HALF_BYTES = 4 * 1024 * 1024


class TransactionalMessageService:
    """Coordinator of transactional messages; event-loop only (no locking across threads)."""

    def __init__(self, config: BrokerConfig, store: MessageStore, registry: ClientRegistry,
                 metrics: BrokerMetrics, *, clock: Callable[[], float] = time.time,
                 bridge: TransactionalMessageBridge | None = None,
                 timer: TimerService | None = None) -> None:
        self.config = config
        #: Schedules a committed message that asks for a delivery time (transactional
        #: timers); without one (tools that replay transactions alone) a commit is delivered
        #: at once.
        self.timer = timer
        #: All store I/O; tests pass a subclass to inject faults.
        self.bridge = bridge if bridge is not None else TransactionalMessageBridge(store, clock=clock)
        self.registry = registry
        self.metrics = metrics
        self.clock = clock
        #: Pending and discarded halves (by commitlog offset and UNIQ_KEY).
        self._open = PendingIndex()
        self._resolved = ResolvedStates()
        #: Who decided the most recent halves and when (TXN_SHOW, decisions by id).
        self.history = TxHistory(config.transaction_history_size)
        #: commitlog offset -> the half as it was stored, newest last, bounded by
        #: ``_RECENT_HALF_BYTES`` of bodies: only a cache, the store stays the truth.
        self._recent: OrderedDict[int, Message] = OrderedDict()
        self._recent_bytes = 0
        #: Per-half locks while a decision is being written.
        self._locks = KeyedLock()
        #: Halves recovered as committed whose ``d`` record was missing; written by start().
        self._missing_ops: list[tuple[int, int]] = []
        self._checker = CheckService(self, config)
        # Gauges are computed when scraped; per-source counters resolved once.
        metrics.pending.set_function(self.pending_count)
        metrics.discarded.set_function(self.discarded_count)
        self._decided = {
            (state, source): (metrics.commits if state is HalfState.COMMITTED
                              else metrics.rollbacks).labels(source=source)
            for state in (HalfState.COMMITTED, HalfState.ROLLED_BACK)
            for source in ("producer", "check", "operator")}
        #: Recovered and started (a master's); False before start and after suspend().
        self.active = False
        #: Whether the last recover() started from a clean-close snapshot.
        self.recovered_from_snapshot = False

    # --- lifecycle -------------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild pending, discarded and resolved halves and check counts from the store
        (and the clean-close snapshot): see :func:`.recovery.recover`."""
        got = recovery.recover(self.bridge, self.snapshot_path,
                               history_size=self.config.transaction_history_size,
                               default_immunity_ms=self._default_immunity_ms())
        self._open = got.open
        self._resolved, self.history = got.resolved, got.history
        self._missing_ops = got.missing_ops
        self._recent.clear()
        self._recent_bytes = 0
        self.recovered_from_snapshot = got.from_snapshot

    async def start(self) -> None:
        """Write op records recovery found missing, then start the periodic check service."""
        missing, self._missing_ops = self._missing_ops, []
        for phys, qo in missing:
            extra = {PROPERTY_STATE: HalfState.COMMITTED.value}
            known = self.history.get(qo)
            if known is not None:
                extra.update(decision_properties(known))
            result = await self.bridge.put_op(OP_TAG_DONE, str(qo), extra,
                                              born_ms=known.decided_at if known is not None else None)
            if result.ok:
                log.warning("rewrote the missing op record of committed half %d (queue offset %d)",
                            phys, qo)
            else:
                self._missing_ops.append((phys, qo))
                log.error("could not rewrite the op record of committed half %d: %s", phys,
                          result.status.name)
        self._checker.start()
        self.active = True

    async def suspend(self) -> None:
        """Stop checking, write no snapshot: this broker stopped being its group's master, and
        what it knows may be cut by the new master's log (:meth:`recover` starts over)."""
        self.active = False
        await self._checker.close()

    async def close(self) -> None:
        """Stop checking and write the snapshot (call before the store closes); a service
        that is not active (a slave's, a demoted master's) writes none: it holds no state the
        next start could trust."""
        await self._checker.close()
        if not self.active:
            return
        self.active = False
        try:
            await recovery.write_snapshot(self.bridge, self.snapshot_path, self._resolved,
                                          list(self._open.open_states()),
                                          self._missing_ops, self.history)
        except OSError as exc:
            log.error("transaction snapshot not written (the next start replays): %s", exc)

    @property
    def snapshot_path(self) -> Path:
        return self.config.data_path / recovery.SNAPSHOT_FILE

    # --- queries ---------------------------------------------------------------------------
    def pending_count(self) -> int:
        return self._open.count(HalfState.PENDING)

    def discarded_count(self) -> int:
        return self._open.count(HalfState.DISCARDED)

    def state_of(self, phys: int) -> HalfState | None:
        """The state of the half at commitlog offset ``phys``; None if it is not a known half.

        A decided half is looked up by its queue offset, read back from the store.
        """
        entry = self._open.get(phys)
        if entry is not None:
            return entry.state
        half = self.bridge.read_half(phys)
        return self._resolved.get(half.queue_offset) if half is not None else None

    def entry(self, phys: int) -> HalfEntry | None:
        """The undecided (pending or discarded) half at ``phys``, None if there is none."""
        return self._open.get(phys)

    def pending_entries(self) -> list[HalfEntry]:
        return self._open.entries(HalfState.PENDING)

    def due_entries(self, now_ms: int) -> list[HalfEntry]:
        """Pending halves older than their immunity, oldest first (a check pass)."""
        return self._open.due(now_ms)

    def resolve_id(self, txn_id: str) -> int | None:
        """A UNIQ_KEY or an offsetMsgId → the half's commitlog offset (None if unknown).

        A UNIQ_KEY resolves while its half is undecided or in the decision history.
        """
        phys = self._open.find_uniq(txn_id)
        if phys is not None:
            return phys
        known = self.history.by_txn_id(txn_id)
        if known is not None:
            half = self.bridge.half_at(known.queue_offset)
            if half is not None:
                return half.physical_offset
        try:
            _, _, phys = decode_offset_msg_id(txn_id)
        except ValueError:
            return None
        return phys if self.state_of(phys) is not None else None

    def list_halves(self, state: str = "pending", *, topic: str | None = None,
                    group: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """TXN_LIST rows, oldest first: ``pending``, ``discarded`` or ``all`` (both)."""
        states = {"pending": (HalfState.PENDING,), "discarded": (HalfState.DISCARDED,),
                  "all": (HalfState.PENDING, HalfState.DISCARDED)}[state]
        now_ms = self._now_ms()
        # keys and tags are not kept in memory: each row reads its half back
        return [e.row(now_ms, self.bridge.read_half(e.phys))
                for e in self._open.select(states, topic=topic, group=group, limit=limit)]

    def show(self, txn_id: str) -> dict[str, Any] | None:
        """TXN_SHOW: the row plus body size, the stored properties and, once decided or
        discarded, the decision: ``source`` (producer, check, operator or unknown),
        ``operator``, ``decided_at`` (ms; None when the history no longer holds it).
        ``prepared_at`` is the half's store time.  ``checks`` is the check-backs sent: the
        index's count while undecided, the history's once decided, and left out when neither
        knows it (a count of 0 would be a claim).  None if the id names no half."""
        phys = self.resolve_id(txn_id)
        if phys is None:
            return None
        half = self.bridge.read_half(phys)
        if half is None:
            return None
        entry = self.entry(phys)
        row = entry.row(self._now_ms(), half) if entry is not None else stored_row(half, self._now_ms())
        state = self.state_of(phys)
        row["state"] = state.value
        row["prepared_at"] = half.store_timestamp
        if state is not HalfState.PENDING:
            known = self.history.get(half.queue_offset)
            if known is not None and known.state is not state:
                known = None  # a decision this broker does not remember any more
            row["source"] = known.source if known is not None else "unknown"
            row["operator"] = known.operator if known is not None else None
            row["decided_at"] = known.decided_at if known is not None else None
            if entry is None:  # decided: only the history knows how many checks it took
                checks = known.checks if known is not None else None
                if checks is None:
                    del row["checks"]
                else:
                    row["checks"] = checks
        row["body_size"] = len(half.body)
        row["store_timestamp"] = half.store_timestamp
        row["born_timestamp"] = half.born_timestamp
        row["properties"] = dict(half.properties)
        return row

    # --- prepare ---------------------------------------------------------------------------
    async def prepare(self, msg: Message, conn: Any | None) -> PutResult:
        """Store ``msg`` as a half message and index it as PENDING."""
        group, half, retried = self._to_prepare(msg, conn)
        if retried is not None:
            return await self.bridge.store.confirm_stored(retried)
        return self._prepared(msg, half, group, await self.bridge.put_half(half), conn)

    def prepare_now(self, msg: Message, conn: Any | None) -> PutResult:
        """:meth:`prepare` when the store :attr:`~MessageStore.answers_at_once`: the same
        steps, nothing awaited (the send handler's fast path)."""
        group, half, retried = self._to_prepare(msg, conn)
        if retried is not None:
            return self.bridge.store.confirm_stored_now(retried)
        return self._prepared(msg, half, group, self.bridge.put_half_now(half), conn)

    def _to_prepare(self, msg: Message, conn: Any | None) -> tuple[str, Message, PutResult | None]:
        """The half's group and record, and for a producer's retry of a half still pending,
        the first half's result to confirm instead of storing it again."""
        group = producer_group(msg)
        retried = self._retried_half(msg.properties.get(PROPERTY_UNIQ_KEY), group, msg)
        if retried is not None:
            retried.conn = conn or retried.conn  # the retrying connection is the live one
            self.metrics.retried_halves.inc()
            return group, msg, PutResult(
                PutStatus.OK, physical_offset=retried.phys, queue_offset=retried.queue_offset,
                msg_id=retried.msg_id, store_timestamp=retried.store_ts)
        return group, half_message(msg), None

    def _prepared(self, msg: Message, half: Message, group: str, result: PutResult,
                  conn: Any | None) -> PutResult:
        """Index a half the store took (see :meth:`prepare`)."""
        if not result.in_log:
            return result
        # OUTCOME_UNKNOWN: stored here, not acknowledged.  The half is in the log, so it is
        # indexed like any other: the producer's retry is answered from it (not stored twice,
        # which the check-back would then commit as well), and if no retry comes it is checked.
        props = half.properties
        self._open.add(
            phys=result.physical_offset, queue_offset=result.queue_offset,
            store_ts=result.store_timestamp,
            immunity_ms=immunity_ms(props, self._default_immunity_ms()), group=group,
            uniq=props.get(PROPERTY_UNIQ_KEY), topic=msg.topic, queue_id=msg.queue_id,
            body_size=len(msg.body), msg_id=result.msg_id, conn=conn)
        self._remember(result.physical_offset, half)
        self.metrics.halves.inc()
        return result

    def _remember(self, phys: int, half: Message) -> None:
        self._recent[phys] = half
        self._recent_bytes += len(half.body)
        while self._recent_bytes > _RECENT_HALF_BYTES:
            _, old = self._recent.popitem(last=False)
            self._recent_bytes -= len(old.body)

    def _recall(self, phys: int) -> Message | None:
        """The half stored at ``phys`` if it is still cached (and forget it: it is being decided)."""
        half = self._recent.pop(phys, None)
        if half is not None:
            self._recent_bytes -= len(half.body)
        return half

    def _retried_half(self, uniq: str | None, group: str, msg: Message) -> HalfEntry | None:
        """The pending half this send repeats, if it is a producer's retry of a half send.

        A client whose half SEND answer was lost (time-out, cut connection) sends the same
        message again with the same UNIQ_KEY.  Storing it twice would make two halves of one
        local transaction: the producer's END decides one, the check-back the other, and a
        commit is delivered twice.  So while the first half is pending, the retry is answered
        with the first half's ids and nothing is stored; the producer then ends that half.
        The group, real topic and body size must match: a UNIQ_KEY alone names nothing.
        """
        if not uniq:
            return None
        phys = self._open.find_uniq(uniq)
        entry = self._open.get(phys) if phys is not None else None
        if entry is None or entry.state is not HalfState.PENDING or entry.group != group or entry.topic != msg.topic \
                or entry.body_size != len(msg.body):
            return None
        return entry

    # --- decisions -------------------------------------------------------------------------
    async def end_transaction(self, *, commit_log_offset: int, tran_state_table_offset: int,
                              producer_group: str, commit_or_rollback: int,
                              from_check: bool = False) -> Outcome | None:
        """Apply a producer's END_TRANSACTION.  Returns the outcome (None for "unknown").

        Raises :class:`TransactionError` for a request naming no half of that group (the
        RocketMQ remarks) and :class:`ConflictError` for a contradicting decision.
        """
        decision = self._end_decision(commit_log_offset, commit_or_rollback, from_check)
        if decision is None:
            return None
        async with self._locks.hold(commit_log_offset):
            state, entry = self._validate_end(commit_log_offset, tran_state_table_offset,
                                              producer_group)
            return await self._apply(commit_log_offset, state, decision,
                                     source="check" if from_check else "producer", entry=entry)

    def can_end_now(self, commit_log_offset: int) -> bool:
        """True when :meth:`end_transaction_now` may apply an END on this half: no slave must
        hold its records first and no other decision on it is under way.

        With sync flush too: a producer's END is one-way, nobody waits for its answer, so it
        does not wait for the disk either (the group commit of the next send, or the interval
        flush, makes it durable within ``flush_interval``).  Should the machine lose power
        first, the half is pending again after the restart and its check-back decides it, as
        it would if the END had been lost on the way."""
        return not self.bridge.store.replicated and commit_log_offset not in self._locks

    def end_transaction_now(self, *, commit_log_offset: int, tran_state_table_offset: int,
                            producer_group: str, commit_or_rollback: int,
                            from_check: bool = False) -> Outcome | None:
        """:meth:`end_transaction` without awaiting, when :meth:`can_end_now` (the END
        handler's fast path).  Nothing else runs until it returns, so it takes no lock."""
        decision = self._end_decision(commit_log_offset, commit_or_rollback, from_check)
        if decision is None:
            return None
        state, entry = self._validate_end(commit_log_offset, tran_state_table_offset,
                                          producer_group)
        plan = self._plan(commit_log_offset, state, decision,
                          source="check" if from_check else "producer", operator=None, name=None,
                          entry=entry)
        if plan.__class__ is Outcome:
            return plan
        entry, decided, extra = plan
        if decision is Decision.COMMIT:
            final, op = self._commit_records(commit_log_offset, entry, decided, extra)
            result, op_result = self.bridge.put_commit_now(final, op)
            self._committed(commit_log_offset, entry, decided, result, op_result)
        else:
            self._rolled_back(entry, decided, self.bridge.put_op_now(
                OP_TAG_DONE, str(entry.queue_offset), extra, born_ms=decided.decided_at))
        return Outcome.APPLY

    def _end_decision(self, phys: int, commit_or_rollback: int,
                      from_check: bool) -> Decision | None:
        """The decision an END asks for (None: "unknown"), counted; an answer to a check
        tells the check service that the check arrived."""
        kind = _END_KINDS.get(commit_or_rollback)
        if kind is None:
            raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                   f"commitOrRollback={commit_or_rollback} must be 0, 8 or 12")
        if from_check:
            self.metrics.check_answers.labels(kind=kind).inc()
            self._checker.answered(phys)
        if kind == "unknown":
            self.metrics.unknown_ends.inc()
            return None
        return Decision.COMMIT if kind == "commit" else Decision.ROLLBACK

    def _validate_end(self, phys: int, queue_offset: int,
                      group: str) -> tuple[HalfState, HalfEntry | None]:
        """RocketMQ's checks, with its remarks (clients and operators grep for them); the
        half's state, and its index entry while it is undecided."""
        entry = self.entry(phys)
        if entry is not None:
            half_group, half_qo, state = entry.group, entry.queue_offset, entry.state
        else:
            half = self.bridge.read_half(phys)
            state = self._resolved.get(half.queue_offset) if half is not None else None
            if state is None:
                self.metrics.invalid_ends.inc()
                raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                       "Find prepared transaction message failed")
            half_group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
            half_qo = half.queue_offset
        if half_group != group:
            self.metrics.invalid_ends.inc()
            raise TransactionError(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if half_qo != queue_offset:
            self.metrics.invalid_ends.inc()
            raise TransactionError(ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong")
        return state, entry

    async def operator_decide(self, txn_id: str, decision: str, *, operator: str, peer: str = "",
                              reason: str | None = None) -> dict[str, Any]:
        """TXN_DECIDE / RESUME_CHECK_HALF_MESSAGE: commit, rollback or resume, logged with who."""
        phys = self.resolve_id(txn_id)
        if phys is None:
            raise UnknownTransactionError(txn_id)
        dec = {"commit": Decision.COMMIT, "rollback": Decision.ROLLBACK,
               "resume": Decision.RESUME}.get(decision)
        if dec is None:
            raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                   f"decision must be commit, rollback or resume, got {decision!r}")
        when = datetime.fromtimestamp(self.clock(), UTC).isoformat(timespec="seconds")
        log.warning("operator %r from %s decides %s on transaction %s (half %d) at %s%s",
                    operator, peer or "?", dec.value, txn_id, phys, when,
                    f": {reason}" if reason else "")
        async with self._locks.hold(phys):
            state = self.state_of(phys)
            if dec is Decision.RESUME:
                outcome = await self._resume(phys, state, operator, txn_id)
            else:
                outcome = await self._apply(phys, state, dec, source="operator", operator=operator,
                                            name=txn_id)
        return {"id": txn_id, "commit_log_offset": phys, "decision": dec.value,
                "outcome": outcome.value, "state": self.state_of(phys).value,
                "operator": operator, "at": when}

    async def _apply(self, phys: int, state: HalfState, decision: Decision, *, source: str,
                     operator: str | None = None, name: str | None = None,
                     entry: HalfEntry | None = None) -> Outcome:
        """Write ``decision`` (or nothing, for a repeat; or refuse a contradiction, naming
        the transaction ``name`` or, for a producer's END, the half's commitlog offset).
        ``entry`` is the half's index entry when the caller already looked it up."""
        plan = self._plan(phys, state, decision, source=source, operator=operator, name=name,
                          entry=entry)
        if plan.__class__ is Outcome:
            return plan
        entry, decided, extra = plan
        if decision is Decision.COMMIT:
            final, op = self._commit_records(phys, entry, decided, extra)
            result, op_result = await self.bridge.put_commit(final, op)
            self._committed(phys, entry, decided, result, op_result)
        else:
            self._rolled_back(entry, decided, await self.bridge.put_op(
                OP_TAG_DONE, str(entry.queue_offset), extra, born_ms=decided.decided_at))
        return Outcome.APPLY

    def _plan(self, phys: int, state: HalfState, decision: Decision, *, source: str,
              operator: str | None, name: str | None,
              entry: HalfEntry | None) -> Outcome | tuple[HalfEntry, Decided, dict[str, str]]:
        """What :meth:`_apply` writes: the outcome when there is nothing to write (a repeat),
        else the half's entry, the decision and the op record's properties.  Refuses a
        contradiction."""
        outcome, target = decide(state, decision, operator=operator is not None)
        if outcome is Outcome.DUPLICATE:
            self.metrics.duplicate_ends.inc()
            log.info("%s of half %d repeated (%s): nothing written", decision.value, phys, source)
            return outcome
        if outcome is Outcome.CONFLICT:
            self.metrics.conflicting_ends.inc()
            log.warning("refused %s of half %d from %s: it is %s", decision.value, phys, source,
                        state.value)
            raise ConflictError(state, decision, name or f"at commitlog offset {phys}")
        if entry is None:
            entry = self.entry(phys)
        assert entry is not None  # APPLY only from PENDING/DISCARDED, which are indexed
        decided = Decided(entry.queue_offset, target, source, operator, self._now_ms(), entry.uniq,
                          entry.checks)
        return entry, decided, {PROPERTY_STATE: target.value, **decision_properties(decided)}

    def _commit_records(self, phys: int, entry: HalfEntry, decided: Decided,
                        extra: dict[str, str]) -> tuple[Message, Message]:
        """A commit's final message and op record."""
        half = self._recall(phys) or self.bridge.read_half(phys)
        if half is None:
            raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                   "Find prepared transaction message failed")
        final = final_message(half, phys, entry.store_ts)
        if self.timer is not None:
            final = self.timer.wrap_committed(final)
        return (final,
                self.bridge.op_message(OP_TAG_DONE, str(entry.queue_offset), extra,
                                       born_ms=decided.decided_at))

    def _committed(self, phys: int, entry: HalfEntry, decided: Decided, result: PutResult,
                   op: PutResult | None) -> None:
        """Settle a commit whose records the store took, or raise why it did not."""
        if not result.in_log:
            raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                   f"commit failed, the store refused the message: "
                                   f"{result.status.name} {result.reason}".strip())
        # The final message is stored: the half is committed whatever happened to the op.
        # Also when it was answered OUTCOME_UNKNOWN (the write gate went up while it
        # waited): it is in this log, so a check-back must not commit the half again (two
        # final messages, one transaction delivered twice).  Should another replica take
        # over without it, that master recovers the half as pending and checks it.
        self._settle(entry, decided)
        assert op is not None  # attempted whenever the final message was stored
        if not op.in_log:
            self._missing_ops.append((phys, entry.queue_offset))
            log.error("op record of committed half %d not written (%s); it is rewritten at "
                      "the next start", phys, op.status.name)
        _raise_if_unknown(result, "commit")

    def _rolled_back(self, entry: HalfEntry, decided: Decided, op: PutResult) -> None:
        """Settle a rollback whose op record the store took, or raise why it did not."""
        if not op.in_log:
            raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                   f"rollback failed, the store refused the op record: "
                                   f"{op.status.name} {op.reason}".strip())
        self._settle(entry, decided)
        _raise_if_unknown(op, "rollback")

    def _settle(self, entry: HalfEntry, decided: Decided) -> None:
        target = decided.state
        self._open.remove(entry.phys, target)
        self._recall(entry.phys)
        self._resolved.set(entry.queue_offset, target)
        self.history.record(decided)
        self._decided[(target, decided.source)].inc()
        self.metrics.decision_latency.observe(max(0, self._now_ms() - entry.store_ts) / 1000)

    # --- discard / resume / check counts (used by the check service) -----------------------
    async def discard(self, entry: HalfEntry) -> bool:
        """Move a half checked ``transaction_check_max`` times to TRANS_CHECK_MAX_TIME_TOPIC."""
        async with self._locks.hold(entry.phys):
            outcome, target = decide(self.state_of(entry.phys), Decision.DISCARD)
            if outcome is not Outcome.APPLY:
                return False
            half = self.bridge.read_half(entry.phys)
            if half is None:
                self.forget(entry, "its record can no longer be read (retention or damage)")
                return False
            result = await self.bridge.put_discard(discard_copy(half, entry.checks,
                                                                entry.queue_offset))
            if not result.ok:
                log.error("discard of half %d failed: %s", entry.phys, result.status.name)
                return False
            self._open.set_state(entry.phys, target)
            self._recall(entry.phys)
            # a replay reads the discard time from the copy's store timestamp: the same value
            self.history.record(Decided(entry.queue_offset, target, "check", None,
                                        result.store_timestamp, entry.uniq, entry.checks))
            self.metrics.discards.inc()
            log.warning("half %d (%s, group %s) discarded after %d checks without an answer",
                        entry.phys, entry.uniq, entry.group, entry.checks)
            return True

    async def _resume(self, phys: int, state: HalfState, operator: str, name: str) -> Outcome:
        outcome, target = decide(state, Decision.RESUME)
        if outcome is Outcome.CONFLICT:
            self.metrics.conflicting_ends.inc()
            raise ConflictError(state, Decision.RESUME, name)
        if outcome is Outcome.DUPLICATE:
            return outcome
        entry = self._open.get(phys)
        assert entry is not None  # DISCARDED, so indexed
        result = await self.bridge.put_op(OP_TAG_RESUME, f"{entry.queue_offset},",
                                          {PROPERTY_OPERATOR: operator})
        if not result.ok:
            raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                   f"resume failed, the store refused the record: {result.status.name}")
        self.history.drop(entry.queue_offset)
        self._open.set_state(phys, target)
        entry.checks = 0
        self.metrics.resumes.inc()
        return Outcome.APPLY

    async def record_checks(self, entries: list[HalfEntry]) -> None:
        """Persist the check counts of one pass as ``c`` records (one, unless it is huge)."""
        limit = max(256, self.config.max_message_size // 2)
        for body in counts_bodies(((e.queue_offset, e.checks) for e in entries), limit):
            result = await self.bridge.put_op(OP_TAG_CHECKS, body, {})
            if not result.ok:
                log.error("check counts of %d halves not persisted: %s", body.count(","),
                          result.status.name)

    def trim_resolved(self) -> None:
        """Drop decisions about halves retention has deleted (run by every check pass)."""
        recovery.trim(self.bridge, self._resolved, self.history)

    def forget(self, entry: HalfEntry, reason: str) -> None:
        """Drop an undecided half from the index because its record is gone."""
        self._open.remove(entry.phys, None)
        self._recall(entry.phys)
        log.error("half %d (%s, group %s) dropped from the pending index: %s", entry.phys,
                  entry.uniq, entry.group, reason)

    def read_half(self, phys: int) -> StoredMessage | None:
        return self.bridge.read_half(phys)

    def write_refusal(self) -> str:
        """Why the store refuses writes now ("" if it accepts them)."""
        return self.bridge.write_refusal()

    def producer_connections(self, group: str) -> list[Any]:
        """Live connections of producer ``group``, most recently active first."""
        return self.registry.producer_connections(group)

    async def check_now(self) -> CheckPassReport:
        """Run one check pass now (tests, operators); the periodic service runs the same."""
        return await self._checker.run_pass()

    def is_busy(self, phys: int) -> bool:
        """A decision on this half is being written right now."""
        return phys in self._locks

    # --- helpers ---------------------------------------------------------------------------
    def _default_immunity_ms(self) -> int:
        return int(self.config.transaction_timeout * 1000)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)


#: commitOrRollback -> what an END asks for.
_END_KINDS = {TRANSACTION_COMMIT_TYPE: "commit", TRANSACTION_ROLLBACK_TYPE: "rollback",
              TRANSACTION_NOT_TYPE: "unknown"}


def _raise_if_unknown(result: PutResult, what: str) -> None:
    """A decision written but answered OUTCOME_UNKNOWN: applied here, yet another replica may
    now speak for the group without it, so whoever asked is told it may not hold."""
    if result.status is PutStatus.OUTCOME_UNKNOWN:
        raise TransactionError(ResponseCode.SYSTEM_ERROR,
                               f"{what} stored, but not acknowledged: {result.reason}")
