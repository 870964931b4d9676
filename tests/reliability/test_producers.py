"""Producers that vanish, and producers whose clocks lie.

* A producer process SIGKILLed mid-transaction while it is the only member of its group: while
  the group has no live connection, checks are not sent and not counted (no burned checks, no
  discard); when a producer of the group returns, the half is checked and resolved once.
* A producer whose born timestamps are a day off: the immunity time runs from when the broker
  stored the half, so the first check is neither early (clock behind) nor never (clock ahead).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.waiting import eventually

from txbroker.broker import Broker
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.store import record as rec

HANGING_PRODUCER = Path(__file__).parents[1] / "support" / "hanging_producer.py"


class Commit(TransactionListener):
    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        self.checked.append(msg.keys)
        return LocalTransactionState.COMMIT_MESSAGE


def start_hanging_producer(namesrv: str, group: str, topic: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HANGING_PRODUCER), namesrv, group, topic,
                             "mid-transaction", "MID"], stdout=subprocess.PIPE, text=True)


@pytest.mark.slow
async def test_group_gone_then_back_resolves_half_without_burning_checks(broker_config):
    broker = Broker(broker_config.replace(transaction_check_max=3, flush_mode="sync"))
    await broker.start()
    try:
        child = start_hanging_producer(broker.namesrv_addr, "gone_pg", "GoneTopic")
        try:
            tx_id = (await asyncio.to_thread(child.stdout.readline)).strip()
            assert tx_id
        finally:
            child.kill()
            child.wait(10)
            child.stdout.close()
        await eventually(lambda: "gone_pg" not in broker.registry.producer_groups(), 5.0,
                         "the killed producer's connection dropped")
        # The half must outlive its immunity (transaction_timeout) before a pass would check it:
        # that wait is the situation under test, not synchronisation.
        await asyncio.sleep(broker_config.transaction_timeout)
        for _ in range(2 * 3):  # twice transaction_check_max passes, run now
            await broker.tx.check_now()
        async with AdminClient(broker.namesrv_addr) as admin:
            row = await admin.txn_show(tx_id)
            assert broker.tx.pending_count() == 1, row
            assert row["state"] == "pending" and row["checks"] == 0, row
            assert not (await admin.txn_list("discarded")), "checks were burned while the group was gone"

        listener = Commit()
        async with TransactionProducer("gone_pg", broker.namesrv_addr, listener=listener):
            await eventually(lambda: broker.tx.pending_count() == 0, 10, "the half resolved")
        assert broker.tx.pending_count() == 0
        assert listener.checked.count("MID") >= 1
        consumer = Consumer("gone_cg", broker.namesrv_addr, from_where="first", long_poll_timeout=0.5)
        consumer.subscribe("GoneTopic")
        got = []
        async with consumer:
            while (msg := await consumer.poll(2.0)) is not None:
                got.append(msg.keys)
        assert got == ["MID"]  # committed exactly once
    finally:
        await broker.stop()


def half_send(topic: str, group: str, uniq: str, born_ms: int) -> RemotingCommand:
    props = {rec.PROPERTY_TRANSACTION_PREPARED: "true", rec.PROPERTY_PRODUCER_GROUP: group,
             rec.PROPERTY_UNIQ_KEY: uniq, "KEYS": uniq}
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, {
        "producerGroup": group, "topic": topic, "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": str(rec.TRANSACTION_PREPARED_TYPE),
        "bornTimestamp": str(born_ms), "flag": "0",
        "properties": rec.properties_to_string(props), "reconsumeTimes": "0"}, b"skewed")


@pytest.mark.parametrize("skew_seconds", [-86400, 86400])
async def test_skewed_producer_clock_gives_neither_early_nor_late_checks(broker_config, skew_seconds):
    immunity = 1.5
    broker = Broker(broker_config.replace(transaction_timeout=immunity))
    await broker.start()
    client = RemotingClient(broker.broker_addr)
    checks: dict[str, float] = {}

    def on_check(cmd: RemotingCommand):
        stored = rec.decode_record(cmd.body)
        uniq = stored.properties.get(rec.PROPERTY_UNIQ_KEY, "")
        checks.setdefault(uniq, time.monotonic())

    client.register(RequestCode.CHECK_TRANSACTION_STATE, on_check)
    try:
        await client.connect()
        uniq = f"SKEW{skew_seconds + 86400:06d}"
        sent_at = time.monotonic()
        born = int((time.time() + skew_seconds) * 1000)
        resp = await client.invoke(half_send("SkewTopic", "skew_pg", uniq, born), 5)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        await eventually(lambda: uniq in checks, 15.0, "no check-back: the producer's clock delayed it")
        assert checks[uniq] - sent_at >= immunity * 0.9, "checked before the immunity time"
    finally:
        await client.close()
        await broker.stop()
