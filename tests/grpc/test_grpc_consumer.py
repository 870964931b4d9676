"""POP consumption over gRPC: the unmodified RocketMQ 5.x Python client's SimpleConsumer
(receive/ack, redelivery with a higher attempt, change of invisible duration, dead letters
after the max attempts) and PushConsumer, and the RPCs' answers read by a plain gRPC client
(status frames, per-entry ack results, codes, assignments)."""

from __future__ import annotations

import grpc
import pytest

from tests.grpc.conftest import grpc_endpoint
from tests.support.waiting import eventually
from txbroker.broker import Broker
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.remoting.grpc import service_pb2_grpc as rpc
from txbroker.store.record import Message

pytestmark = pytest.mark.slow


def got(events: list[dict], key: str = "got") -> list[dict]:
    return [e for e in events if key in e]


async def test_simple_consumer_receives_and_acks_each_message_once(grpc_broker, py5,
                                                                   py5_consumer) -> None:
    ep = grpc_endpoint(grpc_broker)
    await py5("send", ep, "G5Pop", 6)
    events = await py5_consumer("receive", ep, "G5Pop", "GID_G5", 6, "--quiet", 3)
    received = got(events)
    assert sorted(e["got"] for e in received) == [f"m-{i}" for i in range(6)]
    assert {e["attempt"] for e in received} == {1}
    assert got(events, "extra") == []           # acked: nothing comes again
    # The acks moved the group's consumer offset to the end of every queue.
    tc = grpc_broker.topics.get("G5Pop")
    assert sum(grpc_broker.store.offsets.get("GID_G5", "G5Pop", q) or 0
               for q in range(tc.read_queue_nums)) == 6


async def test_unacked_message_is_delivered_again_with_a_higher_attempt(grpc_broker, py5,
                                                                        py5_consumer) -> None:
    ep = grpc_endpoint(grpc_broker)
    await py5("send", ep, "G5Redo", 1)
    events = await py5_consumer("redeliver", ep, "G5Redo", "GID_G5R", 1, "--invisible", 2)
    [first], [again] = got(events), got(events, "again")
    assert first["got"] == again["again"] == "m-0" and first["id"] == again["id"]
    assert (first["attempt"], again["attempt"]) == (1, 2)
    assert first["handle"] != again["handle"]
    assert grpc_broker.pop.state.inflight("GID_G5R") == 0


async def test_change_invisible_duration_keeps_the_message_away(grpc_broker, py5,
                                                                py5_consumer) -> None:
    ep = grpc_endpoint(grpc_broker)
    await py5("send", ep, "G5Cid", 1)
    events = await py5_consumer("change", ep, "G5Cid", "GID_G5C", 1)
    [changed] = got(events, "changed")
    assert changed["new_handle"] is True
    assert got(events, "extra") == []          # 30 s now, not 2 s
    assert got(events, "acked")                 # under the new handle
    assert grpc_broker.pop.state.inflight("GID_G5C") == 0


async def test_message_goes_to_the_dead_letter_topic_after_max_attempts(
        grpc_config, py5, py5_consumer) -> None:
    b = Broker(grpc_config.replace(max_reconsume_times=1))   # 2 deliveries
    await b.start()
    try:
        ep = grpc_endpoint(b)
        await py5("send", ep, "G5Dead", 1)
        events = await py5_consumer("give-up", ep, "G5Dead", "GID_G5D", 2, "--invisible", 1,
                                    "--quiet", 3)
        assert [(e["got"], e["attempt"]) for e in got(events)] == [("m-0", 1), ("m-0", 2)]
        assert got(events, "extra") == []
        dlq = "%DLQ%GID_G5D"
        await eventually(lambda: b.store.max_offset(dlq, 0) == 1, msg="message in the DLQ")
        assert b.store.get(dlq, 0, 0, 1).messages()[0].body == b"m-0"
    finally:
        await b.stop()


