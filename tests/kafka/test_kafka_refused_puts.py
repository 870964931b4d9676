"""The Kafka transaction coordinator while the store refuses writes: a decided commit whose
records the fenced store refuses stays decided, is applied once writes are accepted again,
and never twice."""

from __future__ import annotations

import pytest

from tests.support.store import store_config
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import Record, encode_batch, read_batches
from txbroker.service.kafka.coordinator import (
    CoordinatorUnavailable,
    TransactionCoordinator,
)
from txbroker.service.kafka.txn_log import STATE_TOPIC
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.topics import TopicConfig, TopicManager
from txbroker.store.message_store import MessageStore
from txbroker.store.results import Fence

TID, T = "app-1", "orders"
FENCE = Fence.LEASE_NOT_VALID.text


class FencingStore(MessageStore):
    """Raises its own real fence right after storing the state record naming ``fence_after``
    (a lease running out between a commit's decision and its records)."""

    fence_after: str | None = None

    async def put(self, msg):
        result = await super().put(msg)
        if self.fence_after and msg.topic == STATE_TOPIC and self.fence_after.encode() in msg.body:
            self.fence_after = None
            self.set_write_gate(lambda: Fence.LEASE_NOT_VALID)
        return result


@pytest.fixture
async def coord(tmp_path):
    config = store_config(tmp_path, kafka_transaction_max_timeout=900.0)
    store = FencingStore(config)
    store.open()
    await store.start()
    topics = TopicManager(config)
    await topics.create_or_update(TopicConfig(T, 2, 2))
    c = TransactionCoordinator(config, store, topics, BrokerMetrics())
    c.recover()
    await c.start()
    try:
        yield c
    finally:
        await c.close()
        await store.close()


def _bodies(store: MessageStore, partition: int) -> list[bytes]:
    return [m.body for m in store.get(T, partition, 0, 100).messages()]


async def test_a_commit_refused_after_its_decision_is_applied_once_writes_return(coord) -> None:
    c, store = coord, coord.store
    err, pid, epoch = await c.init_producer_id(TID, 60000, -1, -1, 0)
    assert err is ErrorCode.NONE
    assert set((await c.add_partitions(TID, pid, epoch, [(T, 0), (T, 1)], 0)).values()) == {
        ErrorCode.NONE}
    for partition, values in ((0, [b"a0", b"a1"]), (1, [b"b0"])):
        records = [Record(i, 1_700_000_000_000 + i, None, v, []) for i, v in enumerate(values)]
        b = read_batches(encode_batch(0, records, producer_id=pid, producer_epoch=epoch,
                                      base_sequence=0, transactional=True))[0]
        assert c.check_batch(TID, T, partition, b) == (ErrorCode.NONE, None)
        assert await c.append_transactional(TID, T, partition, b) is ErrorCode.NONE
    store.fence_after = "PrepareCommit"
    with pytest.raises(CoordinatorUnavailable):
        await c.end_txn(TID, pid, epoch, True, 0)
    for _ in range(3):  # retries while fenced: nothing placed, still decided
        await c.scan()
        assert c.describe(TID).state == "PrepareCommit"
        assert _bodies(store, 0) == [] and _bodies(store, 1) == []
        assert await c.end_txn(TID, pid, epoch, True, 0) is ErrorCode.CONCURRENT_TRANSACTIONS
    store.set_write_gate(None)
    await c.scan()
    assert c.describe(TID).state == "CompleteCommit"
    assert _bodies(store, 0) == [b"a0", b"a1"] and _bodies(store, 1) == [b"b0"]
    assert await c.end_txn(TID, pid, epoch, True, 0) is ErrorCode.NONE
    await c.scan()
    assert _bodies(store, 0) == [b"a0", b"a1"] and _bodies(store, 1) == [b"b0"]
