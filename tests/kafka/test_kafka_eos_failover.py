"""Exactly once across broker groups through a failover to the slave: the aiokafka
consume-transform-produce app (tests/support/kafka_pipeline.py) on a controller-mode cluster,
``broker-a`` a master and its slave, ``broker-b`` one master.  The app's transactions are
coordinated by ``broker-a``, its consumer group by ``broker-b``; input and output partitions are
on both groups.  While it runs, ``broker-a``'s master is SIGKILLed and stays dead: the
controller promotes the slave, which rebuilds the coordinator from the replicated log alone
(docs/kafka.md, "Kafka on a cluster", "Failover").  At the end the output holds exactly one
record per input, read_committed.  (test_kafka_eos_groups.py restarts the killed process
instead.)"""

from __future__ import annotations

import asyncio
import json

import pytest
from support.kafka_e2e import per_input, produce_inputs, read_topic, start_app
from support.waiting import eventually
from test_kafka_cluster import keys_by_coordinator
from test_kafka_txn_groups_crash import create_topic, namesrv, seen_everywhere

from txbroker.bench.chaos.cluster import ServiceProcess, replica_info
from txbroker.bench.chaos.process import BrokerProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.chaos]
#: The name-server process fixture, shared with the crash tests.
__all__ = ["namesrv"]

INPUTS = 600
LEASE = 2.0
#: Seconds of running before broker-a's master is killed.
KILL_AFTER = 1.5


@pytest.fixture
def controller(tmp_path):
    """``txbroker controller`` as a process: its lease runs on its own loop, not the test's."""
    ctl = ServiceProcess(["controller", "--port", "0", "--data-dir", str(tmp_path / "controller"),
                          "--lease", str(LEASE)], r"^txbroker controller ready addr=(\S+)$",
                         tmp_path / "controller.log").start()
    try:
        yield ctl
    finally:
        ctl.stop()


def member(broker_process, tmp_path, name: str, broker_id: int, node: int, namesrv: str,
           controller: str, role: str = "SYNC_MASTER") -> BrokerProcess:
    """One broker of a controller-mode group, Kafka node ``node``, every port pinned."""
    return broker_process(tmp_path / f"{name}-{broker_id}", namesrv_port=-1, namesrv_addr=namesrv,
                          broker_name=name, broker_id=broker_id, broker_role=role,
                          broker_port=free_port(), ha_port=free_port(), kafka_port=free_port(),
                          kafka_node_id=node, kafka_cluster_refresh_interval=0.2,
                          kafka_transaction_scan_interval=0.2, controller_addr=controller,
                          controller_lease=LEASE, controller_heartbeat_interval=0.3,
                          metadata_sync_interval=0.2, slave_timeout=1.0,
                          kafka_group_initial_rebalance_delay=0.2,
                          kafka_group_min_session_timeout=1.0)


async def master_of(controller: str, group: str, procs: list[BrokerProcess]) -> BrokerProcess | None:
    info = await replica_info(controller, group)
    if info is None or info.master_id is None:
        return None
    return next((p for p in procs if p.broker_addr == info.master_addr), None)


async def test_pipeline_outputs_exactly_once_through_a_failover_to_the_slave(
        broker_process, namesrv, controller, tmp_path) -> None:
    a = [member(broker_process, tmp_path, "broker-a", i, 1, namesrv.addr, controller.addr)
         for i in (0, 1)]
    # broker-b has no slave: ASYNC_MASTER, or every acks=all write would wait for one.
    b = member(broker_process, tmp_path, "broker-b", 0, 2, namesrv.addr, controller.addr,
               "ASYNC_MASTER")

    async def a_in_sync() -> bool:
        info = await replica_info(controller.addr, "broker-a")
        return info is not None and len(info.sync_state_set) == 2 and \
            await master_of(controller.addr, "broker-a", a) is not None

    await eventually(a_in_sync, timeout=30, msg="broker-a: a master and its slave in sync")
    master = await master_of(controller.addr, "broker-a", a)
    assert master is not None
    slave = next(p for p in a if p is not master)
    await eventually(lambda: master_of(controller.addr, "broker-b", [b]), timeout=30,
                     msg="broker-b has a master")
    for topic in ("eos-in", "eos-out"):
        await create_topic(master, topic, 4)  # two partitions in each group
        await seen_everywhere([master, b], topic, [1, 1, 2, 2])
    tid, group = keys_by_coordinator(2)  # transactions on broker-a, the consumer group on broker-b
    bootstrap = ",".join(p.kafka_addr for p in (*a, b))
    inputs = await produce_inputs(bootstrap, "eos-in", INPUTS)
    log = tmp_path / "app.log"
    done: set[str] = set()

    def app():
        return start_app(bootstrap, "eos-in", "eos-out", group, tid, delay=0.05, idle_exit=4.0,
                         log=log)

    def reap(p) -> None:
        for line in p.stdout.read().splitlines():
            if line.startswith("committed "):
                done.update(json.loads(line.split(" ", 1)[1]))

    proc = app()
    try:
        await asyncio.sleep(KILL_AFTER)
        assert proc.poll() is None or proc.returncode == 0, log.read_text()[-3000:]
        master.kill()  # and it stays dead: the slave must take over
        await eventually(lambda: master_of(controller.addr, "broker-a", [slave]), timeout=30,
                         msg="the controller promotes broker-a's slave")
        mid_stream = len(done) < INPUTS
        for _ in range(5):  # the app gives up on a broker it lost: start it again
            code = await asyncio.wait_for(asyncio.to_thread(proc.wait), 90)
            reap(proc)
            if code == 0:
                break
            proc = app()
        assert proc.returncode == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert mid_stream, "the kill came after the app had finished"
    bootstrap = f"{slave.kafka_addr},{b.kafka_addr}"
    committed = await read_topic(bootstrap, "eos-out", "read_committed", 4)
    counts = per_input(committed)
    missing = [v for v in inputs if counts[v] == 0]
    twice = {v: n for v, n in counts.items() if n != 1}
    assert not missing and not twice, (len(missing), missing[:10], list(twice.items())[:10])
    assert len(committed) == INPUTS
