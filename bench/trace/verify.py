"""``bench verify``: a Spark job joining the trace's expectations with what happened.

Violations (any one makes ``verify`` fail):

* ``committed_not_delivered`` — expected commit, never delivered;
* ``aborted_but_delivered`` — expected rollback or discard, delivered;
* ``delivered_twice`` — delivered more than once (counted per transaction);
* ``unknown_delivery`` — a delivery of this run naming no trace row;
* ``send_failed`` — the half could not be sent;
* ``outcome_mismatch`` — the producer's last word differs from the expectation (e.g. a check
  never came, so an ``unknown_commit`` row was never committed);
* ``unexpected_checks`` — a check for a half the producer had decided more than ``grace_ms``
  earlier (RocketMQ #1517 / #9640);
* ``duplicate_checks`` — more checks of an undecided half than the trace scripts (more than
  ``transaction_check_max`` for a ``never`` row);
* ``missing_checks`` — fewer (check counts burned without a check, RocketMQ #8311).

Checks arriving while the local transaction still ran (``early``) or within ``grace_ms`` of the
producer's decision (``raced``: the one-way END_TRANSACTION crossed the check) are reported, not
violations.
"""

from __future__ import annotations

import json
from pathlib import Path

from txbroker.bench.trace.fs import WorkFS, join
from txbroker.bench.trace.replay import RESULTS_META
from txbroker.bench.trace.spec import SpecError, TraceMeta

VERIFY_FILE = "verify.json"
VIOLATIONS = ("committed_not_delivered", "aborted_but_delivered", "delivered_twice",
              "unknown_delivery", "send_failed", "outcome_mismatch", "unexpected_checks",
              "duplicate_checks", "missing_checks")
CHECK_KINDS = ("expected", "early", "raced", "unexpected", "duplicate")
_PCTS = (0.5, 0.9, 0.99, 0.999)


def pacing(replay_rate: float | None, trace_rate: float) -> dict:
    """How the replay paced its sends (``verify.json``'s ``pacing``): ``schedule`` (each
    transaction due at its trace ``start_ms``; ``rate`` = the trace's mean), ``rate`` (row
    ``id / rate``, ``--rate R``) or ``unthrottled`` (``--rate 0``: all due at once, so the
    figures are the broker's ceiling, not the trace's load)."""
    if replay_rate is None:
        return {"mode": "schedule", "rate": trace_rate}
    if replay_rate == 0:
        return {"mode": "unthrottled", "rate": None}
    return {"mode": "rate", "rate": replay_rate}


def _load(spark, fs: WorkFS, trace_uri: str, results_uri: str):
    meta = TraceMeta.read(fs, trace_uri)
    try:
        run_meta = json.loads(fs.read_text(join(results_uri, RESULTS_META)))
    except FileNotFoundError:
        raise SpecError(f"{results_uri}: not a results directory (no {RESULTS_META}); "
                        "write one with `txbroker bench replay`") from None
    trace = spark.read.parquet(trace_uri)
    results = spark.read.parquet(join(results_uri, "transactions"))
    deliveries = spark.read.parquet(join(results_uri, "deliveries"))
    return meta, run_meta, trace, results, deliveries


