"""Producer state that survives restarts and failover: idempotent producers' sequences rebuilt
from the latest snapshot plus the batches stored after it, snapshots keeping recovery short,
and suspend/resume of the coordinator on a live broker (demotion, promotion)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from tests.kafka.test_kafka_txn_coordinator import (
    Clock,
    CrashingStore,
    Env,
    T,
    batch,
    begin,
    produce,
)
from tests.support.store import store_config
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.coordinator import PID_BLOCK, TransactionCoordinator
from txbroker.service.kafka.mapping import record_to_message
from txbroker.service.kafka.snapshot import SNAPSHOT_TOPIC
from txbroker.service.kafka.txn_log import STATE_TOPIC
from txbroker.service.metrics import BrokerMetrics

E = ErrorCode
TID = "app-1"


async def store_idempotent(env: Env, pid: int, epoch: int, seq: int, values: list[bytes],
                           partition: int = 0) -> int:
    """What the data path does with an idempotent batch: check, tag, store, record."""
    b = batch(pid, epoch, seq, values, txn=False)
    c = env.coord
    assert c.check_batch(None, T, partition, b) == (E.NONE, None)
    msgs = [record_to_message(T, partition, r, born_host=("127.0.0.1", 0)) for r in b.records()]
    c.tag_batch(msgs[0], b)
    results = await env.store.put_batch(msgs)
    c.record_batch(T, partition, b, results[0].queue_offset)
    return results[0].queue_offset


@pytest.mark.parametrize("clean", [True, False], ids=["clean-stop", "crash"])
async def test_idempotent_state_survives_a_restart(tmp_path, clean):
    env = Env(tmp_path, Clock())
    c = await env.open()
    _, pid, _ = await c.init_producer_id(None, 0, -1, -1, 0)
    offsets = [await store_idempotent(env, pid, 0, seq * 2, [b"a", b"b"]) for seq in range(7)]
    if clean:
        await env.close()  # writes a snapshot
        assert env.store.max_offset(SNAPSHOT_TOPIC, 0) >= 1
    else:
        await c.suspend()  # a crash: nothing more written; the log alone rebuilds the state
        await env.store.close()
    c = await env.open()
    # the last five batches are duplicates answered with their first offsets ...
    for n in range(2, 7):
        assert c.check_batch(None, T, 0, batch(pid, 0, n * 2, [b"a", b"b"], txn=False)) == (
            E.NONE, offsets[n])
    # ... older ones are gone (Kafka keeps five), and the sequence goes on where it was
    assert c.check_batch(None, T, 0, batch(pid, 0, 2, [b"a", b"b"], txn=False))[0] is (
        E.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert c.check_batch(None, T, 0, batch(pid, 0, 14, [b"c"], txn=False)) == (E.NONE, None)
    assert c.check_batch(None, T, 0, batch(pid, 0, 15, [b"c"], txn=False))[0] is (
        E.OUT_OF_ORDER_SEQUENCE_NUMBER)
    # a second restart (replaying what the snapshot already holds) changes nothing
    await env.close()
    c = await env.open()
    assert c.check_batch(None, T, 0, batch(pid, 0, 12, [b"a", b"b"], txn=False)) == (
        E.NONE, offsets[6])
    await env.close()


async def test_snapshot_then_log_tail(tmp_path):
    """State from the snapshot, batches stored after it from the log."""
    env = Env(tmp_path, Clock())
    c = await env.open()
    _, pid, _ = await c.init_producer_id(None, 0, -1, -1, 0)
    first = await store_idempotent(env, pid, 0, 0, [b"a"])
    env.clock.now += 3600
    await c.scan()  # a snapshot
    assert env.store.max_offset(SNAPSHOT_TOPIC, 0) >= 1
    second = await store_idempotent(env, pid, 0, 1, [b"b"], partition=1)
    await c.suspend()
    await env.store.close()
    c = await env.open()
    assert c.check_batch(None, T, 0, batch(pid, 0, 0, [b"a"], txn=False)) == (E.NONE, first)
    assert c.check_batch(None, T, 1, batch(pid, 0, 1, [b"b"], txn=False)) == (E.NONE, second)
    await env.close()


async def _committed(c: TransactionCoordinator, pid: int, epoch: int, seq: int,
                     value: bytes) -> None:
    """One transaction of one batch on partition 0, committed."""
    assert set((await c.add_partitions(TID, pid, epoch, [(T, 0)], 0)).values()) == {E.NONE}
    assert await produce(c, pid, epoch, 0, seq, [value]) == (E.NONE, None)
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE


async def test_transactional_sequences_survive_past_the_snapshot(tmp_path):
    """Transactions completed after the latest snapshot: their batches are only in the data
    topic, yet a promoted slave (a crash, then recovery from the log) knows their sequences,
    so the producer goes on; the replay, which starts before the snapshot, does not take back
    batches older than the five the snapshot retained (they have no offset to compare)."""
    env = Env(tmp_path, Clock())
    c = await env.open()
    err, pid, epoch = await c.init_producer_id(TID, 60000, -1, -1, 0)
    assert err is E.NONE
    for seq in range(7):
        await _committed(c, pid, epoch, seq, b"before")
    env.clock.now += 3600
    await c.scan()  # a snapshot: sequences up to 6, batches 2-6 retained
    assert env.store.max_offset(SNAPSHOT_TOPIC, 0) >= 1
    for seq in (7, 8):
        await _committed(c, pid, epoch, seq, b"after")
    await c.suspend()  # a crash: the log alone rebuilds the state
    await env.store.close()
    c = await env.open()
    assert set((await c.add_partitions(TID, pid, epoch, [(T, 0)], 0)).values()) == {E.NONE}
    # the last five batches (4-8) are retries answered as duplicates, older ones are gone
    for seq in (4, 5, 6):
        assert c.check_batch(TID, T, 0, batch(pid, epoch, seq, [b"before"])) == (E.NONE, -1)
    for seq in (7, 8):
        assert c.check_batch(TID, T, 0, batch(pid, epoch, seq, [b"after"])) == (E.NONE, -1)
    assert c.check_batch(TID, T, 0, batch(pid, epoch, 1, [b"before"]))[0] is (
        E.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert c.check_batch(TID, T, 0, batch(pid, epoch, 10, [b"gap"]))[0] is (
        E.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert await produce(c, pid, epoch, 0, 9, [b"next"]) == (E.NONE, None)
    assert await c.end_txn(TID, pid, epoch, True, 0) is E.NONE
    assert env.bodies(0) == [b"before"] * 7 + [b"after"] * 2 + [b"next"]
    await env.close()


async def test_suspend_then_resume_finishes_an_interrupted_commit(tmp_path):
    """A master demoted mid-commit, then this (live) coordinator becoming master again: the
    commit decided before the failover is finished, once, and producer ids are not reissued."""
    env = Env(tmp_path, Clock())
    c = await env.open(CrashingStore)
    pid, epoch = await begin(c, partitions=[(T, 0), (T, 1)])
    await produce(c, pid, epoch, 0, 0, [b"a0", b"a1", b"a2"])
    await produce(c, pid, epoch, 1, 0, [b"b0"])
    _, idem, _ = await c.init_producer_id(None, 0, -1, -1, 0)
    env.store.chain_limit = 2
    with pytest.raises(Exception, match="died after 2"):
        await c.end_txn(TID, pid, epoch, True, 0)
    env.store.chain_limit = None
    await c.suspend()
    assert not c.ready and c.describe(TID) is None  # nothing served, nothing remembered
    await c.resume()
    assert c.ready
    assert (env.bodies(0), env.bodies(1)) == ([b"a0", b"a1", b"a2"], [b"b0"])
    assert c.describe(TID).state == "CompleteCommit"
    fresh = await c.allocate_pid()
    assert fresh >= PID_BLOCK + idem  # one whole block above the floor: never reissued
    await c.suspend()
    await c.resume()  # callable again and again
    assert (env.bodies(0), env.bodies(1)) == ([b"a0", b"a1", b"a2"], [b"b0"])
    assert await c.allocate_pid() > fresh
    await env.close()


@pytest.mark.slow
async def test_recovery_time_does_not_grow_with_history(tmp_path):
    """100k state changes of 1000 ids: recovery reads the latest snapshot and at most one
    snapshot's worth of records after it."""
    env = Env(tmp_path, Clock())
    env.config = store_config(tmp_path, kafka_transaction_max_timeout=900.0,
                              segment_size=64 * 1024 * 1024, max_message_size=1024 * 1024)
    c = await env.open()
    ids = {}
    for i in range(1000):
        _, pid, epoch = await c.init_producer_id(f"id-{i}", 60000, -1, -1, 0)
        ids[f"id-{i}"] = (pid, epoch)
    changes = 1000
    while changes < 100_000:
        for tid, (pid, epoch) in ids.items():
            await c.add_partitions(tid, pid, epoch, [(T, 0)], 0)
            await c.end_txn(tid, pid, epoch, False, 0)
            changes += 2
        await c.scan()
    await c.suspend()  # as after a crash: no snapshot at stop
    await env.store.close()
    env.store = await _opened(env)
    again = TransactionCoordinator(env.config, env.store, env.topics, BrokerMetrics(), clock=env.clock)
    t0 = time.perf_counter()
    again.recover()
    took = time.perf_counter() - t0
    assert len(again.transactions()) == 1000
    assert env.store.max_offset(STATE_TOPIC, 0) - again._snap_state_from <= 10_000
    print(f"recover() after {changes} state changes: {took:.3f} s")
    await env.store.close()


