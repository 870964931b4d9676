"""Kafka SASL does not tell who has an account (docs/security.md, "Kafka SASL"): over a real
socket to an in-process broker, SASL/PLAIN answers an unknown name as late as a wrong password
of a real account, and SCRAM's server-first for an unknown name is the same after a restart and
on another broker of the same configuration, as a real account's is."""

from __future__ import annotations

import asyncio
import base64
import statistics
import time
from pathlib import Path

import pytest
from support.kafka_sasl import users_file

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.service.users import load_users

WAIT = 10.0
USER, PASSWORD = "alice", "alice-secret"
#: Tries per kind of PLAIN login in the timing test (interleaved, so load hits all alike).
TRIES = 41
#: Largest gap allowed between the median answer times of an unknown name and of a wrong
#: password: the derivations a real account's check costs (SHA-256 and SHA-512, 4096
#: iterations each) take about 3 ms here, so a gap of 1 ms, or a quarter of the wrong
#: password's own median on a slower machine, means the unknown name paid them too.
MAX_GAP_S = 0.001
MAX_GAP_SHARE = 0.25


async def _call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: int,
                version: int, body: dict) -> dict:
    writer.write(encode_request(key, version, 1, "enum-test", body))
    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), WAIT), "big")
    _, answer = decode_response(key, version, await asyncio.wait_for(reader.readexactly(size),
                                                                     WAIT))
    return answer


async def _plain(port: int, user: str, password: str) -> tuple[int, float]:
    """(error code, seconds the SaslAuthenticate answer took) of one PLAIN login."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        answer = await _call(reader, writer, ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert answer["error_code"] == ErrorCode.NONE, answer
        token = f"\0{user}\0{password}".encode()
        started = time.perf_counter()
        answer = await _call(reader, writer, ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": token})
        return answer["error_code"], time.perf_counter() - started
    finally:
        writer.close()


async def _server_first(port: int, user: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
    """The attributes of SCRAM's server-first message for ``user``, but the nonce's server part
    (random per exchange)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        answer = await _call(reader, writer, ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism})
        assert answer["error_code"] == ErrorCode.NONE, answer
        answer = await _call(reader, writer, ApiKey.SASL_AUTHENTICATE, 2,
                             {"auth_bytes": f"n,,n={user},r=enumnonce".encode()})
        assert answer["error_code"] == ErrorCode.NONE, answer
    finally:
        writer.close()
    attrs = dict(p.split("=", 1) for p in answer["auth_bytes"].decode().split(","))
    assert attrs.pop("r").startswith("enumnonce")
    return attrs


def _sasl(config: BrokerConfig, users: str, data_dir: Path) -> BrokerConfig:
    return config.replace(kafka_sasl_mechanisms="SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
                          kafka_sasl_plain_over_plaintext=True, users_file=users,
                          data_dir=str(data_dir))


async def _started(config: BrokerConfig):
    from txbroker.broker import Broker

    b = Broker(config)
    await b.start()
    return b


async def test_plain_answers_an_unknown_name_as_late_as_a_wrong_password(
        kafka_config: BrokerConfig, tmp_path: Path) -> None:
    users = users_file(tmp_path / "users.json", **{USER: PASSWORD})
    broker = await _started(_sasl(kafka_config, users, tmp_path / "data"))
    try:
        port = broker.kafka_port
        unknown, wrong = [], []
        for _ in range(TRIES):
            for name, times in (("mallory", unknown), (USER, wrong)):
                code, took = await _plain(port, name, "guess")
                assert code == ErrorCode.SASL_AUTHENTICATION_FAILED
                times.append(took)
                # A success forgets this address's failure: no back-off delay in the next try.
                code, _ = await _plain(port, USER, PASSWORD)
                assert code == ErrorCode.NONE
    finally:
        await broker.stop()
    m_unknown, m_wrong = statistics.median(unknown), statistics.median(wrong)
    gap = abs(m_wrong - m_unknown)
    assert gap < max(MAX_GAP_S, MAX_GAP_SHARE * m_wrong), (
        f"median PLAIN failure: unknown name {m_unknown * 1e3:.2f} ms, wrong password "
        f"{m_wrong * 1e3:.2f} ms (gap {gap * 1e3:.2f} ms)")


