"""Clean-shutdown marker and recovery checkpoint.

The ``abort`` file exists while the store is open; finding it at start-up means the last run
did not close cleanly and the tail must be validated.  The checkpoint records a commitlog
offset below which every record was flushed *and* indexed in its consume queue, so recovery
walks only from there.  It is replaced atomically (temp file + rename) and written only after
the flush it describes completed, so it can lag reality (more to re-walk) but never lead it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import orjson


@dataclass
class Checkpoint:
    #: Every record before this offset is on disk and indexed.
    commitlog_safe: int = 0
    #: Where the log ended at a clean close (meaningful only without the abort marker).
    commitlog_end: int = 0


class CheckpointFile:
    def __init__(self, directory: Path) -> None:
        self.path = directory / "checkpoint"
        self.abort_path = directory / "abort"

    def load(self) -> Checkpoint:
        try:
            doc = orjson.loads(self.path.read_bytes())
            return Checkpoint(int(doc.get("commitlog_safe", 0)), int(doc.get("commitlog_end", 0)))
        except (OSError, orjson.JSONDecodeError, ValueError, TypeError, AttributeError):
            return Checkpoint()

    def save(self, cp: Checkpoint) -> None:
        tmp = self.path.with_name("checkpoint.tmp")
        tmp.write_bytes(orjson.dumps({"commitlog_safe": cp.commitlog_safe, "commitlog_end": cp.commitlog_end}))
        os.replace(tmp, self.path)

    def was_clean(self) -> bool:
        return not self.abort_path.exists() and self.path.exists()

    def mark_open(self) -> None:
        self.abort_path.write_bytes(b"")

    def mark_clean(self) -> None:
        self.abort_path.unlink(missing_ok=True)
