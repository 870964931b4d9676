"""TLS on the broker's remoting port: a real broker on 127.0.0.1, real sockets, the SDK and
raw remoting clients, certificates made by trustme."""

from __future__ import annotations

import datetime
import logging
import os
import ssl

import pytest
from support.consuming import collect
from support.waiting import eventually

from txbroker.client import Consumer, Message, Producer
from txbroker.client.errors import RouteError
from txbroker.config import BrokerConfig, ConfigError
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.tls import ClientTLS, RefusalLog, TLSConfigError, starts_tls


async def _ask_cluster(addr: str, tls: ClientTLS | None) -> tuple[RemotingCommand, RemotingClient]:
    """One GET_BROKER_CLUSTER_INFO over a fresh raw connection (left open for the caller)."""
    client = RemotingClient(addr, ssl=tls.context() if tls else None)
    answer = await client.invoke(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), 5.0)
    return answer, client


def _peer_cert(client: RemotingClient) -> bytes:
    ssl_object = client._proto.transport.get_extra_info("ssl_object")
    assert ssl_object is not None, "the connection is not TLS"
    return ssl_object.getpeercert(binary_form=True)


# --- no I/O ---------------------------------------------------------------------------------

def test_first_byte_tells_tls_from_a_remoting_frame() -> None:
    assert starts_tls(b"\x16\x03\x01")
    assert not starts_tls(b"\x00\x00\x00\x20")  # a RocketMQ frame's length prefix
    assert not starts_tls(b"")


def test_refusals_are_logged_once_per_peer_per_interval() -> None:
    limit = RefusalLog(interval=60.0, max_peers=2)
    assert limit.should_log("10.0.0.1", 0.0)
    assert not limit.should_log("10.0.0.1", 59.0)
    assert limit.should_log("10.0.0.2", 59.0)
    assert limit.should_log("10.0.0.1", 60.5)
    assert limit.should_log("10.0.0.3", 61.0)  # forgets the oldest beyond max_peers
    assert len(limit._last) == 2


