"""``txbroker serve --workers 2`` as a real process tree: the supervisor, its name server and two
broker processes on 127.0.0.1 ephemeral ports (the ``broker_process`` fixture, ``workers=2``).

The txbroker SDK talks to it as any RocketMQ 4.x client would, through the name server's
routes: transactions land on both workers, a check-back reaches the producer for a half on
worker 1, a consumer gets every committed message exactly once, a SIGKILLed worker is
restarted and loses nothing committed, SIGINT/SIGTERM (and the supervisor's own death) leave
no worker behind, and ``status`` / ``txn list`` show the workers as one broker."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from support.cli_runner import cli_ok, run_cli
from support.cluster import InProcessCluster, cluster_info
from support.waiting import eventually

from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient
from txbroker.client.instance import ClientInstance
from txbroker.config import BrokerConfig
from txbroker.workers import PORT_STEP

pytestmark = pytest.mark.slow

TOPIC = "TWorkers"
WORKERS = {"broker-a-w0", "broker-a-w1"}
SERVING_RE = re.compile(r"worker (\d+) \((\S+)\) (?:serving at|restarted: serving at) \S+,? "
                        r"(?:again, )?pid (\d+)")


def worker_pids(log_path: Path) -> dict[int, int]:
    """Worker index -> its latest pid, from the supervisor's log lines."""
    pids: dict[int, int] = {}
    for m in SERVING_RE.finditer(log_path.read_text(errors="replace")):
        pids[int(m.group(1))] = int(m.group(3))
    return pids


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


async def start_workers(broker_process, **overrides):
    proc = await asyncio.to_thread(broker_process, workers=2, **overrides)
    assert len(proc.worker_addrs) == 2, proc.worker_addrs
    async with AdminClient(proc.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, 2)
    instance = ClientInstance(proc.namesrv_addr)
    try:
        async def routed() -> bool:
            route = await instance.namesrv.route(TOPIC, refresh=True)
            return set(route.brokers) == WORKERS
        await eventually(routed, timeout=30, msg=f"{TOPIC} routed to both workers")
    finally:
        await instance.namesrv.close()
    return proc


