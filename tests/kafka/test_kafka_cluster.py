"""Kafka on a cluster: every broker group's master is one Kafka node, a topic's partitions are
its queues across groups, and a partition is served by its group's master only
(docs/kafka.md, "Kafka on a cluster").  Real name server, real brokers, real sockets, the
unmodified aiokafka client."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from support.cluster import InProcessCluster
from support.waiting import eventually
from test_kafka_listener import Wire

from txbroker.config import BrokerConfig, ConfigError
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import Record, encode_batch
from txbroker.service.topics import TopicConfig

TOPIC = "spread"
#: Short refreshes so that the view follows the cluster quickly in tests.
CLUSTER_KAFKA = {"kafka_port": 0, "kafka_cluster_refresh_interval": 0.1,
                 "kafka_group_initial_rebalance_delay": 0.2}


async def two_groups(c: InProcessCluster):
    """broker-a (node 1, 4 queues of TOPIC) and broker-b (node 2, 2 queues), views refreshed."""
    await c.namesrv()
    a = await c.broker("broker-a", kafka_node_id=1, **CLUSTER_KAFKA)
    b = await c.broker("broker-b", kafka_node_id=2, **CLUSTER_KAFKA)
    await a.topics.create_or_update(TopicConfig(TOPIC, 4, 4))
    await b.topics.create_or_update(TopicConfig(TOPIC, 2, 2))
    for broker in (a, b):
        await eventually(lambda broker=broker: len(broker.kafka_view.slots(TOPIC)) == 6
                         and len(broker.kafka_view.nodes()) == 2, msg="views see both groups")
    return a, b


def record(value: bytes) -> Record:
    return Record(0, 1_700_000_000_000, None, value, [])


async def test_metadata_lists_each_group_as_a_node_and_partitions_across_groups(
        broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        for broker in (a, b):
            wire = await Wire.open(broker.kafka_port)
            try:
                answer = await wire.call(ApiKey.METADATA, 8, 1, {
                    "topics": [{"name": TOPIC}], "allow_auto_topic_creation": False})
            finally:
                wire.close()
            assert answer["brokers"] == [
                {"node_id": 1, "host": "127.0.0.1", "port": a.kafka_port, "rack": None},
                {"node_id": 2, "host": "127.0.0.1", "port": b.kafka_port, "rack": None}]
            parts = answer["topics"][0]["partitions"]
            assert [(p["partition_index"], p["leader_id"]) for p in parts] == [
                (0, 1), (1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]


async def test_a_partition_of_another_group_is_not_led_here(broker_config: BrokerConfig,
                                                            tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        batch = encode_batch(0, [record(b"x")])
        wire = await Wire.open(a.kafka_port)
        try:
            answer = await wire.call(ApiKey.PRODUCE, 7, 1, {
                "acks": 1, "timeout_ms": 1000, "topic_data": [{"name": TOPIC, "partition_data": [
                    {"index": 1, "records": batch}, {"index": 4, "records": batch},
                    {"index": 6, "records": batch}]}]})
            fetch = await wire.call(ApiKey.FETCH, 11, 2, {
                "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                "isolation_level": 0, "topics": [{"topic": TOPIC, "partitions": [
                    {"partition": 5, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
        finally:
            wire.close()
        got = {p["index"]: p["error_code"] for p in answer["responses"][0]["partition_responses"]}
        assert got == {1: ErrorCode.NONE, 4: ErrorCode.NOT_LEADER_OR_FOLLOWER,
                       6: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert fetch["responses"][0]["partitions"][0]["error_code"] == \
            ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert a.store.max_offset(TOPIC, 1) == 1  # partition 1 = broker-a's queue 1
        assert b.store.max_offset(TOPIC, 0) == 0  # nothing reached broker-b


async def test_aiokafka_produces_to_every_group_and_consumes_them_back(
        broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}", acks="all")
        await producer.start()
        try:
            for p in range(6):
                await producer.send_and_wait(TOPIC, f"v{p}".encode(), partition=p)
        finally:
            await producer.stop()
        # Partitions 4 and 5 are broker-b's queues 0 and 1: the client went to its node.
        assert [a.store.max_offset(TOPIC, q) for q in range(4)] == [1, 1, 1, 1]
        assert [b.store.max_offset(TOPIC, q) for q in range(2)] == [1, 1]
        consumer = AIOKafkaConsumer(bootstrap_servers=f"127.0.0.1:{b.kafka_port}",
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(TOPIC, p) for p in range(6)])
            got: dict[int, bytes] = {}

            async def all_read() -> bool:
                batches = await consumer.getmany(timeout_ms=200)
                for tp, msgs in batches.items():
                    for m in msgs:
                        got[tp.partition] = m.value
                return len(got) == 6
            await eventually(all_read, msg=lambda: f"read {got}")
        finally:
            await consumer.stop()
        assert got == {p: f"v{p}".encode() for p in range(6)}


def test_kafka_port_on_a_cluster_broker_needs_a_node_id(broker_config: BrokerConfig) -> None:
    with pytest.raises(ConfigError) as info:
        broker_config.replace(namesrv_addr="127.0.0.1:9876", kafka_port=0)
    assert "kafka_node_id" in str(info.value) and "broker-a" in str(info.value)
