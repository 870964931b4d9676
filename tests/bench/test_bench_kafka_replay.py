"""The trace through Kafka transactions: an embedded broker's Kafka listener, real aiokafka
producers in Spark tasks, read_committed delivery tasks, and every outcome checked directly."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import asdict

import pyarrow.parquet as pq
import pytest
from bench_helpers import E2E_BROKER
from support.waiting import eventually

from txbroker.bench.trace.embedded import EmbeddedBroker
from txbroker.bench.trace.generate import build, default_meta
from txbroker.bench.trace.spec import META_FILE, SpecError
from txbroker.bench.trace.tasks import ProgressServer

#: The broker's Kafka timeout the trace asks for: short, so `never` rows end in seconds.
TIMEOUT_MS = 3000
TRANSACTIONS = 1000
RESTART = {"at_ms": 400, "consumer": 0, "down_ms": 300}


def write_trace(spark, path) -> None:
    """generate.build's trace plus the version 2 columns: every tenth row three messages over
    three topics, every other unknown row a crash, restart_ms 50 ms (null, i.e. the default, on
    every seventh unknown row); metadata version 2 with a Kafka timeout and a consumer restart."""
    from pyspark.sql import functions as F

    meta = default_meta(TRANSACTIONS, seed=11, topics=3, producers=16, rate=1000.0, broker=E2E_BROKER)
    df = build(spark, meta, partitions=2)
    k = F.regexp_extract("topic", r"(\d+)$", 1).cast("int")
    multi = F.col("id") % 10 == 3
    unknown = F.col("first_decision") == "unknown"
    df = (df.withColumn("messages", F.when(multi, F.lit(3)).otherwise(F.lit(1)))
          .withColumn("topics", F.when(multi, F.array(
              F.col("topic"), F.concat(F.lit("BenchT"), ((k + 1) % 3).cast("string")),
              F.concat(F.lit("BenchT"), ((k + 2) % 3).cast("string"))))
              .otherwise(F.array(F.col("topic"))))
          .withColumn("crash", unknown & (F.col("id") % 2 == 0))
          .withColumn("restart_ms", F.when(unknown & (F.col("id") % 7 != 0), F.lit(50))
                      .otherwise(F.lit(None).cast("int"))))
    df.write.parquet(str(path))
    raw = asdict(meta)
    raw.update(version=2, consumers=1, consumer_restarts=[RESTART],
               kafka={"transaction_timeout_ms": TIMEOUT_MS})
    (path / META_FILE).write_text(json.dumps(raw))


@pytest.fixture(scope="module")
def kafka_run(spark, tmp_path_factory):
    from txbroker.bench.trace.kafka_replay import replay

    work = tmp_path_factory.mktemp("bench-kafka")
    write_trace(spark, work / "trace")
    progress = ProgressServer()
    try:
        with EmbeddedBroker(E2E_BROKER) as broker:
            assert broker.bootstrap and broker.bootstrap == broker.kafka_addr
            summary = replay(spark, work / "trace", broker.bootstrap, work / "results" / "kafka",
                             tasks=1, broker_pids=[broker.pid], progress=progress)

        def counts() -> dict:
            return {phase: progress.done(phase) for phase in ("replay-kafka", "deliveries-kafka")}

        # A task's last count is sent as it ends and read by a server thread: wait for it.
        want = {"replay-kafka": TRANSACTIONS, "deliveries-kafka": summary["deliveries"]}
        asyncio.run(eventually(lambda: counts() == want, 10, lambda: f"progress {counts()}"))
    finally:
        progress.close()
    return work, summary


def test_every_outcome_through_kafka_transactions(kafka_run):
    work, summary = kafka_run
    trace = {r["id"]: r for r in pq.read_table(work / "trace").to_pylist()}
    out = work / "results" / "kafka"
    results = {r["id"]: r for r in pq.read_table(out / "transactions").to_pylist()}
    deliveries = pq.read_table(out / "deliveries").to_pylist()
    assert len(results) == TRANSACTIONS
    assert [r for r in results.values() if r["error"]] == []
    kinds = Counter(r["kind"] for r in trace.values())
    assert all(kinds[k] > 0 for k in ("commit", "rollback", "unknown_commit", "unknown_rollback", "never"))

    # Every committed (tx, msg) exactly once, on the topic the trace names; nothing else.
    got = Counter((d["tx"], d["msg"]) for d in deliveries)
    expected = {(i, m) for i, r in trace.items() if r["expected_outcome"] == "commit"
                for m in range(r["messages"])}
    assert set(got) == expected
    assert set(got.values()) == {1}
    for d in deliveries:
        assert d["topic"] == trace[d["tx"]]["topics"][d["msg"]]
        assert d["msg_id"] == d["transaction_id"] == "" and d["consumer"] == 0
        assert d["recv_ms"] >= d["store_ms"] - 1000
    assert any(trace[i]["messages"] == 3 for i, _ in expected)
    assert summary["deliveries"] == len(deliveries) and summary["foreign_deliveries"] == 0

    for i, row in trace.items():
        r = results[i]
        assert r["check_ms"] == [] and r["check_phase"] == []
        assert r["half_ms"] is not None and r["start_ms"] <= r["half_ms"] <= r["return_ms"]
        if row["first_decision"] != "unknown":
            assert (r["abandoned_ms"], r["resolved_ms"], r["attempts"]) == (None, None, 1)
            assert r["final_state"] == row["first_decision"]
            continue
        assert r["first_state"] == "unknown"
        assert r["abandoned_ms"] is not None and r["resolved_ms"] >= r["abandoned_ms"]
        restart = 200 if row["restart_ms"] is None else row["restart_ms"]
        assert r["resolved_ms"] - r["abandoned_ms"] >= restart
        if row["kind"] == "unknown_commit":
            assert r["attempts"] == 2 and r["final_state"] == "commit"
        elif row["kind"] == "unknown_rollback":
            assert r["attempts"] == 1 and r["final_state"] == "rollback"
        else:
            # Only the broker's timeout ends it, counted from when the transaction began
            # (after start_ms): the last stable offset passes its records no earlier.
            assert r["attempts"] == 1 and r["final_state"] == "unknown"
            assert r["resolved_ms"] - r["start_ms"] >= TIMEOUT_MS


def test_results_metadata_and_consumer_restart(kafka_run):
    work, summary = kafka_run
    on_disk = json.loads((work / "results" / "kafka" / "_txbroker_results.json").read_text())
    assert on_disk["protocol"] == "kafka" and on_disk["consumers"] == 1
    assert on_disk["transaction_timeout_ms"] == TIMEOUT_MS
    assert on_disk["broker_cpu_seconds"] is not None and on_disk["broker_cpu_seconds"] > 0
    [restart] = on_disk["consumer_restarts"]
    assert (restart["consumer"], restart["at_ms"], restart["down_ms"]) == (0, 400, 300)
    assert restart["restarted_ms"] - restart["stopped_ms"] >= 300
    assert on_disk == summary


def test_too_few_spark_slots_is_one_clear_error(spark, kafka_run):
    from txbroker.bench.trace.kafka_replay import replay

    work, _ = kafka_run
    slots = spark.sparkContext.defaultParallelism
    with pytest.raises(SpecError, match=rf"Spark has {slots} task slots.* {slots} replay tasks "
                                        rf"\+ 1 delivery tasks"):
        replay(spark, work / "trace", "127.0.0.1:1", work / "unused", tasks=slots, consumers=1)


def test_a_version_1_trace_reads_with_defaults(spark, tmp_path):
    """A trace written before version 2 (no messages, topics, crash, restart_ms, no Kafka
    settings) reads with the defaults the Kafka replay relies on."""
    import json

    from txbroker.bench.trace.fs import WorkFS
    from txbroker.bench.trace.spec import TRACE_COLUMNS, TraceMeta, read_trace

    meta = default_meta(20, producers=2, broker=E2E_BROKER)
    uri = str(tmp_path / "trace")
    v1_columns = [c for c in TRACE_COLUMNS if c not in ("messages", "topics", "crash", "restart_ms")]
    build(spark, meta, partitions=1).select(*v1_columns).write.parquet(uri)
    meta.write(WorkFS(spark), uri)
    path = tmp_path / "trace" / "_txbroker_trace.json"
    raw = json.loads(path.read_text())
    v1 = {k: raw[k] for k in ("transactions", "seed", "topics", "producers", "rate", "mix",
                              "body_bytes", "local_tx_ms", "broker")}
    path.write_text(json.dumps({**v1, "version": 1}))
    (path.parent / f".{path.name}.crc").unlink()  # Hadoop's checksum of the version-2 file
    read = TraceMeta.read(WorkFS(spark), uri)
    assert (read.kafka.transaction_timeout_ms, read.consumers, read.consumer_restarts) == (
        10_000, 2, [])
    rows = read_trace(spark, uri, read).collect()
    assert len(rows) == 20
    assert {(r.messages, tuple(r.topics) == (r.topic,), r.crash, r.restart_ms) for r in rows} == {
        (1, True, False, None)}


def test_no_kafka_listener_is_one_line_naming_the_address(spark, kafka_run):
    from txbroker.bench.chaos.process import free_port
    from txbroker.bench.trace.kafka_replay import replay

    work, _ = kafka_run
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(OSError) as caught:
        replay(spark, work / "trace", address, work / "unused", tasks=1, consumers=1)
    assert caught.value.filename == address
    assert caught.value.strerror.startswith("no Kafka listener answers")
    assert "\n" not in caught.value.strerror


@pytest.mark.slow
def test_a_delivery_consumer_restarted_at_once_stops_cleanly():
    """A trace restart due when the task's consumer has just started: stop() must not raise."""
    from txbroker.bench.trace.kafka_deliveries import DeliveryConsumer, DeliveryParams
    from txbroker.bench.trace.kafka_replay import create_topics

    async def start_stop(bootstrap: str) -> dict:
        await create_topics(bootstrap, ["RestartT"])
        p = DeliveryParams(bootstrap, "run", 0.0, (("RestartT", 0),), 1, (), 10.0, None)
        consumer = DeliveryConsumer(p, [("RestartT", 0)])
        for _ in range(3):
            await consumer.start()
            await consumer.stop()
        return consumer.next_offset

    with EmbeddedBroker(E2E_BROKER) as broker:
        assert asyncio.run(start_stop(broker.bootstrap)) == {("RestartT", 0): 0}
