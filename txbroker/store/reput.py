"""Indexing replicated bytes: a slave's consume queues are built from the records its
commitlog holds, not from puts (RocketMQ's ``ReputMessageService``).

Replicated bytes arrive in batches that may end mid-record, so :func:`reput` walks from the
end of the last record it indexed and stops at the first record that is not complete yet; the
next batch resumes there.  Each record goes into its queue at the queue offset the record
itself states (the master's), as recovery's ``repair_queues`` does, so a slave's queue answers
a pull at an offset exactly as the master's does.  Only the header fields indexing needs are
read: a full decode per record would cap a catch-up well below the disk's speed.

Every read is bounded by the record's own size: the bytes come from another process over the
network, so a length field that points past its record (a corrupt or hostile batch) raises
:class:`CorruptRecord` naming the offset, never an IndexError from deep inside a slice.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable

from txbroker.store.commitlog import END_MARKER_SIZE, CommitLog
from txbroker.store.consumequeue import ConsumeQueue, indexed
from txbroker.store.record import (
    BLANK_MAGIC,
    BORNHOST_V6_FLAG,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    PROPERTY_TAGS,
    STOREHOST_V6_FLAG,
    RecordError,
    string_to_properties,
    tag_hash,
)

log = logging.getLogger(__name__)

_SIZE_MAGIC = struct.Struct(">iI")
#: queue id (12), flag, queue offset (20), physical offset, sys flag (36)
_FIELDS = struct.Struct(">iiqqi")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_TAGS_KEY = PROPERTY_TAGS.encode() + b"\x01"
#: Where the body length sits in a record with IPv4 hosts (the only layout a store writes).
_BODY_LEN_AT = 84


class CorruptRecord(RecordError):
    """Replicated bytes at ``offset`` are not a record this store can index."""

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(f"replicated record at offset {offset} is corrupt: {why}")
        self.offset = offset


def _fields(raw: bytes, offset: int) -> tuple[bytes, int, int]:
    """(topic bytes, the properties' start, their length) of the record ``raw``, every length
    checked against ``len(raw)``."""
    size = len(raw)
    body_len = _I32.unpack_from(raw, _BODY_LEN_AT)[0]
    at = _BODY_LEN_AT + 4 + body_len
    if body_len < 0 or at + 1 > size:
        raise CorruptRecord(offset, f"body length {body_len} does not fit its {size}-byte record")
    topic_len = raw[at]
    props_at = at + 1 + topic_len
    if props_at + 2 > size:
        raise CorruptRecord(offset, f"topic length {topic_len} does not fit its {size}-byte record")
    props_len = _I16.unpack_from(raw, props_at)[0]
    if props_len < 0 or props_at + 2 + props_len > size:
        raise CorruptRecord(offset, f"properties length {props_len} does not fit its "
                                    f"{size}-byte record")
    return raw[at + 1:props_at], props_at + 2, props_len


def reput(commitlog: CommitLog, queues: dict[tuple[str, int], ConsumeQueue],
          queue_for: Callable[[str, int], ConsumeQueue], start: int,
          topics: dict[bytes, str]) -> tuple[int, dict[tuple[str, int], int]]:
    """Index every complete record from ``start`` (a record boundary) on; returns where the
    next reput starts and, per queue touched, its new max offset (for the listeners).
    ``topics`` caches decoded topic names across calls.  Raises :class:`CorruptRecord` at the
    first record that cannot be one (the records before it are indexed)."""
    touched: dict[tuple[str, int], int] = {}
    offset = start
    end = commitlog.max_offset
    while offset < end:
        seg = commitlog.segment_at(offset)
        if seg is None:
            break
        rel = offset - seg.start
        wrote = seg.wrote
        if rel + END_MARKER_SIZE > wrote:
            if wrote == seg.size:  # a full segment with no room for a marker: next one
                offset = seg.start + seg.size
                continue
            break
        size, magic = _SIZE_MAGIC.unpack(seg.read(rel, 8))
        if magic == BLANK_MAGIC:
            if wrote < seg.size:
                break  # the filler's bytes have not all arrived
            offset = seg.start + seg.size
            continue
        if magic != MESSAGE_MAGIC:
            raise CorruptRecord(offset, f"magic code {magic:#x} is neither a message's nor a filler's")
        if size < MIN_RECORD_SIZE:
            raise CorruptRecord(offset, f"size {size} is below the smallest record ({MIN_RECORD_SIZE})")
        if rel + size > wrote:
            if rel + size > seg.size:
                raise CorruptRecord(offset, f"size {size} runs past the end of its segment")
            break  # the rest of this record comes with the next batch
        raw = seg.read(rel, size)
        queue_id, _, queue_offset, _, sys_flag = _FIELDS.unpack_from(raw, 12)
        if not indexed(sys_flag):
            offset += size
            continue
        if sys_flag & (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG):
            raise CorruptRecord(offset, "IPv6 host fields, which no store of this cluster writes")
        topic_raw, props_at, props_len = _fields(raw, offset)
        topic = topics.get(topic_raw)
        if topic is None:
            try:
                topic = topics[topic_raw] = topic_raw.decode()
            except UnicodeDecodeError:
                raise CorruptRecord(offset, "its topic is not UTF-8") from None
            if topic in ("", ".", "..") or "/" in topic or "\x00" in topic:
                del topics[topic_raw]
                # The name becomes a directory under consumequeue/: never a path elsewhere.
                raise CorruptRecord(offset, f"topic {topic!r} cannot name a queue directory")
        if queue_id < 0:
            raise CorruptRecord(offset, f"queue id {queue_id} is negative")
        tag = 0
        props = raw[props_at:props_at + props_len]
        if props_len and _TAGS_KEY in props:
            try:
                tag = tag_hash(string_to_properties(props.decode()).get(PROPERTY_TAGS))
            except UnicodeDecodeError:
                raise CorruptRecord(offset, "its properties are not UTF-8") from None
        offset += size
        key = (topic, queue_id)
        cq = queues.get(key) or queue_for(topic, queue_id)
        phys = offset - size
        if queue_offset == cq.max_offset:
            cq.append(phys, size, tag)
        elif queue_offset < cq.max_offset:
            cq.put(queue_offset, phys, size, tag)
        elif cq.max_offset == 0 and not cq.files:
            # A slave that started from the master's min offset: the queue begins mid-way.
            cq.put(queue_offset, phys, size, tag)
            cq.min_offset = queue_offset
        else:
            log.warning("record at %d claims queue offset %d of %s/%d, past its end %d: not indexed",
                        phys, queue_offset, topic, queue_id, cq.max_offset)
            continue
        touched[key] = cq.max_offset
    return offset, touched
