"""Access control on the gRPC port: 5.x clients sign each call (``authorization: MQv2-HMAC-SHA1
...`` over ``x-mq-date-time``), and the broker checks it against the keys of ``acl_file`` and
of the user store, with the broker port's roles and per-topic rules and its back-off.

The unmodified Python and Node.js 5.x clients send and receive with keys of the right role and
are refused with wrong ones; raw calls (tests/grpc/raw.py) carry what no client sends (garbled
headers) and read the exact status codes.  After every refusal the store is checked: nothing
was written, no topic created, nothing consumed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc
import pytest

from tests.grpc.conftest import grpc_endpoint, visible
from tests.grpc.raw import client_metadata, message, send, signed_metadata, stub
from tests.support.cli_runner import cli_ok, run_cli
from txbroker.broker import Broker
from txbroker.client import Message as RemotingMessage
from txbroker.client import Producer
from txbroker.client.errors import SendError
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb

pytestmark = pytest.mark.slow

ACL = """\
accounts:
  - accessKey: operations
    secretKey: operations-secret
    admin: true
  - accessKey: limited-key
    secretKey: limited-secret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
    topicPerms:
      - GSecret=DENY
"""
ADMIN = ("operations", "operations-secret")
LIMITED = ("limited-key", "limited-secret")


@dataclass
class AclBroker:
    broker: Broker
    #: user name -> (access key, secret key), made by ``txbroker user access-key``
    keys: dict[str, tuple[str, str]]

    @property
    def endpoint(self) -> str:
        return grpc_endpoint(self.broker)


@pytest.fixture
async def acl(grpc_config, tmp_path):
    """A broker with ``acl_file`` and a user store: alice is a producer, bob a consumer."""
    users_file = str(tmp_path / "users.json")
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    keys = {}
    for name, role in (("alice", "producer"), ("bob", "consumer")):
        cli_ok(await run_cli("user", "add", name, "--password-stdin", "--role", role,
                             "--users-file", users_file, input=f"{name}-password\n".encode()))
        out = cli_ok(await run_cli("user", "access-key", name, "--users-file", users_file))
        keys[name] = (out.split("accessKey: ")[1].split()[0], out.split("secretKey: ")[1].split()[0])
    broker = Broker(grpc_config.replace(acl_file=str(acl_file), users_file=users_file))
    await broker.start()
    try:
        yield AclBroker(broker, keys)
    finally:
        await broker.stop()


async def remoting_send(broker: Broker, key: str, secret: str) -> str:
    """A send on the broker port signed with ``key``/``secret``: the refusal's text."""
    async with Producer("acl-remoting", broker.namesrv_addr, send_timeout=15.0, retries=0,
                        access_key=key, secret_key=secret) as producer:
        with pytest.raises(SendError) as err:
            await producer.send(RemotingMessage("GAclSlow", b"over remoting"))
    return str(err.value)


def creds(key: tuple[str, str]) -> tuple[str, str]:
    """The Python drivers' options for a key (``=``: a secret may start with ``-``)."""
    return (f"--ak={key[0]}", f"--sk={key[1]}")


def receive_request(topic: str, group: str) -> spb.ReceiveMessageRequest:
    return spb.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=4,
        invisible_duration={"seconds": 30}, long_polling_timeout={"seconds": 1})


async def forget(s, key: str, secret: str) -> None:
    """A valid call: it passes, and its address's back-off is forgotten (the next refusal is
    answered at once)."""
    ok = await s.Heartbeat(spb.HeartbeatRequest(client_type=pb.PRODUCER),
                           metadata=signed_metadata(key, secret), timeout=10)
    assert ok.status.code == pb.OK, ok.status


async def unsigned_is_refused(acl: AclBroker) -> None:
    async with stub(acl.endpoint) as (s, _):
        answer = await s.Heartbeat(spb.HeartbeatRequest(client_type=pb.PRODUCER),
                                   metadata=client_metadata(), timeout=10)
    assert answer.status.code == pb.UNAUTHORIZED, answer.status


# --- the official clients -----------------------------------------------------------------------


