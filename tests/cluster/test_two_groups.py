"""Two broker groups behind one name server: the route of a topic lists both groups
(brokerDatas and queueDatas), and the SDK, given only the name-server address, sends to and
consumes from both."""

from __future__ import annotations

from support.cluster import InProcessCluster, route
from support.consuming import collect
from support.waiting import eventually

from txbroker.client import Consumer, Message, Producer
from txbroker.service.topics import TopicConfig

TOPIC = "Spread"


async def test_route_lists_both_groups_and_the_sdk_uses_both(broker_config, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        ns = await c.namesrv()
        a = await c.broker("broker-a")
        b = await c.broker("broker-b")
        for broker in (a, b):
            await broker.topics.create_or_update(TopicConfig(TOPIC, 2, 2))

        async def both_routed() -> bool:
            got = await route(ns.addr, TOPIC)
            return got is not None and len(got.broker_datas) == 2

        await eventually(both_routed, msg="both groups routed")
        got = await route(ns.addr, TOPIC)
        assert {bd.broker_name: bd.broker_addrs for bd in got.broker_datas} == {
            "broker-a": {0: a.broker_addr}, "broker-b": {0: b.broker_addr}}
        assert sorted((q.broker_name, q.write_queue_nums) for q in got.queue_datas) == [
            ("broker-a", 2), ("broker-b", 2)]

        sent_to: dict[str, int] = {}
        async with Producer("PG_SPREAD", ns.addr) as producer:
            for i in range(20):
                result = await producer.send(Message(TOPIC, b"m%d" % i))
                sent_to[result.broker_name] = sent_to.get(result.broker_name, 0) + 1
        assert set(sent_to) == {"broker-a", "broker-b"}, sent_to
        for broker in (a, b):  # the messages really are stored on each broker
            stored = sum(broker.store.max_offset(TOPIC, q) for q in range(2))
            assert stored == sent_to[broker.config.broker_name]

        consumer = Consumer("CG_SPREAD", ns.addr, "first", long_poll_timeout=1.0,
                            rebalance_interval=0.5, persist_interval=0.2)
        consumer.subscribe(TOPIC)
        async with consumer:
            got_msgs = await collect(consumer, 20)
        assert sorted(m.body for m in got_msgs) == sorted(b"m%d" % i for i in range(20))
