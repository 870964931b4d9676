"""Kafka's transaction coordinator on txbroker's half-message design (docs/kafka.md,
"Transactions: the half-message design" and "Transaction coordinator").

The public coordinator: request handling, lifecycle and the scan.  What it rests on lives
beside it, one concern a module: the states and their transition table (txn_state.py), one
id's metadata and state-record document (txn_record.py), the records in the log
(txn_log.py, snapshot.py), recovery from them (txn_recovery.py) and applying a decided commit,
shared with the participant groups (commit_apply.py).  The transitions stay in one class,
because each reads and writes the same per-id metadata, the producer sequence state and the
two system topics in one order that recovery relies on:

- a transactional batch is stored as received in ``RMQ_SYS_KAFKA_TXN_DATA`` and kept in memory;
  nothing reaches a partition before the commit;
- EndTxn(commit) writes PrepareCommit (the decision, with the transaction's consumer offsets),
  then appends every record of the transaction to its partitions in one ``put_chain`` — each
  final record carries the PrepareCommit record's commitlog offset in
  ``prepared_transaction_offset`` — then sets the offsets, then writes CompleteCommit;
- recovery loads the newest snapshot (snapshot.py), replays the state topic after it and the
  idempotent batches stored since, rebuilds open transactions from the data topic, finds how
  many records of a decided commit a crash left unapplied (the records tied to its
  PrepareCommit offset after it) and :meth:`start` appends only those;
- :meth:`suspend` and :meth:`resume` stop and restart all of that on a live broker (demotion
  and promotion); the scan also enforces the byte caps' bookkeeping, expires idle ids and
  writes the snapshots.

Every state record holds the whole metadata of its id and is written *before* memory changes,
so memory is never ahead of the log; an id with a transition in progress answers
CONCURRENT_TRANSACTIONS, which every client retries.

Every path is ordered intent, effect, bookkeeping, and is safe against cancellation at any
await (a request handler is cancelled when its client goes away).  This rests on one property
of the store: ``put``/``put_chain`` append synchronously, before their first await, so a put
that was cancelled while it waited for the disk or the replicas has written its record.
Memory therefore follows what the put *appended*, not what it answered: a state record
cancelled or timed out after its append is taken in memory as well (:meth:`_write`); a
transactional batch and a transaction's offsets are staged in memory right before their put
and unstaged only when the put appended nothing; and a commit whose append was not answered
counts what the log holds before it appends again (:meth:`_apply_commit`), so a retry, the
scan and recovery each place every record exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from operator import attrgetter
from typing import TYPE_CHECKING

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import RecordBatch, RecordsError
from txbroker.service.kafka.commit_apply import (
    ApplyRefused,
    CommitProgress,
    apply_decided,
)
from txbroker.service.kafka.mapping import record_to_message
from txbroker.service.kafka.producers import (
    PROPERTY_PRODUCER,
    BatchMeta,
    ProducerStates,
    producer_property,
)
from txbroker.service.kafka.snapshot import Snapshot, snapshot_messages
from txbroker.service.kafka.txn_log import (
    BORN_HOST,
    DATA_TOPIC,
    STATE_TOPIC,
    batch_message,
    expired_message,
    offsets_message,
    pid_block_message,
    state_message,
)
from txbroker.service.kafka.txn_record import Staged, TxnMeta, TxnView
from txbroker.service.kafka.txn_recovery import recover_txns
from txbroker.service.kafka.txn_state import TxnState, move
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.topics import TopicManager, is_system_topic
from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message

if TYPE_CHECKING:
    from txbroker.service.kafka.markers import MarkerSender, Participants

log = logging.getLogger(__name__)

EMPTY, ONGOING = TxnState.EMPTY, TxnState.ONGOING
PREPARE_COMMIT, PREPARE_ABORT = TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT
COMPLETE_COMMIT, COMPLETE_ABORT = TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT
#: Kafka's isEpochExhausted: from this epoch on, InitProducerId hands out a new producer id.
EPOCH_EXHAUSTED = 32766
#: Producer ids are reserved this many at a time (one state record per block).
PID_BLOCK = 1000
#: Width of one broker group's producer-id range on a cluster (2**40 ids each).
PID_RANGE_BITS = 40
#: Largest part of a snapshot (below ``max_message_size`` when that is larger).
SNAPSHOT_PART_SIZE = 1024 * 1024
#: AddPartitionsToTxn's answer key for the request as a whole (only other groups' partitions).
WHOLE_REQUEST = ("", -1)


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
        self._txns: dict[str, TxnMeta] = {}
        # Counted when scraped, not on every transition: a count over every transactional id
        # per begin and end made a broker with tens of thousands of ids spend a tenth of its
        # CPU on this gauge.
        metrics.kafka_txn_open.set_function(
            lambda: sum(t.state is ONGOING for t in self._txns.values()))
        self._by_pid: dict[int, TxnMeta] = {}
        self._next_pid = 0
        self._pid_limit = 0
        self._pid_lock = asyncio.Lock()
        self._snapshot_no = 0
        #: What the latest snapshot covers: state-topic queue offset, when, and the
        #: commitlog offset the next snapshot's producer replay starts from.
        self._snap_state_from = 0
        self._snap_ms = 0
        self._snap_log_mark = 0
        #: The log's end after the latest snapshot: anything beyond is a change to snapshot.
        self._snap_log_end = 0
        #: Bytes staged by every open transaction (capped by ``kafka_transactions_max_bytes``).
        self.staged_bytes = 0
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
        """Rebuild every id's metadata, the open transactions, the producers' sequence state
        and how far each decided commit got, from the latest snapshot and what the log holds
        after it; :meth:`start` finishes those.  Callable again after :meth:`suspend` (a
        replica becoming master): memory is rebuilt from the log alone.

        The producer-id floor starts one block above the highest block recorded: ids of a
        block whose record did not reach this log (a master's last write before failover, or
        an unflushed one before a power loss) are never handed out twice."""
        self._reset()
        found = recover_txns(self.store, self.producers, self.now_ms())
        self._snapshot_no, self._snap_state_from = found.snapshot_no, found.snap_state_from
        self._snap_ms = found.snap_ms
        floor = found.pid_upto + PID_BLOCK if found.pid_upto else 0
        self._next_pid = self._pid_limit = max(floor, self.pid_base)
        for t in found.txns.values():
            self._txns[t.tid] = t
            self._by_pid[t.pid] = t
            self.staged_bytes += t.staged_bytes
        self._snap_log_mark = self._snap_log_end = self.store.max_physical_offset

    def _reset(self) -> None:
        """Forget everything memory holds (recovery rebuilds it from the log)."""
        self._txns.clear()
        self._by_pid.clear()
        self.producers.clear()
        self.staged_bytes = 0
        self._snapshot_no = self._snap_state_from = self._snap_ms = 0

    async def start(self) -> None:
        """Finish the decisions recovery found, then run the timeout scan (and the snapshots)."""
        for t in list(self._txns.values()):
            try:
                if t.state is PREPARE_COMMIT:
                    await self._apply_commit(t)
                elif t.state is PREPARE_ABORT:
                    await self._finish_abort(t)
            except CoordinatorUnavailable:
                log.error("kafka transaction %r: could not finish %s at start; the scan retries",
                          t.tid, t.state.value)
        self.ready = True
        interval = self.config.kafka_transaction_scan_interval
        self._task = asyncio.get_running_loop().create_task(self._scan_loop(interval),
                                                            name="txbroker-kafka-txn-scan")

    async def close(self) -> None:
        """Stop at a clean shutdown: the scan ends, in-flight transitions finish, and a
        snapshot is written so the next start reads it instead of the history."""
        await self._stop_scan()
        await self._settle()
        try:
            await self._snapshot(self.store.max_physical_offset)
        except CoordinatorUnavailable:
            log.warning("kafka coordinator: no snapshot at stop (the store refused it); the next "
                        "start replays from the previous one")

    async def suspend(self) -> None:
        """Stop serving and forget the state (a master being demoted: its log may be cut back
        to the new master's, and the new master owns the transactions).  Requests get
        COORDINATOR_LOAD_IN_PROGRESS until :meth:`resume`.  Writes nothing: a demoted
        store refuses writes."""
        await self._stop_scan()
        await self._settle()
        self._reset()

    async def resume(self) -> None:
        """Serve again from what the log holds now (a replica that became master, after
        :meth:`suspend` or from the start): :meth:`recover` from the latest snapshot and the
        log after it, then :meth:`start`, which finishes any commit the failover interrupted
        after its PrepareCommit."""
        self.recover()
        await self.start()

    async def _stop_scan(self) -> None:
        self.ready = False
        if self._task is not None:
            # The loop also ends on this: a marker send's wait_for can swallow the cancel (3.11).
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _settle(self) -> None:
        """Wait (bounded by ``shutdown_grace``) for transitions and stores in progress."""
        deadline = time.monotonic() + self.config.shutdown_grace
        while time.monotonic() < deadline and any(t.busy or t.inflight for t in self._txns.values()):
            await asyncio.sleep(0.01)

    async def _scan_loop(self, interval: float) -> None:
        me = asyncio.current_task()
        while self._task is me:
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
                if t.state is ONGOING and t.started_ms is not None and now - t.started_ms > t.timeout_ms:
                    log.info("kafka transaction %r timed out after %d ms: aborted", t.tid, now - t.started_ms)
                    await self._abort(t, "timeout", bump=True)
                elif t.state is PREPARE_COMMIT:
                    await self._apply_commit(t)
                elif t.state is PREPARE_ABORT:
                    await self._finish_abort(t)
            except CoordinatorUnavailable:
                pass
        self.producers.expire(now)
        await self._expire_ids(now)
        if self._snapshot_due(now):
            with contextlib.suppress(CoordinatorUnavailable):  # the next scan tries again
                await self._snapshot(self._snap_log_mark)

    async def _expire_ids(self, now: int) -> None:
        """Forget ids settled for ``kafka_transactional_id_expiration`` (Kafka's
        transactional.id.expiration.ms): a tombstone record, then memory.  The producer-id
        floor does not fall: the tombstone names the id's producer id."""
        limit = now - int(self.config.kafka_transactional_id_expiration * 1000)
        for t in [t for t in self._txns.values() if t.settled and t.updated_ms < limit]:
            if t.busy or t.inflight:
                continue
            result = await self.store.put(expired_message(t.tid, t.pid))
            if not result.in_log:
                return  # the store refuses writes: the next scan tries again
            if self._txns.get(t.tid) is t and t.settled and not t.busy:
                del self._txns[t.tid]
                if self._by_pid.get(t.pid) is t:
                    del self._by_pid[t.pid]
                log.info("kafka transactional id %r expired (idle since %d ms)", t.tid, now - t.updated_ms)

    def _snapshot_due(self, now: int) -> bool:
        """A snapshot is written when the state topic grew by ``kafka_snapshot_records`` (or
        by as many records as there are ids, so writing snapshots costs O(1) per state change
        however many ids there are), and at least every ``kafka_snapshot_interval`` — and
        every half ``file_reserved_time``, so retention never takes the newest snapshot."""
        grown = self.store.max_offset(STATE_TOPIC, 0) - self._snap_state_from
        if grown >= max(self.config.kafka_snapshot_records, len(self._txns)):
            return True
        age = now - self._snap_ms
        if age >= self.config.file_reserved_time * 500:
            return True
        changed = grown > 0 or self.store.max_physical_offset > self._snap_log_end
        return changed and age >= self.config.kafka_snapshot_interval * 1000

    async def _snapshot(self, log_from: int) -> None:
        """Write a snapshot of everything (see snapshot.py).  ``log_from`` is where the
        producer replay must start: at a clean stop the log's end; otherwise where the log
        ended at the previous snapshot, so a batch stored before this one but recorded after
        (its put was still waiting for the disk) is replayed — replay skips what the snapshot
        already holds."""
        now = self.now_ms()
        snap = Snapshot(
            state_from=self.store.max_offset(STATE_TOPIC, 0), log_from=log_from,
            pid_upto=self._pid_limit,
            ids=[[t.doc(), t.record_offset] for t in self._txns.values() if t.record_offset >= 0],
            producers=self.producers.to_doc(), written_ms=now)
        mark = self.store.max_physical_offset
        msgs = snapshot_messages(self._snapshot_no + 1, snap,
                                 min(self.config.max_message_size, SNAPSHOT_PART_SIZE))
        results = await self.store.put_chain(msgs)
        if len(results) < len(msgs) or not all(r.ok for r in results):
            raise CoordinatorUnavailable
        self._snapshot_no += 1
        self._snap_state_from, self._snap_ms, self._snap_log_mark = snap.state_from, now, mark
        self._snap_log_end = self.store.max_physical_offset

    # --- producer ids ------------------------------------------------------------------------
    async def allocate_pid(self) -> int:
        async with self._pid_lock:
            if self._next_pid >= self._pid_limit:
                upto = self._next_pid + PID_BLOCK
                result = await self.store.put(pid_block_message(upto))
                if not result.ok:
                    raise CoordinatorUnavailable
                self._pid_limit = upto
            pid = self._next_pid
            self._next_pid += 1
            return pid

    async def _write(self, t: TxnMeta, state: TxnState | None = None, **changes) -> None:
        """Store ``t``'s metadata with ``changes`` and ``state`` (None: the state it is in),
        then (only then) apply them in memory.  A state the transition table does not allow
        from ``t``'s raises TxnTransitionError before anything is stored (a bug).

        Memory follows the log: once the record is appended the change is taken, even when
        the put then answers a flush or replica time-out (CoordinatorUnavailable is raised
        after) or the request is cancelled while the put waits; the record then sits at the
        queue offset the state queue had before the put."""
        doc = t.doc(move(t.state, t.state if state is None else state),
                    updated_ms=self.now_ms(), **changes)
        msg = state_message(doc)
        slot = self.store.max_offset(STATE_TOPIC, 0)
        try:
            result = await self.store.put(msg)
        except asyncio.CancelledError:
            self._follow(t, doc, self._state_record_at(slot, msg.body))
            raise
        if result.in_log:
            self._follow(t, doc, result.physical_offset)
        if not result.ok:
            raise CoordinatorUnavailable


    def _unstage_all(self, t: TxnMeta) -> None:
        """The transaction ended: its batches leave memory (the data topic keeps them)."""
        self.staged_bytes -= t.staged_bytes
        t.staged, t.staged_bytes = [], 0
        t.failed = False
        t.commit_msgs = None

    def _state_record_at(self, slot: int, body: bytes) -> int:
        """Commitlog offset of the state record ``body`` at queue offset ``slot`` (-1: absent)."""
        got = self.store.get(STATE_TOPIC, 0, slot, 1).messages()
        return got[0].physical_offset if got and bytes(got[0].body) == body else -1

    def _follow(self, t: TxnMeta, doc: dict, physical_offset: int) -> None:
        """Take in memory the state record ``doc`` appended at ``physical_offset``."""
        if physical_offset < 0:
            return
        if doc["pid"] != t.pid:
            self._by_pid.pop(t.pid, None)
        t.load(doc)
        if not t.state.holds_data:
            self._unstage_all(t)
        t.record_offset = physical_offset
        self._by_pid[t.pid] = t
        if t.state is PREPARE_COMMIT:
            t.progress = CommitProgress(physical_offset)

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
        if t.state.deciding:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if t.state is not ONGOING or (topic, partition) not in t.partitions:
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
        try:  # a bomb or bad records refused now, not at EndTxn; the output is not kept
            batch.records(self.config.max_message_size)
        except RecordsError as exc:
            log.info("kafka transaction %r: batch for %s-%d refused: %s", transactional_id,
                     topic, partition, exc)
            return exc.error_code
        size = len(batch.data)
        if t.staged_bytes + size > self.config.kafka_transaction_max_bytes:
            log.warning("kafka transaction %r: batch for %s-%d refused: the transaction would stage "
                        "%d bytes, above kafka_transaction_max_bytes %d", transactional_id, topic,
                        partition, t.staged_bytes + size, self.config.kafka_transaction_max_bytes)
            # Not retriable: the transaction may only abort now (as a failed batch makes a Kafka
            # producer abort).  Its sequence counts as used, because clients that do not bump
            # the epoch at the abort (aiokafka) go on after it in their next transaction.
            self.producers.record(batch.producer_id, batch.producer_epoch, topic, partition,
                                  BatchMeta(batch.base_sequence, batch.last_sequence, -1,
                                            batch.max_timestamp), self.now_ms())
            t.failed = True
            return ErrorCode.RECORD_LIST_TOO_LARGE
        if self.staged_bytes + size > self.config.kafka_transactions_max_bytes:
            log.warning("kafka transaction %r: batch for %s-%d refused: open transactions stage %d "
                        "bytes, kafka_transactions_max_bytes is %d", transactional_id, topic,
                        partition, self.staged_bytes, self.config.kafka_transactions_max_bytes)
            return ErrorCode.KAFKA_STORAGE_ERROR
        # Staged and its sequence recorded before the put (which appends before its first
        # await, so a cancelled request has stored the batch): a retry is then a duplicate of
        # a batch the commit holds.  Undone only when the put appended nothing.
        meta = BatchMeta(batch.base_sequence, batch.last_sequence, -1, batch.max_timestamp)
        self.producers.record(batch.producer_id, batch.producer_epoch, topic, partition, meta,
                              self.now_ms())
        staged = Staged(topic, partition, batch)
        self.staged_bytes += t.stage(staged)
        t.inflight += 1
        try:
            result = await self.store.put(batch_message(transactional_id, txn, topic, partition, batch.data))
        finally:
            t.inflight -= 1
        if not result.ok:
            self.producers.forget(batch.producer_id, topic, partition, meta)
            if not result.in_log:
                self.staged_bytes -= t.unstage(staged)
            else:  # in the data topic but not confirmed: the transaction may only abort
                t.failed = True
            return ErrorCode.KAFKA_STORAGE_ERROR
        if t.txn != txn or t.state is not ONGOING:  # aborted meanwhile: the record is an orphan
            return ErrorCode.INVALID_PRODUCER_EPOCH
        return ErrorCode.NONE

    @staticmethod
    def tag_batch(first: Message, batch: RecordBatch) -> None:
        """Mark the first message of an idempotent batch with its producer and sequences, so
        recovery can rebuild the producer state from the log (producers.py)."""
        first.properties[PROPERTY_PRODUCER] = producer_property(
            batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.last_sequence)

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
            t = TxnMeta(tid, await self.allocate_pid(), 0)
            if tid in self._txns:  # another InitProducerId of this id won the race
                return ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1
            self._txns[tid] = t
            try:
                with t.transition(EMPTY):
                    await self._write(t, timeout_ms=timeout_ms)
            except CoordinatorUnavailable:
                if t.record_offset < 0:  # nothing appended: the id stays unknown
                    del self._txns[tid]
                raise
            return ErrorCode.NONE, t.pid, t.epoch
        if t.busy or t.inflight or t.state.deciding:
            return ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1
        if version >= 3 and pid != -1:
            if pid != t.pid or epoch not in (t.epoch, t.last_epoch):
                return fenced(version, 4), -1, -1
            if epoch == t.last_epoch and t.state is not ONGOING:  # a retry of the bump that made t.epoch
                return ErrorCode.NONE, t.pid, t.epoch
        if t.state is ONGOING:  # a new instance fences the old one: its transaction is aborted
            await self._abort(t, "fenced", bump=False)
            self.metrics.kafka_producers_fenced.inc()
        with t.transition(EMPTY):
            if t.epoch >= EPOCH_EXHAUSTED:
                await self._write(t, EMPTY, pid=await self.allocate_pid(), epoch=0,
                                  last_epoch=-1, timeout_ms=timeout_ms)
            else:
                await self._write(t, EMPTY, epoch=t.epoch + 1, last_epoch=t.epoch,
                                  timeout_ms=timeout_ms)
        return ErrorCode.NONE, t.pid, t.epoch

    # --- AddPartitionsToTxn / AddOffsetsToTxn / TxnOffsetCommit ------------------------------
    def _owner(self, tid: str, pid: int, epoch: int, fenced_code: ErrorCode) -> tuple[ErrorCode, TxnMeta | None]:
        t = self._txns.get(tid)
        if t is None or t.pid != pid:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        if epoch != t.epoch:
            return fenced_code, None
        if t.busy or t.state.deciding:
            return ErrorCode.CONCURRENT_TRANSACTIONS, None
        return ErrorCode.NONE, t

    def unstable_offsets(self, group: str) -> set[tuple[str, int]]:
        """The (topic, partition) pairs of ``group`` whose offsets an ongoing or deciding
        transaction holds and has not set yet (OffsetFetch's ``require_stable``)."""
        return {(topic, partition) for t in self._txns.values()
                if t.offsets and t.state.holds_data
                for (g, topic, partition) in t.offsets if g == group}

    def partition_exists(self, topic: str, partition: int) -> bool:
        tc = self.topics.get(topic)
        return tc is not None and not is_system_topic(topic) and 0 <= partition < tc.write_queue_nums

    async def _begin_or_extend(self, t: TxnMeta, partitions: list[tuple[str, int]], groups: list[str],
                               participants: Participants | None = None) -> None:
        """Move ``t`` to Ongoing with ``partitions``, ``groups`` and ``participants`` added
        (one state record)."""
        new = [tp for tp in partitions if tp not in t.partitions]
        new_groups = [g for g in groups if g not in t.groups]
        now_in = t.participants if t.state is ONGOING else {}
        joined = {k: list(v) for k, v in now_in.items()}
        for name, parts in (participants or {}).items():
            have = joined.setdefault(name, [])
            have.extend(list(tp) for tp in parts if list(tp) not in have)
        if t.state is ONGOING and not new and not new_groups and joined == now_in:
            return
        changes: dict = {"partitions": [list(tp) for tp in t.partitions + new],
                         "groups": t.groups + new_groups, "participants": joined}
        starting = t.state is not ONGOING
        if starting:
            now = self.now_ms()
            changes.update(txn=t.txn + 1, started_ms=now, offsets=[],
                           data_from=self.store.max_offset(DATA_TOPIC, 0),
                           partitions=[list(tp) for tp in dict.fromkeys(partitions)], groups=new_groups)
        with t.transition(ONGOING):
            await self._write(t, ONGOING, **changes)
        if starting:
            self.metrics.kafka_txn_started.inc()

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
        if t is not None and (t.state is not ONGOING or group not in t.groups):
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
            # Staged before the put (see append_transactional), undone if nothing was appended.
            before = {(group, tp, p): t.offsets.get((group, tp, p)) for tp, p, _ in good}
            for topic, partition, offset in good:
                t.offsets[(group, topic, partition)] = offset
            t.inflight += 1
            try:
                result = await self.store.put(offsets_message(tid, t.txn, group, good))
            finally:
                t.inflight -= 1
            if not result.in_log:
                for key, old in before.items():
                    if old is None:
                        t.offsets.pop(key, None)
                    else:
                        t.offsets[key] = old
            if not result.ok:
                raise CoordinatorUnavailable
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
        if t.state is ONGOING:
            if not committed:
                await self._abort(t, "client", bump=False)
                return ErrorCode.NONE
            if t.failed:
                return ErrorCode.INVALID_TXN_STATE
            return await self._commit(t)
        if t.state.deciding:
            same = (t.state is PREPARE_COMMIT) == committed
            return ErrorCode.CONCURRENT_TRANSACTIONS if same else ErrorCode.INVALID_TXN_STATE
        if t.state in (COMPLETE_COMMIT, COMPLETE_ABORT) and (t.state is COMPLETE_COMMIT) == committed:
            return ErrorCode.NONE  # a retry of the EndTxn that completed it
        return ErrorCode.INVALID_TXN_STATE

    def _messages(self, t: TxnMeta) -> list[Message]:
        """Every record of the transaction as a txbroker message, in data-topic order."""
        msgs = []
        for s in t.staged:
            for record in s.batch.records(self.config.max_message_size):
                msgs.append(record_to_message(s.topic, s.partition, record, born_host=BORN_HOST))
        return msgs

    async def _commit(self, t: TxnMeta) -> ErrorCode:
        try:
            t.commit_msgs = self._messages(t)  # decodable before the decision is taken
        except RecordsError as exc:
            log.warning("kafka transaction %r: a staged batch does not decode (%s)", t.tid, exc)
            return exc.error_code
        with t.transition(PREPARE_COMMIT):
            await self._write(t, PREPARE_COMMIT)
        return await self._apply_commit(t)

    async def _apply_commit(self, t: TxnMeta) -> ErrorCode:
        """Apply the decided commit (commit_apply.py): append the records not in the log yet,
        set its offsets, deliver its markers, write CompleteCommit.  Idempotent: ``t.progress``
        says where the previous attempt stopped, or the log does when that attempt's answer
        was not seen; a refusal leaves the commit decided, and the scan retries it."""
        progress = t.progress
        assert progress is not None
        started = t.started_ms
        with t.transition(COMPLETE_COMMIT):
            msgs = t.commit_msgs if t.commit_msgs is not None else self._messages(t)
            t.commit_msgs = msgs
            try:
                await apply_decided(
                    self.store, progress, msgs,
                    [(g, tp, p, o) for (g, tp, p), o in t.offsets.items()],
                    elsewhere=lambda: self._deliver(t, commit=True),
                    done=lambda: self._write(t, COMPLETE_COMMIT, partitions=[], groups=[],
                                             participants={}))
            except ApplyRefused as exc:
                log.error("kafka transaction %r: commit not applied yet (%s); retrying", t.tid, exc)
                raise CoordinatorUnavailable from exc
        self.metrics.kafka_txn_committed.inc()
        self.metrics.kafka_records_produced.inc(len(msgs))
        self._finished(started)
        return ErrorCode.NONE

    async def _deliver(self, t: TxnMeta, *, commit: bool) -> None:
        """The decided outcome to every other broker group of the transaction (markers.py);
        raises CoordinatorUnavailable until all of them have it (the scan retries)."""
        if not t.participants:
            return
        if self.markers is None or not await self.markers.send(
                t.pid, t.epoch, t.txn, commit, {k: [(tp, p) for tp, p in v]
                                                for k, v in t.participants.items()}):
            raise CoordinatorUnavailable

    async def _finish_abort(self, t: TxnMeta) -> None:
        """PrepareAbort -> markers -> CompleteAbort."""
        with t.transition(COMPLETE_ABORT):
            await self._deliver(t, commit=False)
            await self._write(t, COMPLETE_ABORT, partitions=[], groups=[], offsets=[],
                              participants={})

    async def _abort(self, t: TxnMeta, reason: str, *, bump: bool) -> None:
        """Abort the open transaction; ``bump`` also raises the epoch, fencing the producer.
        Nothing was applied here, so one CompleteAbort record is the decision and its
        completion, unless other broker groups staged parts of it: then PrepareAbort first,
        their markers, then CompleteAbort."""
        state = PREPARE_ABORT if t.participants else COMPLETE_ABORT
        changes: dict = {"partitions": [], "groups": [], "offsets": [],
                         "participants": t.participants}
        started = t.started_ms
        with t.transition(state):  # before a new producer id is awaited: nothing else starts
            if bump:
                if t.epoch >= EPOCH_EXHAUSTED:
                    changes.update(pid=await self.allocate_pid(), epoch=0, last_epoch=-1)
                else:
                    changes.update(epoch=t.epoch + 1, last_epoch=t.epoch)
            await self._write(t, state, **changes)
        if t.state is PREPARE_ABORT:
            await self._finish_abort(t)
        self.metrics.kafka_txn_aborted.labels(reason=reason).inc()
        self._finished(started)

    def _finished(self, started_ms: int | None) -> None:
        if started_ms is not None:
            self.metrics.kafka_txn_duration.observe(max(0, self.now_ms() - started_ms) / 1000)

    # --- operators ---------------------------------------------------------------------------
    def transactions(self, states: Collection[str] = ()) -> list[TxnView]:
        """Every transactional id's view, by id; with ``states``, only those in one of them
        (filtered before anything is sorted or built: an admin polling the open ones of a
        broker with many settled ids costs one pass over the ids, not a sort and a copy of
        each; a bench replay polling every 100 ms slowed the broker by half as ids grew)."""
        chosen = [t for t in self._txns.values() if not states or t.state.value in states]
        chosen.sort(key=attrgetter("tid"))
        return [t.view() for t in chosen]

    def describe(self, transactional_id: str) -> TxnView | None:
        t = self._txns.get(transactional_id)
        return None if t is None else t.view()

    async def abort(self, transactional_id: str, operator: str) -> str:
        """An operator's abort of an Ongoing transaction; its producer is fenced."""
        t = self._txns.get(transactional_id)
        for _ in range(100):  # a transition in progress ends within a store write
            if t is None or not (t.busy or t.inflight):
                break
            await asyncio.sleep(0.01)
        if t is None or t.state is not ONGOING or t.busy or t.inflight:
            return "not-open"
        log.warning("kafka transaction %r aborted by operator %s", transactional_id, operator)
        try:
            await self._abort(t, "operator", bump=True)
        except CoordinatorUnavailable:
            if t.state is not PREPARE_ABORT:
                raise
            # Decided: another broker group has not answered its marker yet; the scan
            # resends it until it does.
        self.metrics.kafka_producers_fenced.inc()
        return "aborted"
