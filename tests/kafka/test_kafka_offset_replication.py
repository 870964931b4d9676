"""Kafka offsets across a failover and a crash on a cluster (docs/kafka.md, "Consumer groups"
and "Kafka on a cluster"): the commit metadata travels with the offsets to the slave, and the
offsets a transaction marker applies are durable before the marker is answered.  Real name
server, controller and brokers on loopback."""

from __future__ import annotations

import pytest
from support.cluster import InProcessCluster
from support.waiting import eventually
from test_kafka_cluster import CLUSTER_KAFKA, TOPIC, controller
from test_kafka_listener import Wire

from txbroker.config import BrokerConfig
from txbroker.controller import ControllerProcess
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.service.topics import TopicConfig

#: The controller fixture, shared with the cluster tests.
__all__ = ["controller"]


async def commit(port: int, group: str, offset: int, metadata: str) -> None:
    """A "simple" OffsetCommit (no member) of partition 0 with ``metadata``."""
    wire = await Wire.open(port)
    try:
        answer = await wire.call(ApiKey.OFFSET_COMMIT, 2, 1, {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "topics": [{"name": TOPIC, "partitions": [
                {"partition_index": 0, "committed_offset": offset,
                 "committed_metadata": metadata}]}]})
    finally:
        wire.close()
    assert answer["topics"][0]["partitions"][0]["error_code"] == 0


async def fetch(port: int, group: str) -> tuple[int, str | None, int]:
    """(offset, metadata, error) of partition 0 for ``group``."""
    wire = await Wire.open(port)
    try:
        answer = await wire.call(ApiKey.OFFSET_FETCH, 3, 1, {
            "group_id": group, "topics": [{"name": TOPIC, "partition_indexes": [0]}]})
    finally:
        wire.close()
    p = answer["topics"][0]["partitions"][0]
    return p["committed_offset"], p["metadata"], p["error_code"]


@pytest.mark.slow
async def test_commit_metadata_survives_a_failover(broker_config: BrokerConfig, tmp_path,
                                                   controller: ControllerProcess) -> None:
    base = broker_config.replace(controller_addr=controller.addr, controller_lease=1.0,
                                 controller_heartbeat_interval=0.2, metadata_sync_interval=0.2)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", kafka_node_id=1, **CLUSTER_KAFKA)
        b = await c.broker("broker-a", broker_id=1, kafka_node_id=1, **CLUSTER_KAFKA)
        await a.topics.create_or_update(TopicConfig(TOPIC, 2, 2))
        await eventually(lambda: a.roles.is_master and a.roles.sync_state_set == {0, 1}, timeout=15)
        await commit(a.kafka_port, "g-meta", 7, "checkpoint-7")
        # A recommit of the same offset with new metadata reaches the slave too.
        await commit(a.kafka_port, "g-meta", 7, "checkpoint-7b")
        await eventually(lambda: b.store.offsets.get("g-meta", TOPIC, 0) == 7
                         and b.topics.get(TOPIC) is not None, msg="the offset on the slave")
        await eventually(lambda: b.store.offsets.kafka_commit("g-meta", TOPIC, 0) is not None
                         and b.store.offsets.kafka_commit("g-meta", TOPIC, 0)[0] == "checkpoint-7b",
                         timeout=3, msg=lambda: f"slave has {b.store.offsets.kafka_commit('g-meta', TOPIC, 0)}")
        c.brokers.remove(a)
        await a.stop()
        await eventually(lambda: b.roles.is_master, timeout=15)
        await eventually(lambda: [n.port for n in b.kafka_view.nodes()] == [b.kafka_port])
        assert await fetch(b.kafka_port, "g-meta") == (7, "checkpoint-7b", 0)
        # The group is still a Kafka group on the new master (its commit time came along).
        assert "g-meta" in b.store.offsets.kafka_groups()
