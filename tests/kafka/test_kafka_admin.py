"""The Kafka admin APIs through unmodified admin clients (kafka-python's KafkaAdminClient,
confluent-kafka's AdminClient on librdkafka) against a real broker with its Kafka listener:
DescribeCluster, DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, CreatePartitions,
DeleteTopics, ListTransactions, DescribeTransactions and DescribeProducers, and their error
paths (docs/kafka.md, "Admin APIs").  Both admin clients block: each test runs them in a
thread, bounded by ``asyncio.wait_for``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from kafka.admin import (
    AlterConfigOp,
    ConfigResource,
    ConfigResourceType,
    KafkaAdminClient,
    NewPartitions,
    NewTopic,
)
from kafka.errors import InvalidPartitionsError, UnknownTopicOrPartitionError
from support.waiting import eventually

from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode
from txbroker.remoting.command import RemotingCommand
from txbroker.service.topics import TopicManager
from txbroker.store.record import HALF_TOPIC

TIMEOUT = 60


async def _with_admin(bootstrap: str, fn: Callable[[KafkaAdminClient], Any]) -> Any:
    def run() -> Any:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
        try:
            return fn(admin)
        finally:
            admin.close()
    return await asyncio.wait_for(asyncio.to_thread(run), TIMEOUT)


def _configs(admin: KafkaAdminClient, topic: str) -> dict[str, tuple[str, str]]:
    """config name -> (value, source) of every config of the topic."""
    result = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)],
                                    config_filter="all")
    return {k: (v["value"], v["config_source"]) for k, v in result["topic"][topic].items()}


def _alter(admin: KafkaAdminClient, topic: str, configs: dict, **kw) -> str:
    out = admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)],
                              raise_on_unknown=False, **kw)
    return out["topic"][topic]


async def test_describe_cluster_names_this_node(kafka_broker, kafka_bootstrap):
    got = await _with_admin(kafka_bootstrap, lambda a: a.describe_cluster())
    assert got["cluster_id"] == kafka_broker.config.cluster_name
    assert got["controller_id"] == 0
    assert [(b["broker_id"], b["port"]) for b in got["brokers"]] == [(0, kafka_broker.kafka_port)]
    # answered by DescribeCluster itself (kafka-python falls back to Metadata without it)
    assert kafka_broker.metrics.kafka_requests.labels(api="describe_cluster").value == 1


async def test_topic_configs_describe_alter_and_refuse(kafka_broker, kafka_bootstrap):
    broker_ms = str(int(kafka_broker.config.file_reserved_time * 1000))

    def run(admin: KafkaAdminClient) -> dict:
        admin.create_topics([NewTopic("cfg-t", 2, 1)])
        got = {"before": _configs(admin, "cfg-t")}
        # kafka-python uses IncrementalAlterConfigs when the broker offers it
        got["set"] = _alter(admin, "cfg-t", {"retention.ms": "60000"})
        got["after_set"] = _configs(admin, "cfg-t")["retention.ms"]
        # AlterConfigs replaces the whole set (kafka-python sends the modified ones again)
        got["full"] = _alter(admin, "cfg-t", {"retention.ms": "90000"}, incremental=False)
        got["after_full"] = _configs(admin, "cfg-t")["retention.ms"]
        # IncrementalAlterConfigs DELETE returns it to the broker's value
        got["reset"] = _alter(admin, "cfg-t", {"retention.ms": (AlterConfigOp.DELETE, None)})
        got["after_reset"] = _configs(admin, "cfg-t")["retention.ms"]
        got["not_a_number"] = _alter(admin, "cfg-t", {"retention.ms": "soon"})
        got["too_long"] = _alter(admin, "cfg-t", {"retention.ms": str(int(broker_ms) + 1)})
        got["forever"] = _alter(admin, "cfg-t", {"retention.ms": "-1"}, incremental=False)
        got["bytes"] = _alter(admin, "cfg-t", {"retention.bytes": "1000"})
        got["compact"] = _alter(admin, "cfg-t", {"cleanup.policy": "compact"})
        got["unknown"] = _alter(admin, "cfg-t", {"segment.bytes": "1000"})
        got["read_only"] = _alter(admin, "cfg-t", {"max.message.bytes": "1000"})
        got["no_topic"] = _alter(admin, "no-such-topic", {"retention.ms": "1000"})
        got["final"] = _configs(admin, "cfg-t")
        return got

    got = await _with_admin(kafka_bootstrap, run)
    assert got["before"] == {
        "cleanup.policy": ("delete", "DEFAULT_CONFIG"),
        "retention.ms": (broker_ms, "STATIC_BROKER_CONFIG"),
        "retention.bytes": ("-1", "DEFAULT_CONFIG"),
        "max.message.bytes": (str(kafka_broker.config.max_message_size), "STATIC_BROKER_CONFIG")}
    assert got["set"] == "OK" and got["after_set"] == ("60000", "DYNAMIC_TOPIC_CONFIG")
    assert got["full"] == "OK" and got["after_full"] == ("90000", "DYNAMIC_TOPIC_CONFIG")
    assert got["reset"] == "OK" and got["after_reset"] == (broker_ms, "STATIC_BROKER_CONFIG")
    assert "Error 40" in got["not_a_number"] and "Not a number" in got["not_a_number"]
    for key in ("too_long", "forever"):
        assert "Error 40" in got[key] and f"1..{broker_ms}" in got[key], got[key]
    assert "Error 40" in got["bytes"] and "only -1" in got["bytes"]
    assert "Error 40" in got["compact"] and "no compaction" in got["compact"]
    assert "Error 40" in got["unknown"] and "Unknown topic config name: segment.bytes" in got["unknown"]
    assert "Error 40" in got["read_only"] and "read-only" in got["read_only"]
    assert "Error 3" in got["no_topic"]
    assert got["final"]["retention.ms"] == (broker_ms, "STATIC_BROKER_CONFIG")  # no refusal changed it
    # the value is in the topic table on disk, as the rest of the topic's config
    await _with_admin(kafka_bootstrap, lambda a: _alter(a, "cfg-t", {"retention.ms": "120000"}))
    assert TopicManager(kafka_broker.config).get("cfg-t").retention_ms == 120000


async def test_retention_ms_moves_the_start_of_the_partitions(kafka_broker, kafka_bootstrap):
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i in range(3):
            await producer.send_and_wait("ret-t", f"old-{i}".encode(), partition=0)
        await _with_admin(kafka_bootstrap, lambda a: _alter(a, "ret-t", {"retention.ms": "300"}))
        admin = kafka_broker.kafka_admin
        # the records were stored more than 300 ms ago once the pass moves the start past them
        await eventually(lambda: admin.apply_retention() >= 0 and
                         kafka_broker.store.min_offset("ret-t", 0) == 3, timeout=20,
                         msg="retention.ms did not move the partition's start")
        await producer.send_and_wait("ret-t", b"new", partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = TopicPartition("ret-t", 0)
        consumer.assign([tp])
        assert (await consumer.beginning_offsets([tp]))[tp] == 3
        got = await consumer.getmany(tp, timeout_ms=5000)
        assert [r.value for r in got.get(tp, [])] == [b"new"]
    finally:
        await consumer.stop()


async def test_create_partitions_grows_the_topics_queues(kafka_broker, kafka_bootstrap):
    def run(admin: KafkaAdminClient) -> dict:
        admin.create_topics([NewTopic("grow-t", 2, 1)])
        got: dict = {"grow": admin.create_partitions({"grow-t": NewPartitions(5)}).results[0].error_code}
        for label, topic, count in (("shrink", "grow-t", 3), ("same", "grow-t", 5),
                                    ("unknown", "no-such-topic", 3)):
            try:
                admin.create_partitions({topic: NewPartitions(count)})
                got[label] = None
            except (InvalidPartitionsError, UnknownTopicOrPartitionError) as exc:
                got[label] = exc
        got["described"] = len(admin.describe_topics(["grow-t"])[0]["partitions"])
        return got

    got = await _with_admin(kafka_bootstrap, run)
    assert got["grow"] == 0 and got["described"] == 5
    assert isinstance(got["shrink"], InvalidPartitionsError)
    assert "currently has 5 partitions" in str(got["shrink"])
    assert isinstance(got["same"], InvalidPartitionsError)
    assert isinstance(got["unknown"], UnknownTopicOrPartitionError)
    tc = kafka_broker.topics.get("grow-t")
    assert (tc.read_queue_nums, tc.write_queue_nums) == (5, 5)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait("grow-t", b"in-a-new-partition", partition=4)
        assert (meta.partition, meta.offset) == (4, 0)
    finally:
        await producer.stop()


async def test_delete_topics(kafka_broker, kafka_bootstrap):
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait("gone-t", b"x", partition=0)
    finally:
        await producer.stop()
    kafka_broker.store.offsets.set("g1", "gone-t", 0, 1)

    def run(admin: KafkaAdminClient) -> dict:
        got: dict = {"first": admin.delete_topics(["gone-t"])}
        for label, topic in (("again", "gone-t"), ("system", HALF_TOPIC)):
            try:
                admin.delete_topics([topic])
                got[label] = None
            except UnknownTopicOrPartitionError as exc:
                got[label] = exc
        got["listed"] = admin.list_topics()
        return got

    got = await _with_admin(kafka_bootstrap, run)
    assert got["first"]["topics"][0]["error_code"] == 0
    assert isinstance(got["again"], UnknownTopicOrPartitionError)
    assert isinstance(got["system"], UnknownTopicOrPartitionError)
    assert "gone-t" not in got["listed"]
    assert kafka_broker.topics.get("gone-t") is None
    assert kafka_broker.topics.get(HALF_TOPIC) is not None
    assert kafka_broker.store.offsets.get("g1", "gone-t", 0) is None


async def test_transaction_and_producer_admin_apis(kafka_broker, kafka_bootstrap):
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id="adm-tx")
    idem = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    await idem.start()
    try:
        await idem.send_and_wait("txp-t", b"i0", partition=0)
        await idem.send_and_wait("txp-t", b"i1", partition=0)
        await producer.begin_transaction()
        await producer.send_and_wait("txp-t", b"t0", partition=1)

        def run(admin: KafkaAdminClient) -> dict:
            import kafka

            return {"list": admin.list_transactions(),
                    "ongoing": admin.list_transactions(state_filters=["Ongoing"]),
                    "describe": admin.describe_transactions(["adm-tx"]),
                    "producers": admin.describe_producers([kafka.TopicPartition("txp-t", 0),
                                                           kafka.TopicPartition("txp-t", 1)])}

        got = await _with_admin(kafka_bootstrap, run)
        await producer.abort_transaction()
    finally:
        await producer.stop()
        await idem.stop()
    [listed] = got["list"].values()
    assert [(t.transactional_id, t.state) for t in listed] == [("adm-tx", "Ongoing")]
    assert [t.transactional_id for t in next(iter(got["ongoing"].values()))] == ["adm-tx"]
    desc = got["describe"]["adm-tx"]
    assert desc.state == "Ongoing"
    assert {(tp.topic, tp.partition) for tp in desc.topic_partitions} == {("txp-t", 1)}
    by_tp = {(tp.topic, tp.partition): state.active_producers for tp, state in got["producers"].items()}
    [p0] = by_tp[("txp-t", 0)]
    assert (p0.producer_epoch, p0.last_sequence, p0.current_transaction_start_offset) == (0, 1, -1)
    [p1] = by_tp[("txp-t", 1)]
    assert p1.producer_id == desc.producer_id and p1.last_sequence == 0


async def test_librdkafka_admin_client(kafka_broker, kafka_bootstrap):
    confluent = pytest.importorskip("confluent_kafka.admin")

    def run() -> dict:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ResourceType

        admin = confluent.AdminClient({"bootstrap.servers": kafka_bootstrap})

        def one(futures: dict) -> Any:
            [f] = futures.values()
            try:
                return f.result(20)
            except KafkaException as exc:
                return exc.args[0]

        got: dict = {"create": one(admin.create_topics([confluent.NewTopic("rd-t", 2)]))}
        got["cluster"] = admin.describe_cluster().result(20)
        topic = confluent.ConfigResource(ResourceType.TOPIC, "rd-t")
        got["describe"] = {n: e.value for n, e in one(admin.describe_configs([topic])).items()}
        got["unknown"] = one(admin.describe_configs([confluent.ConfigResource(ResourceType.TOPIC, "no-such")]))
        got["set"] = one(admin.incremental_alter_configs([confluent.ConfigResource(
            ResourceType.TOPIC, "rd-t", incremental_configs=[ConfigEntry(
                "retention.ms", "5000", incremental_operation=AlterConfigOpType.SET)])]))
        got["append"] = one(admin.incremental_alter_configs([confluent.ConfigResource(
            ResourceType.TOPIC, "rd-t", incremental_configs=[ConfigEntry(
                "retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND)])]))
        got["retention"] = one(admin.describe_configs([topic]))["retention.ms"].value
        got["grow"] = one(admin.create_partitions([confluent.NewPartitions("rd-t", 3)]))
        got["assign"] = one(admin.create_partitions([confluent.NewPartitions("rd-t", 4, [[7]])]))
        got["shrink"] = one(admin.create_partitions([confluent.NewPartitions("rd-t", 1)]))
        got["delete"] = one(admin.delete_topics(["rd-t"], operation_timeout=10))
        got["delete_again"] = one(admin.delete_topics(["rd-t"], operation_timeout=10))
        return got

    got = await asyncio.wait_for(asyncio.to_thread(run), TIMEOUT)
    assert got["create"] is None
    assert got["cluster"].cluster_id == kafka_broker.config.cluster_name
    assert [n.id for n in got["cluster"].nodes] == [0]
    assert got["describe"]["cleanup.policy"] == "delete"
    assert got["unknown"].code() == 3
    assert got["set"] is None and got["retention"] == "5000"
    assert got["append"].code() == 40 and "append" in got["append"].str()
    assert got["grow"] is None
    assert got["assign"].code() == 39  # INVALID_REPLICA_ASSIGNMENT: broker 7 is not here
    assert got["shrink"].code() == 37
    assert got["delete"] is None and got["delete_again"].code() == 3


async def test_a_rocketmq_topic_update_keeps_the_kafka_retention(kafka_broker, kafka_bootstrap):
    # UPDATE_AND_CREATE_TOPIC carries no retention field: it must not reset retention.ms.
    client = RemotingClient(f"127.0.0.1:{kafka_broker.broker_port}")
    await client.connect()

    async def update(queues: int) -> None:
        resp = await client.invoke(RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": "keep-ret", "readQueueNums": str(queues), "writeQueueNums": str(queues),
            "perm": "6"}), TIMEOUT)
        assert resp.code == 0, resp.remark

    try:
        await update(4)
        await _with_admin(kafka_bootstrap, lambda a: _alter(a, "keep-ret", {"retention.ms": "60000"}))
        await update(8)
    finally:
        await client.close()
    tc = kafka_broker.topics.get("keep-ret")
    assert (tc.read_queue_nums, tc.retention_ms) == (8, 60000)
