"""Consume queues: the per-(topic, queue id) index into the commitlog.

Each entry is 20 bytes — commitlog offset (int64), record size (int32), tag hash (int64) — so
the queue offset a consumer sees is simply the entry index, and an entry is found by
arithmetic.  Entries live in their own mapped segment files of ``entries_per_file`` entries,
named by the byte offset of their first entry, like RocketMQ's.  An entry with size 0 is
"not written": that is how a restart finds the end of a queue without any other metadata.

Dispatch rule (RocketMQ): a record whose transaction bits are PREPARED or ROLLBACK is stored but
not indexed (:func:`indexed`).  txbroker stores half messages in the half topic with those bits
cleared, so halves *are* indexed there — in the half topic, invisible to consumers.

A queue's next file is created by the put that needs it (:meth:`ConsumeQueue.ensure_room`), on
the loop, not preallocated ahead in the executor as the next commitlog segment is
(:mod:`txbroker.store.allocate`).  The two differ in size by more than two orders of magnitude: a queue file
holds ``consume_queue_entries`` × 20 bytes (6 MB at the default), which ``posix_fallocate``
reserves in ~0.04 ms on this machine's ext4 (0.03-0.09 ms over ten runs), once per 300,000
puts to that queue.  A spare kept ahead would instead hold one more file per active queue, and
would make the outcome of a put at a file boundary on a full disk depend on whether a
background allocation happened to finish before the disk filled: the store's guarantee that a
put whose index file cannot be created is refused before its record is written
(tests/store/test_message_store.py, ``test_full_disk_for_a_new_queue_file_...``) holds
because the creation is part of the put.
"""

from __future__ import annotations

import struct
from pathlib import Path

from txbroker.store.record import (
    TRANSACTION_MASK,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from txbroker.store.segment import MappedSegment

ENTRY = struct.Struct(">qiq")
ENTRY_SIZE = ENTRY.size  # 20
_pack_entry = ENTRY.pack
#: Transaction types (``sys_flag & TRANSACTION_MASK``) whose records no queue indexes.
NOT_INDEXED = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)


def indexed(sys_flag: int) -> bool:
    """Whether a record with this sys flag gets a consume-queue entry (the dispatch rule)."""
    return (sys_flag & TRANSACTION_MASK) not in NOT_INDEXED


