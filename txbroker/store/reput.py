"""Indexing replicated bytes: a slave's consume queues are built from the records its
commitlog holds, not from puts (RocketMQ's ``ReputMessageService``).

Replicated bytes arrive in batches that may end mid-record, so :func:`reput` walks from the
end of the last record it indexed and stops at the first record that is not complete yet; the
next batch resumes there.  Each record goes into its queue at the queue offset the record
itself states (the master's), as recovery's ``repair_queues`` does, so a slave's queue answers
a pull at an offset exactly as the master's does.  Only the header fields indexing needs are
read: a full decode per record would cap a catch-up well below the disk's speed.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable

from txbroker.store.commitlog import END_MARKER_SIZE, CommitLog
from txbroker.store.consumequeue import ConsumeQueue, indexed
from txbroker.store.record import (
    BLANK_MAGIC,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    PROPERTY_TAGS,
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


def reput(commitlog: CommitLog, queues: dict[tuple[str, int], ConsumeQueue],
          queue_for: Callable[[str, int], ConsumeQueue], start: int,
          topics: dict[bytes, str]) -> tuple[int, dict[tuple[str, int], int]]:
    """Index every complete record from ``start`` (a record boundary) on; returns where the
    next reput starts and, per queue touched, its new max offset (for the listeners).
    ``topics`` caches decoded topic names across calls."""
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
        if magic != MESSAGE_MAGIC or size < MIN_RECORD_SIZE:
            log.error("replicated commitlog holds no record at offset %d: indexing stops there", offset)
            break
        if rel + size > wrote:
            break  # the rest of this record comes with the next batch
        raw = seg.read(rel, size)
        queue_id, _, queue_offset, _, sys_flag = _FIELDS.unpack_from(raw, 12)
        offset += size
        if not indexed(sys_flag):
            continue
        body_len = _I32.unpack_from(raw, 84)[0]
        at = 88 + body_len
        topic_len = raw[at]
        topic_raw = raw[at + 1:at + 1 + topic_len]
        topic = topics.get(topic_raw)
        if topic is None:
            topic = topics[topic_raw] = topic_raw.decode()
        at += 1 + topic_len
        props_len = _I16.unpack_from(raw, at)[0]
        tag = 0
        if props_len and _TAGS_KEY in raw[at + 2:at + 2 + props_len]:
            tag = tag_hash(string_to_properties(raw[at + 2:at + 2 + props_len].decode()).get(PROPERTY_TAGS))
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
