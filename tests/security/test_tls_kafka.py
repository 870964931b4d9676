"""TLS on the Kafka port: an in-process broker on 127.0.0.1, raw Kafka frames over real sockets
(with and without TLS), certificates made by trustme.  What Kafka's SSL and SASL_SSL listeners
do: plaintext closed on an enforcing port, both on a permissive one, mTLS, the certificate
reloaded from disk, SASL/PLAIN offered on TLS connections only (unless allowed on plaintext)."""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from pathlib import Path

import pytest
from support.kafka_sasl import users_file
from support.waiting import eventually

from txbroker.config import TLS_FRAME_SIZE_LIMIT, BrokerConfig, ConfigError
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.remoting.kafka.records import Record, encode_batch
from txbroker.remoting.tls import ClientTLS
from txbroker.service.topics import TopicConfig

WAIT = 10.0
TOPIC = "KTls"


class Wire:
    """One raw Kafka connection, TLS when given a context."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.corr = 0

    @classmethod
    async def open(cls, port: int, tls: ssl.SSLContext | None = None) -> Wire:
        return cls(*await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=tls), WAIT))

    @property
    def peer_cert(self) -> bytes:
        ssl_object = self.writer.get_extra_info("ssl_object")
        assert ssl_object is not None, "the connection is not TLS"
        return ssl_object.getpeercert(binary_form=True)

    async def call(self, key: int, version: int, body: dict) -> dict:
        self.corr += 1
        self.writer.write(encode_request(key, version, self.corr, "tls-test", body))
        size = int.from_bytes(await asyncio.wait_for(self.reader.readexactly(4), WAIT), "big")
        got_corr, answer = decode_response(
            key, version, await asyncio.wait_for(self.reader.readexactly(size), WAIT))
        assert got_corr == self.corr
        return answer

    async def closed(self) -> bool:
        """True once the broker closed the connection without answering anything."""
        try:
            return await asyncio.wait_for(self.reader.read(), WAIT) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True

    def close(self) -> None:
        self.writer.close()


def _produce(value: bytes) -> dict:
    batch = encode_batch(0, [Record(0, int(time.time() * 1000), None, value, [])])
    return {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
            "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}]}


async def _produced(wire: Wire, value: bytes) -> int:
    answer = await wire.call(ApiKey.PRODUCE, 7, _produce(value))
    part = answer["responses"][0]["partition_responses"][0]
    assert part["error_code"] == ErrorCode.NONE, part
    return part["base_offset"]


async def _kafka_broker(tls_broker, **changes: object):
    b = await tls_broker(kafka_port=0, **changes)
    await b.topics.create_or_update(TopicConfig(TOPIC, 1, 1))
    return b


def _client(pki, **kw: str) -> ssl.SSLContext:
    return ClientTLS(ca=str(pki.ca_file), **kw).context()


# --- settings ---------------------------------------------------------------------------------

def test_plain_needs_tls_or_the_plaintext_flag(tmp_path: Path, pki) -> None:
    users = users_file(tmp_path / "users.json", ("producer", "consumer"), alice="alice-secret")
    base = BrokerConfig(data_dir=str(tmp_path / "d"), kafka_port=0, users_file=users)
    with pytest.raises(ConfigError, match=r"no TLS \(tls_mode=off\); turn TLS on"):
        base.replace(kafka_sasl_mechanisms="PLAIN")
    for mode in ("permissive", "enforcing"):  # PLAIN on TLS connections: no flag needed
        base.replace(kafka_sasl_mechanisms="PLAIN", tls_mode=mode, tls_cert=str(pki.cert_file),
                     tls_key=str(pki.key_file))


def test_frames_never_start_like_a_tls_handshake_with_tls_on(tmp_path: Path, pki) -> None:
    tls = {"tls_mode": "permissive", "tls_cert": str(pki.cert_file), "tls_key": str(pki.key_file)}
    assert (TLS_FRAME_SIZE_LIMIT - 1).to_bytes(4, "big")[0] < 0x16
    assert TLS_FRAME_SIZE_LIMIT.to_bytes(4, "big")[0] == 0x16
    with pytest.raises(ConfigError, match="max_frame_size=369098752: must be below"):
        BrokerConfig(data_dir=str(tmp_path), max_frame_size=TLS_FRAME_SIZE_LIMIT, **tls)
    BrokerConfig(data_dir=str(tmp_path), max_frame_size=TLS_FRAME_SIZE_LIMIT - 1, **tls)


# --- a real broker ----------------------------------------------------------------------------

async def test_enforcing_serves_kafka_over_tls_and_closes_plaintext(tls_broker, pki) -> None:
    b = await _kafka_broker(tls_broker, tls_mode="enforcing")
    wire = await Wire.open(b.kafka_port, _client(pki))
    try:
        versions = await wire.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t",
                                                            "client_software_version": "1"})
        assert versions["error_code"] == ErrorCode.NONE
        assert await _produced(wire, b"over tls") == 0
        assert wire.peer_cert
    finally:
        wire.close()
    # Kafka's SSL listener: a plaintext request is never read, nothing is stored.
    plain = await Wire.open(b.kafka_port)
    try:
        plain.writer.write(encode_request(ApiKey.PRODUCE, 7, 1, "plain", _produce(b"plain")))
        assert await plain.closed()
    finally:
        plain.close()
    assert b.kafka.tls_refusals == 1
    assert b.store.max_offset(TOPIC, 0) == 1


async def test_permissive_serves_plaintext_and_tls_on_the_kafka_port(tls_broker, pki) -> None:
    b = await _kafka_broker(tls_broker, tls_mode="permissive")
    for offset, tls in ((0, None), (1, _client(pki))):
        wire = await Wire.open(b.kafka_port, tls)
        try:
            assert await _produced(wire, b"m%d" % offset) == offset
            assert (wire.writer.get_extra_info("ssl_object") is not None) == (tls is not None)
        finally:
            wire.close()
    assert b.kafka.tls_refusals == 0 and b.store.max_offset(TOPIC, 0) == 2


async def test_the_client_refuses_an_untrusted_certificate(tls_broker, pki) -> None:
    import trustme

    pki.issue_server(pki.cert_file, pki.key_file, ca=trustme.CA())  # a CA the client lacks
    b = await _kafka_broker(tls_broker)
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        await Wire.open(b.kafka_port, _client(pki))
    await eventually(lambda: b.kafka.tls_failures == 1, msg="the broker counts the handshake")
    assert b.store.max_offset(TOPIC, 0) == 0


async def test_mtls_required_refuses_a_client_without_certificate(tls_broker, pki) -> None:
    b = await _kafka_broker(tls_broker, tls_client_auth="required", tls_ca=str(pki.ca_file))
    try:
        # TLS 1.3: the client's side of the handshake completes and the refusal arrives on
        # its first read; TLS 1.2: the handshake itself fails.  Either way nothing is served.
        wire = await Wire.open(b.kafka_port, _client(pki))
        wire.writer.write(encode_request(ApiKey.PRODUCE, 7, 1, "nocert", _produce(b"x")))
        assert await wire.closed()
        wire.close()
    except (ssl.SSLError, ConnectionResetError):
        pass
    await eventually(lambda: b.kafka.tls_failures == 1, msg="the broker counts the handshake")
    cert, key = pki.issue_client("app")
    wire = await Wire.open(b.kafka_port, _client(pki, cert=cert, key=key))
    try:
        assert await _produced(wire, b"with a certificate") == 0
    finally:
        wire.close()
    assert b.store.max_offset(TOPIC, 0) == 1


async def test_a_renewed_certificate_reaches_the_next_kafka_connection(tls_broker, pki) -> None:
    b = await _kafka_broker(tls_broker)
    first = await Wire.open(b.kafka_port, _client(pki))
    new_cert, new_key = pki.dir / "renewed.pem", pki.dir / "renewed.key"
    leaf = pki.issue_server(new_cert, new_key)
    os.replace(new_key, pki.key_file)
    os.replace(new_cert, pki.cert_file)
    second = await Wire.open(b.kafka_port, _client(pki))
    try:
        assert second.peer_cert != first.peer_cert
        assert second.peer_cert == ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())
        assert await _produced(first, b"old session") == 0  # the open connection keeps working
        assert await _produced(second, b"new certificate") == 1
    finally:
        first.close()
        second.close()


# --- SASL over TLS ----------------------------------------------------------------------------

async def _plain_login(wire: Wire, password: str = "alice-secret") -> tuple[dict, dict | None]:
    """SaslHandshake v1 for PLAIN, then (if accepted) its SaslAuthenticate: both answers."""
    hello = await wire.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    if hello["error_code"] != ErrorCode.NONE:
        return hello, None
    token = b"\0alice\0" + password.encode()
    return hello, await wire.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": token})


async def test_plain_is_offered_on_tls_connections_only(tls_broker, pki, tmp_path) -> None:
    users = users_file(tmp_path / "users.json", ("producer", "consumer"), alice="alice-secret")
    b = await _kafka_broker(tls_broker, tls_mode="permissive", users_file=users,
                            kafka_sasl_mechanisms="SCRAM-SHA-512,PLAIN")
    secure = await Wire.open(b.kafka_port, _client(pki))
    try:
        hello, auth = await _plain_login(secure)
        assert hello["mechanisms"] == ["SCRAM-SHA-512", "PLAIN"]
        assert auth is not None and auth["error_code"] == ErrorCode.NONE, auth
        assert await _produced(secure, b"sasl_ssl plain") == 0
    finally:
        secure.close()
    plain = await Wire.open(b.kafka_port)  # the same port, no TLS, no plaintext flag
    try:
        hello, auth = await _plain_login(plain)
        assert hello["error_code"] == ErrorCode.UNSUPPORTED_SASL_MECHANISM and auth is None
        assert hello["mechanisms"] == ["SCRAM-SHA-512"]
        assert await plain.closed()
    finally:
        plain.close()
    assert b.store.max_offset(TOPIC, 0) == 1


async def test_plain_on_plaintext_with_the_flag_on_a_permissive_port(tls_broker, pki,
                                                                      tmp_path) -> None:
    users = users_file(tmp_path / "users.json", ("producer", "consumer"), alice="alice-secret")
    b = await _kafka_broker(tls_broker, tls_mode="permissive", users_file=users,
                            kafka_sasl_mechanisms="PLAIN", kafka_sasl_plain_over_plaintext=True)
    plain = await Wire.open(b.kafka_port)
    try:
        hello, auth = await _plain_login(plain)
        assert hello["mechanisms"] == ["PLAIN"]
        assert auth is not None and auth["error_code"] == ErrorCode.NONE, auth
    finally:
        plain.close()
