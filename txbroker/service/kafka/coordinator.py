"""Kafka's transaction coordinator on txbroker's half-message design (docs/kafka.md,
"Transactions: the half-message design" and "Transaction coordinator").

One class, because every transition reads and writes the same per-id metadata, the producer
sequence state and the two system topics in one order that recovery relies on:

- a transactional batch is stored as received in ``RMQ_SYS_KAFKA_TXN_DATA`` and kept in memory;
  nothing reaches a partition before the commit;
- EndTxn(commit) writes PrepareCommit (the decision, with the transaction's consumer offsets),
  then appends every record of the transaction to its partitions in one ``put_chain`` — each
  final record carries the PrepareCommit record's commitlog offset in
  ``prepared_transaction_offset`` — then sets the offsets, then writes CompleteCommit;
- recovery replays the state topic, rebuilds open transactions from the data topic, finds how
  many records of a decided commit a crash left unapplied (the records tied to its
  PrepareCommit offset after it) and :meth:`start` appends only those.

Every state record holds the whole metadata of its id and is written *before* memory changes,
so memory is never ahead of the log; an id with a transition in progress answers
CONCURRENT_TRANSACTIONS, which every client retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import RecordBatch, RecordsError, read_batches
from txbroker.service.kafka.mapping import record_to_message
from txbroker.service.kafka.producers import BatchMeta, ProducerStates
from txbroker.service.kafka.txn_log import (
    DATA_TOPIC,
    Offset,
    batch_message,
    offsets_message,
    pid_block_message,
    replay_data,
    replay_state,
    state_message,
)
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.topics import TopicManager, is_system_topic
from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message

if TYPE_CHECKING:
    from txbroker.service.kafka.markers import MarkerSender, Participants

log = logging.getLogger(__name__)

EMPTY, ONGOING = "Empty", "Ongoing"
PREPARE_COMMIT, PREPARE_ABORT = "PrepareCommit", "PrepareAbort"
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"
#: Kafka's isEpochExhausted: from this epoch on, InitProducerId hands out a new producer id.
EPOCH_EXHAUSTED = 32766
#: Producer ids are reserved this many at a time (one state record per block).
PID_BLOCK = 1000
#: Width of one broker group's producer-id range on a cluster (2**40 ids each).
PID_RANGE_BITS = 40
#: Committed offsets are re-applied at recovery unless the offset file was written at least
#: this long after the commit (so it holds the commit, or a later commit of the group).
OFFSET_FILE_GRACE_MS = 2000
#: AddPartitionsToTxn's answer key for the request as a whole (only other groups' partitions).
WHOLE_REQUEST = ("", -1)
#: Kafka records are born at the client; the commitlog's born host is not known here.
BORN_HOST = ("127.0.0.1", 0)


@dataclass
class TxnView:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    partitions: list[tuple[str, int]]
    groups: list[str]
    timeout_ms: int
    started_ms: int | None
    updated_ms: int

    def hanging(self, now_ms: int) -> bool:
        """Ongoing for longer than its timeout (the scan aborts it; Kafka's find-hanging)."""
        return (self.state == ONGOING and self.started_ms is not None
                and now_ms - self.started_ms > self.timeout_ms)


@dataclass(slots=True)
class _Staged:
    queue_offset: int
    topic: str
    partition: int
    batch: RecordBatch


@dataclass
class _Txn:
    """The metadata of one transactional id (what a state record holds) plus the open
    transaction's batches and offsets, which live in the data topic."""

    tid: str
    pid: int
    epoch: int
    last_epoch: int = -1
    state: str = EMPTY
    timeout_ms: int = 60000
    txn: int = 0
    partitions: list[tuple[str, int]] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    started_ms: int | None = None
    updated_ms: int = 0
    data_from: int = 0
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    staged: list[_Staged] = field(default_factory=list)
    #: A state write is in progress: other requests of this id get CONCURRENT_TRANSACTIONS.
    busy: bool = False
    #: Transactional batches being stored: EndTxn waits for them (CONCURRENT_TRANSACTIONS).
    inflight: int = 0
    #: A batch of this transaction could not be stored: it may only abort.
    failed: bool = False
    #: Commitlog offset of the PrepareCommit record (ties the applied records to it).
    marker: int = 0
    #: Records of a decided commit already appended.
    applied: int = 0
    #: The decided commit's records, decoded once (None: decode from ``staged``).
    commit_msgs: list[Message] | None = None
    #: Store time (ms) of this id's latest state record (see ``_refresh``).
    written_ms: int = 0
    #: On a cluster, the other broker groups in the transaction (their partitions, global
    #: numbers; empty for a group that coordinates its consumer group): they get a marker.
    participants: dict[str, list[list]] = field(default_factory=dict)

    def doc(self, **changes) -> dict:
        d = {"tid": self.tid, "pid": self.pid, "epoch": self.epoch, "last_epoch": self.last_epoch,
             "state": self.state, "timeout_ms": self.timeout_ms, "txn": self.txn,
             "partitions": [list(tp) for tp in self.partitions], "groups": list(self.groups),
             "started_ms": self.started_ms, "updated_ms": self.updated_ms,
             "data_from": self.data_from,
             "offsets": [[g, t, p, o] for (g, t, p), o in self.offsets.items()],
             "participants": self.participants}
        d.update(changes)
        return d

    def load(self, d: dict) -> None:
        self.pid, self.epoch, self.last_epoch = d["pid"], d["epoch"], d["last_epoch"]
        self.state, self.timeout_ms, self.txn = d["state"], d["timeout_ms"], d["txn"]
        self.partitions = [(t, p) for t, p in d["partitions"]]
        self.groups = list(d["groups"])
        self.started_ms, self.updated_ms, self.data_from = d["started_ms"], d["updated_ms"], d["data_from"]
        self.offsets = {(g, t, p): o for g, t, p, o in d["offsets"]}
        self.participants = {k: list(v) for k, v in (d.get("participants") or {}).items()}
        if self.state not in (ONGOING, PREPARE_COMMIT):
            self.staged = []
            self.failed = False
            self.commit_msgs = None

    @property
    def open(self) -> bool:
        return self.state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT)


