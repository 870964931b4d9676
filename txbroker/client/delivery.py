"""The consumer's bounded buffer between its pullers and ``poll()``: a pull enters in one call.

A pull answer brings up to a batch of messages at once and ``poll()`` hands them out one at a
time.  An ``asyncio.Queue`` took each message in with its own ``put`` (a fullness check, a
waiter wake-up check) and out with ``qsize``/``get_nowait``: together more than the rest of
delivering a pulled message.  :class:`DeliveryBuffer` takes a pull's messages with one
:meth:`~DeliveryBuffer.put_all` and gives them out from a deque; the bound is the same
(``buffer_size`` messages, a puller waits for room: back-pressure reaches the broker), and so
is the order (a pull's messages stay together, in queue order).

Waiters are futures, woken in arrival order; a waiter whose wait is cancelled (a ``poll``
time-out) after it was woken passes the wake-up on, so no message waits while a poll does.
:meth:`~DeliveryBuffer.close` (the consumer's shutdown) drops what is buffered (it was never
delivered, so never acknowledged: the group delivers it again) and makes every waiting and
later :meth:`~DeliveryBuffer.get` return None.  Event loop only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import Any


class DeliveryBuffer:
    """At most ``maxsize`` items in arrival order; see the module docstring."""

    __slots__ = ("_getters", "_putters", "closed", "items", "maxsize")

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("a delivery buffer holds at least one item")
        self.maxsize = maxsize
        #: The buffered items, oldest first: look, but take them with :meth:`get_nowait`
        #: (which makes room for a waiting puller).
        self.items: collections.deque[Any] = collections.deque()
        self._getters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._putters: collections.deque[asyncio.Future[None]] = collections.deque()
        #: Set by :meth:`close`: nothing more is taken in or handed out.
        self.closed = False

    def __len__(self) -> int:
        return len(self.items)

    def _has_items(self) -> bool:
        return bool(self.items)

    def _has_room(self) -> bool:
        return len(self.items) < self.maxsize

    def get_nowait(self) -> Any:
        """The oldest item (IndexError when empty: look at ``len`` first)."""
        item = self.items.popleft()
        if self._putters:
            _wake(self._putters)
        return item

    async def get(self) -> Any:
        """The oldest item, waiting for one; None once the buffer is closed."""
        while not self.items:
            if self.closed:
                return None
            await _wait(self._getters, self._has_items)
        return self.get_nowait()

    async def put_all(self, items: list[Any]) -> None:
        """Append ``items`` in order, waiting for room while the buffer is full (the rest is
        dropped if the buffer closes meanwhile)."""
        done, total = 0, len(items)
        while done < total and not self.closed:
            room = self.maxsize - len(self.items)
            if room <= 0:
                await _wait(self._putters, self._has_room)
                continue
            if done == 0 and room >= total:
                self.items.extend(items)  # the common case: the whole pull fits
                taken = total
            else:
                taken = min(room, total - done)
                self.items.extend(items[done:done + taken])
            done += taken
            for _ in range(min(taken, len(self._getters))):
                _wake(self._getters)

    def close(self) -> None:
        """Drop what is buffered; every waiting and later :meth:`get` returns None."""
        self.closed = True
        self.items.clear()
        while self._getters:
            _wake(self._getters)
        while self._putters:
            _wake(self._putters)


def _wake(waiters: collections.deque[asyncio.Future[None]]) -> None:
    """Wake the longest-waiting waiter still waiting."""
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            return


async def _wait(waiters: collections.deque[asyncio.Future[None]],
                still_ready: Callable[[], bool]) -> None:
    """Wait in ``waiters`` until woken.  A waiter cancelled after it was woken wakes the next
    one while ``still_ready()`` (items to get, room to put), so none is left behind."""
    fut = asyncio.get_running_loop().create_future()
    waiters.append(fut)
    try:
        await fut
    except BaseException:
        if fut.done() and not fut.cancelled():
            if still_ready():
                _wake(waiters)
        else:
            fut.cancel()
            with contextlib.suppress(ValueError):
                waiters.remove(fut)  # a poll that times out again and again leaves nothing
        raise