async def _opened(env: Env):
    from tests.support.store import opened

    return await opened(env.config)


# --- over the wire: a retried idempotent batch across a SIGKILL -----------------------------
def _is_produce_to(topic: bytes):
    seen = []

    def match(chunk: bytes) -> bool:
        # a Produce request (api key 0) naming the topic: forwarded, its answer never arrives
        if not seen and len(chunk) > 6 and chunk[4:6] == b"\x00\x00" and topic in chunk:
            seen.append(chunk)
            return True
        return False
    return match


@pytest.mark.slow
async def test_a_batch_retried_across_a_sigkill_is_stored_once(broker_process, tmp_path):
    """aiokafka with enable_idempotence: its batch is stored, the answer is lost (the fault
    proxy black-holes the connection), the broker is SIGKILLed and restarted, the client
    retries the batch with the same sequence: the broker recognises it and stores it once."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    from txbroker.bench.chaos.faultproxy import FaultProxy
    from txbroker.bench.chaos.process import free_port

    port = free_port("127.0.0.1")
    # The broker listens on 127.0.0.2 and advertises 127.0.0.1, where the proxy listens on
    # the same port: every Kafka connection of the client goes through the proxy.
    broker = broker_process(listen_host="127.0.0.2", advertised_host="127.0.0.1",
                            kafka_port=port, auto_create_topic=True)
    proxy = FaultProxy("127.0.0.2", port, listen_port=port,
                       silence_after=_is_produce_to(b"idem"))
    await proxy.start()
    producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", enable_idempotence=True,
                                acks="all", request_timeout_ms=4000, retry_backoff_ms=200,
                                linger_ms=0)
    try:
        await producer.start()
        await producer.send_and_wait("idem", b"warm-up", partition=0)  # state exists before
        proxy.silence_after = _is_produce_to(b"idem")
        sent = asyncio.ensure_future(producer.send_and_wait("idem", b"once", partition=0))
        for _ in range(100):  # bounded: the request is forwarded within a few loop turns
            if proxy.stats.silenced:
                break
            await asyncio.sleep(0.05)
        assert proxy.stats.silenced == 1
        await asyncio.sleep(1.0)  # the broker stores it (the answer goes nowhere)
        broker.kill()
        proxy.enabled = False
        broker.start()
        meta = await asyncio.wait_for(sent, 60)
        assert meta.offset == 1  # answered with the offset it was stored at the first time
        consumer = AIOKafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", group_id=None,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition("idem", 0)
            consumer.assign([tp])
            values = []
            for _ in range(20):  # bounded
                batches = await consumer.getmany(tp, timeout_ms=500)
                values += [r.value for r in batches.get(tp, [])]
                if len(values) >= 2:
                    break
            with contextlib.suppress(Exception):
                more = await consumer.getmany(tp, timeout_ms=500)
                values += [r.value for r in more.get(tp, [])]
        finally:
            await consumer.stop()
        assert values == [b"warm-up", b"once"]
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), 30)
        await proxy.close()
