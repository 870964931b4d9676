"""Kafka on a cluster: every broker group's master is one Kafka node, a topic's partitions are
its queues across groups, and a partition is served by its group's master only
(docs/kafka.md, "Kafka on a cluster").  Real name server, real brokers, real sockets, the
unmodified aiokafka client."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from support.cluster import InProcessCluster
from support.waiting import eventually
from test_kafka_listener import Wire

from txbroker.config import BrokerConfig, ConfigError
from txbroker.controller import ControllerConfig, ControllerProcess
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import Record, encode_batch
from txbroker.service.kafka.cluster_view import coordinator_index
from txbroker.service.topics import TopicConfig

TOPIC = "spread"
#: Short refreshes so that the view follows the cluster quickly in tests.
CLUSTER_KAFKA = {"kafka_port": 0, "kafka_cluster_refresh_interval": 0.1,
                 "kafka_group_initial_rebalance_delay": 0.2}


async def two_groups(c: InProcessCluster):
    """broker-a (node 1, 4 queues of TOPIC) and broker-b (node 2, 2 queues), views refreshed."""
    await c.namesrv()
    a = await c.broker("broker-a", kafka_node_id=1, **CLUSTER_KAFKA)
    b = await c.broker("broker-b", kafka_node_id=2, **CLUSTER_KAFKA)
    await a.topics.create_or_update(TopicConfig(TOPIC, 4, 4))
    await b.topics.create_or_update(TopicConfig(TOPIC, 2, 2))
    for broker in (a, b):
        await eventually(lambda broker=broker: len(broker.kafka_view.slots(TOPIC)) == 6
                         and len(broker.kafka_view.nodes()) == 2, msg="views see both groups")
    return a, b


def record(value: bytes) -> Record:
    return Record(0, 1_700_000_000_000, None, value, [])


async def test_metadata_lists_each_group_as_a_node_and_partitions_across_groups(
        broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        for broker in (a, b):
            wire = await Wire.open(broker.kafka_port)
            try:
                answer = await wire.call(ApiKey.METADATA, 8, 1, {
                    "topics": [{"name": TOPIC}], "allow_auto_topic_creation": False})
            finally:
                wire.close()
            assert answer["brokers"] == [
                {"node_id": 1, "host": "127.0.0.1", "port": a.kafka_port, "rack": None},
                {"node_id": 2, "host": "127.0.0.1", "port": b.kafka_port, "rack": None}]
            parts = answer["topics"][0]["partitions"]
            assert [(p["partition_index"], p["leader_id"]) for p in parts] == [
                (0, 1), (1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]


async def test_a_partition_of_another_group_is_not_led_here(broker_config: BrokerConfig,
                                                            tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        batch = encode_batch(0, [record(b"x")])
        wire = await Wire.open(a.kafka_port)
        try:
            answer = await wire.call(ApiKey.PRODUCE, 7, 1, {
                "acks": 1, "timeout_ms": 1000, "topic_data": [{"name": TOPIC, "partition_data": [
                    {"index": 1, "records": batch}, {"index": 4, "records": batch},
                    {"index": 6, "records": batch}]}]})
            fetch = await wire.call(ApiKey.FETCH, 11, 2, {
                "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                "isolation_level": 0, "topics": [{"topic": TOPIC, "partitions": [
                    {"partition": 5, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
        finally:
            wire.close()
        got = {p["index"]: p["error_code"] for p in answer["responses"][0]["partition_responses"]}
        assert got == {1: ErrorCode.NONE, 4: ErrorCode.NOT_LEADER_OR_FOLLOWER,
                       6: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert fetch["responses"][0]["partitions"][0]["error_code"] == \
            ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert a.store.max_offset(TOPIC, 1) == 1  # partition 1 = broker-a's queue 1
        assert b.store.max_offset(TOPIC, 0) == 0  # nothing reached broker-b


async def test_aiokafka_produces_to_every_group_and_consumes_them_back(
        broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}", acks="all")
        await producer.start()
        try:
            for p in range(6):
                await producer.send_and_wait(TOPIC, f"v{p}".encode(), partition=p)
        finally:
            await producer.stop()
        # Partitions 4 and 5 are broker-b's queues 0 and 1: the client went to its node.
        assert [a.store.max_offset(TOPIC, q) for q in range(4)] == [1, 1, 1, 1]
        assert [b.store.max_offset(TOPIC, q) for q in range(2)] == [1, 1]
        consumer = AIOKafkaConsumer(bootstrap_servers=f"127.0.0.1:{b.kafka_port}",
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(TOPIC, p) for p in range(6)])
            got: dict[int, bytes] = {}

            async def all_read() -> bool:
                batches = await consumer.getmany(timeout_ms=200)
                for tp, msgs in batches.items():
                    for m in msgs:
                        got[tp.partition] = m.value
                return len(got) == 6
            await eventually(all_read, msg=lambda: f"read {got}")
        finally:
            await consumer.stop()
        assert got == {p: f"v{p}".encode() for p in range(6)}


def test_kafka_port_on_a_cluster_broker_needs_a_node_id(broker_config: BrokerConfig) -> None:
    with pytest.raises(ConfigError) as info:
        broker_config.replace(namesrv_addr="127.0.0.1:9876", kafka_port=0)
    assert "kafka_node_id" in str(info.value) and "broker-a" in str(info.value)


def keys_by_coordinator(count: int) -> list[str]:
    """A group/transactional id owned by each of ``count`` coordinators, in node-id order."""
    out: dict[int, str] = {}
    for n in range(1000):
        out.setdefault(coordinator_index(f"key-{n}", count), f"key-{n}")
        if len(out) == count:
            break
    return [out[i] for i in range(count)]


async def test_find_coordinator_spreads_keys_and_the_wrong_broker_says_not_coordinator(
        broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        on_a, on_b = keys_by_coordinator(2)
        wire = await Wire.open(a.kafka_port)
        try:
            for key, node, port in ((on_a, 1, a.kafka_port), (on_b, 2, b.kafka_port)):
                for key_type in (0, 1):
                    found = await wire.call(ApiKey.FIND_COORDINATOR, 1, 1,
                                            {"key": key, "key_type": key_type})
                    assert (found["error_code"], found["node_id"], found["port"]) == (0, node, port)
            beat = await wire.call(ApiKey.HEARTBEAT, 1, 2, {"group_id": on_b, "generation_id": 1,
                                                            "member_id": "m"})
            end = await wire.call(ApiKey.END_TXN, 0, 3, {"transactional_id": on_b, "producer_id": 1,
                                                         "producer_epoch": 0, "committed": True})
            init = await wire.call(ApiKey.INIT_PRODUCER_ID, 0, 4, {
                "transactional_id": on_b, "transaction_timeout_ms": 10000})
        finally:
            wire.close()
        assert beat["error_code"] == end["error_code"] == init["error_code"] == \
            ErrorCode.NOT_COORDINATOR


async def test_a_consumer_group_commits_each_offset_in_the_group_owning_the_queue(
        broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        a, b = await two_groups(c)
        group = keys_by_coordinator(2)[0]  # coordinated by broker-a; partitions 4-5 on broker-b
        consumer = AIOKafkaConsumer(bootstrap_servers=f"127.0.0.1:{b.kafka_port}", group_id=group,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(TOPIC, p) for p in range(6)])
            await consumer.commit({TopicPartition(TOPIC, p): 10 + p for p in range(6)})
            fetched = {p: await consumer.committed(TopicPartition(TOPIC, p)) for p in range(6)}
        finally:
            await consumer.stop()
        assert fetched == {p: 10 + p for p in range(6)}
        assert [a.store.offsets.get(group, TOPIC, q) for q in range(4)] == [10, 11, 12, 13]
        assert [b.store.offsets.get(group, TOPIC, q) for q in range(2)] == [14, 15]


@pytest.fixture
async def controller(tmp_path):
    ctl = ControllerProcess(ControllerConfig(listen_host="127.0.0.1", port=0,
                                             data_dir=str(tmp_path / "controller"), lease=1.0))
    await ctl.start()
    try:
        yield ctl
    finally:
        await ctl.stop()


async def test_failover_moves_the_node_and_the_new_master_recovers_the_coordinator(
        broker_config: BrokerConfig, tmp_path, controller: ControllerProcess) -> None:
    base = broker_config.replace(controller_addr=controller.addr, controller_lease=1.0,
                                 controller_heartbeat_interval=0.2, metadata_sync_interval=0.2)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", kafka_node_id=1, **CLUSTER_KAFKA)
        b = await c.broker("broker-a", broker_id=1, kafka_node_id=1, **CLUSTER_KAFKA)
        await a.topics.create_or_update(TopicConfig(TOPIC, 2, 2))
        await eventually(lambda: a.roles.sync_state_set == {0, 1})
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{a.kafka_port}",
                                    transactional_id="tx-1")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(TOPIC, b"committed", partition=0)
            pid = producer._txn_manager.producer_id
            epoch = producer._txn_manager.producer_epoch
        finally:
            await producer.stop()
        await eventually(lambda: b.store.max_physical_offset == a.store.max_physical_offset
                         and b.topics.get(TOPIC) is not None)
        # A slave serves no partition and coordinates nothing.
        wire = await Wire.open(b.kafka_port)
        try:
            init = await wire.call(ApiKey.INIT_PRODUCER_ID, 0, 1, {
                "transactional_id": "tx-1", "transaction_timeout_ms": 10000})
        finally:
            wire.close()
        assert init["error_code"] == ErrorCode.NOT_COORDINATOR
        c.brokers.remove(a)
        await a.stop()
        await eventually(lambda: b.roles.is_master, timeout=15)
        await eventually(lambda: [n.port for n in b.kafka_view.nodes()] == [b.kafka_port])
        wire = await Wire.open(b.kafka_port)
        try:
            meta = await wire.call(ApiKey.METADATA, 8, 1, {"topics": [{"name": TOPIC}],
                                                           "allow_auto_topic_creation": False})
            again = await wire.call(ApiKey.INIT_PRODUCER_ID, 0, 2, {
                "transactional_id": "tx-1", "transaction_timeout_ms": 10000})
            fresh = await wire.call(ApiKey.INIT_PRODUCER_ID, 0, 3, {
                "transactional_id": "tx-2", "transaction_timeout_ms": 10000})
        finally:
            wire.close()
        # Same node id, now at the new master's address.
        assert meta["brokers"] == [{"node_id": 1, "host": "127.0.0.1", "port": b.kafka_port,
                                    "rack": None}]
        assert {p["leader_id"] for p in meta["topics"][0]["partitions"]} == {1}
        # The new master knows tx-1 from the replicated log: same producer id, next epoch;
        # and a new id gets a producer id never handed out before.
        assert (again["error_code"], again["producer_id"], again["producer_epoch"]) == \
            (0, pid, epoch + 1)
        assert fresh["error_code"] == 0 and fresh["producer_id"] > pid
