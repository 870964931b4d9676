"""The disk guard: puts are refused while the data directory's disk is fuller than
``disk_max_used_ratio`` (RocketMQ's ``diskMaxUsedSpaceRatio``), so a full disk shows up as a
SERVICE_NOT_AVAILABLE answer, never as a failed write in the middle of a record.

Probing the disk is a system call, so it is done at most every :data:`DISK_PROBE_INTERVAL`; a
put in between reuses the last answer (the put path reads :attr:`DiskGuard.checked_at` and
:attr:`DiskGuard.refusal` directly, without a method call).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

#: Seconds between disk-usage probes; a put in between reuses the last answer.
DISK_PROBE_INTERVAL = 1.0

DiskUsage = Callable[[str], tuple[int, int, int]]  # (total, used, free), as shutil.disk_usage


class DiskGuard:
    """The last probe's answer: ``refusal`` is why puts are refused, '' while they are not."""

    def __init__(self, root: Path, max_used_ratio: float, disk_usage: DiskUsage) -> None:
        self.root = root
        self.max_used_ratio = max_used_ratio
        self._disk_usage = disk_usage
        #: ``time.monotonic()`` of the last probe.
        self.checked_at = -1e18
        self.refusal = ""

    def probe(self) -> str:
        """Probe the disk unless the last probe is recent; returns the refusal reason or ''."""
        now = time.monotonic()
        if now - self.checked_at >= DISK_PROBE_INTERVAL:
            self.checked_at = now
            try:
                total, used, _free = self._disk_usage(str(self.root))
                ratio = used / total if total else 1.0
            except OSError as exc:
                self.refusal = f"cannot read disk usage: {exc}"
            else:
                limit = self.max_used_ratio
                self.refusal = (
                    f"disk {ratio:.1%} full, above disk_max_used_ratio {limit:.0%}; writes refused"
                    if ratio > limit else "")
        return self.refusal

    def probe_now(self) -> str:
        """Probe the disk whatever the time since the last probe."""
        self.checked_at = -1e18
        return self.probe()