async def test_signed_clients_send_and_receive_with_their_roles(acl, py5, py5_consumer) -> None:
    """alice (producer role) sends with the Python client, bob (consumer role) receives and
    acks with its SimpleConsumer: every call of both, Telemetry included, is signed."""
    alice, bob = acl.keys["alice"], acl.keys["bob"]
    events = await py5("send", acl.endpoint, "GAclOrders", 3, *creds(alice))
    assert len([e for e in events if "sent" in e]) == 3
    assert sorted(m.body for m in visible(acl.broker, "GAclOrders")) == [b"m-0", b"m-1", b"m-2"]
    events = await py5_consumer("receive", acl.endpoint, "GAclOrders", "GID_Acl", 3,
                                *creds(bob))
    assert sorted(e["got"] for e in events if "got" in e) == ["m-0", "m-1", "m-2"]
    assert acl.broker.acl.refused == 0
    await unsigned_is_refused(acl)  # so every call above was verified


async def test_node_client_signs_in_upper_case_hex(acl, node5) -> None:
    events = await node5("send", acl.endpoint, "GAclNode", 2, "--ak", ADMIN[0], "--sk", ADMIN[1])
    assert len([e for e in events if "sent" in e]) == 2
    assert sorted(m.body for m in visible(acl.broker, "GAclNode")) == [b"m-0", b"m-1"]
    assert acl.broker.acl.refused == 0
    await unsigned_is_refused(acl)


async def test_consumer_role_cannot_send_with_the_python_client(acl, py5) -> None:
    bob = acl.keys["bob"]
    events = await py5("send", acl.endpoint, "GAclNoPub", 1, *creds(bob),
                       "--refusal-ok")
    [refused] = [e["refused"] for e in events if "refused" in e]
    assert "No permission for topic=GAclNoPub" in refused and "needs PUB" in refused
    assert not [e for e in events if "sent" in e]
    assert visible(acl.broker, "GAclNoPub") == []


@pytest.mark.parametrize("who", ["wrong secret", "unknown key"])
async def test_bad_credentials_refuse_the_python_client(acl, py5, caplog, who) -> None:
    key, secret = ((acl.keys["alice"][0], "not-the-secret") if who == "wrong secret"
                   else ("nobody-key", "nobody-secret"))
    events = await py5("send", acl.endpoint, "GAclBadKey", 1, *creds((key, secret)),
                       "--refusal-ok")
    # The client reports a refused route as "failed to fetch topic ... route"; the broker's
    # log says why.
    assert [e for e in events if "refused" in e] and not [e for e in events if "sent" in e]
    why = "Check signature failed" if who == "wrong secret" else "No acl config for 'nobody-key'"
    assert f"access key {key!r}, gRPC QueryRoute: AclException: {why}" in caplog.text
    assert secret not in caplog.text
    assert acl.broker.topics.get("GAclBadKey") is None  # the route did not even create it


# --- raw calls: codes, garbled headers, per-topic rules, back-off --------------------------------


def _garbled(key: str, secret: str) -> dict[str, tuple[tuple[str, str], ...]]:
    good = dict(signed_metadata(key, secret))
    auth, date = good["authorization"], good["x-mq-date-time"]
    base = client_metadata()

    def with_(authorization: str | None, date_time: str | None = date):
        extra = []
        if date_time is not None:
            extra.append(("x-mq-date-time", date_time))
        if authorization is not None:
            extra.append(("authorization", authorization))
        return base + tuple(extra)

    signature = auth.rsplit("Signature=", 1)[1]
    return {
        "no authorization header": with_(None),
        "empty Credential (an unconfigured Python client)":
            with_(auth.replace(f"Credential={key}", "Credential=")),
        "another scheme": with_(auth.replace("MQv2-HMAC-SHA1", "MQv1-HMAC-SHA256")),
        "no scheme": with_(auth.split(" ", 1)[1]),
        "signature not hex": with_(auth.replace(signature, "zz" * 20)),
        "signature too short": with_(auth.replace(signature, signature[:20])),
        "no Signature": with_(auth.split(", Signature=")[0]),
        "item without =": with_(auth + ", garbage"),
        "other signed headers": with_(auth.replace("SignedHeaders=x-mq-date-time",
                                                   "SignedHeaders=x-mq-client-id")),
        "no date header": with_(auth, None),
        "date not a date": with_(auth, "yesterday"),
        "header too long": with_(auth + ", Pad=" + "x" * 2000),
    }


