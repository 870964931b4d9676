"""Log lines read as sentences with units, never as a raw exception or object dump: the HA
connection ending (two real stores over loopback), a transaction check pass and a topic
deletion (an in-process broker on 127.0.0.1 port 0 with real clients)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from support.store import opened
from support.store import store_config as cfg
from support.waiting import eventually

from txbroker.client import (
    LocalTransactionState,
    Message,
    Producer,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient
from txbroker.store.ha_master import HAMaster
from txbroker.store.ha_slave import HASlave

RAW = re.compile(r"undefined|expected bytes|IncompleteReadError|Report\(|\w+\(\w+=")


def _messages(caplog, contains: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if contains in r.getMessage()]


async def test_ha_connection_end_is_a_sentence(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="txbroker")
    master = await opened(cfg(tmp_path / "m"))
    slave = await opened(cfg(tmp_path / "s"))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01, group="broker-a")
    host, port = await ha.start()
    follower = HASlave(slave, lambda: f"{host}:{port}", heartbeat=0.05, backoff=0.02,
                       max_backoff=0.2, master_name=lambda: "broker-a@master")
    follower.start()
    try:
        await eventually(lambda: follower.connected)
        await ha.close()  # the master goes away: the slave's read sees the end of the stream
        await eventually(lambda: _messages(caplog, "HA connection to the master ended"))
    finally:
        await follower.close()
        await slave.close()
        await master.close()
    ended = _messages(caplog, "HA connection to the master ended")
    assert all(not RAW.search(m) for m in ended), ended
    assert any(m.endswith("the master closed the connection") or "reset" in m for m in ended), ended
    followed = _messages(caplog, "now following")
    want = f"now following broker-a@master (HA {host}:{port}) from offset 0, truncated 0 bytes"
    assert followed == [want], followed
    assert _messages(caplog, "HA slave broker-a id 1 (from ")


class Unknown(TransactionListener):
    """Leaves every local transaction unknown, then commits when checked back."""

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


async def test_check_pass_and_topic_deletion_are_sentences_with_counts(broker, caplog) -> None:
    caplog.set_level(logging.INFO, logger="txbroker")
    ns = broker.namesrv_addr
    async with TransactionProducer("pg-words", ns, listener=Unknown()) as producer:
        await producer.send_message_in_transaction(Message("Words", b"half"))
        await eventually(lambda: _messages(caplog, "check pass:"), 15.0, "no check pass logged")
    passes = _messages(caplog, "check pass:")
    assert all(not RAW.search(m) for m in passes), passes
    assert re.fullmatch(r"check pass: 1 of 1 due half messages checked back \(1 pending\), "
                        r"in [\d.]+ ms", passes[0]), passes

    async with AdminClient(ns) as admin:
        await admin.create_topic("Eight", 8)
    async with Producer("pg-eight", ns) as producer:
        sent = [await producer.send(Message("Eight", b"m%d" % i)) for i in range(3)]
    holding = len({r.queue_id for r in sent})
    async with AdminClient(ns) as admin:
        await admin.delete_topic("Eight")
    [deleted] = _messages(caplog, "topic Eight deleted")
    assert re.fullmatch(rf"topic Eight deleted by \S+: 8 queues, {holding} of them holding "
                        r"messages", deleted), deleted
