"""Kafka SASL with unmodified clients against ``txbroker serve`` in a subprocess: kafka-python
PLAIN over SASL_PLAINTEXT (with ``--kafka-sasl-plain-over-plaintext``), aiokafka
SCRAM-SHA-256 and SCRAM-SHA-512, confluent-kafka (librdkafka) SCRAM-SHA-512; a wrong
password, a fuzz of the handshake that leaves the listener serving, and the start-up refusals."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.kafka_sasl import users_file

from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.framing import decode_response, encode_request

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60
USER, PASSWORD = "alice", "alice-secret"


@pytest.fixture
def sasl_process(broker_process, tmp_path: Path):
    # With SASL on, Kafka ACLs apply: the roles let the user produce and consume.
    users = users_file(tmp_path / "users.json", ("producer", "consumer"), **{USER: PASSWORD})
    return broker_process(kafka_port=0, kafka_group_initial_rebalance_delay=0.2,
                          kafka_sasl_mechanisms="PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                          kafka_sasl_plain_over_plaintext=True,
                          users_file=users)


async def _aiokafka_round_trip(bootstrap: str, mechanism: str, password: str = PASSWORD) -> bytes:
    import aiokafka

    auth = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": USER, "sasl_plain_password": password}
    topic = f"sasl-{mechanism.lower()}-{uuid.uuid4().hex[:6]}"
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, **auth)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"over " + mechanism.encode())
    finally:
        await producer.stop()
    consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                                         auto_offset_reset="earliest", **auth)
    await consumer.start()
    try:
        msg = await asyncio.wait_for(consumer.getone(), TIMEOUT)
    finally:
        await consumer.stop()
    return msg.value


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_aiokafka_scram(sasl_process, mechanism: str) -> None:
    got = await asyncio.wait_for(_aiokafka_round_trip(sasl_process.kafka_addr, mechanism), TIMEOUT)
    assert got == b"over " + mechanism.encode()


async def test_aiokafka_wrong_password_is_refused(sasl_process) -> None:
    from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed

    with pytest.raises((SaslAuthenticationFailed, KafkaConnectionError)) as info:
        await asyncio.wait_for(
            _aiokafka_round_trip(sasl_process.kafka_addr, "SCRAM-SHA-256", "wrong"), TIMEOUT)
    log = Path(sasl_process.log_path).read_text()
    assert "Kafka authentication failed" in log and "'alice'" in log, (info.value, log[-2000:])
    assert "wrong" not in log.split("Kafka authentication failed", 1)[1].split("\n")[0] \
        .replace("invalid credentials", "")


def test_kafka_python_plain(sasl_process) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    auth = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
            "sasl_plain_username": USER, "sasl_plain_password": PASSWORD}
    topic = f"sasl-plain-{uuid.uuid4().hex[:6]}"
    producer = KafkaProducer(bootstrap_servers=sasl_process.kafka_addr, **auth)
    try:
        producer.send(topic, b"plain").get(timeout=TIMEOUT)
    finally:
        producer.close(timeout=10)
    consumer = KafkaConsumer(topic, bootstrap_servers=sasl_process.kafka_addr,
                             auto_offset_reset="earliest", consumer_timeout_ms=TIMEOUT * 1000,
                             **auth)
    try:
        got = next(iter(consumer)).value
    finally:
        consumer.close()
    assert got == b"plain"


def test_kafka_python_wrong_mechanism_is_refused(broker_process, tmp_path: Path) -> None:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    users = users_file(tmp_path / "users.json", **{USER: PASSWORD})
    proc = broker_process(kafka_port=0, kafka_sasl_mechanisms="SCRAM-SHA-512",
                          users_file=users)
    # kafka-python retries a refused handshake until its bootstrap time-out (30 s by default)
    # and then raises: a refusal comes at once, so 5 s is a wide bound.
    with pytest.raises(KafkaError):
        KafkaProducer(bootstrap_servers=proc.kafka_addr, security_protocol="SASL_PLAINTEXT",
                      sasl_mechanism="PLAIN", sasl_plain_username=USER,
                      sasl_plain_password=PASSWORD, request_timeout_ms=5000,
                      max_block_ms=5000, bootstrap_timeout_ms=5000).send("t", b"x").get(timeout=20)


def test_confluent_kafka_scram_sha512(sasl_process) -> None:
    confluent = pytest.importorskip("confluent_kafka")
    conf = {"bootstrap.servers": sasl_process.kafka_addr, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER, "sasl.password": PASSWORD}
    topic = f"sasl-librdkafka-{uuid.uuid4().hex[:6]}"
    producer = confluent.Producer(conf)
    producer.produce(topic, b"librdkafka")
    assert producer.flush(TIMEOUT) == 0
    consumer = confluent.Consumer({**conf, "group.id": "sasl-g", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        got = None
        for _ in range(TIMEOUT):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got = msg.value()
                break
    finally:
        consumer.close()
    assert got == b"librdkafka"
    # a wrong password: librdkafka reports an authentication error and delivers nothing
    errors: list = []
    bad = confluent.Producer({**conf, "sasl.password": "wrong", "error_cb": errors.append})
    bad.produce(topic, b"never")
    bad.flush(5)
    assert any(e.code() == confluent.KafkaError._AUTHENTICATION for e in errors), errors


def _exchange(addr: str, frames: list[bytes]) -> None:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(encode_request(ApiKey.SASL_HANDSHAKE, 1, 1, "fuzz",
                                 {"mechanism": "SCRAM-SHA-256"}))
        for i, token in enumerate(frames):
            s.sendall(encode_request(ApiKey.SASL_AUTHENTICATE, 1, i + 2, "fuzz",
                                     {"auth_bytes": token}))
        s.sendall(b"\0\0\0\x05xx")  # and a truncated frame
        s.shutdown(socket.SHUT_WR)
        while s.recv(4096):  # until the broker closes (bounded by the socket time-out)
            pass


def _authenticates(addr: str) -> bool:
    from support.kafka_sasl import scram_client

    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        f = s.makefile("rb")

        def call(key: int, version: int, corr: int, body: dict) -> dict:
            s.sendall(encode_request(key, version, corr, "fuzz", body))
            size = int.from_bytes(f.read(4), "big")
            return decode_response(key, version, f.read(size))[1]
        call(ApiKey.SASL_HANDSHAKE, 1, 1, {"mechanism": "SCRAM-SHA-256"})
        first = call(ApiKey.SASL_AUTHENTICATE, 1, 2, {"auth_bytes": b"n,,n=alice,r=fz"})
        final, _ = scram_client("SCRAM-SHA-256", USER, PASSWORD, first["auth_bytes"],
                                "n=alice,r=fz")
        return call(ApiKey.SASL_AUTHENTICATE, 1, 3, {"auth_bytes": final})["error_code"] == 0


def test_fuzzed_sasl_exchanges_leave_the_listener_serving(sasl_process) -> None:
    addr = sasl_process.kafka_addr

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.binary(max_size=120) | st.sampled_from(
        [b"n,,n=alice,r=", b"n,,n=alice,r=abc", b"c=biws,r=abc,p=", b"\0alice\0x"]),
        min_size=1, max_size=3))
    def exchange(frames: list[bytes]) -> None:
        _exchange(addr, frames)

    exchange()
    assert sasl_process.alive()
    assert _authenticates(addr)


def _serve(*args: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXBROKER_")}
    return subprocess.run([sys.executable, "-P", "-m", "txbroker", "serve", *args, "--print-config"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
                          env=clean)


@pytest.mark.parametrize("args, message", [
    (("--kafka-sasl-mechanisms", "PLAIN", "--users-file", "u.json"),
     "PLAIN sends the password in the clear"),
    (("--kafka-sasl-mechanisms", "SCRAM-SHA-1", "--users-file", "u.json"),
     "unknown SCRAM-SHA-1"),
    (("--kafka-sasl-mechanisms", "SCRAM-SHA-256",), "needs users_file"),
])
def test_serve_refuses_bad_sasl_settings_in_one_line(args, message) -> None:
    res = _serve(*args)
    assert res.returncode == 2, res
    err = res.stderr.strip()
    assert message in err and "\n" not in err and "Traceback" not in err, err


def test_serve_refuses_an_unreadable_credentials_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXBROKER_")}
    res = subprocess.run([sys.executable, "-P", "-m", "txbroker", "serve", "--data-dir",
                          str(tmp_path / "d"), "--broker-port", "0", "--namesrv-port", "0",
                          "--kafka-port", "0", "--kafka-sasl-mechanisms", "SCRAM-SHA-256",
                          "--users-file", str(missing)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60, check=False, env=clean)
    assert res.returncode == 2, res
    err = res.stderr.strip().splitlines()[-1]
    assert str(missing) in err and err.startswith("error: ") and "Traceback" not in res.stderr, \
        res.stderr
