"""The timer service's parts: the pure index and record format (no I/O), then an in-process
broker for rolling, the pending limit, recovery after a clean restart and a slave's index."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from support.cli_runner import run_cli
from support.clock import ManualClock
from support.waiting import eventually

from txbroker.broker import Broker
from txbroker.remoting.recall import decode_handle, encode_handle
from txbroker.service.timer.index import TimerIndex
from txbroker.service.timer.props import (
    SETTLE_QUEUE,
    TIMER_QUEUE,
    TimerRefusal,
    deliver_at,
    is_timer,
    unwrap,
    wrap,
)
from txbroker.service.topics import TIMER_TOPIC
from txbroker.store.record import Message
from txbroker.store.results import Fence


def test_index_slots_bits_and_mark() -> None:
    index = TimerIndex(base=100)
    for offset, when in ((100, 5_500), (101, 5_100), (102, 9_000), (103, 5_900)):
        index.add(offset, when)
    assert index.pending == 4
    assert index.in_slot(5) == [100, 101, 103]
    assert index.settle(101) and not index.settle(101)
    assert index.take(5) == [100, 103]  # slots up to second 5, settled ones skipped
    assert index.next_second() == 9
    assert index.advance(104) == 100  # 100 is still pending
    index.settle(100)
    index.settle(103)
    assert index.advance(104) == 102
    with pytest.raises(ValueError):
        index.add(99, 1)


def test_index_mark_trims_its_bits() -> None:
    index = TimerIndex(base=0)
    n = 200_000
    for offset in range(n):
        index.add(offset, 1000)
    for offset in index.take(1):
        index.settle(offset)
    assert index.pending == 0
    assert index.advance(n) == n
    assert len(index._bits) < 4096 * 2  # the bytes below the mark were dropped
    index.add(n, 2000)
    assert index.is_pending(n) and not index.is_pending(n - 1)


def test_deliver_at_precedence_and_refusals() -> None:
    now, horizon = 1_000_000, 60_000
    assert deliver_at({"TIMER_DELAY_SEC": "2", "TIMER_DELIVER_MS": "5"}, now, horizon) == now + 2000
    assert deliver_at({"TIMER_DELAY_MS": "250"}, now, horizon) == now + 250
    assert deliver_at({"TIMER_DELIVER_MS": "5"}, now, horizon) == 5  # past: the caller delivers now
    with pytest.raises(TimerRefusal, match="beyond the broker's timer_max_delay of 60 s"):
        deliver_at({"TIMER_DELIVER_MS": str(now + horizon + 1)}, now, horizon)
    with pytest.raises(TimerRefusal, match="not a non-negative integer"):
        deliver_at({"TIMER_DELAY_SEC": "٣"}, now, horizon)  # a non-ASCII digit
    assert not is_timer({"TIMER_DELIVER_MS": "5", "DELAY": "3"})  # a level wins


def test_wrap_unwrap_and_handle_round_trip() -> None:
    msg = Message("T", 3, b"b", properties={"TIMER_DELAY_SEC": "9", "UNIQ_KEY": "U"},
                  sys_flag=8, prepared_transaction_offset=77)
    stored = wrap(msg, 123)
    assert (stored.topic, stored.queue_id) == (TIMER_TOPIC, TIMER_QUEUE)
    assert stored.properties["TIMER_OUT_MS"] == "123"
    back = unwrap(stored)
    assert (back.topic, back.queue_id, back.sys_flag, back.prepared_transaction_offset) == ("T", 3, 8, 77)
    assert "TIMER_DELAY_SEC" not in back.properties and "REAL_TOPIC" not in back.properties
    handle = encode_handle("T", "b1", 123, "U")
    assert decode_handle(handle) == ("T", "b1", 123, "U")
    # not base64; "v2 T b1 1 U" (another version); "v1 T b1 x U" (a time that is no number)
    for bad in ("", "!!!", "djIgVCBiMSAxIFU=", "djEgVCBiMSB4IFU="):
        with pytest.raises(ValueError, match="is invalid"):
            decode_handle(bad)


def _timer(topic: str, when_ms: int, key: str) -> Message:
    return Message(topic, 0, b"x", properties={"TIMER_DELIVER_MS": str(when_ms), "UNIQ_KEY": key})


@pytest.mark.slow
async def test_rolled_timers_are_delivered_once_and_recovered(broker_config) -> None:
    """A roll window of 0.3 s: a timer due in 5 s is written again several times, and a
    clean restart in between neither loses nor repeats it."""
    cfg = broker_config.replace(timer_roll_window=0.3)
    b = Broker(cfg)
    await b.start()
    await b.topics.get_or_create("TRoll", queue_nums=1)
    due = int(time.time() * 1000) + 5000
    for i in range(5):
        assert (await b.store.put(b.timer.wrap(_timer("TRoll", due, f"K{i}")))).ok
    await eventually(lambda: b.store.max_offset(TIMER_TOPIC, TIMER_QUEUE) >= 10,
                     msg="the five timers rolled at least once")
    assert b.timer.pending == 5
    await b.stop()
    b = Broker(cfg)
    await b.start()
    try:
        assert b.timer.pending == 5
        await eventually(lambda: b.store.max_offset("TRoll", 0) >= 5, msg="delivered")
        assert b.timer.pending == 0
        got = b.store.get("TRoll", 0, 0, 100).messages()
        assert sorted(m.uniq_key for m in got) == [f"K{i}" for i in range(5)]
        assert all(m.store_timestamp >= due for m in got)
        assert b.store.max_offset(TIMER_TOPIC, SETTLE_QUEUE) >= 2
    finally:
        await b.stop()


async def test_pending_limit_refuses_clearly(broker_config) -> None:
    b = Broker(broker_config.replace(timer_max_pending=3))
    await b.start()
    try:
        due = int(time.time() * 1000) + 60_000
        for i in range(3):
            assert (await b.store.put(b.timer.wrap(_timer("TLimit", due, f"K{i}")))).ok
        await eventually(lambda: b.timer.pending == 3, msg="three pending")
        with pytest.raises(TimerRefusal, match="3 timers are pending on broker .*"
                                               "timer_max_pending is 3"):
            b.timer.wrap(_timer("TLimit", due, "K3"))
    finally:
        await b.stop()


@pytest.mark.parametrize(("args", "line"), [
    (["--timer-max-delay", "0"], "timer_max_delay=0.0: must be > 0"),
    (["--timer-max-pending", "0"], "timer_max_pending=0: must be >= 1"),
    (["--timer-roll-window", "-3"], "timer_roll_window=-3.0: must be > 0"),
])
async def test_serve_refuses_bad_timer_settings_in_one_line(tmp_path, args, line) -> None:
    result = await run_cli("serve", "--data-dir", str(tmp_path / "d"), "--broker-port", "0", *args)
    assert result.exit_code == 2  # a usage error, as every bad setting
    assert result.stderr.strip() == f"error: {line}" and "Traceback" not in result.output
    assert not (tmp_path / "d").exists()


async def test_due_timers_wait_while_the_store_refuses_and_are_delivered_after(
        broker_config, caplog) -> None:
    """A fenced store refuses the deliveries: nothing is lost or settled, they are tried again
    every 0.1 s (not in a tight loop), the refusal is logged once, and once writes are taken
    the timers are delivered.  The broker's clock is manual: the timers fall due when the test
    moves it, after the fence is up."""
    clock = ManualClock()
    b = Broker(broker_config, clock=clock)
    await b.start()
    try:
        due = int(clock() * 1000) + 1000
        for i in range(3):
            assert (await b.store.put(b.timer.wrap(_timer("TFenced", due, f"K{i}")))).ok
        await eventually(lambda: b.timer.pending == 3, msg="three pending")
        attempts = []

        def fenced():
            attempts.append(1)
            return Fence.LEASE_NOT_VALID

        b.store.set_write_gate(fenced)
        clock.advance(2.0)  # due now
        with caplog.at_level(logging.WARNING, logger="txbroker.service.timer.service"):
            await eventually(lambda: attempts, msg="a delivery attempted")
            await asyncio.sleep(1.0)  # retried every 0.1 s meanwhile
        held = [r for r in caplog.records if "timer delivery held back" in r.getMessage()]
        assert len(held) == 1
        assert b.store.max_offset("TFenced", 0) == 0 and b.timer.pending == 3
        assert len(attempts) <= 30  # about one put attempt per 0.1 s, not a tight loop
        b.store.set_write_gate(None)
        await eventually(lambda: b.store.max_offset("TFenced", 0) == 3, msg="delivered")
        await eventually(lambda: b.timer.pending == 0, msg="settled")
    finally:
        await b.stop()


async def test_one_recall_cancels_a_timer_stored_twice(broker_config) -> None:
    """A producer whose send answer was lost sends again with the same UNIQ_KEY: two timer
    records of one message.  Its recall handle names the message, so both are cancelled."""
    b = Broker(broker_config)
    await b.start()
    try:
        await b.topics.get_or_create("TTwice", queue_nums=1)
        due = int(time.time() * 1000) + 60_000
        for _ in range(2):
            stored = b.timer.wrap(_timer("TTwice", due, "U-TWICE"))
            result = await b.store.put(stored)
            handle = b.timer.recall_handle(stored, result)
        assert await b.timer.recall("TTwice", handle) == "U-TWICE"
        assert b.timer.pending == 0
        with pytest.raises(TimerRefusal, match="no pending timer message U-TWICE"):
            await b.timer.recall("TTwice", handle)
    finally:
        await b.stop()
