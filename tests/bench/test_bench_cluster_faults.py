"""The bench's embedded cluster and fault plans, on real processes (loopback, free ports).

* a 2-group cluster starts healthy, with the trace's transaction settings on every broker and
  a Kafka view over both groups;
* a kill-master plan under a few hundred SDK transactions: the event is recorded with its
  times, the slave is promoted, the killed broker rejoins, and the chaos Ledger finds every
  committed transaction delivered, stored once, nothing else delivered;
* a pause and a partition (the cluster behind proxies), each applied once and healed, under
  the same load.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from txbroker.bench.chaos.driver import LedgerListener
from txbroker.bench.chaos.ledger import KINDS, Ledger
from txbroker.bench.kafka_cluster import metadata_leaders
from txbroker.bench.trace.cluster import EmbeddedCluster
from txbroker.bench.trace.embedded import serve_settings
from txbroker.bench.trace.faultplan import FaultRunner, parse_plan
from txbroker.bench.trace.spec import BrokerSettings
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient
from txbroker.client.errors import ClientError
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

#: The trace's settings: a check max the brokers' defaults (1000) would never show.
TRACE = BrokerSettings(transaction_timeout=0.5, transaction_check_interval=0.2, transaction_check_max=2)
TOPIC = "FaultTopic"
#: Pause between a producer's transactions: a few hundred over a plan of seconds.
PACE = 0.03


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T``: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


async def create_topic(namesrv: str) -> None:
    async with AdminClient(namesrv) as admin:
        await admin.create_topic(TOPIC, 2)


async def wait_for(predicate, timeout: float, what: str) -> None:
    """Poll a blocking ``predicate`` off the loop until true (bounded)."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(predicate):
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        await asyncio.sleep(0.2)


async def pending_halves(namesrv: str) -> int | None:
    try:
        async with AdminClient(namesrv, timeout=2.0) as admin:
            docs = await admin.status()
    except (ClientError, OSError, TimeoutError):
        return None
    return sum(int(d.get("pendingHalfMessages", 0)) for d in docs.values() if d.get("role") == "master")


async def transactional_load(cluster: EmbeddedCluster, ledger: Ledger, done, *, min_txns: int,
                             max_seconds: float = 90.0) -> None:
    """Two SDK TransactionProducers (the Ledger's seeded kinds) until ``done()`` and at least
    ``min_txns`` transactions, then every delivery of a fresh consumer group, settled."""
    namesrv = cluster.namesrv_addr
    groups = cluster.group_names
    consumer = Consumer("fault_cg", namesrv, from_where="first", long_poll_timeout=1.0,
                        rebalance_interval=1.0, persist_interval=0.2, pull_error_backoff=0.2,
                        request_timeout=2.0, heartbeat_interval=1.0)
    consumer.subscribe(TOPIC)
    await consumer.start()
    stop_consume = asyncio.Event()

    async def consume() -> None:
        while not stop_consume.is_set():
            msg = await consumer.poll(0.3)
            if msg is not None:  # a queue is (group, queue id): both groups have queue 0
                ledger.delivered(msg.keys or "", groups.index(msg.broker_name) * 1000 + msg.queue_id,
                                 msg.queue_offset)

    # Heartbeats every second: a newly promoted master sends check-backs only to producers
    # that have told it they are there.
    producers = [TransactionProducer("fault_pg", namesrv, listener=LedgerListener(ledger),
                                     send_timeout=2.0, retries=2, heartbeat_interval=1.0)
                 for _ in range(2)]
    for p in producers:
        await p.start()
    sent = 0
    deadline = time.monotonic() + max_seconds

    async def produce(idx: int, producer: TransactionProducer) -> None:
        nonlocal sent
        for i in range(100_000):
            if (done() and sent >= min_txns) or time.monotonic() > deadline:
                return
            key = f"p{idx}-{i}"
            ledger.begin(key, KINDS[i % len(KINDS)])
            try:
                await producer.send_message_in_transaction(Message(TOPIC, key.encode(), keys=key), key)
            except (ClientError, OSError, TimeoutError):
                ledger.send_failed(key)
            sent += 1
            await asyncio.sleep(PACE)

    consuming = asyncio.ensure_future(consume())
    try:
        await asyncio.gather(*(produce(i, p) for i, p in enumerate(producers)))
        settle = time.monotonic() + 60
        while time.monotonic() < settle:
            if await pending_halves(namesrv) == 0 and not ledger.missing_commits():
                break
            await asyncio.sleep(0.3)
        await asyncio.sleep(1.0)  # a late duplicate would show up now
    finally:
        stop_consume.set()
        await consuming
        for p in producers:
            await p.shutdown()
        await consumer.shutdown()


