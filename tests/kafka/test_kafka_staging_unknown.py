"""A participant of a cross-group Kafka transaction counts a write answered OUTCOME_UNKNOWN as
stored: the record is in its log, only the acknowledgement is missing (the master lease
lapsed while the put waited).  Counted as not stored, the marker's retry appended the
transaction's records a second time, and a staged batch's retry was staged a second time
(recovery then replayed both).

A real store in sync flush mode, whose write gate goes up once the records in question are
appended: the put's answer, checked against the gate as it leaves, becomes OUTCOME_UNKNOWN
(the same way a lapsed lease does on a clustered master)."""

from __future__ import annotations

import pytest
from support.clock import ManualClock

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import Record, encode_batch, read_batches
from txbroker.service.kafka.staging import STAGED_TOPIC, TxnStaging
from txbroker.store.message_store import MessageStore
from txbroker.store.results import Fence

TOPIC = "orders"
PID, EPOCH = 7, 0
RECORDS = 3


def _config(tmp_path) -> BrokerConfig:
    return BrokerConfig(data_dir=str(tmp_path / "data"), broker_port=0, namesrv_port=-1,
                        metrics_port=-1, segment_size=1024 * 1024, max_message_size=64 * 1024,
                        flush_mode="sync", flush_interval=0.05)


def _batch(sequence: int = 0):
    records = [Record(i, 1_000 + i, None, b"v%d" % i, []) for i in range(RECORDS)]
    data = encode_batch(0, records, producer_id=PID, producer_epoch=EPOCH,
                        base_sequence=sequence, transactional=True)
    return read_batches(data)[0]


class GateAfter:
    """A write gate that goes up once ``topic`` holds ``count`` records (so the put that
    appended them is answered OUTCOME_UNKNOWN), until lifted."""

    def __init__(self, store: MessageStore, topic: str, count: int) -> None:
        self.store, self.topic, self.count = store, topic, count
        self.lifted = False

    def __call__(self) -> Fence | None:
        if not self.lifted and self.store.max_offset(self.topic, 0) >= self.count:
            return Fence.LEASE_NOT_VALID
        return None


async def _commit_remote(*_args) -> bool:
    return True


def _staging(config: BrokerConfig, store: MessageStore) -> TxnStaging:
    return TxnStaging(config, store, commit_remote=_commit_remote, coordinates=lambda _tid: False,
                      clock=ManualClock())


@pytest.fixture
async def store(tmp_path):
    config = _config(tmp_path)
    s = MessageStore(config, clock=ManualClock())
    s.open()
    await s.start()
    try:
        yield s
    finally:
        await s.close()


async def _open_staging(store: MessageStore) -> TxnStaging:
    staging = _staging(store.config, store)
    staging.recover()
    await staging.start()
    return staging


def _appended(store: MessageStore) -> int:
    """Records of the transaction in their partition."""
    return store.max_offset(TOPIC, 0)


async def test_records_answered_outcome_unknown_are_not_appended_again_by_the_retry(store) -> None:
    staging = await _open_staging(store)
    assert (await staging.stage_batch(TOPIC, 0, _batch()))[0] is ErrorCode.NONE
    gate = GateAfter(store, TOPIC, RECORDS)
    store.set_write_gate(gate)
    # The marker record is stored; the records are appended, but their answer leaves after
    # the gate went up: OUTCOME_UNKNOWN.  The done record is refused: the marker is retried.
    assert await staging.apply(PID, EPOCH, 1, True) is ErrorCode.KAFKA_STORAGE_ERROR
    assert _appended(store) == RECORDS
    gate.lifted = True
    assert await staging.apply(PID, EPOCH, 1, True) is ErrorCode.NONE
    assert _appended(store) == RECORDS  # not appended twice
    # A restart replays the topic: the commit is done, nothing is appended again.
    again = await _open_staging(store)
    assert again.staged_count() == 0
    assert _appended(store) == RECORDS


async def test_a_staged_batch_answered_outcome_unknown_is_kept_so_its_retry_stages_nothing(store) -> None:
    staging = await _open_staging(store)
    gate = GateAfter(store, STAGED_TOPIC, 1)
    store.set_write_gate(gate)
    err, _ = await staging.stage_batch(TOPIC, 0, _batch())
    assert err is ErrorCode.KAFKA_STORAGE_ERROR  # retriable: the client sends it again
    gate.lifted = True
    err, _ = await staging.stage_batch(TOPIC, 0, _batch())
    assert err is ErrorCode.NONE  # a duplicate of the batch already staged
    assert staging.staged_count() == 1
    assert store.max_offset(STAGED_TOPIC, 0) == 1  # stored once
    assert await staging.apply(PID, EPOCH, 1, True) is ErrorCode.NONE
    assert _appended(store) == RECORDS


async def test_a_commit_marker_answered_outcome_unknown_is_taken_so_its_retry_writes_no_second(
        store) -> None:
    staging = await _open_staging(store)
    assert (await staging.stage_batch(TOPIC, 0, _batch()))[0] is ErrorCode.NONE
    gate = GateAfter(store, STAGED_TOPIC, 2)  # the batch, then the commit marker
    store.set_write_gate(gate)
    assert await staging.apply(PID, EPOCH, 1, True) is ErrorCode.KAFKA_STORAGE_ERROR
    gate.lifted = True
    assert await staging.apply(PID, EPOCH, 1, True) is ErrorCode.NONE
    assert _appended(store) == RECORDS
    # batch, one commit marker, one done record: a second marker would have replaced the
    # first at recovery with one that holds no records
    assert store.max_offset(STAGED_TOPIC, 0) == 3
    again = await _open_staging(store)
    assert again.staged_count() == 0
    assert _appended(store) == RECORDS
