"""Half messages from the C++ client, resolved by a txbroker SDK TransactionProducer.

The C++ wheel exports only a plain producer: it can send a message with ``TRAN_MSG=true`` and
``PGROUP=G`` (a half message) but never sends END_TRANSACTION and ignores check-backs.  The
broker's check-back must therefore reach a producer of group G that can answer: here a
:class:`txbroker.client.TransactionProducer`.
"""

from __future__ import annotations

import pytest
from compat_cpp import CppRun, run_cpp
from support.waiting import eventually

from txbroker.client import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
)
from txbroker.store.record import HALF_TOPIC

pytestmark = pytest.mark.needs_cpp

TOPIC = "CompatTx"
GROUP = "PID_COMPAT_TX"


class DecideByBody(TransactionListener):
    """Answers check-backs from the message body, and records what it was asked."""

    def __init__(self) -> None:
        self.checked: list = []

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    async def check_local_transaction(self, msg):
        self.checked.append(msg)
        if msg.body.startswith(b"commit"):
            return LocalTransactionState.COMMIT_MESSAGE
        return LocalTransactionState.ROLLBACK_MESSAGE


def visible(broker) -> list:
    out = []
    for qid in broker.store.queues().get(TOPIC, []):
        out.extend(broker.store.get(TOPIC, qid, 0, 100).messages())
    return out


def tx_spec(broker, body: str, **kw) -> dict:
    return {"scenario": "send_tx_props", "namesrv": broker.namesrv_addr, "topic": TOPIC,
            "group": GROUP, "tags": "TagT", "keys": "TXK", "body": body,
            "props": {"TRAN_MSG": "true", "PGROUP": GROUP, "color": "green"}, **kw}


async def test_cpp_half_messages_commit_and_roll_back_via_sdk_check(broker, tmp_path):
    runs = [await run_cpp(tmp_path / name, **tx_spec(broker, name))
            for name in ("commit", "rollback")]
    for run in runs:
        run.assert_clean()
        assert run.of("sent")[0]["status"] == 0
    # Stored as half messages: nothing visible, both pending in the half topic.
    assert visible(broker) == []
    assert broker.tx.pending_count() == 2
    halves = broker.store.get(HALF_TOPIC, 0, 0, 10).messages()
    assert sorted(h.properties["REAL_TOPIC"] for h in halves) == [TOPIC, TOPIC]
    # The SEND response's queue offset is the half-queue offset (what END_TRANSACTION names).
    assert sorted(r.of("sent")[0]["offset"] for r in runs) == sorted(h.queue_offset for h in halves)

    # A C++ consumer sees nothing of a pending half.
    pull = {"scenario": "pull_consume", "namesrv": broker.namesrv_addr, "topic": TOPIC,
            "group": "CID_COMPAT_TX"}
    before = await run_cpp(tmp_path / "pull1", **pull)
    before.assert_clean()
    assert before.of("msg") == []

    listener = DecideByBody()
    async with TransactionProducer(GROUP, namesrv=broker.namesrv_addr, listener=listener):
        await eventually(lambda: broker.tx.pending_count() == 0, 15.0, lambda: f"halves still pending; checked: {listener.checked}")
    after = await run_cpp(tmp_path / "pull2", record_props=["color"], **pull)
    after.assert_clean()
    assert [(m["body"], m["tags"], m["props"]["color"]) for m in after.of("msg")] == [
        ("commit", "TagT", "green")]  # committed reaches the C++ client; rolled back never
    [msg] = visible(broker)
    assert msg.body == b"commit"
    assert msg.tags == "TagT" and msg.keys == "TXK" and msg.properties["color"] == "green"
    assert "TRAN_MSG" not in msg.properties
    # The check-back carried the C++ client's message and id to the SDK producer.
    uniq = {r.of("sent")[0]["msg_id"] for r in runs}
    assert {m.body for m in listener.checked} >= {b"commit", b"rollback"}
    assert {m.msg_id for m in listener.checked} >= uniq
    assert msg.properties["UNIQ_KEY"] in uniq


async def test_check_reaches_sdk_producer_while_cpp_producer_of_group_is_connected(broker, tmp_path):
    # The C++ producer stays connected (it heartbeats as group G, late) but ignores checks;
    # the half must still be resolved by the SDK producer of the same group.  The test broker
    # checks every 0.2 s and gives up after 15 checks, i.e. about 3 s: the C++ producer stays
    # up for 6 s, so the SDK producer is only reached if checks are not pinned to the sender.
    cpp = await CppRun(tx_spec(broker, "commit late", linger=6.0), tmp_path / "c").start()
    try:
        await eventually(lambda: broker.tx.pending_count() == 1, 15.0, "the half pending")
        listener = DecideByBody()
        async with TransactionProducer(GROUP, namesrv=broker.namesrv_addr, listener=listener):
            await eventually(lambda: broker.tx.pending_count() == 0, 20.0, lambda: (
                f"check never answered while the C++ producer was connected; "
                f"listener saw {len(listener.checked)} checks"))
    finally:
        await cpp.finish(20)
    cpp.assert_clean()
    assert [m.body for m in listener.checked][:1] == [b"commit late"]
    assert [m.body for m in visible(broker)] == [b"commit late"]
