"""The Kafka admin APIs through unmodified admin clients (kafka-python's KafkaAdminClient,
confluent-kafka's AdminClient on librdkafka) against a real broker with its Kafka listener:
DescribeCluster, DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, CreatePartitions,
DeleteTopics, ListTransactions, DescribeTransactions and DescribeProducers, and their error
paths (docs/kafka.md, "Admin APIs").  kafka-python's client is blocking: each test runs it in
a thread, bounded by ``asyncio.wait_for``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions
from kafka.errors import (
    InvalidConfigurationError,
    InvalidPartitionsError,
    UnknownTopicOrPartitionError,
)

from txbroker.remoting.kafka.apis import ADVERTISED, ApiKey

TIMEOUT = 60


async def _with_admin(bootstrap: str, fn: Callable[[KafkaAdminClient], Any]) -> Any:
    def run() -> Any:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
        try:
            return fn(admin)
        finally:
            admin.close()
    return await asyncio.wait_for(asyncio.to_thread(run), TIMEOUT)


def _topic_configs(admin: KafkaAdminClient, topic: str) -> dict[str, str]:
    [result] = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)],
                                      config_filter="all")
    # kafka-python: {"topic": {name: {config: {"value": ...}}}} in 3.0
    return {k: v["value"] for k, v in result["topic"][topic].items()}


async def test_describe_cluster_names_this_node(kafka_broker, kafka_bootstrap):
    got = await _with_admin(kafka_bootstrap, lambda a: a.describe_cluster())
    assert got["cluster_id"] == kafka_broker.config.cluster_name
    assert got["controller_id"] == 0
    assert [(b["broker_id"], b["port"]) for b in got["brokers"]] == [(0, kafka_broker.kafka_port)]
