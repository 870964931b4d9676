"""Kafka SASL on the wire (raw frames through a real socket to an in-process broker): what is
served before authentication, what closes the connection, SaslHandshake v0's raw tokens,
ILLEGAL_SASL_STATE once authenticated or with SASL off, the pre-authentication frame bound,
the back-off and the failure log line."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from support.kafka_sasl import scram_client, users_file

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response, encode_request

WAIT = 10.0
MECHS = "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"


@pytest.fixture
def sasl_config(kafka_config: BrokerConfig, tmp_path: Path) -> BrokerConfig:
    return kafka_config.replace(kafka_sasl_mechanisms=MECHS, kafka_sasl_plain_over_plaintext=True,
                                users_file=users_file(tmp_path / "users.json",
                                                      alice="alice-secret"))


@pytest.fixture
async def sasl_broker(sasl_config: BrokerConfig):
    from txbroker.broker import Broker

    b = Broker(sasl_config)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


class Wire:
    """One raw Kafka connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.corr = 0

    @classmethod
    async def open(cls, port: int) -> Wire:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def frame(self) -> bytes:
        size = int.from_bytes(await asyncio.wait_for(self.reader.readexactly(4), WAIT), "big")
        return await asyncio.wait_for(self.reader.readexactly(size), WAIT)

    async def call(self, key: int, version: int, body: dict) -> dict:
        self.corr += 1
        self.writer.write(encode_request(key, version, self.corr, "sasl-test", body))
        got_corr, answer = decode_response(key, version, await self.frame())
        assert got_corr == self.corr
        return answer

    async def closed(self) -> bool:
        try:
            return await asyncio.wait_for(self.reader.read(), WAIT) == b""
        except ConnectionResetError:
            return True

    async def scram(self, mech: str, user: str, password: str, version: int = 2) -> dict:
        assert (await self.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mech}))["error_code"] == 0
        bare = f"n={user},r=wirenonce"
        first = await self.call(ApiKey.SASL_AUTHENTICATE, version,
                                {"auth_bytes": f"n,,{bare}".encode()})
        assert first["error_code"] == ErrorCode.NONE, first
        final, _ = scram_client(mech, user, password, first["auth_bytes"], bare)
        return await self.call(ApiKey.SASL_AUTHENTICATE, version, {"auth_bytes": final})

    def close(self) -> None:
        self.writer.close()


async def test_api_versions_is_served_before_authentication_and_lists_sasl(sasl_broker) -> None:
    wire = await Wire.open(sasl_broker.kafka_port)
    try:
        answer = await wire.call(ApiKey.API_VERSIONS, 2, {})
        got = {k["api_key"]: (k["min_version"], k["max_version"]) for k in answer["api_keys"]}
        assert got[ApiKey.SASL_HANDSHAKE] == (0, 1) and got[ApiKey.SASL_AUTHENTICATE] == (0, 2)
        answer = await wire.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"})
        assert answer == {"error_code": 0, "mechanisms": MECHS.split(",")}
    finally:
        wire.close()


@pytest.mark.parametrize("key, version, body", [
    (ApiKey.METADATA, 1, {"topics": None}),
    (ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": b"n,,n=alice,r=x"}),  # before the handshake
])
async def test_a_request_before_authentication_closes_the_connection(sasl_broker, key, version,
                                                                      body) -> None:
    wire = await Wire.open(sasl_broker.kafka_port)
    try:
        wire.writer.write(encode_request(key, version, 1, "sasl-test", body))
        assert await wire.closed()
    finally:
        wire.close()


async def test_metadata_between_handshake_and_authenticate_closes(sasl_broker) -> None:
    wire = await Wire.open(sasl_broker.kafka_port)
    try:
        await wire.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-256"})
        wire.writer.write(encode_request(ApiKey.METADATA, 1, 9, "sasl-test", {"topics": None}))
        assert await wire.closed()
    finally:
        wire.close()


async def test_wrong_mechanism_is_answered_then_closed(sasl_broker) -> None:
    wire = await Wire.open(sasl_broker.kafka_port)
    try:
        answer = await wire.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "GSSAPI"})
        assert answer == {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                          "mechanisms": MECHS.split(",")}
        assert await wire.closed()
    finally:
        wire.close()


@pytest.mark.parametrize("mech, version", [("SCRAM-SHA-256", 0), ("SCRAM-SHA-512", 1),
                                           ("SCRAM-SHA-512", 2)])