def assert_clean(ledger: Ledger, cluster: EmbeddedCluster, at_least: int) -> None:
    report = ledger.verify(pending_at_end=0)
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(cluster.root.glob("*.log")))
    committed = [k for k, t in ledger.txns.items() if t.truth == "commit"]
    assert len(ledger.txns) >= at_least
    assert len(committed) >= at_least // 3
    assert report.ok, report.table() + "\n" + logs
    assert report.lost == [] and report.duplicated == [] and report.wrongly_delivered == []
    # Every committed transaction consumed, from one stored position only.
    assert all(len(ledger.positions[k]) == 1 for k in committed)


class NeverDecides(TransactionListener):
    """Answers UNKNOW to everything and counts the checks: a ``never`` row of a trace."""

    def __init__(self) -> None:
        self.checks: dict[str, int] = {}

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        self.checks[msg.keys] = self.checks.get(msg.keys, 0) + 1
        return LocalTransactionState.UNKNOW


async def test_two_group_cluster_starts_with_the_trace_settings_and_a_kafka_view(tmp_path):
    cluster = EmbeddedCluster(2, TRACE, root=tmp_path / "c")
    try:
        seconds = await asyncio.to_thread(cluster.start)
        print(f"cluster of 2 groups started and healthy in {seconds:.1f} s")
        masters = await asyncio.to_thread(lambda: {g: cluster.master_of(g) for g in cluster.group_names})
        assert masters == {"broker-a": "broker-a-0", "broker-b": "broker-b-0"}
        pids = cluster.broker_pids()
        assert len(set(pids)) == 4
        for pid in pids:  # every broker, slaves too, runs with the trace's settings
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert argv[argv.index(b"--transaction-check-max") + 1] == b"2"
            assert argv[argv.index(b"--broker-role") + 1] == b"SYNC_MASTER"
        await create_topic(cluster.namesrv_addr)

        # A `never` transaction on each group's master is checked check_max times, then discarded.
        listener = NeverDecides()
        producer = TransactionProducer("never_pg", cluster.namesrv_addr, listener=listener)
        await producer.start()
        try:
            brokers = set()
            for i in range(4):  # the producer takes the groups' queues in turn
                result = await producer.send_message_in_transaction(
                    Message(TOPIC, b"x", keys=f"never-{i}"), None)
                brokers.add(result.broker_name)
            assert brokers == {"broker-a", "broker-b"}
            deadline = time.monotonic() + 30
            while await pending_halves(cluster.namesrv_addr) != 0:
                assert time.monotonic() < deadline, listener.checks
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # a third check would come within 5 intervals
        finally:
            await producer.shutdown()
        # Discarded (nothing pending) within seconds: after 2 checks, not the brokers' 1000.
        # The SDK drops a check of a transaction whose previous check is still running, so
        # the listener may have seen one of the two.
        assert set(listener.checks) == {f"never-{i}" for i in range(4)}
        assert all(1 <= n <= 2 for n in listener.checks.values()), listener.checks

        # The Kafka view: every listener of the bootstrap list numbers the partitions alike,
        # two per group, each led by its group's node.
        addrs = cluster.bootstrap.split(",")
        assert len(addrs) == 4
        deadline = time.monotonic() + 30
        while True:
            seen = [await metadata_leaders(a, TOPIC) for a in addrs]
            if all(s == [1, 1, 2, 2] for s in seen):
                break
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.3)
    finally:
        await asyncio.to_thread(cluster.close)


async def test_kill_master_plan_under_transactions(tmp_path):
    # The single broker's settings, as `bench run` makes them: the cluster keeps its own
    # ports, hosts and names, and takes the rest.
    cluster = EmbeddedCluster(2, serve_settings(TRACE), root=tmp_path / "c")
    await asyncio.to_thread(cluster.start)
    try:
        await create_topic(cluster.namesrv_addr)
        assert await asyncio.to_thread(cluster.master_of, "broker-a") == "broker-a-0"
        plan = parse_plan([{"at": 2, "action": "kill-master", "group": "broker-a", "restart_after": 3}],
                          "plan")
        epoch_ms = time.time() * 1000
        runner = FaultRunner(plan, cluster, epoch_ms).start()
        ledger = Ledger()
        promoted_ms: list[float] = []

        rejoined_ms: list[float] = []

        async def watch() -> None:  # when the controller named the slave; when both are in sync
            while not promoted_ms:
                if await asyncio.to_thread(cluster.master_of, "broker-a") == "broker-a-1":
                    promoted_ms.append(time.time() * 1000)
                await asyncio.sleep(0.1)
            while not ended():
                await asyncio.sleep(0.1)
            if await asyncio.to_thread(cluster.wait_healthy, 60):
                rejoined_ms.append(time.time() * 1000)

        def ended() -> bool:
            return bool(runner.events) and runner.events[0]["until_ms"] is not None

        watcher = asyncio.ensure_future(watch())
        await transactional_load(cluster, ledger, ended, min_txns=300)
        events = runner.stop()
        await asyncio.wait_for(watcher, 70)
        path = tmp_path / "faults.json"
        runner.write(path)

        assert runner.errors == []
        (row,) = events
        assert set(row) == {"at_ms", "action", "target", "until_ms"}
        assert row["action"] == "kill-master" and row["target"] == "broker-a-0"
        assert epoch_ms + 2000 <= row["at_ms"] < epoch_ms + 10_000
        assert row["until_ms"] >= row["at_ms"] + 3000
        assert row["at_ms"] < promoted_ms[0] < row["at_ms"] + 30_000
        assert path.read_text().count('"kill-master"') == 1
        assert rejoined_ms, "the killed broker did not rejoin"
        # The slave stays master; the restarted broker is its slave now.
        assert await asyncio.to_thread(cluster.master_of, "broker-a") == "broker-a-1"
        assert len(cluster.broker_pids()) == 4
        print(f"master killed: promoted after {(promoted_ms[0] - row['at_ms']) / 1000:.1f} s, "
              f"restarted after {(row['until_ms'] - row['at_ms']) / 1000:.1f} s, "
              f"group in sync again {(rejoined_ms[0] - row['until_ms']) / 1000:.1f} s after the restart")
        assert_clean(ledger, cluster, 300)
    finally:
        await asyncio.to_thread(cluster.close)


