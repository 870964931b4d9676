"""Consumer against a real broker: group rebalancing, offsets, start positions, tags, polling."""

from __future__ import annotations

import asyncio
import time

import pytest
from support.consuming import collect
from support.waiting import eventually

from txbroker.client import Consumer, Message, Producer
from txbroker.client.admin import AdminClient
from txbroker.client.errors import ClientStateError, TopicNotFoundError

FAST = {"long_poll_timeout": 1.0, "rebalance_interval": 0.5, "persist_interval": 0.2}


async def _send(namesrv: str, topic: str, bodies: list[bytes], **kw) -> None:
    async with Producer("PG_C", namesrv) as producer:
        for b in bodies:
            await producer.send(Message(topic, b, **kw))


async def _create(namesrv: str, *topics: str) -> None:
    """Consuming needs the topic to exist (a consumer never creates one)."""
    async with AdminClient(namesrv) as admin:
        for topic in topics:
            await admin.create_topic(topic, 4)


def _consumer(namesrv: str, group: str, topic: str, expression: str = "*", **kw) -> Consumer:
    consumer = Consumer(group, namesrv, **{**FAST, **kw})
    consumer.subscribe(topic, expression)
    return consumer


async def test_two_members_split_queues_and_rebalance_when_one_leaves(broker, namesrv) -> None:
    async with AdminClient(namesrv) as admin:
        await admin.create_topic("TGroup", 4)
    a = _consumer(namesrv, "CG_SPLIT", "TGroup", from_where="first")
    b = _consumer(namesrv, "CG_SPLIT", "TGroup", from_where="first")
    await a.start()
    assert len(a.assignment()) == 4  # alone: every queue
    await b.start()
    try:
        def split() -> bool:
            qa = {q.queue_id for q in a.assignment()}
            qb = {q.queue_id for q in b.assignment()}
            return len(qa) == 2 and len(qb) == 2 and qa | qb == {0, 1, 2, 3}

        await eventually(split, msg="queues split 2/2")
        await _send(namesrv, "TGroup", [f"m{i}".encode() for i in range(8)])
        got_a, got_b = await asyncio.gather(collect(a, 4), collect(b, 4))
        assert {m.queue_id for m in got_a}.isdisjoint({m.queue_id for m in got_b})
        assert sorted(m.body for m in got_a + got_b) == sorted(f"m{i}".encode() for i in range(8))
        await b.shutdown()  # leaves: commits its offsets, unregisters; the broker notifies a
        await eventually(lambda: len(a.assignment()) == 4, msg="a takes every queue")
        await _send(namesrv, "TGroup", [f"n{i}".encode() for i in range(8)])
        got = await collect(a, 8)
        # b's offsets were committed at its shutdown, so nothing of the first round comes back
        assert sorted(m.body for m in got) == sorted(f"n{i}".encode() for i in range(8))
    finally:
        await a.shutdown()
        await b.shutdown()


async def test_offsets_committed_at_shutdown_and_resumed(broker, namesrv) -> None:
    await _send(namesrv, "TOff", [f"{i}".encode() for i in range(6)], tags="t")
    first = _consumer(namesrv, "CG_OFF", "TOff", from_where="first")
    async with first:
        got = await collect(first, 3)
    second = _consumer(namesrv, "CG_OFF", "TOff", from_where="first")
    async with second:
        rest = await collect(second, 3)
        assert await second.poll(0.3) is None
    assert sorted(m.body for m in got + rest) == [f"{i}".encode() for i in range(6)]


async def test_unacknowledged_message_is_redelivered_after_an_error(broker, namesrv) -> None:
    await _send(namesrv, "TRedo", [b"only"])
    consumer = _consumer(namesrv, "CG_REDO", "TRedo", from_where="first")
    with pytest.raises(RuntimeError):
        async with consumer:
            async for msg in consumer:
                assert msg.body == b"only"
                raise RuntimeError("processing failed")
    again = _consumer(namesrv, "CG_REDO", "TRedo", from_where="first")
    async with again:
        [msg] = await collect(again, 1)  # at-least-once: delivered again
        assert msg.body == b"only"


async def test_start_positions_last_first_timestamp(broker, namesrv) -> None:
    await _send(namesrv, "TPos", [b"old1", b"old2"])
    # Time passing is what this needs: store timestamps have ms resolution, so "cut" is kept
    # clear of both sides.
    await asyncio.sleep(0.05)
    cut = time.time()
    await asyncio.sleep(0.05)
    await _send(namesrv, "TPos", [b"mid"])
    last = _consumer(namesrv, "CG_LAST", "TPos", from_where="last")
    first = _consumer(namesrv, "CG_FIRST", "TPos", from_where="first")
    stamp = _consumer(namesrv, "CG_TS", "TPos", from_where=cut)
    async with last, first, stamp:
        await _send(namesrv, "TPos", [b"new"])
        assert [m.body for m in await collect(last, 1)] == [b"new"]
        assert await last.poll(0.3) is None
        assert sorted(m.body for m in await collect(first, 4)) == [b"mid", b"new", b"old1", b"old2"]
        assert sorted(m.body for m in await collect(stamp, 2)) == [b"mid", b"new"]


async def test_tag_expression_and_async_iteration(broker, namesrv) -> None:
    await _create(namesrv, "TTags")
    consumer = _consumer(namesrv, "CG_TAGS", "TTags", "TagA || TagC", from_where="first")
    async with consumer:
        for tag in ("TagA", "TagB", "TagC", "TagB"):
            await _send(namesrv, "TTags", [tag.encode()], tags=tag)
        seen = []
        async for msg in consumer:
            seen.append(msg.tags)
            if len(seen) == 2:
                break
        assert sorted(seen) == ["TagA", "TagC"]
        assert await consumer.poll(0.3) is None


