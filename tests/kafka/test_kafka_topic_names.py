"""Topic names (docs/kafka.md, "Topic names"): Kafka's rule on the broker for both protocols,
Kafka's `.`/`_` collision refused at creation with Kafka's error, RocketMQ's own names
(retry, dead-letter, namespaces) still accepted."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from test_kafka_listener import Wire

from txbroker.client import Consumer, Message, Producer
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import SendMessageRequestHeader
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.topics import TopicError, validate_topic_name
from txbroker.store.record import properties_to_string

WAIT = 15.0


async def _aiokafka_round_trip(bootstrap: str, topic: str) -> list[bytes]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    await producer.start()
    try:
        await asyncio.wait_for(producer.send_and_wait(topic, b"via aiokafka", partition=0), WAIT)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        msg = await asyncio.wait_for(consumer.getone(), WAIT)
        return [msg.value]
    finally:
        await consumer.stop()


def _kafka_python_admin_round_trip(bootstrap: str, topic: str) -> list[bytes]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        producer.send(topic, b"via kafka-python", partition=0).get(timeout=WAIT)
    finally:
        producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=int(WAIT * 1000))
    try:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                return [r.value for r in records]
        return []
    finally:
        consumer.close()


async def test_dotted_names_work_with_both_kafka_clients(kafka_broker, kafka_bootstrap) -> None:
    assert await _aiokafka_round_trip(kafka_bootstrap, "orders.v1") == [b"via aiokafka"]
    assert await asyncio.to_thread(_kafka_python_admin_round_trip, kafka_bootstrap,
                                   "payments.v1") == [b"via kafka-python"]
    assert kafka_broker.topics.get("orders.v1") is not None


def _create(name: str) -> dict:
    return {"topics": [{"name": name, "num_partitions": 1, "replication_factor": -1,
                        "assignments": [], "configs": []}],
            "timeout_ms": 5000, "validate_only": False}


@pytest.mark.slow
async def test_collisions_and_bad_names_are_refused_with_kafkas_error(kafka_broker,
                                                                        kafka_bootstrap,
                                                                        caplog) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        ok = await wire.call(ApiKey.CREATE_TOPICS, 4, 1, _create("orders.v1"))
        assert ok["topics"][0]["error_code"] == ErrorCode.NONE
        cases = {
            "orders_v1": "Topic 'orders_v1' collides with existing topic: orders.v1",
            "x" * 250: "the max allowed length 249",
            "bad name!": "contains one or more characters other than ASCII alphanumerics",
            "..": "'..' is not allowed",
            "ns%topic": "contains one or more characters other than ASCII alphanumerics",
        }
        for corr, (name, words) in enumerate(cases.items(), start=2):
            [answer] = (await wire.call(ApiKey.CREATE_TOPICS, 4, corr, _create(name)))["topics"]
            assert answer["error_code"] == ErrorCode.INVALID_TOPIC_EXCEPTION, name
            assert words in answer["error_message"], answer["error_message"]
        long_ok = "y" * 249
        [answer] = (await wire.call(ApiKey.CREATE_TOPICS, 4, 10, _create(long_ok)))["topics"]
        assert answer["error_code"] == ErrorCode.NONE
        # Auto-creation through Metadata: the collision gets the same error, and a log line.
        meta = await wire.call(ApiKey.METADATA, 8, 11, {
            "topics": [{"name": "orders_v1"}], "allow_auto_topic_creation": True,
            "include_cluster_authorized_operations": False,
            "include_topic_authorized_operations": False})
        assert meta["topics"][0]["error_code"] == ErrorCode.INVALID_TOPIC_EXCEPTION
        assert kafka_broker.topics.get("orders_v1") is None
        assert any("collides with existing topic: orders.v1" in r.getMessage()
                   and "127.0.0.1" in r.getMessage() for r in caplog.records)
    finally:
        wire.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, request_timeout_ms=5000)
    await producer.start()
    try:
        with pytest.raises(KafkaError):  # refused at once, not after a 40 s metadata wait
            await asyncio.wait_for(producer.send_and_wait("orders_v1", b"x"), WAIT)
    finally:
        await producer.stop()
    # The 249-character topic holds records (the stored length byte is read unsigned).
    assert await _aiokafka_round_trip(kafka_bootstrap, "y" * 249) == [b"via aiokafka"]


async def _send_rocketmq(addr: str, topic: str) -> RemotingCommand:
    ext = SendMessageRequestHeader(
        producer_group="PG_NAMES", topic=topic, default_topic_queue_nums=1, queue_id=0,
        sys_flag=0, born_timestamp=int(time.time() * 1000), flag=0,
        properties=properties_to_string({"WAIT": "true"})).to_ext()
    client = RemotingClient(addr)
    try:
        return await client.invoke(RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, b"m"), 10.0)
    finally:
        await client.close()


async def test_rocketmq_side_takes_the_same_names_and_refuses_bad_ones(kafka_broker) -> None:
    addr = kafka_broker.broker_addr
    for good in ("orders.v2", "ns%topic", "z" * 200):
        resp = await _send_rocketmq(addr, good)
        assert resp.code == ResponseCode.SUCCESS, (good, resp.remark)
    for bad, words in (("bad name!", "'bad name!' contains one or more characters"),
                       ("w" * 250, "longer than the max allowed length 249"),
                       ("..", "'..' is not allowed")):
        resp = await _send_rocketmq(addr, bad)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL, bad
        assert words in resp.remark and "\n" not in resp.remark


@pytest.mark.parametrize("name", ["%RETRY%CG_a", "%DLQ%CG_a", "RMQ_SYS_TRANS_HALF_TOPIC",
                                  "SCHEDULE_TOPIC_XXXX", "TBW102", "a|b", "a.b_c-D9"])
def test_broker_and_system_names_still_pass(name: str) -> None:
    assert validate_topic_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "a/b", "é", "x" * 250])
def test_bad_names_fail(name: str) -> None:
    with pytest.raises(TopicError, match="Topic name is invalid"):
        validate_topic_name(name)


async def test_the_rocketmq_sdk_keeps_working_with_its_names(kafka_broker) -> None:
    topic = "Sdk_Names-1"
    async with Producer("PG_SDK_NAMES", kafka_broker.namesrv_addr) as producer:
        await producer.send(Message(topic, b"sdk", tags="t"))
    consumer = Consumer("CG_SDK_NAMES", kafka_broker.namesrv_addr, from_where="first",
                        long_poll_timeout=1.0, rebalance_interval=0.5)
    consumer.subscribe(topic, "*")
    await consumer.start()
    try:
        from support.consuming import collect

        [msg] = await collect(consumer, 1)
    finally:
        await consumer.shutdown()
    assert msg.body == b"sdk"
