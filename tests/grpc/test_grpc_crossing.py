"""Messages crossing protocols: what the unmodified 5.x Python client sends over gRPC (plain and
committed in a transaction) is read by a 4.x-protocol consumer (the txbroker SDK) with its tag,
keys and properties, and by a Kafka consumer (aiokafka, read_committed) with its properties as
headers; a rolled-back one reaches neither."""

from __future__ import annotations

import pytest

from tests.grpc.conftest import grpc_endpoint
from tests.support.consuming import collect
from tests.support.kafka_e2e import read_topic
from txbroker.client import Consumer

pytestmark = pytest.mark.slow
TOPIC = "GCross"


@pytest.fixture
def grpc_config(broker_config):
    return broker_config.replace(grpc_port=0, kafka_port=0)


async def test_grpc_messages_reach_remoting_and_kafka_consumers(grpc_broker, py5) -> None:
    endpoint = grpc_endpoint(grpc_broker)
    await py5("send", endpoint, TOPIC, 3, "--tag", "blue", "--prefix", "plain")
    await py5("tx", endpoint, TOPIC, 2, "--end", "commit", "--prefix", "committed")
    await py5("tx", endpoint, TOPIC, 1, "--end", "rollback", "--prefix", "rolledback")
    expected = {"plain-0", "plain-1", "plain-2", "committed-0", "committed-1"}

    consumer = Consumer("GCrossRemoting", grpc_broker.namesrv_addr, "first",
                        long_poll_timeout=1.0, rebalance_interval=0.5, persist_interval=0.2)
    consumer.subscribe(TOPIC)
    async with consumer:
        got = await collect(consumer, 5)
    assert {m.body.decode() for m in got} == expected
    plain = next(m for m in got if m.body == b"plain-1")
    assert (plain.tags, plain.keys, plain.properties["n"]) == ("blue", "k1", "1")

    partitions = grpc_broker.topics.get(TOPIC).read_queue_nums
    values = await read_topic(f"127.0.0.1:{grpc_broker.kafka_port}", TOPIC, "read_committed",
                              partitions)
    assert sorted(values) == sorted(expected)
