"""All or nothing across broker groups under SIGKILL (docs/kafka.md, "Kafka on a cluster"):
two broker groups as real processes (a name server process, brokers with pinned ports so a
restarted one answers at the same address), a transaction over a partition of each, and the
coordinator and/or the participant killed in the middle of the commit or abort.  After the
restarts the transaction is complete on both groups or on neither, and read_committed
consumers of either group agree."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from aiokafka import AIOKafkaProducer
from support.cluster import NamesrvSubprocess
from support.waiting import eventually
from test_kafka_cluster import keys_by_coordinator
from test_kafka_listener import Wire
from test_kafka_txn_groups import read_all

from txbroker.bench.chaos.process import BrokerProcess, free_port
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import GetMaxOffsetRequestHeader
from txbroker.remoting.kafka.apis import ApiKey

pytestmark = pytest.mark.slow

TOPIC = "crossing"
#: Partitions 0-1 are broker-a's (node 1, the coordinator's), 2-3 broker-b's (node 2).
PARTS = range(4)


def group_process(broker_process, tmp_path, name: str, node: int, namesrv: str,
                  **settings: object) -> BrokerProcess:
    """A broker group of one master, every port pinned (a restart answers at the same address)."""
    return broker_process(tmp_path / name, namesrv_port=-1, namesrv_addr=namesrv, **settings,
                          broker_name=name, broker_port=free_port(), ha_port=free_port(),
                          kafka_port=free_port(),
                          kafka_node_id=node, kafka_cluster_refresh_interval=0.2,
                          kafka_transaction_scan_interval=0.2)


async def call(port: int, key: ApiKey, version: int, body: dict) -> dict:
    wire = await Wire.open(port)
    try:
        return await wire.call(key, version, 1, body)
    finally:
        wire.close()


async def txn_state(port: int, tid: str) -> str:
    answer = await call(port, ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [tid]})
    return answer["transaction_states"][0]["transaction_state"]


async def latest(port: int, partition: int) -> int:
    answer = await call(port, ApiKey.LIST_OFFSETS, 2, {
        "replica_id": -1, "isolation_level": 0, "topics": [
            {"name": TOPIC, "partitions": [{"partition_index": partition, "timestamp": -1}]}]})
    return answer["topics"][0]["partitions"][0]["offset"]


async def queue_end(proc: BrokerProcess, queue: int) -> int:
    """The end of one of the group's own queues of TOPIC (RocketMQ's GET_MAX_OFFSET)."""
    header = GetMaxOffsetRequestHeader(topic=TOPIC, queue_id=queue)
    client = RemotingClient(proc.broker_addr, reconnect=False)
    try:
        resp = await client.invoke(RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                                           header.to_ext()), 5.0)
    finally:
        await client.close()
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return int(resp.ext_fields["offset"])


async def create_topic(proc: BrokerProcess, topic: str, partitions: int, groups: int = 2) -> None:
    """``topic`` with ``partitions`` partitions, spread over the groups by CreateTopics, once
    ``proc``'s view holds ``groups`` groups (a view that does not know a group yet is complete
    without it, and would put every partition in the groups it knows)."""
    async def knows_all() -> bool:
        meta = await call(proc.kafka_port, ApiKey.METADATA, 8, {
            "topics": [], "allow_auto_topic_creation": False})
        return len(meta["brokers"]) >= groups
    await eventually(knows_all, timeout=20, msg=f"{proc.kafka_addr} sees {groups} groups")
    created = await call(proc.kafka_port, ApiKey.CREATE_TOPICS, 2, {
        "topics": [{"name": topic, "num_partitions": partitions, "replication_factor": -1}],
        "timeout_ms": 5000})
    assert created["topics"][0]["error_code"] == 0


async def create_in_group(proc: BrokerProcess, topic: str, queues: int) -> None:
    """``topic`` in ``proc``'s group only (RocketMQ's UPDATE_AND_CREATE_TOPIC): its Kafka
    partitions are that group's queues."""
    client = RemotingClient(proc.broker_addr, reconnect=False)
    try:
        resp = await client.invoke(RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "readQueueNums": str(queues), "writeQueueNums": str(queues),
            "perm": "6"}), 5.0)
    finally:
        await client.close()
    assert resp.code == ResponseCode.SUCCESS, resp.remark


async def seen_everywhere(procs: list[BrokerProcess], topic: str, leaders: list[int]) -> None:
    """Until every broker's Metadata lists ``topic``'s partitions led by ``leaders``."""
    async def seen() -> bool:
        for p in procs:
            meta = await call(p.kafka_port, ApiKey.METADATA, 8, {
                "topics": [{"name": topic}], "allow_auto_topic_creation": False})
            if [x["leader_id"] for x in meta["topics"][0]["partitions"]] != leaders:
                return False
        return True
    await eventually(seen, timeout=20, msg=f"{topic} led by {leaders} in every view")


