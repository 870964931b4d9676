"""Transaction recovery and the clean-close snapshot.

:func:`recover` reads the op and discard queues, decodes only the halves no decision names,
and scans the commitlog from the oldest of those for committed messages: its cost follows the
transactional records, not the normal traffic in the log.  A commit appends the final message
*before* its ``d`` record and the final message carries the half's commitlog offset in
``preparedTransactionOffset``, so if the broker died between the two writes the scan still
sees the commit, marks the half COMMITTED and lists the missing ``d`` record, which the
service writes at start: no crash can make a commit happen twice.

At a clean close the service writes ``txstate.snapshot`` in the data dir
(:func:`write_snapshot`): the decision bytes, the undecided halves' check counts, the decision
history (:mod:`txbroker.service.transaction.history`) and the op/discard/half queue ends and
commitlog end it reflects.  The next :func:`recover` loads it (once: it is deleted on load, so
a crash later in that run falls back to the full replay) after checking it is not ahead of the
store, then replays only the queue tails after it; the commit scan starts no earlier than its
commitlog end.  A clean restart therefore costs what happened since the snapshot, not the
whole history.  The decision history survives both paths: a replay rebuilds it from the op
records (decision time = the record's store time) and the discard copies.  The benchmark
``bench/txcheck.py`` reports both paths.
"""

from __future__ import annotations

import heapq
import logging
import os
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiofiles
import aiofiles.os
import orjson

from txbroker.service.transaction.bridge import TransactionalMessageBridge
from txbroker.service.transaction.history import Decided, TxHistory
from txbroker.service.transaction.index import ResolvedStates
from txbroker.service.transaction.oplog import (
    OP_TAG_CHECKS,
    OP_TAG_DONE,
    OP_TAG_RESUME,
    PROPERTY_OPERATOR,
    PROPERTY_SOURCE,
    PROPERTY_STATE,
    check_times,
    is_uint,
    parse_counts,
    parse_offsets,
)
from txbroker.service.transaction.pending import PendingIndex, index_stored
from txbroker.service.transaction.state import HalfState
from txbroker.store.record import (
    CHECK_MAX_TIME_TOPIC,
    HALF_TOPIC,
    OP_HALF_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_MASK,
)

log = logging.getLogger(__name__)

#: Written at clean close, read (once) by recover(): see the module docstring.
SNAPSHOT_FILE = "txstate.snapshot"
_SNAPSHOT_MAGIC = b"TXBSNAP1"
#: 2: carries the decision history.  Another version is not loaded (the replay rebuilds all).
_SNAPSHOT_VERSION = 2
_SNAPSHOT_LEN = struct.Struct(">I")


@dataclass
class Recovered:
    """The service's in-memory state as :func:`recover` rebuilt it."""

    resolved: ResolvedStates
    history: TxHistory
    #: The pending and discarded halves.
    open: PendingIndex = field(default_factory=PendingIndex)
    #: (commitlog offset, half queue offset) of halves committed without their ``d`` record.
    missing_ops: list[tuple[int, int]] = field(default_factory=list)
    from_snapshot: bool = False


def trim(bridge: TransactionalMessageBridge, resolved: ResolvedStates, history: TxHistory) -> None:
    """Drop decisions about halves retention has deleted."""
    oldest = bridge.min_offset(HALF_TOPIC)
    resolved.trim_below(oldest)
    history.trim_below(oldest)


