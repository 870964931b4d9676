"""The SDK and the operator CLI against two broker groups behind a standalone name server.

Real parts only: ``support.cluster.running_cluster`` starts a name server and two
single-broker groups (``broker-a``, ``broker-b``) on 127.0.0.1 port 0.  The module is skipped
until that helper exists.

* sends spread over both groups, and keep succeeding on the other group when one stops
  (failures and the longest gap are counted and printed; only the count is asserted);
* transactional sends over both groups end at the group that stored each half;
* a consumer rebalances over both groups' queues and commits each queue's offset to its group;
* ``txbroker topic create --cluster``, ``status`` and ``txn list`` show every broker.
"""

from __future__ import annotations

import time

import orjson
import pytest
from support.cli_runner import cli_ok, run_cli
from support.consuming import collect
from support.waiting import eventually

from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    Producer,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient
from txbroker.client.errors import ClientError
from txbroker.client.instance import ClientInstance

cluster_support = pytest.importorskip("support.cluster")

GROUPS = ["broker-a", "broker-b"]
TOPIC_QUEUES = 2
#: Bound on waits for the name server to list a new topic on both groups.
ROUTE_WAIT = 40.0


@pytest.fixture
async def cluster(tmp_path, broker_config):
    """One name server and the groups of GROUPS, each a single master; ``.namesrv_addr``
    and ``.brokers``.  Uses the helper's ``running_cluster`` when it offers one, else builds
    the same with its ``InProcessCluster``."""
    if hasattr(cluster_support, "running_cluster"):
        async with cluster_support.running_cluster(tmp_path, groups=GROUPS, slaves=0) as c:
            yield c
        return
    async with cluster_support.InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv()
        for name in GROUPS:
            await c.broker(name)
        yield c


def _cluster_name(cluster) -> str:
    return cluster.brokers[0].config.cluster_name


async def _create_topic(cluster, topic: str) -> None:
    """``txbroker topic create --cluster`` on both masters, then wait until the name server
    routes the topic to both groups."""
    out = cli_ok(await run_cli("topic", "create", topic, "--queues", str(TOPIC_QUEUES),
                               "--cluster", _cluster_name(cluster), "--namesrv", cluster.namesrv_addr))
    for name in GROUPS:
        assert f"broker {name} at " in out and "created" in out, out
    assert f"created on 2 of 2 master(s) of cluster {_cluster_name(cluster)}" in out
    instance = ClientInstance(cluster.namesrv_addr)

    async def routed() -> bool:
        route = await instance.namesrv.route(topic, refresh=True)
        return set(route.brokers) == set(GROUPS) and len(route.write_queues()) == 2 * TOPIC_QUEUES

    try:
        await eventually(routed, timeout=ROUTE_WAIT, msg=f"{topic} routed to both groups")
    finally:
        await instance.namesrv.close()


def _by_name(cluster, name: str):
    [broker] = [b for b in cluster.brokers if b.config.broker_name == name]
    return broker


async def test_sends_spread_over_both_groups_and_cli_shows_the_cluster(cluster) -> None:
    await _create_topic(cluster, "TSpread")
    async with Producer("PG_SPREAD", cluster.namesrv_addr) as producer:
        results = [await producer.send(Message("TSpread", f"m{i}".encode())) for i in range(16)]
    per_group = {name: sum(r.broker_name == name for r in results) for name in GROUPS}
    assert all(n > 0 for n in per_group.values()), per_group

    ns = ("--namesrv", cluster.namesrv_addr)
    out = cli_ok(await run_cli("status", *ns))
    for broker in cluster.brokers:
        assert f"broker {broker.config.broker_name}@{broker.broker_addr} (master, epoch 1)" in out
    [total] = [line for line in out.splitlines() if line.startswith("total: ")]
    assert "2 of 2 broker(s) reachable in 2 group(s)" in total and "messages: 16" in total
    docs = orjson.loads(cli_ok(await run_cli("status", "--json", *ns)))
    assert set(docs) == set(GROUPS)
    for name in GROUPS:
        queues = docs[name]["topics"]["TSpread"]["queues"]
        assert sum(q["maxOffset"] for q in queues) == per_group[name]
    rows = orjson.loads(cli_ok(await run_cli("txn", "list", "--json", *ns)))
    assert rows == []
    # the cluster's masters already hold the topic: nothing to create
    again = await run_cli("topic", "create", "TSpread", "--cluster", _cluster_name(cluster), *ns)
    assert again.exit_code == 1 and "already exists" in again.stderr
    unknown = await run_cli("topic", "create", "TOther", "--cluster", "NoSuchCluster", *ns)
    assert unknown.exit_code == 1 and "no cluster 'NoSuchCluster'" in unknown.stderr


