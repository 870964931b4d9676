"""Getting appended bytes onto disk: interval flush (async mode) and group commit (sync mode).

Machine limits (docs/bench.md): mapped pages cost ~3.7 ms per call to make durable, about 15x a
``write()``+fdatasync.  One flush per put would cap a broker near 300 puts/s, so sync mode is a
group commit (RocketMQ's ``GroupCommitService``): each put appends, then waits on a future
tagged with the offset its record ends at; one flusher task swaps the waiting list, performs a
single flush in an executor (``os.fdatasync`` releases the GIL, the loop keeps serving) and
resolves every future that flush covers.  Requests arriving during a flush form the next
batch, so the batch size grows with the load and the flush rate stays at what the disk allows.

Waiting is made as cheap as the loop allows, because every put in sync mode pays it: a waiter is
one plain future, resolved with True (flushed) or False (not within its time-out).  Time-outs
are not a timer per waiter (``asyncio.wait_for`` costs a timer, a waiter future and, with the
``shield`` a shared batch would need, another future and callback per put): the service keeps
one timer, armed at the earliest deadline of anyone waiting, and answers False to every waiter
past its deadline when it fires, while the flush that is late goes on and covers the data later.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

log = logging.getLogger(__name__)

#: A waiter: the offset its data ends at, its deadline (loop time), the future it awaits.
Waiter = tuple[int, float, "asyncio.Future[bool]"]


class FlushService:
    """Owns the flusher task.  ``flush_to`` is blocking and runs in the default executor."""

    def __init__(self, flush_to: Callable[[int], int], write_end: Callable[[], int]) -> None:
        #: Blocking: make everything before the given offset durable; returns the flushed end.
        self._flush_to = flush_to
        self._write_end = write_end
        self._waiting: list[Waiter] = []
        self._inflight: list[Waiter] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The one time-out timer and the deadline it is armed for (inf: none armed).
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.flushed = 0
        self.flushes = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="txbroker-group-commit")

    async def wait_flushed(self, end: int, timeout: float) -> bool:
        """True once a flush covers ``end``; False when that takes longer than ``timeout``, when
        the flush failed, or when the service closed first (the data stays written and is
        flushed later: the put answers FLUSH_DISK_TIMEOUT).  Cancelling the caller cancels only
        its own future, which the flusher then skips."""
        if end <= self.flushed:
            return True
        loop = self._loop
        assert loop is not None, "start() first"
        fut: asyncio.Future[bool] = loop.create_future()
        deadline = loop.time() + timeout
        self._waiting.append((end, deadline, fut))
        if deadline < self._timer_at:
            self._arm(deadline)
        self._wake.set()
        return await fut

    # --- time-outs ----------------------------------------------------------------------------
    def _arm(self, deadline: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(deadline, self._expire)
        self._timer_at = deadline

    def _expire(self) -> None:
        """The timer fired: answer False to every waiter past its deadline, drop the ones
        already answered or cancelled, and re-arm for the earliest deadline left."""
        assert self._loop is not None
        self._timer, self._timer_at = None, math.inf
        now = self._loop.time()
        earliest = math.inf
        for waiters in (self._inflight, self._waiting):
            left: list[Waiter] = []
            for waiter in waiters:
                fut = waiter[2]
                if fut.done():
                    continue
                if waiter[1] <= now:
                    fut.set_result(False)
                else:
                    left.append(waiter)
                    earliest = min(earliest, waiter[1])
            waiters[:] = left  # in place: the flusher holds the same in-flight list
        if earliest < math.inf:
            self._arm(earliest)

    # --- flushing -------------------------------------------------------------------------------
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
                self._answer(self._inflight, False)
                self._inflight = []
                continue
            self._settle()
            if self._waiting:
                self._wake.set()

    def _settle(self) -> None:
        """Resolve every waiter the last flush covered; the rest wait for the next one."""
        batch, self._inflight = self._inflight, []
        flushed = self.flushed
        for waiter in batch:
            fut = waiter[2]
            if fut.done():
                continue
            if waiter[0] <= flushed:
                fut.set_result(True)
            else:
                self._waiting.append(waiter)

    @staticmethod
    def _answer(waiters: list[Waiter], value: bool) -> None:
        for _end, _deadline, fut in waiters:
            if not fut.done():
                fut.set_result(value)

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
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
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
        self._answer(self._waiting, False)
        self._waiting.clear()
