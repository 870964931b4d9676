"""``bench/trace/tasks.py`` without Spark: a worker on its own loop fed rows lazily, its results
yielded as they come, its failure raised in the task's thread, and progress reaching the driver."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from txbroker.bench.trace.tasks import (
    BATCH,
    ProgressReporter,
    ProgressServer,
    stream_task,
)


async def _echo(feed, emit) -> None:
    """Each row comes back after a short sleep, many in flight at once."""
    pending: set[asyncio.Task] = set()

    async def one(row: dict) -> None:
        await asyncio.sleep(0.001)
        emit((row["id"], row["id"] * 2))

    while batch := await feed.next_batch():
        for row in batch:
            task = asyncio.get_running_loop().create_task(one(row))
            pending.add(task)
            task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)


def test_every_row_comes_back_once():
    out = list(stream_task(({"id": i} for i in range(20_000)), _echo))
    assert sorted(out) == [(i, i * 2) for i in range(20_000)]


def test_input_is_read_lazily_while_results_are_yielded():
    """The worker sees rows while the input is still being produced: the generator yields
    results before the last input row was read (a partition is never held whole)."""
    read = 0

    def rows():
        nonlocal read
        for i in range(50_000):
            read = i + 1
            yield {"id": i}

    gen = stream_task(rows(), _echo, window=4 * BATCH)
    first = next(gen)
    assert first[1] == first[0] * 2
    assert read < 50_000, "the whole input was read before the first result"
    assert len(list(gen)) == 49_999


def test_a_failing_worker_fails_the_task():
    async def broken(feed, emit) -> None:
        await feed.next_batch()
        raise ValueError("broker refused")

    with pytest.raises(ValueError, match="broker refused"):
        list(stream_task(({"id": i} for i in range(10_000)), broken))


def test_a_worker_that_stops_early_does_not_hang_the_task():
    async def two(feed, emit) -> None:
        batch = await feed.next_batch()
        emit((batch[0]["id"],))
        emit((batch[1]["id"],))

    started = time.monotonic()
    assert list(stream_task(({"id": i} for i in itertools.count()), two)) == [(0,), (1,)]
    assert time.monotonic() - started < 30


def test_progress_reaches_the_driver():
    server = ProgressServer()
    try:
        reporters = [ProgressReporter(server.address, "replay", t) for t in range(2)]
        for t, r in enumerate(reporters):
            out = list(stream_task(({"id": i} for i in range(1000 * (t + 1))), _echo, reporter=r))
            assert len(out) == 1000 * (t + 1)
        deadline = time.monotonic() + 10
        while server.done("replay") < 3000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.done("replay") == 3000
        assert server.done("deliveries") == 0
    finally:
        server.close()


def test_a_task_without_a_reachable_driver_works_on():
    reporter = ProgressReporter("127.0.0.1:1", "replay", 0)
    assert len(list(stream_task(({"id": i} for i in range(100)), _echo, reporter=reporter))) == 100
