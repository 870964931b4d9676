"""Fixed queues against a real broker: ``Consumer.assign`` / ``Consumer.queues`` (RocketMQ's
LitePullConsumer.assign) and ``Producer.send(msg, queue=...)`` (RocketMQ's send(msg, mq))."""

from __future__ import annotations

import pytest
from support.consuming import collect
from support.waiting import eventually

from txbroker.client import Consumer, Message, MessageQueue, Producer
from txbroker.client.admin import AdminClient

FAST = {"long_poll_timeout": 1.0, "rebalance_interval": 0.5, "persist_interval": 0.2}


async def test_send_to_a_queue_stores_every_message_there(broker, namesrv) -> None:
    async with AdminClient(namesrv) as admin:
        await admin.create_topic("TSendQ", 4)
    consumer = Consumer("CG_SENDQ", namesrv, from_where="first", **FAST)
    queues = await consumer.queues("TSendQ")
    assert [q.queue_id for q in queues] == [0, 1, 2, 3]
    async with Producer("PG_SENDQ", namesrv) as producer:
        for i in range(12):
            result = await producer.send(Message("TSendQ", f"m{i}".encode()), queue=queues[2])
            assert result.queue_id == 2
        with pytest.raises(ValueError, match="not a queue of topic"):
            await producer.send(Message("TOther", b"x"), queue=queues[0])
    consumer.subscribe("TSendQ")
    async with consumer:
        got = await collect(consumer, 12)
    assert {m.queue_id for m in got} == {2}
    assert sorted(m.queue_offset for m in got) == list(range(12))


async def test_assigned_members_of_one_group_pull_exactly_their_queues(broker, namesrv) -> None:
    async with AdminClient(namesrv) as admin:
        await admin.create_topic("TAssign", 4)
    a = Consumer("CG_ASSIGN", namesrv, from_where="first", **FAST)
    b = Consumer("CG_ASSIGN", namesrv, from_where="first", **FAST)
    queues = await a.queues("TAssign")
    a.assign(queues[:1])          # uneven on purpose: a rebalance would split 2/2
    b.assign(queues[1:])
    async with Producer("PG_ASSIGN", namesrv) as producer:
        for q in queues:
            for i in range(5):
                await producer.send(Message("TAssign", f"{q.queue_id}-{i}".encode()), queue=q)
    async with a, b:
        got_a, got_b = await collect(a, 5), await collect(b, 15)
        # Two members of one group, rebalance notices flowing: the fixed sets hold.
        await a.rebalance()
        await b.rebalance()
        assert a.assignment() == queues[:1] and b.assignment() == queues[1:]
    assert {m.queue_id for m in got_a} == {0}
    assert {m.queue_id for m in got_b} == {1, 2, 3}
    # Offsets were committed for the group: a new member assigned queue 0 starts after them.
    async with Producer("PG_ASSIGN", namesrv) as producer:
        await producer.send(Message("TAssign", b"after"), queue=queues[0])
    c = Consumer("CG_ASSIGN", namesrv, from_where="first", **FAST)
    c.assign([MessageQueue("TAssign", queues[0].broker_name, 0)])
    async with c:
        got = await collect(c, 1)
        assert [m.body for m in got] == [b"after"]
        await eventually(lambda: c.assignment() == queues[:1], msg="c keeps its one queue")
