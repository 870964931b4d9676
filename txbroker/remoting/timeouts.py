"""The time-outs of one connection's requests to its peer: one loop timer for all of them.

Each request must fail with TimeoutError once its own time-out has passed without an answer,
and only that request.  A loop timer per request (``call_later``, then ``cancel`` when the
answer came, as almost all do) gives that, but on uvloop it cost about a tenth of the client's
CPU per round trip (``python -m txbroker.bench.remoting --cpu``, 64 requests in flight); so
does a heap of deadlines.  Callers use a few fixed time-outs, and requests with the same
time-out reach their deadlines in the order they were sent: one queue per time-out value,
in sending order, holds each request's deadline, and a single loop timer is armed at the
earliest head.  Answered requests are not looked for: their entries leave when they reach the
head of their queue, or in a clean-up once a queue has doubled since the previous one.
"""

from __future__ import annotations

import asyncio
import collections
import math

#: Entries expire this early, as the loop's own timers may fire (uvloop counts milliseconds).
TOLERANCE = 0.001
#: A queue is cleaned of answered requests once it holds at least this many entries and
#: twice as many as after its previous clean-up.
CLEAN_FROM = 256


class _Queue(collections.deque):
    """The requests of one time-out value, in sending order (so by deadline): tuples
    ``(deadline, future, opaque)``."""

    __slots__ = ("clean_at",)

    def __init__(self) -> None:
        super().__init__()
        self.clean_at = CLEAN_FROM


class RequestTimeouts:
    """Fails the future of a request still unanswered at its deadline with TimeoutError."""

    __slots__ = ("_loop", "_queues", "_timer", "_timer_at", "peer")

    def __init__(self, loop: asyncio.AbstractEventLoop, peer: str) -> None:
        self._loop = loop
        #: Named in the TimeoutError; the owner sets it once the connection knows its peer.
        self.peer = peer
        self._queues: dict[float, _Queue] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def add(self, fut: asyncio.Future, opaque: int, timeout: float) -> None:
        """Fail ``fut`` with TimeoutError if it is not done ``timeout`` seconds from now."""
        queue = self._queues.get(timeout)
        if queue is None:
            queue = self._queues[timeout] = _Queue()
        else:
            while queue and queue[0][1].done():
                queue.popleft()
            if len(queue) >= queue.clean_at:
                _clean(queue)
        deadline = self._loop.time() + timeout
        queue.append((deadline, fut, opaque))
        if deadline < self._timer_at:
            self._arm(deadline)

    def close(self) -> None:
        """Forget every request (the connection is gone; their futures fail otherwise)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf
        self._queues.clear()

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        due = self._loop.time() + TOLERANCE
        earliest = math.inf
        for timeout, queue in list(self._queues.items()):
            while queue and (queue[0][0] <= due or queue[0][1].done()):
                _, fut, opaque = queue.popleft()
                if not fut.done():
                    fut.set_exception(TimeoutError(f"no answer from {self.peer} within "
                                                   f"{timeout:g} s (opaque {opaque})"))
            if queue:
                earliest = min(earliest, queue[0][0])
            else:
                del self._queues[timeout]
        if earliest < math.inf:
            self._arm(earliest)


def _clean(queue: _Queue) -> None:
    """Drop the entries of answered requests; the order of the rest stays."""
    live = [entry for entry in queue if not entry[1].done()]
    queue.clear()
    queue.extend(live)
    queue.clean_at = max(CLEAN_FROM, 2 * len(queue))
