"""Timer messages from the unmodified RocketMQ 5.x Python and Node.js clients (in
subprocesses) through the gRPC endpoint: a DELAY send is stored as a timer with a RocketMQ 5.3
recall handle, becomes visible in its topic at its time (to the millisecond, from the Node
client) and not before, and RecallMessage cancels one (a second recall of it fails with the
broker's reason); and a transactional timer sent as raw requests."""

from __future__ import annotations

import time

import pytest

from tests.grpc import raw
from tests.grpc.conftest import grpc_endpoint, visible
from tests.support.waiting import eventually
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.remoting.recall import decode_handle

pytestmark = pytest.mark.slow


async def test_delay_messages_wait_and_recall_cancels_one(grpc_broker, py5) -> None:
    due_s = int(time.time()) + 6  # this client sends whole seconds
    events = await py5("recall", grpc_endpoint(grpc_broker), "G5Timer", 3,
                       "--deliver-s", due_s)
    sent = [e for e in events if "sent" in e]
    assert len(sent) == 3
    for e in sent:
        handle = decode_handle(e["recall_handle"])
        assert (handle.topic, handle.deliver_ms, handle.msg_id) == ("G5Timer", due_s * 1000, e["sent"])
    recalls = {e["attempt"]: e for e in events if "attempt" in e}
    assert recalls[0].get("recalled") == sent[0]["sent"]
    assert "no pending timer message" in recalls[1].get("recall_failed", ""), recalls[1]
    assert visible(grpc_broker, "G5Timer") == []  # not before its time
    assert grpc_broker.timer.pending == 2
    await eventually(lambda: len(visible(grpc_broker, "G5Timer")) == 2, timeout=20,
                     msg="the two timers left became visible")
    stored = visible(grpc_broker, "G5Timer")
    assert sorted(m.uniq_key for m in stored) == sorted(e["sent"] for e in sent[1:])
    assert all(m.store_timestamp >= due_s * 1000 for m in stored)


async def test_transactional_timer_over_grpc(grpc_broker) -> None:
    """TRANSACTION + delivery_timestamp (raw requests: the official clients refuse to send
    it): the committed one becomes visible at its time, the rolled-back one never."""
    due_ms = int(time.time() * 1000) + 3000
    async with raw.stub(grpc_endpoint(grpc_broker)) as (stub, _):
        for body, resolution in ((b"committed", pb.COMMIT), (b"rolled-back", pb.ROLLBACK)):
            msg = raw.message("G5TxTimer", body, message_type=pb.TRANSACTION)
            msg.system_properties.delivery_timestamp.FromMilliseconds(due_ms)
            sent = await raw.send(stub, msg)
            [entry] = sent.entries
            assert sent.status.code == pb.OK and entry.transaction_id and not entry.recall_handle
            ended = await stub.EndTransaction(spb.EndTransactionRequest(
                topic=pb.Resource(name="G5TxTimer"), message_id=entry.message_id,
                transaction_id=entry.transaction_id, resolution=resolution,
                source=pb.SOURCE_CLIENT), metadata=raw.client_metadata(), timeout=10)
            assert ended.status.code == pb.OK, ended.status.message
            if body == b"committed":
                committed_id = entry.message_id
    assert grpc_broker.tx.pending_count() == 0
    assert visible(grpc_broker, "G5TxTimer") == []  # committed, waiting for its time
    await eventually(lambda: len(visible(grpc_broker, "G5TxTimer")) == 1, timeout=20,
                     msg="the committed one became visible")
    [m] = visible(grpc_broker, "G5TxTimer")
    assert m.body == b"committed" and m.uniq_key == committed_id
    assert m.store_timestamp >= due_ms


async def test_node_client_delay_messages_to_the_millisecond_and_recall(grpc_broker, node5) -> None:
    """The unmodified Node.js 5.x client sends its delivery time with milliseconds: the
    timers become visible at that millisecond, not before, and its RecallMessage cancels one
    (a second recall of it fails with the broker's reason)."""
    due_ms = int(time.time() * 1000) + 6000 + 123  # not a whole second
    events = await node5("send", grpc_endpoint(grpc_broker), "N5Timer", 3, "--deliver-ms", due_ms,
                         "--recall-first")
    sent = [e for e in events if "sent" in e]
    assert len(sent) == 3
    for e in sent:
        handle = decode_handle(e["recall_handle"])
        assert (handle.topic, handle.deliver_ms, handle.msg_id) == ("N5Timer", due_ms, e["sent"])
    recalls = {e["attempt"]: e for e in events if "attempt" in e}
    assert recalls[0].get("recalled") == sent[0]["sent"], recalls
    assert "no pending timer message" in recalls[1].get("recall_failed", ""), recalls[1]
    assert visible(grpc_broker, "N5Timer") == []
    await eventually(lambda: len(visible(grpc_broker, "N5Timer")) == 2, timeout=20,
                     msg="the two timers left became visible")
    stored = visible(grpc_broker, "N5Timer")
    assert sorted(m.uniq_key for m in stored) == sorted(e["sent"] for e in sent[1:])
    assert all(m.properties["TIMER_OUT_MS"] == str(due_ms) for m in stored)
    assert all(m.store_timestamp >= due_ms for m in stored)
