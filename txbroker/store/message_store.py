"""MessageStore: the one object the broker talks to for bytes on disk.

It ties the commitlog, the consume queues, flushing, consumer offsets, recovery, the disk guard
and retention together.  Everything runs on the event-loop thread: an append is a memcpy into
a mapped segment plus a 20-byte index entry, so it never blocks; flushes, checkpoints, offset
persistence and the preallocation of the next commitlog segment go to an executor.  ``put`` is
``async`` solely so that sync-flush mode can await the group commit.

Dispatch rule (RocketMQ): a record whose transaction bits are PREPARED or ROLLBACK is stored
but not indexed in any consume queue.  txbroker stores half messages in the half topic with
those bits cleared, so halves *are* indexed there — in the half topic, invisible to consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import shutil
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from txbroker.config import BrokerConfig
from txbroker.store.checkpoint import Checkpoint, CheckpointFile
from txbroker.store.commitlog import END_MARKER_SIZE, CommitLog
from txbroker.store.consumequeue import ConsumeQueue
from txbroker.store.flush import FlushService
from txbroker.store.lock import DataDirLock
from txbroker.store.offsets import ConsumerOffsetStore
from txbroker.store.record import (
    BORNHOST_V6_FLAG,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    MESSAGE_MAGIC,
    PROPERTY_TAGS,
    RECORD_HEAD,
    STOREHOST_V6_FLAG,
    TRANSACTION_MASK,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    RecordError,
    StoredMessage,
    create_offset_msg_id,
    decode_offset_msg_id,
    decode_record,
    decode_records,
    ip4_bytes,
    properties_to_string,
    record_size,
    tag_hash,
)

log = logging.getLogger(__name__)

_STORE_TS = struct.Struct(">q")
_I16 = struct.Struct(">h")
_I32_MAX = 2**31 - 1
#: Record bytes besides body, topic field and properties: head (84) + BODYLEN + PROPERTIESLEN.
_RECORD_OVERHEAD = record_size(0, 0, 0) - 1
_NOT_DISPATCHED = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
_NOT_V6 = ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)
_TOPIC_CACHE_MAX = 65536
_crc32 = zlib.crc32
_monotonic = time.monotonic
_STORE_TS_POS = 56  # STORETIMESTAMP within a record (IPv4 hosts)
#: Consume-queue entries a single get may look at when a tag filter skips most of them.
MAX_SCAN_ENTRIES = 800
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
#: Seconds between disk-usage probes; a put in between reuses the last answer.
DISK_PROBE_INTERVAL = 1.0
RETENTION_INTERVAL = 60.0

DiskUsage = Callable[[str], tuple[int, int, int]]  # (total, used, free), as shutil.disk_usage


class PutStatus(enum.Enum):
    OK = "OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"


@dataclass(slots=True)
class PutResult:
    status: PutStatus
    physical_offset: int = -1
    queue_offset: int = -1
    msg_id: str = ""
    store_timestamp: int = 0
    size: int = 0
    reason: str = ""

    @property
    def ok(self) -> bool:
        """Stored (a flush time-out still stored it; it is flushed later)."""
        return self.status in (PutStatus.OK, PutStatus.FLUSH_DISK_TIMEOUT)


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"


@dataclass
class GetResult:
    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    raw: list[bytes] = field(default_factory=list)

    def messages(self) -> list[StoredMessage]:
        return decode_records(b"".join(self.raw))


@dataclass
class RecoveryReport:
    clean: bool
    start_offset: int = 0
    end_offset: int = 0
    records_scanned: int = 0
    bytes_scanned: int = 0
    bytes_cut: int = 0
    queue_entries_repaired: int = 0
    queue_entries_dropped: int = 0
    seconds: float = 0.0
    #: The directory held no store before this open (nothing to recover, nothing lost).
    new: bool = False

    def describe(self) -> str:
        """One line for the start-up log: a fresh directory is not a failed clean stop."""
        if self.new:
            return "new data directory"
        if self.clean:
            return f"clean restart: commitlog ends at offset {self.end_offset} (opened in {self.seconds:.3f} s)"
        return (f"recovered after a crash: {self.records_scanned} records, {self.bytes_scanned} bytes "
                f"checked, {self.bytes_cut} cut in {self.seconds:.3f} s; log ends at offset {self.end_offset}")


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
        self._store_ip = ip4_bytes(store_host[0])
        self._store_port = store_host[1]
        #: topic -> its record field (length byte + UTF-8), validated once.
        self._topic_fields: dict[str, bytes] = {}
        self._disk_usage = disk_usage
        self.root = Path(config.data_dir)
        #: Nothing in ``root`` is read or written before this is held (see :meth:`open`).
        self._lock = DataDirLock(self.root)
        self._checkpoint = CheckpointFile(self.root)
        self.commitlog: CommitLog | None = None
        self.queues_: dict[tuple[str, int], ConsumeQueue] = {}
        #: Loaded by :meth:`open`, under the lock.
        self.offsets: ConsumerOffsetStore
        self._listeners: list[Callable[[str, int, int], None]] = []
        self._flush: FlushService | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._disk_checked_at = -1e18
        self._disk_refusal = ""
        self._closed = True
        self.puts = 0
        self.put_bytes = 0
        self.gets = 0
        self.refusals = 0

    # --- lifecycle ----------------------------------------------------------------------------
    def open(self) -> RecoveryReport:
        """Lock the data directory (:class:`~txbroker.store.lock.DataDirInUseError` if another
        process holds it), then load and recover; the lock is held until :meth:`close`."""
        self._lock.acquire()
        try:
            new = self._is_new()
            self.offsets = ConsumerOffsetStore(self.root / "consumerOffset.json")
            report = self._recover()
        except BaseException:
            self._lock.release()
            raise
        report.new = new
        return report

    def _is_new(self) -> bool:
        """No checkpoint, no abort marker, no segment: no store has ever run here."""
        segments = self.root / "commitlog"
        return not (self._checkpoint.path.exists() or self._checkpoint.abort_path.exists()
                    or (segments.is_dir() and any(p.name.isdigit() for p in segments.iterdir())))

    def _recover(self) -> RecoveryReport:
        """Load segments and queues; after an unclean stop, validate the tail and repair."""
        started = time.perf_counter()
        clean = self._checkpoint.was_clean()
        cp = self._checkpoint.load()
        self.commitlog = CommitLog(self.root / "commitlog", self.config.segment_size)
        self._load_queues()
        report = RecoveryReport(clean=clean)
        if clean and self.commitlog.segments and cp.commitlog_end >= self.commitlog.min_offset:
            self.commitlog.trust_end(cp.commitlog_end)
            report.end_offset = cp.commitlog_end
        else:
            start = max(cp.commitlog_safe, self.commitlog.min_offset)
            walk = self.commitlog.walk_valid(start)
            report.start_offset = start
            report.end_offset = walk.end
            report.records_scanned = walk.records
            report.bytes_scanned = walk.bytes_scanned
            report.bytes_cut = self.commitlog.set_end(walk.end)
            repaired, dropped = self._repair_queues(start, walk.end)
            report.queue_entries_repaired, report.queue_entries_dropped = repaired, dropped
            if report.bytes_cut:
                log.warning("commitlog tail after offset %d was torn or corrupt: %d bytes cut",
                            walk.end, report.bytes_cut)
        for cq in self.queues_.values():
            cq.delete_below(self.commitlog.min_offset)
        for seg in self.commitlog.segments:
            seg.flushed = seg.wrote
        self._checkpoint.mark_open()
        self._closed = False
        report.seconds = time.perf_counter() - started
        return report

    def _load_queues(self) -> None:
        cq_root = self.root / "consumequeue"
        cq_root.mkdir(parents=True, exist_ok=True)
        for topic_dir in cq_root.iterdir():
            if not topic_dir.is_dir():
                continue
            for qdir in topic_dir.iterdir():
                if qdir.is_dir() and qdir.name.isdigit():
                    self.queues_[(topic_dir.name, int(qdir.name))] = ConsumeQueue(
                        qdir, topic_dir.name, int(qdir.name), self.config.consume_queue_entries)

    def _repair_queues(self, start: int, end: int) -> tuple[int, int]:
        """Consume queues after a crash: drop entries past the valid log, index what is missing."""
        assert self.commitlog is not None
        dropped = 0
        for cq in self.queues_.values():
            while cq.max_offset > cq.min_offset:
                last = cq.get(cq.max_offset - 1)
                if last is not None and last[0] + last[1] <= end:
                    break
                dropped += cq.truncate(cq.max_offset - 1)
        repaired = 0
        for msg in self.commitlog.scan(start):
            if msg.physical_offset >= end:
                break
            if not _dispatched(msg.sys_flag):
                continue
            cq = self._queue(msg.topic, msg.queue_id)
            have = cq.get(msg.queue_offset)
            stale = have is None or have[0] != msg.physical_offset
            if not stale:
                continue
            # Records reach a queue in order, so a forward scan only ever rewrites an entry in
            # place or appends the next one.  A queue offset beyond that (a damaged header
            # field the body CRC does not cover) would leave a gap: it is not indexed.
            if cq.min_offset <= msg.queue_offset <= cq.max_offset:
                cq.put(msg.queue_offset, msg.physical_offset, msg.store_size, tag_hash(msg.tags))
                repaired += 1
            elif msg.queue_offset > cq.max_offset:
                log.warning("record at %d claims queue offset %d of %s/%d, past its end %d: not indexed",
                            msg.physical_offset, msg.queue_offset, msg.topic, msg.queue_id, cq.max_offset)
        return repaired, dropped

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
            loop.create_task(self._periodic(self.config.flush_interval, self._checkpoint_once), name="txbroker-flush"),
            loop.create_task(self._periodic(self.config.offset_persist_interval, self._persist_offsets),
                             name="txbroker-offsets"),
            loop.create_task(self._periodic(min(RETENTION_INTERVAL, self.config.file_reserved_time),
                                            self._retention_once), name="txbroker-retention"),
        ]

    async def close(self) -> None:
        """Final flush, offsets persisted, clean-shutdown marker."""
        if self._closed:
            return
        self._closed = True
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
        await _off_loop(self._flush_all)
        data = self.offsets.snapshot()
        if data is not None:
            await _off_loop(self.offsets.write, data)
        await _off_loop(self._mark_clean, Checkpoint(commitlog_safe=end, commitlog_end=end))
        for cq in self.queues_.values():
            cq.close()
        self.commitlog.close()
        self._lock.release()

    async def _periodic(self, interval: float, fn: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                result = fn()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("store background task %s failed", getattr(fn, "__name__", fn))

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
        await _off_loop(self._flush_all)
        if not self._closed:
            await _off_loop(self._checkpoint.save, Checkpoint(commitlog_safe=end, commitlog_end=0))

    async def _persist_offsets(self) -> None:
        data = self.offsets.snapshot()
        if data is not None:
            await _off_loop(self.offsets.write, data)

    # --- disk guard and retention ----------------------------------------------------------------
    def _disk_full_reason(self) -> str:
        now = _monotonic()
        if now - self._disk_checked_at >= DISK_PROBE_INTERVAL:
            self._disk_checked_at = now
            try:
                total, used, _free = self._disk_usage(str(self.root))
                ratio = used / total if total else 1.0
            except OSError as exc:
                self._disk_refusal = f"cannot read disk usage: {exc}"
            else:
                limit = self.config.disk_max_used_ratio
                self._disk_refusal = (
                    f"disk {ratio:.1%} full, above disk_max_used_ratio {limit:.0%}; writes refused"
                    if ratio > limit else "")
        return self._disk_refusal

    def write_refusal(self) -> str:
        """Why puts are refused right now, '' when they are accepted (the disk guard, probed at
        most every ``DISK_PROBE_INTERVAL``).  Lets a caller hold back work whose outcome needs
        a write, as the check service does."""
        if self._closed:
            return "store is closed"
        return self._disk_full_reason()

    def recheck_disk(self) -> str:
        """Probe the disk now (operators, tests); returns the refusal reason or ''."""
        self._disk_checked_at = -1e18
        return self._disk_full_reason()

    def delete_expired(self, now: float | None = None) -> int:
        """Delete closed segments last written before ``file_reserved_time``; returns how many."""
        assert self.commitlog is not None
        limit = (self.clock() if now is None else now) - self.config.file_reserved_time
        deleted = 0
        while len(self.commitlog.segments) > 1:
            seg = self.commitlog.segments[0]
            try:
                mtime = seg.path.stat().st_mtime
            except OSError:
                mtime = 0.0
            if mtime > limit:
                break
            self.commitlog.segments.pop(0).destroy()
            deleted += 1
            log.info("retention: deleted commitlog segment %s", seg.path.name)
        if deleted:
            for cq in self.queues_.values():
                cq.delete_below(self.commitlog.min_offset)
        return deleted

    def _retention_once(self) -> None:
        self.delete_expired()

    # --- writing ----------------------------------------------------------------------------------
    def delete_topic(self, topic: str) -> int:
        """Drop ``topic``'s consume queues (files included) and its consumer offsets, as
        RocketMQ's topic deletion does; returns the number of queues dropped.  The records stay
        in the commitlog until retention deletes their segments, unreachable."""
        if not topic or "/" in topic or topic in (".", ".."):
            raise ValueError(f"{topic!r} cannot name a topic directory")
        dropped = [key for key in self.queues_ if key[0] == topic]
        for key in dropped:
            self.queues_.pop(key).close()
        shutil.rmtree(self.root / "consumequeue" / topic, ignore_errors=True)
        self.offsets.forget_topic(topic)
        return len(dropped)

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues_.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(self.root / "consumequeue" / topic / str(queue_id), topic, queue_id,
                              self.config.consume_queue_entries)
            self.queues_[(topic, queue_id)] = cq
        return cq

    def _append(self, msg: Message) -> PutResult:
        """Validate and append one message (synchronous, on the loop thread).

        This is the hot path, written flat on purpose: one struct pack for the record head,
        cached topic fields and host bytes, the active segment's free space checked inline,
        and a fast index append.  Every field is validated before any byte is written; the
        only thing a refused put may leave behind is a segment roll (a blank filler).
        """
        commitlog = self.commitlog
        if self._closed or commitlog is None:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason="store is closed")
        if _monotonic() - self._disk_checked_at >= DISK_PROBE_INTERVAL:
            self._disk_full_reason()
        if self._disk_refusal:
            self.refusals += 1
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason=self._disk_refusal)
        body = msg.body
        if not isinstance(body, (bytes, bytearray, memoryview)):
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"body must be bytes, got {type(body).__name__}")
        body_len = len(body)
        if body_len > self.config.max_message_size:
            return PutResult(PutStatus.MESSAGE_ILLEGAL,
                             reason=f"body of {body_len} bytes exceeds max_message_size {self.config.max_message_size}")
        topic = msg.topic
        topic_field = self._topic_fields.get(topic)
        if topic_field is None:
            topic_field, reason = _topic_field(topic)
            if topic_field is None:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=reason)
            if len(self._topic_fields) >= _TOPIC_CACHE_MAX:
                self._topic_fields.clear()
            self._topic_fields[topic] = topic_field
        queue_id = msg.queue_id
        if type(queue_id) is not int or not 0 <= queue_id <= _I32_MAX:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"queue id {queue_id!r} must be 0..{_I32_MAX}")
        props = msg.properties
        try:
            if props:
                try:
                    props_bytes = "\x02".join([k + "\x01" + v for k, v in props.items()]).encode()
                except TypeError:  # a None value (skipped) or a non-str one (str() of it)
                    props_bytes = properties_to_string(props).encode()
            else:
                props_bytes = b""
        except UnicodeEncodeError as exc:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"properties are not encodable as UTF-8: {exc}")
        if len(props_bytes) > MAX_PROPERTIES_BYTES:
            return PutResult(PutStatus.PROPERTIES_SIZE_EXCEEDED,
                             reason=f"properties of {len(props_bytes)} bytes exceed {MAX_PROPERTIES_BYTES}")
        size = _RECORD_OVERHEAD + body_len + len(topic_field) + len(props_bytes)
        store_ts = msg.store_timestamp or int(self.clock() * 1000)
        sys_flag = msg.sys_flag
        if type(sys_flag) is not int:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"sys_flag must be an int, got {sys_flag!r}")
        dispatch = (sys_flag & TRANSACTION_MASK) not in _NOT_DISPATCHED
        cq = None
        queue_offset = 0
        if dispatch:
            try:
                cq = self.queues_.get((topic, queue_id)) or self._queue(topic, queue_id)
                cq.ensure_room()
            except OSError as exc:
                self.refusals += 1
                return PutResult(PutStatus.SERVICE_NOT_AVAILABLE,
                                 reason=f"cannot create a consume-queue file: {exc.strerror or exc}")
            queue_offset = cq.max_offset
        segs = commitlog.segments
        seg = segs[-1] if segs else None
        if seg is not None and size + END_MARKER_SIZE <= seg.size - seg.wrote:
            phys = seg.start + seg.wrote
        else:
            try:
                phys = commitlog.reserve(size)
            except OSError as exc:
                self.refusals += 1
                return PutResult(PutStatus.SERVICE_NOT_AVAILABLE,
                                 reason=f"cannot preallocate a commitlog segment: {exc.strerror or exc}")
            except ValueError as exc:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=str(exc))
            seg = segs[-1]
        born_host = msg.born_host
        try:
            head = RECORD_HEAD.pack(
                size, MESSAGE_MAGIC, _crc32(body) & 0x7FFFFFFF, queue_id, msg.flag, queue_offset,
                phys, sys_flag & _NOT_V6, msg.born_timestamp, ip4_bytes(born_host[0]), born_host[1],
                store_ts, self._store_ip, self._store_port, msg.reconsume_times,
                msg.prepared_transaction_offset, body_len)
            data = b"".join((head, body, topic_field, _I16.pack(len(props_bytes)), props_bytes))
        except (struct.error, TypeError, IndexError) as exc:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"a message field is out of range: {exc}")
        seg.append(data)
        if cq is not None:
            cq.append(phys, size, tag_hash(props.get(PROPERTY_TAGS)) if props else 0)
        self.puts += 1
        self.put_bytes += size
        result = PutResult(PutStatus.OK, phys, queue_offset, f"{self._id_prefix}{phys:016X}",
                           store_ts, size)
        if cq is not None and self._listeners:
            for fn in self._listeners:
                try:
                    fn(topic, queue_id, queue_offset + 1)
                except Exception:  # the record is stored; a listener bug must not hide that
                    log.exception("store listener %r failed", fn)
        return result

    async def _await_flush(self, results: list[PutResult]) -> None:
        if self._flush is None:
            return
        stored = [r for r in results if r.status is PutStatus.OK]
        if not stored:
            return
        end = max(r.physical_offset + r.size for r in stored)
        try:
            ok = await self._flush.wait_flushed(end, self.config.sync_flush_timeout)
        except OSError as exc:
            log.error("flush failed: %s", exc)
            ok = False
        if not ok:
            for r in stored:
                r.status = PutStatus.FLUSH_DISK_TIMEOUT

    async def put(self, msg: Message) -> PutResult:
        result = self._append(msg)
        if self._flush is not None:
            await self._await_flush([result])
        return result

    async def put_batch(self, msgs: list[Message]) -> list[PutResult]:
        """Append all, then wait for one flush covering them all (sync mode)."""
        results = [self._append(m) for m in msgs]
        await self._await_flush(results)
        return results

    def add_listener(self, fn: Callable[[str, int, int], None]) -> None:
        """``fn(topic, queue_id, new_max_offset)`` after each indexed append (long polling)."""
        self._listeners.append(fn)

    # --- reading ----------------------------------------------------------------------------------
    def get(self, topic: str, queue_id: int, offset: int, max_count: int,
            max_bytes: int = DEFAULT_MAX_BYTES, tag_filter: set[int] | None = None) -> GetResult:
        self.gets += 1
        cq = self.queues_.get((topic, queue_id))
        if cq is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        lo, hi = cq.min_offset, cq.max_offset
        if hi == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
        if offset < lo:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
        assert self.commitlog is not None
        raw: list[bytes] = []
        total = 0
        index = offset
        scan_limit = offset + max(max_count, MAX_SCAN_ENTRIES)
        missing = False
        while index < hi and index < scan_limit and len(raw) < max_count:
            entry = cq.get(index)
            if entry is None:
                break
            phys, size, thash = entry
            if tag_filter is not None and thash not in tag_filter:
                index += 1
                continue
            if raw and total + size > max_bytes:
                break
            data = self.commitlog.read_at(phys, size)
            if data is None:
                missing = True
                index += 1
                continue
            raw.append(data)
            total += size
            index += 1
        if raw:
            status = GetStatus.FOUND
        elif missing:
            status = GetStatus.OFFSET_FOUND_NULL
        else:
            status = GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, index, lo, hi, raw)

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
        cq = self.queues_.get((topic, queue_id))
        if cq is None or cq.max_offset == cq.min_offset:
            return cq.max_offset if cq else 0
        assert self.commitlog is not None
        lo, hi = cq.min_offset, cq.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            entry = cq.get(mid)
            data = self.commitlog.read_at(entry[0] + _STORE_TS_POS, 8) if entry else None
            ts = _STORE_TS.unpack(data)[0] if data else -1
            if ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

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
            "puts": self.puts, "put_bytes": self.put_bytes, "gets": self.gets,
            "refusals": self.refusals,
            "commitlog_min_offset": self.min_physical_offset,
            "commitlog_max_offset": self.max_physical_offset,
            "commitlog_segments": len(self.commitlog.segments) if self.commitlog else 0,
            "consume_queues": len(self.queues_),
            "group_commit_flushes": self._flush.flushes if self._flush else 0,
            "disk_refusal": self._disk_refusal,
        }


async def _off_loop(fn: Callable[..., object], *args: object) -> None:
    """Run blocking file work in the default executor.  A caller cancelled meanwhile still
    waits for it to finish before the cancellation goes on: :meth:`MessageStore.close` cancels
    the periodic tasks and then writes the same files, and a checkpoint or offsets write still
    running in a thread could otherwise land after the final one."""
    fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    try:
        await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        raise


def _dispatched(sys_flag: int) -> bool:
    return (sys_flag & TRANSACTION_MASK) not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)


def _topic_field(topic: object) -> tuple[bytes | None, str]:
    """The record's TOPICLEN + TOPIC bytes, or None and why the topic is not acceptable."""
    if not isinstance(topic, str):
        return None, f"topic must be a string, got {type(topic).__name__}"
    try:
        raw = topic.encode()
    except UnicodeEncodeError:
        return None, "topic is not encodable as UTF-8"
    if not 0 < len(raw) <= MAX_TOPIC_BYTES:
        return None, f"topic must be 1..{MAX_TOPIC_BYTES} bytes, got {len(raw)}"
    return bytes((len(raw),)) + raw, ""
