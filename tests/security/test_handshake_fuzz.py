"""Fuzz of the handshakes a stranger can reach before authenticating: the TLS handshake on the
broker's remoting port (permissive and enforcing) and the SASL exchange on the Kafka port.

A real broker process (``txbroker serve``) on 127.0.0.1 port 0; hypothesis makes the bytes
(random, a 0x16 byte then garbage, a real ClientHello truncated or with bytes flipped, a record
header announcing 64 KiB, a handshake cut after the server's first flight; malformed and
truncated Kafka SASL frames and oversized size prefixes).  The fuzzer sends, half-closes, reads
briefly and closes, so nothing waits on the broker's timeouts.  After every example the broker
must still answer a real TLS client (and, in permissive mode, a plaintext one) on the remoting
port, or ApiVersions on the Kafka port; at the end a real SCRAM client (kafka-python) logs in.
"""

from __future__ import annotations

import socket
import ssl
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txbroker.remoting.codec import FrameDecoder, encode
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.service.users import Users, write_users

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Per-operation socket timeout of the checks (a healthy broker answers in milliseconds).
WAIT = 10.0
#: How long the fuzzer reads what the broker answers before closing.
PEEK = 0.05
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _client_hello() -> bytes:
    """A real ClientHello, as Python's TLS client writes it first."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_side=False)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


HELLO = _client_hello()


@st.composite
def tls_garbage(draw: st.DrawFn) -> tuple[bytes, bool]:
    """(bytes to send, whether to read the server's first flight before closing)."""
    kind = draw(st.sampled_from(["random", "0x16", "truncated", "flipped", "huge", "cut"]))
    if kind == "random":
        return draw(st.binary(min_size=1, max_size=600)), False
    if kind == "0x16":
        return b"\x16" + draw(st.binary(max_size=600)), False
    if kind == "truncated":
        return HELLO[:draw(st.integers(1, len(HELLO) - 1))], False
    if kind == "flipped":
        data = bytearray(HELLO)
        for at in draw(st.lists(st.integers(0, len(HELLO) - 1), min_size=1, max_size=8)):
            data[at] ^= draw(st.integers(1, 255))
        return bytes(data), False
    if kind == "huge":  # a handshake record announcing 64 KiB, then far less
        return b"\x16\x03\x01\xff\xff" + draw(st.binary(max_size=300)), False
    return HELLO, True  # a whole ClientHello, the server's answer read, then cut


def _throw(port: int, data: bytes, read_first: bool = False) -> None:
    """Send ``data`` to 127.0.0.1:port, half-close, peek at the answer, close."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
        try:
            s.sendall(data)
            if read_first:
                s.settimeout(WAIT)
                s.recv(4096)  # the ServerHello flight: the handshake is cut after it
            s.shutdown(socket.SHUT_WR)
            s.settimeout(PEEK)
            while s.recv(65536):
                pass
        except OSError:  # timed out, or the broker already dropped the stranger: both fine
            pass


def _remoting_call(sock: socket.socket) -> RemotingCommand:
    sock.sendall(encode(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)))
    decoder = FrameDecoder()
    while True:
        chunk = sock.recv(65536)
        assert chunk, "the broker closed the connection"
        frames = decoder.feed(chunk)
        if frames:
            return frames[0]


def _serves_tls(port: int, ca_file: Path) -> None:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert _remoting_call(tls).code == ResponseCode.SUCCESS


def _serves_plaintext(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
        assert _remoting_call(s).code == ResponseCode.SUCCESS


@pytest.mark.parametrize("mode", ["permissive", "enforcing"])
def test_tls_handshake_fuzz_leaves_the_broker_serving(broker_process, pki, mode) -> None:
    b = broker_process(tls_mode=mode, tls_cert=str(pki.cert_file), tls_key=str(pki.key_file))
    port = int(b.broker_addr.rsplit(":", 1)[1])
    thrown: list[bytes] = []

    @FUZZ
    @given(case=tls_garbage())
    def fuzz(case: tuple[bytes, bool]) -> None:
        thrown.append(case[0])
        _throw(port, *case)
        assert b.alive()
        _serves_tls(port, pki.ca_file)
        if mode == "permissive":
            _serves_plaintext(port)

    fuzz()
    assert len(thrown) >= 20 and any(t.startswith(b"\x16") for t in thrown)
    assert b.alive()


# --- Kafka SASL ---------------------------------------------------------------------------

def _frame(key: int, version: int, body: dict, corr: int = 1) -> bytes:
    return encode_request(key, version, corr, "fuzz", body)


@st.composite
def sasl_garbage(draw: st.DrawFn) -> bytes:
    """Bytes a stranger may send first on a Kafka port with SASL on."""
    mech = draw(st.sampled_from(["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "GSSAPI", ""]))
    handshake = _frame(ApiKey.SASL_HANDSHAKE, draw(st.integers(0, 1)), {"mechanism": mech})
    token = draw(st.binary(max_size=300) | st.sampled_from(
        [b"n,,n=alice,r=abc", b"c=biws,r=abc,p=AAAA", b"n,,n=,r=", b"\0alice\0x"]))
    authenticate = _frame(ApiKey.SASL_AUTHENTICATE, draw(st.integers(0, 2)),
                          {"auth_bytes": token}, corr=2)
    kind = draw(st.sampled_from(["random", "truncated", "flipped", "oversized", "raw", "sequence"]))
    if kind == "random":
        return draw(st.binary(min_size=1, max_size=400))
    whole = handshake + authenticate
    if kind == "truncated":
        return whole[:draw(st.integers(1, len(whole) - 1))]
    if kind == "flipped":
        data = bytearray(whole)
        for at in draw(st.lists(st.integers(0, len(whole) - 1), min_size=1, max_size=6)):
            data[at] ^= draw(st.integers(1, 255))
        return bytes(data)
    if kind == "oversized":  # a size prefix far past the pre-authentication bound
        size = draw(st.sampled_from([2**31 - 1, 2**24, 600_000, -1]))
        return struct.pack(">i", size) + draw(st.binary(max_size=100))
    if kind == "raw":  # SaslHandshake v0, then a bare token
        return _frame(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": mech}) + \
            struct.pack(">i", len(token)) + token
    return whole


def _serves_api_versions(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
        s.sendall(_frame(ApiKey.API_VERSIONS, 0, {}, corr=7))
        head = b""
        while len(head) < 4:
            chunk = s.recv(4 - len(head))
            assert chunk, "the broker closed the connection"
            head += chunk
        size = int.from_bytes(head, "big")
        body = b""
        while len(body) < size:
            chunk = s.recv(size - len(body))
            assert chunk
            body += chunk
        corr, answer = decode_response(ApiKey.API_VERSIONS, 0, body)
        assert corr == 7 and answer["error_code"] == 0


def test_kafka_sasl_fuzz_leaves_the_broker_serving_a_scram_client(broker_process,
                                                                  tmp_path) -> None:
    kafka = pytest.importorskip("kafka")
    users = tmp_path / "users.json"
    write_users(users, Users().with_password("alice", "alice-secret", ("producer", "consumer")))
    b = broker_process(kafka_port=0, kafka_sasl_mechanisms="SCRAM-SHA-256,SCRAM-SHA-512",
                       users_file=str(users))
    port = int(b.kafka_addr.rsplit(":", 1)[1])
    thrown: list[bytes] = []

    @FUZZ
    @given(data=sasl_garbage())
    def fuzz(data: bytes) -> None:
        thrown.append(data)
        _throw(port, data)
        assert b.alive()
        _serves_api_versions(port)

    fuzz()
    assert len(thrown) >= 20
    # The failures above put 127.0.0.1 on the back-off (up to 5 s per attempt): a real client
    # still gets in, a little later, and its success forgets the address.
    producer = kafka.KafkaProducer(
        bootstrap_servers=b.kafka_addr, security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
        sasl_plain_password="alice-secret", request_timeout_ms=60000)
    try:
        meta = producer.send("fuzzed", b"still here").get(timeout=60)
        assert meta.topic == "fuzzed" and meta.offset >= 0
    finally:
        producer.close(timeout=10)
    assert b.alive()
