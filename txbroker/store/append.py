"""The put path: validate one message, lay out its record, append it to the commitlog and
index it in its consume queue, then tell the listeners (long polling).

:class:`Appender` runs on the event-loop thread and never blocks on the disk: the record is a
memcpy into the active mapped segment and the index entry 20 bytes into a mapped queue file.
The files it may have to create on the way — the next commitlog segment (preallocated ahead,
:mod:`txbroker.store.allocate`) and the next queue file (see :mod:`txbroker.store.consumequeue`)
— are created before any byte is written, so a disk that cannot hold them refuses the put.

Dispatch rule (RocketMQ): a record whose transaction bits are PREPARED or ROLLBACK is stored
but not indexed in any consume queue (:func:`txbroker.store.consumequeue.indexed`).
"""

from __future__ import annotations

import logging
import struct
import time
import zlib
from collections.abc import Callable

from txbroker.config import BrokerConfig
from txbroker.store.commitlog import END_MARKER_SIZE, CommitLog
from txbroker.store.consumequeue import NOT_INDEXED, ConsumeQueue
from txbroker.store.guard import DISK_PROBE_INTERVAL, DiskGuard
from txbroker.store.record import (
    BORNHOST_V6_FLAG,
    MAX_PROPERTIES_BYTES,
    MAX_STORED_TOPIC_BYTES,
    MESSAGE_MAGIC,
    PROPERTY_TAGS,
    RECORD_HEAD,
    STOREHOST_V6_FLAG,
    TRANSACTION_MASK,
    Message,
    ip4_bytes,
    properties_to_string,
    record_size,
    tag_hash,
)
from txbroker.store.results import Fence, PutResult, PutStatus

log = logging.getLogger(__name__)

_I16 = struct.Struct(">h")
_I32_MAX = 2**31 - 1
#: Record bytes besides body, topic field and properties: head (84) + BODYLEN + PROPERTIESLEN.
_RECORD_OVERHEAD = record_size(0, 0, 0) - 1
_NOT_V6 = ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)
_TOPIC_CACHE_MAX = 65536
_crc32 = zlib.crc32
_monotonic = time.monotonic

Listener = Callable[[str, int, int], None]
#: Consulted before every append: None = take it, a :class:`Fence` = refuse, saying why.
WriteGate = Callable[[], Fence | None]


class Appender:
    """Appends to the store's log and queues; :attr:`commitlog` is None while the store is
    closed (every put is then refused)."""

    def __init__(self, config: BrokerConfig, clock: Callable[[], float], guard: DiskGuard,
                 queues: dict[tuple[str, int], ConsumeQueue],
                 queue_for: Callable[[str, int], ConsumeQueue],
                 store_host: tuple[str, int], id_prefix: str) -> None:
        self.config = config
        self.clock = clock
        self.guard = guard
        #: The store's queues (the same dict), and how to make a missing one.
        self.queues = queues
        self.queue_for = queue_for
        self.commitlog: CommitLog | None = None
        #: offsetMsgId = host + port + offset; the first two never change for this store.
        self.id_prefix = id_prefix
        self.store_ip = ip4_bytes(store_host[0])
        self.store_port = store_host[1]
        #: topic -> its record field (length byte + UTF-8), validated once.
        self.topic_fields: dict[str, bytes] = {}
        self.listeners: list[Listener] = []
        #: Who decides whether a client write may be appended now (None: always; a clustered
        #: broker's role installs one, docs/cluster.md "Fencing").  Replicated bytes do not
        #: come through here.
        self.gate: WriteGate | None = None
        self.puts = 0
        self.put_bytes = 0
        self.refusals = 0

    def append(self, msg: Message) -> PutResult:
        """Validate and append one message (synchronous, on the loop thread).

        This is the hot path, written flat on purpose: one struct pack for the record head,
        cached topic fields and host bytes, the active segment's free space checked inline,
        and a fast index append.  Every field is validated before any byte is written; the
        only thing a refused put may leave behind is a segment roll (a blank filler).
        """
        commitlog = self.commitlog
        if commitlog is None:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason="store is closed")
        gate = self.gate
        if gate is not None:
            fence = gate()
            if fence is not None:
                return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason=fence.text)
        guard = self.guard
        if _monotonic() - guard.checked_at >= DISK_PROBE_INTERVAL:
            guard.probe()
        if guard.refusal:
            self.refusals += 1
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason=guard.refusal)
        body = msg.body
        if not isinstance(body, (bytes, bytearray, memoryview)):
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"body must be bytes, got {type(body).__name__}")
        body_len = len(body)
        if body_len > self.config.max_message_size:
            return PutResult(PutStatus.MESSAGE_ILLEGAL,
                             reason=f"body of {body_len} bytes exceeds max_message_size {self.config.max_message_size}")
        topic = msg.topic
        topic_field = self.topic_fields.get(topic)
        if topic_field is None:
            topic_field, reason = topic_field_of(topic)
            if topic_field is None:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=reason)
            if len(self.topic_fields) >= _TOPIC_CACHE_MAX:
                self.topic_fields.clear()
            self.topic_fields[topic] = topic_field
        queue_id = msg.queue_id
        if type(queue_id) is not int or not 0 <= queue_id <= _I32_MAX:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"queue id {queue_id!r} must be 0..{_I32_MAX}")
        props = msg.properties
        try:
            if props:
                try:
                    props_bytes = "\x02".join(map("\x01".join, props.items())).encode()
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
        dispatch = (sys_flag & TRANSACTION_MASK) not in NOT_INDEXED
        cq = None
        queue_offset = 0
        if dispatch:
            try:
                cq = self.queues.get((topic, queue_id)) or self.queue_for(topic, queue_id)
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
                store_ts, self.store_ip, self.store_port, msg.reconsume_times,
                msg.prepared_transaction_offset, body_len)
            data = b"".join((head, body, topic_field, _I16.pack(len(props_bytes)), props_bytes))
        except (struct.error, TypeError, IndexError) as exc:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"a message field is out of range: {exc}")
        seg.append(data)
        if cq is not None:
            cq.append(phys, size, tag_hash(props.get(PROPERTY_TAGS)) if props else 0)
        self.puts += 1
        self.put_bytes += size
        result = PutResult(PutStatus.OK, phys, queue_offset, f"{self.id_prefix}{phys:016X}",
                           store_ts, size)
        if cq is not None and self.listeners:
            for fn in self.listeners:
                try:
                    fn(topic, queue_id, queue_offset + 1)
                except Exception:  # the record is stored; a listener bug must not hide that
                    log.exception("store listener %r failed", fn)
        return result


def topic_field_of(topic: object) -> tuple[bytes | None, str]:
    """The record's TOPICLEN + TOPIC bytes, or None and why the topic is not acceptable."""
    if not isinstance(topic, str):
        return None, f"topic must be a string, got {type(topic).__name__}"
    try:
        raw = topic.encode()
    except UnicodeEncodeError:
        return None, "topic is not encodable as UTF-8"
    if not 0 < len(raw) <= MAX_STORED_TOPIC_BYTES:
        return None, f"topic must be 1..{MAX_STORED_TOPIC_BYTES} bytes, got {len(raw)}"
    return bytes((len(raw),)) + raw, ""