async def test_push_consumer_consumes_with_several_threads(grpc_broker, py5,
                                                           py5_consumer) -> None:
    ep = grpc_endpoint(grpc_broker)
    await py5("send", ep, "G5Push", 20)
    events = await py5_consumer("push", ep, "G5Push", "GID_G5P", 20, "--threads", 4)
    assert {e["got"] for e in got(events)} == {f"m-{i}" for i in range(20)}
    [threads] = got(events, "threads")
    assert threads["threads"] >= 2
    await eventually(lambda: grpc_broker.pop.state.inflight("GID_G5P") == 0,
                     msg="every message acked")


# --- the RPCs read by a plain gRPC client (the broker's own stubs), before any settings ------
async def test_rpc_answers_before_settings(grpc_config) -> None:
    b = Broker(grpc_config.replace(pop_fifo_groups="GID_FIFO"))
    await b.start()
    try:
        await b.topics.get_or_create("G5Raw")
        assert (await b.store.put(Message("G5Raw", 1, b"raw"))).ok
        async with grpc.aio.insecure_channel(grpc_endpoint(b)) as channel:
            stub = rpc.MessagingServiceStub(channel)
            meta = (("x-mq-client-id", "raw-client"),)

            async def receive(group: str, **kw) -> list:
                req = spb.ReceiveMessageRequest(
                    group=pb.Resource(name=group),
                    message_queue=pb.MessageQueue(topic=pb.Resource(name="G5Raw"), id=0),
                    filter_expression=kw.pop("filter_expression",
                                             pb.FilterExpression(type=pb.TAG, expression="*")),
                    batch_size=kw.pop("batch_size", 4), **kw)
                return [r async for r in stub.ReceiveMessage(req, metadata=meta, timeout=10)]

            frames = await receive("GID_RAW", invisible_duration={"seconds": 30},
                                   long_polling_timeout={"seconds": 1})
            kinds = [f.WhichOneof("content") for f in frames]
            assert kinds == ["status", "message", "delivery_timestamp"]
            assert frames[0].status.code == pb.Code.OK
            msg = frames[1].message
            assert msg.body == b"raw" and msg.system_properties.delivery_attempt == 1
            assert msg.system_properties.queue_id == 1          # any queue was popped
            handle = msg.system_properties.receipt_handle
            # Nothing more within the long-polling time: MESSAGE_NOT_FOUND, then the time.
            frames = await receive("GID_RAW", invisible_duration={"seconds": 30},
                                   long_polling_timeout={"seconds": 1})
            assert [f.WhichOneof("content") for f in frames] == ["status", "delivery_timestamp"]
            assert frames[0].status.code == pb.Code.MESSAGE_NOT_FOUND
            # Out of range: the codes clients react to.
            frames = await receive("GID_RAW", invisible_duration={"nanos": 1000})
            assert frames[0].status.code == pb.Code.ILLEGAL_INVISIBLE_TIME
            frames = await receive("GID_RAW", invisible_duration={"seconds": 30}, batch_size=999)
            assert frames[0].status.code == pb.Code.BAD_REQUEST
            assert "batch size 999" in frames[0].status.message
            frames = await receive("GID_RAW", invisible_duration={"seconds": 30},
                                   filter_expression=pb.FilterExpression(type=pb.SQL,
                                                                         expression="a > 1"))
            assert frames[0].status.code == pb.Code.ILLEGAL_FILTER_EXPRESSION

            new = await stub.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
                group=pb.Resource(name="GID_RAW"), topic=pb.Resource(name="G5Raw"),
                receipt_handle=handle, invisible_duration={"seconds": 60}), metadata=meta)
            assert new.status.code == pb.Code.OK and new.receipt_handle != handle
            # Per-entry results: the old handle is stale, the new one acks; the overall
            # status says the entries differ.
            ack = await stub.AckMessage(spb.AckMessageRequest(
                group=pb.Resource(name="GID_RAW"), topic=pb.Resource(name="G5Raw"),
                entries=[spb.AckMessageEntry(message_id="a", receipt_handle=handle),
                         spb.AckMessageEntry(message_id="b", receipt_handle=new.receipt_handle)]),
                metadata=meta)
            assert [e.status.code for e in ack.entries] == [pb.Code.INVALID_RECEIPT_HANDLE,
                                                           pb.Code.OK]
            assert "stale" in ack.entries[0].status.message
            assert ack.status.code == pb.Code.MULTIPLE_RESULTS
            ack = await stub.AckMessage(spb.AckMessageRequest(
                group=pb.Resource(name="GID_RAW"), topic=pb.Resource(name="G5Raw"),
                entries=[spb.AckMessageEntry(message_id="c", receipt_handle="forged")]),
                metadata=meta)
            assert ack.status.code == pb.Code.INVALID_RECEIPT_HANDLE

            # Assignments: one "any queue" for a plain group, every queue for a FIFO one.
            async def assignment(group: str) -> list[int]:
                resp = await stub.QueryAssignment(spb.QueryAssignmentRequest(
                    topic=pb.Resource(name="G5Raw"), group=pb.Resource(name=group)),
                    metadata=meta)
                assert resp.status.code == pb.Code.OK
                return [a.message_queue.id for a in resp.assignments]

            assert await assignment("GID_RAW") == [-1]
            assert await assignment("GID_FIFO") == list(range(b.topics.get("G5Raw").read_queue_nums))
            # The message is gone for good: forwarded handles of acked messages are refused.
            fwd = await stub.ForwardMessageToDeadLetterQueue(
                spb.ForwardMessageToDeadLetterQueueRequest(
                    group=pb.Resource(name="GID_RAW"), topic=pb.Resource(name="G5Raw"),
                    receipt_handle=new.receipt_handle), metadata=meta)
            assert fwd.status.code == pb.Code.INVALID_RECEIPT_HANDLE
    finally:
        await b.stop()


