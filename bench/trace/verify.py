"""``bench verify``: Spark joins of the trace's expectations with what a replay did, reduced to
counts, percentiles and histograms before anything reaches the driver (so its memory does not
grow with the trace: at most ``sample`` ids per violation and a few hundred aggregate rows).

Violations (any one makes ``verify`` fail), counted per message ``(tx, msg)`` where a
transaction has several, else per transaction or per check:

* ``committed_not_delivered`` — a message of an expected commit never delivered;
* ``aborted_but_delivered`` — a message of an expected rollback or discard delivered;
* ``delivered_twice`` — the same ``(tx, msg)`` at two different ``(topic, queue_id,
  queue_offset)``: a duplicate in the log.  The same offset received again (a consumer
  restarting from its committed offset) is a *redelivery*, counted but not a violation;
* ``partial_delivery`` — an expected commit of which some but not all messages arrived;
* ``unknown_delivery`` — a delivered ``(tx, msg)`` of this run that no trace row names;
* ``send_failed`` — the transaction could not be sent;
* ``outcome_mismatch`` — the producer's last word differs from the expectation (e.g. a check
  never came, so an ``unknown_commit`` row was never committed);
* ``unexpected_checks`` — a check for a half the producer had decided more than ``grace_ms``
  earlier (RocketMQ #1517 / #9640);
* ``duplicate_checks`` — more checks of an undecided half than the trace scripts (more than
  ``transaction_check_max`` for a ``never`` row);
* ``missing_checks`` — fewer (check counts burned without a check, RocketMQ #8311).

The three check figures apply to RocketMQ only: Kafka has no check-back, its results carry
empty check arrays, so they are 0 by construction there (``checks_apply`` says which).
Checks arriving while the local transaction still ran (``early``) or within ``grace_ms`` of the
producer's decision (``raced``: the one-way END_TRANSACTION crossed the check) are reported, not
violations.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from txbroker.bench.trace.fs import WorkFS, join
from txbroker.bench.trace.plots import bucket_count, bucket_seconds
from txbroker.bench.trace.replay import RESULTS_META
from txbroker.bench.trace.spec import SpecError, TraceMeta

VERIFY_FILE = "verify.json"
#: A fault schedule the fault harness ran during the replay, beside the results.
FAULTS_FILE = "faults.json"
VIOLATIONS = ("committed_not_delivered", "aborted_but_delivered", "delivered_twice",
              "partial_delivery", "unknown_delivery", "send_failed", "outcome_mismatch",
              "unexpected_checks", "duplicate_checks", "missing_checks")
CHECK_VIOLATIONS = ("unexpected_checks", "duplicate_checks", "missing_checks")
CHECK_KINDS = ("expected", "early", "raced", "unexpected", "duplicate")
CHECK_PHASES = ("running", "undecided", "decided")
LATENCIES = ("send_ms", "decision_ms", "end_to_end_ms", "schedule_lag_ms")
_PCTS = (0.5, 0.9, 0.99, 0.999)
#: Latency histograms: 10 log-spaced bins per decade from 0.1 ms to 100 s, enough to draw a
#: distribution to within 26 % of a value; below and above the range are counted apart.
HIST_MIN_MS, HIST_MAX_MS, HIST_BINS_PER_DECADE = 0.1, 100_000.0, 10
HIST_BINS = round(math.log10(HIST_MAX_MS / HIST_MIN_MS)) * HIST_BINS_PER_DECADE
#: A fault without an end in faults.json counts as lasting this long.
DEFAULT_FAULT_MS = 10_000.0


def hist_edges() -> list[float]:
    """The latency histograms' bin edges (ms)."""
    return [HIST_MIN_MS * 10 ** (i / HIST_BINS_PER_DECADE) for i in range(HIST_BINS + 1)]


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


def read_faults(fs: WorkFS, results_uri: str) -> list[dict]:
    """``faults.json`` of a results directory (``[]`` without one), checked and sorted by time."""
    uri = join(results_uri, FAULTS_FILE)
    if not fs.exists(uri):
        return []
    try:
        faults = json.loads(fs.read_text(uri))
        out = [{"at_ms": float(f["at_ms"]), "action": str(f["action"]), "target": str(f["target"]),
                "until_ms": None if f.get("until_ms") is None else float(f["until_ms"])}
               for f in faults]
    except (ValueError, TypeError, KeyError) as exc:
        raise SpecError(f"{uri}: not a fault list [{{at_ms, action, target, until_ms}}]: "
                        f"{exc!r}") from None
    return sorted(out, key=lambda f: f["at_ms"])


