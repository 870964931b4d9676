"""``bench describe``: what a trace contains, from Spark aggregations over it.

A trace of ten million rows is described without bringing rows to the driver: every figure is
a count, a percentile, or a grouping whose size is bounded by the trace's options (kinds,
topics, messages per transaction, time buckets), never by its row count; the skew figures
order the per-producer and per-key counts in Spark and bring back only the top 1 %'s sum.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from txbroker.bench.trace.fs import WorkFS
from txbroker.bench.trace.spec import TraceMeta, read_trace

#: Time buckets of the arrivals line (one character each).
BUCKETS = 60
_BARS = "▁▂▃▄▅▆▇█"
_PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}


def describe(spark, trace_dir: str) -> dict:
    """The machine document ``bench describe --json`` prints."""
    from pyspark.sql import functions as F

    fs = WorkFS(spark)
    uri = fs.qualify(trace_dir)
    meta = TraceMeta.read(fs, uri)
    df = read_trace(spark, uri, meta)
    pct = F.lit(list(_PERCENTILES.values()))
    s = df.agg(F.count(F.lit(1)).alias("rows"), F.min("start_ms").alias("first"),
               F.max("start_ms").alias("last"),
               F.percentile_approx("local_tx_ms", pct).alias("local"),
               F.max("local_tx_ms").alias("local_max"),
               F.sum(F.col("crash").cast("int")).alias("crashes"),
               F.count("restart_ms").alias("restarts"),
               F.percentile_approx("restart_ms", pct).alias("restart"),
               F.max("restart_ms").alias("restart_max"),
               F.sum("messages").alias("messages"), F.max("messages").alias("messages_max"),
               F.sum((F.size(F.array_distinct("topics")) > 1).cast("int")).alias("multi_topic"),
               ).first()
    rows = s["rows"]
    first, last = s["first"] or 0, s["last"] or 0
    width = _round_width(math.ceil((last - first + 1) / BUCKETS))
    buckets = dict(df.groupBy(F.floor((F.col("start_ms") - first) / width).alias("b"))
                   .count().collect())
    span_s = (last - first) / 1000
    return {
        "trace": uri,
        "version": meta.version,
        "rows": rows,
        "span_s": span_s,
        "scheduled_span_s": meta.span_ms / 1000,
        "mean_rate": rows / span_s if span_s > 0 else None,
        "arrivals": {"bucket_s": width / 1000,
                     "counts": [buckets.get(b, 0) for b in range(math.ceil((last - first + 1) / width))]},
        "kinds": _counts(df, "kind"),
        "expected_outcomes": _counts(df, "expected_outcome"),
        "messages": {"total": s["messages"], "mean": s["messages"] / rows if rows else None,
                     "max": s["messages_max"], "per_transaction": _counts(df, "messages"),
                     "spanning_several_topics": s["multi_topic"]},
        "topics": _counts(df.select(F.explode("topics").alias("t")), "t"),
        "producers": _skew(df, "producer", meta.producers),
        "keys": _skew(df, "keys", meta.key_space),
        "local_tx_ms": _percentiles(s["local"], s["local_max"]),
        "crashes": s["crashes"],
        "restarts": {"n": s["restarts"], "restart_ms": _percentiles(s["restart"], s["restart_max"])},
        "consumers": meta.consumers,
        "consumer_restarts": [asdict(c) for c in meta.consumer_restarts],
        "broker": asdict(meta.broker),
        "kafka": asdict(meta.kafka),
        "generator": {"seed": meta.seed, "rate": meta.rate, "arrival": meta.arrival,
                      "producers": meta.producers, "producer_skew": meta.producer_skew,
                      "key_space": meta.key_space, "key_skew": meta.key_skew,
                      "mix": meta.mix, "messages": meta.messages, "local_tx_ms": meta.local_tx_ms,
                      "body_bytes": meta.body_bytes, "crash_fraction": meta.crash_fraction,
                      "restart_ms": meta.restart_ms},
    }


def _round_width(ms: int) -> int:
    """The smallest of 1, 2, 5 x 10^k ms that is at least ``ms``: buckets a reader can count."""
    for exp in range(16):
        for step in (1, 2, 5):
            if step * 10 ** exp >= ms:
                return step * 10 ** exp
    return ms


def _counts(df, column: str) -> dict:
    """Rows per value of a column whose values are few (kinds, topics, message counts)."""
    return {str(value): n for value, n in sorted(df.groupBy(column).count().collect())}


def _skew(df, column: str, space: int) -> dict:
    """How concentrated a column is: distinct values, the top one's share and the share of
    the top 1 % of the ``space`` values it is drawn from (at least one), counted and ordered
    in Spark.  1 % of the space, not of the values seen: under strong skew most values of the
    space never occur, and a share of what occurred would hide that."""
    from pyspark.sql import functions as F

    counts = df.groupBy(column).count()
    distinct = counts.count()
    top_n = max(1, math.ceil(space / 100))
    ranked = counts.orderBy(F.desc("count"), column)
    total = df.count()
    top = ranked.first()
    top_sum = ranked.limit(top_n).agg(F.sum("count")).first()[0]
    return {"distinct": distinct, "top": str(top[column]), "top_share": top["count"] / total,
            "top_1pct": top_n, "top_1pct_share": top_sum / total}


def _percentiles(values, maximum) -> dict | None:
    if values is None:
        return None
    out = dict(zip(_PERCENTILES, values, strict=True))
    return {**out, "max": maximum}


def sparkline(counts: list[int]) -> str:
    """One character per bucket, its height proportional to the count (the top bar = max)."""
    top = max(counts, default=0)
    if top == 0:
        return ""
    return "".join(_BARS[min(len(_BARS) - 1, c * len(_BARS) // (top + 1))] if c else " "
                   for c in counts)


def describe_text(d: dict) -> list[str]:
    """The document as lines for a person."""
    g = d["generator"]
    rate = f"{d['mean_rate']:,.1f} tx/s" if d["mean_rate"] else "-"
    arr = d["arrivals"]
    counts = arr["counts"]
    lines = [
        f"trace {d['trace']} (version {d['version']})",
        (f"rows: {d['rows']:,}; starts over {d['span_s']:,.1f} s, mean rate {rate} (arrival "
         f"{g['arrival']}, {g['rate']:,.0f} tx/s over {d['scheduled_span_s']:,.1f} s)"),
        (f"arrivals per {arr['bucket_s']:g} s: |{sparkline(counts)}| "
         f"min {min(counts, default=0):,} max {max(counts, default=0):,}"),
        "kinds: " + ", ".join(f"{k} {n:,}" for k, n in d["kinds"].items()),
        "expected outcomes: " + ", ".join(f"{k} {n:,}" for k, n in d["expected_outcomes"].items()),
    ]
    m = d["messages"]
    lines.append(f"messages: {m['total']:,} ({m['mean']:.2f} per transaction, max {m['max']}; "
                 f"{m['spanning_several_topics']:,} transactions span several topics)")
    lines.append("topics (messages): " + ", ".join(f"{t} {n:,}" for t, n in d["topics"].items()))
    for name, what in (("producers", "producer"), ("keys", "key")):
        s = d[name]
        space = g["producers"] if name == "producers" else g["key_space"]
        lines.append(f"{name}: {s['distinct']:,} of {space:,} occur; top {what} {s['top']} has "
                     f"{s['top_share'] * 100:.3g} %, top 1 % ({s['top_1pct']:,}) have "
                     f"{s['top_1pct_share'] * 100:.3g} % (skew {g[what + '_skew']:g})")
    lines.append(f"local_tx_ms: {_pct_text(d['local_tx_ms'])} ({g['local_tx_ms']})")
    r = d["restarts"]
    lines.append(f"producer crashes: {d['crashes']:,}; replacements: {r['n']:,}"
                 + (f", restart_ms {_pct_text(r['restart_ms'])}" if r["n"] else ""))
    restarts = ", ".join(f"consumer {c['consumer']} at {c['at_ms'] / 1000:g} s for {c['down_ms']} ms"
                         for c in d["consumer_restarts"]) or "none"
    lines.append(f"consumers: {d['consumers']}; restarts: {restarts}")
    b = d["broker"]
    lines.append(f"broker: transaction_timeout {b['transaction_timeout']:g} s, check interval "
                 f"{b['transaction_check_interval']:g} s, check max {b['transaction_check_max']}")
    lines.append(f"kafka: transaction timeout {d['kafka']['transaction_timeout_ms']:,} ms")
    return lines


def _pct_text(p: dict | None) -> str:
    if not p:
        return "-"
    return " ".join(f"{k} {v:,}" for k, v in p.items())