async def test_unsigned_and_garbled_calls_are_unauthorized_and_store_nothing(acl) -> None:
    key, secret = acl.keys["alice"]
    async with stub(acl.endpoint) as (s, _):
        for case, meta in _garbled(key, secret).items():
            answer = await send(s, message("GAclRaw", b"garbled"), metadata=meta)
            assert answer.status.code == pb.UNAUTHORIZED, (case, answer.status)
            assert answer.status.message, case
            await forget(s, key, secret)
        unsigned = await s.Heartbeat(spb.HeartbeatRequest(), metadata=client_metadata(),
                                     timeout=10)
        assert unsigned.status.code == pb.UNAUTHORIZED
        assert "No accessKey is configured" in unsigned.status.message
    assert acl.broker.topics.get("GAclRaw") is None
    assert visible(acl.broker, "GAclRaw") == []


async def test_wrong_secret_and_unknown_key_are_unauthorized(acl) -> None:
    key, _ = acl.keys["alice"]
    async with stub(acl.endpoint) as (s, _):
        wrong = await send(s, message("GAclCreds"),
                           metadata=signed_metadata(key, "not-the-secret"))
        assert wrong.status.code == pb.UNAUTHORIZED
        assert wrong.status.message == f"Check signature failed for accessKey={key}"
        await forget(s, *acl.keys["alice"])
        unknown = await send(s, message("GAclCreds"),
                             metadata=signed_metadata("nobody-key", "nobody-secret"))
        assert unknown.status.code == pb.UNAUTHORIZED
        assert unknown.status.message == "No acl config for 'nobody-key'"
    assert acl.broker.topics.get("GAclCreds") is None


async def test_roles_and_per_topic_rules_are_the_broker_ports(acl) -> None:
    alice, bob = acl.keys["alice"], acl.keys["bob"]
    async with stub(acl.endpoint) as (s, _):
        # A key denied one topic: that topic refused, another one served (upper-case hex).
        denied = await send(s, message("GSecret"), metadata=signed_metadata(*LIMITED))
        assert denied.status.code == pb.FORBIDDEN
        assert denied.status.message == ("No permission for topic=GSecret: accessKey=limited-key "
                                         "needs PUB, has DENY")
        route = await s.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="GSecret")),
                                   metadata=signed_metadata(*LIMITED), timeout=10)
        assert route.status.code == pb.FORBIDDEN and not route.message_queues
        assert "needs PUB or SUB, has DENY" in route.status.message
        served = await send(s, message("GOpen", b"open"),
                            metadata=signed_metadata(*LIMITED, upper=True))
        assert served.status.code == pb.OK, served.status
        # The consumer role may not send nor end a transaction.
        no_pub = await send(s, message("GOpen", b"from bob"), metadata=signed_metadata(*bob))
        assert no_pub.status.code == pb.FORBIDDEN
        assert "needs PUB, has SUB" in no_pub.status.message
        end = await s.EndTransaction(
            spb.EndTransactionRequest(topic=pb.Resource(name="GOpen"), message_id="x",
                                      transaction_id="x", resolution=pb.COMMIT),
            metadata=signed_metadata(*bob), timeout=10)
        assert end.status.code == pb.FORBIDDEN
        # The producer role may not consume (a server stream: the refusal is its one frame).
        frames = [f async for f in s.ReceiveMessage(receive_request("GOpen", "GID_Alice"),
                                                    metadata=signed_metadata(*alice), timeout=10)]
        assert [f.status.code for f in frames] == [pb.FORBIDDEN]
        assert "topic=GOpen" in frames[0].status.message
        assert "needs SUB, has PUB" in frames[0].status.message
        ack = await s.AckMessage(
            spb.AckMessageRequest(group=pb.Resource(name="GID_Alice"),
                                  topic=pb.Resource(name="GOpen"),
                                  entries=[spb.AckMessageEntry(receipt_handle="x")]),
            metadata=signed_metadata(*alice), timeout=10)
        assert ack.status.code == pb.FORBIDDEN
        # bob consumes what was stored, and only that.
        frames = [f async for f in s.ReceiveMessage(receive_request("GOpen", "GID_Bob"),
                                                    metadata=signed_metadata(*bob), timeout=10)]
        assert [f.message.body for f in frames if f.HasField("message")] == [b"open"]
    assert [m.body for m in visible(acl.broker, "GOpen")] == [b"open"]
    assert acl.broker.topics.get("GSecret") is None
    assert acl.broker.pop.state.inflight("GID_Alice") == 0