async def test_scram_unknown_name_answers_the_same_after_a_restart_and_on_another_broker(
        kafka_config: BrokerConfig, tmp_path: Path) -> None:
    users = users_file(tmp_path / "users.json", **{USER: PASSWORD})
    first = await _started(_sasl(kafka_config, users, tmp_path / "a"))
    try:
        before = {mech: await _server_first(first.kafka_port, "mallory", mech)
                  for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512")}
        real = await _server_first(first.kafka_port, USER)
    finally:
        await first.stop()
    # Shaped like a real account's answer: a salt of the same length, the same iterations.
    salt = base64.b64decode(before["SCRAM-SHA-512"]["s"])
    assert len(salt) == len(base64.b64decode(real["s"]))
    assert before["SCRAM-SHA-512"]["i"] == real["i"]
    assert before["SCRAM-SHA-256"]["s"] != before["SCRAM-SHA-512"]["s"]

    again = await _started(_sasl(kafka_config, users, tmp_path / "a"))  # a restart
    other = await _started(_sasl(kafka_config, users, tmp_path / "b"))  # another broker
    try:
        for broker in (again, other):
            for mech, answer in before.items():
                assert await _server_first(broker.kafka_port, "mallory", mech) == answer
            assert await _server_first(broker.kafka_port, USER) == real
    finally:
        await again.stop()
        await other.stop()


async def test_scram_unknown_name_is_keyed_by_the_cluster_secret(kafka_config: BrokerConfig,
                                                                 tmp_path: Path) -> None:
    """Brokers of one cluster may each read their own users file: the made-up salt is keyed
    by the cluster secret they all hold."""
    secret = "s3cret-of-the-cluster-long-enough-" * 2
    answers = []
    for name in ("a", "b"):
        users = users_file(tmp_path / f"users-{name}.json", **{USER: PASSWORD})
        broker = await _started(_sasl(kafka_config, users, tmp_path / name).replace(
            cluster_secret=secret))
        try:
            answers.append(await _server_first(broker.kafka_port, "mallory"))
        finally:
            await broker.stop()
    assert answers[0] == answers[1]


async def test_a_users_file_without_a_salt_key_gets_one_at_start(kafka_config: BrokerConfig,
                                                                 tmp_path: Path) -> None:
    """A file written before there was a salt key: the broker adds one once, and the made-up
    salt then survives a restart like any other."""
    import orjson

    path = Path(users_file(tmp_path / "users.json", **{USER: PASSWORD}))
    doc = orjson.loads(path.read_bytes())
    del doc["salt_key"]
    path.write_bytes(orjson.dumps(doc))
    answers = []
    for _ in range(2):
        broker = await _started(_sasl(kafka_config, str(path), tmp_path / "data"))
        try:
            answers.append(await _server_first(broker.kafka_port, "mallory"))
        finally:
            await broker.stop()
        assert load_users(path).salt_key
    assert answers[0] == answers[1]
    assert load_users(path).users[USER].scram  # the accounts are untouched


@pytest.mark.parametrize("user", ["mallory", USER, "nobody@example.com"])
def test_plain_check_derives_for_every_mechanism_whoever_asks(user: str,
                                                               monkeypatch) -> None:
    """The PLAIN check's work counted directly: one derivation per mechanism for a real
    account, an unknown name and a name alike (a wrong password)."""
    from txbroker.service import users as users_module
    from txbroker.service.users import Users

    store = Users().with_password(USER, PASSWORD)
    calls = []
    real = users_module.verify_password

    def counted(cred, password):
        calls.append(cred.mechanism)
        return real(cred, password)

    monkeypatch.setattr(users_module, "verify_password", counted)
    assert not store.check_password(user, "guess")
    assert sorted(calls) == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    calls.clear()
    assert store.check_password(USER, PASSWORD) and len(calls) == 2
