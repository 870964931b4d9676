"""Internal re-puts while the store refuses writes: nothing taken from a queue is dropped.

A master whose lease is not known valid, a demotion or the disk guard makes the store refuse
puts for a while.  Each test refuses puts through the store's real fence (or the disk guard),
runs an internal path that takes something from a queue and puts it again, checks that nothing
moved and nothing was lost, lets writes in again and checks the outcome the contract promises.
"""

from __future__ import annotations

import logging

import pytest
from broker_wire import pull, request, send
from support.clock import ManualClock
from support.txnode import (
    COMMIT,
    ROLLBACK,
    TIMEOUT,
    Producer,
    end_cmd,
    op_records,
    open_node,
    prepare,
    tx_config,
    visible,
)
from support.waiting import eventually

from txbroker.broker import Broker
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.service.schedule import SCHEDULE_GROUP
from txbroker.service.topics import SCHEDULE_TOPIC
from txbroker.service.transaction.bridge import TransactionalMessageBridge
from txbroker.service.transaction.state import HalfState, TransactionError
from txbroker.store.record import CHECK_MAX_TIME_TOPIC, Message
from txbroker.store.results import Fence

FENCE = Fence.LEASE_NOT_VALID.text


class Disk:
    """The data disk as the disk guard's probe sees it; the test moves ``used``."""

    def __init__(self) -> None:
        self.used = 50

    def usage(self, path: str) -> tuple[int, int, int]:
        return 100, self.used, 100 - self.used


def refuse(b: Broker, disk: Disk, how: str) -> None:
    if how == "fence":
        b.store.set_write_gate(lambda: Fence.LEASE_NOT_VALID)
    else:
        disk.used = 95
        assert b.store.recheck_disk()


def accept(b: Broker, disk: Disk, how: str) -> None:
    if how == "fence":
        b.store.set_write_gate(None)
    else:
        disk.used = 50
        assert not b.store.recheck_disk()


async def _broker(broker_config, clock: ManualClock, disk: Disk, **overrides) -> Broker:
    b = Broker(broker_config.replace(disk_max_used_ratio=0.9, **overrides), clock=clock,
               disk_usage=disk.usage)
    await b.start()
    return b


def _bodies(b: Broker, topic: str) -> list[bytes]:
    res = b.store.get(topic, 0, 0, 100)
    return [m.body for m in res.messages()] if res.raw else []


@pytest.mark.parametrize("how", ["fence", "disk"])
async def test_delayed_messages_wait_out_a_refusal_and_arrive_once_in_order(
        broker_config, how, caplog) -> None:
    clock, disk = ManualClock(follows_real_time=True), Disk()
    b = await _broker(broker_config, clock, disk)
    c = RemotingClient(b.broker_addr)
    await c.connect()
    try:
        for i in range(3):
            resp = await send(c, "Delayed", b"d%d" % i, props={"DELAY": "1"})
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert b.store.max_offset(SCHEDULE_TOPIC, 0) == 3
        caplog.set_level(logging.WARNING, logger="txbroker.service.schedule")
        refuse(b, disk, how)
        clock.advance(5)  # level 1 (1 s) is due
        for _ in range(5):  # passes of our own besides the service's periodic ones
            assert await b.schedule.deliver_due() == 0
        assert b.store.max_offset("Delayed", 0) == 0
        assert b.store.offsets.get(SCHEDULE_GROUP, SCHEDULE_TOPIC, 0) in (None, 0)
        held = [r for r in caplog.records if "held back" in r.getMessage()]
        assert len(held) == 1, [r.getMessage() for r in held]  # once per cause, not per pass
        accept(b, disk, how)
        await eventually(lambda: b.store.max_offset("Delayed", 0) >= 3, 10.0,
                         lambda: f"{b.store.max_offset('Delayed', 0)} of 3 delivered")
        assert await b.schedule.deliver_due() == 0  # nothing left to deliver
        assert _bodies(b, "Delayed") == [b"d0", b"d1", b"d2"]
        assert b.store.offsets.get(SCHEDULE_GROUP, SCHEDULE_TOPIC, 0) == 3
    finally:
        await c.close()
        await b.stop()


