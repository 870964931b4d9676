"""The cluster's own Kafka account (docs/security.md, "Kafka SASL", "Between brokers"): the
SCRAM client against the listener's SCRAM server, the account derived from cluster_secret,
a broker logging in to a real listener (and being refused with a different secret), the
reserved user name in the CLI and the start-up check."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.cli_runner import cli_one_line_error
from support.kafka_sasl import users_file
from support.scram_client import client_proof as independent_proof
from test_kafka_sasl import Wire

from txbroker.cli.main import main
from txbroker.config import BrokerConfig, ConfigError
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.peer_auth import (
    CLUSTER_SALTS,
    CLUSTER_USER,
    ClusterAccount,
    PeerAuthError,
    ScramClient,
    authenticate,
)
from txbroker.service.kafka.sasl import SaslFailure, ScramServer
from txbroker.service.scram import client_proof, make_credentials
from txbroker.service.users import Users

SECRET = "the-cluster-secret"
SCRAMS = ["SCRAM-SHA-256", "SCRAM-SHA-512"]
REPO_ROOT = Path(__file__).resolve().parents[2]


def _store() -> Users:
    """A user store holding alice, and a user of the reserved name written before it was
    reserved: the account never comes from the store."""
    return Users().with_password("alice", "alice-secret").with_password(CLUSTER_USER, "planted")


def _exchange(client: ScramClient, server: ScramServer) -> None:
    first, done = server.step(client.first())
    assert not done
    final, done = server.step(client.final(first))
    assert done
    client.verify(final)


# --- the SCRAM client against the listener's server (no I/O) -------------------------------

@pytest.mark.parametrize("mech", SCRAMS)
def test_scram_client_logs_in_to_the_cluster_account(mech: str) -> None:
    server = ScramServer(ClusterAccount(_store(), SECRET), mech, b"k" * 32)
    _exchange(ScramClient(mech, CLUSTER_USER, SECRET), server)
    assert server.user == CLUSTER_USER


@pytest.mark.parametrize("mech", SCRAMS)
def test_a_wrong_secret_is_refused_and_the_planted_user_is_ignored(mech: str) -> None:
    for password in ("another-secret", "planted"):
        server = ScramServer(ClusterAccount(_store(), SECRET), mech, b"k" * 32)
        with pytest.raises(SaslFailure, match="invalid credentials"):
            _exchange(ScramClient(mech, CLUSTER_USER, password), server)


def test_without_a_secret_there_is_no_cluster_account() -> None:
    account = ClusterAccount(_store(), None)
    assert account.scram_credentials(CLUSTER_USER, "SCRAM-SHA-512") is None
    assert not account.check_password(CLUSTER_USER, "planted")
    server = ScramServer(account, "SCRAM-SHA-512", b"k" * 32)
    with pytest.raises(SaslFailure):
        _exchange(ScramClient("SCRAM-SHA-512", CLUSTER_USER, "planted"), server)


def test_the_account_credentials_and_plain_check() -> None:
    account = ClusterAccount(_store(), SECRET)
    for mech in SCRAMS:
        assert account.scram_credentials(CLUSTER_USER, mech) == make_credentials(
            mech, SECRET, CLUSTER_SALTS[mech])
    assert account.check_password(CLUSTER_USER, SECRET)
    assert not account.check_password(CLUSTER_USER, SECRET + "x")
    assert not account.check_password(CLUSTER_USER, "planted")
    # Every other user is the store's.
    assert account.check_password("alice", "alice-secret")
    assert account.scram_credentials("alice", "SCRAM-SHA-256") is not None
    assert account.scram_credentials("bob", "SCRAM-SHA-256") is None


@pytest.mark.parametrize("mech", SCRAMS)
def test_client_proof_matches_an_independent_computation(mech: str) -> None:
    creds = make_credentials(mech, "pencil", b"salt-of-sixteen!", 4096)
    proof, server_sig = client_proof(mech, "pencil", creds.salt, creds.iterations, b"auth")
    assert proof == independent_proof("pencil", creds, b"auth")
    assert len(server_sig) == len(proof)


def test_the_client_checks_the_server() -> None:
    client = ScramClient("SCRAM-SHA-256", CLUSTER_USER, SECRET)
    with pytest.raises(PeerAuthError, match="server signature"):
        client.verify(b"v=" + base64.b64encode(b"\0" * 32))  # before any server-first
    nonce = client.first().decode().rsplit("r=", 1)[1]
    salt = base64.b64encode(b"s" * 16).decode()
    with pytest.raises(PeerAuthError, match="does not extend"):
        client.final(f"r=other{nonce},s={salt},i=4096".encode())
    with pytest.raises(PeerAuthError, match="iterations"):
        client.final(f"r={nonce}x,s={salt},i=100000000".encode())
    with pytest.raises(PeerAuthError, match="malformed"):
        client.final(b"r=,s,i=x")
    client.final(f"r={nonce}x,s={salt},i=4096".encode())
    with pytest.raises(PeerAuthError, match="server signature"):
        client.verify(b"v=" + base64.b64encode(b"\0" * 32))


# --- a broker logging in to a real listener ---------------------------------------------------

@pytest.fixture
def peer_config(kafka_config: BrokerConfig, tmp_path: Path) -> BrokerConfig:
    """A Kafka port with SASL, ACLs (bob has no permission) and the cluster secret."""
    return kafka_config.replace(kafka_sasl_mechanisms="SCRAM-SHA-256,SCRAM-SHA-512",
                                users_file=users_file(tmp_path / "users.json", bob="bob-secret"),
                                cluster_secret=SECRET)


@pytest.fixture
async def peer_broker(peer_config: BrokerConfig):
    from txbroker.broker import Broker

    b = Broker(peer_config)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


async def _create_topic(wire: Wire, name: str) -> int:
    answer = await wire.call(ApiKey.CREATE_TOPICS, 4, {"topics": [
        {"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": []}], "timeout_ms": 5000, "validate_only": False})
    return answer["topics"][0]["error_code"]


async def test_the_cluster_account_logs_in_and_is_a_super_user(peer_broker, peer_config) -> None:
    bob = await Wire.open(peer_broker.kafka_port)
    try:
        assert (await bob.scram("SCRAM-SHA-256", "bob", "bob-secret"))["error_code"] == 0
        assert await _create_topic(bob, "by-bob") == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    finally:
        bob.close()
    wire = await Wire.open(peer_broker.kafka_port)
    try:
        await asyncio.wait_for(authenticate(wire.reader, wire.writer, peer_config), 10)
        assert await _create_topic(wire, "by-the-cluster") == ErrorCode.NONE
    finally:
        wire.close()
    assert peer_broker.topics.get("by-the-cluster") is not None
    assert peer_broker.topics.get("by-bob") is None


@pytest.mark.parametrize("mechanisms", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
async def test_a_peer_with_another_secret_is_refused_with_one_line(
        peer_broker, peer_config, caplog, mechanisms: str) -> None:
    other = peer_config.replace(cluster_secret="not-the-cluster-secret",
                                kafka_sasl_mechanisms=mechanisms)
    wire = await Wire.open(peer_broker.kafka_port)
    try:
        with caplog.at_level(logging.WARNING, "txbroker.kafka"), \
                pytest.raises(PeerAuthError, match="different cluster_secret"):
            await asyncio.wait_for(authenticate(wire.reader, wire.writer, other), 10)
        assert await wire.closed()
    finally:
        wire.close()
    mine = [r.getMessage() for r in caplog.records if r.getMessage().startswith("logging in")]
    assert len(mine) == 1, mine
    assert f"Kafka peer 127.0.0.1:{peer_broker.kafka_port}" in mine[0]
    assert mechanisms in mine[0] and "different cluster_secret" in mine[0]
    assert "not-the-cluster-secret" not in caplog.text and SECRET not in caplog.text


async def test_a_peer_offering_other_mechanisms_is_named(peer_broker, peer_config) -> None:
    plain = peer_config.replace(kafka_sasl_mechanisms="PLAIN", kafka_sasl_plain_over_plaintext=True)
    wire = await Wire.open(peer_broker.kafka_port)
    try:
        with pytest.raises(PeerAuthError, match="same kafka_sasl_mechanisms"):
            await asyncio.wait_for(authenticate(wire.reader, wire.writer, plain), 10)
    finally:
        wire.close()


async def test_plain_logs_in_with_the_secret(peer_config, tmp_path) -> None:
    from txbroker.broker import Broker

    config = peer_config.replace(kafka_sasl_mechanisms="PLAIN",
                                 kafka_sasl_plain_over_plaintext=True)
    broker = Broker(config)
    await broker.start()
    try:
        for secret, ok in ((SECRET, True), ("not-the-cluster-secret", False)):
            wire = await Wire.open(broker.kafka_port)
            try:
                login = authenticate(wire.reader, wire.writer,
                                     config.replace(cluster_secret=secret))
                if ok:
                    await asyncio.wait_for(login, 10)
                    assert await _create_topic(wire, "by-plain") == ErrorCode.NONE
                else:
                    with pytest.raises(PeerAuthError, match="Invalid username or password"):
                        await asyncio.wait_for(login, 10)
            finally:
                wire.close()
    finally:
        await broker.stop()


# --- the reserved name and the start-up check ---------------------------------------------

def test_the_cli_refuses_the_reserved_user_name(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    result = CliRunner().invoke(main, ["user", "add", CLUSTER_USER, "--password-stdin",
                                       "--users-file", str(path)], input="whatever\n")
    err = cli_one_line_error(result)
    assert "reserved" in err and "cluster_secret" in err, err
    assert not path.exists()


def test_a_cluster_broker_with_kafka_sasl_needs_the_cluster_secret() -> None:
    base = BrokerConfig(kafka_port=0, kafka_node_id=1, kafka_sasl_mechanisms="SCRAM-SHA-256",
                        users_file="u.json")
    with pytest.raises(ConfigError, match="needs cluster_secret"):
        base.replace(namesrv_addr="127.0.0.1:9876")
    with pytest.raises(ConfigError, match="needs cluster_secret"):
        base.replace(workers=2)
    base.replace(namesrv_addr="127.0.0.1:9876", cluster_secret=SECRET)  # accepted
    base.replace(namesrv_addr="127.0.0.1:9876", kafka_port=-1)  # no Kafka port: nothing to reach


def test_serve_says_why_in_one_line(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXBROKER_")}
    res = subprocess.run(
        [sys.executable, "-P", "-m", "txbroker", "serve", "--data-dir", str(tmp_path / "d"),
         "--namesrv-addr", "127.0.0.1:9876", "--kafka-port", "0", "--kafka-node-id", "1",
         "--kafka-sasl-mechanisms", "SCRAM-SHA-512", "--users-file", "u.json", "--print-config"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False, env=clean)
    assert res.returncode == 2, res
    err = res.stderr.strip()
    assert err.startswith("error: ") and "needs cluster_secret" in err, err
    assert "\n" not in err and "Traceback" not in err, err