@pytest.fixture
async def namesrv(tmp_path):
    server = NamesrvSubprocess(tmp_path / "namesrv.log").start()
    try:
        yield server
    finally:
        server.kill()


async def seen_groups(proc: BrokerProcess) -> bool:
    meta = await call(proc.kafka_port, ApiKey.METADATA, 8, {"topics": []})
    return len(meta["brokers"]) == 2


@pytest.fixture
async def groups(tmp_path, broker_process, namesrv):
    """broker-a (node 1) and broker-b (node 2), two queues of TOPIC each."""
    a = group_process(broker_process, tmp_path, "broker-a", 1, namesrv.addr)
    b = group_process(broker_process, tmp_path, "broker-b", 2, namesrv.addr)
    await eventually(lambda: seen_groups(a), timeout=20, msg="broker-a's view sees both groups")
    await create_topic(a, TOPIC, 4)  # two queues in each group
    await seen_everywhere([a, b], TOPIC, [1, 1, 2, 2])
    return a, b


async def open_transaction(a: BrokerProcess, tid: str) -> AIOKafkaProducer:
    """A producer with an open transaction holding one record on partition 0 (broker-a) and
    one on partition 2 (broker-b, staged there)."""
    producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}",
                                transactional_id=tid, request_timeout_ms=3000)
    await producer.start()
    await producer.begin_transaction()
    for p in (0, 2):
        await producer.send_and_wait(TOPIC, f"v{p}".encode(), partition=p)
    return producer


async def abandon(producer: AIOKafkaProducer, task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(task, 5)
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(producer.stop(), 5)


@pytest.mark.parametrize("kill_coordinator", [True, False], ids=["coordinator-too", "participant-only"])
async def test_a_commit_interrupted_by_sigkill_completes_on_both_groups(groups, kill_coordinator) -> None:
    a, b = groups
    tid = keys_by_coordinator(2)[0]
    producer = await open_transaction(a, tid)
    b.kill()  # the participant dies holding its staged batch, before any marker
    task = asyncio.create_task(producer.commit_transaction())
    try:
        # The decision is durable and broker-a applied its own partition; broker-b's marker
        # cannot be delivered.
        await eventually(_is(a.kafka_port, tid, "PrepareCommit"), timeout=20, msg="PrepareCommit")
        assert await latest(a.kafka_port, 0) == 1
        if kill_coordinator:
            a.kill()  # after PrepareCommit and its own group, before the other group's marker
    finally:
        await abandon(producer, task)
    b.start()
    if kill_coordinator:
        # Restarted, broker-b still holds the batch staged, out of its queue.
        assert await queue_end(b, 0) == 0
    if kill_coordinator:
        a.start()  # its recovery resends the marker
    await eventually(_is(a.kafka_port, tid, "CompleteCommit"), timeout=30, msg="CompleteCommit")
    for port in (a.kafka_port, b.kafka_port):
        got = await read_all(port, TOPIC, PARTS, committed=True)
        assert got == {0: [b"v0"], 1: [], 2: [b"v2"], 3: []}


async def test_an_abort_interrupted_by_sigkill_is_aborted_on_both_groups(groups) -> None:
    a, b = groups
    tid = keys_by_coordinator(2)[0]
    producer = await open_transaction(a, tid)
    b.kill()
    task = asyncio.create_task(producer.abort_transaction())
    try:
        await eventually(_is(a.kafka_port, tid, "PrepareAbort"), timeout=20, msg="PrepareAbort")
        a.kill()
    finally:
        await abandon(producer, task)
    b.start()
    a.start()
    await eventually(_is(a.kafka_port, tid, "CompleteAbort"), timeout=30, msg="CompleteAbort")
    # The next transaction of the same id commits on both: the aborted batch stayed dropped.
    producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}",
                                transactional_id=tid)
    await producer.start()
    try:
        async with producer.transaction():
            for p in (0, 2):
                await producer.send_and_wait(TOPIC, f"next{p}".encode(), partition=p)
    finally:
        await producer.stop()
    for port in (a.kafka_port, b.kafka_port):
        for committed in (True, False):
            got = await read_all(port, TOPIC, PARTS, committed=committed)
            assert got == {0: [b"next0"], 1: [], 2: [b"next2"], 3: []}


def _is(port: int, tid: str, state: str):
    async def check() -> bool:
        try:
            return await txn_state(port, tid) == state
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            return False
    return check
