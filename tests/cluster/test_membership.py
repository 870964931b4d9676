"""Membership with real name servers and brokers on 127.0.0.1 port 0: a broker registers with
every name server, is listed and routed, re-registers when its topics change, unregisters on a
clean stop, expires after silence, and is dropped when its connection closes (SIGKILL)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

from support.cluster import (
    InProcessCluster,
    NamesrvSubprocess,
    cluster_info,
    route,
    topic_list,
)
from support.waiting import eventually

from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import GetRouteInfoRequestHeader
from txbroker.service.topics import TopicConfig


async def _brokers(addr: str) -> dict[str, dict[int, str]]:
    info = await cluster_info(addr)
    return {name: bd.broker_addrs for name, bd in info.broker_addr_table.items()}


async def test_broker_registers_with_every_name_server_and_is_routed(broker_config, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        ns1, ns2 = await c.namesrv(), await c.namesrv()
        b = await c.broker("broker-a")
        assert b.namesrv_addr == f"{ns1.addr};{ns2.addr}"
        assert b.namesrv_port == -1  # no embedded name server in a cluster
        for ns in (ns1, ns2):  # start() returns once every name server has the registration
            assert await _brokers(ns.addr) == {"broker-a": {0: b.broker_addr}}
            info = await cluster_info(ns.addr)
            assert info.cluster_addr_table == {"DefaultCluster": ["broker-a"]}
            tbw = await route(ns.addr, "TBW102")  # auto-create is on: the template is routed
            assert tbw is not None and tbw.broker_datas[0].broker_addrs == {0: b.broker_addr}
            assert "RMQ_SYS_TRANS_HALF_TOPIC" in await topic_list(ns.addr)
        # A topic created on the broker is registered at once, not at the next interval.
        await b.topics.create_or_update(TopicConfig("Orders", 3, 3))
        for ns in (ns1, ns2):
            await eventually(lambda ns=ns: route(ns.addr, "Orders"), msg="Orders routed")
            got = await route(ns.addr, "Orders", version=0)  # the fastjson dialect reads too
            assert got.queue_datas[0].write_queue_nums == 3
        # The broker port no longer answers name-server requests.
        client = RemotingClient(b.broker_addr)
        try:
            resp = await client.invoke(RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(topic="Orders").to_ext()), 5.0)
            assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        finally:
            await client.close()
        # A clean stop unregisters from both before it returns.
        await b.stop()
        for ns in (ns1, ns2):
            assert await _brokers(ns.addr) == {}
            assert await route(ns.addr, "Orders") is None


async def test_template_topic_is_routed_only_while_auto_create_is_on(broker_config, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        ns = await c.namesrv()
        b = await c.broker("broker-a", auto_create_topic=False)
        assert await _brokers(ns.addr) == {"broker-a": {0: b.broker_addr}}
        assert await route(ns.addr, "TBW102") is None


async def test_a_silent_broker_expires_and_comes_back_at_its_next_registration(broker_config,
                                                                               tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        ns = await c.namesrv(broker_expiry=0.5)
        b = await c.broker("broker-a", register_interval=3600.0)
        assert "broker-a" in await _brokers(ns.addr)
        await eventually(lambda: _is_empty(ns.addr), msg="broker expired")
        assert await route(ns.addr, "TBW102") is None
        b.registrar.trigger()  # a name server that dropped a broker takes it back
        await eventually(lambda: _has(ns.addr, "broker-a"), msg="broker registered again")


async def _is_empty(addr: str) -> bool:
    return await _brokers(addr) == {}


async def _has(addr: str, name: str) -> bool:
    return name in await _brokers(addr)


async def test_a_name_server_down_at_start_gets_the_broker_once_it_is_up(broker_config,
                                                                         tmp_path) -> None:
    with socket.socket() as s:  # a port nothing listens on (yet)
        s.bind(("127.0.0.1", 0))
        late_port = s.getsockname()[1]
    async with InProcessCluster(broker_config, tmp_path) as c:
        ns1 = await c.namesrv()
        b = await c.broker("broker-a", register_interval=0.2,
                           namesrv_addr=f"{ns1.addr};127.0.0.1:{late_port}")
        assert b.registrar.registered == {ns1.addr: True, f"127.0.0.1:{late_port}": False}
        from txbroker.namesrv import NameServerProcess

        late = NameServerProcess(listen_host="127.0.0.1", port=late_port)
        await late.start()
        try:
            await eventually(lambda: _has(late.addr, "broker-a"), msg="late name server has it")
        finally:
            await late.stop()


async def test_sigkilled_broker_is_dropped_when_its_connection_closes(broker_process, tmp_path) -> None:
    ns = NamesrvSubprocess(tmp_path / "ns.log").start()  # default 120 s expiry: not the cause
    try:
        proc = broker_process(namesrv_addr=ns.addr, broker_name="broker-k")
        assert proc.namesrv_addr == ns.addr
        assert await _brokers(ns.addr) == {"broker-k": {0: proc.broker_addr}}
        proc.kill()
        await eventually(lambda: _is_empty(ns.addr), msg="killed broker dropped")
        assert await route(ns.addr, "TBW102") is None
    finally:
        ns.stop()


def test_namesrv_cli_refuses_a_port_in_use_with_one_line(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run([sys.executable, "-P", "-m", "txbroker",
                              "namesrv", "--port", str(port)], capture_output=True, text=True,
                             timeout=30, check=False)
    assert out.returncode == 1
    err = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    expected = f"error: cannot listen on 127.0.0.1:{port} (name-server port): address already in use"
    assert err == [expected], out.stderr


async def test_namesrv_cli_stops_cleanly_on_sigterm(tmp_path) -> None:
    ns = NamesrvSubprocess(tmp_path / "ns.log").start()
    assert await _brokers(ns.addr) == {}
    assert await asyncio.to_thread(ns.stop) == 0
