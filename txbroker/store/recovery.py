"""Opening a store: loading the consume queues and, after an unclean stop, validating the
commitlog tail and repairing the queues against it.

After a clean stop the checkpoint says where the log ends and nothing is rescanned.  After a
crash the log is walked from the last checkpointed safe offset: the first record that does not
validate ends it (everything past it is zeroed, see :meth:`CommitLog.set_end`), queue entries
pointing past that end are dropped, and records the queues missed are indexed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from txbroker.store.checkpoint import CheckpointFile
from txbroker.store.commitlog import CommitLog
from txbroker.store.consumequeue import ConsumeQueue, indexed
from txbroker.store.record import tag_hash

log = logging.getLogger(__name__)

Queues = dict[tuple[str, int], ConsumeQueue]


@dataclass
class RecoveryReport:
    clean: bool
    start_offset: int = 0
    end_offset: int = 0
    records_scanned: int = 0
    bytes_scanned: int = 0
    bytes_cut: int = 0
    queue_entries_repaired: int = 0
    queue_entries_dropped: int = 0
    seconds: float = 0.0
    #: The directory held no store before this open (nothing to recover, nothing lost).
    new: bool = False

    def describe(self) -> str:
        """One line for the start-up log: a fresh directory is not a failed clean stop."""
        if self.new:
            return "new data directory"
        if self.clean:
            return f"clean restart: commitlog ends at offset {self.end_offset} (opened in {self.seconds:.3f} s)"
        return (f"recovered after a crash: {self.records_scanned} records, {self.bytes_scanned} bytes "
                f"checked, {self.bytes_cut} cut in {self.seconds:.3f} s; log ends at offset {self.end_offset}")


def is_new(root: Path, checkpoint: CheckpointFile) -> bool:
    """No checkpoint, no abort marker, no segment: no store has ever run here."""
    segments = root / "commitlog"
    return not (checkpoint.path.exists() or checkpoint.abort_path.exists()
                or (segments.is_dir() and any(p.name.isdigit() for p in segments.iterdir())))


def load_queues(cq_root: Path, entries_per_file: int) -> Queues:
    """Every queue under ``consumequeue/<topic>/<queue id>/``."""
    queues: Queues = {}
    cq_root.mkdir(parents=True, exist_ok=True)
    for topic_dir in cq_root.iterdir():
        if not topic_dir.is_dir():
            continue
        for qdir in topic_dir.iterdir():
            if qdir.is_dir() and qdir.name.isdigit():
                queues[(topic_dir.name, int(qdir.name))] = ConsumeQueue(
                    qdir, topic_dir.name, int(qdir.name), entries_per_file)
    return queues


def recover(commitlog: CommitLog, queues: Queues, checkpoint: CheckpointFile,
            queue_for: Callable[[str, int], ConsumeQueue]) -> RecoveryReport:
    """Find the end of the log (trusted after a clean stop, validated after a crash), bring
    the queues in line with it; ``queue_for`` makes a queue a repaired record needs."""
    clean = checkpoint.was_clean()
    cp = checkpoint.load()
    report = RecoveryReport(clean=clean)
    if clean and commitlog.segments and cp.commitlog_end >= commitlog.min_offset:
        commitlog.trust_end(cp.commitlog_end)
        report.end_offset = cp.commitlog_end
    else:
        start = max(cp.commitlog_safe, commitlog.min_offset)
        walk = commitlog.walk_valid(start)
        report.start_offset = start
        report.end_offset = walk.end
        report.records_scanned = walk.records
        report.bytes_scanned = walk.bytes_scanned
        report.bytes_cut = commitlog.set_end(walk.end)
        repaired, dropped = repair_queues(commitlog, queues, queue_for, start, walk.end)
        report.queue_entries_repaired, report.queue_entries_dropped = repaired, dropped
        if report.bytes_cut:
            log.warning("commitlog tail after offset %d was torn or corrupt: %d bytes cut",
                        walk.end, report.bytes_cut)
    for cq in queues.values():
        for f in cq.delete_below(commitlog.min_offset):
            f.destroy()
    for seg in commitlog.segments:
        seg.flushed = seg.wrote
    return report


def drop_entries_past(queues: Queues, end: int) -> int:
    """Drop queue entries whose record does not lie wholly before ``end`` (the log was cut
    there); returns how many."""
    dropped = 0
    for cq in queues.values():
        while cq.max_offset > cq.min_offset:
            last = cq.get(cq.max_offset - 1)
            if last is not None and last[0] + last[1] <= end:
                break
            dropped += cq.truncate(cq.max_offset - 1)
    return dropped


def repair_queues(commitlog: CommitLog, queues: Queues, queue_for: Callable[[str, int], ConsumeQueue],
                  start: int, end: int) -> tuple[int, int]:
    """Consume queues after a crash: drop entries past the valid log, index what is missing."""
    dropped = drop_entries_past(queues, end)
    repaired = 0
    for msg in commitlog.scan(start):
        if msg.physical_offset >= end:
            break
        if not indexed(msg.sys_flag):
            continue
        cq = queue_for(msg.topic, msg.queue_id)
        have = cq.get(msg.queue_offset)
        stale = have is None or have[0] != msg.physical_offset
        if not stale:
            continue
        # Records reach a queue in order, so a forward scan only ever rewrites an entry in
        # place or appends the next one.  A queue offset beyond that (a damaged header
        # field the body CRC does not cover) would leave a gap: it is not indexed.
        if cq.min_offset <= msg.queue_offset <= cq.max_offset:
            cq.put(msg.queue_offset, msg.physical_offset, msg.store_size, tag_hash(msg.tags))
            repaired += 1
        elif msg.queue_offset > cq.max_offset:
            log.warning("record at %d claims queue offset %d of %s/%d, past its end %d: not indexed",
                        msg.physical_offset, msg.queue_offset, msg.topic, msg.queue_id, cq.max_offset)
    return repaired, dropped
