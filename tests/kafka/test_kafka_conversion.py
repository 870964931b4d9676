"""Reading stored messages as Kafka records (docs/kafka.md, "Record mapping"): a message that
cannot be converted is delivered as stored with a marker header and never stops its partition,
and headers come back in the order they were produced, duplicates and binary ones included."""

from __future__ import annotations

import asyncio
import time
import zlib

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as SyncTopicPartition

from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import SendMessageRequestHeader
from txbroker.remoting.kafka.records import Record
from txbroker.service.kafka.mapping import (
    CONVERSION_ERROR_HEADER,
    message_to_record,
    record_to_message,
)
from txbroker.service.topics import TopicConfig
from txbroker.store.record import (
    COMPRESSED_FLAG,
    Message,
    decode_record,
    encode_record,
    properties_to_string,
)

WAIT = 15.0


async def _topic(broker, name: str) -> str:
    await broker.topics.create_or_update(TopicConfig(name, 1, 1))
    return name


async def _aiokafka_records(bootstrap: str, topic: str, count: int) -> list:
    """Up to ``count`` records of partition 0 from the earliest offset, bounded in time."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        out: list = []
        deadline = time.monotonic() + WAIT
        while len(out) < count and time.monotonic() < deadline:
            got = await consumer.getmany(tp, timeout_ms=500)
            out.extend(got.get(tp, []))
        return out
    finally:
        await consumer.stop()


def _kafka_python_records(bootstrap: str, topic: str, count: int) -> list:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=int(WAIT * 1000))
    try:
        tp = SyncTopicPartition(topic, 0)
        consumer.assign([tp])
        out: list = []
        deadline = time.monotonic() + WAIT
        while len(out) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                out.extend(records)
        return out
    finally:
        consumer.close()


async def _send_rocketmq(addr: str, topic: str, body: bytes, *, sys_flag: int = 0) -> None:
    """SEND_MESSAGE as a RocketMQ client sends it, with the sys flag given (0x1: compressed)."""
    ext = SendMessageRequestHeader(
        producer_group="PG_POISON", topic=topic, default_topic_queue_nums=1, queue_id=0,
        sys_flag=sys_flag, born_timestamp=int(time.time() * 1000), flag=0,
        properties=properties_to_string({"WAIT": "true", "color": "red"})).to_ext()
    client = RemotingClient(addr)
    try:
        resp = await client.invoke(RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, body), 10.0)
    finally:
        await client.close()
    assert resp.code == ResponseCode.SUCCESS, resp.remark


# --- item: a message that cannot be converted -------------------------------------------------
async def test_kafka_consumers_read_past_poison_messages_written_through_rocketmq(
        kafka_broker, kafka_bootstrap) -> None:
    topic = await _topic(kafka_broker, "Poison")
    addr = kafka_broker.broker_addr
    bomb = zlib.compress(bytes(16 * 1024 * 1024), 9)  # inflates past max_message_size
    await _send_rocketmq(addr, topic, b"before")
    await _send_rocketmq(addr, topic, b"not a zlib stream", sys_flag=COMPRESSED_FLAG)
    await _send_rocketmq(addr, topic, bomb, sys_flag=COMPRESSED_FLAG)
    await _send_rocketmq(addr, topic, zlib.compress(b"inflated"), sys_flag=COMPRESSED_FLAG)
    await _send_rocketmq(addr, topic, b"after")

    for got in (await _aiokafka_records(kafka_bootstrap, topic, 5),
                await asyncio.to_thread(_kafka_python_records, kafka_bootstrap, topic, 5)):
        assert [r.offset for r in got] == [0, 1, 2, 3, 4]
        assert [r.value for r in got] == [b"before", b"not a zlib stream", bomb, b"inflated",
                                          b"after"]
        marks = [dict(r.headers).get(CONVERSION_ERROR_HEADER) for r in got]
        assert marks[0] is None and marks[3] is None and marks[4] is None
        assert b"does not inflate" in marks[1]
        assert b"inflates past" in marks[2]
        assert dict(got[1].headers)["color"] == b"red"  # the rest of the message is converted
    assert kafka_broker.store.max_offset(topic, 0) == 5


# --- item: header order ----------------------------------------------------------------------
MIXED = [("a", b"1"), ("bin", b"\xff\x00"), ("b", b"2"), ("a", b"dup"), ("empty", b""),
         ("c", b"3"), ("DELAY", b"3"), ("a", b"1")]


def _round_trip(headers: list) -> list:
    msg = record_to_message("T", 0, Record(0, 5, None, b"v", headers), born_host=("127.0.0.1", 1))
    raw = encode_record(msg, physical_offset=0, queue_offset=0, store_timestamp=6,
                        store_host=("127.0.0.1", 10911))
    return message_to_record(decode_record(raw), 0).headers


@pytest.mark.parametrize("headers", [
    MIXED,
    [("plain", b"x"), ("other", b"y")],
    [("bin", b"\xff"), ("plain", b"x")],
    [("dup", b"1"), ("dup", b"1"), ("dup", b"2")],
    [("null", None), ("x", b"1"), ("TAGS", b"t"), ("KEYS", b"k")],
])
def test_headers_come_back_in_produced_order(headers: list) -> None:
    assert _round_trip(headers) == headers


def test_a_message_from_before_keeps_plain_headers_first() -> None:
    """Stored before order was kept: encoded entries without references come after the
    plain properties, as they were read then."""
    msg = Message("T", 0, b"v", properties={"p": "1", "KAFKA_HEADERS_B64": "Yg==:/w=="})
    raw = encode_record(msg, physical_offset=0, queue_offset=0, store_timestamp=6,
                        store_host=("127.0.0.1", 10911))
    assert message_to_record(decode_record(raw), 0).headers == [("p", b"1"), ("b", b"\xff")]


async def test_real_clients_get_headers_in_produced_order(kafka_broker, kafka_bootstrap) -> None:
    topic = await _topic(kafka_broker, "HeaderOrder")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"mixed", partition=0, headers=MIXED)
        await producer.send_and_wait(topic, b"plain", partition=0,
                                     headers=[("z", b"1"), ("y", b"2"), ("x", b"3")])
    finally:
        await producer.stop()
    for got in (await _aiokafka_records(kafka_bootstrap, topic, 2),
                await asyncio.to_thread(_kafka_python_records, kafka_bootstrap, topic, 2)):
        assert [list(r.headers) for r in got] == [MIXED, [("z", b"1"), ("y", b"2"), ("x", b"3")]]
