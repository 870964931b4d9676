"""Deleting what the store no longer keeps — commitlog segments past ``file_reserved_time``
with the consume-queue files that index only them, and the queue directories of a deleted
topic — with the file system work off the event loop.

Unlinking a segment frees its extents (1 GiB by default) and removing a topic's queue
directory touches every file in it; either can take long enough to stall every connection the
loop serves.  So the in-memory bookkeeping changes first, on the loop — the files leave the
commitlog's and the queues' lists, after which no get can reach them — and only then are the
files closed and deleted in the executor (:func:`destroy_files`, :func:`remove_tree`).

A deleted topic's queue directory is first renamed, on the loop, into :data:`TRASH_DIR` beside
``consumequeue/`` (one metadata call): the queue loader never looks there, a put that recreates
the topic meanwhile starts from an empty directory, and :func:`empty_trash` at the next open
removes whatever a crash left behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

from txbroker.store.commitlog import CommitLog
from txbroker.store.segment import MappedSegment

log = logging.getLogger(__name__)

#: Seconds between two retention passes at most (``file_reserved_time`` when shorter).
RETENTION_INTERVAL = 60.0
#: Where deleted topics' queue directories wait for removal, inside the data directory.
TRASH_DIR = "consumequeue-deleted"


def take_expired(commitlog: CommitLog, limit: float) -> list[MappedSegment]:
    """Remove from the log, oldest first, the closed segments last written at or before
    ``limit`` (a wall-clock time); the active segment always stays.  The files are untouched:
    the caller destroys them off the loop."""
    expired: list[MappedSegment] = []
    segments = commitlog.segments
    while len(segments) > 1:
        try:
            mtime = segments[0].path.stat().st_mtime
        except OSError:
            mtime = 0.0
        if mtime > limit:
            break
        expired.append(segments.pop(0))
    return expired


def destroy_files(files: list[MappedSegment]) -> None:
    """Blocking, in the executor: unmap, close and unlink files no list refers to any more."""
    for f in files:
        f.destroy()


def move_to_trash(directory: Path, root: Path) -> Path | None:
    """Rename ``directory`` into ``root``'s trash under a fresh name; None when it is absent."""
    trash = root / TRASH_DIR
    target = trash / f"{directory.name}.{uuid.uuid4().hex}"
    try:
        os.rename(directory, target)
    except FileNotFoundError:
        if not directory.exists():
            return None
        trash.mkdir(exist_ok=True)  # the first deletion since the last open
        os.rename(directory, target)
    return target


def remove_tree(path: Path) -> None:
    """Blocking, in the executor: remove a trashed directory and everything in it."""
    shutil.rmtree(path, ignore_errors=True)


def empty_trash(root: Path) -> None:
    """At open: remove queue directories whose deletion a stop or crash interrupted."""
    trash = root / TRASH_DIR
    if trash.exists():
        log.info("removing the queue files of topics deleted before the last stop")
        shutil.rmtree(trash, ignore_errors=True)
