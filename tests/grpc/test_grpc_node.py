"""The unmodified RocketMQ 5.x Node.js client (npm ``rocketmq-client-nodejs`` 1.0.8, driven by
tests/grpc/node5_client.js) against txbroker's gRPC endpoint: normal, FIFO and transactional
sends, commit, rollback, an orphaned transaction whose producer process was SIGKILLed recovered
by a new producer process answering the check-back, one endpoint reaching both groups of a
cluster, and messages crossing protocols: sent by the Node client, read by the txbroker SDK
over remoting and by a Kafka consumer; sent over remoting, read by the Node SimpleConsumer;
the Node PushConsumer, a message it fails given back at once, and a FIFO group's order."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.grpc.conftest import grpc_endpoint, visible
from tests.support.cluster import InProcessCluster, route
from tests.support.consuming import collect
from tests.support.waiting import eventually
from txbroker.broker import Broker
from txbroker.client import Consumer, Message, MessageQueue, Producer
from txbroker.config import BrokerConfig
from txbroker.service.topics import TopicConfig
from txbroker.store.record import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY

pytestmark = pytest.mark.slow


async def test_normal_sends_are_stored_with_their_properties(grpc_broker, node5) -> None:
    events = await node5("send", grpc_endpoint(grpc_broker), "N5Normal", 5, "--tag", "red")
    sent = [e["sent"] for e in events if "sent" in e]
    assert len(sent) == 5
    stored = visible(grpc_broker, "N5Normal")
    assert sorted(m.properties[PROPERTY_UNIQ_KEY] for m in stored) == sorted(sent)
    by_body = {m.body.decode(): m for m in stored}
    assert set(by_body) == {f"m-{i}" for i in range(5)}
    m3 = by_body["m-3"]
    assert m3.properties[PROPERTY_TAGS] == "red" and m3.properties[PROPERTY_KEYS] == "k3"
    assert m3.properties["n"] == "3"


async def test_fifo_messages_of_one_group_share_a_queue_in_order(grpc_broker, node5) -> None:
    await node5("send", grpc_endpoint(grpc_broker), "N5Fifo", 8, "--group", "order-42")
    stored = visible(grpc_broker, "N5Fifo")
    assert len({m.queue_id for m in stored}) == 1
    assert [m.body.decode() for m in sorted(stored, key=lambda m: m.queue_offset)] == \
        [f"m-{i}" for i in range(8)]
    assert all(m.properties["__SHARDINGKEY"] == "order-42" for m in stored)


async def test_committed_transactions_become_visible_rolled_back_never(grpc_broker, node5) -> None:
    endpoint = grpc_endpoint(grpc_broker)
    committed = await node5("tx", endpoint, "N5Tx", 3, "--end", "commit", "--prefix", "c")
    rolled_back = await node5("tx", endpoint, "N5Tx", 3, "--end", "rollback", "--prefix", "r")
    bodies = sorted(m.body.decode() for m in visible(grpc_broker, "N5Tx"))
    assert bodies == ["c-0", "c-1", "c-2"]
    assert grpc_broker.tx.pending_count() == 0
    for events, state in ((committed, "committed"), (rolled_back, "rolled_back")):
        for e in (e for e in events if "half" in e):
            row = grpc_broker.tx.show(e["transaction_id"])
            assert (row["state"], row["source"], row["producer_group"]) == (state, "producer", "N5Tx")


async def test_an_orphaned_transaction_is_recovered_by_a_new_producer(grpc_broker, node5) -> None:
    """The Node producer process dies (SIGKILL) with its halves open; a new Node producer of
    the same topic gets the check-back on its Telemetry stream, and its checker commits."""
    endpoint = grpc_endpoint(grpc_broker)
    doomed = await node5.start("tx", endpoint, "N5Orphan", 2, "--end", "none", "--prefix", "o")
    events = await node5.events_until(doomed, "ended", 2)
    halves = {e["half"] for e in events if "half" in e}
    doomed.kill()
    await doomed.wait()
    assert visible(grpc_broker, "N5Orphan") == []
    assert grpc_broker.tx.pending_count() == 2

    checks = await node5("check", endpoint, "N5Orphan", 2, "--answer", "commit")
    assert {e["check"] for e in checks if "check" in e} >= halves
    # The check-back carries the half's body with a digest the client accepts.
    assert {e["body"] for e in checks if "check" in e} >= {"o-0", "o-1"}
    assert not any(e.get("corrupted") for e in checks)
    await eventually(lambda: len(visible(grpc_broker, "N5Orphan")) == 2, timeout=20)
    assert sorted(m.body.decode() for m in visible(grpc_broker, "N5Orphan")) == ["o-0", "o-1"]
    assert grpc_broker.tx.pending_count() == 0
    for e in (e for e in events if "half" in e):
        assert grpc_broker.tx.show(e["transaction_id"])["source"] == "check"


async def test_one_endpoint_reaches_both_groups_of_a_cluster(grpc_config, tmp_path, node5) -> None:
    """The Node client keeps only the queues whose id is 0 (it compares the queue id with the
    master's broker id), one per broker group of the route: given one group's endpoint, it
    still sends and ends transactions on both groups."""
    async with InProcessCluster(grpc_config, tmp_path) as c:
        ns = await c.namesrv()
        a = await c.broker("broker-a")
        b = await c.broker("broker-b")
        for broker in (a, b):
            await broker.topics.create_or_update(TopicConfig("N5Spread", 2, 2))

        async def both_routed() -> bool:
            got = await route(ns.addr, "N5Spread")
            return got is not None and len(got.broker_datas) == 2

        await eventually(both_routed, msg="both groups routed")

        def stored(broker) -> int:
            return sum(broker.store.max_offset("N5Spread", q) for q in range(2))

        await node5("send", grpc_endpoint(a), "N5Spread", 10)
        assert stored(a) > 0 and stored(b) > 0 and stored(a) + stored(b) == 10
        before = {x: stored(x) for x in (a, b)}
        await node5("tx", grpc_endpoint(a), "N5Spread", 6, "--end", "commit", "--prefix", "t")
        assert a.tx.pending_count() == 0 and b.tx.pending_count() == 0
        committed = {x: stored(x) - before[x] for x in (a, b)}
        assert sum(committed.values()) == 6 and all(committed.values()), committed


@pytest.fixture
def kafka_grpc_config(grpc_config: BrokerConfig) -> BrokerConfig:
    return grpc_config.replace(kafka_port=0, kafka_group_initial_rebalance_delay=0.2)


@pytest.fixture
async def kafka_grpc_broker(kafka_grpc_config: BrokerConfig):
    from txbroker.broker import Broker

    b = Broker(kafka_grpc_config)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


async def kafka_records(bootstrap: str, topic: str, partitions: int, count: int,
                        timeout: float = 20.0) -> list:
    """Up to ``count`` records of the topic's partitions from the earliest offset, bounded."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        out: list = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for records in (await consumer.getmany(*tps, timeout_ms=500)).values():
                out.extend(records)
        return out
    finally:
        await consumer.stop()


async def test_node_messages_are_read_over_remoting_and_kafka(kafka_grpc_broker, node5) -> None:
    """One set of messages from the Node producer (three plain, one committed transaction), read
    by the txbroker SDK's consumer over the 4.x protocol and by aiokafka over Kafka, each with
    the id, tag, key and property the Node client gave it."""
    b = kafka_grpc_broker
    endpoint = grpc_endpoint(b)
    sent = await node5("send", endpoint, "N5Cross", 3, "--tag", "blue")
    txn = await node5("tx", endpoint, "N5Cross", 1, "--end", "commit", "--prefix", "tx",
                      "--tag", "blue")
    ids = {e["sent"]: f"m-{e['i']}" for e in sent if "sent" in e}
    ids.update({e["half"]: f"tx-{e['i']}" for e in txn if "half" in e})
    assert len(ids) == 4

    consumer = Consumer("CG_N5CROSS", b.namesrv_addr, from_where="first", long_poll_timeout=1.0,
                        rebalance_interval=0.5, persist_interval=0.2)
    consumer.subscribe("N5Cross", "blue")
    async with consumer:
        got = await collect(consumer, 4, timeout=20)
    assert {m.msg_id: m.body.decode() for m in got} == ids
    for m in got:
        assert (m.tags, m.keys, m.properties["n"]) == ("blue", f"k{m.properties['n']}", m.properties["n"])

    records = await kafka_records(f"127.0.0.1:{b.kafka_port}", "N5Cross",
                                  b.topics.get("N5Cross").read_queue_nums, 4)
    assert sorted(r.value.decode() for r in records) == sorted(ids.values())
    for r in records:
        headers = {k: v.decode() for k, v in r.headers}
        n = headers["n"]
        assert (r.key.decode(), headers["TAGS"]) == (f"k{n}", "blue")


async def test_remoting_messages_are_read_by_the_node_simple_consumer(grpc_broker, node5) -> None:
    """Messages sent by the txbroker SDK over the 4.x protocol, to every queue of the topic,
    received and acked by the Node SimpleConsumer (which asks for queue 0 only: the broker
    pops the whole topic for it, as the proxy does)."""
    b = grpc_broker
    await b.topics.create_or_update(TopicConfig("N5FromRemoting", 4, 4))
    consumer = await node5.start("receive", grpc_endpoint(b), "N5FromRemoting", "CG_N5SIMPLE", 8,
                                 "--tag", "green")
    await node5.events_until(consumer, "receiving")
    ids = {}
    async with Producer("PG_N5REMOTING", b.namesrv_addr) as producer:
        for i in range(8):
            msg = Message("N5FromRemoting", f"r-{i}".encode(), tags="green", keys=f"k{i}",
                          properties={"n": str(i)})
            result = await producer.send(msg, queue=MessageQueue("N5FromRemoting", b.config.broker_name, i % 4))
            ids[result.msg_id] = f"r-{i}"
    events = await node5.events_until(consumer, "acked", 8)
    got = {e["received"]: e for e in events if "received" in e}
    assert {k: e["body"] for k, e in got.items()} == ids
    for e in got.values():
        n = e["properties"]["n"]
        assert (e["tag"], e["keys"], e["attempt"], e["corrupted"]) == ("green", [f"k{n}"], 1, False)
    assert (await asyncio.wait_for(consumer.wait(), 30)) == 0


async def test_the_node_push_consumer_consumes_what_node_sent(grpc_broker, node5) -> None:
    endpoint = grpc_endpoint(grpc_broker)
    sent = await node5("send", endpoint, "N5Push", 6, "--tag", "pushed")
    events = await node5("push", endpoint, "N5Push", "CG_N5PUSH", 6, "--tag", "pushed")
    consumed = {e["consumed"]: e["body"] for e in events if "consumed" in e}
    assert consumed == {e["sent"]: f"m-{e['i']}" for e in sent if "sent" in e}


async def test_a_message_the_node_push_consumer_fails_comes_back_at_once(grpc_broker, node5) -> None:
    """The Node PushConsumer ignores a customized back-off (the broker's, as the proxy's default
    group retry policy), so it nacks a failed message with ChangeInvisibleDuration(0 ms), which
    the proxy accepts (its lower bound for it is 0): the message is delivered again right away,
    with attempt 2, not after the receive's invisible time."""
    endpoint = grpc_endpoint(grpc_broker)
    await node5("send", endpoint, "N5PushFail", 2, "--tag", "redo")
    events = await node5("push", endpoint, "N5PushFail", "CG_N5PUSHFAIL", 2, "--tag", "redo",
                         "--fail-first", timeout=50)
    failed = {e["failed"]: e["attempt"] for e in events if "failed" in e}
    consumed = {e["consumed"]: e["attempt"] for e in events if "consumed" in e}
    assert set(failed) == set(consumed) and len(consumed) == 2
    assert set(failed.values()) == {1} and set(consumed.values()) == {2}


async def test_the_node_push_consumer_of_a_fifo_group_keeps_each_message_group_in_order(
        grpc_config, node5) -> None:
    """The settings tell the Node PushConsumer its group is FIFO: it consumes each message
    group in the order sent."""
    b = Broker(grpc_config.replace(pop_fifo_groups="CG_N5FIFO"))
    await b.start()
    try:
        endpoint = grpc_endpoint(b)
        for group in ("order-1", "order-2", "order-3"):
            await node5("send", endpoint, "N5FifoPush", 5, "--group", group, "--prefix", group)
        events = await node5("push", endpoint, "N5FifoPush", "CG_N5FIFO", 15)
        consumed = [e for e in events if "consumed" in e]
        assert len(consumed) == 15
        for group in ("order-1", "order-2", "order-3"):
            assert [e["body"] for e in consumed if e["group"] == group] == \
                [f"{group}-{i}" for i in range(5)]
    finally:
        await b.stop()


async def test_a_node_producer_given_several_topics_starts_at_once(grpc_broker, node5) -> None:
    """The Node client starts listening for its settings only after every topic's route came
    back, so an answer sent while a later topic was still being created was missed and its
    start-up waited for its next settings sync, 5 minutes on.  The endpoint answers a settings
    command again a second later: the start-up takes seconds."""
    started = time.monotonic()
    events = await node5("send", grpc_endpoint(grpc_broker), "N5First,N5Second,N5Third", 1)
    assert sum("sent" in e for e in events) == 1
    assert time.monotonic() - started < 30
