"""OffsetFetch v7's ``require_stable`` (KIP-447; docs/kafka.md, "Consumer groups"): while a
transaction holds offsets of a consumer group and has not set them, a fetch that asks for
stable offsets gets UNSTABLE_OFFSET_COMMIT for those partitions and asks again; otherwise a
consumer that joins (or rejoins after a rebalance) in that window starts from the offset the
commit is about to move, and an exactly-once pipeline processes a batch twice.  Raw requests
against a single broker and a two-group cluster (where the offsets are staged at the group
coordinator), and the unmodified librdkafka consumer (read_committed asks for stable offsets)."""

from __future__ import annotations

import asyncio
import threading

from aiokafka import AIOKafkaProducer, TopicPartition
from confluent_kafka import Consumer
from support.cluster import InProcessCluster
from test_kafka_cluster import TOPIC, keys_by_coordinator, two_groups
from test_kafka_listener import Wire

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.topics import TopicConfig

UNSTABLE = ErrorCode.UNSTABLE_OFFSET_COMMIT


async def fetch(port: int, group: str, topic: str, partitions: list[int], *,
                version: int = 7, stable: bool = True) -> dict[int, tuple[int, int]]:
    """partition -> (committed offset, error code) from one OffsetFetch."""
    body: dict = {"group_id": group, "topics": [{"name": topic, "partition_indexes": partitions}]}
    if version >= 7:
        body["require_stable"] = stable
    wire = await Wire.open(port)
    try:
        answer = await wire.call(ApiKey.OFFSET_FETCH, version, 1, body)
    finally:
        wire.close()
    assert answer["error_code"] == ErrorCode.NONE, answer
    out = {}
    for t in answer["topics"]:
        for p in t["partitions"]:
            if version >= 5:
                assert p["committed_leader_epoch"] == -1
            out[p["partition_index"]] = (p["committed_offset"], p["error_code"])
    return out


async def test_a_transactions_offsets_are_unstable_until_it_ends(kafka_broker) -> None:
    await kafka_broker.topics.create_or_update(TopicConfig("in", 2, 2))
    port = kafka_broker.kafka_port
    producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", transactional_id="stable-1")
    await producer.start()
    try:
        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "g")
        assert await fetch(port, "g", "in", [0, 1]) == {0: (-1, UNSTABLE), 1: (-1, ErrorCode.NONE)}
        # Without require_stable, and below v7, the offset stored now (none yet).
        assert await fetch(port, "g", "in", [0], stable=False) == {0: (-1, ErrorCode.NONE)}
        assert await fetch(port, "g", "in", [0], version=3) == {0: (-1, ErrorCode.NONE)}
        assert await fetch(port, "other", "in", [0]) == {0: (-1, ErrorCode.NONE)}
        await producer.commit_transaction()
        assert await fetch(port, "g", "in", [0]) == {0: (5, ErrorCode.NONE)}
        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({TopicPartition("in", 0): 9}, "g")
        assert await fetch(port, "g", "in", [0], version=6) == {0: (5, ErrorCode.NONE)}
        assert await fetch(port, "g", "in", [0]) == {0: (-1, UNSTABLE)}
        await producer.abort_transaction()
        assert await fetch(port, "g", "in", [0]) == {0: (5, ErrorCode.NONE)}
    finally:
        await producer.stop()


async def test_offsets_staged_at_the_group_coordinator_are_unstable_there(
        broker_config: BrokerConfig, tmp_path) -> None:
    """The transaction is coordinated by broker-a, the consumer group by broker-b, which
    stages the offsets of partition 1 (broker-a's queue) and 5 (its own) until the marker."""
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        tid, group = keys_by_coordinator(2)
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}",
                                    transactional_id=tid)
        await producer.start()
        try:
            await producer.begin_transaction()
            await producer.send_offsets_to_transaction(
                {TopicPartition(TOPIC, p): 10 + p for p in (1, 5)}, group)
            # Partition 0 (broker-a's queue, never committed): -1 as a Kafka client expects,
            # not the 0 a RocketMQ consumer is told for a queue that still holds message 0.
            assert await fetch(b.kafka_port, group, TOPIC, [0, 1, 5]) == {
                0: (-1, ErrorCode.NONE), 1: (-1, UNSTABLE), 5: (-1, UNSTABLE)}
            assert await fetch(b.kafka_port, group, TOPIC, [1, 5], stable=False) == {
                1: (-1, ErrorCode.NONE), 5: (-1, ErrorCode.NONE)}
            await producer.commit_transaction()
        finally:
            await producer.stop()
        assert await fetch(b.kafka_port, group, TOPIC, [1, 5]) == {
            1: (11, ErrorCode.NONE), 5: (15, ErrorCode.NONE)}


async def test_librdkafka_waits_for_the_transaction_before_taking_its_position(
        kafka_broker, kafka_bootstrap) -> None:
    """A read_committed librdkafka consumer joins while a transaction holds its group's offset
    of partition 0 (6): it starts at 6 once the transaction commits, not at the earliest
    record (what it was told, -1, when the broker answered OffsetFetch v3 only)."""
    await kafka_broker.topics.create_or_update(TopicConfig("src", 1, 1))
    plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await plain.start()
    try:
        for n in range(10):
            await plain.send_and_wait("src", f"v{n}".encode(), partition=0)
    finally:
        await plain.stop()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id="stable-2")
    await producer.start()
    got: list[int] = []
    stop = threading.Event()

    def consume() -> None:
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "pipeline",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "isolation.level": "read_committed"})
        try:
            consumer.subscribe(["src"])
            for _ in range(600):  # bounded: 0.1 s a poll, until told to stop
                if stop.is_set():
                    break
                msg = consumer.poll(0.1)
                if msg is not None and msg.error() is None:
                    got.append(msg.offset())
        finally:
            consumer.close()

    try:
        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({TopicPartition("src", 0): 6}, "pipeline")
        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        await asyncio.sleep(3.0)  # it joins, assigns and keeps asking for the offset
        assert got == []
        await producer.commit_transaction()
        for _ in range(200):  # up to 20 s
            if len(got) >= 4:
                break
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.to_thread(thread.join, 15)
    finally:
        stop.set()
        await producer.stop()
    assert got == [6, 7, 8, 9]
