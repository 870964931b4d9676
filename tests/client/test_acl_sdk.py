"""Access control over TCP: a real broker with a plain_acl.yml and the SDK with credentials."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from support.consuming import collect
from support.waiting import eventually

from txbroker.broker import Broker
from txbroker.client import Consumer, Message, Producer
from txbroker.client.admin import AdminClient
from txbroker.client.errors import BrokerError, SendError
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codec import FrameDecoder, encode
from txbroker.remoting.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.signing import SessionCredentials
from txbroker.service.acl_rules import AclConfigError

ACL = """\
accounts:
  - accessKey: writer-key
    secretKey: writer-secret
    defaultTopicPerm: DENY
    topicPerms: [Orders=PUB, Secret=DENY]
  - accessKey: reader-key
    secretKey: reader-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: DENY
    topicPerms: [Secret=DENY]
    groupPerms: [readers=SUB]
  - accessKey: admin-key
    secretKey: admin-secret
    admin: true
"""
WRITER = {"access_key": "writer-key", "secret_key": "writer-secret"}
READER = {"access_key": "reader-key", "secret_key": "reader-secret"}
ADMIN = {"access_key": "admin-key", "secret_key": "admin-secret"}


async def _broker(broker_config, tmp_path: Path, text: str = ACL, **changes: object) -> Broker:
    path = tmp_path / "plain_acl.yml"
    path.write_text(text)
    b = Broker(broker_config.replace(acl_file=str(path), **changes))
    await b.start()
    return b


@pytest.fixture
async def acl_broker(broker_config, tmp_path):
    b = await _broker(broker_config, tmp_path)
    try:
        yield b
    finally:
        await b.stop()


def _raw(b: Broker, creds: dict | None) -> RemotingClient:
    return RemotingClient(b.broker_addr, credentials=SessionCredentials(**creds) if creds else None)


async def _ask(b: Broker, creds: dict | None, code: int, ext: dict[str, str],
               body: bytes = b"") -> RemotingCommand:
    client = _raw(b, creds)
    try:
        return await client.invoke(RemotingCommand.request(code, ext, body), 3.0)
    finally:
        await client.close()


async def test_right_credentials_send_and_consume(acl_broker) -> None:
    async with Producer("writers", acl_broker.namesrv_addr, **WRITER) as producer:
        result = await producer.send(Message("Orders", b"order 1"))
    assert result.queue_offset == 0
    consumer = Consumer("readers", acl_broker.namesrv_addr, from_where="first",
                        rebalance_interval=0.2, **READER)
    consumer.subscribe("Orders")
    async with consumer:
        [msg] = await collect(consumer, 1)
    assert msg.body == b"order 1"
    assert acl_broker.acl.refused == 0


@pytest.mark.parametrize("creds, fragment", [
    ({"access_key": "writer-key", "secret_key": "not-the-secret"},
     "AclException: Check signature failed for accessKey=writer-key"),
    ({"access_key": "nobody-key", "secret_key": "whatever-secret"},
     "AclException: No acl config for 'nobody-key'"),
    (None, "AclException: No accessKey is configured"),
    (READER, "AclException: No permission for topic=Orders: accessKey=reader-key needs PUB, has SUB"),
    (WRITER, None),
])
async def test_send_refusals_name_the_key_resource_and_permission(acl_broker, creds, fragment) -> None:
    kw = creds or {}
    async with Producer("writers", acl_broker.namesrv_addr, retries=0, **kw) as producer:
        if fragment is None:
            await producer.send(Message("Orders", b"ok"))
            return
        with pytest.raises(SendError) as info:
            await producer.send(Message("Orders", b"refused"))
    assert info.value.code == ResponseCode.SYSTEM_ERROR
    assert fragment in info.value.remark
    assert acl_broker.acl.refused >= 1
    assert "Orders" not in acl_broker.store.queues()  # nothing stored


async def test_a_shared_name_server_port_refuses_wrong_credentials_at_start(
        broker_config, tmp_path) -> None:
    # With one port for both roles even the route lookup is guarded, as on a RocketMQ broker.
    b = await _broker(broker_config, tmp_path, namesrv_port=-1)
    try:
        with pytest.raises(BrokerError, match="Check signature failed for accessKey=writer-key"):
            async with Producer("writers", b.namesrv_addr, access_key="writer-key",
                                secret_key="not-the-secret"):
                pass
        async with Producer("writers", b.namesrv_addr, **WRITER) as producer:
            await producer.send(Message("Orders", b"signed"))
    finally:
        await b.stop()


async def test_denied_topic_and_pub_only_topic(acl_broker) -> None:
    async with Producer("writers", acl_broker.namesrv_addr, retries=0, **WRITER) as producer:
        with pytest.raises(SendError, match="topic=Secret: accessKey=writer-key needs PUB, has DENY"):
            await producer.send(Message("Secret", b"x"))
        await producer.send(Message("Orders", b"x"))
    pull = {"consumerGroup": "readers", "topic": "Orders", "queueId": "0", "queueOffset": "0",
            "maxMsgNums": "32", "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0",
            "subscription": "*", "subVersion": "0"}
    # PUB-only for the writer: it may not pull.
    resp = await _ask(acl_broker, WRITER, RequestCode.PULL_MESSAGE, pull)
    assert resp.code == ResponseCode.SYSTEM_ERROR
    assert "topic=Orders: accessKey=writer-key needs SUB, has PUB" in resp.remark
    # SUB for the reader, in its own group only.
    resp = await _ask(acl_broker, READER, RequestCode.PULL_MESSAGE, pull)
    assert resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), resp.remark
    resp = await _ask(acl_broker, READER, RequestCode.PULL_MESSAGE, {**pull, "consumerGroup": "others"})
    assert "group=others: accessKey=reader-key needs SUB, has DENY" in resp.remark
    resp = await _ask(acl_broker, READER, RequestCode.PULL_MESSAGE, {**pull, "topic": "Secret"})
    assert "topic=Secret" in resp.remark


async def test_group_permissions_for_heartbeat_and_offsets(acl_broker) -> None:
    def heartbeat(group: str) -> bytes:
        return orjson.dumps({"clientID": "127.0.0.1@acl", "consumerDataSet": [
            {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
             "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
             "subscriptionDataSet": [{"topic": "Orders", "subString": "*"}]}]})

    client = _raw(acl_broker, READER)
    try:
        for group in ("readers", "others"):
            cmd = RemotingCommand.request(RequestCode.HEART_BEAT, body=heartbeat(group))
            resp = await client.invoke(cmd, 3.0)
            assert (resp.code == ResponseCode.SUCCESS) == (group == "readers"), resp.remark
        assert "group=others: accessKey=reader-key needs SUB, has DENY" in resp.remark
        assert "readers" in acl_broker.registry.consumer_groups()
        assert "others" not in acl_broker.registry.consumer_groups()  # refused before the processor
    finally:
        await client.close()
    await acl_broker.topics.get_or_create("Orders")  # offsets are stored for existing topics only
    offset = {"consumerGroup": "readers", "topic": "Orders", "queueId": "0", "commitOffset": "0"}
    resp = await _ask(acl_broker, READER, RequestCode.UPDATE_CONSUMER_OFFSET, offset)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    resp = await _ask(acl_broker, READER, RequestCode.UPDATE_CONSUMER_OFFSET,
                      {**offset, "consumerGroup": "others"})
    assert "group=others" in resp.remark
    resp = await _ask(acl_broker, READER, RequestCode.QUERY_CONSUMER_OFFSET,
                      {"consumerGroup": "others", "topic": "Orders", "queueId": "0"})
    assert "group=others" in resp.remark
    resp = await _ask(acl_broker, READER, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                      {"consumerGroup": "others"})
    assert "group=others" in resp.remark


async def test_topic_creation_and_transaction_decisions_need_admin(acl_broker) -> None:
    async with AdminClient(acl_broker.namesrv_addr, **WRITER) as admin:
        with pytest.raises(BrokerError, match="Need admin permission for request code=17, "
                                              "but accessKey=writer-key is not"):
            await admin.create_topic("Created", 2)
        with pytest.raises(BrokerError, match="Need admin permission for request code=9003"):
            await admin.txn_decide("0" * 32, "commit", "ops")
        assert await admin.status()  # read-only admin requests need a signature only
    assert "Created" not in acl_broker.topics.names()
    async with AdminClient(acl_broker.namesrv_addr, **ADMIN) as admin:
        await admin.create_topic("Created", 2)
        assert "Created" in await admin.list_topics()


async def test_refused_oneway_request_is_dropped_unanswered(acl_broker) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", acl_broker.broker_port)
    try:
        oneway = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": "readers", "topic": "Orders", "queueId": "0", "commitOffset": "5"})
        oneway.opaque, oneway.flag = 1, FLAG_ONEWAY
        probe = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG)
        probe.opaque = 2
        writer.write(encode(oneway) + encode(probe))
        decoder, answers = FrameDecoder(), []
        while not answers:
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data
            answers.extend(decoder.feed(data))
        assert [a.opaque for a in answers] == [2]  # only the probe, refused too
        assert "No accessKey" in answers[0].remark
        # Both were refused; a second probe's answer is written after any answer to the
        # one-way request would have been, so everything up to it shows none came.
        await eventually(lambda: acl_broker.acl.refused == 2, 5, "both requests refused")
        probe.opaque = 3
        writer.write(encode(probe))
        while answers[-1].opaque != 3:
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data
            answers.extend(decoder.feed(data))
        assert [a.opaque for a in answers] == [2, 3]
    finally:
        writer.close()
    assert acl_broker.acl.refused == 3  # the one-way request and both probes
    assert acl_broker.store.offsets.get("readers", "Orders", 0) is None


async def test_white_listed_address_passes_unsigned(broker_config, tmp_path) -> None:
    b = await _broker(broker_config, tmp_path, "globalWhiteRemoteAddresses: ['127.0.0.*']\n")
    try:
        async with Producer("anyone", b.namesrv_addr) as producer:
            await producer.send(Message("Orders", b"from a white-listed address"))
        async with AdminClient(b.namesrv_addr) as admin:
            await admin.create_topic("Created", 1)
        assert b.acl.refused == 0
    finally:
        await b.stop()


async def test_acl_off_by_default_accepts_unsigned_and_signed(broker) -> None:
    assert broker.acl is None
    async with Producer("anyone", broker.namesrv_addr) as producer:
        await producer.send(Message("Orders", b"unsigned"))
    async with Producer("anyone", broker.namesrv_addr, access_key="not-checked",
                        secret_key="at-all") as producer:
        await producer.send(Message("Orders", b"signed"))


def test_credentials_must_come_in_pairs() -> None:
    with pytest.raises(ValueError, match="together"):
        Producer("g", access_key="only-the-key")
    with pytest.raises(ValueError, match="non-empty"):
        Consumer("g", access_key="", secret_key="s")


async def test_invalid_acl_file_stops_the_start(broker_config, tmp_path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text("accounts:\n  - {accessKey: long-enough, secretKey: long-enough, defaultTopicPerm: ALL}\n")
    b = Broker(broker_config.replace(acl_file=str(path)))
    with pytest.raises(AclConfigError, match="'ALL' is not a permission"):
        await b.start()
    missing = Broker(broker_config.replace(acl_file=str(tmp_path / "missing.yml")))
    with pytest.raises(AclConfigError, match="missing.yml"):
        await missing.start()


def test_serve_reports_an_invalid_acl_file_in_one_line(tmp_path) -> None:
    from txbroker.cli.main import main

    path = tmp_path / "plain_acl.yml"
    path.write_text("accounts: [{accessKey: tiny, secretKey: long-enough}]\n")
    result = CliRunner().invoke(main, ["serve", "--broker-port", "0", "--namesrv-port", "-1",
                                       "--data-dir", str(tmp_path / "d"), "--acl-file", str(path)])
    assert result.exit_code == 2, result.output
    assert "error: acl file" in result.output and "accessKey must be a string longer than 6" in result.output


async def test_cli_commands_sign_with_access_key_options_or_environment(acl_broker) -> None:
    from txbroker.cli.main import main

    async def cli(*args: str, env: dict[str, str] | None = None):
        return await asyncio.to_thread(CliRunner().invoke, main,
                                       [*args, "--namesrv", acl_broker.namesrv_addr], env=env)

    refused = await cli("topic", "create", "ByCli", "--access-key", "writer-key",
                        "--secret-key", "writer-secret")
    assert refused.exit_code == 1 and "Need admin permission" in refused.stderr, refused.output
    created = await cli("topic", "create", "ByCli",
                        env={"TXBROKER_ACCESS_KEY": "admin-key", "TXBROKER_SECRET_KEY": "admin-secret"})
    assert created.exit_code == 0, created.output
    sent = await cli("produce", "--topic", "Orders", "--body", "b", "--access-key", "writer-key",
                     "--secret-key", "writer-secret")
    assert sent.exit_code == 0, sent.output
    half = await cli("topic", "list", "--access-key", "writer-key")
    assert half.exit_code == 2 and "must be given together" in half.output


async def test_consume_without_the_sub_right_is_one_error_line(acl_broker) -> None:
    """The broker refuses the group's heartbeat and member list (no SUB right on the topic):
    ``txbroker consume`` fails at once with the broker's answer, instead of waiting out its
    idle time and reporting 0 messages as a success."""
    from support.cli_runner import cli_one_line_error, run_cli

    async with AdminClient(acl_broker.namesrv_addr, **ADMIN) as admin:
        await admin.create_topic("Secret", 1)
    result = await run_cli("consume", "--topic", "Secret", "--group", "readers", "--from-beginning",
                           "--max", "1", "--idle-timeout", "8", "--namesrv", acl_broker.namesrv_addr,
                           "--access-key", READER["access_key"], "--secret-key", READER["secret_key"])
    err = cli_one_line_error(result)
    assert err.startswith(f"error: heartbeat at {acl_broker.broker_addr}: SYSTEM_ERROR (1): "
                          "AclException: No permission for topic=Secret: accessKey=reader-key "
                          "needs SUB, has DENY"), err
    assert "consumed" not in result.output, result.output
