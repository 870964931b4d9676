"""The consumer's delivery buffer (txbroker/client/delivery.py) on its own: bound, order,
waiters, cancelled waiters, close.  The consumer tests cover it inside a Consumer."""

from __future__ import annotations

import asyncio

import pytest

from txbroker.client.delivery import DeliveryBuffer


async def test_a_pull_goes_in_whole_and_comes_out_in_order() -> None:
    buffer = DeliveryBuffer(8)
    await buffer.put_all([1, 2, 3])
    await buffer.put_all([4])
    assert len(buffer) == 4
    assert [buffer.get_nowait() for _ in range(4)] == [1, 2, 3, 4]
    with pytest.raises(IndexError):
        buffer.get_nowait()


async def test_a_full_buffer_holds_the_puller_back_until_there_is_room() -> None:
    buffer = DeliveryBuffer(3)
    putter = asyncio.create_task(buffer.put_all(list(range(7))))
    await asyncio.sleep(0)
    assert list(buffer.items) == [0, 1, 2] and not putter.done()  # back-pressure
    got = []
    for _ in range(7):
        got.append(await asyncio.wait_for(buffer.get(), 5))
        assert len(buffer) <= 3
    await asyncio.wait_for(putter, 5)
    assert got == list(range(7))


async def test_waiting_polls_are_served_in_turn_and_each_gets_one_item() -> None:
    buffer = DeliveryBuffer(8)
    polls = [asyncio.create_task(buffer.get()) for _ in range(3)]
    await asyncio.sleep(0)
    await buffer.put_all(["a", "b"])
    assert await asyncio.wait_for(polls[0], 5) == "a"  # the longest-waiting poll first
    assert await asyncio.wait_for(polls[1], 5) == "b"
    for _ in range(5):  # a few loop turns: the third poll has nothing to take
        await asyncio.sleep(0)
    assert not polls[2].done()
    await buffer.put_all(["c"])
    assert await asyncio.wait_for(polls[2], 5) == "c"


async def test_a_poll_timed_out_after_its_wake_up_passes_the_item_on() -> None:
    """The first waiter is woken and cancelled in the same loop turn (a poll's time-out):
    the item must reach the second waiter, not wait for a later put."""
    buffer = DeliveryBuffer(8)
    first = asyncio.create_task(buffer.get())
    second = asyncio.create_task(buffer.get())
    await asyncio.sleep(0)
    await buffer.put_all(["x"])  # wakes the first waiter
    first.cancel()               # ... which times out before it runs
    assert await asyncio.wait_for(second, 5) == "x"
    assert first.cancelled()
    assert not buffer._getters


async def test_polls_that_time_out_leave_no_waiters_behind() -> None:
    buffer = DeliveryBuffer(8)
    for _ in range(50):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.001):
                await buffer.get()
    assert not buffer._getters


async def test_close_drops_the_items_and_wakes_every_waiter_with_none() -> None:
    buffer = DeliveryBuffer(2)
    waiter = asyncio.create_task(buffer.get())
    await asyncio.sleep(0)
    buffer.close()
    assert await asyncio.wait_for(waiter, 5) is None
    full = DeliveryBuffer(1)
    putter = asyncio.create_task(full.put_all([1, 2, 3]))
    await asyncio.sleep(0)
    full.close()
    await asyncio.wait_for(putter, 5)  # a puller waiting for room ends; the rest is dropped
    assert len(full) == 0 and await full.get() is None
    with pytest.raises(ValueError):
        DeliveryBuffer(0)
