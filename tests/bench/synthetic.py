"""Results directories as a faithful replay would write them (contract of ``bench verify``),
built by Spark from a trace so that a test or a measurement of a million rows never holds the
rows in Python.  Tests then damage them on purpose with ``bench_helpers.read_rows/write_rows``.

Times: the run starts at :data:`T0_MS` (epoch ms); every committed message is delivered
``DELIVERY_MS`` after its transaction was decided, at a queue offset of its own."""

from __future__ import annotations

import json
from pathlib import Path

T0_MS = 1_800_000_000_000.0
DELIVERY_MS = 7.0
QUEUES = 4
#: What a Kafka producer that died mid-transaction waits for before its replacement starts.
RESTART_MS = 300.0


def with_messages(spark, trace_dir: Path, out: Path, messages: int) -> Path:
    """A copy of a version-1 trace whose every ``messages``-th row (from row 1) holds
    ``messages`` messages over as many topics: the contract's multi-message rows."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(trace_dir))
    n = F.when(F.col("id") % messages == 1, F.lit(messages)).otherwise(F.lit(1))
    df = (df.withColumn("messages", n)
          .withColumn("topics", F.transform(F.sequence(F.lit(0), n - 1),
                                            lambda i: F.when(i == 0, F.col("topic"))
                                            .otherwise(F.concat(F.col("topic"), F.lit("-"), i)))))
    df.write.parquet(str(out))
    (out / "_txbroker_trace.json").write_text((trace_dir / "_txbroker_trace.json").read_text())
    return out


def write_results(spark, trace_dir: Path, out: Path, protocol: str = "rocketmq",
                  broker_cpu_seconds: float | None = 2.0, faults: list[dict] | None = None) -> Path:
    """Write ``out/transactions``, ``out/deliveries`` and ``out/_txbroker_results.json`` for
    the trace, every row behaving as expected under ``protocol`` (rocketmq | kafka)."""
    from pyspark.sql import functions as F

    meta = json.loads((trace_dir / "_txbroker_trace.json").read_text())
    b = meta["broker"]
    timeout_ms, interval_ms = b["transaction_timeout"] * 1000.0, b["transaction_check_interval"] * 1000.0
    trace = spark.read.parquet(str(trace_dir))
    if "messages" not in trace.columns:
        trace = trace.withColumn("messages", F.lit(1)).withColumn("topics", F.array("topic"))
    kafka = protocol == "kafka"
    unknown = F.col("first_decision") == "unknown"
    # Renamed first: a later `start_ms` alias in the same select would shadow the trace's.
    trace = trace.withColumnRenamed("start_ms", "trace_start_ms")
    start = F.lit(T0_MS) + F.col("trace_start_ms")
    ret = start + F.col("local_tx_ms") + 3.0
    n_checks = F.col("expected_checks")
    checks = F.transform(F.sequence(F.lit(1), F.greatest(n_checks, F.lit(1))),
                         lambda k: start + timeout_ms + k * interval_ms)
    checks = F.when(n_checks > 0, checks).otherwise(F.array().cast("array<double>"))
    if kafka:
        checks = F.array().cast("array<double>")
        resolved = F.when(F.col("kind") == "never", ret + meta.get("kafka", {}).get(
            "transaction_timeout_ms", 10_000)).otherwise(ret + RESTART_MS)
        decided = F.when(~unknown, ret).when(F.col("kind") == "unknown_commit", ret + RESTART_MS + 5.0)
    else:
        last_check = F.element_at(checks, -1)
        resolved = last_check
        decided = F.when(~unknown, ret).when(F.col("kind") != "never", last_check)
    final = F.when(F.col("kind") == "never", F.lit("unknown")).otherwise(F.col("expected_outcome"))
    results = trace.select(
        "id", F.lit(0).alias("task"), start.alias("scheduled_ms"), start.alias("start_ms"),
        (start + 1.0).alias("half_ms"), decided.alias("decided_ms"), ret.alias("return_ms"),
        F.col("first_decision").alias("first_state"), final.alias("final_state"),
        checks.alias("check_ms"),
        F.transform(checks, lambda _: F.lit("undecided")).alias("check_phase"),
        F.lit(None).cast("string").alias("error"),
        F.when(unknown, ret).alias("abandoned_ms"), F.when(unknown, resolved).alias("resolved_ms"),
        F.when(F.lit(kafka) & (F.col("kind") == "unknown_commit"), 2).otherwise(1).alias("attempts"))
    results.write.parquet(str(out / "transactions"))

    queue = (F.col("id") % QUEUES).cast("int")
    deliveries = (results.join(trace.select("id", "messages", "topics", "expected_outcome"), "id")
                  .filter(F.col("expected_outcome") == "commit")
                  .select("id", "decided_ms", "topics",
                          F.explode(F.sequence(F.lit(0), F.col("messages") - 1)).alias("msg"))
                  .select(F.col("id").alias("tx"), F.col("msg").cast("int").alias("msg"),
                          F.element_at("topics", F.col("msg") + 1).alias("topic"),
                          queue.alias("queue_id"), (F.col("id") * 8 + F.col("msg")).alias("queue_offset"),
                          F.lit("").alias("msg_id"), F.lit("").alias("transaction_id"),
                          (F.col("decided_ms") + 1.0).alias("store_ms"),
                          (F.col("decided_ms") + DELIVERY_MS + F.col("msg")).alias("recv_ms"),
                          (queue % 2).alias("consumer")))
    deliveries.write.parquet(str(out / "deliveries"))
    (out / "_txbroker_results.json").write_text(json.dumps({
        "run_id": f"synthetic-{protocol}", "protocol": protocol, "consumers": 2, "rate": None,
        "broker_cpu_seconds": broker_cpu_seconds, "trace": meta}))
    if faults is not None:
        (out / "faults.json").write_text(json.dumps(faults))
    return out
