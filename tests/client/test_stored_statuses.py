"""Sends the broker stored without meeting its durability promise (FLUSH_DISK_TIMEOUT here;
FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE take the same path): the producer returns the
status and does not retry (no duplicate), and a transactional producer runs the local
transaction and commits the half, which is stored (RocketMQ's Java client rolls it back,
apache/rocketmq issue #3617).

The broker is real, with sync flushing and a disk slower than ``sync_flush_timeout`` (the
store tests' slow-disk pattern), so every put answers FLUSH_DISK_TIMEOUT.
"""

from __future__ import annotations

import time

import pytest
from support.consuming import collect
from support.waiting import eventually

from txbroker.broker import Broker
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    Producer,
    SendStatus,
    TransactionListener,
    TransactionProducer,
)


@pytest.fixture
async def slow_disk_broker(broker_config, monkeypatch):
    from txbroker.store.segment import MappedSegment
    real_sync = MappedSegment.sync

    def slow_sync(self):  # a disk that takes longer than sync_flush_timeout
        time.sleep(0.2)
        real_sync(self)

    monkeypatch.setattr(MappedSegment, "sync", slow_sync)
    broker = Broker(broker_config.replace(flush_mode="sync", sync_flush_timeout=0.02))
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


def _stored(broker: Broker, topic: str) -> int:
    return sum(broker.store.max_offset(topic, q) for q in range(4))


async def test_stored_status_is_returned_and_not_retried(slow_disk_broker) -> None:
    broker = slow_disk_broker
    async with Producer("PG_STORED", broker.namesrv_addr, retries=2) as producer:
        result = await producer.send(Message("TStored", b"once"))
    assert result.send_status is SendStatus.FLUSH_DISK_TIMEOUT
    assert _stored(broker, "TStored") == 1  # a retry would have stored it twice


class CommitListener(TransactionListener):
    def __init__(self) -> None:
        self.executed: list[str] = []

    def execute_local_transaction(self, msg, arg):
        self.executed.append(msg.transaction_id)
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


async def test_transaction_with_stored_status_runs_and_commits(slow_disk_broker) -> None:
    broker = slow_disk_broker
    listener = CommitListener()
    async with TransactionProducer("PG_STORED_TX", broker.namesrv_addr, listener=listener) as producer:
        result = await producer.send_message_in_transaction(Message("TStoredTx", b"tx"))
    assert result.send_status is SendStatus.FLUSH_DISK_TIMEOUT
    assert listener.executed == [result.transaction_id]
    assert result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
    await eventually(lambda: broker.tx.pending_count() == 0, msg="half committed")
    consumer = Consumer("CG_STORED_TX", broker.namesrv_addr, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("TStoredTx")
    async with consumer:
        [msg] = await collect(consumer, 1)
    assert msg.body == b"tx" and msg.transaction_id == result.transaction_id
