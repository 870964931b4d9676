"""The Kafka transaction coordinator on a real MessageStore in a tmp dir: every state transition
and error code, KIP-890's refusal, the timeout abort on a manual clock, operators, and recovery
after a crash at each point of a commit (fault injection: a store that dies mid-write)."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest

from tests.support.store import opened, store_config
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import Record, encode_batch, read_batches
from txbroker.service.kafka.coordinator import TransactionCoordinator
from txbroker.service.kafka.txn_log import STATE_TOPIC
from txbroker.service.kafka.txn_state import TxnState, TxnTransitionError
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.topics import TopicConfig, TopicManager
from txbroker.store.message_store import MessageStore

E = ErrorCode
TID = "app-1"
T = "orders"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


class Crash(Exception):
    """The simulated death of the broker in the middle of a write."""


class CrashingStore(MessageStore):
    """Dies at a chosen point: after ``chain_limit`` records of a put_chain, or at the put of
    a state record whose state is ``die_at_state``.  (Fault injection lives in tests only.)"""

    chain_limit: int | None = None
    die_at_state: str | None = None

    async def put_chain(self, msgs):
        if self.chain_limit is not None:
            results = await super().put_chain(msgs[:self.chain_limit])
            raise Crash(f"died after {len(results)} records")
        return await super().put_chain(msgs)

    async def put(self, msg):
        if self.die_at_state and msg.topic == STATE_TOPIC and self.die_at_state.encode() in msg.body:
            raise Crash(f"died before writing {self.die_at_state}")
        return await super().put(msg)


class Env:
    def __init__(self, tmp_path, clock: Clock) -> None:
        self.tmp_path = tmp_path
        self.clock = clock
        self.config = store_config(tmp_path, kafka_transaction_max_timeout=900.0)
        self.metrics = BrokerMetrics()
        self.store: MessageStore
        self.coord: TransactionCoordinator

    async def open(self, store_cls=MessageStore) -> TransactionCoordinator:
        self.store = await opened(self.config) if store_cls is MessageStore else await _opened(
            store_cls, self.config)
        self.topics = TopicManager(self.config)
        if self.topics.get(T) is None:
            await self.topics.create_or_update(TopicConfig(T, 4, 4))
        self.coord = TransactionCoordinator(self.config, self.store, self.topics, self.metrics,
                                            clock=self.clock)
        self.coord.recover()
        await self.coord.start()
        return self.coord

    async def close(self) -> None:
        await self.coord.close()
        await self.store.close()

    def bodies(self, partition: int) -> list[bytes]:
        return [m.body for m in self.store.get(T, partition, 0, 1000).messages()]


async def _opened(cls, config) -> MessageStore:
    store = cls(config)
    store.open()
    await store.start()
    return store


@pytest.fixture
async def env(tmp_path):
    e = Env(tmp_path, Clock())
    await e.open()
    yield e
    with contextlib.suppress(Exception):  # a test may have closed it already
        await e.close()


def batch(pid: int, epoch: int, seq: int, values: list[bytes], *, txn: bool = True):
    records = [Record(i, 1_700_000_000_000 + i, None, v, []) for i, v in enumerate(values)]
    data = encode_batch(0, records, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                        transactional=txn)
    return read_batches(data)[0]


async def begin(c: TransactionCoordinator, partitions=((T, 0), (T, 1)), tid: str = TID):
    err, pid, epoch = await c.init_producer_id(tid, 60000, -1, -1, 0)
    assert err is E.NONE
    res = await c.add_partitions(tid, pid, epoch, list(partitions), 0)
    assert set(res.values()) == {E.NONE}
    return pid, epoch


async def produce(c: TransactionCoordinator, pid, epoch, partition, seq, values, tid=TID):
    b = batch(pid, epoch, seq, values)
    err, dup = c.check_batch(tid, T, partition, b)
    if err is not E.NONE or dup is not None:
        return err, dup
    return await c.append_transactional(tid, T, partition, b), None


async def test_a_state_record_the_table_forbids_is_a_bug_and_stores_nothing(env):
    c = env.coord
    await begin(c)
    before = env.store.max_offset(STATE_TOPIC, 0)
    with pytest.raises(TxnTransitionError):  # Ongoing cannot complete a commit never decided
        await c._write(c._txns[TID], TxnState.COMPLETE_COMMIT)
    assert env.store.max_offset(STATE_TOPIC, 0) == before
    assert c.describe(TID).state == "Ongoing"


# --- commit and abort -----------------------------------------------------------------------
async def test_commit_places_every_record_at_commit_only(env):
    c = env.coord
    pid, epoch = await begin(c)
    assert await produce(c, pid, epoch, 0, 0, [b"a0", b"a1"]) == (E.NONE, None)
    assert await produce(c, pid, epoch, 1, 0, [b"b0"]) == (E.NONE, None)
    assert await produce(c, pid, epoch, 0, 2, [b"a2"]) == (E.NONE, None)
    assert env.bodies(0) == [] and env.bodies(1) == []  # invisible until the commit
    assert c.describe(TID).state == "Ongoing"
    assert env.metrics.registry.get_sample_value("txbroker_kafka_txn_open") == 1
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE
    assert env.bodies(0) == [b"a0", b"a1", b"a2"] and env.bodies(1) == [b"b0"]
    v = c.describe(TID)
    assert v.state == "CompleteCommit" and v.partitions == [] and v.started_ms is None
    assert env.metrics.kafka_txn_committed.value == 1
    assert env.metrics.registry.get_sample_value("txbroker_kafka_txn_open") == 0
    # a retried EndTxn(commit) is answered NONE; the opposite decision is refused
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE
    assert await c.end_txn(TID, pid, epoch, False, 0) is E.INVALID_TXN_STATE
    # the next transaction of the same producer continues its sequence
    await c.add_partitions(TID, pid, epoch, [(T, 0)], 0)
    assert await produce(c, pid, epoch, 0, 3, [b"a3"]) == (E.NONE, None)
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE
    assert env.bodies(0) == [b"a0", b"a1", b"a2", b"a3"]


async def test_abort_appends_nothing_and_drops_offsets(env):
    c = env.coord
    pid, epoch = await begin(c)
    await produce(c, pid, epoch, 0, 0, [b"x"])
    assert await c.add_offsets(TID, pid, epoch, "g", 0) is E.NONE
    res = await c.txn_offset_commit(TID, "g", pid, epoch, [(T, 0, 7)], 0)
    assert res == {(T, 0): E.NONE}
    assert await c.end_txn(TID, pid, epoch, False, 0) is E.NONE
    assert env.bodies(0) == []
    assert env.store.offsets.get("g", T, 0) is None
    assert c.describe(TID).state == "CompleteAbort"
    assert env.metrics.kafka_txn_aborted.labels(reason="client").value == 1
    assert await c.end_txn(TID, pid, epoch, False, 0) is E.NONE  # retry
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.INVALID_TXN_STATE


async def test_offsets_committed_with_the_transaction(env):
    c = env.coord
    pid, epoch = await begin(c)
    await produce(c, pid, epoch, 0, 0, [b"x"])
    # offsets of a group not added to the transaction are refused
    assert await c.txn_offset_commit(TID, "g", pid, epoch, [(T, 0, 7)], 0) == {(T, 0): E.INVALID_TXN_STATE}
    await c.add_offsets(TID, pid, epoch, "g", 0)
    res = await c.txn_offset_commit(TID, "g", pid, epoch, [(T, 0, 7), (T, 9, 1), ("nope", 0, 1)], 0)
    assert res == {(T, 0): E.NONE, (T, 9): E.UNKNOWN_TOPIC_OR_PARTITION,
                   ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert env.store.offsets.get("g", T, 0) is None  # pending until the commit
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE
    assert env.store.offsets.get("g", T, 0) == 7


async def test_end_txn_errors(env):
    c = env.coord
    _, pid, epoch = await c.init_producer_id(TID, 60000, -1, -1, 0)
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.INVALID_TXN_STATE  # Empty
    assert await c.end_txn(TID, pid + 1, epoch, True, 0) is E.INVALID_PRODUCER_ID_MAPPING
    assert await c.end_txn("unknown", pid, epoch, True, 0) is E.INVALID_PRODUCER_ID_MAPPING
    assert await c.end_txn(TID, pid, epoch + 1, True, 0) is E.INVALID_PRODUCER_EPOCH
    assert await c.end_txn(TID, pid, epoch + 1, True, 2) is E.PRODUCER_FENCED


# --- InitProducerId and fencing -------------------------------------------------------------
async def test_init_producer_id_errors_and_bumps(env):
    c = env.coord
    assert (await c.init_producer_id("", 60000, -1, -1, 0))[0] is E.INVALID_REQUEST
    assert (await c.init_producer_id(TID, 0, -1, -1, 0))[0] is E.INVALID_TRANSACTION_TIMEOUT
    assert (await c.init_producer_id(TID, 900_001, -1, -1, 0))[0] is E.INVALID_TRANSACTION_TIMEOUT
    assert (await c.init_producer_id(TID, 60000, 5, -1, 3))[0] is E.INVALID_REQUEST
    err, pid, epoch = await c.init_producer_id(TID, 60000, -1, -1, 0)
    assert (err, epoch) == (E.NONE, 0)
    err, pid2, epoch2 = await c.init_producer_id(TID, 60000, -1, -1, 0)
    assert (err, pid2, epoch2) == (E.NONE, pid, 1)
    # v3+: a retry with the epoch just replaced gets the current one back, no second bump
    assert await c.init_producer_id(TID, 60000, pid, 0, 4) == (E.NONE, pid, 1)
    assert await c.init_producer_id(TID, 60000, pid, 1, 4) == (E.NONE, pid, 2)
    assert (await c.init_producer_id(TID, 60000, pid, 0, 4))[0] is E.PRODUCER_FENCED
    assert (await c.init_producer_id(TID, 60000, pid, 0, 3))[0] is E.INVALID_PRODUCER_EPOCH
    # idempotent producers: a new id every time, epoch 0
    e1, p1, ep1 = await c.init_producer_id(None, 0, -1, -1, 0)
    e2, p2, ep2 = await c.init_producer_id(None, 0, -1, -1, 0)
    assert e1 is e2 is E.NONE and p1 != p2 and p1 != pid and ep1 == ep2 == 0


async def test_epoch_exhaustion_gives_a_new_producer_id(env):
    c = env.coord
    err, pid, _ = await c.init_producer_id(TID, 60000, -1, -1, 0)
    c._txns[TID].epoch = 32766
    err, pid2, epoch2 = await c.init_producer_id(TID, 60000, -1, -1, 0)
    assert err is E.NONE and pid2 != pid and epoch2 == 0


async def test_new_instance_fences_the_ongoing_one(env):
    c = env.coord
    pid, epoch = await begin(c)
    await produce(c, pid, epoch, 0, 0, [b"zombie"])
    err, pid2, epoch2 = await c.init_producer_id(TID, 60000, -1, -1, 0)
    assert (err, pid2, epoch2) == (E.NONE, pid, epoch + 1)
    assert env.metrics.kafka_producers_fenced.value == 1
    assert env.metrics.kafka_txn_aborted.labels(reason="fenced").value == 1
    # the zombie is refused everywhere; nothing it wrote becomes visible
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.INVALID_PRODUCER_EPOCH
    assert await c.end_txn(TID, pid, epoch, True, 2) is E.PRODUCER_FENCED
    assert await c.add_partitions(TID, pid, epoch, [(T, 2)], 0) == {(T, 2): E.INVALID_PRODUCER_EPOCH}
    assert await c.add_partitions(TID, pid, epoch, [(T, 2)], 2) == {(T, 2): E.PRODUCER_FENCED}
    assert await c.add_offsets(TID, pid, epoch, "g", 0) is E.INVALID_PRODUCER_EPOCH
    assert await produce(c, pid, epoch, 0, 1, [b"late"]) == (E.INVALID_PRODUCER_EPOCH, None)
    assert env.bodies(0) == []
    # the new instance starts at sequence 0 of its epoch
    await c.add_partitions(TID, pid2, epoch2, [(T, 0)], 0)
    assert await produce(c, pid2, epoch2, 0, 0, [b"new"]) == (E.NONE, None)
    assert await c.end_txn(TID, pid2, epoch2, True, 0) is E.NONE
    assert env.bodies(0) == [b"new"]


# --- the produce path: KIP-890 and idempotence ------------------------------------------------
async def test_transactional_produce_checks(env):
    c = env.coord
    pid, epoch = await begin(c, partitions=[(T, 0)])
    # KIP-890 part 1: a partition not added is refused
    assert await produce(c, pid, epoch, 1, 0, [b"x"]) == (E.INVALID_TXN_STATE, None)
    assert await produce(c, pid + 1, epoch, 0, 0, [b"x"]) == (E.INVALID_PRODUCER_ID_MAPPING, None)
    assert await produce(c, pid, epoch, 0, 0, [b"x"], tid="other") == (E.INVALID_PRODUCER_ID_MAPPING, None)
    assert await produce(c, pid, epoch + 1, 0, 0, [b"x"]) == (E.INVALID_PRODUCER_EPOCH, None)
    # a non-transactional batch of a producer with an open transaction
    assert c.check_batch(None, T, 0, batch(pid, epoch, 0, [b"x"], txn=False)) == (E.INVALID_TXN_STATE, None)
    # unknown partitions: 3 for them, 55 for the others, nothing added
    res = await c.add_partitions(TID, pid, epoch, [(T, 1), (T, 99), ("nope", 0)], 0)
    assert res == {(T, 1): E.OPERATION_NOT_ATTEMPTED, (T, 99): E.UNKNOWN_TOPIC_OR_PARTITION,
                   ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert c.describe(TID).partitions == [(T, 0)]
    # a transactional retry is a duplicate (offset -1: placed at commit), stored once
    assert await produce(c, pid, epoch, 0, 0, [b"a", b"b"]) == (E.NONE, None)
    assert await produce(c, pid, epoch, 0, 0, [b"a", b"b"]) == (E.NONE, -1)
    assert await produce(c, pid, epoch, 0, 5, [b"gap"]) == (E.OUT_OF_ORDER_SEQUENCE_NUMBER, None)
    assert env.metrics.kafka_duplicate_batches.value == 0  # counted by the data path
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE
    assert env.bodies(0) == [b"a", b"b"]


async def test_idempotent_sequence_rules(env):
    c = env.coord
    _, pid, _ = await c.init_producer_id(None, 0, -1, -1, 0)
    end = [0]  # the partition's next offset, as the data path would assign it

    async def send(epoch, seq, n):
        b = batch(pid, epoch, seq, [b"v"] * n, txn=False)
        err, dup = c.check_batch(None, T, 0, b)
        if err is E.NONE and dup is None:
            c.record_batch(T, 0, b, end[0])
            end[0] += n
        return err, dup

    assert await send(0, 17, 2) == (E.NONE, None)  # no state: any sequence is accepted
    assert await send(0, 19, 1) == (E.NONE, None)
    assert await send(0, 17, 2) == (E.NONE, 0)  # duplicate: answered with its original offset
    assert await send(0, 21, 1) == (E.OUT_OF_ORDER_SEQUENCE_NUMBER, None)  # gap
    assert await send(0, 18, 2) == (E.OUT_OF_ORDER_SEQUENCE_NUMBER, None)  # overlap, not exact
    assert await send(1, 5, 1) == (E.OUT_OF_ORDER_SEQUENCE_NUMBER, None)  # new epoch: seq 0
    assert await send(1, 0, 1) == (E.NONE, None)
    assert await send(0, 20, 1) == (E.INVALID_PRODUCER_EPOCH, None)  # older epoch
    for seq in range(1, 7):
        assert await send(1, seq, 1) == (E.NONE, None)
    # only the last five batches are remembered
    assert (await send(1, 1, 1))[0] is E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert await send(1, 2, 1) == (E.NONE, 5)
    assert end[0] == 10


async def test_sequence_wraps_after_int32_max(env):
    c = env.coord
    b = batch(7, 0, 2**31 - 2, [b"x", b"y"], txn=False)
    assert b.last_sequence == 2**31 - 1
    c.record_batch(T, 0, b, 0)
    assert c.check_batch(None, T, 0, batch(7, 0, 0, [b"z"], txn=False)) == (E.NONE, None)
    assert c.check_batch(None, T, 0, batch(7, 0, 1, [b"z"], txn=False))[0] is E.OUT_OF_ORDER_SEQUENCE_NUMBER


# --- timeouts and operators -----------------------------------------------------------------
async def test_timeout_aborts_and_fences(env):
    c = env.coord
    _, pid, epoch = await c.init_producer_id(TID, 10_000, -1, -1, 0)
    await c.add_partitions(TID, pid, epoch, [(T, 0)], 0)
    await produce(c, pid, epoch, 0, 0, [b"slow"])
    env.clock.now += 9
    await c.scan()
    assert c.describe(TID).state == "Ongoing" and not c.describe(TID).hanging(c.now_ms())
    env.clock.now += 2
    assert c.describe(TID).hanging(c.now_ms())
    await c.scan()
    v = c.describe(TID)
    assert v.state == "CompleteAbort" and v.producer_epoch == epoch + 1 and not v.hanging(c.now_ms())
    assert env.metrics.kafka_txn_aborted.labels(reason="timeout").value == 1
    assert await c.end_txn(TID, pid, epoch, True, 2) is E.PRODUCER_FENCED
    assert env.bodies(0) == []


async def test_operator_abort_lists_and_describes(env):
    c = env.coord
    _, epoch = await begin(c)
    views = c.transactions()
    assert [(v.transactional_id, v.state, v.partitions) for v in views] == [
        (TID, "Ongoing", [(T, 0), (T, 1)])]
    assert c.describe("nope") is None
    assert await c.abort(TID, "alice") == "aborted"
    assert c.describe(TID).producer_epoch == epoch + 1
    assert await c.abort(TID, "alice") == "not-open"
    assert await c.abort("nope", "alice") == "not-open"
    assert env.metrics.kafka_txn_aborted.labels(reason="operator").value == 1


# --- recovery -------------------------------------------------------------------------------
async def test_recovery_keeps_an_open_transaction_and_the_producer_ids(env):
    c = env.coord
    pid, epoch = await begin(c)
    await produce(c, pid, epoch, 0, 0, [b"a"])
    await produce(c, pid, epoch, 1, 0, [b"b"])
    await c.add_offsets(TID, pid, epoch, "g", 0)
    await c.txn_offset_commit(TID, "g", pid, epoch, [(T, 0, 3)], 0)
    await env.close()
    c = await env.open()
    assert c.describe(TID).state == "Ongoing"
    # the sequence state came back with the batches: a retry is a duplicate
    assert await produce(c, pid, epoch, 0, 0, [b"a"]) == (E.NONE, -1)
    assert await produce(c, pid, epoch, 0, 1, [b"c"]) == (E.NONE, None)
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE
    assert env.bodies(0) == [b"a", b"c"] and env.bodies(1) == [b"b"]
    assert env.store.offsets.get("g", T, 0) == 3
    # producer ids are never reused after a restart
    _, other, _ = await c.init_producer_id(None, 0, -1, -1, 0)
    await env.close()
    c = await env.open()
    _, after, _ = await c.init_producer_id(None, 0, -1, -1, 0)
    assert after > other > pid
    assert c.describe(TID).state == "CompleteCommit"


async def _crash_commit(env, **faults):
    c = env.coord
    pid, epoch = await begin(c, partitions=[(T, 0), (T, 1), (T, 2)])
    await produce(c, pid, epoch, 0, 0, [b"a0", b"a1", b"a2"])
    await produce(c, pid, epoch, 1, 0, [b"b0", b"b1"])
    await produce(c, pid, epoch, 2, 0, [b"c0"])
    await produce(c, pid, epoch, 0, 3, [b"a3"])
    await c.add_offsets(TID, pid, epoch, "g", 0)
    await c.txn_offset_commit(TID, "g", pid, epoch, [(T, 3, 11)], 0)
    for k, v in faults.items():
        setattr(env.store, k, v)
    with pytest.raises(Crash):
        await c.end_txn(TID, pid, epoch, True, 0)
    await c.suspend()  # a dead broker writes nothing more (close would write a snapshot)
    await env.store.close()
    with contextlib.suppress(FileNotFoundError):  # as if never persisted
        os.remove(os.path.join(env.config.data_dir, "consumerOffset.json"))
    return pid, epoch


@pytest.mark.parametrize("faults,committed", [
    ({"die_at_state": "PrepareCommit"}, False),   # before the decision
    ({"chain_limit": 0}, True),                   # decided, nothing applied
    ({"chain_limit": 3}, True),                   # decided, part applied
    ({"chain_limit": 6}, True),                   # decided, all but the last applied
    ({"die_at_state": "CompleteCommit"}, True),   # applied, not completed
])
async def test_recovery_after_a_crash_in_the_commit(tmp_path, faults, committed):
    env = Env(tmp_path, Clock())
    await env.open(CrashingStore)
    pid, epoch = await _crash_commit(env, **faults)
    c = await env.open()
    want = ([b"a0", b"a1", b"a2", b"a3"], [b"b0", b"b1"], [b"c0"])
    if committed:
        assert (env.bodies(0), env.bodies(1), env.bodies(2)) == want
        assert c.describe(TID).state == "CompleteCommit"
        assert env.store.offsets.get("g", T, 3) == 11
        assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE
    else:  # still open: the client may commit again (all of it) or abort
        assert (env.bodies(0), env.bodies(1), env.bodies(2)) == ([], [], [])
        assert c.describe(TID).state == "Ongoing"
        assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE
        assert (env.bodies(0), env.bodies(1), env.bodies(2)) == want
    # a second restart changes nothing: no duplicates
    await env.close()
    await env.open()
    assert (env.bodies(0), env.bodies(1), env.bodies(2)) == want
    await env.close()


async def test_recovered_offsets_never_move_a_later_commit_back(env):
    c = env.coord
    pid, epoch = await begin(c)
    await c.add_offsets(TID, pid, epoch, "g", 0)
    await c.txn_offset_commit(TID, "g", pid, epoch, [(T, 0, 5), (T, 1, 5)], 0)
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE
    assert env.store.commit_offsets_now([("g", T, 0, 9, None)]).ok  # a later, plain commit
    await env.close()
    path = os.path.join(env.config.data_dir, "consumerOffset.json")
    os.utime(path, (0, 0))  # the file's time decides nothing: the offsets are in the log
    await env.open()
    assert env.store.offsets.get("g", T, 0) == 9
    assert env.store.offsets.get("g", T, 1) == 5


async def test_a_snapshot_is_written_before_retention_can_take_the_last_one(env):
    """Retention deletes old segments, state records and snapshots included: a snapshot is
    written again once half of ``file_reserved_time`` old, even with nothing changed, so the
    newest snapshot alone rebuilds every id and the producer-id floor."""
    from txbroker.service.kafka.snapshot import SNAPSHOT_TOPIC

    c = env.coord
    pid, epoch = await begin(c)
    assert await produce(c, pid, epoch, 0, 0, [b"x"]) == (E.NONE, None)
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE
    await c.scan()  # changed since the start: a snapshot
    first = env.store.max_offset(SNAPSHOT_TOPIC, 0)
    assert first >= 1
    await c.scan()
    assert env.store.max_offset(SNAPSHOT_TOPIC, 0) == first  # nothing changed: none
    env.clock.now += env.config.file_reserved_time / 2 + 1
    await c.scan()
    last = env.store.max_offset(SNAPSHOT_TOPIC, 0)
    assert last > first  # unchanged, but half the retention old: written again
    state_end = env.store.max_offset(STATE_TOPIC, 0)

    class AfterRetention:  # the store as retention would leave it: everything older gone
        def __getattr__(self, name):
            return getattr(env.store, name)

        def min_offset(self, topic, queue_id):
            if topic == STATE_TOPIC:
                return state_end
            if topic == SNAPSHOT_TOPIC:
                return first
            return env.store.min_offset(topic, queue_id)

    again = TransactionCoordinator(env.config, AfterRetention(), env.topics, BrokerMetrics(),
                                   clock=env.clock)
    again.recover()
    assert again.describe(TID).state == "CompleteCommit"
    assert again.describe(TID).producer_id == pid
    assert await again.allocate_pid() > pid


async def test_close_ends_the_scan_even_when_a_pass_swallows_the_cancel(tmp_path) -> None:
    # A marker send under asyncio.wait_for can lose a cancel on Python 3.11 (the answer and
    # the cancel arrive together): the scan pass then returns normally.  The loop must still
    # end, or the broker's stop waits for it forever.
    class LosesACancel(TransactionCoordinator):
        async def scan(self) -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                return

    config = store_config(tmp_path, kafka_transaction_scan_interval=0.01)
    store = await opened(config)
    try:
        coord = LosesACancel(config, store, TopicManager(config), BrokerMetrics(), clock=Clock())
        coord.recover()
        await coord.start()
        await asyncio.sleep(0.1)  # a pass is under way
        await asyncio.wait_for(coord.close(), 5.0)
    finally:
        await store.close()