async def test_sends_keep_succeeding_on_the_other_group_when_one_stops(cluster) -> None:
    await _create_topic(cluster, "TFail")
    stopped = _by_name(cluster, "broker-a")
    failures, after_stop, gap, last_ok = 0, [], 0.0, time.monotonic()
    async with Producer("PG_FAIL", cluster.namesrv_addr, send_timeout=2.0) as producer:
        for i in range(60):  # bounded: 60 sends
            if i == 20:
                await stopped.stop()
            try:
                result = await producer.send(Message("TFail", f"m{i}".encode()))
            except ClientError as exc:  # counted, not raised: the figure is the point
                failures += 1
                print(f"send {i} failed: {exc}")
                continue
            now = time.monotonic()
            gap, last_ok = max(gap, now - last_ok), now
            if i >= 20:
                after_stop.append(result.broker_name)
        print(f"failures={failures} longest gap between successful sends={gap:.3f}s")
        # each failed attempt on the stopped group was retried on the other group
        assert failures == 0
        assert set(after_stop) == {"broker-b"} and len(after_stop) == 40
        assert "broker-a" in producer.faults.items  # its failure was recorded for a back-off


class KeyListener(TransactionListener):
    def __init__(self) -> None:
        self.executed: dict[str, str] = {}

    def execute_local_transaction(self, msg, arg):
        self.executed[msg.transaction_id] = msg.broker_name
        return (LocalTransactionState.COMMIT_MESSAGE if msg.keys == "c"
                else LocalTransactionState.ROLLBACK_MESSAGE)

    def check_local_transaction(self, msg):
        return LocalTransactionState.UNKNOW  # every outcome was sent at once


async def test_transactions_over_both_groups_end_at_their_group(cluster) -> None:
    await _create_topic(cluster, "TTxC")
    listener = KeyListener()
    async with TransactionProducer("PG_TXC", cluster.namesrv_addr, listener=listener) as producer:
        results = [await producer.send_message_in_transaction(
            Message("TTxC", f"m{i}".encode(), keys="c" if i % 2 == 0 else "r")) for i in range(16)]
    assert {r.broker_name for r in results} == set(GROUPS)
    await eventually(lambda: all(b.tx.pending_count() == 0 for b in cluster.brokers),
                     msg="every half ended on its own group")
    committed = {r.transaction_id: r.broker_name for r in results
                 if r.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE}
    assert len(committed) == 8
    consumer = Consumer("CG_TXC", cluster.namesrv_addr, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("TTxC")
    async with consumer:
        got = await collect(consumer, 8)
        assert await consumer.poll(1.0) is None  # no rolled-back half became visible
    assert {m.transaction_id: m.broker_name for m in got} == committed


async def test_consumer_rebalances_over_both_groups_and_commits_to_each(cluster) -> None:
    await _create_topic(cluster, "TCons")
    async with Producer("PG_CONS", cluster.namesrv_addr) as producer:
        sent = [await producer.send(Message("TCons", f"m{i}".encode())) for i in range(16)]
    consumer = Consumer("CG_CONS", cluster.namesrv_addr, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("TCons")
    async with consumer:
        assert {q.broker_name for q in consumer.assignment()} == set(GROUPS)
        assert len(consumer.assignment()) == 2 * TOPIC_QUEUES
        got = await collect(consumer, 16)
    assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(16))
    expected: dict[str, dict[str, int]] = {name: {} for name in GROUPS}
    for r in sent:
        queues = expected[r.broker_name]
        queues[str(r.queue_id)] = max(queues.get(str(r.queue_id), 0), r.queue_offset + 1)
    async with AdminClient(cluster.namesrv_addr) as admin:
        docs = await admin.status()
    for name in GROUPS:
        offsets = docs[name]["consumerGroups"]["CG_CONS"]["offsets"]["TCons"]
        assert {q: o for q, o in offsets.items() if o} == expected[name], name
