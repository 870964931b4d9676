"""Unmodified Kafka clients over TLS against ``txbroker serve`` in a subprocess (docs/security.md
"Kafka over TLS"): confluent-kafka (librdkafka) and aiokafka with SASL_SSL SCRAM-SHA-512,
kafka-python with SASL_SSL PLAIN (no ``--kafka-sasl-plain-over-plaintext``: PLAIN over TLS
needs no flag), and librdkafka refusing a certificate its CA did not sign.  The raw-socket
cases (plaintext refused, permissive, mTLS, reload) are in test_tls_kafka.py."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
import trustme
from support.kafka_sasl import users_file

pytestmark = pytest.mark.slow

TIMEOUT = 60
USER, PASSWORD = "alice", "alice-secret"


@pytest.fixture
def tls_process(broker_process, pki, tmp_path: Path):
    """``txbroker serve`` with an enforcing TLS Kafka port and SASL (SCRAM-SHA-512, PLAIN)."""
    users = users_file(tmp_path / "users.json", ("producer", "consumer"), **{USER: PASSWORD})
    return broker_process(kafka_port=0, kafka_group_initial_rebalance_delay=0.2,
                          tls_mode="enforcing", tls_cert=str(pki.cert_file),
                          tls_key=str(pki.key_file), users_file=users,
                          kafka_sasl_mechanisms="SCRAM-SHA-512,PLAIN")


def _topic(what: str) -> str:
    return f"tls-{what}-{uuid.uuid4().hex[:6]}"


def test_confluent_kafka_sasl_ssl_scram_sha512(tls_process, pki) -> None:
    confluent = pytest.importorskip("confluent_kafka")
    conf = {"bootstrap.servers": tls_process.kafka_addr, "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(pki.ca_file), "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": USER, "sasl.password": PASSWORD}
    topic = _topic("librdkafka")
    producer = confluent.Producer(conf)
    producer.produce(topic, b"librdkafka over tls")
    assert producer.flush(TIMEOUT) == 0
    consumer = confluent.Consumer({**conf, "group.id": "tls-g", "auto.offset.reset": "earliest"})
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
    assert got == b"librdkafka over tls"


def test_confluent_kafka_refuses_a_certificate_from_another_ca(tls_process, tmp_path) -> None:
    confluent = pytest.importorskip("confluent_kafka")
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    errors: list = []
    producer = confluent.Producer({
        "bootstrap.servers": tls_process.kafka_addr, "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(other), "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER,
        "sasl.password": PASSWORD, "error_cb": errors.append, "message.timeout.ms": 2000})
    reports: list = []
    producer.produce(_topic("untrusted"), b"never", on_delivery=lambda err, _: reports.append(err))
    producer.flush(15)
    assert len(reports) == 1 and reports[0] is not None  # failed, not delivered
    assert any(e.code() in (confluent.KafkaError._SSL, confluent.KafkaError._TRANSPORT)
               for e in errors), errors
    assert any("certificate verify failed" in e.str() for e in errors), errors


async def test_aiokafka_sasl_ssl_scram_sha512(tls_process, pki) -> None:
    import aiokafka
    from aiokafka.helpers import create_ssl_context

    auth = {"security_protocol": "SASL_SSL", "ssl_context": create_ssl_context(cafile=str(pki.ca_file)),
            "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": USER,
            "sasl_plain_password": PASSWORD}
    topic = _topic("aiokafka")

    async def round_trip() -> bytes:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=tls_process.kafka_addr, **auth)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"aiokafka over tls")
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=tls_process.kafka_addr,
                                             auto_offset_reset="earliest", **auth)
        await consumer.start()
        try:
            return (await consumer.getone()).value
        finally:
            await consumer.stop()

    assert await asyncio.wait_for(round_trip(), TIMEOUT) == b"aiokafka over tls"


def test_kafka_python_sasl_ssl_plain(tls_process, pki) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    auth = {"security_protocol": "SASL_SSL", "ssl_cafile": str(pki.ca_file),
            "sasl_mechanism": "PLAIN", "sasl_plain_username": USER,
            "sasl_plain_password": PASSWORD}
    topic = _topic("kafka-python")
    producer = KafkaProducer(bootstrap_servers=tls_process.kafka_addr, **auth)
    try:
        producer.send(topic, b"plain over tls").get(timeout=TIMEOUT)
    finally:
        producer.close(timeout=10)
    consumer = KafkaConsumer(topic, bootstrap_servers=tls_process.kafka_addr,
                             auto_offset_reset="earliest", consumer_timeout_ms=TIMEOUT * 1000,
                             **auth)
    try:
        got = next(iter(consumer)).value
    finally:
        consumer.close()
    assert got == b"plain over tls"
