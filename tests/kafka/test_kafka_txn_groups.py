"""Kafka transactions across broker groups: the coordinator's group decides, the other groups
stage and apply on WriteTxnMarkers (docs/kafka.md, "Kafka on a cluster").  Real name server,
real brokers on loopback, the unmodified aiokafka client."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from support.cluster import InProcessCluster
from support.waiting import eventually
from test_kafka_cluster import (
    CLUSTER_KAFKA,
    TOPIC,
    controller,
    keys_by_coordinator,
    two_groups,
)
from test_kafka_listener import Wire

from txbroker.config import BrokerConfig
from txbroker.controller import ControllerProcess
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.service.cluster_auth import CLUSTER_ACCESS_KEY
from txbroker.service.kafka.peer_envelope import canonical, client_id, signed_client_id
from txbroker.service.topics import TopicConfig

#: The controller fixture, shared with the cluster tests.
__all__ = ["controller"]


async def read_all(port: int, topic: str, partitions: range, *, committed: bool) -> dict[int, list[bytes]]:
    """Every record of ``partitions`` now, by partition (one consumer, assigned)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", auto_offset_reset="earliest",
                                enable_auto_commit=False,
                                isolation_level="read_committed" if committed else "read_uncommitted")
    await consumer.start()
    got: dict[int, list[bytes]] = {p: [] for p in partitions}
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        want = {tp.partition: n for tp, n in ends.items()}

        async def caught_up() -> bool:
            for tp, msgs in (await consumer.getmany(timeout_ms=100)).items():
                got[tp.partition].extend(m.value for m in msgs)
            return all(len(got[p]) >= want[p] for p in partitions)
        await eventually(caught_up, msg=lambda: f"read {got} of {want}")
    finally:
        await consumer.stop()
    return got


async def test_a_transaction_over_both_groups_commits_on_both_and_aborts_on_neither(
        broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        tid = keys_by_coordinator(2)[0]  # coordinated by broker-a; partitions 4-5 are broker-b's
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{b.kafka_port}",
                                    transactional_id=tid)
        await producer.start()
        try:
            async with producer.transaction():
                for p in (0, 4, 5):
                    await producer.send_and_wait(TOPIC, f"commit-{p}".encode(), partition=p)
                # Staged, not in any partition yet: on broker-b in its staging topic.
                assert b.store.max_offset(TOPIC, 0) == 0 and b.kafka_staging.staged_count() == 2
            await producer.begin_transaction()
            for p in (1, 4):
                await producer.send_and_wait(TOPIC, f"abort-{p}".encode(), partition=p)
            await producer.abort_transaction()
        finally:
            await producer.stop()
        assert [a.store.max_offset(TOPIC, q) for q in range(4)] == [1, 0, 0, 0]
        assert [b.store.max_offset(TOPIC, q) for q in range(2)] == [1, 1]
        assert b.kafka_staging.staged_count() == 0
        for port in (a.kafka_port, b.kafka_port):
            for committed in (True, False):
                got = await read_all(port, TOPIC, range(6), committed=committed)
                assert got == {0: [b"commit-0"], 1: [], 2: [], 3: [], 4: [b"commit-4"],
                               5: [b"commit-5"]}


async def test_offsets_committed_in_the_transaction_are_staged_at_the_group_coordinator(
        broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        tid, group = keys_by_coordinator(2)  # transaction on broker-a, consumer group on broker-b
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}",
                                    transactional_id=tid)
        await producer.start()
        try:
            offsets = {TopicPartition(TOPIC, p): 10 + p for p in (1, 5)}
            await producer.begin_transaction()
            await producer.send_and_wait(TOPIC, b"x", partition=4)
            await producer.send_offsets_to_transaction(offsets, group)
            assert b.store.offsets.get(group, TOPIC, 1) is None  # staged, not set
            await producer.abort_transaction()
            assert a.store.offsets.get(group, TOPIC, 1) is None
            assert b.store.offsets.get(group, TOPIC, 1) is None
            async with producer.transaction():
                await producer.send_and_wait(TOPIC, b"y", partition=4)
                await producer.send_offsets_to_transaction(offsets, group)
        finally:
            await producer.stop()
        # Partition 1 is broker-a's queue 1, partition 5 broker-b's queue 1.
        assert a.store.offsets.get(group, TOPIC, 1) == 11
        assert b.store.offsets.get(group, TOPIC, 1) == 15
        assert [b.store.max_offset(TOPIC, q) for q in range(2)] == [1, 0]


