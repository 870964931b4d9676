"""Getting appended bytes onto disk: interval flush (async mode) and group commit (sync mode).

Machine limits (docs/bench.md): mapped pages cost ~3.7 ms per call to make durable, about 15x a
``write()``+fdatasync.  One flush per put would cap a broker near 300 puts/s, so sync mode is a
group commit (RocketMQ's ``GroupCommitService``): each put appends, then waits on a future
tagged with the offset its record ends at; one flusher thread performs a single flush for
everything appended so far (``os.fdatasync`` releases the GIL, the loop keeps serving) and the
loop resolves every future that flush covers.  Requests arriving during a flush form the next
batch, so the batch size grows with the load and the flush rate stays at what the disk allows.
An idle service does not start a flush for the first put that waits but at the end of that
loop turn: the requests of one read (producers answering the last flush tend to arrive
together) append first, and one flush covers them all instead of one for the first record
and another for the rest.

Every put in sync mode pays for its wait, and a lone producer pays a whole flush round trip
per put, so both are kept to what the loop cannot avoid:

- A waiter is one plain future, resolved True (flushed) or False (not in time).  Time-outs are
  not a timer per waiter (``asyncio.wait_for`` costs a timer, a waiter future and, with the
  ``shield`` a shared future would need, another future and callback per put): the service
  keeps one timer, armed at the earliest deadline of anyone waiting, and answers False to every
  waiter past its deadline when it fires; the late flush goes on and covers the data later.
- The flush runs on a thread of its own fed through a ``SimpleQueue``, not through
  ``run_in_executor`` (a concurrent future, a work item, locks, an asyncio future chained to
  it, and a flusher task to wake per flush): one queue put to start a flush, one
  ``call_soon_threadsafe`` to report it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: A waiter: the offset its data ends at, its deadline (loop time), the future it awaits.
Waiter = tuple[int, float, "asyncio.Future[bool]"]


class FlushService:
    """The group commit: waiters on the loop, flushes on one thread.  ``flush_to`` is blocking
    (it runs on that thread) and returns the offset it made durable."""

    def __init__(self, flush_to: Callable[[int], int], write_end: Callable[[], int]) -> None:
        self._flush_to = flush_to
        self._write_end = write_end
        #: Waiters no flush has started for yet, and those the running flush will cover.
        self._waiting: list[Waiter] = []
        self._inflight: list[Waiter] = []
        #: A flush was handed to the thread and its outcome has not reached the loop yet.
        self._busy = False
        #: A flush is due at the end of this loop turn (:meth:`_begin` is scheduled).
        self._due = False
        self._closing = False
        self._requests: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The one time-out timer and the deadline it is armed for (inf: none armed).
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.flushed = 0
        self.flushes = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._flusher, name="txbroker-group-commit", daemon=True)
        self._thread.start()

    async def wait_flushed(self, end: int, timeout: float) -> bool:
        """True once a flush covers ``end``; False when that takes longer than ``timeout``, when
        the flush failed, or when the service closed first (the data stays written and is
        flushed later: the put answers FLUSH_DISK_TIMEOUT).  Cancelling the caller cancels only
        its own future, which the service then skips."""
        if end <= self.flushed:
            return True
        loop = self._loop
        assert loop is not None, "start() first"
        fut: asyncio.Future[bool] = loop.create_future()
        deadline = loop.time() + timeout
        self._waiting.append((end, deadline, fut))
        if deadline < self._timer_at:
            self._arm(deadline)
        if not self._busy and not self._due:
            # Not now: at the end of this loop turn, so that the puts of every request read in
            # this turn (a burst of producers answering the last flush) share one flush.
            self._due = True
            loop.call_soon(self._begin)
        return await fut

    # --- flushing -------------------------------------------------------------------------------
    def _begin(self) -> None:
        """Hand the thread one flush covering every waiter so far (all appended before it)."""
        self._due = False
        if self._closing or self._busy or not self._waiting:
            return
        self._busy = True
        self._inflight, self._waiting = self._waiting, []
        self._requests.put(self._write_end())

    def _flusher(self) -> None:
        """The flush thread: one flush per request, its outcome posted back to the loop."""
        loop = self._loop
        assert loop is not None
        while (target := self._requests.get()) is not None:
            try:
                outcome: int | OSError = self._flush_to(target)
            except OSError as exc:
                outcome = exc
            try:
                loop.call_soon_threadsafe(self._done, outcome)
            except RuntimeError:  # the loop is closed: nobody is left to answer
                return

    def _done(self, outcome: int | OSError) -> None:
        """On the loop: a flush ended; answer its batch and start the next one if anyone waits."""
        self._busy = False
        if isinstance(outcome, OSError):
            log.error("group commit flush failed: %s", outcome)
            self._answer(self._inflight, False)
            self._inflight = []
        else:
            self.flushes += 1
            self.flushed = max(self.flushed, outcome)
            self._settle()
        if self._waiting:
            self._begin()

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

    # --- time-outs ------------------------------------------------------------------------------
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
            waiters[:] = left
        if earliest < math.inf:
            self._arm(earliest)

    # --- closing --------------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop the thread (a flush in progress finishes and is answered), then flush once more
        so that no waiting put is left unanswered: a put appended before close is acknowledged
        by this final flush."""
        self._closing = True
        loop = asyncio.get_running_loop()
        if self._thread is not None:
            self._requests.put(None)
            # The join's answer is posted after the last flush's outcome: both are answered then.
            await loop.run_in_executor(None, self._thread.join)
            self._thread = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        self._inflight.extend(self._waiting)
        self._waiting = []
        if self._inflight:
            try:
                self.flushed = max(self.flushed, await loop.run_in_executor(
                    None, self._flush_to, self._write_end()))
                self.flushes += 1
            except OSError as exc:
                log.error("final group commit flush failed: %s", exc)
            self._settle()
        self._answer(self._waiting, False)
        self._waiting.clear()
