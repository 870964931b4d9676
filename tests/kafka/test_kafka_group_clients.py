"""Consumer groups and committed offsets through the real clients (aiokafka, kafka-python)
against an in-process broker with its Kafka port open; offsets shared with RocketMQ consumers.

Session timeouts are small (the broker's lower bound is lowered for this module) and every wait
is bounded."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.support.waiting import eventually
from txbroker.client.consumer import Consumer
from txbroker.client.message import Message
from txbroker.client.producer import Producer
from txbroker.service.topics import TopicConfig

SESSION = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 300,
           "rebalance_timeout_ms": 10_000}
WAIT = 30.0


@pytest.fixture
def kafka_config(kafka_config):
    """Sessions of 2 s are allowed here, so a crashed member lapses quickly."""
    return kafka_config.replace(kafka_group_min_session_timeout=1.0)


async def make_topic(broker, name: str, partitions: int) -> None:
    await broker.topics.create_or_update(TopicConfig(name, partitions, partitions))


async def produce(bootstrap: str, topic: str, per_partition: int, partitions: int,
                  tag: str) -> None:
    async with AIOKafkaProducer(bootstrap_servers=bootstrap) as producer:
        for p in range(partitions):
            for i in range(per_partition):
                await producer.send(topic, f"{tag}-{p}-{i}".encode(), partition=p)
        await producer.flush()


def group_consumer(bootstrap: str, topic: str, group: str, **kw) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                            auto_offset_reset="earliest", enable_auto_commit=False,
                            **{**SESSION, **kw})


class Member:
    """An aiokafka group member that consumes into a shared list, committing each batch
    before reporting it (so a later rebalance hands over committed positions only)."""

    def __init__(self, bootstrap: str, topic: str, group: str, seen: list) -> None:
        self.consumer = group_consumer(bootstrap, topic, group)
        self.seen = seen
        self.task: asyncio.Task | None = None

    async def start(self) -> Member:
        await self.consumer.start()
        self.task = asyncio.ensure_future(self._run())
        return self

    async def _run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100)
            if batches:
                await self.consumer.commit()
                for tp, records in batches.items():
                    self.seen.extend((tp.partition, r.offset, r.value) for r in records)

    def owned(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.consumer.stop()


def split(members: list[Member], partitions: int) -> bool:
    """Every partition owned by exactly one member, every member owning some."""
    owned = [m.owned() for m in members]
    return (all(owned) and sum(len(o) for o in owned) == partitions
            and set().union(*owned) == set(range(partitions)))


async def test_aiokafka_group_splits_partitions_and_hands_them_over(kafka_broker,
                                                                   kafka_bootstrap):
    topic, group = "GroupSplit", "g-split"
    await make_topic(kafka_broker, topic, 4)
    seen: list[tuple[int, int, bytes]] = []
    members = [await Member(kafka_bootstrap, topic, group, seen).start() for _ in range(2)]
    try:
        await eventually(lambda: split(members, 4), WAIT, "2 members split 4 partitions")
        await produce(kafka_bootstrap, topic, 5, 4, "a")
        await eventually(lambda: len(seen) >= 20, WAIT, lambda: f"{len(seen)}/20 consumed")

        members.append(await Member(kafka_bootstrap, topic, group, seen).start())
        await eventually(lambda: split(members, 4), WAIT, "3 members split 4 partitions")
        assert kafka_broker.groups.groups[group].generation >= 2
        await produce(kafka_bootstrap, topic, 5, 4, "b")
        await eventually(lambda: len(seen) >= 40, WAIT, lambda: f"{len(seen)}/40 consumed")

        leaving = members.pop()
        gone = leaving.owned()
        await leaving.stop()                         # LeaveGroup: its partitions move
        await eventually(lambda: split(members, 4), WAIT, "partitions moved to the 2 left")
        assert gone <= members[0].owned() | members[1].owned()
        await produce(kafka_bootstrap, topic, 5, 4, "c")
        await eventually(lambda: len(seen) >= 60, WAIT, lambda: f"{len(seen)}/60 consumed")
        await asyncio.sleep(0.3)                     # nothing more arrives
    finally:
        for m in members:
            await m.stop()
    assert len(seen) == 60 and len(set(seen)) == 60            # each message consumed once
    assert {(p, o) for p, o, _ in seen} == {(p, o) for p in range(4) for o in range(15)}
    assert kafka_broker.metrics.kafka_groups._value.get() == 0


async def test_aiokafka_manual_commit_and_committed(kafka_broker, kafka_bootstrap):
    topic, group = "GroupManual", "g-manual"
    await make_topic(kafka_broker, topic, 1)
    await produce(kafka_bootstrap, topic, 6, 1, "m")
    tp = TopicPartition(topic, 0)
    consumer = group_consumer(kafka_bootstrap, topic, group)
    await consumer.start()
    try:
        assert await consumer.committed(tp) is None               # nothing committed: -1
        got = []
        while len(got) < 6:
            batches = await asyncio.wait_for(consumer.getmany(timeout_ms=200), WAIT)
            got.extend(r.value for rs in batches.values() for r in rs)
        await consumer.commit({tp: 4})
        assert await consumer.committed(tp) == 4
        await consumer.commit()                                    # the position
        assert await consumer.committed(tp) == 6
    finally:
        await consumer.stop()
    assert kafka_broker.store.offsets.get(group, topic, 0) == 6


def _kafka_python_group(bootstrap: str, topic: str, group: str, commit_after: int) -> list:
    """One kafka-python group member: read until ``commit_after`` records (or the end),
    commit the position after the last one taken, close (LeaveGroup)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=6000, heartbeat_interval_ms=500,
                             consumer_timeout_ms=3000)
    taken = []
    try:
        for record in consumer:
            taken.append((record.offset, record.value))
            if len(taken) == commit_after:
                break
        consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(taken[-1][0] + 1, "", -1)})
    finally:
        consumer.close()
    return taken


