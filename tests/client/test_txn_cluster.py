"""``txbroker txn list`` against two broker groups behind a standalone name server: the table
names each transaction's broker group in a column (also while every transaction sits in one
group), the per-group count names every group, and ``--json`` rows carry ``broker``.

Real parts: an in-process name server and two single-master groups on 127.0.0.1 port 0
(``support.cluster.InProcessCluster``), the SDK's TransactionProducer, the real CLI."""

from __future__ import annotations

import re

import orjson
import pytest
from support.cli_runner import cli_ok, run_cli
from support.cluster import InProcessCluster
from support.waiting import eventually

from txbroker.client import (
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.instance import ClientInstance
from txbroker.service.kafka.cluster_view import coordinator_index

GROUPS = ["broker-a", "broker-b"]
TOPIC = "TTxGroups"


class LeaveOpen(TransactionListener):
    """Every transaction stays pending (the long transaction timeout keeps checks away)."""

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        return LocalTransactionState.UNKNOW


@pytest.fixture
async def cluster(tmp_path, broker_config):
    async with InProcessCluster(broker_config.replace(transaction_timeout=3600.0), tmp_path) as c:
        await c.namesrv()
        for name in GROUPS:
            await c.broker(name)
        yield c


def _group_cells(table: str) -> list[str]:
    """The first cell of each body row of the halves' table."""
    return [m.group(1) for m in re.finditer(r"^│ (broker-\w)\s+│", table, re.MULTILINE)]


async def test_txn_list_names_the_broker_group_of_each_transaction(cluster) -> None:
    ns = ("--namesrv", cluster.namesrv_addr)
    cli_ok(await run_cli("topic", "create", TOPIC, "--queues", "2", "--cluster",
                         cluster.brokers[0].config.cluster_name, *ns))
    instance = ClientInstance(cluster.namesrv_addr)
    try:
        async def routed() -> bool:
            route = await instance.namesrv.route(TOPIC, refresh=True)
            return set(route.brokers) == set(GROUPS)

        await eventually(routed, timeout=40, msg=f"{TOPIC} routed to both groups")
    finally:
        await instance.namesrv.close()

    # no transaction yet: the column is there because the cluster has two groups
    empty = cli_ok(await run_cli("txn", "list", *ns))
    assert "broker group" in empty and "per broker group: broker-a=0  broker-b=0" in empty, empty

    async with TransactionProducer("PG_GROUPS", cluster.namesrv_addr, listener=LeaveOpen()) as producer:
        first = await producer.send_message_in_transaction(Message(TOPIC, b"first"))
        # one transaction, in one group: still named, and the other group counted as 0
        table = cli_ok(await run_cli("txn", "list", *ns))
        assert _group_cells(table) == [first.broker_name], table
        other = next(g for g in GROUPS if g != first.broker_name)
        assert f"{first.broker_name}=1" in table and f"{other}=0" in table
        sent = [first]
        for i in range(16):  # bounded: the producer spreads sends over both groups' queues
            if {r.broker_name for r in sent} == set(GROUPS):
                break
            sent.append(await producer.send_message_in_transaction(Message(TOPIC, f"m{i}".encode())))
        assert {r.broker_name for r in sent} == set(GROUPS)

        rows = orjson.loads(cli_ok(await run_cli("txn", "list", "--json", *ns)))
        assert {r["id"]: r["broker"] for r in rows} == {r.transaction_id: r.broker_name for r in sent}
        table = cli_ok(await run_cli("txn", "list", *ns))
        assert sorted(_group_cells(table)) == sorted(r.broker_name for r in sent), table
        for name in GROUPS:
            assert f"{name}={sum(r.broker_name == name for r in sent)}" in table


async def test_kafka_transactions_name_their_broker_group(tmp_path, broker_config) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    base = broker_config.replace(kafka_port=0, kafka_group_initial_rebalance_delay=0.2,
                                 kafka_transaction_scan_interval=3600.0)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        # one Kafka node per group; the transaction's coordinator is the group Kafka's hash
        # of its id names, whichever node the client bootstraps from
        brokers = [await c.broker(name, kafka_node_id=n + 1) for n, name in enumerate(GROUPS)]
        ns = ("--namesrv", c.namesrv_addr)
        target = brokers[coordinator_index("groups-app", len(brokers))]
        other = next(b for b in brokers if b is not target)
        cli_ok(await run_cli("topic", "create", "kgroups", "--queues", "1", *ns))
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{other.kafka_port}",
                                             transactional_id="groups-app")
        await producer.start()
        try:
            await producer.begin_transaction()
            await (await producer.send("kgroups", b"open", partition=0))
            table = cli_ok(await run_cli("txn", "list", *ns))
            assert "1 open Kafka transaction(s)" in table and "broker group" in table, table
            [line] = [ln for ln in table.splitlines() if "groups-app" in ln]
            assert line.startswith(f"│ {target.config.broker_name} "), table
            rows = orjson.loads(cli_ok(await run_cli("txn", "list", "--json", *ns)))
            assert [(r["kind"], r["broker"]) for r in rows] == [("kafka", target.config.broker_name)]
            await producer.abort_transaction()
        finally:
            await producer.stop()
