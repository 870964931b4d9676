"""Kafka transactions and idempotent producers through the unmodified clients (aiokafka,
kafka-python) against a real broker: commit, abort, offsets in the transaction, what each
client makes of the BaseOffset -1 a transactional Produce is answered with, and a committed
transaction surviving a SIGKILL of the broker process."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from txbroker.service.topics import TopicConfig

TOPIC = "txt"


@pytest.fixture
async def topic(kafka_broker) -> str:
    await kafka_broker.topics.create_or_update(TopicConfig(TOPIC, 2, 2))
    return TOPIC


async def consume_all(bootstrap: str, topic: str, isolation: str, expect: int,
                      timeout: float = 10.0) -> list[bytes]:
    """Every value of ``topic`` (both partitions) from the start, read until ``expect`` came
    (and once more briefly, so extra records would show)."""
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, isolation_level=isolation,
                         auto_offset_reset="earliest", enable_auto_commit=False, group_id=None)
    await c.start()
    out: list[bytes] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(out) < expect and loop.time() < deadline:
            for msgs in (await c.getmany(timeout_ms=200)).values():
                out += [m.value for m in msgs]
        for msgs in (await c.getmany(timeout_ms=300)).values():
            out += [m.value for m in msgs]
    finally:
        await c.stop()
    return sorted(out)


async def test_aiokafka_commit_and_abort(kafka_bootstrap, kafka_broker, topic):
    p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id="ai-1")
    await p.start()
    try:
        async with p.transaction():
            futs = [await p.send(topic, f"c{i}".encode(), partition=i % 2) for i in range(6)]
            metas = await asyncio.gather(*futs)
        # BaseOffset -1 (placed at commit): aiokafka reports -1 + the record's index
        assert sorted({m.offset for m in metas}) == [-1, 0, 1]
        await p.begin_transaction()
        await p.send_and_wait(topic, b"aborted-1", partition=0)
        await p.send_and_wait(topic, b"aborted-2", partition=1)
        await p.abort_transaction()
    finally:
        await p.stop()
    want = sorted(f"c{i}".encode() for i in range(6))
    assert await consume_all(kafka_bootstrap, topic, "read_committed", 6) == want
    assert await consume_all(kafka_bootstrap, topic, "read_uncommitted", 6) == want
    m = kafka_broker.metrics
    assert m.kafka_txn_committed.value == 1
    assert m.kafka_txn_aborted.labels(reason="client").value == 1


async def test_aiokafka_offsets_in_the_transaction(kafka_bootstrap, kafka_broker, topic):
    p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id="ai-2")
    await p.start()
    try:
        async with p.transaction():
            await p.send_and_wait(topic, b"out", partition=0)
            await p.send_offsets_to_transaction({TopicPartition(topic, 1): 42}, "pipeline")
        assert kafka_broker.store.offsets.get("pipeline", topic, 1) == 42
        await p.begin_transaction()
        await p.send_offsets_to_transaction({TopicPartition(topic, 1): 50}, "pipeline")
        await p.abort_transaction()
    finally:
        await p.stop()
    assert kafka_broker.store.offsets.get("pipeline", topic, 1) == 42


async def test_aiokafka_second_instance_fences_the_first(kafka_bootstrap, kafka_broker, topic):
    old = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id="ai-3")
    new = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id="ai-3")
    await old.start()
    try:
        await old.begin_transaction()
        await old.send_and_wait(topic, b"zombie", partition=0)
        await new.start()
        async with new.transaction():
            await new.send_and_wait(topic, b"fresh", partition=0)
        with pytest.raises(Exception):  # noqa: B017 - aiokafka raises its fenced error
            await old.commit_transaction()
    finally:
        await new.stop()
        await old.stop()
    assert await consume_all(kafka_bootstrap, topic, "read_committed", 1) == [b"fresh"]
    assert kafka_broker.metrics.kafka_producers_fenced.value == 1


async def test_aiokafka_idempotent_producer(kafka_bootstrap, kafka_broker, topic):
    p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await p.start()
    try:
        metas = [await p.send_and_wait(topic, f"i{i}".encode(), partition=0) for i in range(5)]
    finally:
        await p.stop()
    assert [m.offset for m in metas] == list(range(5))
    assert await consume_all(kafka_bootstrap, topic, "read_uncommitted", 5) == sorted(
        f"i{i}".encode() for i in range(5))


def _kafka_python_transactions(bootstrap: str, topic: str) -> list[int]:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="kp-1")
    try:
        p.init_transactions()
        p.begin_transaction()
        futs = [p.send(topic, f"k{i}".encode(), partition=i % 2) for i in range(4)]
        p.commit_transaction()
        offsets = [f.get(timeout=10).offset for f in futs]
        p.begin_transaction()
        p.send(topic, b"kp-aborted", partition=0).get(timeout=10)
        p.abort_transaction()
    finally:
        p.close(timeout=5)
    return offsets


async def test_kafka_python_commit_and_abort(kafka_bootstrap, kafka_broker, topic):
    offsets = await asyncio.to_thread(_kafka_python_transactions, kafka_bootstrap, topic)
    assert offsets == [-1, -1, -1, -1]  # kafka-python keeps BaseOffset -1 for every record
    assert await consume_all(kafka_bootstrap, topic, "read_committed", 4) == sorted(
        f"k{i}".encode() for i in range(4))
    v = kafka_broker.kafka_txn.describe("kp-1")
    assert v.state == "CompleteAbort" and v.partitions == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_committed_transaction_survives_sigkill(broker_process):
    port = _free_port()
    bp = broker_process(kafka_port=port, offset_persist_interval=3600.0)
    bootstrap = f"127.0.0.1:{port}"
    plain = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await plain.start()
    try:
        await plain.send_and_wait(TOPIC, b"plain")  # creates the topic
    finally:
        await plain.stop()
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="survivor")
    await p.start()
    try:
        async with p.transaction():
            for i in range(20):
                await p.send(TOPIC, f"t{i}".encode(), partition=0)
            await p.send_offsets_to_transaction({TopicPartition(TOPIC, 0): 7}, "g1")
    finally:
        await p.stop()
    bp.kill()  # SIGKILL: the offset table was never persisted (interval one hour)
    bp.start()
    want = sorted([b"plain"] + [f"t{i}".encode() for i in range(20)])
    assert await consume_all(bootstrap, TOPIC, "read_committed", 21) == want
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id="g1", enable_auto_commit=False)
    await c.start()
    try:
        assert await c.committed(TopicPartition(TOPIC, 0)) == 7
    finally:
        await c.stop()
