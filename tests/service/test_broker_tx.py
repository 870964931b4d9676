"""Transactions end to end through the broker's processors, over TCP.

Half send (TRAN_MSG=true) → one-way END_TRANSACTION → visible to a pull (commit) or never
(rollback); a half left unknown is checked back on the connection that sent it, even though
that producer never sent a heartbeat.
"""

from __future__ import annotations

import asyncio

from broker_wire import TIMEOUT, pull, request, send
from support.waiting import eventually

from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.store.record import decode_offset_msg_id, decode_record, encode_batch

COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0


async def _half(client, topic: str, body: bytes, uniq: str, *, queue_id: int = 0):
    resp = await send(client, topic, body, group="PG_TX", sys_flag=4, queue_id=queue_id,
                      props={"TRAN_MSG": "true", "PGROUP": "PG_TX", "UNIQ_KEY": uniq})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp


def _end(resp, uniq: str, decision: int, *, from_check: bool = False):
    return request(RequestCode.END_TRANSACTION, {
        "producerGroup": "PG_TX", "tranStateTableOffset": resp.ext_fields["queueOffset"],
        "commitLogOffset": str(decode_offset_msg_id(resp.ext_fields["msgId"])[2]),
        "commitOrRollback": str(decision), "fromTransactionCheck": "1" if from_check else "0",
        "msgId": uniq, "transactionId": uniq,
    })


async def test_commit_visible_rollback_never(broker, broker_client) -> None:
    c = broker_client
    committed = await _half(c, "TxT", b"commit-me", "U-COMMIT")
    rolled = await _half(c, "TxT", b"roll-me", "U-ROLL")
    assert committed.ext_fields["queueId"] == "0"
    # halves are invisible
    _, msgs = await pull(c, "TG", "TxT", 0, 0)
    assert msgs == []
    assert broker.tx.pending_count() == 2
    await c.invoke_oneway(_end(committed, "U-COMMIT", COMMIT))
    await c.invoke_oneway(_end(rolled, "U-ROLL", ROLLBACK))
    await eventually(lambda: broker.tx.pending_count() == 0, 5.0)
    await eventually(lambda: broker.store.max_offset("TxT", 0) == 1, 5.0)
    _, msgs = await pull(c, "TG", "TxT", 0, 0)
    assert [m.body for m in msgs] == [b"commit-me"]
    assert "TRAN_MSG" not in msgs[0].properties
    assert msgs[0].prepared_transaction_offset == decode_offset_msg_id(committed.ext_fields["msgId"])[2]
    # a repeated commit writes nothing new
    def duplicates() -> str | None:
        return broker.metrics.snapshot().get("tx_duplicate_ends_total")

    before = duplicates()
    await c.invoke_oneway(_end(committed, "U-COMMIT", COMMIT))
    await eventually(lambda: duplicates() != before, 5.0, "the repeated commit handled")
    assert broker.store.max_offset("TxT", 0) == 1


async def test_unknown_is_checked_back_on_the_sending_connection(broker, broker_client) -> None:
    c = broker_client
    checks: list = []
    answered = asyncio.Event()

    async def on_check(cmd):
        checks.append(cmd)
        msg = decode_record(cmd.body)
        assert msg.topic == "TxCheck"  # the real topic is restored for the producer
        fake = type("R", (), {"ext_fields": {"queueOffset": cmd.ext_fields["tranStateTableOffset"],
                                             "msgId": cmd.ext_fields["offsetMsgId"]}})
        await c.invoke_oneway(_end(fake, cmd.ext_fields["transactionId"], COMMIT, from_check=True))
        answered.set()

    c.register(RequestCode.CHECK_TRANSACTION_STATE, on_check)
    half = await _half(c, "TxCheck", b"checked", "U-CHECK")
    await c.invoke_oneway(_end(half, "U-CHECK", UNKNOWN))
    # transaction_timeout 0.5 s, check interval 0.2 s
    await asyncio.wait_for(answered.wait(), 10)
    await eventually(lambda: broker.store.max_offset("TxCheck", 0) == 1, 5.0)
    _, msgs = await pull(c, "TG", "TxCheck", 0, 0)
    assert [m.body for m in msgs] == [b"checked"]
    assert checks[0].ext_fields["transactionId"] == "U-CHECK"


async def test_transactional_batch_and_forged_op_refused(broker, broker_client) -> None:
    resp = await send(broker_client, "RMQ_SYS_TRANS_OP_HALF_TOPIC", b"forged", sys_flag=0)
    assert resp.code == ResponseCode.NO_PERMISSION
    body = encode_batch([(0, b"a", {"TRAN_MSG": "true", "PGROUP": "PG_TX"})])
    resp = await send(broker_client, "TxBatch", body, code=RequestCode.SEND_BATCH_MESSAGE)
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "transactional" in resp.remark
    assert broker.tx.pending_count() == 0
    assert broker.store.max_offset("TxBatch", 0) == 0


async def test_send_back_cannot_leak_a_half_message(broker, broker_client) -> None:
    c = broker_client
    half = await _half(c, "TxLeak", b"secret", "U-LEAK")
    await c.invoke_oneway(_end(half, "U-LEAK", ROLLBACK))
    await eventually(lambda: broker.tx.pending_count() == 0, 5.0)
    resp = await c.invoke(request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "offset": str(decode_offset_msg_id(half.ext_fields["msgId"])[2]), "group": "LG",
        "delayLevel": "-1"}), TIMEOUT)
    assert resp.code == ResponseCode.NO_PERMISSION
    assert broker.store.max_offset("%DLQ%LG", 0) == 0
    assert broker.store.max_offset("TxLeak", 0) == 0
