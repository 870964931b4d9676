"""A gRPC producer's transaction through a master failover in a two-group cluster: a
controller-mode group ``broker-a`` (master and slave, SYNC_MASTER) and a one-broker group
``broker-b``, gRPC on all three.  A 5.x producer sends plain messages and an orphaned half to
``broker-a``'s master and dies (SIGKILL); then that master is SIGKILLed and stays dead.  The
controller promotes the slave, which holds all of it (replicated before it was acknowledged); a
new producer at the new master's endpoint answers its check-back and the half commits there.
Then a producer given only ``broker-b``'s endpoint is routed to both groups, ``broker-a`` at its
new master's endpoint.  Nothing acknowledged is lost, and the decision is the checker's."""

from __future__ import annotations

import pytest

from tests.support.cluster import NamesrvSubprocess, route
from tests.support.waiting import eventually
from txbroker.bench.chaos.cluster import ServiceProcess, replica_info
from txbroker.bench.chaos.process import BrokerProcess, free_port
from txbroker.client.admin import AdminClient, TransactionNotFoundError

pytestmark = [pytest.mark.slow, pytest.mark.chaos]
TOPIC = "GFailover"
LEASE = 2.0


@pytest.fixture
def namesrv(tmp_path):
    server = NamesrvSubprocess(tmp_path / "namesrv.log").start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def controller(tmp_path):
    ctl = ServiceProcess(["controller", "--port", "0", "--data-dir", str(tmp_path / "controller"),
                          "--lease", str(LEASE)], r"^txbroker controller ready addr=(\S+)$",
                         tmp_path / "controller.log").start()
    try:
        yield ctl
    finally:
        ctl.stop()


async def master_of(controller: str, procs: list[BrokerProcess]) -> BrokerProcess | None:
    info = await replica_info(controller, "broker-a")
    if info is None or info.master_id is None:
        return None
    return next((p for p in procs if p.broker_addr == info.master_addr), None)


def member(broker_process, tmp_path, broker_id: int, namesrv: str, ctl: str,
           name: str = "broker-a", role: str = "SYNC_MASTER") -> BrokerProcess:
    return broker_process(tmp_path / f"{name}-{broker_id}", namesrv_port=-1, namesrv_addr=namesrv,
                          broker_name=name, broker_id=broker_id, broker_role=role,
                          broker_port=free_port(), ha_port=free_port(), grpc_port=free_port(),
                          controller_addr=ctl, controller_lease=LEASE,
                          controller_heartbeat_interval=0.3, metadata_sync_interval=0.2,
                          slave_timeout=1.0, transaction_timeout=1.0)


async def test_an_orphaned_grpc_half_is_committed_on_the_promoted_slave_and_routes_follow(
        broker_process, namesrv, controller, tmp_path, py5) -> None:
    procs = [member(broker_process, tmp_path, i, namesrv.addr, controller.addr) for i in (0, 1)]
    # broker-b has no slave: ASYNC_MASTER, or every write would wait for one.
    b = member(broker_process, tmp_path, 0, namesrv.addr, controller.addr, "broker-b",
               "ASYNC_MASTER")

    async def in_sync() -> bool:
        info = await replica_info(controller.addr, "broker-a")
        return info is not None and len(info.sync_state_set) == 2 and \
            await master_of(controller.addr, procs) is not None

    await eventually(in_sync, timeout=30, msg="broker-a master and slave in sync")
    master = await master_of(controller.addr, procs)
    slave = next(p for p in procs if p is not master)
    await py5("send", master.grpc_addr, TOPIC, 3, "--prefix", "plain")
    doomed = await py5.start("tx", master.grpc_addr, TOPIC, 1, "--end", "none", "--prefix", "half")
    events = await py5.events_until(doomed, "ended")
    tid = next(e["transaction_id"] for e in events if "half" in e)
    doomed.kill()
    await doomed.wait()
    master.kill()

    async def promoted() -> bool:
        return await master_of(controller.addr, [slave]) is slave

    await eventually(promoted, timeout=30, msg="the slave promoted")

    async def pending_at_the_new_master() -> bool:
        async with AdminClient(namesrv.addr) as admin:
            try:
                row = await admin.txn_show(tid)
            except TransactionNotFoundError:  # the name servers still list the old master
                return False
        assert row["state"] == "pending", row
        return True

    await eventually(pending_at_the_new_master, timeout=30, msg="the half pending, routed")
    await py5("check", slave.grpc_addr, TOPIC, 1, "--answer", "commit")
    async with AdminClient(namesrv.addr) as admin:
        row = await admin.txn_show(tid)
        assert (row["state"], row["source"]) == ("committed", "check")
        status = await admin.status()
    queues = status["broker-a"]["topics"][TOPIC]["queues"]
    assert sum(q["maxOffset"] for q in queues) == 4  # the 3 plain messages and the committed one

    # broker-b's endpoint routes the topic to both groups, broker-a at the promoted slave.
    async with AdminClient(namesrv.addr) as admin:
        await admin.create_topic(TOPIC, cluster="DefaultCluster")
    await eventually(lambda: routed_to_both(namesrv.addr), timeout=30, msg="both groups routed")
    await py5("send", b.grpc_addr, TOPIC, 16, "--prefix", "spread")
    async with AdminClient(namesrv.addr) as admin:
        status = await admin.status()
    stored = {g: sum(q["maxOffset"] for q in status[g]["topics"][TOPIC]["queues"])
              for g in ("broker-a", "broker-b")}
    assert stored["broker-a"] > 4 and stored["broker-b"] > 0, stored
    assert stored["broker-a"] + stored["broker-b"] == 4 + 16, stored


async def routed_to_both(namesrv: str) -> bool:
    got = await route(namesrv, TOPIC)
    return got is not None and {q.broker_name for q in got.queue_datas} == {"broker-a", "broker-b"}
