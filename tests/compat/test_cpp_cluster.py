"""The unmodified RocketMQ C++ client (rocketmq==0.4.4) against a cluster of broker groups.

Two groups behind one name server: the client's routes carry two brokerDatas, its sends
spread over both groups' queues and its consumer reads every queue of both.  Then a group
with a controller loses its master to SIGKILL while the client keeps producing.

What the C++ client does on a failover (observed, and asserted below): it refreshes a topic's
route from the name server only every 30 s, so for that long it still names the dead master's
address.  A send that picks one of that group's queues fails to connect and the client retries
it on a queue of another group (it avoids the broker that just failed), so with a second group
every send is still acknowledged; once the route is refreshed it sends to the promoted slave,
now id 0 of the group.  The first refresh comes 3 s after the client starts, then every 30 s
(the client's fixed schedule), so the gap before the promoted master gets sends is up to 30 s.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from compat_cpp import CppRun, run_cpp
from support.cluster import InProcessCluster, cluster_info, route
from support.waiting import eventually

from txbroker.bench.chaos.process import BrokerProcess, free_port
from txbroker.client.admin import AdminClient
from txbroker.controller import ControllerConfig, ControllerProcess
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import GetMaxOffsetRequestHeader

pytestmark = pytest.mark.needs_cpp

TOPIC = "CompatCluster"
#: Seconds between route refreshes in the C++ client (its fixed topic-route update period,
#: after a first refresh 3 s after start; see its log: updateTopicRouteInfoFromNameServer).
CPP_ROUTE_PERIOD = 30.0


def stored_bodies(broker, topic: str = TOPIC) -> list[bytes]:
    out = []
    for qid in broker.store.queues().get(topic, []):
        out.extend(m.body for m in broker.store.get(topic, qid, 0, 1000).messages())
    return out


async def create_topic(namesrv: str) -> None:
    async with AdminClient(namesrv) as admin:
        await admin.create_topic(TOPIC, 4, cluster="DefaultCluster")


async def test_cpp_producer_and_pull_consumer_span_two_groups(broker_config, tmp_path):
    async with InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a")
        b = await c.broker("broker-b")
        await create_topic(c.namesrv_addr)
        r = await route(c.namesrv_addr, TOPIC)
        assert sorted(bd.broker_name for bd in r.broker_datas) == ["broker-a", "broker-b"]

        n = 24
        run = await run_cpp(tmp_path / "prod", scenario="send_sync", namesrv=c.namesrv_addr,
                            topic=TOPIC, group="PID_CPP_CLUSTER", count=n, body="spread")
        run.assert_clean()
        assert [e["status"] for e in run.of("sent")] == [0] * n
        on_a, on_b = stored_bodies(a), stored_bodies(b)
        # Round-robin over the 8 queues of both groups: each group holds half.
        assert len(on_a) == len(on_b) == n // 2, (len(on_a), len(on_b))
        assert sorted(on_a + on_b) == sorted(b"spread %d" % i for i in range(n))

        pull = await run_cpp(tmp_path / "pull", scenario="pull_consume", namesrv=c.namesrv_addr,
                             topic=TOPIC, group="CID_CPP_CLUSTER")
        pull.assert_clean()
        assert sorted(m["body"] for m in pull.of("msg")) == sorted(f"spread {i}" for i in range(n))

        push = await run_cpp(tmp_path / "push", timeout=40, scenario="push_consume",
                             namesrv=c.namesrv_addr, topic=TOPIC, group="CID_CPP_CLUSTER_PUSH",
                             expect=n, max_seconds=30, linger=1.0)
        push.assert_clean()
        assert sorted(m["body"] for m in push.of("msg")) == sorted(f"spread {i}" for i in range(n))

        # Each group's offsets were committed to that group, the owner of the queue: together
        # they cover every message.
        def committed(broker) -> int:
            table = broker.store.offsets.groups().get("CID_CPP_CLUSTER_PUSH", {}).get(TOPIC, {})
            return sum(table.values())

        await eventually(lambda: committed(a) == len(on_a) and committed(b) == len(on_b), 15.0,
                         lambda: f"committed offsets a={committed(a)} b={committed(b)}")


#: A subprocess broker's settings: small and fast, as the in-process test brokers'.
PROC_SETTINGS = {
    "listen_host": "127.0.0.1", "namesrv_port": -1, "metrics_port": -1,
    "segment_size": 1024 * 1024, "max_message_size": 256 * 1024, "consume_queue_entries": 4096,
    "flush_interval": 0.05,
    "offset_persist_interval": 0.2, "transaction_check_interval": 0.2,
    "transaction_timeout": 0.5, "shutdown_grace": 1.0, "metadata_sync_interval": 0.2,
}


async def max_offset_sum(addr: str) -> int:
    """Messages of TOPIC the broker at ``addr`` holds (sum of its queues' max offsets)."""
    client = RemotingClient(addr, reconnect=False)
    try:
        total = 0
        for qid in range(4):
            cmd = RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                          GetMaxOffsetRequestHeader(topic=TOPIC, queue_id=qid).to_ext())
            resp = await client.invoke(cmd, 5.0)
            assert resp.code == ResponseCode.SUCCESS, (addr, resp.code, resp.remark)
            total += int(resp.ext_fields["offset"])
        return total
    finally:
        await client.close()


def group_addrs(r, name: str) -> dict[int, str]:
    return next((bd.broker_addrs for bd in r.broker_datas if bd.broker_name == name), {}) if r else {}


