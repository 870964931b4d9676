"""Mutual exclusion per half message, free when nobody else wants the same half.

Every END_TRANSACTION takes the lock of its half, so that a producer's commit, a check-back
answer and an operator's decision on one half are applied one after the other.  They almost
never meet: an ``asyncio.Lock`` per decision (plus a context-manager generator around it) was
a measurable share of a commit's CPU.  Here an uncontended acquire is one dict insert and no
await; only a second comer waits, on a future handed the lock when the holder releases it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable


class KeyedLock:
    """Locks named by a key, FIFO among waiters; a key exists while someone holds it."""

    def __init__(self) -> None:
        #: key -> waiters (None while nobody waits: the common case allocates nothing more).
        self._held: dict[Hashable, deque[asyncio.Future[None]] | None] = {}

    def __contains__(self, key: Hashable) -> bool:
        """True while ``key`` is held."""
        return key in self._held

    def hold(self, key: Hashable) -> _Held:
        """``async with locks.hold(key):`` — the key is held inside the block."""
        return _Held(self, key)

    def try_acquire(self, key: Hashable) -> bool:
        """Take ``key`` if it is free; False if someone holds it (then use :meth:`acquire`)."""
        if key in self._held:
            return False
        self._held[key] = None
        return True

    async def acquire(self, key: Hashable) -> None:
        """Take ``key``, waiting behind its holder and earlier waiters."""
        if self.try_acquire(key):
            return
        waiters = self._held[key]
        if waiters is None:
            waiters = self._held[key] = deque()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(key)  # it was handed to us as we were cancelled: pass it on
            raise

    def release(self, key: Hashable) -> None:
        """Hand ``key`` to the first live waiter, or free it."""
        waiters = self._held[key]
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # ownership passes; the key stays held
                return
        del self._held[key]


class _Held:
    __slots__ = ("_key", "_locks")

    def __init__(self, locks: KeyedLock, key: Hashable) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        if not self._locks.try_acquire(self._key):
            await self._locks.acquire(self._key)

    async def __aexit__(self, *exc: object) -> None:
        self._locks.release(self._key)