class ConsumeQueue:
    """One queue's index; single-threaded (the event loop), like the commitlog."""

    def __init__(self, directory: Path, topic: str, queue_id: int, entries_per_file: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.dir = directory
        self.file_size = entries_per_file * ENTRY_SIZE
        self.entries_per_file = entries_per_file
        self.dir.mkdir(parents=True, exist_ok=True)
        self.files: list[MappedSegment] = [
            MappedSegment(p, int(p.name), self.file_size, create=False)
            for p in sorted(p for p in self.dir.iterdir() if p.name.isdigit())
        ]
        #: Entries before this index were deleted with their commitlog segments.
        self.min_offset = self.files[0].start // ENTRY_SIZE if self.files else 0
        self.max_offset = self._find_end()
        #: The file appends go to, cached: the hot path must not search the file list.
        self._tail: MappedSegment | None = self.files[-1] if self.files else None
        self._tail_first = self._tail.start // ENTRY_SIZE if self._tail else 0

    def _find_end(self) -> int:
        """Binary search for the first unwritten entry in the last file."""
        if not self.files:
            return 0
        last = self.files[-1]
        lo, hi = 0, self.entries_per_file
        while lo < hi:
            mid = (lo + hi) // 2
            _, size, _ = ENTRY.unpack(last.read(mid * ENTRY_SIZE, ENTRY_SIZE))
            if size > 0:
                lo = mid + 1
            else:
                hi = mid
        for f in self.files:
            f.wrote = f.size
        last.wrote = lo * ENTRY_SIZE
        return last.start // ENTRY_SIZE + lo

    def _file_for(self, index: int, *, create: bool) -> MappedSegment | None:
        start = (index // self.entries_per_file) * self.file_size
        if self.files and self.files[-1].start == start:
            return self.files[-1]
        for f in self.files:
            if f.start == start:
                return f
        if not create:
            return None
        f = MappedSegment(self.dir / MappedSegment.file_name(start), start, self.file_size, create=True)
        self.files.append(f)
        self.files.sort(key=lambda s: s.start)
        return f

    def append(self, phys: int, size: int, tag_hash: int) -> int:
        """Index a record; returns its queue offset (the put hot path: the tail file is cached)."""
        index = self.max_offset
        f = self._tail
        rel = (index - self._tail_first) * ENTRY_SIZE
        if f is not None and 0 <= rel < self.file_size:
            f.write_at(rel, _pack_entry(phys, size, tag_hash))
            f.wrote = rel + ENTRY_SIZE
            self.max_offset = index + 1
        else:
            self.put(index, phys, size, tag_hash)
        return index

    def ensure_room(self) -> None:
        """Make sure the next append has a file to go to, creating it now if needed.  The
        store calls this *before* appending the record to the commitlog, so a disk that cannot
        hold a new index file (OSError) refuses the put instead of leaving a record unindexed."""
        f = self._tail
        if f is not None and 0 <= self.max_offset - self._tail_first < self.entries_per_file:
            return
        f = self._file_for(self.max_offset, create=True)
        assert f is not None
        if f is self.files[-1]:
            self._tail, self._tail_first = f, f.start // ENTRY_SIZE

    def put(self, index: int, phys: int, size: int, tag_hash: int) -> None:
        """Write the entry at ``index`` (recovery repairs entries at their recorded offset)."""
        f = self._tail
        rel = (index - self._tail_first) * ENTRY_SIZE
        if f is None or not 0 <= rel < self.file_size:
            f = self._file_for(index, create=True)
            assert f is not None
            rel = (index % self.entries_per_file) * ENTRY_SIZE
            if f is self.files[-1]:
                self._tail, self._tail_first = f, f.start // ENTRY_SIZE
        f.write_at(rel, ENTRY.pack(phys, size, tag_hash))
        f.wrote = max(f.wrote, rel + ENTRY_SIZE)
        if index >= self.max_offset:
            self.max_offset = index + 1

    def get(self, index: int) -> tuple[int, int, int] | None:
        """(commitlog offset, size, tag hash) at ``index``, or None outside the queue."""
        if index < self.min_offset or index >= self.max_offset:
            return None
        f = self._file_for(index, create=False)
        if f is None:
            return None
        return ENTRY.unpack(f.read((index % self.entries_per_file) * ENTRY_SIZE, ENTRY_SIZE))

    def entries(self, index: int, count: int) -> list[tuple[int, int, int]]:
        """Up to ``count`` consecutive entries from ``index``, read as one slice of one file
        (fewer at the queue's end or the file's); empty outside the queue.  A pull walks
        entries in order, so this replaces ``count`` calls of :meth:`get` by one."""
        if index < self.min_offset or index >= self.max_offset or count <= 0:
            return []
        f = self._file_for(index, create=False)
        if f is None:
            return []
        slot = index % self.entries_per_file
        n = min(count, self.max_offset - index, self.entries_per_file - slot)
        return list(ENTRY.iter_unpack(f.read(slot * ENTRY_SIZE, n * ENTRY_SIZE)))

    def truncate(self, new_max: int) -> int:
        """Drop entries at or past ``new_max`` (they point past the valid commitlog)."""
        dropped = 0
        while self.max_offset > max(new_max, self.min_offset):
            index = self.max_offset - 1
            f = self._file_for(index, create=False)
            if f is not None:
                f.write_at((index % self.entries_per_file) * ENTRY_SIZE, bytes(ENTRY_SIZE))
            self.max_offset = index
            dropped += 1
        for f in [f for f in self.files if f.start // ENTRY_SIZE > self.max_offset and f is not self.files[0]]:
            self.files.remove(f)
            f.destroy()
        self._tail = self.files[-1] if self.files else None
        self._tail_first = self._tail.start // ENTRY_SIZE if self._tail else 0
        return dropped

    def delete_below(self, min_phys: int) -> list[MappedSegment]:
        """Retention: forget entries whose records lie before ``min_phys``.  Returns the files
        that no longer hold a live entry, already out of :attr:`files`; the caller destroys them
        (off the loop: nothing here can reach them any more)."""
        removed: list[MappedSegment] = []
        while self.min_offset < self.max_offset:
            entry = self.get(self.min_offset)
            if entry is None or entry[0] >= min_phys:
                break
            # Skip whole files at once when their last entry is also gone.
            f = self._file_for(self.min_offset, create=False)
            assert f is not None
            last_index = f.start // ENTRY_SIZE + self.entries_per_file - 1
            last = self.get(min(last_index, self.max_offset - 1))
            if last is not None and last[0] < min_phys and last_index < self.max_offset - 1:
                self.min_offset = last_index + 1
                self.files.remove(f)
                removed.append(f)
                if f is self._tail:
                    self._tail = None
            else:
                self.min_offset += 1
        return removed

    def sync(self) -> None:
        for f in self.files[-2:]:
            f.sync()

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files.clear()
