"""The transactional message service: half messages, decisions, discards, recovery.

A half message is stored like RocketMQ 4.x stores it (docs/protocol.md §7.2): topic rewritten to
``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, the real topic and queue kept in ``REAL_TOPIC`` /
``REAL_QID``, the transaction bits of the sys flag reset so the half queue indexes it.  What
differs from RocketMQ is how the broker remembers what happened to it:

* **An in-memory index.**  ``_pending`` and ``_discarded`` map the half's commitlog offset to a
  small :class:`HalfEntry`; decided halves cost one byte each in :class:`ResolvedStates`
  (indexed by half queue offset), so remembering millions of decisions stays cheap; who
  decided the most recent ones and when is kept, bounded, in
  :class:`~txbroker.service.txhistory.TxHistory` (``txbroker txn show``).  A check
  pass walks ``_pending`` only, so its cost follows what is pending, not the history of the
  half queue (RocketMQ walks the half and op queues every round).
* **Every decision goes through** :func:`txbroker.service.txstate.decide` under a per-half
  lock, so a retried commit, or a check answer racing the producer's own commit, writes
  nothing the second time, and a rollback after a commit is refused.
* **A commit usually reads nothing back.**  The halves prepared most recently (bounded by
  ``_RECENT_HALF_BYTES``) are kept as they were stored, so the common commit, moments after its
  half, builds the final message without reading and decoding the half record (~10 % more
  transactions per second in ``bench/broker.py``); older halves are read back from the store.
* **Checks never re-append the half** (RocketMQ 4.x copies it to the half queue on every
  check, which fills disks in check storms).  Check counts are persisted as small records.

Records this service writes (all go through ``MessageStore.put``, so they are recovered,
flushed and retained like any message):

=====================  =====  ==============================================================
topic / queue 0        tag    body and properties
=====================  =====  ==============================================================
RMQ_SYS_TRANS_OP_HALF  ``d``  RocketMQ 4.x op message: body = the half queue offset in
_TOPIC                        decimal, one record per decision (no 5.x batching: a 4.x
                              checker can still read the store; the reader here also accepts
                              5.x bodies ``"17,18,"``).  Property ``TXB_STATE`` = ``committed``
                              or ``rolled_back``; ``TXB_SOURCE`` = ``producer``, ``check`` or
                              ``operator``; ``TXB_OPERATOR`` when an operator decided;
                              ``__transactionId__`` = the half's UNIQ_KEY; born timestamp =
                              the decision time.  A record without them (RocketMQ's, or older
                              txbroker's) replays as source ``unknown``.
same                   ``c``  check counts, one record per check pass: body
                              ``"<half queue offset>:<checks so far>,"`` repeated.  Counts are
                              absolute, so replaying is idempotent.
same                   ``r``  operator resume of a discarded half: body ``"<queue offset>,"``;
                              the count starts again from 0.
TRANS_CHECK_MAX_TIME   —      the discarded half, copied as RocketMQ does (same body and
_TOPIC                        properties) plus ``TRAN_PREPARED_QUEUE_OFFSET`` = its half queue
                              offset and ``TRANSACTION_CHECK_TIMES``.
=====================  =====  ==============================================================

A commit appends the final message *before* its ``d`` record.  The final message carries the
half's commitlog offset in ``preparedTransactionOffset``, so if the broker dies between the
two writes, :meth:`TransactionalMessageService.recover` still sees the commit, marks the half
COMMITTED, and :meth:`start` writes the missing ``d`` record: no crash can make a commit happen
twice.  A check count is recorded after the checks are sent; a crash in between loses at most
one count per half (the safe direction: a count is never burned without a check).

Recovery (:meth:`TransactionalMessageService.recover`) reads the op and discard queues, decodes
only the halves no decision names, and scans the commitlog from the oldest of those for
committed messages: its cost follows the transactional records, not the normal traffic in the
log.  At a clean close the service also writes ``txstate.snapshot`` in the data dir: the
decision bytes, the undecided halves' check counts, the decision history
(:mod:`txbroker.service.txhistory`) and the op/discard/half queue ends and commitlog end it
reflects.  The next ``recover()`` loads it (once: it is deleted on load, so a
crash later in that run falls back to the full replay) after checking it is not ahead of the
store, then replays only the queue tails after it; the commit scan starts no earlier than its
commitlog end.  A clean restart therefore costs what happened since the snapshot, not the
whole history.  The decision history survives both paths: a replay rebuilds it from the op
records (decision time = the record's store time) and the discard copies.  The benchmark ``bench/txcheck.py`` reports both paths.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import re
import struct
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from txbroker.config import BrokerConfig
from txbroker.remoting.codes import ResponseCode
from txbroker.service.check import CheckPassReport, CheckService
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.tx_processors import transaction_handlers
from txbroker.service.txhistory import Decided, TxHistory
from txbroker.service.txstate import (
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
    CHECK_MAX_TIME_TOPIC,
    HALF_TOPIC,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    OP_HALF_TOPIC,
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_MASK,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    RecordError,
    StoredMessage,
    decode_offset_msg_id,
    string_to_properties,
)

if TYPE_CHECKING:
    from txbroker.service.clients import ClientRegistry
    from txbroker.store.message_store import MessageStore

__all__ = ["CheckPassReport", "HalfEntry", "TransactionalMessageService", "transaction_handlers"]

log = logging.getLogger(__name__)

#: RocketMQ's op tag (TransactionalMessageUtil.REMOVETAG): the half is decided.
OP_TAG_DONE = "d"
#: txbroker: check counts of one pass.
OP_TAG_CHECKS = "c"
#: txbroker: an operator resumed a discarded half.
OP_TAG_RESUME = "r"
PROPERTY_STATE = "TXB_STATE"
PROPERTY_OPERATOR = "TXB_OPERATOR"
PROPERTY_SOURCE = "TXB_SOURCE"

_PUT_OK = ("OK", "FLUSH_DISK_TIMEOUT")
#: Body bytes of recently prepared halves kept in memory, so that the common commit (within
#: moments of the half) builds the final message without reading the half back and decoding it.
_RECENT_HALF_BYTES = 16 * 1024 * 1024
#: Messages and bytes per store.get while recovering.
_RECOVERY_BATCH = 4096
_RECOVERY_BYTES = 64 * 1024 * 1024
_MAGIC = struct.Struct(">I")
_ZERO_RUNS = re.compile(rb"\x00+")
#: Written at clean close, read (once) by recover(): see the module docstring.
SNAPSHOT_FILE = "txstate.snapshot"
_SNAPSHOT_MAGIC = b"TXBSNAP1"
#: 2: carries the decision history.  Another version is not loaded (the replay rebuilds all).
_SNAPSHOT_VERSION = 2
_SNAPSHOT_LEN = struct.Struct(">I")
_STATE_CODES = {HalfState.COMMITTED: 1, HalfState.ROLLED_BACK: 2}
_CODE_STATES = {code: state for state, code in _STATE_CODES.items()}  # RocketMQ counts a flush time-out as stored


@dataclass(slots=True, eq=False)
class HalfEntry:
    """What the broker keeps in memory about one unresolved half message."""

    phys: int               # commitlog offset: the half's identity
    queue_offset: int       # offset in the half queue (tranStateTableOffset)
    store_ts: int           # ms, the broker's clock: immunity is measured on this
    immunity_ms: int
    group: str
    uniq: str | None
    topic: str              # the real topic
    queue_id: int           # the real queue
    keys: str | None
    tags: str | None
    body_size: int
    msg_id: str             # offsetMsgId
    state: HalfState = HalfState.PENDING
    checks: int = 0
    #: The connection that sent the half (asked first on a check); None after a restart.
    conn: Any = None

    def row(self, now_ms: int) -> dict[str, Any]:
        """The TXN_LIST row."""
        return {
            "id": self.uniq or self.msg_id, "offset_msg_id": self.msg_id,
            "commit_log_offset": self.phys, "queue_offset": self.queue_offset,
            "topic": self.topic, "queue_id": self.queue_id, "keys": self.keys, "tags": self.tags,
            "producer_group": self.group, "age_s": round(max(0, now_ms - self.store_ts) / 1000, 3),
            "checks": self.checks, "state": self.state.value,
        }


def _put_ok(result: PutResult) -> bool:
    return result.status.name in _PUT_OK


def is_uint(text: str) -> bool:
    """ASCII decimal digits only (``str.isdigit`` also accepts "²", which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def _parse_offsets(body: bytes) -> list[int]:
    """``"17"`` (4.x) or ``"17,18,"`` (5.x batch) → [17, 18]; junk pieces are skipped."""
    out = []
    for piece in body.decode("utf-8", "replace").split(","):
        piece = piece.strip()
        if is_uint(piece):
            out.append(int(piece))
    return out


class _RecordView(NamedTuple):
    """What recovery needs of an op or discard record."""

    phys: int
    born_ts: int
    store_ts: int
    topic: str
    body: bytes
    properties: dict[str, str]


_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
#: Positions in a stored record (docs/protocol.md §6.1, IPv4 hosts: the store writes no other).
_PHYS_POS, _BORN_TS_POS, _STORE_TS_POS, _BODY_LEN_POS = 28, 40, 56, 84


def _view(raw: bytes) -> _RecordView:
    """Decode only offset, body, topic and properties: recovery reads millions of op records,
    and building a full StoredMessage for each doubles the replay time."""
    if len(raw) < MIN_RECORD_SIZE or _MAGIC.unpack_from(raw, 4)[0] != MESSAGE_MAGIC:
        raise RecordError("not a message record")
    body_len = _I32.unpack_from(raw, _BODY_LEN_POS)[0]
    p = _BODY_LEN_POS + 4
    if body_len < 0 or p + body_len + 3 > len(raw):
        raise RecordError(f"body length {body_len} exceeds the record")
    body = raw[p:p + body_len]
    p += body_len
    topic_end = p + 1 + raw[p]
    topic = raw[p + 1:topic_end].decode()
    props_len = _I16.unpack_from(raw, topic_end)[0]
    props = string_to_properties(raw[topic_end + 2:topic_end + 2 + props_len].decode())
    return _RecordView(_I64.unpack_from(raw, _PHYS_POS)[0], _I64.unpack_from(raw, _BORN_TS_POS)[0],
                       _I64.unpack_from(raw, _STORE_TS_POS)[0], topic, body, props)


def _parse_counts(body: bytes) -> list[tuple[int, int]]:
    out = []
    for piece in body.decode("utf-8", "replace").split(","):
        qo, sep, n = piece.strip().partition(":")
        if sep and is_uint(qo) and is_uint(n):
            out.append((int(qo), int(n)))
    return out


class ResolvedStates:
    """Final state of every decided half, one byte per half-queue offset.

    Half-queue offsets are dense and increase with time, so a ``bytearray`` indexed from the
    oldest half seen holds the decision of every retained transaction at one byte each (a dict
    would cost ~100 bytes per entry).  0 means "not decided here".
    """

    def __init__(self) -> None:
        self._base: int | None = None
        self._buf = bytearray()

    def set(self, queue_offset: int, state: HalfState) -> None:
        if self._base is None:
            self._base = queue_offset
        i = queue_offset - self._base
        if i < 0:
            # older than anything seen (only after a store that lost its head): grow downwards
            self._buf[0:0] = bytes(-i)
            self._base, i = queue_offset, 0
        if i >= len(self._buf):
            self._buf.extend(bytes(i + 1 - len(self._buf)))
        self._buf[i] = _STATE_CODES[state]

    def get(self, queue_offset: int) -> HalfState | None:
        if self._base is None:
            return None
        i = queue_offset - self._base
        if 0 <= i < len(self._buf):
            return _CODE_STATES.get(self._buf[i])
        return None

    def export(self) -> tuple[int | None, bytes]:
        return self._base, bytes(self._buf)

    @classmethod
    def restore(cls, base: int | None, data: bytes) -> ResolvedStates:
        rs = cls()
        if base is not None:
            rs._base, rs._buf = base, bytearray(data)
        return rs

    def trim_below(self, queue_offset: int) -> None:
        """Forget decisions about halves below ``queue_offset`` (deleted by retention)."""
        if self._base is None or queue_offset <= self._base:
            return
        n = min(queue_offset - self._base, len(self._buf))
        del self._buf[:n]
        self._base = queue_offset if not self._buf else self._base + n

    def undecided_runs(self, lo: int, hi: int) -> Iterator[tuple[int, int]]:
        """Runs ``[start, end)`` of queue offsets in ``[lo, hi)`` with no decision recorded.

        Found with a regular expression over the byte array (C speed), so finding the few
        undecided halves among millions of decided ones does not loop in Python per half.
        """
        if self._base is None:
            if lo < hi:
                yield lo, hi
            return
        base, end = self._base, self._base + len(self._buf)
        if lo < min(base, hi):
            yield lo, min(base, hi)
        first, last = max(lo, base), min(hi, end)
        if first < last:
            for m in _ZERO_RUNS.finditer(self._buf, first - base, last - base):
                yield base + m.start(), base + m.end()
        if max(lo, end) < hi:
            yield max(lo, end), hi


class TransactionalMessageService:
    """Coordinator of transactional messages; event-loop only (no locking across threads)."""

    def __init__(self, config: BrokerConfig, store: MessageStore, registry: ClientRegistry,
                 metrics: BrokerMetrics, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self.registry = registry
        self.metrics = metrics
        self.clock = clock
        self._pending: dict[int, HalfEntry] = {}
        self._discarded: dict[int, HalfEntry] = {}
        self._resolved = ResolvedStates()
        #: Who decided the most recent halves and when (TXN_SHOW, decisions by id).
        self.history = TxHistory(config.transaction_history_size)
        #: UNIQ_KEY -> commitlog offset, for unresolved halves (admin lookups).
        self._by_uniq: dict[str, int] = {}
        #: commitlog offset -> the half as it was stored, newest last, bounded by
        #: ``_RECENT_HALF_BYTES`` of bodies: only a cache, the store stays the truth.
        self._recent: OrderedDict[int, Message] = OrderedDict()
        self._recent_bytes = 0
        #: Per-half locks while a decision is being written: [lock, users].
        self._locks: dict[int, list] = {}
        #: Halves recovered as committed whose ``d`` record was missing; written by start().
        self._missing_ops: list[tuple[int, int]] = []
        self._checker = CheckService(self, config)
        # Op records get a fresh UNIQ_KEY (as RocketMQ's): random per process + a counter.
        self._id_prefix = uuid.uuid4().hex[:16].upper()
        self._ids = itertools.count()
        # Gauges are computed when scraped; per-source counters resolved once.
        metrics.pending.set_function(self.pending_count)
        metrics.discarded.set_function(self.discarded_count)
        self._decided = {
            (state, source): (metrics.commits if state is HalfState.COMMITTED
                              else metrics.rollbacks).labels(source=source)
            for state in (HalfState.COMMITTED, HalfState.ROLLED_BACK)
            for source in ("producer", "check", "operator")}
        #: Whether the last recover() started from a clean-close snapshot.
        self.recovered_from_snapshot = False
        #: Fault-injection seam for crash tests: called after a commit's final message is
        #: stored and before its op record is written; raising there models a crash.
        self.after_final_message: Callable[[int], None] | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild pending, discarded and resolved halves and check counts from the store.

        Cost follows the transactional records, not the whole log:

        1. replay the op queue and the discard queue, merged in commitlog order: decisions
           (``d``), check counts (``c``), resumes (``r``) and discards;
        2. read from the half queue only the halves no decision names (runs of zeros in
           :class:`ResolvedStates`);
        3. scan the commitlog from the oldest of those halves for committed messages naming
           one of them in ``preparedTransactionOffset`` (a crash between a commit's final
           message and its op record); their op records are rewritten by :meth:`start`.

        The decision history is rebuilt on the way: the snapshot's, then the newest decisions,
        discards and resumes replayed (at most ``transaction_history_size`` of them are kept
        while replaying, so a long op queue costs no more memory than the history itself).
        """
        started = time.perf_counter()
        self._pending.clear()
        self._discarded.clear()
        self._resolved = ResolvedStates()
        self.history = TxHistory(self.config.transaction_history_size)
        self._by_uniq.clear()
        self._recent.clear()
        self._recent_bytes = 0
        self._missing_ops.clear()
        counts: dict[int, int] = {}       # half queue offset -> checks, for undecided halves
        discarded: set[int] = set()       # half queue offsets currently discarded
        records = 0
        op_from = self.store.min_offset(OP_HALF_TOPIC, 0)
        discard_from = self.store.min_offset(CHECK_MAX_TIME_TOPIC, 0)
        commits_from = 0
        # TxHistory.replay events in log order: Decided's fields as a plain tuple (cheap: one
        # per op record), (qo,) for a resume
        decided: deque[tuple] = deque(maxlen=max(self.history.capacity, 1))
        snap = self._take_snapshot()
        if snap is not None:
            self._resolved = ResolvedStates.restore(snap["resolved_base"], snap["resolved"])
            self.history = snap["history"]
            for qo, checks, state in snap["open"]:
                counts[qo] = checks
                if state == HalfState.DISCARDED.value:
                    discarded.add(qo)
            self._missing_ops = [(phys, qo) for phys, qo in snap["missing_ops"]]
            op_from = max(op_from, snap["op_next"])
            discard_from = max(discard_from, snap["discard_next"])
            commits_from = snap["log_end"]
        events = heapq.merge(self._queue(OP_HALF_TOPIC, op_from),
                             self._queue(CHECK_MAX_TIME_TOPIC, discard_from),
                             key=lambda m: m.phys)
        for m in events:
            records += 1
            if m.topic == CHECK_MAX_TIME_TOPIC:
                raw = m.properties.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, "")
                if is_uint(raw) and self._resolved.get(int(raw)) is None:
                    discarded.add(int(raw))
                    decided.append((int(raw), HalfState.DISCARDED, "check", None, m.store_ts,
                                    m.properties.get(PROPERTY_UNIQ_KEY)))
                continue
            tag = m.properties.get(PROPERTY_TAGS)
            if tag == OP_TAG_DONE:
                # txbroker's op records say which decision; a RocketMQ 4.x one does not, and
                # is taken as a rollback unless step 3 finds the committed message.
                state = (HalfState.COMMITTED if m.properties.get(PROPERTY_STATE) == HalfState.COMMITTED.value
                         else HalfState.ROLLED_BACK)
                operator = m.properties.get(PROPERTY_OPERATOR)
                source = m.properties.get(PROPERTY_SOURCE) or ("operator" if operator else "unknown")
                for qo in _parse_offsets(m.body):
                    self._resolved.set(qo, state)
                    counts.pop(qo, None)
                    discarded.discard(qo)
                    decided.append((qo, state, source, operator, m.born_ts,
                                    m.properties.get(PROPERTY_TRANSACTION_ID)))
            elif tag == OP_TAG_CHECKS:
                for qo, n in _parse_counts(m.body):
                    if self._resolved.get(qo) is None:
                        counts[qo] = n
            elif tag == OP_TAG_RESUME:
                for qo in _parse_offsets(m.body):
                    if qo in discarded:
                        discarded.discard(qo)
                        counts[qo] = 0
                        decided.append((qo,))
        self.history.replay(decided)
        self.trim_resolved()
        open_by_phys: dict[int, HalfEntry] = {}
        for m in self._undecided_halves():
            records += 1
            entry = self._entry_from(m)
            entry.checks = counts.get(entry.queue_offset, 0)
            if entry.queue_offset in discarded:
                entry.state = HalfState.DISCARDED
            open_by_phys[entry.phys] = entry
        if open_by_phys:
            # after a clean stop every earlier commit has its op record (or is listed in the
            # snapshot's missing ops): only commits made since can lack one
            for m in self.store.scan(max(min(open_by_phys), commits_from)):
                records += 1
                if (m.sys_flag & TRANSACTION_MASK) != TRANSACTION_COMMIT_TYPE:
                    continue
                entry = open_by_phys.pop(m.prepared_transaction_offset, None)
                if entry is not None:
                    self._resolved.set(entry.queue_offset, HalfState.COMMITTED)
                    self._missing_ops.append((entry.phys, entry.queue_offset))
                    # who committed died with the op record: say so, do not guess
                    self.history.record(Decided(entry.queue_offset, HalfState.COMMITTED, "unknown",
                                                None, m.store_timestamp, entry.uniq))
        for entry in open_by_phys.values():
            pool = self._pending if entry.state is HalfState.PENDING else self._discarded
            pool[entry.phys] = entry
            if entry.uniq:
                self._by_uniq[entry.uniq] = entry.phys
        # Nothing to recover (a new data directory) is not news at start-up.
        log.log(logging.INFO if records or snap is not None else logging.DEBUG,
                "transaction state recovered (%s) from %d records in %.3fs: %d pending, "
                "%d discarded, %d op records to rewrite",
                 "snapshot + tail" if snap is not None else "full replay", records,
                 time.perf_counter() - started, len(self._pending), len(self._discarded),
                 len(self._missing_ops))
        self.recovered_from_snapshot = snap is not None

    def _queue(self, topic: str, offset: int) -> Iterator[_RecordView]:
        """Views of ``topic`` queue 0 from queue offset ``offset`` on, in order.

        An undecodable record is logged and skipped: one damaged op record must not keep the
        broker from starting (at worst its half is checked again).
        """
        end = self.store.max_offset(topic, 0)
        while offset < end:
            res = self.store.get(topic, 0, offset, _RECOVERY_BATCH, _RECOVERY_BYTES)
            for raw in res.raw:
                try:
                    yield _view(raw)
                except (RecordError, struct.error, IndexError, UnicodeDecodeError) as exc:
                    log.error("skipping an undecodable %s record during recovery: %s", topic, exc)
            if res.next_offset <= offset:
                break
            offset = res.next_offset

    def _undecided_halves(self) -> Iterator[StoredMessage]:
        """Retained halves that no decision names, read run by run from the half queue."""
        lo = self.store.min_offset(HALF_TOPIC, 0)
        hi = self.store.max_offset(HALF_TOPIC, 0)
        for start, end in self._resolved.undecided_runs(lo, hi):
            offset = start
            while offset < end:
                res = self.store.get(HALF_TOPIC, 0, offset, min(end - offset, _RECOVERY_BATCH),
                                     _RECOVERY_BYTES)
                yield from res.messages()
                if res.next_offset <= offset:
                    break
                offset = res.next_offset

    async def start(self) -> None:
        """Write op records recovery found missing, then start the periodic check service."""
        missing, self._missing_ops = self._missing_ops, []
        for phys, qo in missing:
            extra = {PROPERTY_STATE: HalfState.COMMITTED.value}
            known = self.history.get(qo)
            if known is not None:
                extra.update(self._decision_properties(known))
            result = await self._put_op(OP_TAG_DONE, str(qo), extra,
                                        born_ms=known.decided_at if known is not None else None)
            if _put_ok(result):
                log.warning("rewrote the missing op record of committed half %d (queue offset %d)",
                            phys, qo)
            else:
                self._missing_ops.append((phys, qo))
                log.error("could not rewrite the op record of committed half %d: %s", phys,
                          result.status.name)
        self._checker.start()

    async def close(self) -> None:
        """Stop checking and write the snapshot (call before the store closes)."""
        await self._checker.close()
        try:
            self._write_snapshot()
        except OSError as exc:
            log.error("transaction snapshot not written (the next start replays): %s", exc)

    # --- snapshot --------------------------------------------------------------------------
    @property
    def snapshot_path(self) -> Path:
        return self.config.data_path / SNAPSHOT_FILE

    def _write_snapshot(self) -> None:
        """State as of the current queue ends, written atomically (tmp file, fsync, rename)."""
        base, resolved = self._resolved.export()
        meta = {
            "version": _SNAPSHOT_VERSION,
            "op_next": self.store.max_offset(OP_HALF_TOPIC, 0),
            "discard_next": self.store.max_offset(CHECK_MAX_TIME_TOPIC, 0),
            "half_next": self.store.max_offset(HALF_TOPIC, 0),
            "log_end": self.store.max_physical_offset,
            "resolved_base": base,
            "open": [[e.queue_offset, e.checks, e.state.value]
                     for e in (*self._pending.values(), *self._discarded.values())],
            "missing_ops": self._missing_ops,
            "history": self.history.export(),
        }
        head = orjson.dumps(meta)
        path = self.snapshot_path
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(_SNAPSHOT_MAGIC + _SNAPSHOT_LEN.pack(len(head)) + head + resolved)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def _take_snapshot(self) -> dict[str, Any] | None:
        """Load and remove the snapshot; None if absent, unreadable or not matching the store.

        Removed on load so that it is used once: after a crash later in this run the next
        start replays everything instead of trusting an old snapshot.
        """
        path = self.snapshot_path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("transaction snapshot unreadable, replaying: %s", exc)
            return None
        path.unlink(missing_ok=True)
        try:
            if not data.startswith(_SNAPSHOT_MAGIC):
                raise ValueError("bad magic")
            (n,) = _SNAPSHOT_LEN.unpack_from(data, len(_SNAPSHOT_MAGIC))
            start = len(_SNAPSHOT_MAGIC) + _SNAPSHOT_LEN.size
            meta = orjson.loads(data[start:start + n])
            meta["resolved"] = data[start + n:]
            if meta["version"] != _SNAPSHOT_VERSION:
                raise ValueError(f"version {meta['version']}, this broker reads {_SNAPSHOT_VERSION}")
            history = TxHistory(self.config.transaction_history_size)
            history.load(meta["history"])
            meta["history"] = history
            fits = (meta["op_next"] <= self.store.max_offset(OP_HALF_TOPIC, 0)
                    and meta["discard_next"] <= self.store.max_offset(CHECK_MAX_TIME_TOPIC, 0)
                    and meta["half_next"] <= self.store.max_offset(HALF_TOPIC, 0)
                    and meta["log_end"] <= self.store.max_physical_offset)
        except (ValueError, KeyError, TypeError, struct.error, orjson.JSONDecodeError) as exc:
            log.warning("transaction snapshot invalid (%s), replaying", exc)
            return None
        if not fits:
            log.warning("transaction snapshot is ahead of the store (a lost tail?), replaying")
            return None
        return meta

    # --- queries ---------------------------------------------------------------------------
    def pending_count(self) -> int:
        return len(self._pending)

    def discarded_count(self) -> int:
        return len(self._discarded)

    def state_of(self, phys: int) -> HalfState | None:
        """The state of the half at commitlog offset ``phys``; None if it is not a known half.

        A decided half is looked up by its queue offset, read back from the store.
        """
        entry = self._pending.get(phys) or self._discarded.get(phys)
        if entry is not None:
            return entry.state
        half = self._read_half(phys)
        return self._resolved.get(half.queue_offset) if half is not None else None

    def entry(self, phys: int) -> HalfEntry | None:
        return self._pending.get(phys) or self._discarded.get(phys)

    def pending_entries(self) -> list[HalfEntry]:
        return list(self._pending.values())

    def resolve_id(self, txn_id: str) -> int | None:
        """A UNIQ_KEY or an offsetMsgId → the half's commitlog offset (None if unknown).

        A UNIQ_KEY resolves while its half is undecided or in the decision history.
        """
        phys = self._by_uniq.get(txn_id)
        if phys is not None:
            return phys
        known = self.history.by_txn_id(txn_id)
        if known is not None:
            half = self._half_at(known.queue_offset)
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
        pools = {"pending": (self._pending,), "discarded": (self._discarded,),
                 "all": (self._pending, self._discarded)}[state]
        now_ms = self._now_ms()
        entries = sorted((e for pool in pools for e in pool.values()
                          if (topic is None or e.topic == topic) and (group is None or e.group == group)),
                         key=lambda e: e.phys)
        return [e.row(now_ms) for e in entries[:limit]]

    def show(self, txn_id: str) -> dict[str, Any] | None:
        """TXN_SHOW: the row plus body size, the stored properties and, once decided or
        discarded, the decision: ``source`` (producer, check, operator or unknown),
        ``operator``, ``decided_at`` (ms; None when the history no longer holds it).
        ``prepared_at`` is the half's store time.  None if the id names no half."""
        phys = self.resolve_id(txn_id)
        if phys is None:
            return None
        half = self._read_half(phys)
        if half is None:
            return None
        entry = self.entry(phys) or self._entry_from(half)
        row = entry.row(self._now_ms())
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
        row["body_size"] = len(half.body)
        row["store_timestamp"] = half.store_timestamp
        row["born_timestamp"] = half.born_timestamp
        row["properties"] = dict(half.properties)
        return row

    # --- prepare ---------------------------------------------------------------------------
    async def prepare(self, msg: Message, conn: Any | None) -> PutResult:
        """Store ``msg`` as a half message and index it as PENDING."""
        props = dict(msg.properties)
        group = props.get(PROPERTY_PRODUCER_GROUP, "")
        if not group:
            raise TransactionError(ResponseCode.MESSAGE_ILLEGAL,
                                   "a transactional message needs the PGROUP property")
        delay = props.get(PROPERTY_DELAY_TIME_LEVEL)
        if delay not in (None, "", "0"):
            raise TransactionError(ResponseCode.MESSAGE_ILLEGAL,
                                   f"a transactional message cannot have a delay level (DELAY={delay})")
        immunity = props.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        if immunity is not None and not is_uint(immunity.strip()):
            raise TransactionError(ResponseCode.MESSAGE_ILLEGAL,
                                   f"property CHECK_IMMUNITY_TIME_IN_SECONDS={immunity!r} is not a "
                                   "non-negative integer")
        retried = self._retried_half(props.get(PROPERTY_UNIQ_KEY), group, msg)
        if retried is not None:
            retried.conn = conn or retried.conn  # the retrying connection is the live one
            self.metrics.retried_halves.inc()
            return PutResult(PutStatus.OK, physical_offset=retried.phys,
                             queue_offset=retried.queue_offset, msg_id=retried.msg_id,
                             store_timestamp=retried.store_ts)
        props[PROPERTY_REAL_TOPIC] = msg.topic
        props[PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
        half = Message(topic=HALF_TOPIC, queue_id=0, body=msg.body, flag=msg.flag,
                       properties=props, sys_flag=msg.sys_flag & ~TRANSACTION_MASK,
                       born_timestamp=msg.born_timestamp, born_host=msg.born_host,
                       reconsume_times=msg.reconsume_times)
        result = await self.store.put(half)
        if not _put_ok(result):
            return result
        entry = HalfEntry(
            phys=result.physical_offset, queue_offset=result.queue_offset,
            store_ts=result.store_timestamp, immunity_ms=self._immunity_ms(props), group=group,
            uniq=props.get(PROPERTY_UNIQ_KEY), topic=msg.topic, queue_id=msg.queue_id,
            keys=msg.keys, tags=msg.tags, body_size=len(msg.body), msg_id=result.msg_id,
            conn=conn)
        self._pending[entry.phys] = entry
        if entry.uniq:
            self._by_uniq[entry.uniq] = entry.phys
        self._remember(entry.phys, half)
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
        phys = self._by_uniq.get(uniq)
        entry = self._pending.get(phys) if phys is not None else None
        if entry is None or entry.group != group or entry.topic != msg.topic \
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
        kind = {TRANSACTION_COMMIT_TYPE: "commit", TRANSACTION_ROLLBACK_TYPE: "rollback",
                TRANSACTION_NOT_TYPE: "unknown"}.get(commit_or_rollback)
        if kind is None:
            raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                   f"commitOrRollback={commit_or_rollback} must be 0, 8 or 12")
        if from_check:
            self.metrics.check_answers.labels(kind=kind).inc()
        if kind == "unknown":
            self.metrics.unknown_ends.inc()
            return None
        decision = Decision.COMMIT if kind == "commit" else Decision.ROLLBACK
        async with self._locked(commit_log_offset):
            state = self._validate_end(commit_log_offset, tran_state_table_offset, producer_group)
            return await self._apply(commit_log_offset, state, decision,
                                     source="check" if from_check else "producer")

    def _validate_end(self, phys: int, queue_offset: int, group: str) -> HalfState:
        """RocketMQ's checks, with its remarks (clients and operators grep for them)."""
        entry = self.entry(phys)
        if entry is not None:
            half_group, half_qo, state = entry.group, entry.queue_offset, entry.state
        else:
            half = self._read_half(phys)
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
        return state

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
        async with self._locked(phys):
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
                     operator: str | None = None, name: str | None = None) -> Outcome:
        """Write ``decision`` (or nothing, for a repeat; or refuse a contradiction, naming
        the transaction ``name`` or, for a producer's END, the half's commitlog offset)."""
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
        entry = self.entry(phys)
        assert entry is not None  # APPLY only from PENDING/DISCARDED, which are indexed
        decided = Decided(entry.queue_offset, target, source, operator, self._now_ms(), entry.uniq)
        extra = {PROPERTY_STATE: target.value, **self._decision_properties(decided)}
        if decision is Decision.COMMIT:
            half = self._recall(phys) or self._read_half(phys)
            if half is None:
                raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                       "Find prepared transaction message failed")
            result = await self.store.put(self._final_message(half, phys, entry.store_ts))
            if not _put_ok(result):
                raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                       f"commit failed, the store refused the message: "
                                       f"{result.status.name} {result.reason}".strip())
            if self.after_final_message is not None:
                self.after_final_message(phys)
            # The final message is durable: the half is committed whatever happens to the op.
            self._settle(entry, decided)
            op = await self._put_op(OP_TAG_DONE, str(entry.queue_offset), extra,
                                    born_ms=decided.decided_at)
            if not _put_ok(op):
                self._missing_ops.append((phys, entry.queue_offset))
                log.error("op record of committed half %d not written (%s); it is rewritten at "
                          "the next start", phys, op.status.name)
        else:
            op = await self._put_op(OP_TAG_DONE, str(entry.queue_offset), extra,
                                    born_ms=decided.decided_at)
            if not _put_ok(op):
                raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                       f"rollback failed, the store refused the op record: "
                                       f"{op.status.name} {op.reason}".strip())
            self._settle(entry, decided)
        return Outcome.APPLY

    @staticmethod
    def _decision_properties(decided: Decided) -> dict[str, str]:
        """What a ``d`` record carries so a replay knows who decided which transaction."""
        props = {}
        if decided.source != "unknown":
            props[PROPERTY_SOURCE] = decided.source
        if decided.operator:
            props[PROPERTY_OPERATOR] = decided.operator
        if decided.txn_id:
            props[PROPERTY_TRANSACTION_ID] = decided.txn_id
        return props

    def _settle(self, entry: HalfEntry, decided: Decided) -> None:
        self._pending.pop(entry.phys, None)
        self._discarded.pop(entry.phys, None)
        self._recall(entry.phys)
        if entry.uniq:
            self._by_uniq.pop(entry.uniq, None)
        entry.state = target = decided.state
        entry.conn = None
        self._resolved.set(entry.queue_offset, target)
        self.history.record(decided)
        self._decided[(target, decided.source)].inc()
        self.metrics.decision_latency.observe(max(0, self._now_ms() - entry.store_ts) / 1000)

    def _final_message(self, half: Message, phys: int, store_ts: int) -> Message:
        """The committed message: real topic and queue back, transaction markers removed.

        ``half`` is the half as stored at ``phys`` with store timestamp ``store_ts`` (read
        back, or the cached object that was put there).  Empty names and values are dropped,
        as reading a record back drops them (RocketMQ's decoder does the same)."""
        props = {k: v for k, v in half.properties.items() if k and v}
        topic = props.pop(PROPERTY_REAL_TOPIC, "")
        qid = props.pop(PROPERTY_REAL_QUEUE_ID, "0")
        if not topic:
            raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                   f"half message {phys} has no REAL_TOPIC")
        props.pop(PROPERTY_TRANSACTION_PREPARED, None)
        uniq = props.get(PROPERTY_UNIQ_KEY)
        if uniq:
            props.setdefault(PROPERTY_TRANSACTION_ID, uniq)
        return Message(topic=topic, queue_id=int(qid) if is_uint(qid) else 0, body=half.body,
                       flag=half.flag, properties=props,
                       sys_flag=(half.sys_flag & ~TRANSACTION_MASK) | TRANSACTION_COMMIT_TYPE,
                       born_timestamp=half.born_timestamp, born_host=half.born_host,
                       reconsume_times=half.reconsume_times,
                       prepared_transaction_offset=phys, store_timestamp=store_ts)

    # --- discard / resume / check counts (used by the check service) -----------------------
    async def discard(self, entry: HalfEntry) -> bool:
        """Move a half checked ``transaction_check_max`` times to TRANS_CHECK_MAX_TIME_TOPIC."""
        async with self._locked(entry.phys):
            outcome, target = decide(self.state_of(entry.phys), Decision.DISCARD)
            if outcome is not Outcome.APPLY:
                return False
            half = self._read_half(entry.phys)
            if half is None:
                self.forget(entry, "its record can no longer be read (retention or damage)")
                return False
            props = dict(half.properties)
            props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(entry.checks)
            props[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] = str(entry.queue_offset)
            copy = Message(topic=CHECK_MAX_TIME_TOPIC, queue_id=0, body=half.body, flag=half.flag,
                           properties=props, sys_flag=half.sys_flag,
                           born_timestamp=half.born_timestamp, born_host=half.born_host,
                           reconsume_times=half.reconsume_times)
            result = await self.store.put(copy)
            if not _put_ok(result):
                log.error("discard of half %d failed: %s", entry.phys, result.status.name)
                return False
            self._pending.pop(entry.phys, None)
            self._recall(entry.phys)
            entry.state = target
            self._discarded[entry.phys] = entry
            # a replay reads the discard time from the copy's store timestamp: the same value
            self.history.record(Decided(entry.queue_offset, target, "check", None,
                                        result.store_timestamp, entry.uniq))
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
        entry = self._discarded[phys]
        result = await self._put_op(OP_TAG_RESUME, f"{entry.queue_offset},", {PROPERTY_OPERATOR: operator})
        if not _put_ok(result):
            raise TransactionError(ResponseCode.SYSTEM_ERROR,
                                   f"resume failed, the store refused the record: {result.status.name}")
        del self._discarded[phys]
        self.history.drop(entry.queue_offset)
        entry.state = target
        entry.checks = 0
        self._pending[phys] = entry
        self.metrics.resumes.inc()
        return Outcome.APPLY

    async def record_checks(self, entries: list[HalfEntry]) -> None:
        """Persist the check counts of one pass as ``c`` records (one, unless it is huge)."""
        limit = max(256, self.config.max_message_size // 2)
        chunk: list[str] = []
        size = 0
        for e in entries:
            piece = f"{e.queue_offset}:{e.checks},"
            chunk.append(piece)
            size += len(piece)
            if size >= limit:
                await self._put_checks(chunk)
                chunk, size = [], 0
        if chunk:
            await self._put_checks(chunk)

    async def _put_checks(self, pieces: list[str]) -> None:
        result = await self._put_op(OP_TAG_CHECKS, "".join(pieces), {})
        if not _put_ok(result):
            log.error("check counts of %d halves not persisted: %s", len(pieces), result.status.name)

    def trim_resolved(self) -> None:
        """Drop decisions about halves retention has deleted (run by every check pass)."""
        oldest = self.store.min_offset(HALF_TOPIC, 0)
        self._resolved.trim_below(oldest)
        self.history.trim_below(oldest)

    def forget(self, entry: HalfEntry, reason: str) -> None:
        """Drop an undecided half from the index because its record is gone."""
        self._pending.pop(entry.phys, None)
        self._discarded.pop(entry.phys, None)
        self._recall(entry.phys)
        if entry.uniq:
            self._by_uniq.pop(entry.uniq, None)
        log.error("half %d (%s, group %s) dropped from the pending index: %s", entry.phys,
                  entry.uniq, entry.group, reason)

    def read_half(self, phys: int) -> StoredMessage | None:
        return self._read_half(phys)

    async def check_now(self) -> CheckPassReport:
        """Run one check pass now (tests, operators); the periodic service runs the same."""
        return await self._checker.run_pass()

    def is_busy(self, phys: int) -> bool:
        """A decision on this half is being written right now."""
        return phys in self._locks

    # --- helpers ---------------------------------------------------------------------------
    @asynccontextmanager
    async def _locked(self, phys: int) -> AsyncIterator[None]:
        """Serialise decisions per half; the lock lives only while someone holds or waits."""
        slot = self._locks.get(phys)
        if slot is None:
            slot = self._locks[phys] = [asyncio.Lock(), 0]
        slot[1] += 1
        try:
            async with slot[0]:
                yield
        finally:
            slot[1] -= 1
            if slot[1] == 0:
                del self._locks[phys]

    def _half_at(self, queue_offset: int) -> StoredMessage | None:
        """The half message at ``queue_offset`` of the half queue, if still retained."""
        found = self.store.get(HALF_TOPIC, 0, queue_offset, 1).messages()
        return found[0] if found and found[0].queue_offset == queue_offset else None

    def _read_half(self, phys: int) -> StoredMessage | None:
        """The half message at ``phys``, or None if there is no half message there."""
        try:
            m = self.store.read(phys)
        except (RecordError, ValueError, IndexError):
            return None
        if m is None or m.topic != HALF_TOPIC or m.physical_offset != phys:
            return None
        return m

    def _entry_from(self, m: StoredMessage) -> HalfEntry:
        props = m.properties
        qid = props.get(PROPERTY_REAL_QUEUE_ID, "0")
        try:
            immunity = self._immunity_ms(props)
        except ValueError:
            immunity = int(self.config.transaction_timeout * 1000)
        return HalfEntry(
            phys=m.physical_offset, queue_offset=m.queue_offset, store_ts=m.store_timestamp,
            immunity_ms=immunity, group=props.get(PROPERTY_PRODUCER_GROUP, ""),
            uniq=props.get(PROPERTY_UNIQ_KEY), topic=props.get(PROPERTY_REAL_TOPIC, ""),
            queue_id=int(qid) if is_uint(qid) else 0, keys=m.keys, tags=m.tags,
            body_size=len(m.body), msg_id=m.msg_id)

    def _immunity_ms(self, props: dict[str, str]) -> int:
        raw = props.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        if raw is not None and is_uint(raw.strip()):
            return int(raw) * 1000
        return int(self.config.transaction_timeout * 1000)

    async def _put_op(self, tag: str, body: str, extra: dict[str, str], *,
                      born_ms: int | None = None) -> PutResult:
        """Append an op record; a ``d`` record is born at its decision's time, which a
        replay reads back as the decision time."""
        props = {PROPERTY_TAGS: tag, PROPERTY_UNIQ_KEY: f"{self._id_prefix}{next(self._ids):016X}",
                 **extra}
        return await self.store.put(Message(topic=OP_HALF_TOPIC, queue_id=0, body=body.encode(),
                                            properties=props,
                                            born_timestamp=self._now_ms() if born_ms is None else born_ms))

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)
