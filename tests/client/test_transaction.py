"""TransactionProducer against a real broker: commit, rollback, check-backs, a killed producer."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from pathlib import Path

import pytest
from support.consuming import collect
from support.waiting import WAIT, eventually

from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.errors import ClientStateError
from txbroker.store.record import HALF_TOPIC, decode_offset_msg_id

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


class SyncListener(TransactionListener):
    """Plain methods: decision by message key; check-backs answered from ``decided``."""

    def __init__(self) -> None:
        self.executed: list[tuple[str, object]] = []
        self.checked: list[str] = []
        self.decided: dict[str, LocalTransactionState] = {}
        self.check_threads: set[int] = set()

    def execute_local_transaction(self, msg, arg):
        self.executed.append((msg.transaction_id, arg))
        if msg.keys == "boom":
            raise RuntimeError("local transaction exploded")
        return {"c": COMMIT, "r": ROLLBACK}.get(msg.keys, UNKNOW)

    def check_local_transaction(self, msg):
        self.checked.append(msg.transaction_id)
        self.check_threads.add(threading.get_ident())
        return self.decided.get(msg.transaction_id, UNKNOW)


class AsyncListener(SyncListener):
    async def execute_local_transaction(self, msg, arg):
        await asyncio.sleep(0)
        return super().execute_local_transaction(msg, arg)

    async def check_local_transaction(self, msg):
        await asyncio.sleep(0)
        return super().check_local_transaction(msg)


async def _consumer(namesrv: str, group: str, topic: str) -> Consumer:
    consumer = Consumer(group, namesrv, from_where="first", long_poll_timeout=2.0)
    consumer.subscribe(topic)
    await consumer.start()
    return consumer


@pytest.mark.parametrize("listener_cls", [SyncListener, AsyncListener])
async def test_commit_visible_rollback_never(broker, namesrv, listener_cls) -> None:
    listener = listener_cls()
    topic = f"TTx{listener_cls.__name__}"
    async with TransactionProducer("PG_TX", namesrv, listener=listener) as producer:
        rolled = await producer.send_message_in_transaction(Message(topic, b"no", keys="r"), arg=1)
        committed = await producer.send_message_in_transaction(Message(topic, b"yes", keys="c"), arg=2)
        with pytest.raises(ClientStateError):
            await producer.send(Message(topic, b"plain"))
        with pytest.raises(ValueError, match="delay"):
            await producer.send_message_in_transaction(Message(topic, b"x", delay_level=2))
    assert rolled.local_transaction_state is ROLLBACK and committed.local_transaction_state is COMMIT
    assert committed.transaction_id == committed.msg_id
    assert [a for _, a in listener.executed] == [1, 2]
    # the half as stored: hidden topic, TRAN_MSG, PGROUP, real topic kept aside
    half = broker.store.read(decode_offset_msg_id(committed.offset_msg_id)[2])
    assert half.topic == HALF_TOPIC and half.properties["TRAN_MSG"] == "true"
    assert half.properties["PGROUP"] == "PG_TX" and half.properties["REAL_TOPIC"] == topic
    assert half.properties["UNIQ_KEY"] == committed.transaction_id
    assert half.properties["__transactionId__"] == committed.transaction_id
    consumer = await _consumer(namesrv, "CG_TX", topic)
    try:
        [msg] = await collect(consumer, 1)
        assert msg.body == b"yes" and msg.transaction_id == committed.transaction_id
        assert msg.prepared_transaction_offset == half.physical_offset
        assert await consumer.poll(0.5) is None  # the rolled-back half never shows up
    finally:
        await consumer.shutdown()
    await eventually(lambda: broker.tx.pending_count() == 0, msg="no pending halves")


@pytest.mark.parametrize("listener_cls", [SyncListener, AsyncListener])
async def test_unknown_then_check_back_commits(broker, namesrv, listener_cls, caplog) -> None:
    listener = listener_cls()
    topic = f"TCheck{listener_cls.__name__}"
    caplog.set_level(logging.ERROR, logger="txbroker.client.transaction")
    async with TransactionProducer("PG_CHECK", namesrv, listener=listener) as producer:
        unknown = await producer.send_message_in_transaction(Message(topic, b"later", keys="u"))
        boom = await producer.send_message_in_transaction(Message(topic, b"boom", keys="boom"))
        assert unknown.local_transaction_state is UNKNOW and boom.local_transaction_state is UNKNOW
        assert "local transaction exploded" in caplog.text
        assert broker.tx.pending_count() == 2
        # The broker asks (immunity 0.5 s, interval 0.2 s); the listener knows now.
        listener.decided[unknown.transaction_id] = COMMIT
        listener.decided[boom.transaction_id] = ROLLBACK
        await eventually(lambda: broker.tx.pending_count() == 0, msg="checks resolved both")
    assert unknown.transaction_id in listener.checked and boom.transaction_id in listener.checked
    # plain check methods run off the event loop (they may block on a database), async ones on it
    on_loop = threading.get_ident() in listener.check_threads
    assert on_loop == (listener_cls is AsyncListener)
    consumer = await _consumer(namesrv, "CG_CHECK", topic)
    try:
        [msg] = await collect(consumer, 1)
        assert msg.body == b"later"
        assert await consumer.poll(0.5) is None
    finally:
        await consumer.shutdown()


@pytest.mark.slow
async def test_check_backs_run_with_bounded_concurrency(broker, namesrv) -> None:
    running = peak = 0
    seen: set[str] = set()

    class Slow(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            return UNKNOW

        async def check_local_transaction(self, msg):
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            try:
                await asyncio.sleep(0.3)  # longer than the check interval: re-checks pile up
            finally:
                running -= 1
            seen.add(msg.transaction_id)
            return COMMIT

    async with TransactionProducer("PG_SLOW", namesrv, listener=Slow(), check_concurrency=2) as producer:
        for i in range(6):
            await producer.send_message_in_transaction(Message("TSlow", f"s{i}".encode()))
        await eventually(lambda: broker.tx.pending_count() == 0, msg="all six committed")
    assert len(seen) == 6 and 1 <= peak <= 2
    consumer = await _consumer(namesrv, "CG_SLOW", "TSlow")
    try:
        msgs = await collect(consumer, 6)
        assert sorted(m.body for m in msgs) == [f"s{i}".encode() for i in range(6)]
        assert await consumer.poll(0.5) is None  # committed once each, despite repeated checks
    finally:
        await consumer.shutdown()


async def test_killed_producer_is_answered_for_by_its_group(broker, namesrv) -> None:
    script = Path(__file__).parents[1] / "support" / "hanging_producer.py"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), namesrv, "PG_KILL", "TKill", "orphaned half", "ORPHAN",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), WAIT)
        tx_id = line.decode().strip()
        assert len(tx_id) == 32, (line, await proc.stderr.read())
        assert broker.tx.pending_count() == 1  # the half is stored
    finally:
        proc.kill()  # SIGKILL: no END_TRANSACTION, no unregister
        await asyncio.wait_for(proc.wait(), WAIT)
    assert proc.returncode == -9

    listener = SyncListener()
    listener.decided[tx_id] = COMMIT  # e.g. found in the database the dead producer wrote
    async with TransactionProducer("PG_KILL", namesrv, listener=listener):
        await eventually(lambda: broker.tx.pending_count() == 0, msg="half resolved by the survivor")
    assert tx_id in listener.checked
    consumer = await _consumer(namesrv, "CG_KILL", "TKill")
    try:
        [msg] = await collect(consumer, 1)
        assert msg.body == b"orphaned half" and msg.msg_id == tx_id and msg.keys == "ORPHAN"
    finally:
        await consumer.shutdown()


def test_listener_validation() -> None:
    with pytest.raises(ValueError, match="listener"):
        TransactionProducer("PG", listener=None)
    with pytest.raises(ValueError, match="check_concurrency"):
        TransactionProducer("PG", listener=SyncListener(), check_concurrency=0)


async def test_check_back_reaches_a_producer_whose_connection_dropped(broker, namesrv) -> None:
    listener = SyncListener()
    # The periodic heartbeat (30 s) is far beyond the wait below: the producer must reconnect
    # and heartbeat as soon as its connection drops, as it must after a broker restart.
    async with TransactionProducer("PG_DROP", namesrv, listener=listener) as producer:
        result = await producer.send_message_in_transaction(Message("TDropTx", b"d", keys="u"))
        for conn in list(broker.server.connections):
            conn.close()  # the broker no longer knows a connection of PG_DROP
        listener.decided[result.transaction_id] = COMMIT
        await eventually(lambda: broker.tx.pending_count() == 0, msg="half resolved by check-back")
    assert result.transaction_id in listener.checked


class RecordingListener(TransactionListener):
    """Keeps the half it was given, and returns what it is told to (a state or not)."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.halves: list = []

    def execute_local_transaction(self, msg, arg):
        self.halves.append(msg)
        return self.answer

    def check_local_transaction(self, msg):
        return COMMIT


