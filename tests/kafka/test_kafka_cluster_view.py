"""The Kafka view of a cluster offers one numbering or none (docs/kafka.md, "Kafka on a
cluster"): a broker that has not learned every broker group the name servers list answers
LEADER_NOT_AVAILABLE / NOT_LEADER_OR_FOLLOWER / COORDINATOR_NOT_AVAILABLE rather than number
partitions as no other broker does, and two groups never share a Kafka node id.  Real name
server, real brokers (one of them a process that is SIGKILLed), the unmodified aiokafka client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest
from aiokafka import AIOKafkaProducer
from support.cluster import InProcessCluster, cluster_info
from support.waiting import eventually
from test_kafka_cluster import CLUSTER_KAFKA, TOPIC
from test_kafka_listener import Wire
from test_kafka_txn_groups_crash import (
    create_in_group,
    group_process,
    namesrv,
    seen_everywhere,
)

from txbroker.bench.chaos.process import free_port
from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import Record, encode_batch
from txbroker.service.kafka.cluster_view import NodeIdClash
from txbroker.service.topics import TopicConfig

#: The name-server process fixture, shared with the crash tests.
__all__ = ["namesrv"]


async def call(port: int, key: ApiKey, version: int, body: dict) -> dict:
    wire = await Wire.open(port)
    try:
        return await wire.call(key, version, 1, body)
    finally:
        wire.close()


async def metadata(port: int, topic: str) -> dict:
    answer = await call(port, ApiKey.METADATA, 8, {"topics": [{"name": topic}],
                                                    "allow_auto_topic_creation": False})
    return answer["topics"][0]


@pytest.mark.slow
async def test_a_broker_that_never_learned_a_listed_group_offers_no_numbering(
        broker_config: BrokerConfig, tmp_path, broker_process) -> None:
    """broker-b (node 1, 2 queues) registers and freezes (SIGSTOP: its connection to the name
    server stays open, so it stays listed, but it answers nothing); broker-a (node 2, 4 queues)
    starts.  broker-a cannot know broker-b's queues, so it must not answer partitions 0-3 as
    its own (the numbering once broker-b is back is b 0-1, a 2-5).  An idempotent aiokafka
    producer that sends to partition 2 meanwhile lands, once broker-b is back, in broker-a's
    queue 0 — not queue 2."""
    async with InProcessCluster(broker_config, tmp_path) as c:
        ns = await c.namesrv()
        # In a thread: the name server on this loop answers broker-b meanwhile.
        b = await asyncio.to_thread(
            broker_process, tmp_path / "broker-b", namesrv_port=-1, namesrv_addr=ns.addr,
            broker_name="broker-b", broker_port=free_port(), ha_port=free_port(),
            kafka_port=free_port(), kafka_node_id=1, kafka_cluster_refresh_interval=0.1)
        created = await call(b.kafka_port, ApiKey.CREATE_TOPICS, 2, {
            "topics": [{"name": TOPIC, "num_partitions": 2, "replication_factor": -1}],
            "timeout_ms": 5000})
        assert created["topics"][0]["error_code"] == 0, created
        os.kill(b.pid, signal.SIGSTOP)
        try:
            await frozen_b_meets_a(c, b, ns.addr)
        finally:
            os.kill(b.pid, signal.SIGCONT)


async def frozen_b_meets_a(c: InProcessCluster, b, ns_addr: str) -> None:
    """broker-a starts while broker-b is listed but frozen, then broker-b thaws."""
    info = await cluster_info(ns_addr)
    assert "broker-b" in info.broker_addr_table
    a = await c.broker("broker-a", kafka_node_id=2, **CLUSTER_KAFKA)
    await a.topics.create_or_update(TopicConfig(TOPIC, 4, 4))
    await eventually(lambda: a.kafka_view.rounds >= 2 and TOPIC in a.kafka_view.topic_names(),
                     msg="broker-a's view went round with its own topic")
    assert not a.kafka_view.ready() and "broker-b" in a.kafka_view.incomplete
    meta = await metadata(a.kafka_port, TOPIC)
    assert (meta["error_code"], meta["partitions"]) == (ErrorCode.LEADER_NOT_AVAILABLE, [])
    found = await call(a.kafka_port, ApiKey.FIND_COORDINATOR, 1, {"key": "g", "key_type": 0})
    assert found["error_code"] == ErrorCode.COORDINATOR_NOT_AVAILABLE
    produce = await call(a.kafka_port, ApiKey.PRODUCE, 7, {
        "acks": 1, "timeout_ms": 1000, "topic_data": [{"name": TOPIC, "partition_data": [
            {"index": 0, "records": b""}]}]})
    assert produce["responses"][0]["partition_responses"][0]["error_code"] == \
        ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert a.store.max_offset(TOPIC, 0) == 0

    producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}",
                                enable_idempotence=True, request_timeout_ms=30000)

    async def send() -> int:
        await producer.start()  # its producer id waits for the view too (NOT_COORDINATOR)
        return (await producer.send_and_wait(TOPIC, b"to-2", partition=2)).partition

    sent = asyncio.create_task(send())
    try:
        await asyncio.sleep(1.0)  # the producer asks meanwhile and gets nothing to send to
        assert not sent.done()
        assert a.store.max_offset(TOPIC, 2) == 0
        os.kill(b.pid, signal.SIGCONT)  # broker-b answers again: broker-a learns its queues
        await eventually(a.kafka_view.ready, timeout=20, msg="broker-a's view completes")
        meta = await metadata(a.kafka_port, TOPIC)
        assert [(p["partition_index"], p["leader_id"]) for p in meta["partitions"]] == [
            (0, 1), (1, 1), (2, 2), (3, 2), (4, 2), (5, 2)]
        got = await asyncio.wait_for(sent, 30)
    finally:
        sent.cancel()
        with contextlib.suppress(BaseException):
            await sent
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), 10)
    assert got == 2
    # Partition 2 is broker-a's queue 0, the numbering broker-b gives too.
    assert [a.store.max_offset(TOPIC, q) for q in range(4)] == [1, 0, 0, 0]
    b_meta = await metadata(b.kafka_port, TOPIC)
    assert [(p["partition_index"], p["leader_id"]) for p in b_meta["partitions"]] == [
        (p["partition_index"], p["leader_id"]) for p in meta["partitions"]]


async def test_a_second_group_with_the_same_node_id_is_refused(broker_config: BrokerConfig,
                                                               tmp_path, caplog) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", kafka_node_id=1, **CLUSTER_KAFKA)
        with pytest.raises(NodeIdClash) as info:
            await c.broker("broker-b", kafka_node_id=1, **CLUSTER_KAFKA)
        line = str(info.value)
        assert "\n" not in line
        assert "kafka_node_id=1" in line and "broker-a" in line and "broker-b" in line
        assert a.broker_addr in line
        # The refused broker left the cluster; the running one's view is whole again.
        await eventually(lambda: a.kafka_view.ready()
                         and [n.node_id for n in a.kafka_view.nodes()] == [1],
                         msg=lambda: f"broker-a's view: {a.kafka_view.incomplete!r}")


@pytest.mark.slow
async def test_serve_refuses_a_node_id_another_group_has_with_one_line(
        broker_config: BrokerConfig, tmp_path, broker_process) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", kafka_node_id=1, **CLUSTER_KAFKA)
        with pytest.raises(RuntimeError) as info:  # in a thread: broker-a answers meanwhile
            await asyncio.to_thread(broker_process, tmp_path / "b", namesrv_port=-1,
                                    namesrv_addr=c.namesrv_addr, broker_name="broker-b",
                                    kafka_port=0, kafka_node_id=1)
    first = a
    text = str(info.value)
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, text
    assert "kafka_node_id=1" in errors[0] and "broker-a" in errors[0] \
        and first.broker_addr in errors[0], text
    assert "Traceback" not in text


async def test_a_group_added_later_moves_no_partition(broker_config: BrokerConfig,
                                                      tmp_path) -> None:
    """A topic created through Kafka keeps its numbering when a broker group joins, even one
    with a lower node id (it holds no block of the topic): a Produce numbered before the join
    lands in the same queue after it, and one sent to a broker that does not lead the
    partition is refused, not stored."""
    async with InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", kafka_node_id=1, **CLUSTER_KAFKA)
        b = await c.broker("broker-b", kafka_node_id=2, **CLUSTER_KAFKA)
        await eventually(lambda: a.kafka_view.ready() and len(a.kafka_view.nodes()) == 2)
        created = await call(a.kafka_port, ApiKey.CREATE_TOPICS, 2, {
            "topics": [{"name": "kept", "num_partitions": 4, "replication_factor": -1}],
            "timeout_ms": 5000})
        assert created["topics"][0]["error_code"] == 0, created
        zero = await c.broker("broker-0", kafka_node_id=0, **CLUSTER_KAFKA)
        await zero.topics.create_or_update(TopicConfig("other", 2, 2))

        async def numbered() -> bool:
            for x in (a, b, zero):
                if not x.kafka_view.ready() or len(x.kafka_view.nodes()) != 3:
                    return False
                meta = await metadata(x.kafka_port, "kept")
                if [p["leader_id"] for p in meta["partitions"]] != [1, 1, 2, 2]:
                    return False
            return True
        await eventually(numbered, msg="every view has three nodes and kept's old numbering")
        batch = encode_batch(0, [Record(0, 1_700_000_000_000, None, b"x", [])])
        for port, expected in ((b.kafka_port, ErrorCode.NONE),
                               (a.kafka_port, ErrorCode.NOT_LEADER_OR_FOLLOWER),
                               (zero.kafka_port, ErrorCode.NOT_LEADER_OR_FOLLOWER)):
            answer = await call(port, ApiKey.PRODUCE, 7, {
                "acks": 1, "timeout_ms": 1000, "topic_data": [{"name": "kept", "partition_data": [
                    {"index": 2, "records": batch}]}]})
            assert answer["responses"][0]["partition_responses"][0]["error_code"] == expected
        # Partition 2 is broker-b's queue 0, before the join and after it.
        assert [b.store.max_offset("kept", q) for q in range(2)] == [1, 0]
        assert [a.store.max_offset("kept", q) for q in range(2)] == [0, 0]
        assert zero.topics.get("kept") is None


@pytest.mark.slow
async def test_a_restarting_broker_answers_metadata_with_every_topic(broker_process, namesrv,
                                                                     tmp_path) -> None:
    """A broker serves Kafka before its view's first round; a Metadata answer in that window
    used to drop every topic (LEADER_NOT_AVAILABLE, no partitions), so a consumer subscribed
    to one rebalanced, twice, and re-read its committed offsets while its transaction was
    committing newer ones (tests/kafka/test_kafka_eos_groups.py saw inputs processed twice).
    Every Metadata answer while broker-b restarts lists the topic with its partitions."""
    a = group_process(broker_process, tmp_path, "broker-a", 1, namesrv.addr)
    b = group_process(broker_process, tmp_path, "broker-b", 2, namesrv.addr)
    await create_in_group(b, "held-by-b", 2)
    await seen_everywhere([a, b], "held-by-b", [2, 2])
    b.kill()
    answers: list[dict] = []
    restart = asyncio.create_task(asyncio.to_thread(b.start))
    try:
        for _ in range(2000):  # bounded: a connection refused waits 5 ms
            if restart.done():
                break
            try:
                answers.append(await asyncio.wait_for(metadata(b.kafka_port, "held-by-b"), 30))
            except OSError:
                await asyncio.sleep(0.005)
    finally:
        await restart
    assert answers, "no Metadata answer while broker-b started"
    assert all((t["error_code"], len(t["partitions"])) == (ErrorCode.NONE, 2) for t in answers), \
        [(t["error_code"], t["partitions"]) for t in answers]


async def test_a_topic_auto_created_at_two_brokers_at_once_is_numbered_once(
        broker_config: BrokerConfig, tmp_path) -> None:
    """Metadata auto-creates a topic across the cluster, as Kafka does.  It used to create it
    in the asking master's group only: broker-a, asked 50 ms after broker-b and its view a
    round behind, then created the topic in its own group too, and the partitions broker-b's
    clients held were numbered anew (b's queues moved from 0-3 to 4-7; a consumer started in
    between found no partitions and stopped, seen in the README's cluster quick start).  Now
    both answers, and every later one, number the same four partitions."""
    slow_views = {**CLUSTER_KAFKA, "kafka_cluster_refresh_interval": 1.0}
    async with InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", kafka_node_id=1, **slow_views)
        b = await c.broker("broker-b", kafka_node_id=2, **slow_views)
        for x in (a, b):
            await eventually(lambda x=x: x.kafka_view.ready() and len(x.kafka_view.nodes()) == 2,
                             timeout=10)

        async def auto(port: int, delay: float) -> dict:
            await asyncio.sleep(delay)
            answer = await call(port, ApiKey.METADATA, 8, {"topics": [{"name": "fresh"}],
                                                           "allow_auto_topic_creation": True})
            return answer["topics"][0]

        first_b, first_a = await asyncio.gather(auto(b.kafka_port, 0.0), auto(a.kafka_port, 0.05))
        for answer in (first_b, first_a):
            assert answer["error_code"] == ErrorCode.NONE, answer
            assert [p["leader_id"] for p in answer["partitions"]] == [1, 1, 2, 2], answer
        await asyncio.sleep(2.5)  # more rounds: nothing moves
        for port in (a.kafka_port, b.kafka_port):
            later = await metadata(port, "fresh")
            assert [p["leader_id"] for p in later["partitions"]] == [1, 1, 2, 2], later
        assert [x.topics.get("fresh").read_queue_nums for x in (a, b)] == [2, 2]
