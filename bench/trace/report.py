"""``bench report``: Markdown plus four PNG plots from a verified results directory.

The figures come from ``verify.json``; the plots (:mod:`txbroker.bench.trace.plots`) from the raw event
times in the results Parquet: throughput over time, the latency distribution, latency over
time and check-backs (by kind and over time).  Spark reads the results wherever they live;
numpy and matplotlib draw on the driver.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from txbroker.bench.trace import plots
from txbroker.bench.trace.fs import WorkFS, join
from txbroker.bench.trace.plots import Events
from txbroker.bench.trace.spec import SpecError
from txbroker.bench.trace.verify import CHECK_KINDS, VERIFY_FILE, VIOLATIONS

FILES = ("report.md", "throughput.png", "latency_cdf.png", "latency_over_time.png",
         "checks.png")


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return f"{v:,}"


def pacing_text(p: dict) -> str:
    """``verify.json``'s ``pacing`` in words."""
    if p["mode"] == "schedule":
        return f"trace schedule ({p['rate']:,.0f} tx/s mean)"
    if p["mode"] == "rate":
        return f"fixed rate ({p['rate']:,.0f} tx/s, --replay-rate)"
    return "unthrottled (--replay-rate 0)"


def summary_notes(v: dict) -> list[str]:
    """What the summary's schedule lag means under this run's pacing (printed under it)."""
    p = v.get("pacing")
    if p is None:  # verified before pacing was recorded
        return []
    due = {"schedule": "its start time in the trace",
           "rate": "its trace id / the rate",
           "unthrottled": "the start of the replay (all at once)"}[p["mode"]]
    note = ("schedule_lag_ms: how late each transaction's send began after it was due "
            f"(due: {due}); a lag that grows means the replay could not keep up "
            "(--concurrency transactions in flight per task, the broker or the machine)")
    if p["mode"] == "unthrottled":
        note = ("schedule_lag_ms: unthrottled, every transaction is due at once, so this is "
                "the time each waited for one of the --concurrency in-flight slots per task, "
                "not lateness; throughput is the broker's ceiling, not the trace's load")
    return [note]


def summary_rows(v: dict) -> list[tuple[str, str]]:
    """The figures ``bench run`` prints and the report opens with."""
    lat = v["latency_ms"]
    rows = [("transactions", _fmt(v["transactions"]))]
    if "pacing" in v:
        rows.append(("replay pacing", pacing_text(v["pacing"])))
    rows += [
            ("throughput (tx/s, sends)", _fmt(v["throughput_tx_per_s"])),
            ("send window (s)", _fmt(v["send_seconds"])),
            ("deliveries / expected commits", f"{v['deliveries']:,} / {v['expected_commits']:,}"),
            ("checks expected / received as expected", f"{v['expected_checks']:,} / {v['checks']['expected']:,}")]
    for name in ("send_ms", "decision_ms", "end_to_end_ms", "schedule_lag_ms"):
        q = lat.get(name)
        if q is None:
            continue
        rows.append((f"{name} p50 / p99 / max", f"{_fmt(q.get('p50'))} / {_fmt(q.get('p99'))} / {_fmt(q.get('max'))}"))
    rows.append(("violations", _fmt(v["violation_total"])))
    return rows


def load_events(spark, results: str | Path) -> Events:
    """The run's event times from the results Parquet, in seconds since its first send.

    Read by Spark and brought to the driver as columns (Arrow when enabled), wherever the
    results live."""
    from pyspark.sql import functions as F

    uri = WorkFS(spark).qualify(results)
    txs = spark.read.parquet(join(uri, "transactions"))
    tx = txs.select("id", "start_ms", "half_ms", "decided_ms").toPandas()
    checks = (txs.select(F.explode(F.arrays_zip("check_ms", "check_phase")).alias("c"))
              .select("c.check_ms", "c.check_phase").toPandas())
    dl = spark.read.parquet(join(uri, "deliveries")).select("tx", "recv_ms").toPandas()

    def col(frame, name) -> np.ndarray:
        return frame[name].to_numpy(dtype=float, na_value=np.nan)

    start = col(tx, "start_ms")
    t0 = np.nanmin(start) if start.size and not np.all(np.isnan(start)) else 0.0
    ids = tx["id"].to_numpy()
    recv = col(dl, "recv_ms")
    # First delivery per transaction: sort by time, keep each id's first occurrence.
    order = np.argsort(recv, kind="stable")
    delivered, first = np.unique(dl["tx"].to_numpy()[order], return_index=True)
    first_recv = np.full(ids.size, np.nan)
    at = np.searchsorted(delivered, ids)
    hit = at < delivered.size
    hit[hit] = delivered[at[hit]] == ids[hit]
    first_recv[hit] = recv[order][first[at[hit]]]
    check = col(checks, "check_ms")
    phase = checks["check_phase"].to_numpy(dtype=object)

    def since(ms: np.ndarray) -> np.ndarray:
        return (ms - t0) / 1000.0

    return Events(start=since(start), half=since(col(tx, "half_ms")),
                  decided=since(col(tx, "decided_ms")), first_recv=since(first_recv),
                  recv=since(recv), check=since(check), check_phase=phase)