def recover(bridge: TransactionalMessageBridge, snapshot_path: Path, *, history_size: int,
            default_immunity_ms: int) -> Recovered:
    """Rebuild pending, discarded and resolved halves and check counts from the store.

    Cost follows the transactional records, not the whole log:

    1. replay the op queue and the discard queue, merged in commitlog order: decisions
       (``d``), check counts (``c``), resumes (``r``) and discards;
    2. read from the half queue only the halves no decision names (runs of zeros in
       :class:`ResolvedStates`);
    3. scan the commitlog from the oldest of those halves for committed messages naming
       one of them in ``preparedTransactionOffset`` (a crash between a commit's final
       message and its op record); their op records are rewritten by the service's start.

    The decision history is rebuilt on the way: the snapshot's, then the newest decisions,
    discards and resumes replayed (at most ``history_size`` of them are kept while replaying,
    so a long op queue costs no more memory than the history itself).
    """
    started = time.perf_counter()
    out = Recovered(ResolvedStates(), TxHistory(history_size))
    counts: dict[int, int] = {}       # half queue offset -> checks, for undecided halves
    discarded: set[int] = set()       # half queue offsets currently discarded
    records = 0
    op_from = bridge.min_offset(OP_HALF_TOPIC)
    discard_from = bridge.min_offset(CHECK_MAX_TIME_TOPIC)
    commits_from = 0
    # TxHistory.replay events in log order: Decided's fields as a plain tuple (cheap: one
    # per op record), (qo,) for a resume
    decided: deque[tuple] = deque(maxlen=max(out.history.capacity, 1))
    snap = take_snapshot(bridge, snapshot_path, history_size)
    if snap is not None:
        out.resolved = ResolvedStates.restore(snap["resolved_base"], snap["resolved"])
        out.history = snap["history"]
        for qo, checks, state in snap["open"]:
            counts[qo] = checks
            if state == HalfState.DISCARDED.value:
                discarded.add(qo)
        out.missing_ops = [(phys, qo) for phys, qo in snap["missing_ops"]]
        op_from = max(op_from, snap["op_next"])
        discard_from = max(discard_from, snap["discard_next"])
        commits_from = snap["log_end"]
    resolved = out.resolved
    events = heapq.merge(bridge.views(OP_HALF_TOPIC, op_from),
                         bridge.views(CHECK_MAX_TIME_TOPIC, discard_from),
                         key=lambda m: m.phys)
    for m in events:
        records += 1
        if m.topic == CHECK_MAX_TIME_TOPIC:
            raw = m.properties.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, "")
            if is_uint(raw) and resolved.get(int(raw)) is None:
                discarded.add(int(raw))
                decided.append((int(raw), HalfState.DISCARDED, "check", None, m.store_ts,
                                m.properties.get(PROPERTY_UNIQ_KEY), check_times(m.properties)))
            continue
        tag = m.properties.get(PROPERTY_TAGS)
        if tag == OP_TAG_DONE:
            # txbroker's op records say which decision; a RocketMQ 4.x one does not, and
            # is taken as a rollback unless step 3 finds the committed message.
            state = (HalfState.COMMITTED if m.properties.get(PROPERTY_STATE) == HalfState.COMMITTED.value
                     else HalfState.ROLLED_BACK)
            operator = m.properties.get(PROPERTY_OPERATOR)
            source = m.properties.get(PROPERTY_SOURCE) or ("operator" if operator else "unknown")
            checks = check_times(m.properties)
            for qo in parse_offsets(m.body):
                resolved.set(qo, state)
                counts.pop(qo, None)
                discarded.discard(qo)
                decided.append((qo, state, source, operator, m.born_ts,
                                m.properties.get(PROPERTY_TRANSACTION_ID), checks))
        elif tag == OP_TAG_CHECKS:
            for qo, n in parse_counts(m.body):
                if resolved.get(qo) is None:
                    counts[qo] = n
        elif tag == OP_TAG_RESUME:
            for qo in parse_offsets(m.body):
                if qo in discarded:
                    discarded.discard(qo)
                    counts[qo] = 0
                    decided.append((qo,))
    out.history.replay(decided)
    trim(bridge, resolved, out.history)
    index = out.open
    for start, end in resolved.undecided_runs(bridge.min_offset(HALF_TOPIC),
                                              bridge.max_offset(HALF_TOPIC)):
        for m in bridge.halves(start, end):
            records += 1
            qo = m.queue_offset
            index_stored(index, m, default_immunity_ms, checks=counts.get(qo, 0),
                         state=HalfState.DISCARDED if qo in discarded else HalfState.PENDING)
    oldest = index.oldest_phys()
    if oldest is not None:
        # after a clean stop every earlier commit has its op record (or is listed in the
        # snapshot's missing ops): only commits made since can lack one
        for m in bridge.scan(max(oldest, commits_from)):
            records += 1
            if (m.sys_flag & TRANSACTION_MASK) != TRANSACTION_COMMIT_TYPE:
                continue
            entry = index.get(m.prepared_transaction_offset)
            if entry is not None:
                index.remove(entry.phys, HalfState.COMMITTED)
                resolved.set(entry.queue_offset, HalfState.COMMITTED)
                out.missing_ops.append((entry.phys, entry.queue_offset))
                # who committed, and after how many checks, died with the op record: say
                # so, do not guess (the last persisted count may miss the final pass)
                out.history.record(Decided(entry.queue_offset, HalfState.COMMITTED, "unknown",
                                           None, m.store_timestamp, entry.uniq, None))
    # Nothing to recover (a new data directory) is not news at start-up.
    log.log(logging.INFO if records or snap is not None else logging.DEBUG,
            "transaction state recovered (%s) from %d records in %.3fs: %d pending, "
            "%d discarded, %d op records to rewrite",
            "snapshot + tail" if snap is not None else "full replay", records,
            time.perf_counter() - started, index.count(HalfState.PENDING),
            index.count(HalfState.DISCARDED),
            len(out.missing_ops))
    out.from_snapshot = snap is not None
    return out