@pytest.mark.parametrize("changes, fragment", [
    ({"tls_mode": "enforcing"}, "tls_mode=enforcing: needs tls_cert and tls_key"),
    ({"tls_mode": "sometimes"}, "tls_mode='sometimes': must be off, permissive or enforcing"),
    ({"tls_client_auth": "required"}, "tls_client_auth=required: needs tls_ca"),
])
def test_settings_are_checked(tmp_path, changes, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        BrokerConfig(data_dir=str(tmp_path), **changes)


# --- a real broker ----------------------------------------------------------------------------

async def test_sdk_sends_and_consumes_over_tls(tls_broker, pki) -> None:
    b = await tls_broker(tls_mode="enforcing")
    tls = ClientTLS(ca=str(pki.ca_file))
    async with Producer("PG_TLS", b.namesrv_addr, tls=tls) as producer:
        result = await producer.send(Message("TTls", b"over tls"))
        conn = producer._instance._conns[b.broker_addr]
        assert conn._proto.transport.get_extra_info("ssl_object") is not None
    consumer = Consumer("CG_TLS", b.namesrv_addr, from_where="first", rebalance_interval=0.2,
                        tls=tls)
    consumer.subscribe("TTls")
    async with consumer:
        [msg] = await collect(consumer, 1)
    assert msg.body == b"over tls" and msg.queue_offset == result.queue_offset
    assert b.server.tls_refusals == 0 and b.namesrv_server.tls_refusals == 0


async def test_enforcing_refuses_plaintext_and_logs_once(tls_broker, caplog) -> None:
    b = await tls_broker(tls_mode="enforcing")
    caplog.set_level(logging.WARNING, logger="txbroker.remoting.server")
    for _ in range(2):
        producer = Producer("PG_PLAIN", b.broker_addr, retries=0)  # the broker port answers routes
        with pytest.raises(ConnectionError, match="closed before any answer.*requires TLS"):
            await producer.start()
        await producer.shutdown()
    assert b.server.tls_refusals == 2
    refusals = [r for r in caplog.records if "requires TLS" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]
    assert "127.0.0.1" in refusals[0].getMessage()
    assert "TPlain" not in b.store.queues()  # nothing stored


async def test_permissive_serves_plaintext_and_tls_on_one_port(tls_broker, pki) -> None:
    b = await tls_broker(tls_mode="permissive")
    tls = ClientTLS(ca=str(pki.ca_file))
    for body, client_tls in ((b"plain", None), (b"secure", tls)):
        async with Producer("PG_MIX", b.namesrv_addr, tls=client_tls) as producer:
            await producer.send(Message("TMix", body))
    answer, client = await _ask_cluster(b.broker_addr, tls)
    try:
        assert answer.code == ResponseCode.SUCCESS
        assert _peer_cert(client)
    finally:
        await client.close()
    consumer = Consumer("CG_MIX", b.namesrv_addr, from_where="first", rebalance_interval=0.2)
    consumer.subscribe("TMix")
    async with consumer:
        msgs = await collect(consumer, 2)
    assert sorted(m.body for m in msgs) == [b"plain", b"secure"]
    assert b.server.tls_refusals == 0


async def test_a_tls_client_on_a_plaintext_port_is_closed(broker, pki) -> None:
    """tls_mode=off: a ClientHello is no frame, so the connection is closed (RocketMQ's
    disabled mode closes it too) and the port goes on serving plaintext."""
    producer = Producer("PG_WRONG", broker.namesrv_addr, tls=ClientTLS(insecure=True), retries=0)
    with pytest.raises((ConnectionError, RouteError)):
        await producer.start()
    await producer.shutdown()
    async with Producer("PG_RIGHT", broker.namesrv_addr) as producer:
        await producer.send(Message("TOff", b"plain"))


async def test_client_refuses_an_untrusted_certificate(tls_broker, pki, tmp_path) -> None:
    import trustme

    other = trustme.CA()
    pki.issue_server(pki.cert_file, pki.key_file, ca=other)  # signed by a CA the client lacks
    b = await tls_broker()
    for tls in (ClientTLS(ca=str(pki.ca_file)), ClientTLS()):  # the CA file, the system store
        producer = Producer("PG_UNTRUSTED", b.namesrv_addr, tls=tls, retries=0)
        with pytest.raises((ConnectionError, RouteError), match="certificate verify failed"):
            await producer.start()
        await producer.shutdown()
    # Only an explicit --tls-insecure connects to it.
    answer, client = await _ask_cluster(b.broker_addr, ClientTLS(insecure=True))
    await client.close()
    assert answer.code == ResponseCode.SUCCESS


async def test_client_refuses_an_expired_certificate(tls_broker, pki) -> None:
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    pki.issue_server(pki.cert_file, pki.key_file, not_before=past - datetime.timedelta(days=30),
                     not_after=past)
    b = await tls_broker()
    producer = Producer("PG_EXPIRED", b.namesrv_addr, tls=ClientTLS(ca=str(pki.ca_file)),
                        retries=0)
    with pytest.raises((ConnectionError, RouteError), match="certificate has expired"):
        await producer.start()
    await producer.shutdown()


async def test_mtls_required_refuses_a_client_without_certificate(tls_broker, pki) -> None:
    b = await tls_broker(tls_client_auth="required", tls_ca=str(pki.ca_file))
    without = ClientTLS(ca=str(pki.ca_file))
    producer = Producer("PG_NOCERT", b.namesrv_addr, tls=without, retries=0)
    with pytest.raises((ConnectionError, RouteError)):
        # TLS 1.3: the client finishes its side first and learns of the refusal on its
        # first request; TLS 1.2: the handshake fails.  Either way nothing is answered.
        await producer.start()
        await producer.send(Message("TMtls", b"refused"))
    await producer.shutdown()
    await eventually(lambda: b.namesrv_server.tls_failures + b.server.tls_failures >= 1,
                     msg="the server counts the failed handshake")
    assert "TMtls" not in b.store.queues()

    cert, key = pki.issue_client("app")
    async with Producer("PG_CERT", b.namesrv_addr, tls=ClientTLS(ca=str(pki.ca_file), cert=cert,
                                                                  key=key)) as producer:
        await producer.send(Message("TMtls", b"accepted"))
    assert "TMtls" in b.store.queues()


async def test_a_certificate_replaced_on_disk_is_served_to_the_next_connection(
        tls_broker, pki) -> None:
    b = await tls_broker()
    tls = ClientTLS(ca=str(pki.ca_file))
    _, first = await _ask_cluster(b.broker_addr, tls)
    old = _peer_cert(first)
    # Replace both files the way a renewal tool does: write aside, rename into place.
    new_cert, new_key = pki.dir / "renewed.pem", pki.dir / "renewed.key"
    leaf = pki.issue_server(new_cert, new_key)
    os.replace(new_key, pki.key_file)
    os.replace(new_cert, pki.cert_file)
    _, second = await _ask_cluster(b.broker_addr, tls)
    try:
        served = _peer_cert(second)
        assert served != old
        assert served == ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())
        assert b.tls.reloads == 1
        # The connection opened before keeps working on its own session.
        answer = await first.invoke(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO),
                                    5.0)
        assert answer.code == ResponseCode.SUCCESS
    finally:
        await first.close()
        await second.close()


async def test_a_replacement_that_does_not_load_keeps_the_old_certificate(
        tls_broker, pki, caplog) -> None:
    b = await tls_broker()
    tls = ClientTLS(ca=str(pki.ca_file))
    _, first = await _ask_cluster(b.broker_addr, tls)
    old = _peer_cert(first)
    await first.close()
    caplog.set_level(logging.ERROR, logger="txbroker.remoting.tls")
    pki.key_file.write_text("not a key\n")  # half-written renewal
    for _ in range(2):
        _, client = await _ask_cluster(b.broker_addr, tls)
        assert _peer_cert(client) == old
        await client.close()
    errors = [r.getMessage() for r in caplog.records if "cannot be used" in r.getMessage()]
    assert len(errors) == 1 and str(pki.cert_file) in errors[0]


async def test_a_bad_key_stops_the_start_naming_the_file(broker_config, pki, tmp_path) -> None:
    from txbroker.broker import Broker

    missing = tmp_path / "nowhere" / "server.key"
    b = Broker(broker_config.replace(tls_mode="enforcing", tls_cert=str(pki.cert_file),
                                     tls_key=str(missing)))
    with pytest.raises(TLSConfigError, match=f"TLS key file {missing}: not found"):
        await b.start()
    assert not (tmp_path / "data").exists()  # refused before the data dir was touched
