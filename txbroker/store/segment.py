"""One preallocated, memory-mapped file: the unit both the commitlog and consume queues use.

Appends are slice assignments into the mapping (on this machine ~4x faster than one
``os.write`` per record, see docs/bench.md, "Machine limits") and reads are slices of it.

Durability comes from ``os.fdatasync`` on the file descriptor, not ``mmap.flush`` (msync).
On Linux a shared mapping dirties the same page-cache pages the descriptor sees, so fdatasync
writes them back.  Both were measured (``python -m txbroker.bench.store``, rows "durable 4 KiB append
via ..." and the 64-writer group-commit rows): per call the two are within the machine's noise
of each other (msync of a page range ~500-2,700/s, fdatasync ~400-900/s single-threaded), and
group commit with 64 writers reaches the same rate with either (16-19k msgs/s).  What decides
it is the event loop: on CPython 3.11 ``mmap.flush`` holds the GIL for the whole msync, so
while a flush runs in the executor the loop thread gets ~45-60% of its idle progress;
fdatasync releases the GIL and the loop keeps all of it (120-135% of the idle baseline on a
quiet machine; 64% vs msync's 54% in a run where other processes took most of the CPU).
Flushes must not stall the loop that serves every connection, so fdatasync it is.

Sync flush fdatasyncs after every batch of puts, so what each fdatasync must write besides the
data decides the flush time.  A preallocated (``posix_fallocate``) range is an *unwritten*
extent: the first write-back of a block in it converts the extent, a metadata write the
fdatasync must also wait for, on every flush.  So a sync-flush segment (``zero_ahead``) writes
zeros ahead of its data, :data:`ZERO_AHEAD` at a time (one ``pwrite`` per MiB of records):
the conversion is then paid once per MiB, by the flush that writes the zeros back, and every
other flush writes only data blocks.  In the broker with 64 halves per flush a flush's p50
went from 0.29-1.38 ms to 0.20-0.28 ms (docs/bench.md, "Machine limits", has the runs).
Content is unchanged (zeros over zeros, past the data).  Appending through the mapping was
measured against ``os.pwrite`` per record for this mode too and kept: a pwrite costs a system
call per record (~3 µs from Python, three per transaction) and gave no shorter flushes.

Task-safety contract: all mutation happens on one thread (the event loop); :meth:`sync` may run
concurrently in an executor because it only asks the kernel to write pages back.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

_ZERO_CHUNK = 1024 * 1024
_ZEROS = bytes(_ZERO_CHUNK)
_ZERO_VIEW = memoryview(_ZEROS)
#: Bytes of zeros a sync-flush segment keeps written ahead of its data.
ZERO_AHEAD = _ZERO_CHUNK


class SegmentFullError(Exception):
    """An append does not fit in what is left of the segment."""


class MappedSegment:
    """A fixed-size file named after the absolute offset of its first byte."""

    def __init__(self, path: Path, start: int, size: int, *, create: bool,
                 zero_ahead: bool = False) -> None:
        self.path = path
        self.start = start
        self.size = size
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self._fd = os.open(path, flags, 0o644)
        try:
            current = os.fstat(self._fd).st_size
            if current < size:
                # Real preallocation: running out of disk shows up here, not as SIGBUS on a
                # page fault in the middle of an append.
                os.posix_fallocate(self._fd, 0, size)
            elif current > size:
                raise ValueError(f"{path} is {current} bytes, expected {size}")
            self._mm = mmap.mmap(self._fd, size, access=mmap.ACCESS_WRITE)
        except BaseException:
            os.close(self._fd)
            if create:
                path.unlink(missing_ok=True)
            raise
        #: Bytes of this segment that hold data (relative to ``start``).
        self.wrote = 0
        #: Bytes known to be on disk (relative to ``start``).
        self.flushed = 0
        #: Zeros are written up to here ahead of the data (sync flush, see the module
        #: docstring); ``size`` when this segment does not write zeros ahead.
        self.zeroed = 0 if zero_ahead else size

    @staticmethod
    def file_name(start: int) -> str:
        return f"{start:020d}"

    @property
    def end(self) -> int:
        """Absolute offset one past the last byte written."""
        return self.start + self.wrote

    @property
    def remaining(self) -> int:
        return self.size - self.wrote

    def append(self, data: bytes) -> int:
        """Write ``data`` at the end; returns its absolute offset."""
        n = len(data)
        if n > self.size - self.wrote:
            raise SegmentFullError(f"{n} bytes do not fit in {self.size - self.wrote}")
        pos = self.wrote
        if pos + n > self.zeroed:
            self._zero_ahead(pos + n)
        self._mm[pos:pos + n] = data
        self.wrote = pos + n
        return self.start + pos

    def _zero_ahead(self, end: int) -> None:
        """Write zeros from where the data ends to :data:`ZERO_AHEAD` past ``end`` (never over
        data: only at or past :attr:`wrote`)."""
        first = max(self.zeroed, self.wrote)
        stop = min(self.size, end + ZERO_AHEAD)
        zeros = _ZERO_VIEW[:stop - first]
        done = 0
        while done < len(zeros):  # a short write (the kernel may stop early) is continued
            done += os.pwrite(self._fd, zeros[done:], first + done)
        self.zeroed = stop

    def write_at(self, rel: int, data: bytes) -> None:
        """Overwrite bytes in place (consume-queue repair during recovery)."""
        self._mm[rel:rel + len(data)] = data

    def read(self, rel: int, n: int) -> bytes:
        return self._mm[rel:rel + n]

    def view(self) -> memoryview:
        """Zero-copy view for recovery scans; release it before closing the segment."""
        return memoryview(self._mm)

    def zero_from(self, rel: int) -> int:
        """Erase everything from ``rel`` on (a torn or corrupt tail).

        Every byte up to the end of the file is cleared, not just up to the first zero run:
        after a power loss pages reach the disk out of order, so stale records can sit past a
        zeroed page and would look valid to a later recovery once new writes reach them.  Only
        the ranges the kernel reports as possibly holding data are read (:meth:`data_ranges`):
        a preallocated segment that is mostly unwritten costs what was written, not its size.
        Chunks that are already zero are only compared, never written, so they are not dirtied.
        Returns how many bytes held data (up to the last non-zero one).
        """
        cut_end = rel
        # The map is taken whole before reading: reading pages in (with read-ahead) makes the
        # kernel count them as data, and a lazy walk would chase its own reads to the end.
        for first, end in list(self.data_ranges(rel)):
            pos = first
            while pos < end:
                n = min(_ZERO_CHUNK, end - pos)
                chunk = self._mm[pos:pos + n]
                if chunk != _ZEROS[:n]:
                    cut_end = pos + len(chunk.rstrip(b"\x00"))
                    self._mm[pos:pos + n] = _ZEROS[:n]
                pos += n
        self.wrote = min(self.wrote, rel)
        self.flushed = min(self.flushed, rel)
        return cut_end - rel

    def data_ranges(self, rel: int) -> Iterator[tuple[int, int]]:
        """The ``[start, end)`` ranges at or after ``rel`` that may hold non-zero bytes.

        Asked of the kernel with ``lseek(SEEK_DATA / SEEK_HOLE)``: a hole, and on ext4, XFS and
        tmpfs a preallocated extent nothing was written to, reads as zeros, while a page written
        through the mapping counts as data from the moment it is dirtied, before any write-back.
        The kernel may report zeros as data (a page it read in), never data as a hole, so the
        ranges can only be too wide.  A filesystem without the map reports the whole rest of
        the file as one range, which is still correct, only as slow as a full scan.
        """
        pos = rel
        while pos < self.size:
            try:
                first = os.lseek(self._fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # nothing but holes from ``pos`` to the end
                    return
                if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                    yield pos, self.size
                    return
                raise
            if first >= self.size:
                return
            end = min(os.lseek(self._fd, first, os.SEEK_HOLE), self.size)
            yield first, end
            pos = end

    def sync(self) -> None:
        """Write dirty pages back to disk (blocking; run it in an executor)."""
        os.fdatasync(self._fd)

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()
        try:
            os.close(self._fd)
        except OSError:
            pass

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