async def answers(addr: str, timeout: float = 1.0) -> bool:
    """Whether the broker at ``addr`` answers a request within ``timeout``."""
    client = RemotingClient(addr, reconnect=False)
    try:
        resp = await client.invoke(RemotingCommand.request(RequestCode.BROKER_STATUS), timeout)
        return resp.code == ResponseCode.SUCCESS
    except (OSError, TimeoutError):
        return False
    finally:
        await client.close()


async def test_pause_and_partition_applied_once_and_healed(tmp_path):
    cluster = EmbeddedCluster(2, asdict(TRACE), root=tmp_path / "c", partitionable=True)
    await asyncio.to_thread(cluster.start)
    try:
        await create_topic(cluster.namesrv_addr)
        b0 = cluster.brokers["broker-b-0"]
        a0 = cluster.brokers["broker-a-0"]
        assert await asyncio.to_thread(cluster.master_of, "broker-a") == "broker-a-0"
        assert await answers(a0.broker_addr)
        plan = parse_plan([{"at": 1, "action": "pause", "target": "broker-b-0", "for": 2},
                           {"at": 4, "action": "partition", "target": "broker-a-master", "for": 6}],
                          "plan")
        epoch_ms = time.time() * 1000
        runner = FaultRunner(plan, cluster, epoch_ms).start()
        seen: dict[str, list[float]] = {"stopped": [], "a0 silent": [], "a1 master": []}

        rejoined_ms: list[float] = []

        async def watch() -> None:
            while not ended():
                now = time.time() * 1000
                if proc_state(b0.pid) == "T":
                    seen["stopped"].append(now)
                if len(runner.events) == 2:
                    if not await answers(a0.broker_addr, 0.5):
                        seen["a0 silent"].append(now)
                    if await asyncio.to_thread(cluster.master_of, "broker-a") == "broker-a-1":
                        seen["a1 master"].append(now)
                await asyncio.sleep(0.1)
            if await asyncio.to_thread(cluster.wait_healthy, 60):
                rejoined_ms.append(time.time() * 1000)

        def ended() -> bool:
            return len(runner.events) == 2 and runner.events[1]["until_ms"] is not None

        ledger = Ledger()
        watcher = asyncio.ensure_future(watch())
        await transactional_load(cluster, ledger, ended, min_txns=200)
        await asyncio.wait_for(watcher, 70)
        events = runner.stop()

        assert runner.errors == []
        pause, cut = events
        assert (pause["action"], pause["target"]) == ("pause", "broker-b-0")
        assert (cut["action"], cut["target"]) == ("partition", "broker-a-0")
        assert pause["until_ms"] >= pause["at_ms"] + 2000 and cut["until_ms"] >= cut["at_ms"] + 6000
        # The pause held (the process stopped) and ended (it runs again).
        assert seen["stopped"] and all(pause["at_ms"] - 50 <= t <= pause["until_ms"] + 50 for t in seen["stopped"])
        assert proc_state(b0.pid) != "T"
        # The partition cut clients and the controller off: requests went unanswered and the
        # controller promoted the slave; healed, the old master answers and rejoins as slave.
        assert seen["a0 silent"] and seen["a1 master"], seen
        assert await answers(a0.broker_addr, 5.0)
        assert rejoined_ms, "the partitioned broker did not rejoin"
        assert await asyncio.to_thread(cluster.master_of, "broker-a") == "broker-a-1"
        print(f"partition: promoted {(seen['a1 master'][0] - cut['at_ms']) / 1000:.1f} s after the cut, "
              f"old master in sync again {(rejoined_ms[0] - cut['until_ms']) / 1000:.1f} s after the heal")
        assert_clean(ledger, cluster, 200)
    finally:
        await asyncio.to_thread(cluster.close)