async def test_the_listeners_half_and_the_result_carry_every_field(broker, namesrv) -> None:
    """The half handed to execute_local_transaction is built lazily; every field a listener
    may read must still be there: the properties map as sent, ids, offsets, body, keys."""
    listener = RecordingListener(COMMIT)
    async with TransactionProducer("PG_TXF", namesrv, listener=listener) as producer:
        result = await producer.send_message_in_transaction(Message(
            "TTxFields", b"payload", tags="TagA", keys=["k1", "k2"], properties={"color": "red"}))
        (half,) = listener.halves
        uniq = result.transaction_id
        assert half.properties == {"color": "red", "KEYS": "k1 k2", "TAGS": "TagA",
                                   "UNIQ_KEY": uniq, "WAIT": "true", "TRAN_MSG": "true",
                                   "PGROUP": "PG_TXF", "__transactionId__": uniq}
        assert (half.topic, half.body, half.tags, half.keys) == ("TTxFields", b"payload", "TagA", "k1 k2")
        assert half.msg_id == half.transaction_id == uniq == result.msg_id
        assert (half.offset_msg_id, half.queue_id, half.queue_offset, half.broker_name) == (
            result.offset_msg_id, result.queue_id, result.queue_offset, result.broker_name)
        assert decode_offset_msg_id(half.offset_msg_id)[2] >= 0
        assert result.local_transaction_state is COMMIT and result.topic == "TTxFields"
        # a listener answering something that is no state: UNKNOW, the broker checks back
        listener.answer = "yes"
        unknown = await producer.send_message_in_transaction(Message("TTxFields", b"x"))
        assert unknown.local_transaction_state is UNKNOW