async def test_markers_without_the_cluster_signature_are_refused(
        broker_config: BrokerConfig, tmp_path) -> None:
    secret = "s" * 32
    async with InProcessCluster(broker_config.replace(cluster_secret=secret), tmp_path) as c:
        a, b = await two_groups(c)
        tid = keys_by_coordinator(2)[0]
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}",
                                    transactional_id=tid)
        await producer.start()
        try:
            await producer.begin_transaction()
            await producer.send_and_wait(TOPIC, b"staged", partition=4)
            pid = producer._txn_manager.producer_id
            epoch = producer._txn_manager.producer_epoch
            markers = [{"producer_id": pid, "producer_epoch": epoch, "transaction_result": True,
                        "coordinator_epoch": 99,
                        "topics": [{"name": TOPIC, "partition_indexes": [4]}]}]
            wire = await Wire.open(b.kafka_port)
            try:
                body = canonical(ApiKey.WRITE_TXN_MARKERS, 1, {"markers": markers})
                here = b.config.broker_name
                stale = signed_client_id(ApiKey.WRITE_TXN_MARKERS, 1, body, secret, to=here,
                                         now=time.time() - 60, nonce=os.urandom(16))
                other = client_id(ApiKey.WRITE_TXN_MARKERS, 1, {"markers": markers}, "x" * 32,
                                  to=here)
                for cid in ("rogue", other, stale):
                    wire.writer.write(_marker_frame(cid, markers))
                    answer = await _answer(wire)
                    assert answer["markers"][0]["topics"][0]["partitions"][0]["error_code"] == \
                        ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            finally:
                wire.close()
            assert b.store.max_offset(TOPIC, 0) == 0 and b.kafka_staging.staged_count() == 1
            await producer.commit_transaction()  # the coordinator's own markers are signed
        finally:
            await producer.stop()
        assert b.store.max_offset(TOPIC, 0) == 1
        # A marker in the envelope is obeyed once: the same frame again (captured on the path
        # and replayed) is refused.
        frame = _marker_frame(client_id(ApiKey.WRITE_TXN_MARKERS, 1, {"markers": markers},
                                        secret, to=b.config.broker_name), markers)
        wire = await Wire.open(b.kafka_port)
        try:
            codes = []
            for _ in range(2):
                wire.writer.write(frame)
                answer = await _answer(wire)
                codes.append(answer["markers"][0]["topics"][0]["partitions"][0]["error_code"])
            assert codes[0] != ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            assert codes[1] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        finally:
            wire.close()


def _marker_frame(client_id: str, markers: list[dict]) -> bytes:
    return encode_request(ApiKey.WRITE_TXN_MARKERS, 1, 7, client_id, {"markers": markers})


async def _answer(wire: Wire) -> dict:
    return decode_response(ApiKey.WRITE_TXN_MARKERS, 1, await wire.frame())[1]


async def test_a_single_broker_refuses_markers(kafka_broker) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        markers = [{"producer_id": 1, "producer_epoch": 0, "transaction_result": True,
                    "coordinator_epoch": 1, "topics": [{"name": "t", "partition_indexes": [0]}]}]
        wire.writer.write(_marker_frame("txbroker-cluster", markers))
        answer = await _answer(wire)
    finally:
        wire.close()
    assert answer["markers"][0]["topics"][0]["partitions"][0]["error_code"] == \
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED


@pytest.mark.slow
async def test_a_participant_that_fails_over_keeps_its_staged_batch_and_applies_the_marker(
        broker_config: BrokerConfig, tmp_path, controller: ControllerProcess) -> None:
    base = broker_config.replace(controller_addr=controller.addr, controller_lease=1.0,
                                 controller_heartbeat_interval=0.2, metadata_sync_interval=0.2)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", kafka_node_id=1, **CLUSTER_KAFKA)
        b0 = await c.broker("broker-b", kafka_node_id=2, **CLUSTER_KAFKA)
        b1 = await c.broker("broker-b", broker_id=1, kafka_node_id=2, **CLUSTER_KAFKA)
        await eventually(lambda: a.roles.is_master and b0.roles.is_master, timeout=15)
        await a.topics.create_or_update(TopicConfig(TOPIC, 2, 2))
        await b0.topics.create_or_update(TopicConfig(TOPIC, 2, 2))
        await eventually(lambda: b0.roles.sync_state_set == {0, 1}, timeout=15)
        await eventually(lambda: len(a.kafka_view.slots(TOPIC)) == 4, msg="a sees both groups")
        tid = keys_by_coordinator(2)[0]
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}",
                                    transactional_id=tid)
        await producer.start()
        try:
            await producer.begin_transaction()
            for p in (0, 2):  # partition 2 is broker-b's queue 0: staged on b0
                await producer.send_and_wait(TOPIC, f"v{p}".encode(), partition=p)
            await eventually(lambda: b1.store.max_physical_offset == b0.store.max_physical_offset
                             and b1.topics.get(TOPIC) is not None,
                             msg="the staged batch and the topic table on b1")
            c.brokers.remove(b0)
            await b0.stop()  # broker-b fails over to b1 before the marker
            await asyncio.wait_for(producer.commit_transaction(), 60)
        finally:
            await producer.stop()
        assert b1.roles.is_master
        assert b1.store.max_offset(TOPIC, 0) == 1 and a.store.max_offset(TOPIC, 0) == 1
        for port in (a.kafka_port, b1.kafka_port):
            got = await read_all(port, TOPIC, range(4), committed=True)
            assert got == {0: [b"v0"], 1: [], 2: [b"v2"], 3: []}


