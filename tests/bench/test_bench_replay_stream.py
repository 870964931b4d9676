"""The streaming RocketMQ replay against a real broker (embedded ``txbroker serve``), on a trace
with the version-2 columns: rows of several messages over several topics (N halves, all
decided alike) and crash rows (the half's producer instance dies before deciding; the group's
other instance answers the checks).  Results are read back directly."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
from bench_helpers import E2E_BROKER

from txbroker.bench.trace.embedded import EmbeddedBroker
from txbroker.bench.trace.fs import WorkFS
from txbroker.bench.trace.generate import build, default_meta
from txbroker.bench.trace.replay import RESULTS_META, replay

ROWS = 400


def _trace_v2(spark, meta, out) -> None:
    """generate's rows plus the version-2 columns: 1-3 messages over the two topics, and
    every second ``unknown`` row a crash."""
    from pyspark.sql import functions as F

    df = build(spark, meta)
    n = (F.col("id") % 3 + 1).cast("int")
    other = F.when(F.col("topic") == "BenchT0", F.lit("BenchT1")).otherwise(F.lit("BenchT0"))
    df = (df.withColumn("messages", n)
          .withColumn("topics", F.slice(F.array(F.col("topic"), other, F.col("topic")), 1, n))
          .withColumn("crash", (F.col("first_decision") == "unknown") & (F.col("id") % 2 == 0))
          .withColumn("restart_ms", F.lit(None).cast("int")))
    df.write.parquet(str(out))
    meta.write(WorkFS(spark), WorkFS(spark).qualify(out))


def test_streaming_replay_of_multi_message_and_crash_rows(spark, tmp_path):
    meta = default_meta(ROWS, seed=11, topics=2, producers=2, rate=500.0, broker=E2E_BROKER)
    trace_dir, out = tmp_path / "trace", tmp_path / "results"
    _trace_v2(spark, meta, trace_dir)
    trace = {r["id"]: r for r in pq.read_table(trace_dir).to_pylist()}
    assert any(r["crash"] for r in trace.values()) and any(r["messages"] == 3 for r in trace.values())

    with EmbeddedBroker(E2E_BROKER) as broker:
        summary = replay(spark, trace_dir, broker.namesrv_addr, out, tasks=2, consumers=2,
                         concurrency=32, broker_pids=[broker.proc.pid])

    assert summary["protocol"] == "rocketmq" and summary["consumers"] == 2
    assert summary["broker_cpu_seconds"] > 0 and summary["driver_peak_rss_mb"] > 0
    assert summary["orphan_checks"] == 0  # no send failed: no half of a failed attempt
    assert json.loads((out / RESULTS_META).read_text())["run_id"] == summary["run_id"]
    results = pq.read_table(out / "transactions").to_pylist()
    assert sorted(r["id"] for r in results) == sorted(trace)  # each row emitted exactly once
    for got in results:
        row = trace[got["id"]]
        assert got["error"] is None and got["attempts"] == 1, got
        if row["kind"] == "never":
            assert got["final_state"] == "unknown", got
            # every half checked check-max times (scripted), then left to the broker
            assert got["check_phase"].count("undecided") == row["messages"] * row["expected_checks"]
        else:
            assert got["final_state"] == row["expected_outcome"], (row, got)
        if row["first_decision"] == "unknown":
            assert got["first_state"] == "unknown" and got["abandoned_ms"] is not None, got
            assert got["resolved_ms"] >= got["abandoned_ms"], got
        else:
            assert got["abandoned_ms"] is None and got["resolved_ms"] is None, got

    # Every message of a committed row delivered once, on its own topic; nothing else.
    deliveries = pq.read_table(out / "deliveries").to_pylist()
    assert {d["consumer"] for d in deliveries} == {0, 1}
    got = Counter((d["tx"], d["msg"], d["topic"]) for d in deliveries)
    want = Counter((r["id"], i, r["topics"][i]) for r in trace.values()
                   if r["expected_outcome"] == "commit" for i in range(r["messages"]))
    assert got == want
    assert summary["deliveries"] == len(deliveries)


def test_rows_wait_for_late_check_passes(spark, tmp_path):
    """A broker whose check passes come slower than the trace's settings say (as a loaded one
    does): every scripted check still reaches its row, because each check moves the row's
    settle deadline on.  Trace: 1 s timeout, 0.5 s interval, 2 checks (settle 5 s); broker:
    the same but a pass every 3 s, so the second check comes up to 7 s after the send."""
    from txbroker.bench.trace.generate import generate
    from txbroker.bench.trace.spec import BrokerSettings

    said = BrokerSettings(transaction_timeout=1.0, transaction_check_interval=0.5,
                          transaction_check_max=2)
    meta = default_meta(200, seed=4, topics=1, producers=2, rate=200.0, broker=said,
                        mix={"commit": 0.2, "rollback": 0.0, "unknown_commit": 0.4,
                             "unknown_rollback": 0.0, "never": 0.4})
    trace_dir, out = tmp_path / "trace", tmp_path / "results"
    generate(spark, meta, trace_dir)
    trace = {r["id"]: r for r in pq.read_table(trace_dir).to_pylist()}
    slow = BrokerSettings(transaction_timeout=1.0, transaction_check_interval=3.0,
                          transaction_check_max=2)
    with EmbeddedBroker(slow) as broker:
        replay(spark, trace_dir, broker.namesrv_addr, out, tasks=2, consumers=2, concurrency=32)
    results = pq.read_table(out / "transactions").to_pylist()
    assert len(results) == len(trace)
    late = []
    for got in results:
        row = trace[got["id"]]
        if got["check_phase"].count("undecided") != row["expected_checks"]:
            late.append((row["id"], row["kind"], [round(c - got["return_ms"]) for c in got["check_ms"]]))
        elif row["kind"] != "never":
            assert got["final_state"] == row["expected_outcome"], (row, got)
    assert not late, late[:10]
