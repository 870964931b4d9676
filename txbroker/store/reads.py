"""Reading through a consume queue: a batch of stored records for a pull, and the first
queue offset at or after a time (RocketMQ's ``getMessage`` and ``getOffsetInQueueByTime``).

Both run on the event loop: a read is a slice of a mapped segment, no system call.
"""

from __future__ import annotations

import struct

from txbroker.store.commitlog import CommitLog
from txbroker.store.consumequeue import ConsumeQueue
from txbroker.store.results import GetResult, GetStatus

#: Consume-queue entries a single get may look at when a tag filter skips most of them.
MAX_SCAN_ENTRIES = 800
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
_STORE_TS = struct.Struct(">q")
_STORE_TS_POS = 56  # STORETIMESTAMP within a record (IPv4 hosts)


def read_queue(commitlog: CommitLog | None, cq: ConsumeQueue | None, offset: int, max_count: int,
               max_bytes: int, tag_filter: set[int] | None, visible_limit: int | None = None) -> GetResult:
    """Up to ``max_count`` records (``max_bytes`` in all, at least one) from queue ``offset``
    on whose tag hash is in ``tag_filter`` (None: all), exactly as stored.  A record that does
    not end by ``visible_limit`` (None: no limit) ends the read as if the queue ended there:
    a SYNC_MASTER sets it to what its slaves confirmed, so no consumer sees bytes a failover
    could cut."""
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
    assert commitlog is not None  # a queue exists only once the store is open
    raw: list[bytes] = []
    append = raw.append
    # The segment of the last record read, and the absolute range of its written bytes: the
    # records of one pull nearly always lie in one segment, so it is looked up once.
    seg_read = None
    seg_start = seg_end = 0
    total = 0
    index = offset
    scan_end = min(hi, offset + max(max_count, MAX_SCAN_ENTRIES))
    missing = False
    while index < scan_end:
        # Entries come a slice at a time; without a filter every one is taken, so only as
        # many are read as may still fit.
        want = scan_end - index if tag_filter is not None else max_count - len(raw)
        batch = cq.entries(index, want)
        if not batch:
            break
        for phys, size, thash in batch:
            if visible_limit is not None and phys + size > visible_limit:
                if raw:
                    return GetResult(GetStatus.FOUND, index, lo, hi, raw)
                return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, index, lo, hi)
            if tag_filter is not None and thash not in tag_filter:
                index += 1
                continue
            if raw and total + size > max_bytes:
                return GetResult(GetStatus.FOUND, index, lo, hi, raw)
            index += 1
            if size <= 0 or not seg_start <= phys <= seg_end - size:
                seg = commitlog.segment_at(phys)
                if seg is None or size <= 0 or phys + size > seg.start + seg.wrote:
                    missing = True  # deleted by retention, or not (yet) written there
                    continue
                seg_read, seg_start, seg_end = seg.read, seg.start, seg.start + seg.wrote
            append(seg_read(phys - seg_start, size))
            total += size
            if len(raw) >= max_count:
                return GetResult(GetStatus.FOUND, index, lo, hi, raw)
    if raw:
        status = GetStatus.FOUND
    elif missing:
        status = GetStatus.OFFSET_FOUND_NULL
    else:
        status = GetStatus.NO_MATCHED_MESSAGE
    return GetResult(status, index, lo, hi, raw)


def offset_by_time(commitlog: CommitLog | None, cq: ConsumeQueue | None, timestamp_ms: int) -> int:
    """First queue offset whose store timestamp is >= ``timestamp_ms`` (max offset if none)."""
    if cq is None or cq.max_offset == cq.min_offset:
        return cq.max_offset if cq else 0
    assert commitlog is not None
    lo, hi = cq.min_offset, cq.max_offset
    while lo < hi:
        mid = (lo + hi) // 2
        entry = cq.get(mid)
        data = commitlog.read_at(entry[0] + _STORE_TS_POS, 8) if entry else None
        ts = _STORE_TS.unpack(data)[0] if data else -1
        if ts < timestamp_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo
