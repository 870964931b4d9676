"""TLS on every cluster port and every link between nodes: the standalone name server, the
controller, the HA port and the metrics endpoint refuse plaintext when enforcing, and brokers
dial them with TLS (``tls_peers``), verified against the cluster's CA, presenting their own
certificate.  Real name servers, controllers and brokers on 127.0.0.1 port 0, in-process;
certificates made by trustme (tests/security/conftest.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from pathlib import Path

import pytest
import trustme
from click.testing import CliRunner
from support.cluster import InProcessCluster
from support.waiting import eventually

from txbroker.cli.main import main
from txbroker.client import Message, Producer, SendStatus
from txbroker.config import BrokerConfig
from txbroker.controller import ControllerConfig, ControllerProcess
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.controller_headers import RegisterBrokerToControllerRequestHeader
from txbroker.remoting.headers import RegisterBrokerRequestHeader
from txbroker.remoting.tls import ClientTLS, ServerTLS
from txbroker.store.ha_codec import SlaveHandshake, encode_slave_handshake


def _tls(pki, mode: str = "enforcing", **changes: object) -> dict[str, object]:
    """A node's TLS settings: the fixture's certificate (for 127.0.0.1), its CA, mTLS."""
    return {"tls_mode": mode, "tls_cert": str(pki.cert_file), "tls_key": str(pki.key_file),
            "tls_ca": str(pki.ca_file), "tls_client_auth": "required", **changes}


def _server_tls(pki) -> ServerTLS:
    return ServerTLS("enforcing", str(pki.cert_file), str(pki.key_file), str(pki.ca_file),
                     "required")


async def _plaintext_request(addr: str, cmd: RemotingCommand) -> None:
    """Sends ``cmd`` in plaintext; the enforcing port must close the connection unanswered."""
    client = RemotingClient(addr, reconnect=False)
    try:
        with pytest.raises(ConnectionError, match="closed before any answer"):
            await client.invoke(cmd, 5.0)
    finally:
        await client.close()


def _raw_exchange(port: int, data: bytes) -> bytes:
    """Connects in plaintext, sends ``data``, returns what arrives before the close (bounded;
    a close with ``data`` unread is a reset)."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as s:
        s.sendall(data)
        for _ in range(100):
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return got
            if not chunk:
                return got
            got += chunk
    return got


async def test_name_server_refuses_plaintext_and_registers_a_tls_broker(
        broker_config: BrokerConfig, tmp_path: Path, pki) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        ns = await c.namesrv(tls=_server_tls(pki))
        forged = RegisterBrokerRequestHeader(broker_name="forged", broker_addr="10.0.0.1:10911",
                                             cluster_name="DefaultCluster",
                                             ha_server_addr="10.0.0.1:10912", broker_id=0,
                                             compressed=False, body_crc32=0)
        await _plaintext_request(ns.addr, RemotingCommand.request(RequestCode.REGISTER_BROKER,
                                                                  forged.to_ext()))
        assert ns.routes.cluster_info().broker_addr_table == {}  # nothing registered
        assert ns.server.tls_refusals == 1
        # A broker dialling its peers with TLS (auto: it is enforcing) and its certificate.
        b = await c.broker("broker-a", **_tls(pki))
        assert b.registrar.registered == {ns.addr: True}
        assert set(ns.routes.cluster_info().broker_addr_table) == {"broker-a"}


async def test_controller_refuses_plaintext_and_serves_a_tls_broker(
        broker_config: BrokerConfig, tmp_path: Path, pki) -> None:
    ctl = ControllerProcess(ControllerConfig(port=0, data_dir=str(tmp_path / "ctl"), lease=1.0,
                                             **_tls(pki)))
    await ctl.start()
    try:
        forged = RegisterBrokerToControllerRequestHeader(
            cluster_name="DefaultCluster", broker_name="forged", broker_address="10.0.0.1:10911",
            broker_id=0)
        await _plaintext_request(ctl.addr, RemotingCommand.request(
            RequestCode.CONTROLLER_REGISTER_BROKER, forged.to_ext()))
        assert ctl.state.groups() == []  # nothing registered
        # TLS without a client certificate: the mTLS handshake fails, nothing answered.
        bare = RemotingClient(ctl.addr, ssl=ClientTLS(ca=str(pki.ca_file)).context(),
                              reconnect=False)
        with pytest.raises(ConnectionError):
            await bare.invoke(RemotingCommand.request(RequestCode.CONTROLLER_REGISTER_BROKER,
                                                      forged.to_ext()), 5.0)
        await bare.close()
        assert ctl.state.groups() == []
        async with InProcessCluster(broker_config, tmp_path) as c:
            await c.namesrv(tls=_server_tls(pki))
            b = await c.broker("broker-a", controller_addr=ctl.addr, controller_lease=1.0,
                               controller_heartbeat_interval=0.2, **_tls(pki))
            await eventually(lambda: b.roles.is_master, msg="elected over TLS")
            assert ctl.state.groups() == ["broker-a"]
    finally:
        await ctl.stop()


async def test_ha_port_refuses_plaintext_and_replicates_over_tls(
        broker_config: BrokerConfig, tmp_path: Path, pki) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv(tls=_server_tls(pki))
        master = await c.broker("broker-a", broker_role="SYNC_MASTER", **_tls(pki))
        ha_port = int(master.roles.ha_addr.rpartition(":")[2])
        # A forged slave handshake in plaintext: closed before anything of the log is sent.
        hello = encode_slave_handshake(SlaveHandshake(sync_from_last_file=False,
                                                      async_learner=False, slave_id=7))
        assert hello[0] != 0x16  # an HA stream never starts like a TLS record
        got = await asyncio.to_thread(_raw_exchange, ha_port, hello)
        assert got == b""
        assert master.roles.ha_master.slaves() == []
        slave = await c.broker("broker-a", broker_id=1, metadata_sync_interval=0.2, **_tls(pki))
        await eventually(lambda: any(s.connected for s in master.roles.ha_master.slaves()),
                         msg="the slave follows over TLS")
        tls = ClientTLS(ca=str(pki.ca_file), cert=str(pki.cert_file), key=str(pki.key_file))
        async with Producer("pg", c.namesrv_addr, tls=tls) as producer:
            result = await producer.send(Message("Repl", b"secret payload"))
        assert result.send_status is SendStatus.SEND_OK  # SYNC_MASTER: the slave holds it
        await eventually(lambda: slave.store.max_physical_offset
                         == master.store.max_physical_offset)
        # The metadata sync dials the master's broker port (enforcing) with TLS too.
        await eventually(lambda: slave.topics.get("Repl") is not None, msg="topics synced")
        assert slave.roles.sync.problem is None


async def test_permissive_ha_port_serves_a_plaintext_and_a_tls_slave(
        broker_config: BrokerConfig, tmp_path: Path, pki) -> None:
    """During a migration one HA port takes both: a slave still dialling in plaintext and one
    dialling with TLS (told apart by the first byte, as on the broker port)."""
    async with InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv(tls=ServerTLS("permissive", str(pki.cert_file), str(pki.key_file)))
        master = await c.broker("broker-a", **_tls(pki, "permissive", tls_client_auth="none"))
        plain = await c.broker("broker-a", broker_id=1)
        secure = await c.broker("broker-a", broker_id=2, tls_peers="on", tls_ca=str(pki.ca_file))
        await eventually(lambda: sum(s.connected for s in master.roles.ha_master.slaves()) == 2,
                         msg="both slaves follow")
        async with Producer("pg", c.namesrv_addr) as producer:
            await producer.send(Message("Mixed", b"to both"))
        for slave in (plain, secure):
            await eventually(lambda slave=slave: slave.store.max_physical_offset
                             == master.store.max_physical_offset)
        assert master.roles.ha_master._server.refusals == 0


