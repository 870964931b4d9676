"""The epoch file: which master epoch wrote which stretch of the commitlog.

An entry ⟨epoch, start offset⟩ says that the master elected under ``epoch`` wrote from
``start offset`` on; the entry ends where the next one starts (the last one ends at the log's
end).  Two stores that hold the same entry wrote the same bytes under it, which is how a slave
finds the last point its log agrees with the master's (:func:`find_consistent_point`) and cuts
the rest (docs/cluster.md, "Replication (HA)").

On disk it is RocketMQ's ``epochFileCheckpoint`` text: the entry count, the CRC32 (masked to
31 bits, 0 = not checked) of the entry lines, then one ``epoch-startOffset`` line per entry.
A write goes to a temporary file, the previous file becomes ``.bak``, and the temporary file
is renamed into place, so a crash leaves at least one whole copy; a file that fails its count
or CRC is replaced by the ``.bak`` copy when reading.

RocketMQ refuses (silently) an entry whose start offset equals the last one's, which loses the
epoch when a master is re-elected before writing anything (its issue #9689); here the start
offset may repeat, the epoch must grow.
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "epochFileCheckpoint"
Entry = tuple[int, int]


class EpochFileError(Exception):
    """The epoch file and its backup are both unreadable."""


def encode(entries: list[Entry]) -> str:
    lines = "".join(f"{e}-{s}\n" for e, s in entries)
    crc = zlib.crc32(lines.encode()) & 0x7FFFFFFF
    return f"{len(entries)}\n{crc}\n{lines}"


def decode(text: str, where: str) -> list[Entry]:
    """Entries of one file's text; ValueError naming ``where`` when count or CRC disagree."""
    head = text.split("\n", 2)
    if len(head) < 2:
        raise ValueError(f"{where}: missing count and CRC lines")
    count, crc = int(head[0]), int(head[1])
    body = head[2] if len(head) > 2 else ""
    entries: list[Entry] = []
    lines = ""
    for line in body.splitlines():
        lines += line + "\n"
        epoch, sep, start = line.partition("-")
        if sep:
            entries.append((int(epoch), int(start)))
    if len(entries) != count:
        raise ValueError(f"{where}: {len(entries)} entries, header says {count}")
    if crc and zlib.crc32(lines.encode()) & 0x7FFFFFFF != crc:
        raise ValueError(f"{where}: CRC mismatch")
    return entries


class EpochFile:
    """The entries, in memory and persisted on every change (changes are rare: elections)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bak = path.with_name(path.name + ".bak")
        self.entries: list[Entry] = self._load()

    def _load(self) -> list[Entry]:
        errors = []
        for p in (self.path, self.bak):
            try:
                return decode(p.read_text(encoding="utf-8"), str(p))
            except FileNotFoundError:
                continue
            except ValueError as exc:
                errors.append(str(exc))
                log.warning("epoch file unreadable, trying the backup: %s", exc)
        if errors:
            raise EpochFileError("; ".join(errors))
        return []

    def _save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(encode(self.entries))
            f.flush()
            os.fsync(f.fileno())
        if self.path.exists():
            os.replace(self.path, self.bak)
        os.replace(tmp, self.path)

    @property
    def last_epoch(self) -> int:
        """The newest epoch, 0 when none was ever recorded (RocketMQ: never elected)."""
        return self.entries[-1][0] if self.entries else 0

    def append(self, epoch: int, start: int) -> None:
        """Record that ``epoch`` writes from ``start``; ValueError unless the epoch grows and
        the start does not go back."""
        if self.entries:
            last_epoch, last_start = self.entries[-1]
            if epoch <= last_epoch or start < last_start:
                raise ValueError(f"epoch entry {epoch}-{start} does not follow {last_epoch}-{last_start}")
        self.entries.append((epoch, start))
        self._save()

    def truncate_from(self, offset: int) -> None:
        """Drop entries starting at or past ``offset`` (the log was cut there)."""
        keep = [e for e in self.entries if e[1] < offset]
        if len(keep) != len(self.entries):
            self.entries = keep
            self._save()

    def entry_at(self, offset: int) -> tuple[int, int, int | None]:
        """(epoch, start, end or None for the last) of the entry holding ``offset``; epoch 0
        (none) up to the first entry's start."""
        found: tuple[int, int, int | None] = (0, 0, self.entries[0][1] if self.entries else None)
        for i, (epoch, start) in enumerate(self.entries):
            if start > offset:
                break
            nxt = self.entries[i + 1][1] if i + 1 < len(self.entries) else None
            found = (epoch, start, nxt)
        return found

    def find_consistent_point(self, other: list[Entry], local_end: int, remote_end: int) -> int:
        """Where this log and ``other``'s last agree (RocketMQ ``EpochFileCache.findConsistentPoint``):
        walking this file's entries newest first, the first epoch ``other`` holds with the
        same start offset gives min(its end here, its end there); -1 when none matches.  Each
        side's last entry ends at that side's log end."""
        return find_consistent_point(self.entries, local_end, other, remote_end)


def _ends(entries: list[Entry], end: int) -> dict[int, tuple[int, int]]:
    out = {}
    for i, (epoch, start) in enumerate(entries):
        out[epoch] = (start, entries[i + 1][1] if i + 1 < len(entries) else end)
    return out


def find_consistent_point(local: list[Entry], local_end: int, remote: list[Entry], remote_end: int) -> int:
    theirs = _ends(remote, remote_end)
    mine = _ends(local, local_end)
    for epoch, _ in reversed(local):
        start, end = mine[epoch]
        other = theirs.get(epoch)
        if other is not None and other[0] == start:
            return min(end, other[1])
    return -1
