"""Fixtures for the Kafka listener: a real broker with its Kafka port open.

* ``kafka_config`` — the test settings plus ``kafka_port=0`` (ephemeral) and a short initial
  rebalance delay (groups form in tests without Kafka's 3 s wait).
* ``kafka_broker`` — a started in-process :class:`txbroker.broker.Broker` from ``kafka_config``
  (``.kafka_port`` is the bound port); stopped after the test.
* ``kafka_bootstrap`` — ``"127.0.0.1:<kafka port>"``, what Kafka clients are given.
* ``group_clock``, ``group_node`` — a manual wall clock and a store + durable group coordinator
  on it (tests/support/kafka_groups.py), restartable on the same data directory.
"""

from __future__ import annotations

import pytest

from txbroker.config import BrokerConfig

KAFKA_SETTINGS = {"kafka_port": 0, "kafka_group_initial_rebalance_delay": 0.2}


@pytest.fixture
def kafka_config(broker_config: BrokerConfig) -> BrokerConfig:
    return broker_config.replace(**KAFKA_SETTINGS)


@pytest.fixture
async def kafka_broker(kafka_config: BrokerConfig):
    from txbroker.broker import Broker

    b = Broker(kafka_config)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


@pytest.fixture
def kafka_bootstrap(kafka_broker) -> str:
    return f"127.0.0.1:{kafka_broker.kafka_port}"


@pytest.fixture
def group_clock():
    from support.kafka_groups import Clock

    return Clock()


@pytest.fixture
async def group_node(broker_config: BrokerConfig, group_clock):
    from support.kafka_groups import Node

    n = Node(broker_config.replace(kafka_group_initial_rebalance_delay=0.0), group_clock)
    await n.open()
    try:
        yield n
    finally:
        await n.close()
