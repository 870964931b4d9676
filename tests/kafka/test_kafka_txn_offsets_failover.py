"""Consumer offsets across a failover (docs/cluster.md, "Replication (HA)"; docs/kafka.md,
"Consumer groups"): offsets are records of the replicated commitlog
(txbroker/store/offset_log.py), so what the master acknowledged is on the promoted slave, with
no copy on a timer and no rule on the offsets file's time.

A controller-mode group of a SYNC_MASTER and its slave as real processes; the master is
SIGKILLed right after the commit (well within ``metadata_sync_interval``, which once was the
only way an offset reached a slave):

- a Kafka transaction commits a consumer group's offsets (``send_offsets_to_transaction``);
  while the group waits for the controller, RocketMQ consumers that lost the master report
  another group's offsets to the slave, as their client does (once that made the slave's
  offsets file look newer than the commit, and the promoted slave skipped it);
- a RocketMQ consumer commits its offset (UPDATE_CONSUMER_OFFSET).

OffsetFetch / QUERY_CONSUMER_OFFSET on the new master answer the committed offsets."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition
from support.waiting import eventually
from test_kafka_eos_failover import master_of
from test_kafka_txn_groups_crash import call, create_topic, namesrv

from txbroker.bench.chaos.cluster import ServiceProcess, replica_info
from txbroker.bench.chaos.process import BrokerProcess, free_port
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import (
    QueryConsumerOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from txbroker.remoting.kafka.apis import ApiKey

pytestmark = [pytest.mark.slow, pytest.mark.chaos]
#: The name-server process fixture, shared with the crash tests.
__all__ = ["namesrv"]

TOPIC = "offsets-failover"
#: Long enough that the reports to the slave land before the controller promotes it.
LEASE = 5.0


@pytest.fixture
def controller(tmp_path):
    ctl = ServiceProcess(["controller", "--port", "0", "--data-dir", str(tmp_path / "controller"),
                          "--lease", str(LEASE)], r"^txbroker controller ready addr=(\S+)$",
                         tmp_path / "controller.log").start()
    try:
        yield ctl
    finally:
        ctl.stop()


def member(broker_process, tmp_path, broker_id: int, namesrv: str,
           controller: str) -> BrokerProcess:
    return broker_process(tmp_path / f"broker-a-{broker_id}", namesrv_port=-1,
                          namesrv_addr=namesrv, broker_name="broker-a", broker_id=broker_id,
                          broker_role="SYNC_MASTER", broker_port=free_port(), ha_port=free_port(),
                          kafka_port=free_port(), kafka_node_id=1,
                          kafka_cluster_refresh_interval=0.2, kafka_transaction_scan_interval=0.2,
                          controller_addr=controller, controller_lease=LEASE,
                          controller_heartbeat_interval=0.3, slave_timeout=1.0,
                          metadata_sync_interval=30.0, offset_persist_interval=0.2)


async def group_in_sync(broker_process, tmp_path, namesrv, controller) -> tuple[BrokerProcess,
                                                                              BrokerProcess]:
    """(master, slave) of broker-a once both are in the in-sync set; TOPIC is created on the
    master before the slave starts (so the slave knows it from its first metadata round)."""
    first = member(broker_process, tmp_path, 0, namesrv.addr, controller.addr)
    await eventually(lambda: master_of(controller.addr, "broker-a", [first]), timeout=30,
                     msg="broker-a has a master")
    await create_topic(first, TOPIC, 2, groups=1)
    a = [first, member(broker_process, tmp_path, 1, namesrv.addr, controller.addr)]

    async def in_sync() -> bool:
        info = await replica_info(controller.addr, "broker-a")
        return info is not None and len(info.sync_state_set) == 2

    await eventually(in_sync, timeout=30, msg="the master and its slave in sync")
    return first, a[1]


async def remoting(addr: str, code: int, header) -> RemotingCommand:
    client = RemotingClient(addr, reconnect=False)
    try:
        return await client.invoke(RemotingCommand.request(code, header.to_ext()), 5.0)
    finally:
        await client.close()


async def update_offset(addr: str, group: str, queue: int, offset: int) -> int:
    resp = await remoting(addr, RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader(
        consumer_group=group, topic=TOPIC, queue_id=queue, commit_offset=offset))
    return resp.code


async def query_offset(addr: str, group: str, queue: int) -> int | None:
    resp = await remoting(addr, RequestCode.QUERY_CONSUMER_OFFSET, QueryConsumerOffsetRequestHeader(
        consumer_group=group, topic=TOPIC, queue_id=queue, set_zero_if_not_found=False))
    if resp.code != ResponseCode.SUCCESS:
        return None
    return int(resp.ext_fields["offset"])


async def fetch(port: int, group: str, partition: int) -> tuple[int, int]:
    """(committed offset, error) of ``partition`` for ``group`` (Kafka OffsetFetch)."""
    answer = await call(port, ApiKey.OFFSET_FETCH, 3, {
        "group_id": group, "topics": [{"name": TOPIC, "partition_indexes": [partition]}]})
    if answer.get("error_code"):
        return -1, answer["error_code"]
    p = answer["topics"][0]["partitions"][0]
    return p["committed_offset"], p["error_code"]


async def promoted(controller, slave: BrokerProcess) -> None:
    await eventually(lambda: master_of(controller.addr, "broker-a", [slave]), timeout=40,
                     msg="the controller promotes the slave")


async def test_transactional_offsets_survive_a_failover(broker_process, namesrv, controller,
                                                        tmp_path) -> None:
    master, slave = await group_in_sync(broker_process, tmp_path, namesrv, controller)
    group = "eos-group"
    producer = AIOKafkaProducer(bootstrap_servers=master.kafka_addr, transactional_id="eos-txn",
                                enable_idempotence=True, request_timeout_ms=10000)
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send(TOPIC, b"out", partition=0)
            await producer.send_offsets_to_transaction({TopicPartition(TOPIC, 0): 42,
                                                        TopicPartition(TOPIC, 1): 7}, group)
    finally:
        master.kill()  # right after the commit
        committed_at = time.monotonic()
        await producer.stop()
    # RocketMQ consumers of another group report their offsets to the slave now: 2.5 s after
    # the commit, while the controller still waits for the lease to end.
    await asyncio.sleep(max(0.0, committed_at + 2.5 - time.monotonic()))
    for offset in (3, 4):
        await update_offset(slave.broker_addr, "rmq-other", 0, offset)  # refused or not
        await asyncio.sleep(0.3)
    await promoted(controller, slave)
    last: dict[int, tuple[int, int]] = {}
    for partition, offset in ((0, 42), (1, 7)):
        async def committed(partition=partition, offset=offset) -> bool:
            got = last[partition] = await fetch(slave.kafka_port, group, partition)
            assert got[1] in (0, 14, 15, 16), got  # loading / not the coordinator yet: again
            return got == (offset, 0)
        await eventually(committed, timeout=20, msg=lambda partition=partition: (
            f"OffsetFetch of partition {partition} on the new master answers {last}"))


async def test_rocketmq_offset_committed_before_a_kill_is_on_the_promoted_slave(
        broker_process, namesrv, controller, tmp_path) -> None:
    master, slave = await group_in_sync(broker_process, tmp_path, namesrv, controller)
    async def taken() -> bool:
        return await update_offset(master.broker_addr, "rmq-group", 1, 10) == ResponseCode.SUCCESS
    await eventually(taken, timeout=10, msg="the master takes an offset of the topic")
    assert await update_offset(master.broker_addr, "rmq-group", 1, 1234) == ResponseCode.SUCCESS
    master.kill()  # the offset was acknowledged just now
    await promoted(controller, slave)
    await eventually(lambda: query_offset(slave.broker_addr, "rmq-group", 1), timeout=20,
                     msg="the new master answers QUERY_CONSUMER_OFFSET")
    assert await query_offset(slave.broker_addr, "rmq-group", 1) == 1234