async def test_a_peer_with_an_untrusted_certificate_is_one_line(
        broker_config: BrokerConfig, tmp_path: Path, pki, caplog) -> None:
    """A name server and an HA master whose certificates the cluster's CA did not sign: the
    broker says so once per peer, with the address and the reason, and keeps retrying."""
    caplog.set_level(logging.INFO)
    rogue_dir = tmp_path / "rogue"
    rogue_dir.mkdir()
    rogue_cert, rogue_key = rogue_dir / "server.pem", rogue_dir / "server.key"
    pki.issue_server(rogue_cert, rogue_key, ca=trustme.CA())
    rogue = ServerTLS("enforcing", str(rogue_cert), str(rogue_key))
    async with InProcessCluster(broker_config.replace(register_interval=0.2), tmp_path) as c:
        untrusted = await c.namesrv(tls=rogue)
        b = await c.broker("broker-a", **_tls(pki))
        assert b.registrar.registered == {untrusted.addr: False}
        await eventually(lambda: b.registrar.rounds >= 4, msg="registration retried")
        lines = [r.getMessage() for r in caplog.records if untrusted.addr in r.getMessage()
                 and r.levelno >= logging.WARNING]
        assert len(lines) == 1, lines
        assert "cannot register with name server" in lines[0]
        assert "certificate verify failed" in lines[0]
        assert untrusted.routes.cluster_info().broker_addr_table == {}

    # The HA link: a master serving a certificate of another CA (its name server trusted).
    caplog.clear()
    async with InProcessCluster(broker_config, tmp_path / "ha") as c:
        await c.namesrv(tls=ServerTLS("enforcing", str(pki.cert_file), str(pki.key_file)))
        master = await c.broker("broker-a", **_tls(pki, tls_cert=str(rogue_cert),
                                                    tls_key=str(rogue_key),
                                                    tls_client_auth="none"))
        ha = master.roles.ha_addr
        slave = await c.broker("broker-a", broker_id=1, **_tls(pki))
        await eventually(lambda: slave.roles.ha_slave.problem is not None, timeout=10)
        assert slave.roles.ha_slave.problem.startswith(f"HA master {ha}: certificate verify failed")
        assert master.roles.ha_master.slaves() == []
        await asyncio.sleep(0.5)  # a few more attempts at the back-off
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("HA master")]
        assert len(lines) == 1, lines

    # The controller link: a controller serving a certificate of another CA.
    caplog.clear()
    ctl = ControllerProcess(ControllerConfig(port=0, data_dir=str(tmp_path / "ctl"), lease=1.0,
                                             tls_mode="enforcing", tls_cert=str(rogue_cert),
                                             tls_key=str(rogue_key)))
    await ctl.start()
    try:
        async with InProcessCluster(broker_config, tmp_path / "ctl-brokers") as c:
            await c.namesrv(tls=_server_tls(pki))
            b = await c.broker("broker-a", controller_addr=ctl.addr, controller_lease=1.0,
                               controller_heartbeat_interval=0.1, **_tls(pki))
            await asyncio.sleep(0.5)  # heartbeats keep failing meanwhile
            assert not b.roles.is_master and ctl.state.groups() == []
            lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                     and ctl.addr in r.getMessage()]
            assert lines and all("certificate verify failed" in line for line in lines), lines
            # As for a controller that is down: once at start, once when heartbeats fail,
            # not once per attempt.
            assert len(lines) <= 2, lines
    finally:
        await ctl.stop()


async def test_a_renewed_node_certificate_is_presented_on_the_next_link_without_restart(
        broker_config: BrokerConfig, tmp_path: Path, pki) -> None:
    """The broker's certificate files are replaced (renamed into place, as renewal tools do):
    its next connection to a name server presents the new certificate; a broken replacement
    keeps the previous one."""
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    cert, key = node_dir / "node.pem", node_dir / "node.key"
    first = pki.issue_server(cert, key)
    async with InProcessCluster(broker_config.replace(register_interval=0.2), tmp_path) as c:
        ns = await c.namesrv(tls=_server_tls(pki))
        b = await c.broker("broker-a", **_tls(pki, tls_cert=str(cert), tls_key=str(key)))

        def presented() -> set[bytes]:
            return {conn.transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
                    for conn in ns.server.connections}

        def der(leaf) -> bytes:
            return ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())

        assert presented() == {der(first)}
        # A half-written replacement: refused, the previous certificate stays.
        (node_dir / "half.pem").write_text("-----BEGIN CERTIFICATE-----\n")
        (node_dir / "half.pem").rename(cert)
        assert b.peer_tls.refresh() is False
        # The renewal proper.
        second = pki.issue_server(node_dir / "new.pem", node_dir / "new.key")
        (node_dir / "new.key").rename(key)
        (node_dir / "new.pem").rename(cert)
        await eventually(lambda: b.peer_tls.reloads == 1, msg="the housekeeping reloads it")
        for conn in list(ns.server.connections):
            conn.close()  # the registration link reconnects on its next round
        await eventually(lambda: presented() == {der(second)}, msg="the new certificate is used")
        # The new link is up; the round whose link was closed under it may have failed, and
        # the next one (0.2 s) registers over the new link.
        await eventually(lambda: b.registrar.registered == {ns.addr: True},
                         msg="registered over the renewed link")


