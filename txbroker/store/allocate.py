"""The next commitlog segment, preallocated ahead of need and off the event loop.

``posix_fallocate`` of a whole segment (1 GiB by default) costs milliseconds on ext4 or XFS,
which only reserve extents, but seconds where the space is zero-filled (tmpfs, or glibc's
emulation on a filesystem without fallocate).  Run inside the put that rolls the log, it would
stall every connection the loop serves.  So, as RocketMQ's ``AllocateMappedFileService`` does,
one spare file is kept ready in the default executor, under a name recovery never reads
(:data:`SPARE_NAME`: hidden, not a 20-digit segment name).  A roll renames it to the new segment's name
— one metadata call — and asks for the next spare.

A spare is not named after its segment while it waits: an empty file with a segment's name
would be read at restart as the last segment, and the one before it as full.

When no spare is ready (the disk cannot keep up, or it is full), the roll creates its segment
itself as it always did, and a full disk is refused by the put with the same reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

#: The spare's file name inside the commitlog directory.
SPARE_NAME = ".next-segment"


class SegmentAllocator:
    """Keeps at most one preallocated spare segment file; used from the event loop only."""

    def __init__(self, directory: Path, size: int) -> None:
        self.path = directory / SPARE_NAME
        self.size = size
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: asyncio.Future[None] | None = None
        self._ready = False
        # A spare left by a crash may be only partly allocated: it is made again.
        self.path.unlink(missing_ok=True)

    @property
    def ready(self) -> bool:
        """A spare is waiting to become the next segment."""
        return self._ready

    async def start(self) -> None:
        """Make the first spare and wait for it, so that even the first roll finds one."""
        self._loop = asyncio.get_running_loop()
        self.request()
        if self._pending is not None:
            await asyncio.wait([self._pending])

    def request(self) -> None:
        """Start making a spare unless one is ready or on its way (no-op before :meth:`start`)."""
        if self._loop is None or self._ready or self._pending is not None:
            return
        self._pending = self._loop.run_in_executor(None, self._make)
        self._pending.add_done_callback(self._made)

    def _make(self) -> None:
        """Blocking, in the executor: create the file and reserve all of its blocks."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, self.size)
        except BaseException:
            self.path.unlink(missing_ok=True)  # a partial reservation would only hold space
            raise
        finally:
            os.close(fd)

    def _made(self, fut: asyncio.Future[None]) -> None:
        self._pending = None
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            log.warning("cannot preallocate the next commitlog segment (%s); "
                        "the next roll-over allocates its own", exc)
        elif self._loop is not None:  # not closed meanwhile (close removes the file)
            self._ready = True

    def take(self, path: Path) -> bool:
        """Rename the ready spare to ``path``; False (nothing done) when there is none."""
        if not self._ready:
            return False
        self._ready = False
        try:
            os.rename(self.path, path)
        except OSError as exc:
            log.warning("cannot use the preallocated segment %s: %s", self.path, exc)
            return False
        return True

    async def close(self) -> None:
        """Stop making spares; wait for one on its way, then remove the spare file."""
        self._loop = None
        if self._pending is not None:
            await asyncio.wait([self._pending])
        self._ready = False
        await asyncio.get_running_loop().run_in_executor(None, self.path.unlink, True)