async def test_scram_authenticates_then_every_api_is_served(sasl_broker, mech, version) -> None:
    wire = await Wire.open(sasl_broker.kafka_port)
    try:
        answer = await wire.scram(mech, "alice", "alice-secret", version)
        assert answer["error_code"] == ErrorCode.NONE and answer["auth_bytes"].startswith(b"v=")
        if version >= 1:
            assert answer["session_lifetime_ms"] == 0  # no re-authentication required
        meta = await wire.call(ApiKey.METADATA, 1, {"topics": None})
        assert meta["brokers"][0]["port"] == sasl_broker.kafka_port
        # once authenticated, as Kafka: ILLEGAL_SASL_STATE, the connection stays
        again = await wire.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mech})
        assert again["error_code"] == ErrorCode.ILLEGAL_SASL_STATE
        auth = await wire.call(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": b""})
        assert auth["error_code"] == ErrorCode.ILLEGAL_SASL_STATE
        assert (await wire.call(ApiKey.API_VERSIONS, 0, {}))["error_code"] == 0
    finally:
        wire.close()


async def test_the_user_store_is_read_again_a_user_added_or_deleted_counts(
        sasl_broker, sasl_config: BrokerConfig) -> None:
    """Kafka's users are the user store's: ``txbroker user add`` or ``delete`` on the running
    broker's file takes effect with no restart (the store looks again at most once a second)."""
    from txbroker.service.users import edit_users

    async def logs_in(user: str, password: str) -> bool:
        wire = await Wire.open(sasl_broker.kafka_port)
        try:
            return (await wire.scram("SCRAM-SHA-512", user, password))["error_code"] == 0
        finally:
            wire.close()

    assert not await logs_in("bob", "bob-secret")
    with edit_users(sasl_config.users_file) as box:
        box[0] = box[0].with_password("bob", "bob-secret").without("alice")
    deadline = asyncio.get_running_loop().time() + WAIT
    while not await logs_in("bob", "bob-secret"):
        assert asyncio.get_running_loop().time() < deadline, "bob never got in"
        await asyncio.sleep(0.3)
    assert not await logs_in("alice", "alice-secret")


async def test_wrong_password_is_refused_logged_once_and_slowed(sasl_broker, caplog) -> None:
    caplog.set_level(logging.WARNING, "txbroker.kafka")
    for _ in range(3):
        wire = await Wire.open(sasl_broker.kafka_port)
        try:
            answer = await wire.scram("SCRAM-SHA-256", "alice", "not-her-password")
            assert answer["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert "invalid credentials" in answer["error_message"]
            assert await wire.closed()
        finally:
            wire.close()
    lines = [r.getMessage() for r in caplog.records if "authentication failed" in r.getMessage()]
    assert len(lines) == 1, lines  # once per address per minute
    assert "127.0.0.1:" in lines[0] and "'alice'" in lines[0]
    assert "not-her-password" not in caplog.text and "alice-secret" not in caplog.text
    assert sasl_broker.kafka.throttle.delay("127.0.0.1") >= 0.4  # 0.1 s doubled per failure
    # the right password still gets in (after the back-off), and clears it
    wire = await Wire.open(sasl_broker.kafka_port)
    try:
        assert (await wire.scram("SCRAM-SHA-256", "alice", "alice-secret"))["error_code"] == 0
    finally:
        wire.close()
    assert sasl_broker.kafka.throttle.delay("127.0.0.1") == 0.0


async def test_handshake_v0_raw_plain_token(sasl_broker) -> None:
    wire = await Wire.open(sasl_broker.kafka_port)
    try:
        assert (await wire.call(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"}))["error_code"] == 0
        token = b"\0alice\0alice-secret"
        wire.writer.write(len(token).to_bytes(4, "big") + token)
        assert await wire.frame() == b""  # PLAIN's empty reply, size-prefixed
        assert (await wire.call(ApiKey.METADATA, 1, {"topics": None}))["brokers"]
    finally:
        wire.close()
    wire = await Wire.open(sasl_broker.kafka_port)
    try:
        await wire.call(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"})
        token = b"\0alice\0wrong"
        wire.writer.write(len(token).to_bytes(4, "big") + token)
        assert await wire.closed()
    finally:
        wire.close()


async def test_large_frame_before_authentication_closes(sasl_broker, caplog) -> None:
    caplog.set_level(logging.WARNING, "txbroker.kafka")
    wire = await Wire.open(sasl_broker.kafka_port)
    try:
        size = sasl_broker.config.kafka_sasl_max_receive_size + 1
        assert size < sasl_broker.config.max_frame_size
        wire.writer.write(size.to_bytes(4, "big") + b"\0" * 64)
        assert await wire.closed()
    finally:
        wire.close()
    assert "larger than kafka_sasl_max_receive_size (not authenticated yet)" in caplog.text
    assert "127.0.0.1:" in caplog.text
    # once authenticated, the frame bound is max_frame_size again
    wire = await Wire.open(sasl_broker.kafka_port)
    try:
        assert (await wire.scram("SCRAM-SHA-256", "alice", "alice-secret"))["error_code"] == 0
        names = [f"{i:02d}" + "t" * 30000 for i in range(20)]  # 600 KB in one request
        answer = await wire.call(ApiKey.METADATA, 1, {"topics": [{"name": n} for n in names]})
        assert len(answer["topics"]) == 20  # answered, not closed
        assert all(t["error_code"] != 0 for t in answer["topics"])  # names too long
    finally:
        wire.close()


async def test_without_sasl_the_sasl_apis_answer_illegal_state(kafka_broker) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        answer = await wire.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert answer["error_code"] == ErrorCode.ILLEGAL_SASL_STATE
        assert (await wire.call(ApiKey.METADATA, 1, {"topics": None}))["brokers"]
    finally:
        wire.close()