async def test_telemetry_streams_are_checked(acl) -> None:
    alice, bob = acl.keys["alice"], acl.keys["bob"]
    publishing = spb.TelemetryCommand(settings=pb.Settings(
        client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="GTel")])))
    async with stub(acl.endpoint) as (s, _):
        # Badly signed: refused when the stream opens, before any settings are read.
        call = s.Telemetry(metadata=signed_metadata(alice[0], "not-the-secret", "tel-bad"))
        first = await asyncio.wait_for(call.read(), 10)
        assert first.status.code == pb.UNAUTHORIZED
        assert await asyncio.wait_for(call.read(), 10) is grpc.aio.EOF
        await forget(s, *alice)
        # Signed by a consumer, publishing: its settings are refused and the stream ends.
        call = s.Telemetry(metadata=signed_metadata(*bob, "tel-bob"))
        await call.write(publishing)
        first = await asyncio.wait_for(call.read(), 10)
        assert first.status.code == pb.FORBIDDEN and "topic=GTel" in first.status.message
        assert await asyncio.wait_for(call.read(), 10) is grpc.aio.EOF
        session = acl.broker.grpc.servicer.sessions.get("tel-bob")
        assert session is None or session.published_topics() == []
        # Signed by the producer: answered with settings.
        call = s.Telemetry(metadata=signed_metadata(*alice, "tel-alice"))
        await call.write(publishing)
        first = await asyncio.wait_for(call.read(), 10)
        assert first.status.code == pb.OK and first.settings.publishing.max_body_size > 0
        call.cancel()


async def test_failed_credentials_back_off_and_a_success_forgets(acl) -> None:
    """Each wrong signature from one address is answered later than the one before (0.1 s
    doubling), as on the broker port; a valid call is answered at once and resets it."""
    key, secret = acl.keys["alice"]
    took = []
    async with stub(acl.endpoint) as (s, _):
        for _ in range(5):
            start = time.monotonic()
            answer = await send(s, message("GAclSlow"), metadata=signed_metadata(key, "wrong-one"))
            took.append(time.monotonic() - start)
            assert answer.status.code == pb.UNAUTHORIZED
        assert took[0] < 0.5 and took[4] >= 0.75, took   # 0, 0.1, 0.2, 0.4, 0.8 s
        assert took[4] > took[2]
        # One back-off for both RocketMQ ports: the broker port answers a bad signature from
        # the address 1.6 s later now (its heartbeat, then its send, each later still).
        start = time.monotonic()
        remark = await remoting_send(acl.broker, key, "wrong-one")
        assert "Check signature failed" in remark and time.monotonic() - start >= 1.2
        start = time.monotonic()
        ok = await send(s, message("GAclSlow", b"right"), metadata=signed_metadata(key, secret))
        assert ok.status.code == pb.OK and time.monotonic() - start < 0.75
        start = time.monotonic()
        again = await send(s, message("GAclSlow"), metadata=signed_metadata(key, "wrong-one"))
        assert again.status.code == pb.UNAUTHORIZED and time.monotonic() - start < 0.5
    assert [m.body for m in visible(acl.broker, "GAclSlow")] == [b"right"]
