"""Debian's kcat (1.7.1 on librdkafka 2.0.2) against ``txbroker serve`` in a subprocess, over
SASL_SSL with SCRAM-SHA-512 (docs/kafka.md "Clients", docs/security.md "Kafka SASL"): produce,
consume, a consumer group, and transactions written by confluent-kafka read back with
``isolation.level=read_committed``.  That librdkafka sends its client nonce twice in the SCRAM
client-final message, which the broker accepts as Kafka 3.8.1 to 3.9 do (``service/kafka/sasl.py``)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import trustme
from support.kafka_sasl import users_file

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
if KCAT is None:
    pytest.skip("kcat is not installed (Debian package: kcat)", allow_module_level=True)

pytestmark = pytest.mark.slow

#: Seconds any one kcat run may take (each exits by itself well before: -e, -c).
KCAT_TIMEOUT = 60
TIMEOUT = 60
USER, PASSWORD = "alice", "alice-secret"


class _Pki:
    def __init__(self, d: Path) -> None:
        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        self.ca_file, self.cert_file, self.key_file = d / "ca.pem", d / "server.pem", d / "server.key"
        ca.cert_pem.write_to_path(str(self.ca_file))
        leaf.cert_chain_pems[0].write_to_path(str(self.cert_file))
        leaf.private_key_pem.write_to_path(str(self.key_file))


@pytest.fixture
def pki(tmp_path: Path) -> _Pki:
    d = tmp_path / "pki"
    d.mkdir()
    return _Pki(d)


@pytest.fixture
def tls_process(broker_process, pki: _Pki, tmp_path: Path):
    """``txbroker serve`` with an enforcing TLS Kafka port and SASL/SCRAM-SHA-512."""
    users = users_file(tmp_path / "users.json", ("producer", "consumer"), **{USER: PASSWORD})
    return broker_process(kafka_port=0, kafka_group_initial_rebalance_delay=0.2,
                          tls_mode="enforcing", tls_cert=str(pki.cert_file),
                          tls_key=str(pki.key_file), users_file=users,
                          kafka_sasl_mechanisms="SCRAM-SHA-512")


def _auth(pki: _Pki) -> dict[str, str]:
    """The client settings, librdkafka's names: the same for kcat's -X and confluent-kafka."""
    return {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": USER, "sasl.password": PASSWORD,
            "ssl.ca.location": str(pki.ca_file)}


def kcat(proc, pki: _Pki, *args: str, stdin: bytes | None = None) -> bytes:
    """One kcat run against the broker; its output, or a failure with its stderr."""
    argv = [KCAT, "-b", proc.kafka_addr, "-q"]
    for key, value in _auth(pki).items():
        argv += ["-X", f"{key}={value}"]
    done = subprocess.run([*argv, *args], input=stdin, capture_output=True,
                          timeout=KCAT_TIMEOUT, check=False)
    assert done.returncode == 0, (args, done.returncode, done.stderr.decode()[-2000:],
                                  proc.log_tail(2000))
    return done.stdout


def _topic(what: str) -> str:
    return f"kcat-{what}-{uuid.uuid4().hex[:6]}"


def test_kcat_produces_and_consumes_over_sasl_ssl_scram(tls_process, pki) -> None:
    topic = _topic("pc")
    kcat(tls_process, pki, "-P", "-t", topic, "-p", "0", stdin=b"one\ntwo\nthree\n")
    out = kcat(tls_process, pki, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
               "-f", "%o %s\n")
    assert out.decode().splitlines() == ["0 one", "1 two", "2 three"]


def test_kcat_consumes_in_a_group(tls_process, pki) -> None:
    topic, group = _topic("group"), f"kcat-g-{uuid.uuid4().hex[:6]}"
    lines = [f"m{i}" for i in range(6)]
    kcat(tls_process, pki, "-P", "-t", topic, stdin="\n".join(lines).encode() + b"\n")
    out = kcat(tls_process, pki, "-G", group, "-X", "auto.offset.reset=earliest",
               "-c", str(len(lines)), "-f", "%s\n", topic)
    assert sorted(out.decode().splitlines()) == sorted(lines)
    # The group committed its offsets: a consumer of the same group finds nothing new, and
    # the broker knows the group's offset (read back by confluent-kafka, another client).
    confluent = pytest.importorskip("confluent_kafka")
    consumer = confluent.Consumer({"bootstrap.servers": tls_process.kafka_addr,
                                   **_auth(pki), "group.id": group,
                                   "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=TIMEOUT).topics[topic].partitions
        committed = consumer.committed([confluent.TopicPartition(topic, p) for p in parts],
                                       timeout=TIMEOUT)
    finally:
        consumer.close()
    assert sum(tp.offset for tp in committed if tp.offset >= 0) == len(lines), committed


def test_kcat_reads_only_committed_transactions(tls_process, pki) -> None:
    confluent = pytest.importorskip("confluent_kafka")
    topic = _topic("txn")
    producer = confluent.Producer({"bootstrap.servers": tls_process.kafka_addr, **_auth(pki),
                                   "transactional.id": f"kcat-tx-{uuid.uuid4().hex[:6]}"})
    try:
        producer.init_transactions(TIMEOUT)
        for value, commit in ((b"committed-1", True), (b"aborted-1", False),
                              (b"committed-2", True), (b"aborted-2", False)):
            producer.begin_transaction()
            producer.produce(topic, value, partition=0)
            producer.flush(TIMEOUT)
            if commit:
                producer.commit_transaction(TIMEOUT)
            else:
                producer.abort_transaction(TIMEOUT)
    finally:
        del producer  # its threads stop now, not after the broker is gone
    out = kcat(tls_process, pki, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
               "-X", "isolation.level=read_committed", "-f", "%s\n")
    assert out.decode().splitlines() == ["committed-1", "committed-2"]
