"""Consumer offsets: (group, topic, queue id) -> next offset to consume.

Kept in memory and persisted as one JSON file, atomically: write a temp file, fsync it, rename
it over the old one, fsync the directory.  A crash at any point leaves either the old or the new
file whole, never a torn one — so a consumer's committed position never moves back past what
was last persisted.

The table itself is written through the commitlog (:mod:`txbroker.store.offset_log`): this
file is its checkpoint, and ``log`` in it is the queue offset of the first offset record it
does not cover (recovery applies the records from there).

Offsets committed by Kafka clients also keep their commit metadata string and commit time
(``kafka`` in the file): OffsetFetch returns the string, and the time decides when the offset
of a group without members expires.  Any other write of the offset drops them.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

OffsetKey = tuple[str, str, int]
#: A Kafka commit's metadata string and commit time (ms).
KafkaCommit = tuple[str, int]


class ConsumerOffsetStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets: dict[OffsetKey, int] = {}
        self._kafka: dict[OffsetKey, KafkaCommit] = {}
        self._dirty = False
        #: The queue offset of the first offset-log record not applied yet (see
        #: :mod:`txbroker.store.offset_log`); persisted with the table it describes.
        self.log_applied = 0
        #: When the last snapshot of the table went into the offset log (ms; 0: none known).
        self.snapshot_ms = 0
        if path.exists():
            self._load(path.read_bytes())

    def _load(self, raw: bytes) -> None:
        """Read the persisted file.  It is only ever replaced whole, so damage means someone
        else wrote it: refuse to start with a clear error instead of silently resetting every
        consumer's position."""
        try:
            doc = orjson.loads(raw)
            applied = doc.get("log", 0)
            if not isinstance(applied, int) or applied < 0:
                raise ValueError(f"log position {applied!r} is not an int >= 0")
            self.log_applied = applied
            self.snapshot_ms = int(doc.get("snap", 0))
            for group, topics in doc.get("offsets", {}).items():
                for topic, queues in topics.items():
                    for qid, offset in queues.items():
                        if not isinstance(offset, int) or offset < 0:
                            raise ValueError(f"offset {offset!r} of {group}/{topic}/{qid} is not an int >= 0")
                        self._offsets[(str(group), str(topic), int(qid))] = offset
            for group, topics in doc.get("kafka", {}).items():
                for topic, queues in topics.items():
                    for qid, (metadata, commit_ms) in queues.items():
                        key = (str(group), str(topic), int(qid))
                        if key in self._offsets:
                            self._kafka[key] = (str(metadata), int(commit_ms))
        except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError) as exc:
            raise ValueError(f"consumer offsets file {self.path} is damaged ({exc}); "
                             "repair or remove it to start") from None

    def rows(self) -> list[tuple[str, str, int, int, KafkaCommit | None]]:
        """Every offset with its Kafka commit (the offset log's snapshot)."""
        return [(g, t, q, o, self._kafka.get((g, t, q))) for (g, t, q), o in self._offsets.items()]

    def applied(self, queue_offset: int) -> None:
        """The offset-log record at ``queue_offset`` is applied."""
        self.log_applied = queue_offset + 1
        self._dirty = True

    def rewind(self, queue_offset: int) -> None:
        """The offset log now ends at ``queue_offset`` (a slave's log was cut): the records
        written there later are new ones to apply."""
        if self.log_applied > queue_offset:
            self.log_applied = queue_offset
            self._dirty = True

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get((group, topic, queue_id))

    def set(self, group: str, topic: str, queue_id: int, offset: int, *,
            kafka: KafkaCommit | None = None) -> None:
        """``kafka``: (metadata, commit time ms) of a Kafka OffsetCommit; None drops them."""
        if offset < 0:
            raise ValueError("consumer offset must be >= 0")
        key = (group, topic, queue_id)
        if self._offsets.get(key) != offset:
            self._offsets[key] = offset
            self._dirty = True
        if kafka is not None:
            if self._kafka.get(key) != kafka:
                self._kafka[key] = kafka
                self._dirty = True
        elif self._kafka.pop(key, None) is not None:
            self._dirty = True

    def kafka_commit(self, group: str, topic: str, queue_id: int) -> KafkaCommit | None:
        return self._kafka.get((group, topic, queue_id))

    def kafka_commits(self) -> dict[OffsetKey, KafkaCommit]:
        """Every offset's Kafka commit metadata and time (a copy: the master's sync answer)."""
        return dict(self._kafka)

    def kafka_groups(self) -> set[str]:
        """Groups with at least one offset committed through Kafka."""
        return {group for group, _, _ in self._kafka}

    def group_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """``group``'s offsets: (topic, queue id) -> offset."""
        return {(t, q): o for (g, t, q), o in self._offsets.items() if g == group}

    def forget(self, group: str, topic: str, queue_id: int) -> None:
        key = (group, topic, queue_id)
        if self._offsets.pop(key, None) is not None:
            self._dirty = True
        self._kafka.pop(key, None)

    def forget_group(self, group: str) -> int:
        """Drop every offset of ``group`` (the group was deleted); returns how many."""
        keys = [k for k in self._offsets if k[0] == group]
        for key in keys:
            self.forget(*key)
        return len(keys)

    def forget_topic(self, topic: str) -> int:
        """Drop every group's offsets in ``topic`` (the topic was deleted); returns how many."""
        keys = [k for k in self._offsets if k[1] == topic]
        for key in keys:
            del self._offsets[key]
            self._kafka.pop(key, None)
        self._dirty = self._dirty or bool(keys)
        return len(keys)

    def groups(self) -> dict[str, dict[str, dict[int, int]]]:
        out: dict[str, dict[str, dict[int, int]]] = {}
        for (group, topic, qid), offset in self._offsets.items():
            out.setdefault(group, {}).setdefault(topic, {})[qid] = offset
        return out

    def snapshot(self) -> bytes | None:
        """The file content to persist, or None when nothing changed since the last one."""
        if not self._dirty:
            return None
        self._dirty = False
        doc: dict = {"log": self.log_applied, "snap": self.snapshot_ms, "offsets": {g: {t: {str(q): o for q, o in qs.items()} for t, qs in ts.items()}
                           for g, ts in self.groups().items()}}
        if self._kafka:
            kafka: dict[str, dict[str, dict[str, list]]] = {}
            for (g, t, q), (metadata, commit_ms) in self._kafka.items():
                kafka.setdefault(g, {}).setdefault(t, {})[str(q)] = [metadata, commit_ms]
            doc["kafka"] = kafka
        return orjson.dumps(doc)

    def write(self, data: bytes) -> None:
        """Persist ``data`` atomically (blocking; runs in an executor on the hot path)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def persist(self) -> bool:
        data = self.snapshot()
        if data is None:
            return False
        self.write(data)
        return True