class CoordinatorUnavailable(Exception):
    """A state record could not be stored: the request is answered COORDINATOR_NOT_AVAILABLE."""


def fenced(version: int, first_new_version: int) -> ErrorCode:
    """PRODUCER_FENCED from ``first_new_version`` on, INVALID_PRODUCER_EPOCH before it."""
    return ErrorCode.PRODUCER_FENCED if version >= first_new_version else ErrorCode.INVALID_PRODUCER_EPOCH


class TransactionCoordinator:
    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicManager,
                 metrics: BrokerMetrics, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.metrics = metrics
        self.clock = clock
        self.producers = ProducerStates()
        self._txns: dict[str, _Txn] = {}
        self._by_pid: dict[int, _Txn] = {}
        self._next_pid = 0
        self._pid_limit = 0
        self._pid_written_ms = 0
        self._pid_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        #: Until start() has finished what recovery found, requests get LOAD_IN_PROGRESS.
        self.ready = False
        #: The first producer id this coordinator may hand out.  On a cluster each broker
        #: group allocates from its own range (``kafka_node_id << PID_RANGE_BITS``), so two
        #: groups never hand out one id; a single broker starts at 0.
        self.pid_base = max(config.kafka_node_id, 0) << PID_RANGE_BITS if config.namesrv_addr else 0
        #: Delivers a decision to the other broker groups of a transaction (markers.py; set
        #: on a cluster broker).
        self.markers: MarkerSender | None = None

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # --- recovery and lifecycle ---------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild every id's metadata, the open transactions and their producers' sequence
        state, and how far each decided commit got; :meth:`start` finishes those.  Callable
        again after :meth:`suspend` (a broker promoted to master replays the replicated log)."""
        self._txns.clear()
        self._by_pid.clear()
        self.producers = ProducerStates()
        rep = replay_state(self.store)
        self._next_pid = self._pid_limit = max(rep.pid_upto, self.pid_base)
        self._pid_written_ms = rep.pid_written_ms
        for tid, rec in rep.latest.items():
            t = _Txn(tid, rec.doc["pid"], rec.doc["epoch"])
            t.load(rec.doc)
            t.written_ms = rec.store_timestamp
            t.marker = rec.physical_offset if t.state == PREPARE_COMMIT else 0
            self._txns[tid] = t
            self._by_pid[t.pid] = t
        wanted = {t.tid: t.txn for t in self._txns.values() if t.state in (ONGOING, PREPARE_COMMIT)}
        if wanted:
            start = min(self._txns[tid].data_from for tid in wanted)
            now = self.now_ms()
            for rec in replay_data(self.store, start, wanted):
                t = self._txns[rec.tid]
                if rec.group is not None:
                    if t.state == ONGOING:  # a PrepareCommit record holds the decided offsets
                        for topic, partition, offset in rec.offsets:
                            t.offsets[(rec.group, topic, partition)] = offset
                    continue
                batch = read_batches(rec.data, check_crc=False)[0]
                t.staged.append(_Staged(rec.queue_offset, rec.topic, rec.partition, batch))
                self.producers.record(batch.producer_id, batch.producer_epoch, rec.topic,
                                      rec.partition, BatchMeta(batch.base_sequence,
                                                               batch.last_sequence, -1,
                                                               batch.max_timestamp), now)
        for t in self._txns.values():
            if t.state == PREPARE_COMMIT:
                t.applied = self._count_applied(t.marker)
        self._reapply_offsets(rep.committed_offsets)
        self.metrics.kafka_txn_open.set(sum(t.state == ONGOING for t in self._txns.values()))

    def _count_applied(self, marker: int) -> int:
        """Records of the commit decided at ``marker`` that reached their partitions (they
        follow the marker in the commitlog; the marker is never 0: a producer-id block record
        always precedes the first state record)."""
        n = 0
        for m in self.store.scan(marker):
            if m.prepared_transaction_offset == marker and not is_system_topic(m.topic):
                n += 1
        return n

    def _reapply_offsets(self, committed: list[tuple[int, list[Offset]]]) -> None:
        """The offset table is persisted periodically: a commit may be newer than the file.
        Offsets of commits the file may predate are set again, forward only, so a later
        non-transactional commit the file already holds is not moved back."""
        path = Path(self.config.data_dir) / "consumerOffset.json"
        try:
            written_ms = int(path.stat().st_mtime * 1000)
        except FileNotFoundError:
            written_ms = 0
        for ts, offsets in committed:
            if ts + OFFSET_FILE_GRACE_MS < written_ms:
                continue
            for group, topic, partition, offset in offsets:
                current = self.store.offsets.get(group, topic, partition)
                if current is None or current < offset:
                    self.store.offsets.set(group, topic, partition, offset)

    async def start(self) -> None:
        """Finish the decisions recovery found, then run the timeout scan."""
        for t in list(self._txns.values()):
            try:
                if t.state == PREPARE_COMMIT:
                    await self._apply_commit(t)
                elif t.state == PREPARE_ABORT:
                    await self._finish_abort(t)
            except CoordinatorUnavailable:
                log.error("kafka transaction %r: could not finish %s at start; the scan retries",
                          t.tid, t.state)
        self.ready = True
        interval = self.config.kafka_transaction_scan_interval
        self._task = asyncio.get_running_loop().create_task(self._scan_loop(interval),
                                                            name="txbroker-kafka-txn-scan")

    async def close(self) -> None:
        self.ready = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def suspend(self) -> None:
        """No longer the master: stop the scan and keep no state (the next master has it in
        the log; :meth:`recover` rebuilds it should this broker be promoted again)."""
        await self.close()
        self._txns.clear()
        self._by_pid.clear()
        self.producers = ProducerStates()

    async def _scan_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.scan()
            except Exception:  # the scan must outlive one bad pass
                log.exception("kafka transaction scan failed")

    async def scan(self) -> None:
        """One pass: abort Ongoing transactions past their timeout (bumping the epoch, so the
        zombie is fenced), retry commits a failed append left decided, expire idle producers."""
        now = self.now_ms()
        for t in list(self._txns.values()):
            if t.busy or t.inflight:
                continue
            try:
                if t.state == ONGOING and t.started_ms is not None and now - t.started_ms > t.timeout_ms:
                    log.info("kafka transaction %r timed out after %d ms: aborted", t.tid, now - t.started_ms)
                    await self._abort(t, "timeout", bump=True)
                elif t.state == PREPARE_COMMIT:
                    await self._apply_commit(t)
                elif t.state == PREPARE_ABORT:
                    await self._finish_abort(t)
            except CoordinatorUnavailable:
                pass
        self.producers.expire(now)
        await self._refresh(now)

    async def _refresh(self, now: int) -> None:
        """Write again the state records retention would otherwise take away.

        Retention deletes commitlog segments last written ``file_reserved_time`` ago, state
        records included; an id whose only record went with them would be forgotten, and the
        producer-id floor could fall (a reused producer id).  So a settled id's latest record
        (Empty or Complete*, its offsets left out: they were applied long ago) and the
        producer-id block are written again once half that time old, and the newest copy is
        always in a segment retention keeps.  Open transactions never live that long (their
        timeout is at most ``kafka_transaction_max_timeout``)."""
        limit = now - int(self.config.file_reserved_time * 1000 / 2)
        if self._pid_limit and self._pid_written_ms < limit:
            async with self._pid_lock:
                result = await self.store.put(pid_block_message(self._pid_limit))
                if result.ok:
                    self._pid_written_ms = self.now_ms()
        for t in list(self._txns.values()):
            if t.busy or t.written_ms >= limit or t.state not in (EMPTY, COMPLETE_COMMIT,
                                                                  COMPLETE_ABORT):
                continue
            result = await self.store.put(state_message(t.doc(offsets=[])))
            if result.ok:
                t.written_ms = self.now_ms()

    # --- producer ids ------------------------------------------------------------------------
    async def allocate_pid(self) -> int:
        async with self._pid_lock:
            if self._next_pid >= self._pid_limit:
                upto = self._next_pid + PID_BLOCK
                result = await self.store.put(pid_block_message(upto))
                if not result.ok:
                    raise CoordinatorUnavailable
                self._pid_limit = upto
                self._pid_written_ms = self.now_ms()
            pid = self._next_pid
            self._next_pid += 1
            return pid

    async def _write(self, t: _Txn, **changes) -> None:
        """Store ``t``'s metadata with ``changes``, then (only then) apply them in memory."""
        doc = t.doc(updated_ms=self.now_ms(), **changes)
        result = await self.store.put(state_message(doc))
        if not result.ok:
            raise CoordinatorUnavailable
        if doc["pid"] != t.pid:
            self._by_pid.pop(t.pid, None)
        t.load(doc)
        t.written_ms = self.now_ms()
        self._by_pid[t.pid] = t
        if t.state == PREPARE_COMMIT:
            t.marker = result.physical_offset
            t.applied = 0

    # --- produce path ------------------------------------------------------------------------
    def check_batch(self, transactional_id: str | None, topic: str, partition: int,
                    batch: RecordBatch) -> tuple[ErrorCode, int | None]:
        """Idempotence and transaction checks of one Produce batch; (NONE, offset) is a
        duplicate stored at that offset (-1 for a transactional batch, placed at commit)."""
        pid = batch.producer_id
        if pid < 0:
            if batch.is_transactional:
                return ErrorCode.INVALID_RECORD, None
            return ErrorCode.NONE, None
        if batch.is_transactional:
            err = self._check_txn_produce(transactional_id, pid, batch.producer_epoch, topic, partition)
            if err is not ErrorCode.NONE:
                return err, None
        else:
            t = self._by_pid.get(pid)
            if t is not None and t.pid == pid and t.open:
                return ErrorCode.INVALID_TXN_STATE, None
        return self.producers.check(pid, batch.producer_epoch, topic, partition,
                                    batch.base_sequence, batch.last_sequence)

    def _check_txn_produce(self, tid: str | None, pid: int, epoch: int, topic: str,
                           partition: int) -> ErrorCode:
        t = self._txns.get(tid) if tid else None
        if t is None or t.pid != pid:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if epoch != t.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if t.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if t.state != ONGOING or (topic, partition) not in t.partitions:
            return ErrorCode.INVALID_TXN_STATE  # KIP-890 part 1: only partitions added
        return ErrorCode.NONE

    async def append_transactional(self, transactional_id: str | None, topic: str, partition: int,
                                   batch: RecordBatch) -> ErrorCode:
        """Stage a checked transactional batch: stored in the data topic, not in the partition."""
        err, dup = self.check_batch(transactional_id, topic, partition, batch)  # again: after any await
        if err is not ErrorCode.NONE or dup is not None:
            return err
        assert transactional_id is not None
        t = self._txns[transactional_id]
        txn = t.txn
        meta = BatchMeta(batch.base_sequence, batch.last_sequence, -1, batch.max_timestamp)
        self.producers.record(batch.producer_id, batch.producer_epoch, topic, partition, meta,
                              self.now_ms())
        t.inflight += 1
        try:
            result = await self.store.put(batch_message(transactional_id, txn, topic, partition, batch.data))
        finally:
            t.inflight -= 1
        if not result.ok:
            self.producers.forget(batch.producer_id, topic, partition, meta)
            t.failed = True
            return ErrorCode.KAFKA_STORAGE_ERROR
        if t.txn != txn or t.state != ONGOING:  # aborted meanwhile: the record is an orphan
            return ErrorCode.INVALID_PRODUCER_EPOCH
        t.staged.append(_Staged(result.queue_offset, topic, partition, batch))
        return ErrorCode.NONE

    def record_batch(self, topic: str, partition: int, batch: RecordBatch, base_offset: int) -> None:
        """Remember a stored idempotent (non-transactional) batch for duplicate detection."""
        self.producers.record(batch.producer_id, batch.producer_epoch, topic, partition,
                              BatchMeta(batch.base_sequence, batch.last_sequence, base_offset,
                                        batch.max_timestamp), self.now_ms())

    # --- InitProducerId ----------------------------------------------------------------------
    async def init_producer_id(self, tid: str | None, timeout_ms: int, pid: int, epoch: int,
                               version: int) -> tuple[ErrorCode, int, int]:
        if tid is None:
            return ErrorCode.NONE, await self.allocate_pid(), 0
        if not tid:
            return ErrorCode.INVALID_REQUEST, -1, -1
        if timeout_ms <= 0 or timeout_ms > self.config.kafka_transaction_max_timeout * 1000:
            return ErrorCode.INVALID_TRANSACTION_TIMEOUT, -1, -1
        if version >= 3 and (pid == -1) != (epoch == -1):
            return ErrorCode.INVALID_REQUEST, -1, -1
        t = self._txns.get(tid)
        if t is None:
            t = _Txn(tid, await self.allocate_pid(), 0)
            if tid in self._txns:  # another InitProducerId of this id won the race
                return ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1
            self._txns[tid] = t
            t.busy = True
            try:
                await self._write(t, timeout_ms=timeout_ms)
            except CoordinatorUnavailable:
                del self._txns[tid]
                raise
            finally:
                t.busy = False
            return ErrorCode.NONE, t.pid, t.epoch
        if t.busy or t.inflight or t.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1
        if version >= 3 and pid != -1:
            if pid != t.pid or epoch not in (t.epoch, t.last_epoch):
                return fenced(version, 4), -1, -1
            if epoch == t.last_epoch and t.state != ONGOING:  # a retry of the bump that made t.epoch
                return ErrorCode.NONE, t.pid, t.epoch
        if t.state == ONGOING:  # a new instance fences the old one: its transaction is aborted
            await self._abort(t, "fenced", bump=False)
            self.metrics.kafka_producers_fenced.inc()
        t.busy = True
        try:
            if t.epoch >= EPOCH_EXHAUSTED:
                await self._write(t, pid=await self.allocate_pid(), epoch=0, last_epoch=-1,
                                  state=EMPTY, timeout_ms=timeout_ms)
            else:
                await self._write(t, epoch=t.epoch + 1, last_epoch=t.epoch, state=EMPTY,
                                  timeout_ms=timeout_ms)
        finally:
            t.busy = False
        return ErrorCode.NONE, t.pid, t.epoch

    # --- AddPartitionsToTxn / AddOffsetsToTxn / TxnOffsetCommit ------------------------------
    def _owner(self, tid: str, pid: int, epoch: int, fenced_code: ErrorCode) -> tuple[ErrorCode, _Txn | None]:
        t = self._txns.get(tid)
        if t is None or t.pid != pid:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        if epoch != t.epoch:
            return fenced_code, None
        if t.busy or t.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS, None
        return ErrorCode.NONE, t

    def partition_exists(self, topic: str, partition: int) -> bool:
        tc = self.topics.get(topic)
        return tc is not None and not is_system_topic(topic) and 0 <= partition < tc.write_queue_nums

    async def _begin_or_extend(self, t: _Txn, partitions: list[tuple[str, int]], groups: list[str],
                               participants: Participants | None = None) -> None:
        """Move ``t`` to Ongoing with ``partitions``, ``groups`` and ``participants`` added
        (one state record)."""
        new = [tp for tp in partitions if tp not in t.partitions]
        new_groups = [g for g in groups if g not in t.groups]
        now_in = t.participants if t.state == ONGOING else {}
        joined = {k: list(v) for k, v in now_in.items()}
        for name, parts in (participants or {}).items():
            have = joined.setdefault(name, [])
            have.extend(list(tp) for tp in parts if list(tp) not in have)
        if t.state == ONGOING and not new and not new_groups and joined == now_in:
            return
        changes: dict = {"state": ONGOING, "partitions": [list(tp) for tp in t.partitions + new],
                         "groups": t.groups + new_groups, "participants": joined}
        starting = t.state != ONGOING
        if starting:
            now = self.now_ms()
            changes.update(txn=t.txn + 1, started_ms=now, offsets=[],
                           data_from=self.store.max_offset(DATA_TOPIC, 0),
                           partitions=[list(tp) for tp in dict.fromkeys(partitions)], groups=new_groups)
        t.busy = True
        try:
            await self._write(t, **changes)
        finally:
            t.busy = False
        if starting:
            self.metrics.kafka_txn_started.inc()
            self._count_open()

    async def add_partitions(self, tid: str, pid: int, epoch: int,
                             partitions: list[tuple[str, int]], version: int,
                             remote: Participants | None = None) -> dict[tuple[str, int], ErrorCode]:
        """``partitions`` are this group's; ``remote`` other groups' (checked by the caller)."""
        err, t = self._owner(tid, pid, epoch, fenced(version, 2))
        if t is not None:
            unknown = {tp for tp in partitions if not self.partition_exists(*tp)}
            if unknown:
                return {tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown
                        else ErrorCode.OPERATION_NOT_ATTEMPTED for tp in partitions}
            await self._begin_or_extend(t, partitions, [], remote)
        if remote and not partitions:
            return {WHOLE_REQUEST: err}
        return dict.fromkeys(partitions, err)

    async def add_offsets(self, tid: str, pid: int, epoch: int, group: str, version: int,
                          participant: str | None = None) -> ErrorCode:
        """``participant``: on a cluster, the broker group coordinating ``group``, which
        stages the transaction's offsets and gets a marker."""
        err, t = self._owner(tid, pid, epoch, fenced(version, 2))
        if t is not None:
            await self._begin_or_extend(t, [], [group],
                                        {participant: []} if participant is not None else None)
        return err

    async def txn_offset_commit(self, tid: str, group: str, pid: int, epoch: int,
                                offsets: list[tuple[str, int, int]], version: int
                                ) -> dict[tuple[str, int], ErrorCode]:
        """Stage a transaction's consumer offsets: applied at commit, dropped at abort."""
        err, t = self._owner(tid, pid, epoch, fenced(version, 2))
        if t is not None and (t.state != ONGOING or group not in t.groups):
            err = ErrorCode.INVALID_TXN_STATE
        out = {(tp, p): err for tp, p, _ in offsets}
        if err is not ErrorCode.NONE or t is None:
            return out
        good = []
        for topic, partition, offset in offsets:
            if not self.partition_exists(topic, partition) or offset < 0:
                out[(topic, partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                good.append((topic, partition, offset))
        if good:
            txn = t.txn
            t.inflight += 1
            try:
                result = await self.store.put(offsets_message(tid, txn, group, good))
            finally:
                t.inflight -= 1
            if not result.ok:
                raise CoordinatorUnavailable
            if t.txn == txn and t.state == ONGOING:
                for topic, partition, offset in good:
                    t.offsets[(group, topic, partition)] = offset
        return out

    # --- EndTxn ------------------------------------------------------------------------------
    async def end_txn(self, tid: str, pid: int, epoch: int, committed: bool, version: int) -> ErrorCode:
        t = self._txns.get(tid)
        if t is None or t.pid != pid:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if epoch != t.epoch:
            return fenced(version, 2)
        if t.busy or t.inflight:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if t.state == ONGOING:
            if not committed:
                await self._abort(t, "client", bump=False)
                return ErrorCode.NONE
            if t.failed:
                return ErrorCode.INVALID_TXN_STATE
            return await self._commit(t)
        if t.state in (PREPARE_COMMIT, PREPARE_ABORT):
            same = (t.state == PREPARE_COMMIT) == committed
            return ErrorCode.CONCURRENT_TRANSACTIONS if same else ErrorCode.INVALID_TXN_STATE
        if t.state in (COMPLETE_COMMIT, COMPLETE_ABORT) and (t.state == COMPLETE_COMMIT) == committed:
            return ErrorCode.NONE  # a retry of the EndTxn that completed it
        return ErrorCode.INVALID_TXN_STATE

    def _messages(self, t: _Txn) -> list[Message]:
        """Every record of the transaction as a txbroker message, in data-topic order."""
        msgs = []
        for s in sorted(t.staged, key=lambda s: s.queue_offset):
            for record in s.batch.records():
                msgs.append(record_to_message(s.topic, s.partition, record, born_host=BORN_HOST))
        return msgs

    async def _commit(self, t: _Txn) -> ErrorCode:
        try:
            t.commit_msgs = self._messages(t)  # decodable before the decision is taken
        except RecordsError as exc:
            log.warning("kafka transaction %r: a staged batch does not decode (%s)", t.tid, exc)
            return exc.error_code
        t.busy = True
        try:
            await self._write(t, state=PREPARE_COMMIT)
        finally:
            t.busy = False
        return await self._apply_commit(t)

    async def _apply_commit(self, t: _Txn) -> ErrorCode:
        """Append the records a decided commit has not applied yet, set its offsets, write
        CompleteCommit.  Idempotent: ``t.applied`` says where the previous attempt stopped."""
        t.busy = True
        try:
            msgs = t.commit_msgs if t.commit_msgs is not None else self._messages(t)
            t.commit_msgs = msgs
            for m in msgs:
                m.prepared_transaction_offset = t.marker
            rest = msgs[t.applied:]
            if rest:
                results = await self.store.put_chain(rest)
                done = sum(1 for r in results if r.ok)
                t.applied += done
                if done < len(rest):
                    log.error("kafka transaction %r: commit applied %d of %d records (%s); retrying",
                              t.tid, t.applied, len(msgs), results[-1].status.value)
                    raise CoordinatorUnavailable
            for (group, topic, partition), offset in t.offsets.items():
                self.store.offsets.set(group, topic, partition, offset)
            await self._deliver(t, commit=True)
            started = t.started_ms
            await self._write(t, state=COMPLETE_COMMIT, partitions=[], groups=[], participants={})
        finally:
            t.busy = False
        self.metrics.kafka_txn_committed.inc()
        self.metrics.kafka_records_produced.inc(len(msgs))
        self._finished(started)
        return ErrorCode.NONE

    async def _deliver(self, t: _Txn, *, commit: bool) -> None:
        """The decided outcome to every other broker group of the transaction (markers.py);
        raises CoordinatorUnavailable until all of them have it (the scan retries)."""
        if not t.participants:
            return
        if self.markers is None or not await self.markers.send(
                t.pid, t.epoch, t.txn, commit, {k: [(tp, p) for tp, p in v]
                                                for k, v in t.participants.items()}):
            raise CoordinatorUnavailable

    async def _finish_abort(self, t: _Txn) -> None:
        """PrepareAbort -> markers -> CompleteAbort."""
        t.busy = True
        try:
            await self._deliver(t, commit=False)
            await self._write(t, state=COMPLETE_ABORT, partitions=[], groups=[], offsets=[],
                              participants={})
        finally:
            t.busy = False

    async def _abort(self, t: _Txn, reason: str, *, bump: bool) -> None:
        """Abort the open transaction; ``bump`` also raises the epoch, fencing the producer.
        Nothing was applied here, so one CompleteAbort record is the decision and its
        completion, unless other broker groups staged parts of it: then PrepareAbort first,
        their markers, then CompleteAbort."""
        changes: dict = {"state": COMPLETE_ABORT, "partitions": [], "groups": [], "offsets": [],
                         "participants": {}}
        if t.participants:
            changes.update(state=PREPARE_ABORT, participants=t.participants)
        started = t.started_ms
        if bump:
            if t.epoch >= EPOCH_EXHAUSTED:
                changes.update(pid=await self.allocate_pid(), epoch=0, last_epoch=-1)
            else:
                changes.update(epoch=t.epoch + 1, last_epoch=t.epoch)
        t.busy = True
        try:
            await self._write(t, **changes)
        finally:
            t.busy = False
        if t.state == PREPARE_ABORT:
            await self._finish_abort(t)
        self.metrics.kafka_txn_aborted.labels(reason=reason).inc()
        self._finished(started)

    def _finished(self, started_ms: int | None) -> None:
        if started_ms is not None:
            self.metrics.kafka_txn_duration.observe(max(0, self.now_ms() - started_ms) / 1000)
        self._count_open()

    def _count_open(self) -> None:
        self.metrics.kafka_txn_open.set(sum(t.state == ONGOING for t in self._txns.values()))

    # --- operators ---------------------------------------------------------------------------
    def _view(self, t: _Txn) -> TxnView:
        return TxnView(t.tid, t.pid, t.epoch, t.state, list(t.partitions), list(t.groups),
                       t.timeout_ms, t.started_ms if t.open else None, t.updated_ms)

    def transactions(self) -> list[TxnView]:
        return [self._view(t) for _, t in sorted(self._txns.items())]

    def describe(self, transactional_id: str) -> TxnView | None:
        t = self._txns.get(transactional_id)
        return None if t is None else self._view(t)

    async def abort(self, transactional_id: str, operator: str) -> str:
        """An operator's abort of an Ongoing transaction; its producer is fenced."""
        t = self._txns.get(transactional_id)
        for _ in range(100):  # a transition in progress ends within a store write
            if t is None or not (t.busy or t.inflight):
                break
            await asyncio.sleep(0.01)
        if t is None or t.state != ONGOING or t.busy or t.inflight:
            return "not-open"
        log.warning("kafka transaction %r aborted by operator %s", transactional_id, operator)
        try:
            await self._abort(t, "operator", bump=True)
        except CoordinatorUnavailable:
            if t.state != PREPARE_ABORT:
                raise
            # Decided: another broker group has not answered its marker yet; the scan
            # resends it until it does.
        self.metrics.kafka_producers_fenced.inc()
        return "aborted"
