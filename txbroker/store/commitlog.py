"""The commitlog: every record ever stored, in order, across fixed-size segment files.

Segment files are named by the absolute offset of their first byte (20 digits, zero-padded),
as in RocketMQ, so a physical offset maps to a file by integer division.  A record never spans
two segments: when a record (plus the 8 bytes an end marker needs) does not fit, the rest of
the segment is filled with a blank record (TOTALSIZE = remaining, MAGIC = BLANK_MAGIC) and the
record goes to the next segment.  Readers and recovery skip blanks.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from txbroker.store.allocate import SegmentAllocator
from txbroker.store.record import (
    BLANK_MAGIC,
    BORNHOST_V6_FLAG,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    STOREHOST_V6_FLAG,
    RecordError,
    StoredMessage,
    body_crc,
    decode_record,
)
from txbroker.store.segment import MappedSegment

log = logging.getLogger(__name__)

_SIZE_MAGIC = struct.Struct(">iI")
_CRC = struct.Struct(">i")
_I32 = _CRC
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_V6_FLAGS = BORNHOST_V6_FLAG | STOREHOST_V6_FLAG
#: A blank record needs TOTALSIZE + MAGIC.
END_MARKER_SIZE = 8


class SegmentSizeError(ValueError):
    """The commitlog's files were made with another segment size than the configured one.

    Offsets map to files by division, so a data dir keeps the segment size it was created with:
    opening 64 MiB files as 1 GiB ones would grow them in place and misplace every later
    record.  The store refuses to open instead, and says which size the files have.
    """

    def __init__(self, directory: Path, found: int, configured: int) -> None:
        super().__init__(f"commitlog {directory} holds segment files of {found} bytes, not the "
                         f"configured segment_size {configured}; a data dir keeps the segment "
                         f"size it was created with")
        self.directory, self.found, self.configured = directory, found, configured


@dataclass
class WalkResult:
    """What a validating walk over the tail found."""

    end: int
    records: int
    bytes_scanned: int


class CommitLog:
    """Ordered segments plus the write position; single-threaded (the event loop)."""

    def __init__(self, directory: Path, segment_size: int, *, sync_flush: bool = False) -> None:
        self.dir = directory
        self.segment_size = segment_size
        #: Sync flush: segments write zeros ahead of their data (see :mod:`txbroker.store.segment`).
        self.sync_flush = sync_flush
        self.dir.mkdir(parents=True, exist_ok=True)
        #: Makes the next segment's file ahead of need, once the store starts.
        self.allocator = SegmentAllocator(self.dir, segment_size)
        self.segments: list[MappedSegment] = []
        paths = sorted(p for p in self.dir.iterdir() if p.name.isdigit() and len(p.name) == 20)
        for path in paths:
            # An empty file is a segment whose creation was cut before its allocation: it is
            # allocated at the configured size like a new one.  Any other size must match.
            found = path.stat().st_size
            if found and found != segment_size:
                raise SegmentSizeError(self.dir, found, segment_size)
        for path in paths:
            self.segments.append(MappedSegment(path, int(path.name), segment_size, create=False,
                                               zero_ahead=sync_flush))
        for seg in self.segments:
            # Until recovery says otherwise, closed segments are full; the last is refined.
            seg.wrote = seg.flushed = seg.size

    # --- positions --------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.segments[0].start if self.segments else 0

    @property
    def max_offset(self) -> int:
        """One past the last byte written."""
        return self.segments[-1].end if self.segments else 0

    def set_end(self, end: int) -> int:
        """Recovery: everything at or past ``end`` is not data — zeroed, and segments that start
        past it deleted.  Returns how many bytes of data were cut."""
        cut = 0
        while self.segments and self.segments[-1].start > end:
            seg = self.segments.pop()
            cut += seg.zero_from(0)
            seg.destroy()
        if not self.segments:
            return cut
        last = self.segments[-1]
        rel = end - last.start
        if rel >= last.size:
            last.wrote = last.flushed = last.size
            return cut
        cut += last.zero_from(rel)
        last.wrote = rel
        return cut

    def trust_end(self, end: int) -> None:
        """Clean restart: the log ended at ``end``; nothing past it is read, nothing rescanned."""
        last = self.segments[-1]
        last.wrote = last.flushed = min(max(end - last.start, 0), last.size)

    # --- writing ----------------------------------------------------------------------------
    def reserve(self, size: int) -> int:
        """The offset where a record of ``size`` bytes will go, rolling to a new segment first
        when it does not fit (with a blank record filling the rest).  May raise OSError when a
        new segment cannot be preallocated; nothing is written in that case."""
        if size + END_MARKER_SIZE > self.segment_size:
            raise ValueError(f"record of {size} bytes cannot fit in a segment")
        seg = self.segments[-1] if self.segments else None
        if seg is None:
            seg = self._new_segment(0)
        elif size + END_MARKER_SIZE > seg.remaining:
            nxt = self._new_segment(seg.start + seg.size)  # may raise: nothing written yet
            if seg.remaining >= END_MARKER_SIZE:
                seg.append(_SIZE_MAGIC.pack(seg.remaining, BLANK_MAGIC))
            seg.wrote = seg.size
            seg = nxt
        return seg.end

    def write(self, offset: int, data: bytes) -> None:
        seg = self.segments[-1]
        if offset != seg.end:
            raise ValueError(f"write at {offset} but the log ends at {seg.end}")
        seg.append(data)

    def append_replicated(self, offset: int, data: bytes | memoryview) -> None:
        """A slave: place a master's raw bytes at ``offset``, which must be where this log ends
        (or, for an empty log, the start of a segment: the master's segment starts are ours).
        The bytes may end mid-record and may cross into the next segment, which is created at
        the master's boundary."""
        if self.segments and offset != self.max_offset:
            raise ValueError(f"replicated bytes at {offset} but the log ends at {self.max_offset}")
        if not self.segments and offset % self.segment_size:
            raise ValueError(f"replication into an empty log must start at a segment start, not {offset}")
        view = memoryview(data)
        pos = 0
        while pos < len(view):
            seg = self.segments[-1] if self.segments else None
            if seg is None or seg.wrote == seg.size:
                seg = self._new_segment(offset if seg is None else seg.start + seg.size)
            n = min(seg.size - seg.wrote, len(view) - pos)
            seg.append(view[pos:pos + n])
            pos += n

    def boundary_at_or_before(self, offset: int) -> int:
        """The end of the last whole record at or before ``offset`` (segment starts are record
        boundaries, so this walks at most one segment's record headers)."""
        seg = self._segment_for(offset) or (self.segments[-1] if self.segments else None)
        if seg is None or offset < seg.start:
            return offset
        rel, limit = 0, min(offset - seg.start, seg.wrote)
        while rel + END_MARKER_SIZE <= limit:
            size, magic = _SIZE_MAGIC.unpack(seg.read(rel, 8))
            if magic == BLANK_MAGIC:
                return seg.start + seg.size if rel + size <= limit else seg.start + rel
            if magic != MESSAGE_MAGIC or size < MIN_RECORD_SIZE or rel + size > limit:
                break
            rel += size
        return seg.start + rel

    def _new_segment(self, start: int) -> MappedSegment:
        """The segment starting at ``start``: the preallocated spare renamed, when one is ready
        (opening it then reserves nothing), else a file allocated here, on the caller's thread."""
        path = self.dir / MappedSegment.file_name(start)
        self.allocator.take(path)
        seg = MappedSegment(path, start, self.segment_size, create=True,
                            zero_ahead=self.sync_flush)
        self.segments.append(seg)
        self.allocator.request()
        return seg

    # --- reading ----------------------------------------------------------------------------
    def segment_at(self, offset: int) -> MappedSegment | None:
        """The segment holding ``offset``, None if none does (a pull reads many records of
        one segment: it looks the segment up once and slices it)."""
        return self._segment_for(offset)

    def _segment_for(self, offset: int) -> MappedSegment | None:
        if not self.segments or offset < self.segments[0].start:
            return None
        idx = (offset - self.segments[0].start) // self.segment_size
        if idx >= len(self.segments):
            return None
        seg = self.segments[idx]
        return seg if seg.start <= offset < seg.start + seg.size else None

    def read_raw(self, offset: int) -> bytes | None:
        """The record at ``offset`` exactly as stored, or None if there is none."""
        seg = self._segment_for(offset)
        if seg is None:
            return None
        rel = offset - seg.start
        if rel + MIN_RECORD_SIZE > seg.wrote:
            return None
        size, magic = _SIZE_MAGIC.unpack(seg.read(rel, 8))
        if magic != MESSAGE_MAGIC or size < MIN_RECORD_SIZE or rel + size > seg.wrote:
            return None
        return seg.read(rel, size)

    def read_at(self, offset: int, size: int) -> bytes | None:
        """``size`` bytes at ``offset`` when they lie within written data (consume-queue reads)."""
        seg = self._segment_for(offset)
        if seg is None:
            return None
        rel = offset - seg.start
        if size <= 0 or rel + size > seg.wrote:
            return None
        return seg.read(rel, size)

    def scan(self, start: int = 0) -> Iterator[StoredMessage]:
        """Every message record from ``start`` (a record boundary) to the end."""
        offset = max(start, self.min_offset)
        while offset < self.max_offset:
            seg = self._segment_for(offset)
            if seg is None:
                return
            rel = offset - seg.start
            if rel + END_MARKER_SIZE > seg.wrote:
                offset = seg.start + seg.size
                continue
            size, magic = _SIZE_MAGIC.unpack(seg.read(rel, 8))
            if magic == BLANK_MAGIC:
                offset = seg.start + seg.size
                continue
            if magic != MESSAGE_MAGIC or size < MIN_RECORD_SIZE or rel + size > seg.wrote:
                return
            try:
                msg = decode_record(seg.read(rel, size))
            except RecordError as exc:
                # Recovery validated the tail, so this is damage below the checkpoint: stop
                # here rather than fail whoever is rebuilding state from the log.
                log.error("commitlog scan stopped at offset %d: %s", offset, exc)
                return
            yield msg
            offset += size

    # --- recovery ---------------------------------------------------------------------------
    def walk_valid(self, start: int) -> WalkResult:
        """Validate records from ``start`` (a known-good boundary) record by record — length
        bounds, magic and body CRC — and return where valid data ends.  Does not modify."""
        if not self.segments:
            return WalkResult(0, 0, 0)
        start = max(start, self.min_offset)
        offset = start
        records = 0
        while True:
            seg = self._segment_for(offset)
            if seg is None:
                break
            view = seg.view()
            try:
                rel = offset - seg.start
                stop = False
                while True:
                    if rel + END_MARKER_SIZE > seg.size:
                        rel = seg.size
                        break
                    size, magic = _SIZE_MAGIC.unpack_from(view, rel)
                    if magic == BLANK_MAGIC and size == seg.size - rel:
                        rel = seg.size
                        break
                    if magic != MESSAGE_MAGIC or size < MIN_RECORD_SIZE or rel + size > seg.size:
                        stop = True
                        break
                    body_len = _CRC.unpack_from(view, rel + 84)[0]
                    if body_len < 0 or 84 + 4 + body_len + 3 > size:
                        stop = True
                        break
                    # The CRC covers only the body; the lengths around it must add up too,
                    # or a later decode of this record would fail.
                    topic_at = rel + 88 + body_len
                    topic_len = view[topic_at]
                    tail = 88 + body_len + 1 + topic_len + 2
                    if tail > size or tail + _I16.unpack_from(view, topic_at + 1 + topic_len)[0] != size:
                        stop = True
                        break
                    try:
                        str(view[topic_at + 1:topic_at + 1 + topic_len], "utf-8")
                        str(view[rel + tail:rel + size], "utf-8")
                    except UnicodeDecodeError:
                        stop = True
                        break
                    if _I32.unpack_from(view, rel + 36)[0] & _V6_FLAGS:
                        stop = True
                        break
                    # A record states its own position: a cheap check of header damage.
                    if _I64.unpack_from(view, rel + 28)[0] != seg.start + rel:
                        stop = True
                        break
                    crc = _CRC.unpack_from(view, rel + 8)[0]
                    if body_crc(view[rel + 88:rel + 88 + body_len]) != crc:
                        stop = True
                        break
                    rel += size
                    records += 1
            finally:
                view.release()
            offset = seg.start + rel
            if stop or rel < seg.size:
                break
            if self._segment_for(offset) is None:
                break
        return WalkResult(offset, records, offset - start)

    def close(self) -> None:
        for seg in self.segments:
            seg.close()
        self.segments.clear()

