"""A secured cluster of two broker groups (Kafka SASL, Kafka ACLs, cluster_secret on both):
CreateTopics sent to one group creates the topic in both, and a transaction over partitions of
both groups commits, its markers delivered to the other group; a group with another
cluster_secret is refused with one log line naming it (docs/security.md, "Kafka SASL",
"Between brokers").  Real name server, brokers on loopback, the unmodified kafka-python admin
client and aiokafka producer logging in with SCRAM."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError
from support.cluster import InProcessCluster
from support.kafka_sasl import users_file
from support.waiting import eventually
from test_kafka_cluster import CLUSTER_KAFKA, TOPIC, keys_by_coordinator, two_groups

from txbroker.config import BrokerConfig
from txbroker.service.users import edit_users

TIMEOUT = 60
MECHS = "SCRAM-SHA-512,SCRAM-SHA-256"
ADMIN, PASSWORD = "alice", "alice-secret"
SECRET = "secured-cluster-secret"
AUTH = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": ADMIN, "sasl_plain_password": PASSWORD}


def secured(broker_config: BrokerConfig, tmp_path: Path) -> BrokerConfig:
    """SASL and ACLs on every Kafka port (alice is an admin), the cluster secret set."""
    path = users_file(tmp_path / "users.json", **{ADMIN: PASSWORD})
    with edit_users(path) as box:
        box[0] = box[0].with_password(ADMIN, PASSWORD, ("admin",))
    return broker_config.replace(kafka_sasl_mechanisms=MECHS, users_file=path,
                                 cluster_secret=SECRET)


async def create_topic(port: int, topic: str, partitions: int) -> None:
    def run() -> None:
        admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=20000,
                                 **AUTH)
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])
        finally:
            admin.close()
    await asyncio.wait_for(asyncio.to_thread(run), TIMEOUT)


async def test_create_topics_and_a_transaction_across_secured_groups(broker_config, tmp_path):
    async with InProcessCluster(secured(broker_config, tmp_path), tmp_path) as c:
        a, b = await two_groups(c)

        # Sent to broker-b (node 2): broker-a's part is forwarded to it first.
        await create_topic(b.kafka_port, "orders", 5)
        assert a.topics.get("orders").write_queue_nums == 3
        assert b.topics.get("orders").write_queue_nums == 2

        async def both_see() -> bool:
            return all([await leaders_sasl(x.kafka_port) == [1, 1, 1, 2, 2] for x in (a, b)])
        await eventually(both_see, timeout=20, msg="orders led by both groups in both views")

        tid = keys_by_coordinator(2)[0]  # coordinated by broker-a; partitions 4-5 are broker-b's
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{b.kafka_port}",
                                    transactional_id=tid, **AUTH)

        async def commit() -> None:
            async with producer.transaction():
                for p in (0, 4, 5):
                    await producer.send_and_wait(TOPIC, f"commit-{p}".encode(), partition=p)
                assert b.kafka_staging.staged_count() == 2

        await asyncio.wait_for(producer.start(), TIMEOUT)
        try:  # the commit waits for the markers: bounded
            await asyncio.wait_for(commit(), TIMEOUT)
        finally:
            await asyncio.wait_for(producer.stop(), TIMEOUT)
        # The markers reached broker-b: its staged records are in its partitions.
        assert [a.store.max_offset(TOPIC, q) for q in range(4)] == [1, 0, 0, 0]
        assert [b.store.max_offset(TOPIC, q) for q in range(2)] == [1, 1]
        assert b.kafka_staging.staged_count() == 0


async def leaders_sasl(port: int) -> list[int]:
    """The leaders of ``orders`` as an authenticated client sees them."""
    def run() -> list[int]:
        admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=20000,
                                 **AUTH)
        try:
            (desc,) = admin.describe_topics(["orders"])
            return [p["leader_id"] for p in sorted(desc["partitions"],
                                                     key=lambda p: p["partition_index"])]
        finally:
            admin.close()
    return await asyncio.wait_for(asyncio.to_thread(run), TIMEOUT)


async def test_a_group_with_another_secret_is_refused_with_one_line(broker_config, tmp_path,
                                                                   caplog) -> None:
    base = secured(broker_config, tmp_path)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", kafka_node_id=1, **CLUSTER_KAFKA)
        b = await c.broker("broker-b", kafka_node_id=2, cluster_secret="another-cluster-secret",
                           **CLUSTER_KAFKA)
        for broker in (a, b):
            await eventually(lambda broker=broker: broker.kafka_view.ready()
                             and len(broker.kafka_view.nodes()) == 2, msg="views see both groups")
        with caplog.at_level(logging.WARNING, "txbroker.kafka"), pytest.raises(KafkaError):
            await create_topic(a.kafka_port, "orders", 4)
        assert b.topics.get("orders") is None
        lines = [r.getMessage() for r in caplog.records
                 if r.getMessage().startswith("logging in to Kafka peer")]
        assert len(lines) == 1, lines
        assert f"127.0.0.1:{b.kafka_port}" in lines[0] and "different cluster_secret" in lines[0]
        assert "another-cluster-secret" not in caplog.text and SECRET not in caplog.text

        # Markers are retried: each attempt is refused, the line is said once.
        caplog.clear()
        with caplog.at_level(logging.WARNING, "txbroker.kafka"):
            for _ in range(3):
                assert not await asyncio.wait_for(a.kafka_txn.markers.send(
                    7, 0, 1, True, {"broker-b": [("orders", 0)]}), TIMEOUT)
        lines = [r.getMessage() for r in caplog.records
                 if r.getMessage().startswith("logging in to Kafka peer")]
        assert len(lines) == 1 and f"127.0.0.1:{b.kafka_port}" in lines[0], lines
        assert "another-cluster-secret" not in caplog.text and SECRET not in caplog.text