class Listener(TransactionListener):
    """Commits at once, except bodies starting ``check``: left UNKNOW, committed by the
    check-back (which records the body)."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, msg, arg):
        if msg.body.startswith(b"check"):
            return LocalTransactionState.UNKNOW
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        self.checked.append(msg.body.decode())
        return LocalTransactionState.COMMIT_MESSAGE


async def consume_all(namesrv: str, group: str, bodies: list[str]) -> list[str]:
    """Every message of TOPIC from the first, as many as ``bodies``, then nothing more (the
    failure names what did not come)."""
    consumer = Consumer(group, namesrv, from_where="first", long_poll_timeout=2.0)
    consumer.subscribe(TOPIC)
    await consumer.start()
    got: list[str] = []
    try:
        async def arrived() -> bool:
            msg = await consumer.poll(0.5)
            if msg is not None:
                got.append(msg.body.decode())
            return len(got) >= len(bodies)
        await eventually(arrived, timeout=60,
                         msg=lambda: f"missing {sorted(set(bodies) - set(got))}")
        extra = await consumer.poll(2.0)
        assert extra is None, f"one more: {extra.body!r}"  # no duplicate follows
        return got
    finally:
        await consumer.shutdown()


async def test_transactions_spread_over_workers_and_check_back_on_worker_1(broker_process) -> None:
    proc = await start_workers(broker_process)
    listener = Listener()
    stored: dict[str, str] = {}  # body -> worker that stored it
    async with TransactionProducer("PG_WORKERS", proc.namesrv_addr, listener=listener) as producer:
        for i in range(20):
            result = await producer.send_message_in_transaction(Message(TOPIC, f"tx{i}".encode()))
            assert result.local_transaction_state == LocalTransactionState.COMMIT_MESSAGE
            stored[f"tx{i}"] = result.broker_name
        assert set(stored.values()) == WORKERS  # both workers took transactions
        for i in range(20):  # a half left open until one sits on worker 1
            body = f"check{i}"
            result = await producer.send_message_in_transaction(Message(TOPIC, body.encode()))
            stored[body] = result.broker_name
            if result.broker_name == "broker-a-w1":
                break
        on_w1 = [b for b, w in stored.items() if b.startswith("check") and w == "broker-a-w1"]
        assert on_w1, stored
        # every open half is checked back by the worker holding it (those on w0 too)
        opened = {b for b in stored if b.startswith("check")}
        await eventually(lambda: opened <= set(listener.checked), timeout=30,
                         msg=lambda: f"check-back for {opened}, got {listener.checked}")
        # consumed with the producer up: the END a check-back answer sends is one-way, and
        # until the worker has it the half is checked again
        got = await consume_all(proc.namesrv_addr, "CG_WORKERS", list(stored))
    assert sorted(got) == sorted(stored)  # every transaction, each once


async def test_killed_worker_is_restarted_and_keeps_what_was_committed(broker_process) -> None:
    proc = await start_workers(broker_process)
    pids = worker_pids(proc.log_path)
    assert set(pids) == {0, 1}
    committed: list[str] = []
    async with TransactionProducer("PG_KILL", proc.namesrv_addr, listener=Listener()) as producer:
        for i in range(12):
            await producer.send_message_in_transaction(Message(TOPIC, f"before{i}".encode()))
            committed.append(f"before{i}")
        os.kill(pids[1], signal.SIGKILL)
        await eventually(lambda: worker_pids(proc.log_path).get(1) not in (None, pids[1]),
                         timeout=60, msg=lambda: f"worker 1 restarted\n{proc.log_tail()}")
        assert "exited with signal SIGKILL; restarting it" in proc.log_path.read_text()
        assert worker_pids(proc.log_path)[0] == pids[0] and running(pids[0])  # left alone
        instance = ClientInstance(proc.namesrv_addr)
        try:
            async def routed() -> bool:
                return set((await instance.namesrv.route(TOPIC, refresh=True)).brokers) == WORKERS
            await eventually(routed, timeout=30, msg="worker 1 routed again")
        finally:
            await instance.namesrv.close()
        for i in range(12):
            await producer.send_message_in_transaction(Message(TOPIC, f"after{i}".encode()))
            committed.append(f"after{i}")
        # The producer stays up: an END in flight when worker 1 died (END is one-way) is
        # settled by a check-back from the restarted worker, as RocketMQ's would be.
        got = await consume_all(proc.namesrv_addr, "CG_KILL", committed)
    assert sorted(got) == sorted(committed)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_one_signal_stops_every_worker(broker_process, sig) -> None:
    proc = await start_workers(broker_process)
    pids = worker_pids(proc.log_path)
    assert len(pids) == 2 and all(running(p) for p in pids.values())
    proc.proc.send_signal(sig)
    code = await asyncio.to_thread(proc.proc.wait, 30)
    assert code == 0, proc.log_tail()
    assert not [p for p in pids.values() if running(p)]
    assert "2 workers and the name server stopped" in proc.log_tail()


async def test_workers_die_with_the_supervisor(broker_process) -> None:
    proc = await start_workers(broker_process)
    pids = worker_pids(proc.log_path)
    await asyncio.to_thread(proc.kill)  # SIGKILL: no shutdown code runs in the supervisor
    await eventually(lambda: not [p for p in pids.values() if running(p)], timeout=30,
                     msg="workers outlived their supervisor")


class LeaveOpen(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        return LocalTransactionState.UNKNOW


async def test_status_and_txn_list_show_the_workers_as_one_broker(broker_process) -> None:
    proc = await start_workers(broker_process, transaction_timeout=3600.0)
    ns = ("--namesrv", proc.namesrv_addr)
    on: dict[str, int] = {}
    async with TransactionProducer("PG_OPEN", proc.namesrv_addr, listener=LeaveOpen()) as producer:
        for i in range(30):
            result = await producer.send_message_in_transaction(Message(TOPIC, f"o{i}".encode()))
            on[result.broker_name] = on.get(result.broker_name, 0) + 1
            if set(on) == WORKERS and i >= 3:
                break
        assert set(on) == WORKERS, on
        table = cli_ok(await run_cli("txn", "list", *ns))
        cells = re.findall(r"^│ (w\d)\s+│", table, re.MULTILINE)
        assert sorted(cells) == sorted(["w0"] * on["broker-a-w0"] + ["w1"] * on["broker-a-w1"]), table
        assert f"per worker: w0={on['broker-a-w0']}  w1={on['broker-a-w1']}" in table, table
        assert "broker group" not in table

        out = cli_ok(await run_cli("status", *ns))
        total = sum(on.values())
        assert re.search(rf"broker broker-a\s+2 of 2 workers up .*pending half messages: {total}\b",
                         out), out
        assert len(re.findall(r"^broker ", out, re.MULTILINE)) == 1, out  # one broker heading
        for i in (0, 1):
            assert re.search(rf"worker w{i} broker-a-w{i}@\S+: master", out), out
        rows = re.findall(rf"^│ {TOPIC}\s+│ (w\d)\s+│", out, re.MULTILINE)
        assert rows == ["w0", "w1"], out  # one topics table, a row per worker
        assert re.search(rf"^total: 2 of 2 workers up  pending half messages: {total}\b", out,
                         re.MULTILINE), out


async def test_kafka_clients_see_one_node_per_worker(broker_process) -> None:
    proc = await start_workers(broker_process, kafka_port=0, kafka_cluster_refresh_interval=0.1)
    producer = AIOKafkaProducer(bootstrap_servers=proc.kafka_addr, acks="all")
    await producer.start()
    try:
        async def four_partitions() -> bool:
            # asked afresh each time: a view that numbered the topic while one worker's table
            # was not read yet showed 2 partitions, and the client keeps what it was told
            await producer.client.force_metadata_update()
            return len(producer.client.cluster.partitions_for_topic(TOPIC) or ()) == 4
        await eventually(four_partitions, timeout=30, msg=lambda: (
            f"2 x 2 queues as 4 partitions, got "
            f"{producer.client.cluster.partitions_for_topic(TOPIC)}"))
        nodes = {b.nodeId for b in producer.client.cluster.brokers()}
        assert nodes == {0, 1}  # one Kafka node per worker
        leaders = {p: producer.client.cluster.leader_for_partition(TopicPartition(TOPIC, p))
                   for p in range(4)}
        assert set(leaders.values()) == {0, 1}, leaders
        for i in range(8):
            await producer.send_and_wait(TOPIC, f"k{i}".encode(), partition=i % 4)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=proc.kafka_addr, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(4)])
        got: list[str] = []

        async def all_read() -> bool:
            batches = await consumer.getmany(timeout_ms=500)
            got.extend(r.value.decode() for rs in batches.values() for r in rs)
            return len(got) >= 8
        await eventually(all_read, timeout=30, msg=lambda: f"8 records, got {got}")
        assert sorted(got) == sorted(f"k{i}" for i in range(8))
    finally:
        await consumer.stop()


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _held_port_pair() -> tuple[socket.socket, int]:
    """A listening socket on some port P + 10 while P and P + 1 are free (bounded tries).

    P is picked below the kernel's ephemeral range: a port from there (``free_port``) is
    released before the broker binds it, and meanwhile any connection or port-0 bind made by a
    test running alongside may be handed it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    picks = random.Random()
    for _ in range(50):
        base = picks.randrange(low // 2, low - PORT_STEP - 1)
        if not (_bindable(base) and _bindable(base + 1)):
            continue
        held = socket.socket()
        try:
            held.bind(("127.0.0.1", base + PORT_STEP))
            held.listen()
        except OSError:
            held.close()
            continue
        return held, base
    raise AssertionError("no free port pair found in 50 tries")


async def test_a_worker_that_cannot_start_fails_the_start_with_one_error_line(tmp_path) -> None:
    held, base = _held_port_pair()  # worker 1's broker port is taken
    try:
        argv = [sys.executable, "-P", "-m", "txbroker", "serve", "--workers", "2",
                "--broker-port", str(base), "--namesrv-port", "0",
                "--data-dir", str(tmp_path / "d"), "--segment-size", "1MiB",
                "--max-message-size", "256KiB"]
        done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=60,
                                       env={k: v for k, v in os.environ.items()
                                            if not k.startswith("TXBROKER_")})
    finally:
        held.close()
    err = done.stderr.decode(errors="replace")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert done.returncode == 1, err
    want = f"error: cannot listen on 127.0.0.1:{base + PORT_STEP} (broker port): address already in use"
    assert errors == [want], err
    assert "Traceback" not in err and done.stdout == b""
    assert "worker 1 exited with code 1 before it was ready; the other workers were stopped" in err
    assert "2 workers and the name server stopped" in err  # worker 0 was stopped, not orphaned


async def test_workers_join_the_name_servers_they_are_given(broker_process, tmp_path) -> None:
    async with InProcessCluster(BrokerConfig(), tmp_path) as cluster:
        ns = await cluster.namesrv()
        proc = await asyncio.to_thread(broker_process, workers=2, namesrv_addr=ns.addr)
        assert proc.namesrv_addr == ns.addr  # no name server of its own
        info = await cluster_info(ns.addr)
        assert set(info.broker_addr_table) == WORKERS
        assert {info.broker_addr_table[w].master_addr() for w in WORKERS} == set(proc.worker_addrs)
        await asyncio.to_thread(proc.stop)
