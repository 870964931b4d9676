"""Fixtures for the Kafka listener: a real broker with its Kafka port open.

* ``kafka_config`` — the test settings plus ``kafka_port=0`` (ephemeral) and a short initial
  rebalance delay (groups form in tests without Kafka's 3 s wait).
* ``kafka_broker`` — a started in-process :class:`txbroker.broker.Broker` from ``kafka_config``
  (``.kafka_port`` is the bound port); stopped after the test.
* ``kafka_bootstrap`` — ``"127.0.0.1:<kafka port>"``, what Kafka clients are given.
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
