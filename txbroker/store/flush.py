"""Getting appended bytes onto disk: interval flush (async mode) and group commit (sync mode).

Machine limits (docs/bench.md): mapped pages cost ~3.7 ms per call to make durable, about 15x a
``write()``+fdatasync.  One flush per put would cap a broker near 300 puts/s, so sync mode is a
group commit (RocketMQ's ``GroupCommitService``): each put appends, then waits on a future
tagged with the offset its record ends at; one flusher task swaps the waiting list, performs a
single flush in an executor (``os.fdatasync`` releases the GIL, the loop keeps serving) and
resolves every future that flush covers.  Requests arriving during a flush form the next
batch, so the batch size grows with the load and the flush rate stays at what the disk allows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class FlushService:
    """Owns the flusher task.  ``flush_to`` is blocking and runs in the default executor."""

    def __init__(self, flush_to: Callable[[int], int], write_end: Callable[[], int]) -> None:
        #: Blocking: make everything before the given offset durable; returns the flushed end.
        self._flush_to = flush_to
        self._write_end = write_end
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []
        self._inflight: list[tuple[int, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.flushed = 0
        self.flushes = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="txbroker-group-commit")

    async def wait_flushed(self, end: int, timeout: float) -> bool:
        """True once a flush covers ``end``; False when that takes longer than ``timeout``
        (the data stays written and is flushed later: the put answers FLUSH_DISK_TIMEOUT)."""
        if end <= self.flushed:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((end, fut))
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            return False
        except asyncio.CancelledError:
            if fut.cancelled():  # the service closed before any flush covered ``end``
                return False
            raise  # the caller itself was cancelled
        return True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._waiting:
                continue
            # The batch stays reachable (``_inflight``) while its flush runs, so close() can
            # still answer it if the task is cancelled mid-flush.
            self._inflight, self._waiting = self._waiting, []
            target = self._write_end()
            try:
                self.flushed = max(self.flushed, await loop.run_in_executor(None, self._flush_to, target))
                self.flushes += 1
            except OSError as exc:
                log.error("group commit flush failed: %s", exc)
                batch, self._inflight = self._inflight, []
                for _end, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            self._settle()
            if self._waiting:
                self._wake.set()

    def _settle(self) -> None:
        """Resolve every waiter the last flush covered; the rest wait for the next one."""
        batch, self._inflight = self._inflight, []
        for end, fut in batch:
            if fut.done():
                continue
            if end <= self.flushed:
                fut.set_result(None)
            else:
                self._waiting.append((end, fut))

    async def close(self) -> None:
        """Stop the flusher, then flush once more so that no waiting put is left unanswered:
        a put that was appended before close is acknowledged by this final flush."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._inflight.extend(self._waiting)
        self._waiting = []
        if self._inflight:
            loop = asyncio.get_running_loop()
            try:
                self.flushed = max(self.flushed, await loop.run_in_executor(
                    None, self._flush_to, self._write_end()))
                self.flushes += 1
            except OSError as exc:
                log.error("final group commit flush failed: %s", exc)
            self._settle()
        for _end, fut in self._waiting:
            if not fut.done():
                fut.cancel()
        self._waiting.clear()