async def test_forward_to_dead_letter_queue_moves_the_message_now(grpc_config) -> None:
    b = Broker(grpc_config)
    await b.start()
    try:
        await b.topics.get_or_create("G5Fwd")
        assert (await b.store.put(Message("G5Fwd", 0, b"bad"))).ok
        [p] = await b.pop.pop("GID_FWD", "G5Fwd", invisible_ms=60_000)
        async with grpc.aio.insecure_channel(grpc_endpoint(b)) as channel:
            stub = rpc.MessagingServiceStub(channel)
            fwd = await stub.ForwardMessageToDeadLetterQueue(
                spb.ForwardMessageToDeadLetterQueueRequest(
                    group=pb.Resource(name="GID_FWD"), topic=pb.Resource(name="G5Fwd"),
                    receipt_handle=p.handle, delivery_attempt=1, max_delivery_attempts=1),
                metadata=(("x-mq-client-id", "raw"),))
        assert fwd.status.code == pb.Code.OK
        assert b.store.get("%DLQ%GID_FWD", 0, 0, 1).messages()[0].body == b"bad"
        assert b.pop.state.inflight("GID_FWD") == 0
    finally:
        await b.stop()


async def test_fifo_group_receives_in_order_through_a_consumer_that_left(
        grpc_config, py5, py5_consumer) -> None:
    b = Broker(grpc_config.replace(pop_fifo_groups="GID_G5F"))
    await b.start()
    try:
        ep = grpc_endpoint(b)
        await py5("send", ep, "G5Fifo", 6, "--group", "order-7")
        # The first consumer takes the head of the message group and leaves without an ack:
        # the queue stays locked (nothing more, not even to it) until its 3 s end.
        first = await py5_consumer("receive", ep, "G5Fifo", "GID_G5F", 2, "--no-ack",
                                   "--invisible", 3, "--batch", 2, "--quiet", 1)
        taken = [e["got"] for e in got(first)]
        assert taken == ["m-0", "m-1"]
        assert got(first, "extra") == []
        # The next consumer gets them again first, in order, then the rest, in order.
        second = await py5_consumer("receive", ep, "G5Fifo", "GID_G5F", 6, "--quiet", 1)
        bodies = [e["got"] for e in got(second)]
        assert bodies == [f"m-{i}" for i in range(6)]
        assert [e["attempt"] for e in got(second)][:len(taken)] == [2] * len(taken)
    finally:
        await b.stop()