async def test_a_marker_applied_twice_changes_nothing(broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        tid = keys_by_coordinator(2)[0]
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}",
                                    transactional_id=tid)
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(TOPIC, b"once", partition=4)
            pid = producer._txn_manager.producer_id
            epoch = producer._txn_manager.producer_epoch
            txn = a.kafka_txn.describe(tid)
            assert txn is not None and txn.state == "CompleteCommit"
            number = a.kafka_txn._txns[tid].txn  # the transaction number its marker carried
            staged_end = b.store.max_offset("RMQ_SYS_KAFKA_TXN_STAGED", 0)
            # The coordinator's marker again (a lost answer, a resend after a restart), then a
            # fresh transaction whose batch is staged: neither the duplicate nor an abort of the
            # old number touches it.
            for commit in (True, False):
                await _send_marker(b, pid, epoch, number, commit)
            assert b.store.max_offset(TOPIC, 0) == 1
            assert b.store.max_offset("RMQ_SYS_KAFKA_TXN_STAGED", 0) == staged_end
            await producer.begin_transaction()
            await producer.send_and_wait(TOPIC, b"next", partition=4)
            await _send_marker(b, pid, epoch, number, True)
            assert b.store.max_offset(TOPIC, 0) == 1 and b.kafka_staging.staged_count() == 1
            await producer.commit_transaction()
        finally:
            await producer.stop()
        assert b.store.max_offset(TOPIC, 0) == 2
        got = await read_all(b.kafka_port, TOPIC, range(4, 6), committed=True)
        assert got == {4: [b"once", b"next"], 5: []}


async def _send_marker(broker, pid: int, epoch: int, txn: int, commit: bool) -> None:
    markers = [{"producer_id": pid, "producer_epoch": epoch, "transaction_result": commit,
                "coordinator_epoch": txn, "topics": [{"name": TOPIC, "partition_indexes": [4]}]}]
    wire = await Wire.open(broker.kafka_port)
    try:
        wire.writer.write(_marker_frame(CLUSTER_ACCESS_KEY, markers))
        answer = await _answer(wire)
    finally:
        wire.close()
    assert answer["markers"][0]["topics"][0]["partitions"][0]["error_code"] == ErrorCode.NONE


async def test_an_operator_abort_with_a_participant_down_is_decided_and_completes_later(
        broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        tid = keys_by_coordinator(2)[0]
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}",
                                    transactional_id=tid)
        await producer.start()
        try:
            await producer.begin_transaction()
            await producer.send_and_wait(TOPIC, b"doomed", partition=4)
            c.brokers.remove(b)
            await b.stop()  # broker-b holds the staged batch and cannot take a marker now
            assert await a.kafka_txn.abort(tid, "ops") == "aborted"
            assert a.kafka_txn.describe(tid).state == "PrepareAbort"
            b = await c.broker("broker-b", data_dir=b.config.data_dir, kafka_node_id=2,
                               **CLUSTER_KAFKA)
            await eventually(lambda: a.kafka_txn.describe(tid).state == "CompleteAbort",
                             msg="the abort marker reached broker-b")
        finally:
            await producer.stop()
        assert b.kafka_staging.staged_count() == 0 and b.store.max_offset(TOPIC, 0) == 0


async def test_librdkafka_commits_and_aborts_across_groups(broker_config: BrokerConfig,
                                                           tmp_path) -> None:
    """The same with confluent-kafka (librdkafka), driven in a thread (its calls block)."""
    from confluent_kafka import Producer

    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        tid = keys_by_coordinator(2)[0]

        def run() -> None:
            producer = Producer({"bootstrap.servers": f"127.0.0.1:{b.kafka_port}",
                                 "transactional.id": tid, "linger.ms": 5})
            producer.init_transactions(20)
            for outcome in ("commit", "abort"):
                producer.begin_transaction()
                for p in (1, 5):
                    producer.produce(TOPIC, f"{outcome}-{p}".encode(), partition=p)
                producer.flush(20)
                if outcome == "commit":
                    producer.commit_transaction(20)
                else:
                    producer.abort_transaction(20)
        await asyncio.to_thread(run)
        assert b.kafka_staging.staged_count() == 0
        for port in (a.kafka_port, b.kafka_port):
            got = await read_all(port, TOPIC, range(6), committed=True)
            assert got == {0: [], 1: [b"commit-1"], 2: [], 3: [], 4: [], 5: [b"commit-5"]}
