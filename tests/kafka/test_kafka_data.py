"""Produce, Fetch and ListOffsets with the real clients (aiokafka, kafka-python) and on the raw
wire; cross-protocol delivery both ways with the txbroker SDK."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from support.consuming import collect
from support.waiting import eventually
from test_kafka_listener import Wire

from txbroker.client import Consumer, Message, Producer
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response
from txbroker.remoting.kafka.records import Record, encode_batch, read_batches
from txbroker.service.topics import TopicConfig

WAIT = 10.0


async def _topic(broker, name: str, partitions: int = 1) -> str:
    await broker.topics.create_or_update(TopicConfig(name, partitions, partitions))
    return name


async def _consume(bootstrap: str, topic: str, count: int, **kw) -> list:
    """``count`` records of ``topic`` partition 0 from the earliest offset (bounded)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", **kw)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        out: list = []
        deadline = time.monotonic() + WAIT
        while len(out) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                out.extend(records)
        return out
    finally:
        await consumer.stop()


@pytest.mark.parametrize("acks", [0, 1, "all"])
async def test_aiokafka_produce_each_acks_then_consume(kafka_broker, kafka_bootstrap, acks) -> None:
    topic = await _topic(kafka_broker, f"Acks{acks}".replace("all", "All"))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks=acks)
    await producer.start()
    try:
        futures = [await producer.send(topic, b"v%d" % i, key=b"k%d" % i, partition=0,
                                       headers=[("h", b"%d" % i)]) for i in range(20)]
        metas = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    if acks != 0:
        assert [m.offset for m in metas] == list(range(20))
    await eventually(lambda: kafka_broker.store.max_offset(topic, 0) == 20)
    got = await _consume(kafka_bootstrap, topic, 20)
    assert [(r.offset, r.key, r.value, list(r.headers)) for r in got] == \
        [(i, b"k%d" % i, b"v%d" % i, [("h", b"%d" % i)]) for i in range(20)]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_aiokafka_compressed_batches_are_stored_as_records(kafka_broker, kafka_bootstrap,
                                                                 codec) -> None:
    topic = await _topic(kafka_broker, f"Codec_{codec}")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, compression_type=codec,
                                linger_ms=50)
    await producer.start()
    try:
        futures = [await producer.send(topic, b"compressible %d " % i * 10, partition=0)
                   for i in range(50)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    # Stored one message per record (RocketMQ consumers read them), fetched back uncompressed.
    assert kafka_broker.store.max_offset(topic, 0) == 50
    for isolation in ("read_uncommitted", "read_committed"):
        got = await _consume(kafka_bootstrap, topic, 50, isolation_level=isolation)
        assert [r.value for r in got] == [b"compressible %d " % i * 10 for i in range(50)]


@pytest.mark.parametrize("codec", [None, "gzip"])
async def test_kafka_python_produce_and_consume(kafka_broker, kafka_bootstrap, codec) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    topic = await _topic(kafka_broker, f"KP_{codec}")

    def produce_and_consume() -> list:
        # kafka-python is blocking: it runs in a thread while the broker serves on the loop.
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all",
                                 compression_type=codec, enable_idempotence=False)
        try:
            for i in range(10):
                producer.send(topic, b"kp%d" % i, key=b"k", partition=0, headers=[("n", b"1")])
            producer.flush(timeout=WAIT)
        finally:
            producer.close(timeout=WAIT)
        consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False,
                                 auto_offset_reset="earliest", consumer_timeout_ms=3000,
                                 isolation_level="read_committed")
        try:
            consumer.assign([KTP(topic, 0)])
            out = []
            for rec in consumer:
                out.append(rec)
                if len(out) == 10:
                    break
            return out
        finally:
            consumer.close()

    got = await asyncio.wait_for(asyncio.to_thread(produce_and_consume), 60)
    assert [(r.offset, r.key, r.value, r.headers) for r in got] == \
        [(i, b"k", b"kp%d" % i, [("n", b"1")]) for i in range(10)]