def report(spark, results: str | Path, out: str | Path) -> list[str]:
    """Write the report of a verified results directory to ``out`` (paths or URIs); return
    the URIs of the files written."""
    fs = WorkFS(spark)
    results_uri, out_uri = fs.qualify(results), fs.qualify(out)
    try:
        v = json.loads(fs.read_text(join(results_uri, VERIFY_FILE)))
    except FileNotFoundError:
        raise SpecError(f"{results_uri}: no {VERIFY_FILE}; run `txbroker bench verify` first") from None
    ev = load_events(spark, results_uri)
    pngs: dict[str, io.BytesIO] = {name: io.BytesIO() for name in FILES[1:]}
    n = v["transactions"]
    lat = v["latency_ms"]
    e2e = lat["end_to_end_ms"]
    b = v["broker"]
    plots.throughput(ev, f"Throughput: {n:,} transactions, {v['throughput_tx_per_s']:,.0f} tx/s "
                         f"sent over {v['send_seconds']:,.1f} s; {v['deliveries']:,} delivered "
                         f"within {ev.span:,.1f} s", pngs["throughput.png"])
    plots.latency_cdf(ev, f"Latency distribution: {n:,} transactions; end to end p50 "
                          f"{_fmt(e2e.get('p50'))} ms, p99 {_fmt(e2e.get('p99'))} ms "
                          f"(check-backs answer after ≥ {b['transaction_timeout']:g} s)",
                      pngs["latency_cdf.png"])
    plots.latency_over_time(ev, "Latency by send time: p50 (solid) and p99 (dashed) per bucket; "
                            "a gap is a bucket in which no transaction started",
                            pngs["latency_over_time.png"])
    bad = v["checks"].get("unexpected", 0) + v["checks"].get("duplicate", 0)
    plots.checks(ev, {k: v["checks"].get(k, 0) for k in CHECK_KINDS}, v["expected_checks"],
                 f"Check-backs: {v['checks'].get('expected', 0):,} as scripted of "
                 f"{v['expected_checks']:,}, {bad:,} violating; broker checks every "
                 f"{b['transaction_check_interval']:g} s after {b['transaction_timeout']:g} s, "
                 f"at most {b['transaction_check_max']} times", pngs["checks.png"])

    lines = [f"# txbroker bench report (run {v.get('run_id')})", "",
             "**PASS**: no violations." if v["violation_total"] == 0 else
             f"**FAIL**: {v['violation_total']:,} violations.", "",
             "| figure | value |", "|---|---:|"]
    lines += [f"| {k} | {val} |" for k, val in summary_rows(v)]
    notes = summary_notes(v)
    if notes:
        lines += [""] + [f"{n}." for n in notes]
    lines += ["", "## Transactions by kind", "", "| kind | count |", "|---|---:|"]
    lines += [f"| {k} | {n:,} |" for k, n in sorted(v["by_kind"].items())]
    lines += ["", "## Violations", "", "| kind | count | sample trace ids |", "|---|---:|---|"]
    lines += [f"| {k} | {v['violations'][k]:,} | {', '.join(map(str, v['violation_samples'][k])) or '–'} |"
              for k in VIOLATIONS]
    lines += ["", "## Checks", "", "| kind | count |", "|---|---:|"]
    lines += [f"| {k} | {v['checks'].get(k, 0):,} |" for k in CHECK_KINDS]
    lines += ["", "## Latency (ms)", "", "| | n | p50 | p90 | p99 | p99.9 | max |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, q in v["latency_ms"].items():
        lines.append(f"| {name} | {q['n']:,} | " + " | ".join(
            _fmt(q.get(k)) for k in ("p50", "p90", "p99", "p99.9", "max")) + " |")
    settings = (f"Broker settings assumed by the trace: transaction_timeout "
                f"{b['transaction_timeout']} s, check interval {b['transaction_check_interval']} s, "
                f"check max {b['transaction_check_max']}.")
    buckets = (f"Plots: time axes count seconds from the first send; throughput and check-backs "
               f"in {plots.fmt_seconds(plots.bucket_seconds(ev.span))} buckets, latency by "
               f"send time in {plots.fmt_seconds(plots.bucket_seconds(ev.send_span))} buckets.")
    lines += ["", settings, "", buckets, "",
              "![throughput](throughput.png)", "", "![latency distribution](latency_cdf.png)", "",
              "![latency over time](latency_over_time.png)", "", "![check-backs](checks.png)", ""]
    for name, png in pngs.items():
        fs.write_bytes(join(out_uri, name), png.getvalue())
    fs.write_text(join(out_uri, "report.md"), "\n".join(lines))
    return [join(out_uri, f) for f in FILES]
