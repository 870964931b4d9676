"""A hanging Kafka transaction blocks nobody and is aborted at its timeout.

A producer process opens a transaction (transaction.timeout.ms 2000), has its records
acknowledged, and is SIGKILLed: its transaction is left open.  Another producer's committed
transaction and a plain message are consumable at once — by aiokafka read_committed and
read_uncommitted consumers and by a txbroker SDK consumer — with no wait for the open one
(Kafka would hold read_committed readers at the LSO).  The broker's timeout scan (every 0.2 s
here) aborts it after its 2 s, and none of its records is ever visible, before or after."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from aiokafka import AIOKafkaProducer
from support.consuming import collect
from support.kafka_e2e import read_topic
from support.waiting import eventually

from txbroker.client import Consumer
from txbroker.client.admin import AdminClient

pytestmark = pytest.mark.slow  # the 2 s transaction timeout and a producer process

TOPIC = "hang-orders"
HANGING = """
import asyncio, sys
from aiokafka import AIOKafkaProducer
async def main():
    p = AIOKafkaProducer(bootstrap_servers=sys.argv[1], transactional_id="hanging-tid",
                         transaction_timeout_ms=2000)
    await p.start()
    await p.begin_transaction()
    for n in range(3):
        await (await p.send(sys.argv[2], f"hang-{n}".encode(), partition=0))
    print("open", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


@pytest.fixture
def kafka_config(kafka_config):
    return kafka_config.replace(kafka_transaction_scan_interval=0.2)


def _start_hanging(bootstrap: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HANGING, bootstrap, TOPIC],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


async def _all_values(bootstrap: str) -> tuple[list[str], list[str]]:
    return (await read_topic(bootstrap, TOPIC, "read_committed", 1),
            await read_topic(bootstrap, TOPIC, "read_uncommitted", 1))


async def test_an_open_transaction_delays_nothing_and_is_aborted_at_its_timeout(
        kafka_broker, kafka_bootstrap):
    async with AdminClient(kafka_broker.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, 1)
    hanging = _start_hanging(kafka_bootstrap)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(hanging.stdout.readline), 30)
        assert line.strip() == "open"
    finally:
        hanging.kill()
        hanging.wait(10)
    coordinator = kafka_broker.kafka_txn
    assert coordinator.describe("hanging-tid").state == "Ongoing"

    other = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id="other-tid")
    await other.start()
    try:
        async with other.transaction():
            await other.send(TOPIC, b"committed-1", partition=0)
    finally:
        await other.stop()
    plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await plain.start()
    try:
        await plain.send_and_wait(TOPIC, b"plain-1", partition=0)
    finally:
        await plain.stop()

    # at once, while the other transaction is still open
    committed, uncommitted = await _all_values(kafka_bootstrap)
    assert committed == uncommitted == ["committed-1", "plain-1"]
    assert coordinator.describe("hanging-tid").state == "Ongoing"
    sdk = Consumer("CG_HANG", kafka_broker.namesrv_addr, from_where="first", long_poll_timeout=1.0)
    sdk.subscribe(TOPIC)
    await sdk.start()
    try:
        got = await collect(sdk, 2)
        assert sorted(m.body for m in got) == [b"committed-1", b"plain-1"]
    finally:
        await sdk.shutdown()

    # the timeout scan aborts it after its 2 s; its records never appear
    await eventually(lambda: coordinator.describe("hanging-tid").state in ("CompleteAbort", "Empty"),
                     msg=lambda: f"hanging-tid aborted (now {coordinator.describe('hanging-tid')})")
    assert kafka_broker.metrics.kafka_txn_aborted.labels(reason="timeout").value >= 1
    committed, uncommitted = await _all_values(kafka_bootstrap)
    assert committed == uncommitted == ["committed-1", "plain-1"]