async def test_consumer_from_latest_and_list_offsets_by_timestamp(kafka_broker,
                                                                  kafka_bootstrap) -> None:
    topic = await _topic(kafka_broker, "Times")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False,
                                auto_offset_reset="latest")
    try:
        for i in range(3):
            await producer.send_and_wait(topic, b"early%d" % i, partition=0)
        await asyncio.sleep(0.01)
        between = int(time.time() * 1000)
        await asyncio.sleep(0.01)
        for i in range(2):
            await producer.send_and_wait(topic, b"late%d" % i, partition=0)
        await consumer.start()
        tp = TopicPartition(topic, 0)
        assert await consumer.beginning_offsets([tp]) == {tp: 0}
        assert await consumer.end_offsets([tp]) == {tp: 5}
        found = await consumer.offsets_for_times({tp: between})
        assert found[tp].offset == 3 and found[tp].timestamp >= between
        future = await consumer.offsets_for_times({tp: int(time.time() * 1000) + 60_000})
        assert future[tp] is None
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        assert await consumer.position(tp) == 5
        await producer.send_and_wait(topic, b"after", partition=0)
        got = await consumer.getmany(tp, timeout_ms=int(WAIT * 1000))
        assert [r.value for r in got[tp]] == [b"after"]
    finally:
        await consumer.stop()
        await producer.stop()


async def test_kafka_record_reaches_an_sdk_consumer(kafka_broker, kafka_bootstrap) -> None:
    topic = await _topic(kafka_broker, "ToRocket")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"from kafka", key=b"order-7", partition=0,
                                     headers=[("color", b"red"), ("TAGS", b"tagK")],
                                     timestamp_ms=1_700_000_000_123)
    finally:
        await producer.stop()
    consumer = Consumer("CG_KAFKA_X", kafka_broker.namesrv_addr, from_where="first",
                        long_poll_timeout=1.0, rebalance_interval=0.5)
    consumer.subscribe(topic, "tagK")  # the TAGS header is the tag: filtering works
    await consumer.start()
    try:
        [msg] = await collect(consumer, 1)
    finally:
        await consumer.shutdown()
    assert msg.body == b"from kafka" and msg.keys == "order-7" and msg.tags == "tagK"
    assert msg.properties["color"] == "red" and msg.born_timestamp == 1_700_000_000_123


async def test_sdk_message_reaches_a_kafka_consumer(kafka_broker, kafka_bootstrap) -> None:
    topic = await _topic(kafka_broker, "FromRocket")
    async with Producer("PG_TO_KAFKA", kafka_broker.namesrv_addr) as producer:
        for _ in range(2):
            await producer.send(Message(topic, b"from rocketmq", tags="tg", keys="k1",
                                        properties={"color": "blue"}))
    got = await _consume(kafka_bootstrap, topic, 2)
    assert [r.offset for r in got] == [0, 1]
    rec = got[0]
    assert rec.value == b"from rocketmq" and rec.key == b"k1"
    assert sorted(rec.headers) == [("TAGS", b"tg"), ("color", b"blue")]  # no system property
    assert abs(rec.timestamp - time.time() * 1000) < 60_000


# --- raw wire --------------------------------------------------------------------------------
def _produce(topic: str, partition: int, records: bytes | None, acks: int = -1) -> dict:
    return {"transactional_id": None, "acks": acks, "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": partition, "records": records}]}]}


