"""TLS between brokers' Kafka sides (docs/security.md "Kafka over TLS"): two broker groups with
``tls_mode=enforcing`` (so ``tls_peers`` is on) whose Kafka view asks the name server and the
other master over TLS, forward a CreateTopics to the other group's Kafka port over TLS and
deliver a transaction's markers there over TLS.  Real brokers on 127.0.0.1, the unmodified
aiokafka client over SSL, certificates made by trustme.

The name server is ``permissive``: it answers the views over TLS and accepts the brokers'
registration either way."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer
from support.cluster import InProcessCluster
from support.waiting import eventually
from test_tls_kafka import Wire

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.tls import ClientTLS, ServerTLS
from txbroker.service.kafka.cluster_view import coordinator_index

TOPIC = "KTlsCluster"
TIMEOUT = 30


def _coordinated_by_first(groups: int) -> str:
    """A transactional id whose coordinator is the first group (node-id order)."""
    return next(f"key-{n}" for n in range(1000) if coordinator_index(f"key-{n}", groups) == 0)


async def test_brokers_forward_admin_requests_and_markers_over_tls(
        broker_config: BrokerConfig, pki, tmp_path) -> None:
    files = {"tls_cert": str(pki.cert_file), "tls_key": str(pki.key_file),
             "tls_ca": str(pki.ca_file)}
    client_tls = ClientTLS(ca=str(pki.ca_file)).context()
    async with InProcessCluster(broker_config, tmp_path) as c:
        ns = await c.namesrv(tls=ServerTLS("permissive", str(pki.cert_file), str(pki.key_file)))
        common = {"namesrv_addr": ns.addr, "tls_mode": "enforcing",
                  "cluster_secret": "tls-cluster-secret", "kafka_port": 0,
                  "kafka_cluster_refresh_interval": 0.1,
                  "kafka_group_initial_rebalance_delay": 0.2, **files}
        a = await c.broker("broker-a", kafka_node_id=1, **common)
        b = await c.broker("broker-b", kafka_node_id=2, **common)
        assert a.kafka_view.tls_context is not None and b.kafka_view.tls_context is not None
        for x in (a, b):
            await eventually(lambda x=x: x.kafka_view.ready() and len(x.kafka_view.nodes()) == 2,
                             timeout=TIMEOUT, msg=lambda x=x: f"view: {x.kafka_view.incomplete}")

        # CreateTopics at broker-a: broker-b's half is forwarded to its (TLS-only) Kafka port.
        wire = await Wire.open(a.kafka_port, client_tls)
        try:
            answer = await wire.call(ApiKey.CREATE_TOPICS, 4, {
                "topics": [{"name": TOPIC, "num_partitions": 4, "replication_factor": 1,
                            "assignments": [], "configs": []}],
                "timeout_ms": 5000, "validate_only": False})
        finally:
            wire.close()
        assert answer["topics"][0]["error_code"] == ErrorCode.NONE, answer
        assert [x.topics.get(TOPIC).write_queue_nums for x in (a, b)] == [2, 2]
        await eventually(lambda: all(len(x.kafka_view.slots(TOPIC)) == 4 for x in (a, b)),
                         timeout=TIMEOUT, msg="both views number the new topic")

        # A transaction coordinated by broker-a over both groups: the marker reaches
        # broker-b's Kafka port over TLS, or the commit never lands there.
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{b.kafka_port}",
                                    security_protocol="SSL", ssl_context=client_tls,
                                    transactional_id=_coordinated_by_first(2))

        async def transaction() -> None:
            async with producer.transaction():
                for p in (0, 2):  # 0-1 are broker-a's queues, 2-3 broker-b's
                    await producer.send_and_wait(TOPIC, f"commit-{p}".encode(), partition=p)

        await asyncio.wait_for(producer.start(), TIMEOUT)
        try:
            await asyncio.wait_for(transaction(), TIMEOUT)
        finally:
            await producer.stop()
        assert a.store.max_offset(TOPIC, 0) == 1 and b.store.max_offset(TOPIC, 0) == 1
        assert b.kafka_staging.staged_count() == 0
        assert a.kafka.tls_refusals == b.kafka.tls_refusals == 0
        assert a.server.tls_refusals == b.server.tls_refusals == 0
