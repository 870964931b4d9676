"""Timer messages through the SDK and the remoting send path, against an in-process broker:
delivery at the requested millisecond (never early), the refusals (bad value, beyond the
horizon), a time already past delivered at once, recall before delivery and its refusals,
and transactional timers (commit schedules, rollback never delivers, the check-back does not
loop)."""

from __future__ import annotations

import asyncio
import time

import pytest
from support.consuming import collect
from support.waiting import eventually

from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    Producer,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient
from txbroker.client.errors import BrokerError, SendError
from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.recall import decode_handle, encode_handle
from txbroker.store.record import PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_OUT_MS


def now_ms() -> int:
    return int(time.time() * 1000)


async def make_topic(namesrv: str, topic: str) -> None:
    async with AdminClient(namesrv) as admin:
        await admin.create_topic(topic, 2)


async def test_timer_delivered_at_its_time_not_before(broker, namesrv) -> None:
    await make_topic(namesrv, "TTimer")
    consumer = Consumer("CG_TIMER", namesrv, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("TTimer")
    async with consumer, Producer("PG_TIMER", namesrv) as producer:
        due = now_ms() + 3000
        sent = await producer.send(Message("TTimer", b"later", deliver_time_ms=due))
        await eventually(lambda: broker.timer.pending == 1, msg="the timer taken in")
        assert sent.recall_handle is not None
        handle = decode_handle(sent.recall_handle)
        assert (handle.topic, handle.broker_name, handle.deliver_ms, handle.msg_id) == (
            "TTimer", broker.config.broker_name, due, sent.msg_id)
        await producer.send(Message("TTimer", b"now"))
        [first] = await collect(consumer, 1)
        assert first.body == b"now"
        [second] = await collect(consumer, 1)
        assert second.body == b"later"
        assert second.msg_id == sent.msg_id
        assert second.properties[PROPERTY_TIMER_OUT_MS] == str(due)
        assert second.store_timestamp >= due  # never early
        await eventually(lambda: broker.timer.pending == 0, msg="timer settled")


async def test_relative_delay_property_and_past_time(broker, namesrv) -> None:
    """TIMER_DELAY_SEC in the properties (as RocketMQ 5 clients set it) and a time already
    past (delivered at once, no recall handle: nothing waits)."""
    await make_topic(namesrv, "TTimerRel")
    consumer = Consumer("CG_TIMER_REL", namesrv, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("TTimerRel")
    async with consumer, Producer("PG_TIMER_REL", namesrv) as producer:
        start = now_ms()
        rel = await producer.send(Message("TTimerRel", b"rel",
                                          properties={PROPERTY_TIMER_DELAY_SEC: "1"}))
        past = await producer.send(Message("TTimerRel", b"past", deliver_time_ms=start - 60_000))
        assert rel.recall_handle is not None and past.recall_handle is None
        got = {m.body: m for m in await collect(consumer, 2)}
        assert got[b"past"].store_timestamp < start + 1000  # stored at once
        assert got[b"rel"].store_timestamp >= start + 1000
        assert PROPERTY_TIMER_DELAY_SEC not in got[b"rel"].properties  # not a timer twice


@pytest.mark.parametrize(("props", "words"), [
    ({"TIMER_DELIVER_MS": "soon"}, "TIMER_DELIVER_MS='soon' is not a non-negative integer"),
    ({"TIMER_DELAY_SEC": "-5"}, "TIMER_DELAY_SEC='-5' is not a non-negative integer"),
    ({"TIMER_DELAY_MS": "1.5"}, "TIMER_DELAY_MS='1.5' is not a non-negative integer"),
    ({"TIMER_DELAY_SEC": str(4 * 86400)}, "beyond the broker's timer_max_delay of 259200 s"),
])
async def test_bad_timer_refused_with_its_reason(broker, namesrv, props, words) -> None:
    await make_topic(namesrv, "TTimerBad")
    async with Producer("PG_TIMER_BAD", namesrv, retries=0) as producer:
        with pytest.raises(SendError) as err:
            await producer.send(Message("TTimerBad", b"x", properties=props))
    assert words in str(err.value)
    assert "MESSAGE_ILLEGAL" in str(err.value)
    assert broker.store.max_offset("TTimerBad", 0) + broker.store.max_offset("TTimerBad", 1) == 0
    assert broker.timer.pending == 0


@pytest.mark.slow
async def test_recall_cancels_before_delivery_and_says_why_not(broker, namesrv) -> None:
    await make_topic(namesrv, "TTimerRecall")
    consumer = Consumer("CG_TIMER_RECALL", namesrv, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("TTimerRecall")
    async with consumer, Producer("PG_TIMER_RECALL", namesrv) as producer:
        due = now_ms() + 3000
        gone = await producer.send(Message("TTimerRecall", b"recalled", deliver_time_ms=due))
        kept = await producer.send(Message("TTimerRecall", b"kept", deliver_time_ms=due))
        assert await producer.recall("TTimerRecall", gone.recall_handle) == gone.msg_id
        assert broker.timer.pending == 1
        with pytest.raises(BrokerError) as twice:
            await producer.recall("TTimerRecall", gone.recall_handle)
        assert twice.value.code == ResponseCode.ILLEGAL_OPERATION
        assert "no pending timer message" in twice.value.remark
        forged = encode_handle("TTimerRecall", broker.config.broker_name, due, "0" * 32)
        with pytest.raises(BrokerError, match="no pending timer message"):
            await producer.recall("TTimerRecall", forged)
        with pytest.raises(BrokerError, match="the handle is for topic TTimerRecall, not TOther"):
            await make_topic(namesrv, "TOther")
            await producer.recall("TOther", kept.recall_handle)
        with pytest.raises(ValueError, match="is invalid"):
            await producer.recall("TTimerRecall", "not-a-handle")
        [only] = await collect(consumer, 1)
        assert only.body == b"kept"
        with pytest.raises(BrokerError, match="too late"):
            await producer.recall("TTimerRecall", kept.recall_handle)
        assert await consumer.poll(1.0) is None  # the recalled one never comes


class _Listener(TransactionListener):
    def __init__(self, local: LocalTransactionState, checked: LocalTransactionState) -> None:
        self.local = local
        self.checked = checked
        self.checks = 0

    async def execute_local_transaction(self, msg, arg):
        return self.local

    async def check_local_transaction(self, msg):
        self.checks += 1
        return self.checked


@pytest.mark.slow
async def test_transactional_timer_commit_schedules_rollback_never(broker, namesrv) -> None:
    await make_topic(namesrv, "TTxTimer")
    consumer = Consumer("CG_TX_TIMER", namesrv, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("TTxTimer")
    commit = TransactionProducer("PG_TX_TIMER_C", namesrv,
                                 listener=_Listener(LocalTransactionState.COMMIT_MESSAGE,
                                                    LocalTransactionState.COMMIT_MESSAGE))
    rollback = TransactionProducer("PG_TX_TIMER_R", namesrv,
                                   listener=_Listener(LocalTransactionState.ROLLBACK_MESSAGE,
                                                      LocalTransactionState.ROLLBACK_MESSAGE))
    async with consumer, commit, rollback:
        due = now_ms() + 3000
        await rollback.send_message_in_transaction(Message("TTxTimer", b"never", deliver_time_ms=due))
        res = await commit.send_message_in_transaction(Message("TTxTimer", b"at-due",
                                                               deliver_time_ms=due))
        assert res.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
        await eventually(lambda: broker.tx.pending_count() == 0, msg="both decided")
        # the commit waits (or, on a machine slow enough, has just been delivered); the
        # rollback stored nothing
        assert broker.timer.pending + broker.store.max_offset("TTxTimer", 0) \
            + broker.store.max_offset("TTxTimer", 1) == 1
        [m] = await collect(consumer, 1)
        assert m.body == b"at-due" and m.store_timestamp >= due
        assert await consumer.poll(1.0) is None


@pytest.mark.slow
async def test_transactional_timer_committed_by_check_back_once(broker, namesrv) -> None:
    """The half's END is lost (UNKNOW): the check-back commits it, the timer delivers it once
    at its time, and the half is checked no more (RocketMQ 4.x looped a delayed half through
    the schedule topic and its checks until the maximum)."""
    await make_topic(namesrv, "TTxTimerCheck")
    consumer = Consumer("CG_TX_TIMER_CHECK", namesrv, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("TTxTimerCheck")
    listener = _Listener(LocalTransactionState.UNKNOW, LocalTransactionState.COMMIT_MESSAGE)
    producer = TransactionProducer("PG_TX_TIMER_CHECK", namesrv, listener=listener)
    async with consumer, producer:
        due = now_ms() + 2000
        await producer.send_message_in_transaction(Message("TTxTimerCheck", b"checked",
                                                           deliver_time_ms=due))
        await eventually(lambda: listener.checks >= 1, msg="checked back")
        await eventually(lambda: broker.tx.pending_count() == 0, msg="committed by the check")
        [m] = await collect(consumer, 1)
        assert m.body == b"checked" and m.store_timestamp >= due
        await asyncio.sleep(1.0)  # several check intervals (0.2 s): no more checks come
        assert listener.checks == 1
        assert await consumer.poll(0.5) is None


async def test_transactional_half_with_a_bad_time_is_refused_at_send(broker, namesrv) -> None:
    await make_topic(namesrv, "TTxTimerBad")
    producer = TransactionProducer("PG_TX_TIMER_BAD", namesrv, retries=0, listener=_Listener(
        LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.COMMIT_MESSAGE))
    async with producer:
        with pytest.raises(SendError, match="beyond the broker's timer_max_delay"):
            await producer.send_message_in_transaction(
                Message("TTxTimerBad", b"x", deliver_time_ms=now_ms() + 4 * 86_400_000))
    assert broker.tx.pending_count() == 0


async def test_a_delay_level_wins_over_timer_properties(broker, namesrv) -> None:
    """As in RocketMQ: with DELAY set, the timer properties are dropped and the level's
    time applies (level 1 = 1 s), not the far-away TIMER_DELIVER_MS."""
    await make_topic(namesrv, "TTimerLevel")
    consumer = Consumer("CG_TIMER_LEVEL", namesrv, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("TTimerLevel")
    async with consumer, Producer("PG_TIMER_LEVEL", namesrv) as producer:
        sent = await producer.send(Message("TTimerLevel", b"lvl", delay_level=1, properties={
            "TIMER_DELIVER_MS": str(now_ms() + 3_600_000)}))
        assert sent.recall_handle is None and broker.timer.pending == 0
        [m] = await collect(consumer, 1)
        assert m.body == b"lvl" and "TIMER_DELIVER_MS" not in m.properties