def verify(spark, trace_dir: str | Path, results_dir: str | Path, grace_ms: float = 500.0,
           sample: int = 10) -> dict:
    """Compute the verdict, write ``verify.json`` into the results directory and return it."""
    from pyspark.sql import functions as F

    fs = WorkFS(spark)
    results_uri = fs.qualify(results_dir)
    meta, run_meta, trace, results, deliveries = _load(spark, fs, fs.qualify(trace_dir), results_uri)

    per_tx = deliveries.groupBy("tx").agg(F.count(F.lit(1)).alias("delivered"),
                                          F.min("recv_ms").alias("first_recv_ms"))
    j = (trace.withColumnRenamed("start_ms", "trace_start_ms")
         .join(results.drop("task"), "id", "left")
         .join(per_tx, trace["id"] == per_tx["tx"], "left")
         .withColumn("delivered", F.coalesce(F.col("delivered"), F.lit(0))))
    expected_final = (F.when(F.col("expected_outcome") == "discard", F.lit("unknown"))
                      .otherwise(F.col("expected_outcome")))

    checks = (results.select("id", "decided_ms", F.posexplode(F.arrays_zip("check_ms", "check_phase"))
                             .alias("n", "c"))
              .select("id", "decided_ms", "n", F.col("c.check_ms").alias("at"),
                      F.col("c.check_phase").alias("phase")))
    w = __import__("pyspark.sql.window", fromlist=["Window"]).Window
    undecided_rank = F.sum(F.when(F.col("phase") == "undecided", 1).otherwise(0)).over(
        w.partitionBy("id").orderBy("n").rowsBetween(w.unboundedPreceding, 0))
    checks = (checks.withColumn("ordinal", undecided_rank)
              .join(trace.select("id", "expected_checks"), "id")
              .withColumn("kind",
                          F.when(F.col("phase") == "running", "early")
                          .when((F.col("phase") == "decided") & (F.col("at") - F.col("decided_ms") > grace_ms),
                                "unexpected")
                          .when(F.col("phase") == "decided", "raced")
                          .when(F.col("ordinal") <= F.col("expected_checks"), "expected")
                          .otherwise("duplicate")))
    checks = checks.cache()
    j = j.cache()
    check_counts = dict.fromkeys(CHECK_KINDS, 0)
    check_counts.update({r["kind"]: r["count"] for r in checks.groupBy("kind").count().collect()})
    scripted = (checks.filter("phase = 'undecided'").groupBy("id").count()
                .withColumnRenamed("count", "got"))
    missing = (trace.filter("expected_checks > 0").join(scripted, "id", "left")
               .withColumn("got", F.coalesce("got", F.lit(0)))
               .filter("got < expected_checks"))

    # One pass over the joined table for the per-transaction violations.
    row_conds = {
        "committed_not_delivered": (F.col("expected_outcome") == "commit") & (F.col("delivered") == 0),
        "aborted_but_delivered": (F.col("expected_outcome") != "commit") & (F.col("delivered") > 0),
        "delivered_twice": F.col("delivered") > 1,
        "send_failed": F.col("error").isNotNull() | F.col("start_ms").isNull(),
        "outcome_mismatch": F.col("error").isNull() & ~F.col("final_state").eqNullSafe(expected_final),
    }
    counts = j.agg(*[F.sum(c.cast("int")).alias(n) for n, c in row_conds.items()]).first()
    violations = {n: int(counts[n] or 0) for n in row_conds}
    violations["unknown_delivery"] = None
    violations["unexpected_checks"] = check_counts["unexpected"]
    violations["duplicate_checks"] = check_counts["duplicate"]
    violations["missing_checks"] = None
    others = {
        "unknown_delivery": deliveries.join(trace, deliveries["tx"] == trace["id"], "left_anti")
                                      .withColumnRenamed("tx", "id"),
        "missing_checks": missing,
    }
    for name, df in others.items():
        violations[name] = df.count()
    violations = {n: violations[n] for n in VIOLATIONS}
    samples = {}
    for name in VIOLATIONS:
        if not violations[name]:
            samples[name] = []
            continue
        if name in row_conds:
            df = j.filter(row_conds[name])
        elif name in others:
            df = others[name]
        else:
            df = checks.filter(F.col("kind") == ("unexpected" if name == "unexpected_checks"
                                                 else "duplicate"))
        samples[name] = sorted(r["id"] for r in df.select("id").distinct().limit(sample).collect())

    lat = j.select((F.col("half_ms") - F.col("start_ms")).alias("send_ms"),
                   (F.col("decided_ms") - F.col("start_ms")).alias("decision_ms"),
                   (F.col("first_recv_ms") - F.col("start_ms")).alias("end_to_end_ms"),
                   (F.col("start_ms") - F.col("scheduled_ms")).alias("schedule_lag_ms"))
    aggs = []
    for col in lat.columns:
        aggs += [F.percentile_approx(col, list(_PCTS), 10000).alias(f"{col}_p"),
                 F.max(col).alias(f"{col}_max"), F.count(col).alias(f"{col}_n")]
    lrow = lat.agg(*aggs).first()
    latency = {}
    for col in lat.columns:
        ps = lrow[f"{col}_p"] or [None] * len(_PCTS)
        latency[col] = {"n": lrow[f"{col}_n"], "max": lrow[f"{col}_max"],
                        **{f"p{str(q * 100).rstrip('0').rstrip('.')}": v for q, v in zip(_PCTS, ps)}}

    span = results.agg(F.min("start_ms").alias("t0"), F.max("return_ms").alias("t1"),
                       F.max("decided_ms").alias("t2")).first()
    t0 = span["t0"] or 0.0
    dspan = deliveries.agg(F.min("recv_ms").alias("a"), F.max("recv_ms").alias("b"),
                           F.count(F.lit(1)).alias("n")).first()
    sent_window_s = max(((span["t1"] or t0) - t0) / 1000.0, 1e-3)
    timeline = _timeline(F, results, deliveries, t0)
    kinds = trace.groupBy("kind", "expected_outcome").agg(F.count(F.lit(1)).alias("n"),
                                                           F.sum("expected_checks").alias("c")).collect()
    by_kind, by_outcome = {}, {}
    for r in kinds:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + r["n"]
        by_outcome[r["expected_outcome"]] = by_outcome.get(r["expected_outcome"], 0) + r["n"]
    n_tx = sum(by_kind.values())
    summary = {
        "run_id": run_meta.get("run_id"),
        "transactions": n_tx,
        "by_kind": by_kind,
        "expected_commits": by_outcome.get("commit", 0),
        "deliveries": dspan["n"],
        "expected_checks": int(sum(r["c"] or 0 for r in kinds)),
        "checks": check_counts,
        "violations": violations,
        "violation_total": sum(violations.values()),
        "violation_samples": samples,
        "latency_ms": latency,
        "send_seconds": sent_window_s,
        "throughput_tx_per_s": n_tx / sent_window_s,
        "delivery_seconds": ((dspan["b"] or t0) - t0) / 1000.0,
        "timeline": timeline,
        "broker": meta.broker.__dict__,
        "grace_ms": grace_ms,
        "pacing": pacing(run_meta.get("rate"), meta.rate),
    }
    checks.unpersist()
    j.unpersist()
    fs.write_text(join(results_uri, VERIFY_FILE), json.dumps(summary, indent=2, default=float) + "\n")
    return summary


def _timeline(F, results, deliveries, t0: float) -> list[dict]:
    """Per-second counts of started, decided and delivered transactions since the first start."""
    def per_second(df, col, name):
        return (df.filter(F.col(col).isNotNull())
                .select(F.floor((F.col(col) - F.lit(t0)) / 1000).cast("int").alias("second"))
                .groupBy("second").count().withColumnRenamed("count", name))
    s = per_second(results, "start_ms", "started")
    d = per_second(results, "decided_ms", "decided")
    r = per_second(deliveries, "recv_ms", "delivered")
    rows = s.join(d, "second", "full").join(r, "second", "full").orderBy("second").collect()
    return [{"second": x["second"], "started": x["started"] or 0, "decided": x["decided"] or 0,
             "delivered": x["delivered"] or 0} for x in rows]