async def test_kafka_cluster_view_reads_name_servers_and_brokers_over_tls(
        broker_config: BrokerConfig, tmp_path: Path, pki) -> None:
    """The Kafka listener's view of the cluster comes from the name servers and the other
    groups' broker ports: enforcing ones, dialled with TLS."""
    from txbroker.service.topics import TopicConfig

    kafka = {"kafka_port": 0, "kafka_cluster_refresh_interval": 0.1}
    async with InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv(tls=_server_tls(pki))
        a = await c.broker("broker-a", kafka_node_id=1, **kafka, **_tls(pki))
        b = await c.broker("broker-b", kafka_node_id=2, **kafka, **_tls(pki))
        await a.topics.create_or_update(TopicConfig("spread", 4, 4))
        await b.topics.create_or_update(TopicConfig("spread", 2, 2))
        for broker in (a, b):
            await eventually(lambda broker=broker: len(broker.kafka_view.slots("spread")) == 6
                             and len(broker.kafka_view.nodes()) == 2, msg="views see both groups")


async def test_metrics_endpoint_speaks_https(broker_config: BrokerConfig, pki) -> None:
    from txbroker.broker import Broker

    b = Broker(broker_config.replace(metrics_port=0, **_tls(pki, tls_client_auth="none")))
    await b.start()
    try:
        request = b"GET /metrics HTTP/1.0\r\n\r\n"
        # Plaintext: closed unanswered.
        assert await asyncio.to_thread(_raw_exchange, b.metrics_port, request) == b""
        ctx = ssl.create_default_context(cafile=str(pki.ca_file))
        reader, writer = await asyncio.open_connection("127.0.0.1", b.metrics_port, ssl=ctx,
                                                       server_hostname="127.0.0.1")
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.0 200 OK"), answer[:80]
        assert b"txbroker_" in answer
    finally:
        await b.stop()


@pytest.mark.parametrize("command", [["namesrv", "--port", "0"],
                                     ["controller", "--port", "0"]])
def test_bad_certificate_stops_namesrv_and_controller_in_one_line(command, tmp_path: Path,
                                                                  monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, [*command, "--tls-mode", "enforcing", "--tls-cert",
                                       "missing.pem", "--tls-key", "missing.key"])
    assert result.exit_code == 2, result.output
    assert result.output == ("error: TLS certificate file missing.pem: not found "
                             "(or not a file)\n")


def test_name_server_tls_settings_are_checked() -> None:
    """The standalone name server's settings are checked like the broker's."""
    runner = CliRunner()
    result = runner.invoke(main, ["namesrv", "--port", "0", "--tls-mode", "enforcing"])
    assert result.exit_code == 2
    assert result.output == "error: tls_mode=enforcing: needs tls_cert and tls_key (PEM files)\n"


@pytest.mark.slow
async def test_workers_register_with_their_supervisors_name_server_over_tls(
        broker_process, pki) -> None:
    """``serve --workers 2`` with enforcing TLS and mTLS: the supervisor's name server speaks
    TLS, and the worker processes register with it over TLS, with their certificate."""
    from txbroker.remoting.bodies import ClusterInfo
    from txbroker.remoting.codec import encode

    proc = await asyncio.to_thread(broker_process, workers=2, **_tls(pki))
    assert len(proc.worker_addrs) == 2, proc.worker_addrs
    port = int(proc.namesrv_addr.rpartition(":")[2])
    ask = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
    assert await asyncio.to_thread(_raw_exchange, port, encode(ask)) == b""  # plaintext: closed
    tls = ClientTLS(ca=str(pki.ca_file), cert=str(pki.cert_file), key=str(pki.key_file))
    client = RemotingClient(proc.namesrv_addr, ssl=tls.context())
    try:
        async def both() -> bool:
            answer = await client.invoke(RemotingCommand.request(
                RequestCode.GET_BROKER_CLUSTER_INFO), 5.0)
            return len(ClusterInfo.decode(answer.body).broker_addr_table) == 2
        await eventually(both, timeout=30, msg="both workers registered over TLS")
    finally:
        await client.close()
