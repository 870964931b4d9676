"""Registration at a name server guarded by the cluster secret: real name servers (in-process
and the ``txbroker namesrv`` CLI in a subprocess) and real brokers on 127.0.0.1 port 0, forged
requests sent with a raw RemotingClient."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

from click.testing import CliRunner
from support.cluster import READY_RE, InProcessCluster, cluster_info, route
from support.waiting import eventually

from txbroker.cli.main import main as cli
from txbroker.remoting.bodies import (
    DataVersion,
    RegisterBrokerBody,
    TopicConfigData,
    TopicConfigSerializeWrapper,
    body_crc32,
)
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import (
    QueryDataVersionRequestHeader,
    RegisterBrokerRequestHeader,
    UnRegisterBrokerRequestHeader,
)
from txbroker.service.cluster_auth import check_answer, sign_request
from txbroker.service.topics import TopicConfig

SECRET = "namesrv-secret-1"
#: Where a forged registration would send the producers of broker-a's topics.
ROGUE = "127.0.0.1:1"


def _forged_register(broker_name: str, topic: str) -> RemotingCommand:
    """A REGISTER_BROKER claiming ``broker_name``'s master id at :data:`ROGUE`, with a newer
    topic table naming ``topic``: obeyed, it repoints the topic's route."""
    wrapper = TopicConfigSerializeWrapper(
        DataVersion(timestamp=int(time.time() * 1000) + 10**6, counter=10**6),
        {topic: TopicConfigData.of(TopicConfig(topic, 8, 8))})
    data = RegisterBrokerBody(wrapper).encode(compressed=False)
    header = RegisterBrokerRequestHeader(
        broker_name=broker_name, broker_addr=ROGUE, cluster_name="DefaultCluster",
        ha_server_addr=ROGUE, broker_id=0, compressed=False, body_crc32=body_crc32(data))
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, header.to_ext(), data)


async def _send(addr: str, cmd: RemotingCommand) -> RemotingCommand:
    client = RemotingClient(addr)
    try:
        return await client.invoke(cmd, 5.0)
    finally:
        await client.close()


async def test_forged_registration_is_refused_and_routes_stay(broker_config, tmp_path, caplog) -> None:
    async with InProcessCluster(broker_config.replace(cluster_secret=SECRET), tmp_path) as c:
        ns = await c.namesrv(cluster_secret=SECRET)
        b = await c.broker("broker-a")  # same secret: its signed registration is obeyed
        await b.topics.create_or_update(TopicConfig("Orders", 4, 4))
        await eventually(lambda: route(ns.addr, "Orders"), msg="Orders routed")
        before = await route(ns.addr, "Orders")
        assert before is not None and before.broker_datas[0].broker_addrs == {0: b.broker_addr}

        caplog.set_level(logging.DEBUG, logger="txbroker.service.cluster_auth")
        unsigned = _forged_register("broker-a", "Orders")
        wrong = _forged_register("broker-a", "Orders")
        sign_request(wrong, "not-the-secret")
        # the same fields signed with the right key but altered after signing
        altered = _forged_register("broker-a", "Orders")
        sign_request(altered, SECRET)
        altered.ext_fields["brokerAddr"] = "127.0.0.1:2"
        # One connection kept open: a registration lasts while its connection does.
        forger = RemotingClient(ns.addr)
        answers = [await forger.invoke(cmd, 5.0) for cmd in (unsigned, wrong, altered)]
        for resp in answers:
            assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
            assert "request code 103 refused" in resp.remark
        assert "not signed" in answers[0].remark
        assert "does not match" in answers[1].remark
        assert "does not match" in answers[2].remark

        # Unregistering the real broker, or keeping a broker alive, needs the secret too.
        unreg = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, UnRegisterBrokerRequestHeader(
            broker_name="broker-a", broker_addr=b.broker_addr, cluster_name="DefaultCluster",
            broker_id=0).to_ext())
        resp = await _send(ns.addr, unreg)
        assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
        query = RemotingCommand.request(
            RequestCode.QUERY_DATA_VERSION,
            QueryDataVersionRequestHeader(broker_name="broker-a", broker_addr=b.broker_addr,
                                          cluster_name="DefaultCluster", broker_id=0).to_ext(),
            DataVersion().encode())
        resp = await _send(ns.addr, query)
        assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)

        after = await route(ns.addr, "Orders")
        assert after is not None
        assert after.broker_datas[0].broker_addrs == {0: b.broker_addr}
        assert after.queue_datas[0].write_queue_nums == 4
        info = await cluster_info(ns.addr)
        assert {n: bd.broker_addrs for n, bd in info.broker_addr_table.items()} == \
            {"broker-a": {0: b.broker_addr}}
        assert ns.guard is not None and ns.guard.refused == 5
        # One warning per peer and reason, the rest at DEBUG; the secret is never written.
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                    and r.name == "txbroker.service.cluster_auth"]
        assert len(warnings) == 2, warnings  # "not signed" and "does not match"
        assert all("127.0.0.1" in w and "code 103" in w for w in warnings)
        assert SECRET not in caplog.text
        await forger.close()