def _fetch(topic: str, offset: int, *, max_wait_ms: int = 0, isolation: int = 0) -> dict:
    return {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": isolation, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def _batch(*values: bytes) -> bytes:
    now = int(time.time() * 1000)
    return encode_batch(0, [Record(i, now, None, v, []) for i, v in enumerate(values)])


def _partition(answer: dict) -> dict:
    return answer["responses"][0]["partition_responses"][0]


async def test_raw_produce_fetch_and_its_errors(kafka_broker) -> None:
    topic = await _topic(kafka_broker, "Raw")
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        ok = _partition(await wire.call(ApiKey.PRODUCE, 7, 1, _produce(topic, 0, _batch(b"a", b"b"))))
        assert (ok["error_code"], ok["base_offset"], ok["log_append_time_ms"],
                ok["log_start_offset"]) == (0, 0, -1, 0)
        bad = bytearray(_batch(b"c"))
        bad[-1] ^= 0xFF  # the CRC covers the records
        assert _partition(await wire.call(ApiKey.PRODUCE, 7, 2, _produce(topic, 0, bytes(bad))))[
            "error_code"] == ErrorCode.CORRUPT_MESSAGE
        assert _partition(await wire.call(ApiKey.PRODUCE, 7, 3, _produce(topic, 9, _batch(b"d"))))[
            "error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        two = _batch(b"e") + _batch(b"f")
        assert _partition(await wire.call(ApiKey.PRODUCE, 7, 4, _produce(topic, 0, two)))[
            "error_code"] == ErrorCode.INVALID_RECORD
        system = _produce("RMQ_SYS_TRANS_HALF_TOPIC", 0, _batch(b"g"))
        assert _partition(await wire.call(ApiKey.PRODUCE, 7, 5, system))["error_code"] == \
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert kafka_broker.store.max_offset(topic, 0) == 2  # nothing refused was stored
        for isolation, aborted in ((0, None), (1, [])):
            answer = await wire.call(ApiKey.FETCH, 11, 6, _fetch(topic, 1, isolation=isolation))
            assert answer["session_id"] == 0
            part = answer["responses"][0]["partitions"][0]
            assert (part["error_code"], part["high_watermark"], part["last_stable_offset"],
                    part["log_start_offset"], part["aborted_transactions"],
                    part["preferred_read_replica"]) == (0, 2, 2, 0, aborted, -1)
            [batch] = read_batches(part["records"])
            assert batch.base_offset == 1 and batch.producer_id == -1
            assert not batch.is_transactional
            assert [r.value for r in batch.records()] == [b"b"]
        # At the end: empty records, not null (kafka-python cannot read a null there).
        answer = await wire.call(ApiKey.FETCH, 11, 8, _fetch(topic, 2))
        assert answer["responses"][0]["partitions"][0]["records"] == b""
        answer = await wire.call(ApiKey.FETCH, 11, 7, _fetch(topic, 3))
        assert answer["responses"][0]["partitions"][0]["error_code"] == \
            ErrorCode.OFFSET_OUT_OF_RANGE
    finally:
        wire.close()


async def test_acks_zero_has_no_answer(kafka_broker) -> None:
    topic = await _topic(kafka_broker, "NoAck")
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        wire.send(ApiKey.PRODUCE, 7, 1, _produce(topic, 0, _batch(b"x"), acks=0))
        wire.send(ApiKey.API_VERSIONS, 0, 2, {})
        corr, _ = decode_response(ApiKey.API_VERSIONS, 0, await wire.frame())
        assert corr == 2  # the produce was not answered
        assert kafka_broker.store.max_offset(topic, 0) == 1
    finally:
        wire.close()


async def test_long_poll_fetch_is_woken_by_a_produce(kafka_broker) -> None:
    topic = await _topic(kafka_broker, "Woken")
    reader, writer = await Wire.open(kafka_broker.kafka_port), await Wire.open(
        kafka_broker.kafka_port)
    try:
        reader.send(ApiKey.FETCH, 11, 1, _fetch(topic, 0, max_wait_ms=60_000))
        await asyncio.sleep(0.2)
        await writer.call(ApiKey.PRODUCE, 7, 1, _produce(topic, 0, _batch(b"wake")))
        # Answered by the produce, long before the 60 s wait (the frame read is bounded).
        corr, answer = decode_response(ApiKey.FETCH, 11, await reader.frame())
        [batch] = read_batches(answer["responses"][0]["partitions"][0]["records"])
        assert corr == 1 and [r.value for r in batch.records()] == [b"wake"]
    finally:
        reader.close()
        writer.close()
