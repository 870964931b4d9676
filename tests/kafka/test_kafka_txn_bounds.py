"""Bounds of the transaction coordinator: the bytes one open transaction and all of them may
stage, and the expiry of idle transactional ids (Kafka's transactional.id.expiration.ms)."""

from __future__ import annotations

import asyncio

from tests.kafka.test_kafka_txn_coordinator import Clock, Env, T, batch, begin
from tests.support.store import store_config
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.txn_log import STATE_TOPIC

E = ErrorCode
VALUE = b"v" * 1000


def capped_env(tmp_path, **caps) -> Env:
    env = Env(tmp_path, Clock())
    env.config = store_config(tmp_path, kafka_transaction_max_timeout=900.0, **caps)
    return env


async def test_one_transaction_is_refused_at_its_cap_and_can_still_abort(tmp_path):
    env = capped_env(tmp_path, kafka_transaction_max_bytes=10_000,
                     kafka_transactions_max_bytes=20_000)
    c = await env.open()
    pid, epoch = await begin(c, partitions=[(T, 0)])
    seq, refused = 0, None
    for _ in range(50):  # without a cap this would stage 50 kB
        err = await c.append_transactional("app-1", T, 0, batch(pid, epoch, seq, [VALUE]))
        if err is not E.NONE:
            refused = err
            break
        seq += 1
    assert refused is E.RECORD_LIST_TOO_LARGE
    assert 0 < c.staged_bytes <= 10_000
    assert seq == c.staged_bytes // len(batch(pid, epoch, 0, [VALUE]).data)
    assert await c.end_txn("app-1", pid, epoch, True, 0) is E.INVALID_TXN_STATE  # abort only
    assert await c.end_txn("app-1", pid, epoch, False, 0) is E.NONE
    assert c.staged_bytes == 0  # an ended transaction's batches leave memory
    # the next transaction has the whole cap again; the refused sequence counts as used
    await c.add_partitions("app-1", pid, epoch, [(T, 0)], 0)
    assert await c.append_transactional("app-1", T, 0, batch(pid, epoch, seq + 1, [VALUE])) is E.NONE
    assert await c.end_txn("app-1", pid, epoch, True, 0) is E.NONE
    assert env.bodies(0) == [VALUE] and c.staged_bytes == 0
    await env.close()


async def test_all_open_transactions_together_are_capped(tmp_path):
    env = capped_env(tmp_path, kafka_transaction_max_bytes=10_000,
                     kafka_transactions_max_bytes=15_000)
    c = await env.open()
    answers = []
    for i in range(3):
        tid = f"app-{i}"
        pid, epoch = await begin(c, partitions=[(T, 0)], tid=tid)
        for seq in range(6):
            answers.append(await c.append_transactional(tid, T, 0, batch(pid, epoch, seq, [VALUE])))
    assert E.KAFKA_STORAGE_ERROR in answers  # retriable: it frees up as transactions end
    assert c.staged_bytes <= 15_000
    await env.close()
    c = await env.open()  # the count is rebuilt with the open transactions
    assert 0 < c.staged_bytes <= 15_000
    await env.close()


async def test_an_idle_transactional_id_expires_and_stays_expired(tmp_path):
    env = capped_env(tmp_path, kafka_transactional_id_expiration=3600.0)
    c = await env.open()
    pid, epoch = await begin(c, partitions=[(T, 0)])
    assert await c.end_txn("app-1", pid, epoch, True, 0) is E.NONE
    pid2, _ = await begin(c, partitions=[(T, 0)], tid="open-one")
    env.clock.now += 1800
    await c.scan()
    assert c.describe("app-1") is not None
    env.clock.now += 1801
    end = env.store.max_offset(STATE_TOPIC, 0)
    await c.scan()
    assert c.describe("app-1") is None  # expired: one tombstone written
    assert env.store.max_offset(STATE_TOPIC, 0) > end
    # the other id was open until the first scan aborted it at its timeout: settled since then
    assert c.describe("open-one").state == "CompleteAbort"
    await env.close()
    c = await env.open()
    assert c.describe("app-1") is None  # a restart does not bring it back
    # the producer-id floor did not fall: a new id is above every id handed out
    _, fresh, _ = await c.init_producer_id("app-1", 60000, -1, -1, 0)
    assert fresh > max(pid, pid2)
    await env.close()


async def test_a_hostile_producer_is_refused_at_the_cap_over_the_wire(kafka_config, tmp_path):
    """An unmodified aiokafka transactional producer staging without end: refused with
    RECORD_LIST_TOO_LARGE once its transaction holds the cap; the broker's staged bytes stay
    under the cap; the producer aborts and the next transaction works."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import RecordListTooLargeError

    from txbroker.broker import Broker

    cap = 200_000
    b = Broker(kafka_config.replace(max_message_size=65536, kafka_transaction_max_bytes=cap))
    await b.start()
    try:
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{b.kafka_port}",
                                    transactional_id="hostile", linger_ms=0,
                                    max_batch_size=16384)
        await producer.start()
        try:
            await producer.begin_transaction()
            refused = None
            for i in range(2000):  # 2 MB without the cap, ten times the cap
                try:
                    await producer.send_and_wait("hog", b"x" * 1000, partition=0)
                except RecordListTooLargeError as exc:
                    refused = exc
                    break
                assert b.kafka_txn.staged_bytes <= cap
            assert refused is not None, "never refused"
            assert b.kafka_txn.staged_bytes <= cap
            await producer.abort_transaction()
            assert b.kafka_txn.staged_bytes == 0
            async with producer.transaction():
                await producer.send_and_wait("hog", b"after", partition=0)
        finally:
            await asyncio.wait_for(producer.stop(), 30)
        got = [m.body for m in b.store.get("hog", 0, 0, 10).messages()]
        assert got == [b"after"]
    finally:
        await b.stop()