async def test_poll_and_lifecycle_errors(broker, namesrv) -> None:
    consumer = Consumer("CG_LIFE", namesrv)
    with pytest.raises(ClientStateError, match="subscribe"):
        await consumer.start()
    consumer.subscribe("TLife")
    with pytest.raises(ClientStateError):
        await consumer.poll(0.1)
    await _create(namesrv, "TLife")
    await consumer.start()
    t0 = time.monotonic()
    assert await consumer.poll(0.2) is None
    assert time.monotonic() - t0 < 5
    waiter = asyncio.create_task(consumer.poll())
    # the poll is waiting on the consumer's buffer (DeliveryBuffer keeps its waiters in _getters)
    await eventually(lambda: consumer._buffer._getters, 5, "poll() waiting")
    await consumer.shutdown()
    assert await asyncio.wait_for(waiter, 5) is None  # shutdown wakes a waiting poll
    for bad in ({"from_where": "middle"}, {"pull_batch_size": 0}, {"long_poll_timeout": 0}):
        with pytest.raises(ValueError):
            Consumer("G", namesrv, **bad)
    with pytest.raises(ValueError):  # no tag at all; "A || " is {A}, as in RocketMQ
        consumer.subscribe("TLife", "||")


async def test_consumer_survives_dropped_connections(broker, namesrv) -> None:
    await _create(namesrv, "TDrop")
    consumer = _consumer(namesrv, "CG_DROP", "TDrop", from_where="first")
    async with consumer:
        await _send(namesrv, "TDrop", [b"before"])
        assert [m.body for m in await collect(consumer, 1)] == [b"before"]
        for conn in list(broker.server.connections):
            conn.close()  # the broker forgets every registration made on them
        await eventually(lambda: consumer.client_id in broker.registry.consumer_ids("CG_DROP"),
                         msg="consumer registered again")
        await _send(namesrv, "TDrop", [b"after"])
        got = await collect(consumer, 1)
        assert [m.body for m in got] == [b"after"]


async def test_subscribe_while_running(broker, namesrv) -> None:
    await _create(namesrv, "TLateA")
    consumer = _consumer(namesrv, "CG_LATE", "TLateA", from_where="first")
    async with consumer:
        await _send(namesrv, "TLateB", [b"b"])
        consumer.subscribe("TLateB")
        await eventually(lambda: any(q.topic == "TLateB" for q in consumer.assignment()),
                         msg="queues of the new topic assigned")
        [msg] = await collect(consumer, 1)
        assert msg.topic == "TLateB" and msg.body == b"b"


async def test_offsets_committed_periodically(broker, namesrv) -> None:
    await _send(namesrv, "TPeriodic", [f"{i}".encode() for i in range(4)])
    consumer = _consumer(namesrv, "CG_PERIODIC", "TPeriodic", from_where="first")

    def committed() -> int:
        return sum(broker.store.offsets.get("CG_PERIODIC", "TPeriodic", q) or 0 for q in range(4))

    async with consumer:
        await collect(consumer, 4)
        assert await consumer.poll(0.05) is None  # acknowledges the fourth
        # persist_interval 0.2 s: committed while still running, not only at shutdown
        await eventually(lambda: committed() == 4, msg="offsets committed while running")


async def test_offset_beyond_the_queue_is_corrected(broker, namesrv, broker_client) -> None:
    from txbroker.remoting.codes import RequestCode, ResponseCode
    from txbroker.remoting.command import RemotingCommand

    async with AdminClient(namesrv) as admin:
        await admin.create_topic("TMoved", 1)
    await _send(namesrv, "TMoved", [b"a", b"b"])
    # a committed offset far past the end (a restored backup, a wiped store...)
    resp = await broker_client.invoke(RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "CG_MOVED", "topic": "TMoved", "queueId": "0", "commitOffset": "1000"}), 5)
    assert resp.code == ResponseCode.SUCCESS
    consumer = _consumer(namesrv, "CG_MOVED", "TMoved", from_where="first")
    async with consumer:
        await _send(namesrv, "TMoved", [b"c"])
        # PULL_OFFSET_MOVED moves the consumer to where the broker says, and it goes on
        got = await collect(consumer, 1)
        assert [m.body for m in got] == [b"c"]  # moved to the end (max offset), as RocketMQ does


async def test_subscribing_to_a_missing_topic_raises_and_creates_nothing(broker, namesrv) -> None:
    consumer = _consumer(namesrv, "CG_MISSING", "NoSuchTopic", from_where="first")
    with pytest.raises(TopicNotFoundError, match=f"^no such topic 'NoSuchTopic' at {namesrv}$") as info:
        await consumer.start()
    assert info.value.topic == "NoSuchTopic" and info.value.namesrv == namesrv
    assert broker.topics.get("NoSuchTopic") is None
    # nothing registered either: no member, no retry topic for the group, no connection left
    assert broker.registry.consumer_ids("CG_MISSING") == []
    assert broker.topics.get("%RETRY%CG_MISSING") is None
    await eventually(lambda: not broker.server.connections, msg="connections closed")
    # once the topic exists the same consumer starts
    await _create(namesrv, "NoSuchTopic")
    async with consumer:
        await _send(namesrv, "NoSuchTopic", [b"here"])
        assert [m.body for m in await collect(consumer, 1)] == [b"here"]