async def test_a_retry_sent_back_during_a_refusal_is_not_lost(broker_config) -> None:
    """Send-back through a delay level: the retry waits in the schedule topic, the store is
    fenced when it falls due, and it reaches the retry topic once writes are accepted."""
    clock, disk = ManualClock(follows_real_time=True), Disk()
    b = await _broker(broker_config, clock, disk)
    c = RemotingClient(b.broker_addr)
    await c.connect()
    try:
        await send(c, "Work", b"payload")
        _, msgs = await pull(c, "WG", "Work", 0, 0)
        resp = await c.invoke(request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": str(msgs[0].physical_offset), "group": "WG", "delayLevel": "1"}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        b.store.set_write_gate(lambda: Fence.LEASE_NOT_VALID)
        clock.advance(5)
        assert await b.schedule.deliver_due() == 0
        assert b.store.max_offset("%RETRY%WG", 0) == 0
        b.store.set_write_gate(None)
        await eventually(lambda: b.store.max_offset("%RETRY%WG", 0) >= 1, 10.0)
        assert _bodies(b, "%RETRY%WG") == [b"payload"]
    finally:
        await c.close()
        await b.stop()


@pytest.mark.parametrize("level", ["0", "-1"])
async def test_send_back_refused_by_the_store_fails_so_the_consumer_keeps_it(
        broker_config, level) -> None:
    """A refused send-back must not answer success: the consumer then keeps the message and
    consumes it again (level -1 goes straight to the dead-letter queue, 0 through a delay)."""
    clock, disk = ManualClock(follows_real_time=True), Disk()
    b = await _broker(broker_config, clock, disk)
    c = RemotingClient(b.broker_addr)
    await c.connect()
    try:
        await send(c, "Work", b"payload")
        _, msgs = await pull(c, "WG", "Work", 0, 0)
        back = request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": str(msgs[0].physical_offset), "group": "WG", "delayLevel": level})
        b.store.set_write_gate(lambda: Fence.LEASE_NOT_VALID)
        resp = await c.invoke(back, TIMEOUT)
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert b.store.max_offset(SCHEDULE_TOPIC, 2) == 0 and b.store.max_offset("%DLQ%WG", 0) == 0
        b.store.set_write_gate(None)
        back = request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": str(msgs[0].physical_offset), "group": "WG", "delayLevel": level})
        resp = await c.invoke(back, TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    finally:
        await c.close()
        await b.stop()


# --- transactions -------------------------------------------------------------------------------

@pytest.fixture
async def tx_node(tmp_path):
    node = await open_node(tx_config(tmp_path / "data"), ManualClock())
    try:
        yield node
    finally:
        await node.close()


async def test_no_checks_while_the_store_is_fenced(tx_node) -> None:
    """A fenced store cannot apply a check's answer, so a check would only burn a count, and
    more passes than ``transaction_check_max`` would then discard a half its producer commits."""
    node = tx_node
    producer = await Producer(node, answer=COMMIT).start()
    try:
        result = await prepare(node, producer.conn)
        node.clock.advance(60)
        node.store.set_write_gate(lambda: Fence.LEASE_NOT_VALID)
        for _ in range(node.config.transaction_check_max + 2):
            report = await node.tx.check_now()
            assert report.sent == 0 and report.discarded == 0 and report.skipped == FENCE
        assert node.tx.entry(result.physical_offset).checks == 0 and producer.checks == []
        node.store.set_write_gate(None)
        assert (await node.tx.check_now()).sent == 1
        await eventually(lambda: node.tx.pending_count() == 0)
        assert [m.body for m in visible(node)] == [b"payload"]
        assert node.tx.discarded_count() == 0
    finally:
        await producer.close()


class FencingBridge(TransactionalMessageBridge):
    """Raises the store's real fence while a check pass is under way (as a lease running out
    would), once the pass has read ``fence_after`` halves."""

    fence_after: int | None = None

    def read_half(self, phys: int):
        if self.fence_after is not None:
            self.fence_after -= 1
            if self.fence_after == 0:
                self.store.set_write_gate(lambda: Fence.LEASE_NOT_VALID)
        return super().read_half(phys)


async def test_a_fence_raised_during_a_check_pass_ends_it(tmp_path) -> None:
    node = await open_node(tx_config(tmp_path / "data", check_concurrency=4), ManualClock(),
                           bridge=FencingBridge)
    producer = await Producer(node).start()
    try:
        for i in range(12):
            await prepare(node, producer.conn, uniq=f"U{i}")
        node.clock.advance(60)
        node.tx.bridge.fence_after = 2
        report = await node.tx.check_now()
        assert report.skipped == FENCE
        assert report.sent == 4  # the batch under way when the fence came, no more
        counts = sorted(e.checks for e in node.tx.pending_entries())
        assert counts == [0] * 8 + [1] * 4
        node.store.set_write_gate(None)
        assert (await node.tx.check_now()).sent == 12
    finally:
        await producer.close()
        await node.close()


@pytest.mark.parametrize("decision", [COMMIT, ROLLBACK])
async def test_end_transaction_refused_by_the_store_is_an_error_and_the_half_stays_pending(
        tx_node, decision) -> None:
    node = tx_node
    producer = await Producer(node).start()
    try:
        result = await prepare(node, producer.conn)
        node.store.set_write_gate(lambda: Fence.LEASE_NOT_VALID)
        resp = await producer.client.invoke(
            end_cmd(result.physical_offset, result.queue_offset, decision), TIMEOUT)
        assert resp.code == ResponseCode.SYSTEM_ERROR and FENCE in resp.remark
        entry = node.tx.entry(result.physical_offset)
        assert entry is not None and entry.state is HalfState.PENDING
        assert visible(node) == [] and op_records(node) == []
        node.store.set_write_gate(None)
        resp = await producer.client.invoke(
            end_cmd(result.physical_offset, result.queue_offset, decision), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert node.tx.pending_count() == 0 and len(op_records(node)) == 1
        assert [m.body for m in visible(node)] == ([b"payload"] if decision == COMMIT else [])
    finally:
        await producer.close()


async def test_discard_and_resume_refused_by_the_store_leave_the_half_where_it_was(tx_node) -> None:
    node = tx_node
    result = await prepare(node)
    entry = node.tx.entry(result.physical_offset)
    entry.checks = node.config.transaction_check_max
    node.store.set_write_gate(lambda: Fence.LEASE_NOT_VALID)
    assert await node.tx.discard(entry) is False
    assert entry.state is HalfState.PENDING and node.store.max_offset(CHECK_MAX_TIME_TOPIC, 0) == 0
    node.store.set_write_gate(None)
    node.clock.advance(60)  # past its immunity: the next pass discards it
    assert (await node.tx.check_now()).discarded == 1
    assert node.tx.discarded_count() == 1
    node.store.set_write_gate(lambda: Fence.LEASE_NOT_VALID)
    with pytest.raises(TransactionError):
        await node.tx.operator_decide("U1", "resume", operator="ops")
    assert node.tx.entry(result.physical_offset).state is HalfState.DISCARDED
    node.store.set_write_gate(None)
    done = await node.tx.operator_decide("U1", "resume", operator="ops")
    assert done["state"] == "pending" and node.tx.entry(result.physical_offset).checks == 0


async def test_a_delayed_message_no_retry_can_store_is_skipped_not_wedging_its_level(
        broker_config) -> None:
    """Only refusals are retried: a message the store can never take (here a real topic too
    long for a record) is logged and skipped, or every later message of its level would wait
    for ever behind it."""
    clock, disk = ManualClock(follows_real_time=True), Disk()
    b = await _broker(broker_config, clock, disk)
    try:
        for topic, body in (("x" * 300, b"bad"), ("Delayed", b"good")):
            result = await b.store.put(b.schedule.wrap(Message(topic, 0, body), 1))
            assert result.ok
        clock.advance(5)
        await eventually(lambda: b.store.max_offset("Delayed", 0) >= 1, 10.0)
        assert _bodies(b, "Delayed") == [b"good"]
        assert b.store.offsets.get(SCHEDULE_GROUP, SCHEDULE_TOPIC, 0) == 2
    finally:
        await b.stop()