async def test_a_recorded_registration_is_obeyed_once_and_its_answer_is_bound_to_it(
        broker_config, tmp_path) -> None:
    """A registration in the cluster envelope, recorded and sent again (to keep a dead broker
    listed, or bring back an old topic table), is refused; the name server's answer verifies
    for that registration's nonce and for no other."""
    async with InProcessCluster(broker_config, tmp_path) as c:
        ns = await c.namesrv(cluster_secret=SECRET)
        registration = _forged_register("broker-z", "Once")
        nonce = sign_request(registration, SECRET)
        other = sign_request(_forged_register("broker-z", "Once"), SECRET)
        client = RemotingClient(ns.addr)
        try:
            first = await client.invoke(registration, 5.0)
            assert first.code == ResponseCode.SUCCESS, (first.code, first.remark)
            assert check_answer(first, SECRET, nonce) is None
            assert "another request" in str(check_answer(first, SECRET, other))
            again = await client.invoke(registration, 5.0)
            assert again.code == ResponseCode.NO_PERMISSION
            assert "repeats a nonce" in (again.remark or "")
        finally:
            await client.close()


async def test_without_a_secret_any_registration_is_accepted(broker_config, tmp_path) -> None:
    """The name server as before (RocketMQ's has no authentication): the forged request wins,
    which is what the secret is for."""
    async with InProcessCluster(broker_config, tmp_path) as c:
        ns = await c.namesrv()
        forger = RemotingClient(ns.addr)
        try:
            resp = await forger.invoke(_forged_register("broker-x", "Stolen"), 5.0)
            assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
            got = await route(ns.addr, "Stolen")
            assert got is not None and got.broker_datas[0].broker_addrs == {0: ROGUE}
        finally:
            await forger.close()


async def test_a_broker_with_another_secret_is_one_line_each_side(broker_config, tmp_path,
                                                                   caplog) -> None:
    caplog.set_level(logging.INFO)
    config = broker_config.replace(cluster_secret="another-secret", register_interval=0.2)
    async with InProcessCluster(config, tmp_path) as c:
        ns = await c.namesrv(cluster_secret=SECRET)
        b = await c.broker("broker-a")
        assert b.registrar is not None
        rounds = b.registrar.rounds
        await eventually(lambda: b.registrar.rounds >= rounds + 3, msg="three more rounds")
        assert b.registrar.registered[ns.addr] is False
        assert await cluster_info(ns.addr) is not None
        assert not (await cluster_info(ns.addr)).broker_addr_table
        name_server_side = [r.getMessage() for r in caplog.records
                            if r.name == "txbroker.service.cluster_auth"
                            and r.levelno >= logging.WARNING]
        broker_side = [r.getMessage() for r in caplog.records
                       if r.name == "txbroker.cluster.registration"
                       and r.levelno >= logging.WARNING]
        assert len(name_server_side) == 1, name_server_side
        assert "refused request code 103 from 127.0.0.1:" in name_server_side[0]
        assert "its signature does not match (a different cluster_secret?)" in name_server_side[0]
        assert len(broker_side) == 1, broker_side
        assert ns.addr in broker_side[0] and "cluster_secret" in broker_side[0]
        assert "another-secret" not in caplog.text and SECRET not in caplog.text


def test_cli_name_server_takes_the_secret_from_the_environment(tmp_path) -> None:
    """``txbroker namesrv`` with TXBROKER_CLUSTER_SECRET refuses an unsigned registration and
    obeys a signed one."""
    import asyncio

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TXBROKER_CLUSTER_SECRET": SECRET}
    with open(tmp_path / "namesrv.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "txbroker", "namesrv", "--port", "0"],
                                stdout=subprocess.PIPE, stderr=log, env=env)
    try:
        assert proc.stdout is not None
        m = READY_RE.match(proc.stdout.readline().decode().strip())
        assert m, (tmp_path / "namesrv.log").read_text()
        addr = m.group(1)

        async def scenario() -> tuple[RemotingCommand, RemotingCommand]:
            refused = await _send(addr, _forged_register("broker-a", "Orders"))
            signed = _forged_register("broker-a", "Orders")
            sign_request(signed, SECRET)
            return refused, await _send(addr, signed)

        refused, obeyed = asyncio.run(scenario())
        assert refused.code == ResponseCode.NO_PERMISSION, (refused.code, refused.remark)
        assert obeyed.code == ResponseCode.SUCCESS, (obeyed.code, obeyed.remark)
    finally:
        proc.terminate()
        proc.wait(10)
    assert SECRET not in (tmp_path / "namesrv.log").read_text()


def test_cli_refuses_a_short_secret_in_one_line() -> None:
    result = CliRunner().invoke(cli, ["namesrv", "--port", "0", "--cluster-secret", "short"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: --cluster-secret must be at least 8 characters"]


def test_workers_register_signed_with_their_own_name_server(broker_process) -> None:
    """``serve --workers 2`` with a secret: both workers are registered (signed) with the
    supervisor's name server, which refuses a forged registration."""
    import asyncio

    b = broker_process(workers=2, namesrv_port=0, cluster_secret=SECRET)

    async def scenario() -> tuple[set[str], RemotingCommand]:
        await eventually(lambda: _registered(b.namesrv_addr, 2), msg="both workers registered")
        info = await cluster_info(b.namesrv_addr)
        forger = RemotingClient(b.namesrv_addr)
        try:
            resp = await forger.invoke(_forged_register(next(iter(info.broker_addr_table)),
                                                        "Orders"), 5.0)
        finally:
            await forger.close()
        return set(info.broker_addr_table), resp

    names, refused = asyncio.run(scenario())
    assert len(names) == 2
    assert refused.code == ResponseCode.NO_PERMISSION, (refused.code, refused.remark)


async def _registered(addr: str, n: int) -> bool:
    return len((await cluster_info(addr)).broker_addr_table) >= n
