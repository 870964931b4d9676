"""KeyedLock: per-half mutual exclusion that costs nothing when uncontended."""

from __future__ import annotations

import asyncio

import pytest

from txbroker.service.transaction.locks import KeyedLock


async def test_uncontended_hold_never_waits_and_frees_the_key():
    locks = KeyedLock()
    async with locks.hold(7):
        assert 7 in locks and 8 not in locks
        assert not locks.try_acquire(7)
    assert 7 not in locks
    assert locks.try_acquire(7)
    locks.release(7)
    assert 7 not in locks


async def test_waiters_take_the_key_in_arrival_order():
    locks = KeyedLock()
    order: list[str] = []

    async def worker(name: str) -> None:
        async with locks.hold(1):
            order.append(f"{name} in")
            await asyncio.sleep(0)
            order.append(f"{name} out")

    await asyncio.gather(*(worker(n) for n in "abc"))
    assert order == ["a in", "a out", "b in", "b out", "c in", "c out"]
    assert 1 not in locks


async def test_a_cancelled_waiter_passes_the_key_on():
    locks = KeyedLock()
    assert locks.try_acquire(1)
    cancelled = asyncio.ensure_future(locks.acquire(1))
    after = asyncio.ensure_future(locks.acquire(1))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    locks.release(1)  # skips the cancelled waiter
    await asyncio.wait_for(after, 1)
    assert 1 in locks
    locks.release(1)
    assert 1 not in locks


async def test_a_waiter_cancelled_after_the_handoff_releases_it():
    locks = KeyedLock()
    assert locks.try_acquire(1)
    waiter = asyncio.ensure_future(locks.acquire(1))
    await asyncio.sleep(0)
    locks.release(1)  # handed to the waiter, which is cancelled before it runs
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert 1 not in locks