def fault_end(f: dict) -> float:
    """When a fault stopped mattering (epoch ms): its ``until_ms``, else 10 s after it began."""
    return f["until_ms"] if f["until_ms"] is not None else f["at_ms"] + DEFAULT_FAULT_MS


def _default(df, name: str, value):
    """``df`` with ``name`` added as ``value`` when an older writer did not write it."""
    return df if name in df.columns else df.withColumn(name, value)


def verify(spark, trace_dir: str | Path, results_dir: str | Path, grace_ms: float = 500.0,
           sample: int = 10) -> dict:
    """Compute the verdict, write ``verify.json`` into the results directory and return it."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    fs = WorkFS(spark)
    results_uri = fs.qualify(results_dir)
    meta, run_meta, trace, results, deliveries = _load(spark, fs, fs.qualify(trace_dir), results_uri)
    faults = read_faults(fs, results_uri)
    protocol = run_meta.get("protocol", "rocketmq")
    checks_apply = protocol != "kafka"
    one = F.lit(1)

    # Version-1 traces and older results: one message per transaction, nothing abandoned.
    trace = _default(trace, "messages", one)
    results = _default(results, "abandoned_ms", F.lit(None).cast("double"))
    results = _default(results, "resolved_ms", F.lit(None).cast("double"))
    deliveries = _default(deliveries, "msg", F.lit(0))

    # Messages: what the trace expects, where each (tx, msg) landed in the log, and how often.
    expected = trace.select(F.col("id").alias("tx"), "expected_outcome",
                            F.explode(F.sequence(F.lit(0), F.col("messages") - 1)).alias("msg"))
    positions = (deliveries.groupBy("tx", "msg", "topic", "queue_id", "queue_offset")
                 .agg(F.min("recv_ms").alias("recv_ms"), F.max("recv_ms").alias("last_recv_ms"),
                      F.count(one).alias("received"))).cache()
    per_msg = positions.groupBy("tx", "msg").agg(F.count(one).alias("positions"),
                                                F.min("recv_ms").alias("first_recv_ms"))
    msgs = (expected.join(per_msg, ["tx", "msg"], "left")
            .withColumn("positions", F.coalesce("positions", F.lit(0))))
    commit = F.col("expected_outcome") == "commit"
    msg_conds = {"committed_not_delivered": commit & (F.col("positions") == 0),
                 "aborted_but_delivered": ~commit & (F.col("positions") > 0),
                 "delivered_twice": F.col("positions") > 1}
    per_tx_msgs = msgs.groupBy("tx").agg(
        *[F.sum(c.cast("int")).alias(n) for n, c in msg_conds.items()],
        F.sum((F.col("positions") > 0).cast("int")).alias("delivered_msgs"),
        F.max("first_recv_ms").alias("full_recv_ms"))
    unknown = per_msg.join(expected, ["tx", "msg"], "left_anti")

    # Checks: each classified by when it came; counted per transaction.
    checks = (results.select("id", "decided_ms", F.posexplode(F.arrays_zip("check_ms", "check_phase"))
                             .alias("n", "c"))
              .select("id", "decided_ms", "n", F.col("c.check_ms").alias("at"),
                      F.col("c.check_phase").alias("phase")))
    undecided_rank = F.sum(F.when(F.col("phase") == "undecided", 1).otherwise(0)).over(
        Window.partitionBy("id").orderBy("n").rowsBetween(Window.unboundedPreceding, 0))
    checks = (checks.withColumn("ordinal", undecided_rank)
              .join(trace.select("id", "expected_checks"), "id")
              .withColumn("kind",
                          F.when(F.col("phase") == "running", "early")
                          .when((F.col("phase") == "decided") & (F.col("at") - F.col("decided_ms") > grace_ms),
                                "unexpected")
                          .when(F.col("phase") == "decided", "raced")
                          .when(F.col("ordinal") <= F.col("expected_checks"), "expected")
                          .otherwise("duplicate"))).cache()
    per_tx_checks = checks.groupBy("id").agg(
        F.sum((F.col("kind") == "unexpected").cast("int")).alias("unexpected_checks"),
        F.sum((F.col("kind") == "duplicate").cast("int")).alias("duplicate_checks"),
        F.sum((F.col("phase") == "undecided").cast("int")).alias("scripted_got"))

    # One row per transaction: expectation, result, message and check counts.
    expected_final = (F.when(F.col("expected_outcome") == "discard", F.lit("unknown"))
                      .otherwise(F.col("expected_outcome")))
    counted = [*msg_conds, "unexpected_checks", "duplicate_checks", "scripted_got", "delivered_msgs"]
    tx = (trace.select("id", "kind", "expected_outcome", "expected_checks", "messages")
          .join(results.drop("task"), "id", "left")
          .join(per_tx_msgs.withColumnRenamed("tx", "id"), "id", "left")
          .join(per_tx_checks, "id", "left")
          .fillna(0, subset=counted))
    tx_conds = {
        **{n: F.col(n) for n in msg_conds},
        "partial_delivery": (commit & (F.col("delivered_msgs") > 0)
                             & (F.col("delivered_msgs") < F.col("messages"))).cast("int"),
        "send_failed": (F.col("error").isNotNull() | F.col("start_ms").isNull()).cast("int"),
        "outcome_mismatch": (F.col("error").isNull()
                             & ~F.col("final_state").eqNullSafe(expected_final)).cast("int"),
        "unexpected_checks": F.col("unexpected_checks"),
        "duplicate_checks": F.col("duplicate_checks"),
        "missing_checks": (F.lit(checks_apply)
                           & (F.col("scripted_got") < F.col("expected_checks"))).cast("int"),
    }
    tx = (tx.select("id", "kind", "expected_outcome", "expected_checks", "messages",
                    "delivered_msgs", "start_ms",
                    "scheduled_ms", "half_ms", "decided_ms", "return_ms", "final_state", "error",
                    "abandoned_ms", "resolved_ms", "full_recv_ms",
                    *[c.alias(f"v_{n}") for n, c in tx_conds.items()])
          .withColumn("bad", sum((F.col(f"v_{n}") for n in tx_conds), F.lit(0)))
          .withColumn("committed", (F.col("error").isNull() & (F.col("final_state") == "commit"))
                      .cast("int"))).cache()
    lat = {"send_ms": F.col("half_ms") - F.col("start_ms"),
           "decision_ms": F.col("decided_ms") - F.col("start_ms"),
           # A transaction reaches its reader when its last message does.
           "end_to_end_ms": F.when(F.col("delivered_msgs") == F.col("messages"),
                                   F.col("full_recv_ms") - F.col("start_ms")),
           "schedule_lag_ms": F.col("start_ms") - F.col("scheduled_ms"),
           "resolution_ms": F.col("resolved_ms") - F.col("abandoned_ms")}

    # One pass for the counts, the percentiles and the run's span.
    aggs = [F.sum(f"v_{n}").alias(n) for n in tx_conds]
    aggs += [F.count(one).alias("rows"), F.sum("committed").alias("committed"),
             F.sum("messages").alias("messages"), F.count("abandoned_ms").alias("abandoned"),
             F.count(F.when(F.col("abandoned_ms").isNotNull() & F.col("resolved_ms").isNull(), 1))
             .alias("unresolved"),
             F.min("start_ms").alias("t0"), F.max("start_ms").alias("last_start"),
             F.max("return_ms").alias("last_return"),
             F.greatest(F.max("decided_ms"), F.max("resolved_ms"), F.max("full_recv_ms")).alias("last_event")]
    for name, c in lat.items():
        aggs += [F.percentile_approx(c, list(_PCTS), 10000).alias(f"{name}_p"),
                 F.max(c).alias(f"{name}_max"), F.count(c).alias(f"{name}_n")]
    row = tx.agg(*aggs).first()
    violations = {n: int(row[n] or 0) for n in tx_conds}
    violations["unknown_delivery"] = unknown.count()
    violations = {n: violations[n] for n in VIOLATIONS}

    samples = {}
    for name in VIOLATIONS:
        if not violations[name]:
            samples[name] = []
            continue
        df = (unknown.select(F.col("tx").alias("id")) if name == "unknown_delivery"
              else tx.filter(F.col(f"v_{name}") > 0).select("id"))
        samples[name] = sorted(r["id"] for r in df.distinct().limit(sample).collect())

    latency = {}
    for name in lat:
        ps = row[f"{name}_p"] or [None] * len(_PCTS)
        latency[name] = {"n": row[f"{name}_n"], "max": row[f"{name}_max"],
                         **{f"p{str(q * 100).rstrip('0').rstrip('.')}": v for q, v in zip(_PCTS, ps)}}
    resolution = latency.pop("resolution_ms")
    hists = _histograms(F, tx, lat)

    check_counts = dict.fromkeys(CHECK_KINDS, 0)
    by_check_kind = checks.groupBy("kind").agg(F.count(one).alias("n"), F.max("at").alias("last")).collect()
    check_counts.update({r["kind"]: r["n"] for r in by_check_kind})
    check_last = max([r["last"] for r in by_check_kind if r["last"] is not None], default=None)
    # A position received more than once is a redelivery (a consumer restart), not a duplicate.
    dspan = positions.agg(F.sum("received").alias("n"), F.max("last_recv_ms").alias("last")).first()
    delivered = int(dspan["n"] or 0)
    redeliveries = delivered - positions.count()

    t0 = row["t0"] or 0.0
    ends = [x for x in (row["last_return"], row["last_event"], dspan["last"], check_last) if x is not None]
    span_s = max([0.0, *[(x - t0) / 1000.0 for x in ends]])
    step = bucket_seconds(span_s)
    timeline, check_timeline = _timelines(F, tx, checks, t0, span_s, step)

    kinds = tx.groupBy("kind", "expected_outcome").agg(F.count(one).alias("n"),
                                                        F.sum("expected_checks").alias("c")).collect()
    by_kind, by_outcome = {}, {}
    for r in kinds:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + r["n"]
        by_outcome[r["expected_outcome"]] = by_outcome.get(r["expected_outcome"], 0) + r["n"]
    n_tx = sum(by_kind.values())
    sent_window_s = max(((row["last_return"] or t0) - t0) / 1000.0, 1e-3)
    committed = int(row["committed"] or 0)
    cpu = run_meta.get("broker_cpu_seconds")
    summary = {
        "run_id": run_meta.get("run_id"),
        "protocol": protocol,
        "transactions": n_tx,
        "messages": int(row["messages"] or 0),
        "by_kind": by_kind,
        "expected_commits": by_outcome.get("commit", 0),
        "committed": committed,
        "deliveries": delivered,
        "redeliveries": redeliveries,
        "expected_checks": int(sum(r["c"] or 0 for r in kinds)) if checks_apply else 0,
        "checks_apply": checks_apply,
        "checks": check_counts,
        "violations": violations,
        "violation_total": sum(violations.values()),
        "violation_samples": samples,
        "latency_ms": latency,
        "latency_hist_ms": {n: h for n, h in hists.items() if n != "resolution_ms"},
        "abandoned": {"n": int(row["abandoned"] or 0), "unresolved": int(row["unresolved"] or 0),
                      "resolution_ms": {"p50": resolution["p50"], "p99": resolution["p99"],
                                        "p999": resolution["p99.9"], "max": resolution["max"]},
                      "resolution_hist_ms": hists["resolution_ms"]},
        "send_seconds": sent_window_s,
        "throughput_tx_per_s": n_tx / sent_window_s,
        "committed_tx_per_s": committed / sent_window_s,
        "broker_cpu_seconds": cpu,
        "broker_cpu_us_per_tx": cpu * 1e6 / committed if cpu is not None and committed else None,
        "delivery_seconds": ((dspan["last"] or t0) - t0) / 1000.0,
        "t0_ms": t0,
        "span_seconds": span_s,
        "timeline_bucket_s": step,
        "timeline": timeline,
        "check_timeline": check_timeline,
        "faults": faults,
        "windows": _windows(F, tx, faults, t0, t0 + span_s * 1000.0) if faults else [],
        "broker": meta.broker.__dict__,
        "grace_ms": grace_ms,
        "pacing": pacing(run_meta.get("rate"), meta.rate),
    }
    for cached in (checks, tx, positions):
        cached.unpersist()
    fs.write_text(join(results_uri, VERIFY_FILE), json.dumps(summary, indent=2, default=float) + "\n")
    return summary


def _histograms(F, tx, lat: dict) -> dict[str, dict]:
    """Each latency's counts per :func:`hist_edges` bin, computed by Spark; values under
    0.1 ms (a clock step can even make one negative) count as ``under``, over 100 s as ``over``."""
    pairs = F.explode(F.array(*[F.struct(F.lit(n).alias("name"), c.cast("double").alias("v"))
                                for n, c in lat.items()])).alias("p")
    v = F.col("p.v")
    bin_ = (F.when(v < HIST_MIN_MS, -1).when(v >= HIST_MAX_MS, HIST_BINS)
            .otherwise(F.least(F.floor(F.log10(v / HIST_MIN_MS) * HIST_BINS_PER_DECADE),
                               F.lit(HIST_BINS - 1))).cast("int"))
    rows = (tx.select(pairs).filter(v.isNotNull()).select(F.col("p.name").alias("name"),
                                                          bin_.alias("bin"))
            .groupBy("name", "bin").count().collect())
    edges = hist_edges()
    out = {n: {"edges": edges, "counts": [0] * HIST_BINS, "under": 0, "over": 0} for n in lat}
    for r in rows:
        h = out[r["name"]]
        if r["bin"] < 0:
            h["under"] += r["count"]
        elif r["bin"] >= HIST_BINS:
            h["over"] += r["count"]
        else:
            h["counts"][r["bin"]] += r["count"]
    return out


def _timelines(F, tx, checks, t0: float, span_s: float, step: float) -> tuple[list[dict], list[dict]]:
    """Per bucket of ``step`` seconds since the first start: transactions started, decided,
    committed (decided commit) and fully delivered, the end-to-end p50 / p99 of those started
    in it; and check-backs by the producer's phase.  Grouped in Spark: at most 100 buckets
    reach the driver."""
    n = bucket_count(span_s, step)

    def bucket(c):
        return F.least(F.greatest(F.floor((c - F.lit(t0)) / (step * 1000.0)), F.lit(0)),
                       F.lit(n - 1)).cast("int")

    events = F.explode(F.array(
        F.struct(F.lit("started").alias("what"), F.col("start_ms").alias("at")),
        F.struct(F.lit("decided").alias("what"), F.col("decided_ms").alias("at")),
        F.struct(F.lit("committed").alias("what"),
                 F.when(F.col("committed") == 1, F.col("decided_ms")).alias("at")),
        F.struct(F.lit("delivered").alias("what"),
                 F.when(F.col("delivered_msgs") == F.col("messages"), F.col("full_recv_ms")).alias("at")),
    )).alias("e")
    counts = (tx.select(events).filter(F.col("e.at").isNotNull())
              .groupBy(F.col("e.what").alias("what"), bucket(F.col("e.at")).alias("b")).count()
              .collect())
    e2e = F.when(F.col("delivered_msgs") == F.col("messages"), F.col("full_recv_ms") - F.col("start_ms"))
    pcts = (tx.filter(F.col("start_ms").isNotNull())
            .groupBy(bucket(F.col("start_ms")).alias("b"))
            .agg(F.percentile_approx(e2e, [0.5, 0.99], 1000).alias("p")).collect())
    phases = (checks.groupBy(bucket(F.col("at")).alias("b"), "phase").count().collect())
    timeline = [{"t": round(b * step, 6), "started": 0, "decided": 0, "committed": 0,
                 "delivered": 0, "e2e_p50_ms": None, "e2e_p99_ms": None} for b in range(n)]
    for r in counts:
        timeline[r["b"]][r["what"]] = r["count"]
    for r in pcts:
        if r["p"] is not None:
            timeline[r["b"]]["e2e_p50_ms"], timeline[r["b"]]["e2e_p99_ms"] = r["p"]
    check_timeline = [{"t": round(b * step, 6), **dict.fromkeys(CHECK_PHASES, 0)} for b in range(n)]
    for r in phases:
        if r["phase"] in CHECK_PHASES:
            check_timeline[r["b"]][r["phase"]] += r["count"]
    return timeline, check_timeline


def _windows(F, tx, faults: list[dict], t0: float, t_end: float) -> list[dict]:
    """Violations and committed tx/s before the first fault, during each fault and after it,
    by transaction start time (a transaction that never started is in no window).  Cut points
    never go back in time, so overlapping faults give empty windows rather than double counts."""
    cuts, names = [], ["before the first fault"]
    for f in faults:
        what = f"{f['action']} {f['target']}"
        for at, name in ((f["at_ms"], f"during {what}"), (fault_end(f), f"after {what}")):
            cuts.append(max([at, *cuts]))
            names.append(name)
    index = sum(((F.col("start_ms") >= c).cast("int") for c in cuts), F.lit(0))
    got = {r["w"]: r for r in (tx.filter(F.col("start_ms").isNotNull())
                               .groupBy(index.alias("w"))
                               .agg(F.count(F.lit(1)).alias("transactions"),
                                    F.sum("committed").alias("committed"),
                                    F.sum("bad").alias("violations")).collect())}
    bounds = [t0, *cuts, t_end]
    out = []
    for i, name in enumerate(names):
        start, end = bounds[i], max(bounds[i], bounds[i + 1])
        if i == 0:
            start = min(start, end)
        r = got.get(i)
        secs = (end - start) / 1000.0
        committed = int(r["committed"] or 0) if r else 0
        out.append({"name": name, "from_ms": start, "to_ms": end,
                    "transactions": r["transactions"] if r else 0, "committed": committed,
                    "violations": int(r["violations"] or 0) if r else 0,
                    "committed_tx_per_s": committed / secs if secs > 0 else None})
    return out
