"""FlushService (group commit) alone, against a fake disk whose flushes the test releases."""

from __future__ import annotations

import asyncio
import threading

from txbroker.store.flush import FlushService


class FakeDisk:
    """Appends move ``end``; a flush blocks until ``gate`` is set, then covers its target."""

    def __init__(self) -> None:
        self.end = 0
        self.gate = threading.Event()
        self.fail_next = False
        self.flushed_targets: list[int] = []

    def append(self, n: int = 10) -> int:
        self.end += n
        return self.end

    def flush_to(self, target: int) -> int:
        self.gate.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise OSError(5, "I/O error")
        self.flushed_targets.append(target)
        return target


def service(disk: FakeDisk) -> FlushService:
    svc = FlushService(disk.flush_to, lambda: disk.end)
    svc.start()
    return svc


async def test_one_flush_answers_everyone_it_covers():
    disk = FakeDisk()
    svc = service(disk)
    waits = [asyncio.ensure_future(svc.wait_flushed(disk.append(), 5)) for _ in range(20)]
    await asyncio.sleep(0)
    disk.gate.set()
    assert await asyncio.gather(*waits) == [True] * 20
    assert svc.flushed == disk.end and 1 <= svc.flushes <= 2
    assert await svc.wait_flushed(5, 5)  # already covered: no flush
    await svc.close()


async def test_a_short_time_out_fires_while_a_longer_one_still_waits():
    # The long waiter arms the service's one timer first; the short one must re-arm it earlier.
    disk = FakeDisk()
    svc = service(disk)
    long = asyncio.ensure_future(svc.wait_flushed(disk.append(), 30))
    short = asyncio.ensure_future(svc.wait_flushed(disk.append(), 0.05))
    assert await asyncio.wait_for(short, 5) is False
    assert not long.done()
    disk.gate.set()
    assert await asyncio.wait_for(long, 5) is True
    await svc.close()


async def test_cancelling_one_waiter_leaves_the_others_answered():
    disk = FakeDisk()
    svc = service(disk)
    waits = [asyncio.ensure_future(svc.wait_flushed(disk.append(), 5)) for _ in range(3)]
    await asyncio.sleep(0)
    waits[1].cancel()
    disk.gate.set()
    results = await asyncio.gather(*waits, return_exceptions=True)
    assert results[0] is True and results[2] is True
    assert isinstance(results[1], asyncio.CancelledError)
    await svc.close()


async def test_a_failed_flush_answers_false_and_the_next_one_works():
    disk = FakeDisk()
    disk.fail_next = True
    disk.gate.set()
    svc = service(disk)
    assert await asyncio.wait_for(svc.wait_flushed(disk.append(), 5), 5) is False
    assert await asyncio.wait_for(svc.wait_flushed(disk.append(), 5), 5) is True
    await svc.close()


async def test_close_flushes_for_waiters_left_and_then_answers_no_more():
    disk = FakeDisk()
    svc = service(disk)
    first = asyncio.ensure_future(svc.wait_flushed(disk.append(), 5))
    await asyncio.sleep(0.01)  # its flush is in progress, blocked on the gate
    second = asyncio.ensure_future(svc.wait_flushed(disk.append(), 5))
    await asyncio.sleep(0)
    disk.gate.set()
    await svc.close()
    assert await asyncio.gather(first, second) == [True, True]
    assert disk.flushed_targets[-1] == disk.end


async def test_puts_of_one_loop_turn_share_one_flush():
    # As requests read in one turn do: each appends, then waits, before the next one runs.
    # The first waiter must not start a flush that covers only its own record.
    disk = FakeDisk()
    disk.gate.set()
    svc = service(disk)

    async def put() -> bool:
        return await svc.wait_flushed(disk.append(), 5)

    waits = [asyncio.ensure_future(put()) for _ in range(20)]
    assert await asyncio.wait_for(asyncio.gather(*waits), 5) == [True] * 20
    assert disk.flushed_targets == [disk.end] and svc.flushes == 1
    await svc.close()


async def test_waiters_arriving_during_a_flush_share_the_next_one():
    disk = FakeDisk()
    svc = service(disk)
    first = asyncio.ensure_future(svc.wait_flushed(disk.append(), 5))
    await asyncio.sleep(0.01)  # its flush is in progress, blocked on the gate
    later = [asyncio.ensure_future(svc.wait_flushed(disk.append(), 5)) for _ in range(10)]
    await asyncio.sleep(0.01)
    disk.gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, *later), 5) == [True] * 11
    assert disk.flushed_targets == [10, disk.end] and svc.flushes == 2
    await svc.close()