async def test_cpp_producer_keeps_sending_through_a_master_kill(broker_config, tmp_path):
    ctl = ControllerProcess(ControllerConfig(listen_host="127.0.0.1", port=0,
                                             data_dir=str(tmp_path / "ctl"), lease=1.0))
    await ctl.start()
    procs: list[BrokerProcess] = []
    cpp: CppRun | None = None
    try:
        async with InProcessCluster(broker_config, tmp_path) as c:
            await c.namesrv()
            b = await c.broker("broker-b")
            for broker_id in (0, 1):
                p = BrokerProcess(tmp_path / f"a{broker_id}", {
                    **PROC_SETTINGS, "namesrv_addr": c.namesrv_addr, "broker_name": "broker-a",
                    "broker_id": broker_id, "broker_role": "SYNC_MASTER",
                    "ha_port": free_port(), "controller_addr": ctl.addr,
                    "controller_lease": 1.0, "controller_heartbeat_interval": 0.2},
                    tmp_path / f"a{broker_id}.log")
                await asyncio.to_thread(p.start)
                procs.append(p)
            master, slave = procs

            async def a_route() -> dict[int, str]:
                return group_addrs(await route(c.namesrv_addr, TOPIC), "broker-a")

            await eventually(lambda: _cluster_ready(c.namesrv_addr, master, slave), 20.0,
                             "broker-a registered with its master (id 0) and slave (id 1)")
            await create_topic(c.namesrv_addr)
            await eventually(lambda: _has_both(c.namesrv_addr), 10.0, "both groups in the route")

            stop = tmp_path / "stop-producing"
            cpp = await CppRun({"scenario": "send_sync", "namesrv": c.namesrv_addr,
                                "topic": TOPIC, "group": "PID_CPP_FAILOVER", "body": "fo",
                                "count": 800, "interval": 0.1, "send_timeout_ms": 8000,
                                "stop_file": str(stop)}, tmp_path / "prod").start()
            # The client refreshes its routes 3 s after it starts, then every 30 s: kill after
            # that first refresh, so the next one is the 30 s one.
            await eventually(lambda: len(cpp.of("sent")) >= 60, 30.0, lambda: cpp.describe())
            await eventually(lambda: max_offset_sum(master.broker_addr), 10.0,
                             "the C++ client sent to broker-a's master before the kill")

            t_kill = time.time()
            master.kill()
            await eventually(lambda: _promoted(a_route, slave.broker_addr), 15.0,
                             "the slave listed as broker-a's id 0")
            t_promoted = time.time()
            # What the slave replicated from the old master (its consume queues settle at once).
            await asyncio.sleep(0.5)
            on_new_master_at_promotion = await max_offset_sum(slave.broker_addr)
            # The C++ client's route still names the dead master until its next refresh;
            # sends to broker-a's queues must reach the promoted slave once it refreshed.
            await eventually(
                lambda: _grew(slave.broker_addr, on_new_master_at_promotion),
                CPP_ROUTE_PERIOD + 15.0, "the C++ client never sent to the promoted master")
            t_new_master = time.time()
            stop.touch()
            await cpp.finish(30)
            cpp.assert_clean()

            after = [e for e in cpp.events if e.get("event") in ("sent", "error")
                     and e["t"] >= t_kill]
            failed = [e for e in after if e["event"] == "error"]
            ok = [e for e in cpp.of("sent") if e["status"] == 0]
            report = (f"promoted {t_promoted - t_kill:.1f}s after the kill, first send on the "
                      f"new master {t_new_master - t_kill:.1f}s after; after the kill "
                      f"{len(after) - len(failed)} sent, {len(failed)} failed: {failed[:3]}")
            print(report)
            # Every send was acknowledged: a send to the dead master's queues is retried by
            # the client on broker-b, and SYNC_MASTER acknowledgements need the slave.
            assert failed == [], report
            assert len(after) >= 10, report
            statuses = {e["status"] for e in cpp.of("sent")}
            assert statuses <= {0, 3}, statuses  # SEND_OK, or SLAVE_NOT_AVAILABLE alone

            # Nothing acknowledged is lost: every acknowledged message is readable from the
            # cluster as it is now (broker-b and the promoted master).
            pull = await run_cpp(tmp_path / "pull", scenario="pull_consume",
                                 namesrv=c.namesrv_addr, topic=TOPIC, group="CID_CPP_FAILOVER")
            pull.assert_clean()
            got = {m["body"] for m in pull.of("msg")}
            acked = len(ok)
            assert acked and len(got) >= acked, (acked, len(got))
            assert stored_bodies(b), "broker-b carried part of the load"
    finally:
        if cpp is not None and cpp.proc is not None and cpp.returncode is None:
            await cpp.finish(1.0)
        for p in procs:
            p.kill()
        await ctl.stop()


async def _cluster_ready(namesrv: str, master: BrokerProcess, slave: BrokerProcess) -> bool:
    group = (await cluster_info(namesrv)).broker_addr_table.get("broker-a")
    addrs = group.broker_addrs if group is not None else {}
    return addrs.get(0) == master.broker_addr and addrs.get(1) == slave.broker_addr


async def _has_both(namesrv: str) -> bool:
    r = await route(namesrv, TOPIC)
    return r is not None and len(r.broker_datas) == 2


async def _promoted(a_route, addr: str) -> bool:
    return (await a_route()).get(0) == addr


async def _grew(addr: str, before: int) -> bool:
    return await max_offset_sum(addr) > before
