"""The Kafka replay when a transaction fails for a reason the trace did not script: another
instance with the same transactional id fences the replay's producer in the middle of its
transaction (what a coordinator that lost the id's state, or a zombie, does), so its commit is
refused.  The replay does what a Kafka application does: a new instance with the same id runs
the same trace transaction again, bounded; the row counts the retry and is delivered once.
When every run is fenced, the row fails once the bound is reached (``send_failed``).  And a
``never`` row whose transaction the broker does not end in time is left unresolved after its
bound: the replay does not hang on it.

The replay task runs as a Spark task runs it (:func:`stream_task`), without Spark, against a
broker process's Kafka listener."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from txbroker.bench.trace.kafka_replay import (
    _RESULT_SCHEMA,
    PARTITIONS,
    TaskParams,
    _replay_task,
    create_topics,
)
from txbroker.bench.trace.spec import producer_group
from txbroker.bench.trace.tasks import now_ms, stream_task

pytestmark = pytest.mark.slow

TOPIC = "RetryT"
COLUMNS = [c.strip().split(" ")[0] for c in _RESULT_SCHEMA.split(",")]
#: Long enough for the test to see the transaction open and fence it.
LOCAL_TX_MS = 1500
#: Bound on waiting for the replay's transaction to be open.
OPEN_TIMEOUT = 30.0


def row(tx_id: int, local_tx_ms: int, kind: str = "commit") -> dict:
    never = kind == "never"
    return {"id": tx_id, "producer": 0, "topic": TOPIC, "topics": [TOPIC], "keys": f"k{tx_id}",
            "tags": "", "body_bytes": 16, "start_ms": 0, "local_tx_ms": local_tx_ms,
            "kind": kind, "first_decision": "unknown" if never else kind,
            "check_answers": [], "expected_checks": 0,
            "expected_outcome": "discard" if never else kind, "messages": 1, "crash": never,
            "restart_ms": 50 if never else None}


def replay_rows(bootstrap: str, rows: list[dict], attempts: int = 6,
                **params: object) -> dict[int, dict]:
    """The replay task's result rows by id (run on this thread, as a Spark task would)."""
    p = TaskParams(bootstrap=bootstrap, run_id="retry", epoch_ms=now_ms(), rate=0.0,
                   concurrency=4, progress=None, attempts=attempts,
                   **{"transaction_timeout_ms": 10000, **params})
    out = stream_task(rows, lambda feed, emit: _replay_task(feed, emit, p, 0), window=16)
    return {r[0]: dict(zip(COLUMNS, r, strict=True)) for r in out}


async def fence_open_transactions(bootstrap: str, transactional_id: str, times: int) -> int:
    """Each time ``transactional_id`` has an Ongoing transaction, start another instance of it
    (InitProducerId: the broker aborts that transaction and fences its producer); ``times``
    times at most, each within :data:`OPEN_TIMEOUT`.  Returns how many it fenced."""
    from aiokafka import AIOKafkaProducer
    from kafka.admin import KafkaAdminClient

    loop = asyncio.get_running_loop()
    admin = await loop.run_in_executor(None, lambda: KafkaAdminClient(bootstrap_servers=bootstrap))

    def ongoing() -> bool:
        listed = admin.list_transactions(state_filters=["Ongoing"])
        return any(t.transactional_id == transactional_id for per in listed.values() for t in per)

    fenced = 0
    try:
        for _ in range(times):
            deadline = loop.time() + OPEN_TIMEOUT
            while not await loop.run_in_executor(None, ongoing):
                if loop.time() > deadline:
                    return fenced
                await asyncio.sleep(0.05)
            zombie = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id)
            await zombie.start()
            try:
                await zombie.begin_transaction()  # waits for its InitProducerId: the fence
                fenced += 1
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(zombie.stop(), 30)
    finally:
        await loop.run_in_executor(None, admin.close)
    return fenced


async def read_committed(bootstrap: str, expected: int) -> list[bytes]:
    """The ``bench_tx`` header of every record of the topic, read_committed."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                isolation_level="read_committed", enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    got: list[bytes] = []
    try:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        quiet = 0
        for _ in range(60):  # bounded: 60 polls of at most 0.5 s
            batches = await consumer.getmany(*tps, timeout_ms=500)
            got += [dict(r.headers)["bench_tx"] for recs in batches.values() for r in recs]
            quiet = quiet + 1 if not batches else 0
            if len(got) >= expected and quiet >= 2:
                break
    finally:
        await consumer.stop()
    return got


@pytest.fixture
def kafka_broker(broker_process):
    broker = broker_process(kafka_port=0)
    asyncio.run(create_topics(broker.kafka_addr, [TOPIC]))
    return broker


async def test_a_fenced_transaction_runs_again_on_a_new_instance(kafka_broker) -> None:
    bootstrap = kafka_broker.kafka_addr
    rows = [row(1, LOCAL_TX_MS), row(2, 0)]
    replay = asyncio.create_task(asyncio.to_thread(replay_rows, bootstrap, rows, 6))
    fenced = await fence_open_transactions(bootstrap, producer_group(0), 1)
    results = await asyncio.wait_for(replay, 120)
    assert fenced == 1
    first, second = results[1], results[2]
    assert (first["error"], first["final_state"], first["retries"], first["attempts"]) == (
        None, "commit", 1, 2)
    assert (second["error"], second["final_state"], second["retries"], second["attempts"]) == (
        None, "commit", 0, 1)
    assert sorted(await read_committed(bootstrap, 2)) == [b"1", b"2"]  # each once


async def test_a_row_fails_only_once_its_retries_are_exhausted(kafka_broker) -> None:
    bootstrap = kafka_broker.kafka_addr
    replay = asyncio.create_task(asyncio.to_thread(replay_rows, bootstrap, [row(1, LOCAL_TX_MS)], 2))
    fenced = await fence_open_transactions(bootstrap, producer_group(0), 2)
    results = await asyncio.wait_for(replay, 120)
    assert fenced == 2
    failed = results[1]
    assert failed["error"] is not None and failed["final_state"] == "unknown"
    assert (failed["retries"], failed["attempts"]) == (1, 2)
    assert await read_committed(bootstrap, 0) == []  # both runs aborted


async def test_a_never_transaction_not_ended_in_time_is_left_unresolved(broker_process) -> None:
    # The broker's timeout scan runs every 30 s: the 1 s transaction outlives the replay's
    # bound (its timeout + 2 s), which must then record the row rather than wait.
    broker = broker_process(kafka_port=0, kafka_transaction_scan_interval=30.0)
    bootstrap = broker.kafka_addr
    await create_topics(bootstrap, [TOPIC])
    replay = asyncio.to_thread(replay_rows, bootstrap, [row(1, 0, "never")],
                               transaction_timeout_ms=1000, resolve_margin_s=2.0)
    results = await asyncio.wait_for(replay, 20)  # the scan would end it only after 30 s
    abandoned = results[1]
    assert abandoned["error"] is None and abandoned["abandoned_ms"] is not None
    assert abandoned["resolved_ms"] is None  # verify counts it unresolved
