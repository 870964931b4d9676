"""RequestTimeouts (txbroker.remoting.timeouts): one loop timer for a connection's requests.

Each request still fails at its own deadline and only then; answered requests never fail and
do not pile up.  Real event loop, time-outs of a few tens of milliseconds.
"""

from __future__ import annotations

import asyncio

import pytest

from txbroker.remoting.timeouts import CLEAN_FROM, RequestTimeouts


async def test_each_request_fails_at_its_own_deadline() -> None:
    loop = asyncio.get_running_loop()
    timeouts = RequestTimeouts(loop, "peer:1")
    long, short, answered = loop.create_future(), loop.create_future(), loop.create_future()
    start = loop.time()
    timeouts.add(long, 1, 0.3)
    timeouts.add(short, 2, 0.05)  # an earlier deadline after a later one re-arms the timer
    timeouts.add(answered, 3, 0.05)
    answered.set_result("answer")
    with pytest.raises(TimeoutError, match=r"no answer from peer:1 within 0.05 s \(opaque 2\)"):
        await short
    assert 0.04 <= loop.time() - start and not long.done()
    assert answered.result() == "answer"
    with pytest.raises(TimeoutError, match=r"within 0.3 s \(opaque 1\)"):
        await long
    assert loop.time() - start >= 0.29


async def test_same_deadline_for_many_requests() -> None:
    loop = asyncio.get_running_loop()
    timeouts = RequestTimeouts(loop, "p")
    futures = [loop.create_future() for _ in range(5)]
    for opaque, fut in enumerate(futures):
        timeouts.add(fut, opaque, 0.0)
    await asyncio.wait(futures, timeout=1.0)
    assert all(isinstance(fut.exception(), TimeoutError) for fut in futures)


async def test_answered_requests_do_not_pile_up() -> None:
    loop = asyncio.get_running_loop()
    timeouts = RequestTimeouts(loop, "p")
    held = loop.create_future()
    timeouts.add(held, 0, 0.2)  # stays unanswered at the head of its queue
    for opaque in range(1, 20 * CLEAN_FROM):
        fut = loop.create_future()
        timeouts.add(fut, opaque, 0.2)
        fut.set_result(None)
    assert len(timeouts._queues[0.2]) <= 2 * CLEAN_FROM
    with pytest.raises(TimeoutError):
        await held


async def test_cancelled_caller_and_close() -> None:
    loop = asyncio.get_running_loop()
    timeouts = RequestTimeouts(loop, "p")
    cancelled, dropped = loop.create_future(), loop.create_future()
    timeouts.add(cancelled, 1, 0.02)
    cancelled.cancel()  # a caller that gave up: nothing to fail, nothing raised
    await asyncio.sleep(0.05)
    timeouts.add(dropped, 2, 0.02)
    timeouts.close()  # the connection is gone: its own error fails the futures instead
    await asyncio.sleep(0.05)
    assert not dropped.done() and not timeouts._queues
