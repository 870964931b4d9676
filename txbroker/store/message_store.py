"""MessageStore: the one object the broker talks to for bytes on disk.

A facade: it ties the commitlog, the consume queues (:mod:`~txbroker.store.consumequeue`),
flushing (:mod:`~txbroker.store.flush`), consumer offsets, recovery
(:mod:`~txbroker.store.recovery`), the disk guard (:mod:`~txbroker.store.guard`), retention
(:mod:`~txbroker.store.retention`), queue reads (:mod:`~txbroker.store.reads`) and the put path
(:mod:`~txbroker.store.append`) together.  Everything runs on the event-loop thread: an append
is a memcpy into a mapped segment plus a 20-byte index entry, so it never blocks; flushes,
checkpoints, offset persistence, file deletion and the preallocation of the next commitlog
segment go to an executor.  ``put`` is ``async`` solely so that sync-flush mode can await the group commit.

It is one file past ~450 lines because it is the facade: each method is a few lines tying
the modules above to the store's one lifecycle and state (the replication entry points included,
whose work lives in :mod:`~txbroker.store.reput` and :mod:`~txbroker.store.commitlog`).

The result types and the disk-guard names are imported here too (``__all__``): the service,
the benchmarks and the tests take them from the store's facade.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from txbroker.config import BrokerConfig
from txbroker.store import offset_log
from txbroker.store.append import Appender, WriteGate
from txbroker.store.background import off_loop, periodic
from txbroker.store.checkpoint import Checkpoint, CheckpointFile
from txbroker.store.commitlog import CommitLog
from txbroker.store.consumequeue import ConsumeQueue
from txbroker.store.epochs import FILE_NAME as EPOCH_FILE_NAME
from txbroker.store.epochs import EpochFile
from txbroker.store.flush import FlushService
from txbroker.store.guard import DISK_PROBE_INTERVAL, DiskGuard, DiskUsage
from txbroker.store.lock import DataDirLock
from txbroker.store.offsets import ConsumerOffsetStore
from txbroker.store.reads import DEFAULT_MAX_BYTES, offset_by_time, read_queue
from txbroker.store.record import (
    Message,
    RecordError,
    StoredMessage,
    create_offset_msg_id,
    decode_offset_msg_id,
    decode_record,
)
from txbroker.store.recovery import (
    RecoveryReport,
    drop_entries_past,
    is_new,
    load_queues,
    recover,
)
from txbroker.store.reput import reput
from txbroker.store.results import Fence, GetResult, GetStatus, PutResult, PutStatus
from txbroker.store.retention import (
    RETENTION_INTERVAL,
    destroy_files,
    empty_trash,
    move_to_trash,
    remove_tree,
    take_expired,
)

__all__ = ["DISK_PROBE_INTERVAL", "DiskUsage", "Fence", "GetResult", "GetStatus", "MessageStore", "PutResult",
           "PutStatus", "RecoveryReport"]

log = logging.getLogger(__name__)

#: Awaited after the flush wait with the end offset of what a put stored (SYNC_MASTER).
ReplicationWaiter = Callable[[int], Awaitable[PutStatus]]


class MessageStore:
    def __init__(
        self,
        config: BrokerConfig,
        *,
        clock: Callable[[], float] = time.time,
        store_host: tuple[str, int] = ("127.0.0.1", 10911),
        disk_usage: DiskUsage = shutil.disk_usage,
    ) -> None:
        self.config = config
        self.clock = clock
        self.store_host = store_host
        #: offsetMsgId = host + port + offset; the first two never change for this store.
        self._id_prefix = create_offset_msg_id(store_host[0], store_host[1], 0)[:16]
        self.root = Path(config.data_dir)
        self._guard = DiskGuard(self.root, config.disk_max_used_ratio, disk_usage)
        #: Nothing in ``root`` is read or written before this is held (see :meth:`open`).
        self._lock = DataDirLock(self.root)
        self._checkpoint = CheckpointFile(self.root)
        self.commitlog: CommitLog | None = None
        self.queues_: dict[tuple[str, int], ConsumeQueue] = {}
        #: Loaded by :meth:`open`, under the lock.
        self.offsets: ConsumerOffsetStore
        self._flush: FlushService | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = True
        #: The put path; it refuses every put until :meth:`open` hands it the commitlog.
        self._appender = Appender(config, clock, self._guard, self.queues_, self._queue, store_host,
                                  self._id_prefix)
        self.gets = 0
        #: SYNC_MASTER: awaited by every put after its flush wait (:meth:`set_replication`).
        self._replication: ReplicationWaiter | None = None
        #: Reads through a queue return nothing at or past this physical offset (None: no cap).
        self.visible_limit: int | None = None
        #: Master epochs and where each began writing (loaded by :meth:`open`).
        self.epochs: EpochFile
        #: Replicated bytes: where indexing resumes, and where the log ended after the last
        #: replicated append (if it ends elsewhere now, a put or a cut moved it: a boundary).
        self._reput_from = 0
        self._replica_end = -1
        self._topic_names: dict[bytes, str] = {}
        #: Truncations so far: a checkpoint taken across one must not be saved.
        self._cuts = 0
        #: Offsets committed in this loop step (:meth:`commit_offsets`), written together at
        #: its end, and the answer they share; the waits of earlier batches.
        self._offset_rows: list[offset_log.OffsetRow] = []
        self._offset_done: asyncio.Future[PutResult] | None = None
        self._offset_waits: set[asyncio.Task[None]] = set()

    # --- lifecycle ----------------------------------------------------------------------------
    def open(self) -> RecoveryReport:
        """Lock the data directory (:class:`~txbroker.store.lock.DataDirInUseError` if another
        process holds it), then load and recover; the lock is held until :meth:`close`."""
        self._lock.acquire()
        try:
            new = is_new(self.root, self._checkpoint)
            empty_trash(self.root)
            self.offsets = ConsumerOffsetStore(self.root / "consumerOffset.json")
            self.epochs = EpochFile(self.root / EPOCH_FILE_NAME)
            report = self._recover()
            self.apply_offset_log()  # before anything is served: the offsets the log holds
            # Epochs that began past the recovered end lost their bytes with the torn tail.
            self.epochs.truncate_from(self.max_physical_offset + 1)
        except BaseException:
            self._lock.release()
            raise
        report.new = new
        return report

    def _recover(self) -> RecoveryReport:
        """Load segments and queues; after an unclean stop, validate the tail and repair."""
        started = time.perf_counter()
        self.commitlog = CommitLog(self.root / "commitlog", self.config.segment_size, sync_flush=self.config.flush_mode == "sync")
        self.queues_.update(load_queues(self.root / "consumequeue", self.config.consume_queue_entries))
        report = recover(self.commitlog, self.queues_, self._checkpoint, self._queue)
        self._checkpoint.mark_open()
        self._closed = False
        self._appender.commitlog = self.commitlog
        report.seconds = time.perf_counter() - started
        return report

    async def start(self) -> None:
        """Start the background tasks: flushing, checkpoints, offset persistence, retention;
        returns once the next commitlog segment is preallocated (or could not be)."""
        assert self.commitlog is not None
        await self.commitlog.allocator.start()
        if self.config.flush_mode == "sync":
            self._flush = FlushService(self._flush_commitlog, lambda: self.max_physical_offset)
            self._flush.start()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(periodic(self.config.flush_interval, self._checkpoint_once), name="txbroker-flush"),
            loop.create_task(periodic(self.config.offset_persist_interval, self._persist_offsets),
                             name="txbroker-offsets"),
            loop.create_task(periodic(min(RETENTION_INTERVAL, self.config.file_reserved_time),
                                     self.delete_expired), name="txbroker-retention"),
        ]

    async def close(self) -> None:
        """Final flush, offsets persisted, clean-shutdown marker."""
        if self._closed:
            return
        self._closed = True
        self._appender.commitlog = None
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        if self._flush is not None:
            await self._flush.close()
        assert self.commitlog is not None
        await self.commitlog.allocator.close()
        end = self.max_physical_offset
        await off_loop(self._flush_all)
        data = self.offsets.snapshot()
        if data is not None:
            await off_loop(self.offsets.write, data)
        await off_loop(self._mark_clean, Checkpoint(commitlog_safe=end, commitlog_end=end))
        for cq in self.queues_.values():
            cq.close()
        self.commitlog.close()
        self._lock.release()

    # --- flushing -------------------------------------------------------------------------------
    def _flush_commitlog(self, target: int) -> int:
        """Blocking: fdatasync every segment holding bytes before ``target``."""
        assert self.commitlog is not None
        for seg in list(self.commitlog.segments):
            if seg.flushed < seg.wrote and seg.start < target:
                wrote = seg.wrote
                seg.sync()
                seg.flushed = max(seg.flushed, wrote)
        return target

    def _flush_all(self) -> None:
        self._flush_commitlog(self.max_physical_offset)
        for cq in list(self.queues_.values()):
            cq.sync()

    def _mark_clean(self, cp: Checkpoint) -> None:
        """Blocking: the final checkpoint, then the clean-shutdown marker."""
        self._checkpoint.save(cp)
        self._checkpoint.mark_clean()

    async def _checkpoint_once(self) -> None:
        """Flush log and queues, then record how far both are durable (recovery starts there)."""
        end = self.max_physical_offset
        cuts = self._cuts
        await off_loop(self._flush_all)
        if not self._closed and cuts == self._cuts:  # a cut meanwhile may have moved the end back
            await off_loop(self._checkpoint.save, Checkpoint(commitlog_safe=end, commitlog_end=0))

    async def _persist_offsets(self) -> None:
        data = self.offsets.snapshot()
        if data is not None:
            await off_loop(self.offsets.write, data)

    # --- disk guard and retention ----------------------------------------------------------------
    def write_refusal(self) -> str:
        """Why puts are refused right now, '' when they are accepted (the disk guard, probed at
        most every ``DISK_PROBE_INTERVAL``).  Lets a caller hold back work whose outcome needs
        a write, as the check service does."""
        if self._closed:
            return "store is closed"
        return self._guard.probe()

    def recheck_disk(self) -> str:
        """Probe the disk now (operators, tests); returns the refusal reason or ''."""
        return self._guard.probe_now()

    async def delete_expired(self, now: float | None = None) -> int:
        """Delete closed segments last written before ``file_reserved_time``, and the queue
        files indexing only them; returns how many segments.  They leave the lists here, on
        the loop, before their files are deleted in the executor."""
        assert self.commitlog is not None
        limit = (self.clock() if now is None else now) - self.config.file_reserved_time
        # The offsets file must cover every offset record a deleted segment holds: write it
        # first (it then covers the whole offset log; see offset_log.py).  A failure raises,
        # and nothing is deleted.
        self.snapshot_offsets_if_due()
        await self._persist_offsets()
        expired = take_expired(self.commitlog, limit)
        if not expired:
            return 0
        files = list(expired)
        for cq in self.queues_.values():
            files.extend(cq.delete_below(self.commitlog.min_offset))
        await off_loop(destroy_files, files)
        for seg in expired:
            log.info("retention: deleted commitlog segment %s", seg.path.name)
        return len(expired)

    async def delete_topic(self, topic: str) -> int:
        """Drop ``topic``'s consume queues (files included) and its consumer offsets, as
        RocketMQ's topic deletion does; returns the number of queues dropped.  The records stay
        in the commitlog until retention deletes their segments, unreachable.  The queue
        directory is renamed aside on the loop and removed in the executor."""
        if not topic or "/" in topic or topic in (".", ".."):
            raise ValueError(f"{topic!r} cannot name a topic directory")
        dropped = [key for key in self.queues_ if key[0] == topic]
        for key in dropped:
            self.queues_.pop(key).close()
        trashed = move_to_trash(self.root / "consumequeue" / topic, self.root)
        self.offsets.forget_topic(topic)
        if trashed is not None:
            await off_loop(remove_tree, trashed)
        return len(dropped)

    def expire_head(self, topic: str, queue_id: int, offset: int) -> int:
        """Make the queue start at ``offset`` at the earliest (a topic retention shorter than
        ``file_reserved_time``, docs/kafka.md "Admin APIs"): entries below it are no longer
        read, as after retention; their files go with the commitlog segments they index.  In
        memory only: the caller applies it again after a restart.  Returns the new start."""
        cq = self.queues_.get((topic, queue_id))
        if cq is None:
            return 0
        cq.min_offset = max(cq.min_offset, min(offset, cq.max_offset))
        return cq.min_offset

    # --- consumer offsets: the offset log ------------------------------------------------------
    def apply_offset_log(self) -> int:
        """Apply the offset records past the last one applied to :attr:`offsets`, in queue
        order (see :mod:`txbroker.store.offset_log`); returns how many.  The one path for a
        master after its append, a slave after replicated bytes, and recovery."""
        cq = self.queues_.get((offset_log.TOPIC, offset_log.QUEUE))
        offsets = self.offsets
        if cq is None or offsets.log_applied >= cq.max_offset:
            return 0
        start = offsets.log_applied
        if start < cq.min_offset:
            if start == 0:  # an empty replica that started at the master's oldest segment
                log.info("consumer offsets: applied from record %d of %s on (the older ones "
                         "are gone; the snapshots since hold every offset)", cq.min_offset,
                         offset_log.TOPIC)
            else:
                log.error("consumer offsets: records %d to %d of %s are gone (the offsets "
                          "file predates retention); offsets only they held are lost", start,
                          cq.min_offset - 1, offset_log.TOPIC)
            start = cq.min_offset
        applied = 0
        for qoff in range(start, cq.max_offset):
            entry = cq.get(qoff)
            msg = self.read(entry[0]) if entry is not None else None
            if msg is None:
                log.error("consumer offset record %d of %s cannot be read: skipped", qoff,
                          offset_log.TOPIC)
                offsets.applied(qoff)
            else:
                self._apply_offset_record(msg.body, qoff)
                applied += 1
        return applied

    def _apply_offset_record(self, body: bytes, queue_offset: int) -> None:
        offset_log.apply(self.offsets, body, queue_offset)
        self.offsets.applied(queue_offset)

    def _write_offset_record(self, msg: Message) -> PutResult:
        """Append an offset record and apply it.  The body just written is applied as the
        record's bytes would be (the same :func:`offset_log.apply`), without reading it back,
        when it is the next record to apply; otherwise the log is read from the cursor."""
        result = self._appender.append(msg)
        if result.ok:
            if result.queue_offset == self.offsets.log_applied:
                self._apply_offset_record(msg.body, result.queue_offset)
            else:
                self.apply_offset_log()
        return result

    def commit_offsets_now(self, rows: list[offset_log.OffsetRow]) -> PutResult:
        """Write the rows as an offset record (more than one only when they do not fit half
        ``max_message_size``; refused on a slave or a fenced master, as a put is) and apply
        it: what a consumer reads back from now on.  No wait: the record is as durable and
        replicated as a put written now (see :meth:`commit_offsets`)."""
        result = PutResult(PutStatus.OK)
        for msg in offset_log.set_messages(rows, self.config.max_message_size // 2):
            result = self._write_offset_record(msg)
            if not result.ok:
                break
        return result

    async def commit_offsets(self, rows: list[offset_log.OffsetRow]) -> PutResult:
        """:meth:`commit_offsets_now`, answered as a send would be: after the flush (sync
        mode) and the slaves (a SYNC_MASTER).  When there is such a wait, the commits of one
        loop step share one record and one wait (consumers' commits arriving together cost
        one append); without one, the commit is written at once and the coroutine never
        suspends (the connection answers it inline, as before offsets were records)."""
        if self.answers_at_once:
            return self.commit_offsets_now(rows)
        done = self._offset_done
        if done is None:
            loop = asyncio.get_running_loop()
            done = self._offset_done = loop.create_future()
            loop.call_soon(self._write_offset_batch)
        self._offset_rows.extend(rows)
        return await asyncio.shield(done)

    def _write_offset_batch(self) -> None:
        rows, done = self._offset_rows, self._offset_done
        self._offset_rows, self._offset_done = [], None
        assert done is not None
        result = self.commit_offsets_now(rows)
        if not result.ok or self.answers_at_once:  # (replication may have ended meanwhile)
            done.set_result(result)
            return
        task = asyncio.get_running_loop().create_task(self._confirm_offsets(result, done))
        self._offset_waits.add(task)
        task.add_done_callback(self._offset_waits.discard)

    async def _confirm_offsets(self, result: PutResult, done: asyncio.Future[PutResult]) -> None:
        try:
            await self._await_flush([result])
            if self._replication is not None:
                await self._await_replicas([result])
            self._recheck_gate([result])
        except BaseException as exc:
            done.set_exception(exc)
            raise
        done.set_result(result)

    def snapshot_offsets_if_due(self) -> bool:
        """The master writes the whole table into the offset log again once its last snapshot
        is half ``file_reserved_time`` old (see :mod:`offset_log`); True when it did.  A slave
        (or a fenced master) is refused and tries again at the next retention pass."""
        now_ms = int(self.clock() * 1000)
        due = self.offsets.snapshot_ms + self.config.file_reserved_time * 500
        if now_ms < due or (self.fenced is not None) or self._closed:
            return False
        msgs = offset_log.set_messages(self.offsets.rows(), self.config.max_message_size // 2,
                                       snap_ms=now_ms)
        for msg in msgs:
            if not self._write_offset_record(msg).ok:
                return False
        log.info("consumer offsets: snapshot of %d offsets written to the offset log in %d "
                 "record(s)", len(self.offsets.rows()), len(msgs))
        return True

    def forget_offsets_now(self, keys: list[tuple[str, str, int]]) -> PutResult:
        """Remove offsets through the log (expired, or their group deleted)."""
        result = PutResult(PutStatus.OK)
        for msg in offset_log.forget_messages(keys, self.config.max_message_size // 2):
            result = self._write_offset_record(msg)
            if not result.ok:
                break
        return result

    # --- writing ----------------------------------------------------------------------------------
    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues_.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(self.root / "consumequeue" / topic / str(queue_id), topic, queue_id,
                              self.config.consume_queue_entries)
            self.queues_[(topic, queue_id)] = cq
        return cq

    async def _await_flush(self, results: list[PutResult]) -> None:
        """Sync mode: wait for one group commit covering every stored result; the ones it
        did not cover in ``sync_flush_timeout`` (or that a failed flush left) answer
        FLUSH_DISK_TIMEOUT.  Only the commitlog is flushed here: the consume queues are
        rebuilt from it by recovery, and are flushed on the checkpoint interval."""
        if self._flush is None:
            return
        stored = [r for r in results if r.status is PutStatus.OK]
        if not stored:
            return
        end = max(r.physical_offset + r.size for r in stored)
        if not await self._flush.wait_flushed(end, self.config.sync_flush_timeout):
            for r in stored:
                r.status = PutStatus.FLUSH_DISK_TIMEOUT

    @property
    def answers_at_once(self) -> bool:
        """True when a put is answered as soon as it is appended (asynchronous flush, no
        replicas to wait for), as on a single broker by default: the transaction fast paths
        then call :meth:`put_now` / :meth:`put_chain_now` and create no coroutine."""
        return self._flush is None and self._replication is None

    @property
    def replicated(self) -> bool:
        """True while puts wait for slaves to hold them (a SYNC_MASTER)."""
        return self._replication is not None

    def put_now(self, msg: Message) -> PutResult:
        """:meth:`put` for a store that :attr:`answers_at_once` (the caller checked)."""
        return self._appender.append(msg)

    def put_chain_now(self, msgs: list[Message]) -> list[PutResult]:
        """:meth:`put_chain` without its waits: for a store that :attr:`answers_at_once`, or
        records nobody waits for (with sync flush, the group commit or the interval flush
        makes them durable later)."""
        results = []
        append = self._appender.append
        for m in msgs:
            result = append(m)
            results.append(result)
            if result.status is not PutStatus.OK:
                break
        return results

    async def put(self, msg: Message) -> PutResult:
        result = self._appender.append(msg)
        if result.status is not PutStatus.OK:
            return result
        flush, waited = self._flush, False
        if flush is not None:
            waited = True
            if not await flush.wait_flushed(result.physical_offset + result.size,
                                            self.config.sync_flush_timeout):
                result.status = PutStatus.FLUSH_DISK_TIMEOUT
        if self._replication is not None:
            waited = True
            await self._await_replicas([result])
        if waited:
            self._recheck_gate([result])
        return result

    async def put_batch(self, msgs: list[Message]) -> list[PutResult]:
        """Append all, then wait for one flush covering them all (sync mode)."""
        results = [self._appender.append(m) for m in msgs]
        await self._await_flush(results)
        if self._replication is not None:
            await self._await_replicas(results)
        self._recheck_gate(results)
        return results

    async def put_chain(self, msgs: list[Message]) -> list[PutResult]:
        """Append in order while the store accepts, then wait for one flush covering them
        (sync mode).  The results stop at the first refusal (which is the last result): a
        record that must not exist without the one before it (a commit's op record after its
        final message) is never written alone."""
        results = self.put_chain_now(msgs)
        await self._await_flush(results)
        if self._replication is not None:
            await self._await_replicas(results)
        self._recheck_gate(results)
        return results

    async def confirm_stored(self, result: PutResult) -> PutResult:
        """Answer again for a record stored earlier (a producer's retry of a half whose first
        answer was lost, or was OUTCOME_UNKNOWN) as a put of it would be answered now: refused
        while the gate is up; else after the flush and replica waits, taken up to this log's
        end (which covers the record), with the gate checked again before the answer leaves.
        Without this, a retry would acknowledge a record no in-sync replica may hold, from a
        master that may no longer speak for its group."""
        result = self.confirm_stored_now(result)
        if not result.ok:
            return result
        await self._await_flush([result])
        if self._replication is not None:
            await self._await_replicas([result])
        self._recheck_gate([result])
        return result

    def confirm_stored_now(self, result: PutResult) -> PutResult:
        """:meth:`confirm_stored` for a store that :attr:`answers_at_once` (and its first
        step otherwise): refused while the gate is up, else taken up to this log's end."""
        fence = self.fenced
        if fence is not None:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason=fence.text)
        result.size = max(result.size, self.max_physical_offset - result.physical_offset)
        return result

    def _recheck_gate(self, results: list[PutResult]) -> None:
        """The answer leaves now: if the gate went up while a put waited (for the disk or the
        slaves) and the fence says another replica may now speak for the group, a stored put
        is not acknowledged but answered OUTCOME_UNKNOWN (it may or may not be delivered)."""
        gate = self._appender.gate
        fence = gate() if gate is not None else None
        if fence is None or not fence.revokes_acks:
            return
        for r in results:
            if r.ok:
                r.status = PutStatus.OUTCOME_UNKNOWN
                r.reason = (f"stored, but not acknowledged: {fence.text}; the message may or may "
                            "not be delivered")

    def set_write_gate(self, gate: WriteGate | None) -> None:
        """Install the one authority on client writes (docs/cluster.md, "Fencing"): ``gate()``
        is called before every append (a :class:`Fence` refuses it with SERVICE_NOT_AVAILABLE
        and the fence's words) and again when a put that waited is answered (see
        :meth:`_recheck_gate`).  None: every write is taken (a single broker)."""
        self._appender.gate = gate

    @property
    def fenced(self) -> Fence | None:
        """Why client writes are refused right now, None when they are taken."""
        gate = self._appender.gate
        return gate() if gate is not None else None

    # --- replication --------------------------------------------------------------------------------
    def set_replication(self, waiter: ReplicationWaiter | None) -> None:
        """SYNC_MASTER: every put then awaits ``waiter(end offset)`` after its flush wait; a
        non-OK answer replaces the put's status (RocketMQ lets the replica status win).  None
        turns it off; the put path then costs what it did without replication."""
        self._replication = waiter

    async def _await_replicas(self, results: list[PutResult]) -> None:
        assert self._replication is not None
        stored = [r for r in results if r.ok]
        if not stored:
            return
        status = await self._replication(max(r.physical_offset + r.size for r in stored))
        if status is not PutStatus.OK:
            for r in stored:
                r.status = status

    def append_replicated(self, offset: int, data: bytes | memoryview) -> int:
        """A slave: append a master's raw commitlog bytes at ``offset`` (this log's end), then
        index every record now complete into its consume queue at the queue offset the record
        states, and tell the listeners.  The bytes may end mid-record; that record is indexed
        once its rest arrives.  Returns the new max physical offset."""
        commitlog = self.commitlog
        if commitlog is None or self._closed:
            raise RuntimeError("store is closed")
        if not commitlog.segments:
            self._reput_from = offset
        elif self._replica_end != commitlog.max_offset:
            # Puts or recovery left the end here: it is a record boundary.
            self._reput_from = commitlog.max_offset
        commitlog.append_replicated(offset, data)
        self._replica_end = commitlog.max_offset
        self._reput_from, touched = reput(commitlog, self.queues_, self._queue, self._reput_from,
                                          self._topic_names)
        if (offset_log.TOPIC, offset_log.QUEUE) in touched:
            self.apply_offset_log()
        if touched and self._appender.listeners:
            for (topic, qid), new_max in touched.items():
                for fn in self._appender.listeners:
                    try:
                        fn(topic, qid, new_max)
                    except Exception:
                        log.exception("store listener %r failed", fn)
        return self._replica_end

    def truncate(self, offset: int) -> int:
        """Cut the commitlog at ``offset`` (a slave whose log diverged from its new master's),
        with the queue entries and epochs past it; returns how many bytes were cut.  The
        checkpoint is pulled back too, so a crash right after never trusts the cut bytes."""
        cut = self._cut(max(offset, 0))
        self.epochs.truncate_from(offset)
        return cut

    def _cut(self, offset: int) -> int:
        commitlog = self.commitlog
        assert commitlog is not None
        cut = 0
        if offset < commitlog.max_offset:
            complete = self._reput_from if self._replica_end == commitlog.max_offset else commitlog.max_offset
            self._cuts += 1
            cut = commitlog.set_end(offset)
            drop_entries_past(self.queues_, offset)
            self.offsets.rewind(self.max_offset(offset_log.TOPIC, offset_log.QUEUE))
            boundary = complete if complete <= offset else commitlog.boundary_at_or_before(offset)
            self._reput_from, self._replica_end = boundary, commitlog.max_offset
            cp = self._checkpoint.load()
            if cp.commitlog_safe > boundary:
                self._checkpoint.save(Checkpoint(commitlog_safe=boundary, commitlog_end=0))
            log.warning("commitlog truncated at offset %d: %d bytes cut", offset, cut)
        return cut

    def cut_torn_tail(self) -> int:
        """Promotion: cut the bytes past the last complete record (a replicated batch may end
        mid-record) and return where the log now ends."""
        commitlog = self.commitlog
        assert commitlog is not None
        if self._replica_end != commitlog.max_offset:
            return commitlog.max_offset  # every byte was written whole by this store
        end = commitlog.walk_valid(self._reput_from).end
        self._cut(end)
        self.epochs.truncate_from(end + 1)
        return end

    def add_listener(self, fn: Callable[[str, int, int], None]) -> None:
        """``fn(topic, queue_id, new_max_offset)`` after each indexed append (long polling)."""
        self._appender.listeners.append(fn)

    # --- reading ----------------------------------------------------------------------------------
    def get(self, topic: str, queue_id: int, offset: int, max_count: int,
            max_bytes: int = DEFAULT_MAX_BYTES, tag_filter: set[int] | None = None) -> GetResult:
        self.gets += 1
        return read_queue(self.commitlog, self.queues_.get((topic, queue_id)), offset, max_count,
                          max_bytes, tag_filter, self.visible_limit)

    def read(self, physical_offset: int) -> StoredMessage | None:
        raw = self.read_raw(physical_offset)
        if raw is None:
            return None
        try:
            return decode_record(raw)
        except RecordError:
            return None

    def read_by_msg_id(self, msg_id: str) -> StoredMessage | None:
        """The message an offsetMsgId names, None if it names nothing here.

        The id carries the store host and port as well as the offset: an id from another
        broker (or this one under another address) must not resolve to whatever record this
        log holds at that offset.  ValueError when ``msg_id`` is not an offsetMsgId at all."""
        decode_offset_msg_id(msg_id)  # shape and hex
        if msg_id[:16].upper() != self._id_prefix:
            return None
        return self.read(int(msg_id[16:], 16))

    def read_raw(self, physical_offset: int) -> bytes | None:
        if self.commitlog is None or physical_offset < 0:
            return None
        return self.commitlog.read_raw(physical_offset)

    def scan(self, start_physical_offset: int = 0) -> Iterator[StoredMessage]:
        assert self.commitlog is not None
        return self.commitlog.scan(start_physical_offset)

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues_.get((topic, queue_id))
        return cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues_.get((topic, queue_id))
        return cq.max_offset if cq else 0

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose store timestamp is >= ``timestamp_ms`` (max offset if none)."""
        return offset_by_time(self.commitlog, self.queues_.get((topic, queue_id)), timestamp_ms)

    def queues(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for (topic, qid), cq in sorted(self.queues_.items()):
            if cq.max_offset > 0:  # a queue whose first put was refused holds nothing
                out.setdefault(topic, []).append(qid)
        return out

    @property
    def max_physical_offset(self) -> int:
        return self.commitlog.max_offset if self.commitlog else 0

    @property
    def min_physical_offset(self) -> int:
        return self.commitlog.min_offset if self.commitlog else 0

    def stats(self) -> dict[str, int | str]:
        return {
            "puts": self._appender.puts, "put_bytes": self._appender.put_bytes, "gets": self.gets,
            "refusals": self._appender.refusals,
            "commitlog_min_offset": self.min_physical_offset,
            "commitlog_max_offset": self.max_physical_offset,
            "commitlog_segments": len(self.commitlog.segments) if self.commitlog else 0,
            "consume_queues": len(self.queues_),
            "group_commit_flushes": self._flush.flushes if self._flush else 0,
            "disk_refusal": self._guard.refusal,
        }