def _kafka_python_group_offsets(bootstrap: str, group: str) -> dict:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.list_group_offsets(group)[group]          # OffsetFetch, topics null
    finally:
        admin.close()


async def test_kafka_python_group_resumes_from_its_committed_offset(kafka_broker,
                                                                    kafka_bootstrap):
    topic, group = "GroupResume", "g-resume"
    await make_topic(kafka_broker, topic, 1)
    await produce(kafka_bootstrap, topic, 10, 1, "r")
    first = await asyncio.to_thread(_kafka_python_group, kafka_bootstrap, topic, group, 4)
    assert [o for o, _ in first] == [0, 1, 2, 3]
    second = await asyncio.to_thread(_kafka_python_group, kafka_bootstrap, topic, group, 100)
    assert [o for o, _ in second] == [4, 5, 6, 7, 8, 9]       # resumed, nothing twice
    assert [v for _, v in first + second] == [f"r-0-{i}".encode() for i in range(10)]
    offsets = await asyncio.to_thread(_kafka_python_group_offsets, kafka_bootstrap, group)
    assert {(tp.topic, tp.partition): m.offset for tp, m in offsets.items()} == {(topic, 0): 10}
    assert all(m.metadata == "" for m in offsets.values())     # metadata is not kept


CRASHING_MEMBER = """
import asyncio, json, sys
from aiokafka import AIOKafkaConsumer

async def main():
    c = AIOKafkaConsumer(sys.argv[2], bootstrap_servers=sys.argv[1], group_id=sys.argv[3],
                         enable_auto_commit=False, **json.loads(sys.argv[4]))
    await c.start()
    said = None
    while True:
        await c.getmany(timeout_ms=100)
        owned = sorted(tp.partition for tp in c.assignment())
        if owned != said:
            print(json.dumps(owned), flush=True)
            said = owned

asyncio.run(main())
"""


async def test_crashed_member_expires_and_the_survivor_takes_over(kafka_broker,
                                                                  kafka_bootstrap):
    topic, group = "GroupCrash", "g-crash"
    await make_topic(kafka_broker, topic, 4)
    survivor = await Member(kafka_bootstrap, topic, group, []).start()
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASHING_MEMBER, kafka_bootstrap, topic, group,
        json.dumps(SESSION), stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()})
    child_owns: list[int] = []

    async def read_child() -> None:
        assert child.stdout is not None
        async for line in child.stdout:
            child_owns[:] = json.loads(line)

    reader = asyncio.ensure_future(read_child())
    try:
        await eventually(lambda: child_owns and len(survivor.owned()) + len(child_owns) == 4
                         and not survivor.owned() & set(child_owns), WAIT,
                         "the two members split the partitions")
        child.send_signal(signal.SIGKILL)            # no LeaveGroup: the session must lapse
        await child.wait()
        await eventually(lambda: survivor.owned() == {0, 1, 2, 3}, WAIT,
                         lambda: f"survivor owns {survivor.owned()}")
        assert len(kafka_broker.groups.groups[group].members) == 1
    finally:
        reader.cancel()
        if child.returncode is None:
            child.kill()
            await child.wait()
        await survivor.stop()


async def test_offsets_are_shared_with_rocketmq_consumers(kafka_broker, kafka_bootstrap):
    topic = "GroupCross"
    await make_topic(kafka_broker, topic, 1)
    async with Producer("pg_cross", kafka_broker.namesrv_addr) as producer:
        for i in range(8):
            await producer.send(Message(topic, f"x{i}".encode()))
    tp = TopicPartition(topic, 0)

    # Kafka commits, RocketMQ resumes there.
    consumer = group_consumer(kafka_bootstrap, topic, "cross_k2r")
    await consumer.start()
    try:
        await consumer.commit({tp: 3})
    finally:
        await consumer.stop()
    rmq = Consumer("cross_k2r", kafka_broker.namesrv_addr, from_where="first",
                   long_poll_timeout=1.0)
    rmq.subscribe(topic)
    async with rmq:
        first = await rmq.poll(WAIT)
    assert first is not None and (first.queue_offset, first.body) == (3, b"x3")

    # RocketMQ consumes and commits, Kafka resumes there.
    rmq = Consumer("cross_r2k", kafka_broker.namesrv_addr, from_where="first",
                   long_poll_timeout=1.0)
    rmq.subscribe(topic)
    async with rmq:
        for _ in range(5):
            assert await rmq.poll(WAIT) is not None
    # shutdown acknowledged the five delivered messages and committed offset 5
    consumer = group_consumer(kafka_bootstrap, topic, "cross_r2k")
    await consumer.start()
    try:
        assert await consumer.committed(tp) == 5
        batches = await asyncio.wait_for(consumer.getmany(timeout_ms=5000), WAIT)
        values = [r.value for rs in batches.values() for r in rs]
        while not values:
            batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500), WAIT)
            values = [r.value for rs in batches.values() for r in rs]
        assert values[0] == b"x5"
    finally:
        await consumer.stop()
