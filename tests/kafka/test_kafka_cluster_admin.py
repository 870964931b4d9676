"""Admin APIs on a cluster of two broker groups (docs/kafka.md, "Admin APIs"): DescribeCluster
lists every group's node, and CreateTopics, CreatePartitions, the alter APIs and DeleteTopics
act on every group holding the topic, forwarded between masters signed with the cluster
secret; DescribeConfigs answers the same from any node.  Real name server and brokers, the
unmodified kafka-python KafkaAdminClient and confluent-kafka AdminClient (run in threads,
bounded by ``asyncio.wait_for``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic as CNewTopic
from kafka.admin import (
    ConfigResource,
    ConfigResourceType,
    KafkaAdminClient,
    NewPartitions,
    NewTopic,
)
from support.cluster import InProcessCluster
from support.waiting import eventually
from test_kafka_cluster import CLUSTER_KAFKA
from test_kafka_cluster_view import call, metadata
from test_kafka_listener import Wire

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.service.cluster_auth import CLUSTER_ACCESS_KEY

TIMEOUT = 60
SECRET = {"cluster_secret": "kview-secret"}


async def admin_call(port: int, fn: Callable[[KafkaAdminClient], Any]) -> Any:
    def run() -> Any:
        admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=20000)
        try:
            return fn(admin)
        finally:
            admin.close()
    return await asyncio.wait_for(asyncio.to_thread(run), TIMEOUT)


async def two_groups(c: InProcessCluster):
    await c.namesrv()
    a = await c.broker("broker-a", kafka_node_id=1, **CLUSTER_KAFKA, **SECRET)
    b = await c.broker("broker-b", kafka_node_id=2, **CLUSTER_KAFKA, **SECRET)
    for broker in (a, b):
        await eventually(lambda broker=broker: broker.kafka_view.ready()
                         and len(broker.kafka_view.nodes()) == 2, msg="views see both groups")
    return a, b


async def leaders(port: int, topic: str) -> list[int]:
    return [p["leader_id"] for p in (await metadata(port, topic))["partitions"]]


async def seen_by_both(a, b, topic: str, expected: list[int]) -> None:
    async def seen() -> bool:
        return all([await leaders(x.kafka_port, topic) == expected for x in (a, b)])
    await eventually(seen, timeout=20, msg=f"{topic} led by {expected} in both views")


async def test_kafka_python_admin_acts_on_every_group(broker_config: BrokerConfig,
                                                      tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        for broker in (a, b):
            got = await admin_call(broker.kafka_port, lambda adm: adm.describe_cluster())
            assert got["controller_id"] == 1
            assert sorted((n["broker_id"], n["port"]) for n in got["brokers"]) == [
                (1, a.kafka_port), (2, b.kafka_port)]

        await admin_call(b.kafka_port, lambda adm: adm.create_topics(
            [NewTopic("orders", 5, 1)]))
        # Spread over both groups, the lower node id first.
        assert (a.topics.get("orders").read_queue_nums, b.topics.get("orders").read_queue_nums) \
            == (3, 2)
        await seen_by_both(a, b, "orders", [1, 1, 1, 2, 2])

        resource = ConfigResource(ConfigResourceType.TOPIC, "orders",
                                  configs={"retention.ms": "60000"})
        done = await admin_call(a.kafka_port, lambda adm: adm.alter_configs(
            [resource], raise_on_unknown=False))
        assert done["topic"]["orders"] == "OK", done
        assert a.topics.get("orders").retention_ms == b.topics.get("orders").retention_ms == 60000
        for broker in (a, b):
            described = await call(broker.kafka_port, ApiKey.DESCRIBE_CONFIGS, 1, {
                "resources": [{"resource_type": 2, "resource_name": "orders",
                               "configuration_keys": ["retention.ms"]}]})
            [result] = described["results"]
            assert result["error_code"] == 0
            assert [(e["name"], e["value"]) for e in result["configs"]] == [("retention.ms", "60000")]

        await admin_call(b.kafka_port, lambda adm: adm.create_partitions(
            {"orders": NewPartitions(7)}))
        # The new partitions go to the last group: partitions 0-4 keep their queues.
        assert (a.topics.get("orders").read_queue_nums, b.topics.get("orders").read_queue_nums) \
            == (3, 4)
        await seen_by_both(a, b, "orders", [1, 1, 1, 2, 2, 2, 2])

        await admin_call(a.kafka_port, lambda adm: adm.delete_topics(["orders"]))
        assert a.topics.get("orders") is None and b.topics.get("orders") is None


async def test_confluent_admin_creates_and_deletes_across_groups(broker_config: BrokerConfig,
                                                                 tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)

        def create_and_delete(port: int, topic: str, stage: str) -> None:
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
            if stage == "create":
                for f in admin.create_topics([CNewTopic(topic, 4, 1)]).values():
                    f.result(timeout=30)
            else:
                for f in admin.delete_topics([topic]).values():
                    f.result(timeout=30)

        await asyncio.wait_for(asyncio.to_thread(create_and_delete, a.kafka_port, "events",
                                                 "create"), TIMEOUT)
        assert (a.topics.get("events").read_queue_nums, b.topics.get("events").read_queue_nums) \
            == (2, 2)
        await seen_by_both(a, b, "events", [1, 1, 2, 2])
        await asyncio.wait_for(asyncio.to_thread(create_and_delete, b.kafka_port, "events",
                                                 "delete"), TIMEOUT)
        assert a.topics.get("events") is None and b.topics.get("events") is None


async def test_a_forwarded_request_without_the_cluster_signature_is_refused(
        broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        await admin_call(a.kafka_port, lambda adm: adm.create_topics([NewTopic("kept", 2, 1)]))
        wire = await Wire.open(b.kafka_port)
        try:
            for corr, client_id in enumerate((CLUSTER_ACCESS_KEY, f"{CLUSTER_ACCESS_KEY}:00")):
                wire.writer.write(encode_request(ApiKey.DELETE_TOPICS, 4, corr, client_id, {
                    "topic_names": ["kept"], "timeout_ms": 1000}))
                _, answer = decode_response(ApiKey.DELETE_TOPICS, 4, await wire.frame())
                assert answer["responses"][0]["error_code"] == \
                    ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        finally:
            wire.close()
        assert b.topics.get("kept") is not None
