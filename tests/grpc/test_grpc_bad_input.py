"""Bad input to the gRPC endpoint: every refusal is the protocol's status code with a one-line
reason, nothing is stored from a refused request, and hostile or abandoned calls (malformed
protobuf, unknown fields, oversized batches and frames, streams dropped mid-way) leave the
broker serving."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.grpc.conftest import grpc_endpoint
from tests.grpc.raw import SERVICE, client_metadata, message, send, stub
from tests.support.waiting import eventually
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb


def stored(broker, topic: str) -> int:
    tc = broker.topics.get(topic)
    if tc is None:
        return 0
    return sum(broker.store.max_offset(topic, q) for q in range(tc.read_queue_nums))


@pytest.mark.parametrize(("msg", "code", "reason"), [
    (message("GBad", b""), pb.MESSAGE_BODY_EMPTY, "body is empty"),
    (message("GBad", b"x" * (300 * 1024)), pb.MESSAGE_BODY_TOO_LARGE, "exceeds the maximum"),
    (message("GBad", message_id=""), pb.ILLEGAL_MESSAGE_ID, "no message_id"),
    (message("GBad", message_group="g"), pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "not FIFO"),
    (message("GBad", message_type=pb.FIFO), pb.ILLEGAL_MESSAGE_GROUP, "needs a message_group"),
    (message("GBad", message_type=pb.DELAY), pb.ILLEGAL_DELIVERY_TIME, "needs a delivery_timestamp"),
    (message("GBad", message_type=pb.LITE), pb.UNSUPPORTED, "LITE"),
    (message("GBad", tag="a|b"), pb.ILLEGAL_MESSAGE_TAG, "holds '|'"),
    (message("GBad", keys=["a b"]), pb.ILLEGAL_MESSAGE_KEY, "holds a space"),
    (message("GBad", body_encoding=pb.GZIP), pb.BAD_REQUEST, "GZIP"),
])
async def test_a_malformed_message_is_refused_with_its_code(grpc_broker, msg, code, reason) -> None:
    async with stub(grpc_endpoint(grpc_broker)) as (s, _):
        reply = await send(s, msg)
    assert reply.entries[0].status.code == code, reply
    assert reason in reply.entries[0].status.message
    assert stored(grpc_broker, "GBad") == 0


async def test_requests_naming_what_is_not_theirs_are_refused(grpc_broker) -> None:
    async with stub(grpc_endpoint(grpc_broker)) as (s, _):
        reserved = message("GBad")
        reserved.user_properties["TRAN_MSG"] = "true"
        assert (await send(s, reserved)).entries[0].status.code == pb.ILLEGAL_MESSAGE_PROPERTY_KEY
        for topic in ("RMQ_SYS_TRANS_HALF_TOPIC", "%RETRY%g", "%DLQ%g"):
            assert (await send(s, message(topic))).status.code == pb.FORBIDDEN
        assert (await send(s, message("bad topic!"))).status.code == pb.ILLEGAL_TOPIC
        mixed = await send(s, message("GBadA"), message("GBadB"))
        assert mixed.status.code == pb.BAD_REQUEST and "different topics" in mixed.status.message
        assert (await send(s)).status.code == pb.BAD_REQUEST
        many = await send(s, *[message("GBad") for _ in range(1025)])
        assert many.status.code == pb.PAYLOAD_TOO_LARGE
        # No client id: refused, not attributed to anybody.
        anonymous = await s.SendMessage(spb.SendMessageRequest(messages=[message("GBad")]),
                                        timeout=10)
        assert anonymous.status.code == pb.CLIENT_ID_REQUIRED
    assert stored(grpc_broker, "GBad") == 0
    # Every answer is counted by RPC and status code.
    rendered = grpc_broker.metrics.render().decode()
    assert 'grpc_requests_total{code="FORBIDDEN",rpc="SendMessage"} 3.0' in rendered, rendered


async def test_end_transaction_names_a_half_of_its_topic_or_is_refused(grpc_broker) -> None:
    async with stub(grpc_endpoint(grpc_broker)) as (s, _):
        half = message("GTx", message_type=pb.TRANSACTION)
        sent = await send(s, half)
        assert sent.status.code == pb.OK, sent
        tid = sent.entries[0].transaction_id
        mid = half.system_properties.message_id

        async def end(**kw) -> spb.EndTransactionResponse:
            fields = {"topic": pb.Resource(name="GTx"), "message_id": mid, "transaction_id": tid,
                      "resolution": pb.COMMIT, "source": pb.SOURCE_CLIENT, **kw}
            return await s.EndTransaction(spb.EndTransactionRequest(**fields),
                                          metadata=client_metadata(), timeout=10)

        assert (await end(transaction_id="not-an-id")).status.code == pb.INVALID_TRANSACTION_ID
        assert (await end(transaction_id="7F00000100002A9F0000000000FFFFFF")).status.code \
            == pb.INVALID_TRANSACTION_ID
        assert (await end(topic=pb.Resource(name="Other"))).status.code == pb.INVALID_TRANSACTION_ID
        assert (await end(message_id="FFFF")).status.code == pb.INVALID_TRANSACTION_ID
        assert (await end(resolution=pb.TRANSACTION_RESOLUTION_UNSPECIFIED)).status.code \
            == pb.BAD_REQUEST
        assert grpc_broker.tx.pending_count() == 1 and stored(grpc_broker, "GTx") == 0
        # SOURCE_UNSPECIFIED (older clients) is the producer's own decision.
        assert (await end(source=pb.SOURCE_UNSPECIFIED)).status.code == pb.OK
        assert stored(grpc_broker, "GTx") == 1
        again = await end()  # the same decision again: nothing more delivered
        assert again.status.code == pb.OK and stored(grpc_broker, "GTx") == 1
        conflict = await end(resolution=pb.ROLLBACK)
        assert conflict.status.code != pb.OK and stored(grpc_broker, "GTx") == 1
        assert grpc_broker.tx.show(tid)["source"] == "producer"


async def test_hostile_and_abandoned_calls_leave_the_broker_serving(grpc_broker) -> None:
    endpoint = grpc_endpoint(grpc_broker)
    async with stub(endpoint) as (s, channel):
        # Bytes that are not the request's protobuf: the call fails, nothing else does.
        raw = channel.unary_unary(SERVICE + "SendMessage")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await raw(b"\xff\xff\xff\xff\x0f garbage", metadata=client_metadata(), timeout=10)
        assert err.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
        # Unknown fields are skipped, as protobuf does: the message is stored.
        known = spb.SendMessageRequest(messages=[message("GFuzz")]).SerializeToString()
        unknown = known + b"\xa2\x06\x03abc"  # field 100, length-delimited
        reply = spb.SendMessageResponse.FromString(
            await raw(unknown, metadata=client_metadata(), timeout=10))
        assert reply.status.code == pb.OK
        # A frame over the receive limit is refused by gRPC itself.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await send(s, message("GFuzz", b"x" * (20 * 1024 * 1024)))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Telemetry streams opened, fed settings and dropped mid-way.
        for _ in range(20):
            call = s.Telemetry(metadata=client_metadata("dropper"))
            await call.write(spb.TelemetryCommand(settings=pb.Settings(
                client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="GFuzz")]))))
            first = await asyncio.wait_for(call.read(), 10)
            assert first.status.code == pb.OK and first.settings.publishing.max_body_size > 0
            call.cancel()
        # A stream whose TCP connection is cut without a goodbye.
        sock = socket.create_connection((grpc_broker.host, grpc_broker.grpc_port))
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 9)
        sock.close()
    await eventually(lambda: not grpc_broker.registry.producer_connections("GFuzz"), timeout=10)
    async with stub(endpoint) as (s, _):
        assert (await send(s, message("GFuzz"))).status.code == pb.OK
    assert stored(grpc_broker, "GFuzz") == 2


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(["QueryRoute", "Heartbeat", "SendMessage", "EndTransaction",
                               "NotifyClientTermination", "ReceiveMessage", "AckMessage",
                               "ChangeInvisibleDuration", "RecallMessage", "QueryAssignment",
                               "ForwardMessageToDeadLetterQueue", "PullMessage"]),
       payload=st.binary(max_size=512))
def test_random_bytes_to_every_rpc_never_take_the_endpoint_down(fuzz_endpoint, method, payload):
    """Any bytes as any request: an answer or a failed call, and the endpoint still answers."""
    async def call() -> None:
        async with grpc.aio.insecure_channel(fuzz_endpoint) as channel:
            streaming = method in ("ReceiveMessage", "PullMessage")
            rpc = (channel.unary_stream if streaming else channel.unary_unary)(SERVICE + method)
            try:
                if streaming:
                    async for _ in rpc(payload, metadata=client_metadata("fuzz"), timeout=5):
                        pass
                else:
                    await rpc(payload, metadata=client_metadata("fuzz"), timeout=5)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() != grpc.StatusCode.UNAVAILABLE, exc
            route = channel.unary_unary(SERVICE + "Heartbeat")
            reply = spb.HeartbeatResponse.FromString(await route(
                spb.HeartbeatRequest().SerializeToString(), metadata=client_metadata("fuzz"),
                timeout=5))
            assert reply.status.code == pb.OK

    asyncio.run_coroutine_threadsafe(call(), fuzz_endpoint.loop).result(30)


async def test_a_telemetry_stream_nobody_reads_is_ended_not_grown() -> None:
    """Commands queue for a stream while its client reads them; one that writes (settings,
    each answered) and never reads is ended past twice the outbox limit, so it cannot make the
    broker hold commands without bound."""
    from txbroker.service.clients import ClientRegistry
    from txbroker.service.grpc.sessions import OUTBOX_LIMIT, Sessions

    sessions = Sessions(ClientRegistry())
    channel = sessions.open_channel("reader-gone", "ipv4:127.0.0.1:1", to_pb=None)
    command = spb.TelemetryCommand(status=pb.Status(code=pb.OK))
    for _ in range(2 * OUTBOX_LIMIT):
        channel.send(command)
    assert not channel.writable and not channel.closed
    with pytest.raises(RuntimeError, match="not read"):
        channel.send(command)
    assert channel.closed
    sent = [c async for c in channel.outgoing()]  # what was queued still drains, then it ends
    assert len(sent) == 2 * OUTBOX_LIMIT