async def write_snapshot(bridge: TransactionalMessageBridge, path: Path, resolved: ResolvedStates,
                         open_states: list[tuple[int, int, str]],
                         missing_ops: list[tuple[int, int]],
                         history: TxHistory) -> None:
    """State as of the current queue ends, written atomically (tmp file, fsync, rename).

    The state is taken on the event loop, where nothing can change it meanwhile; the file (tens
    of MB with a full decision history) is written, fsynced and renamed through aiofiles, which
    runs each call in the executor, so the loop keeps answering the connections still draining.
    """
    base, data = resolved.export()
    meta = {
        "version": _SNAPSHOT_VERSION,
        "op_next": bridge.max_offset(OP_HALF_TOPIC),
        "discard_next": bridge.max_offset(CHECK_MAX_TIME_TOPIC),
        "half_next": bridge.max_offset(HALF_TOPIC),
        "log_end": bridge.log_end,
        "resolved_base": base,
        "open": open_states,  # (half queue offset, checks, state) of each undecided half
        "missing_ops": missing_ops,
        "history": history.export(),
    }
    head = orjson.dumps(meta)
    tmp = path.with_suffix(".tmp")
    async with aiofiles.open(tmp, "wb") as fh:
        await fh.write(_SNAPSHOT_MAGIC + _SNAPSHOT_LEN.pack(len(head)) + head + data)
        await fh.flush()
        await aiofiles.os.wrap(os.fsync)(fh.fileno())  # aiofiles has no fsync of its own
    await aiofiles.os.replace(tmp, path)


def take_snapshot(bridge: TransactionalMessageBridge, path: Path,
                  history_size: int) -> dict[str, Any] | None:
    """Load and remove the snapshot; None if absent, unreadable or not matching the store.

    Removed on load so that it is used once: after a crash later in this run the next
    start replays everything instead of trusting an old snapshot.
    """
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
        history = TxHistory(history_size)
        history.load(meta["history"])
        meta["history"] = history
        fits = (meta["op_next"] <= bridge.max_offset(OP_HALF_TOPIC)
                and meta["discard_next"] <= bridge.max_offset(CHECK_MAX_TIME_TOPIC)
                and meta["half_next"] <= bridge.max_offset(HALF_TOPIC)
                and meta["log_end"] <= bridge.log_end)
    except (ValueError, KeyError, TypeError, struct.error, orjson.JSONDecodeError) as exc:
        log.warning("transaction snapshot invalid (%s), replaying", exc)
        return None
    if not fits:
        log.warning("transaction snapshot is ahead of the store (a lost tail?), replaying")
        return None
    return meta
