"""``bench report``: Markdown plus five PNG plots from one or two verified results directories
(one per protocol: RocketMQ half messages, Kafka transactions), side by side.

Everything comes from each directory's ``verify.json`` — figures, latency histograms, the
per-bucket timeline, fault windows — so the driver reads a few kilobytes however many
transactions ran; no per-transaction column is read.  Spark is only the way to the files
wherever they live (:class:`~txbroker.bench.trace.fs.WorkFS`); numpy and matplotlib draw on the
driver (:mod:`txbroker.bench.trace.plots`).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from txbroker.bench.trace import plots
from txbroker.bench.trace.fs import WorkFS, join
from txbroker.bench.trace.plots import Fault, Panel, Series
from txbroker.bench.trace.spec import SpecError
from txbroker.bench.trace.verify import (
    CHECK_KINDS,
    CHECK_VIOLATIONS,
    VERIFY_FILE,
    VIOLATIONS,
    fault_end,
)

FILES = ("report.md", "throughput.png", "latency_cdf.png", "latency_over_time.png",
         "checks.png", "abandoned.png")
#: Colour of each protocol in every plot.
COLOURS = {"rocketmq": "tab:blue", "kafka": "tab:orange"}


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
            ("checks expected / received as expected",
             f"{v['expected_checks']:,} / {v['checks']['expected']:,}" if v.get("checks_apply", True)
             else "n/a¹")]
    for name in ("send_ms", "decision_ms", "end_to_end_ms", "schedule_lag_ms"):
        q = lat.get(name)
        if q is None:
            continue
        rows.append((f"{name} p50 / p99 / max", f"{_fmt(q.get('p50'))} / {_fmt(q.get('p99'))} / {_fmt(q.get('max'))}"))
    rows += side_by_side_rows(v)
    rows.append(("violations", _fmt(v["violation_total"])))
    return rows


def side_by_side_rows(v: dict) -> list[tuple[str, str]]:
    """The figures that compare the two transaction designs (absent from a ``verify.json``
    written before they were computed)."""
    if "committed_tx_per_s" not in v:
        return []
    e2e = v["latency_ms"]["end_to_end_ms"]
    ab = v["abandoned"]
    res = ab["resolution_ms"]
    cpu = v.get("broker_cpu_us_per_tx")
    return [("committed tx/s", _fmt(v["committed_tx_per_s"])),
            ("end to end p50 / p99 / p99.9 (ms)",
             f"{_fmt(e2e.get('p50'))} / {_fmt(e2e.get('p99'))} / {_fmt(e2e.get('p99.9'))}"),
            ("broker CPU per committed transaction (µs)", _fmt(cpu)),
            ("abandoned transactions (unresolved)", f"{ab['n']:,} ({ab['unresolved']:,})"),
            ("abandoned until it stops mattering p50 / p99 (ms)",
             f"{_fmt(res.get('p50'))} / {_fmt(res.get('p99'))}"),
            ("redeliveries (same offset again)", _fmt(v["redeliveries"]))]


def _label(v: dict, others: list[dict]) -> str:
    p = v.get("protocol", "rocketmq")
    return p if sum(o.get("protocol", "rocketmq") == p for o in others) == 1 else f"{p} ({v.get('run_id')})"


def _faults(v: dict) -> list[Fault]:
    t0 = v.get("t0_ms") or 0.0
    return [Fault((f["at_ms"] - t0) / 1000.0, (fault_end(f) - t0) / 1000.0,
                  f"{f['action']} {f['target']}") for f in v.get("faults", [])]


def _panel(v: dict, label: str, timeline: str = "timeline") -> Panel:
    return Panel(label, v[timeline], v["timeline_bucket_s"], _faults(v))


def _violation_cell(v: dict, name: str) -> str:
    if name in CHECK_VIOLATIONS and not v.get("checks_apply", True):
        return "n/a¹"
    return _fmt(v["violations"][name])


def read_verified(fs: WorkFS, results_uri: str) -> dict:
    """A results directory's ``verify.json``."""
    try:
        v = json.loads(fs.read_text(join(results_uri, VERIFY_FILE)))
    except FileNotFoundError:
        raise SpecError(f"{results_uri}: no {VERIFY_FILE}; run `txbroker bench verify` first") from None
    if "timeline_bucket_s" not in v:
        raise SpecError(f"{join(results_uri, VERIFY_FILE)}: written by an older bench without the "
                        "aggregates the report draws; run `txbroker bench verify` again")
    return v


def report(spark, results_dirs: list[str | Path] | str | Path, out: str | Path) -> list[str]:
    """Write the report of one or two verified results directories (paths or URIs; one per
    protocol, drawn side by side) to ``out``; return the URIs of the files written."""
    if isinstance(results_dirs, (str, Path)):
        results_dirs = [results_dirs]
    fs = WorkFS(spark)
    out_uri = fs.qualify(out)
    vs = [read_verified(fs, fs.qualify(r)) for r in results_dirs]
    labels = [_label(v, vs) for v in vs]
    colours = [COLOURS.get(v.get("protocol", "rocketmq"), f"C{i + 2}") for i, v in enumerate(vs)]
    both = " vs ".join(labels)
    pngs: dict[str, io.BytesIO] = {name: io.BytesIO() for name in FILES[1:]}

    plots.throughput([_panel(v, lab) for v, lab in zip(vs, labels)],
                     f"Throughput ({both}): " + "; ".join(
                         f"{lab} {v['committed']:,} committed of {v['transactions']:,}, "
                         f"{v['committed_tx_per_s']:,.0f} tx/s" for v, lab in zip(vs, labels))
                     + ("; shaded: faults" if any(v.get("faults") for v in vs) else ""),
                     pngs["throughput.png"])
    series = []
    for v, lab, colour in zip(vs, labels, colours):
        lat = v["latency_ms"]
        series.append(Series(f"{lab} end to end", v["latency_hist_ms"]["end_to_end_ms"],
                             lat["end_to_end_ms"].get("p50"), lat["end_to_end_ms"].get("p99"),
                             "-", colour))
        series.append(Series(f"{lab} decision", v["latency_hist_ms"]["decision_ms"],
                             lat["decision_ms"].get("p50"), lat["decision_ms"].get("p99"),
                             "--", colour))
    sizes = " and ".join(f"{v['transactions']:,}" for v in vs)
    plots.latency_cdf(series, f"Latency ({both}): end to end (solid: last message received) and "
                              f"decision (dashed: commit / abort sent), {sizes} transactions",
                      pngs["latency_cdf.png"])
    plots.latency_over_time([_panel(v, lab) for v, lab in zip(vs, labels)],
                            f"End-to-end latency by start time ({both}): p50 (solid) and p99 "
                            "(dashed) per bucket; a gap is a bucket with no delivered transaction",
                            pngs["latency_over_time.png"])
    rocket = [(v, lab) for v, lab in zip(vs, labels) if v.get("checks_apply", True)]
    if rocket:
        v, lab = rocket[0]
        b = v["broker"]
        bad = v["checks"].get("unexpected", 0) + v["checks"].get("duplicate", 0)
        plots.checks({k: v["checks"].get(k, 0) for k in CHECK_KINDS}, v["expected_checks"],
                     _panel(v, lab, "check_timeline"),
                     f"Check-backs ({lab}): {v['checks'].get('expected', 0):,} as scripted of "
                     f"{v['expected_checks']:,}, {bad:,} violating; broker checks every "
                     f"{b['transaction_check_interval']:g} s after {b['transaction_timeout']:g} s, "
                     f"at most {b['transaction_check_max']} times", pngs["checks.png"])
    else:
        plots.checks(dict.fromkeys(CHECK_KINDS, 0), 0, None,
                     "Check-backs: none (Kafka transactions have no check-back)", pngs["checks.png"])
    plots.latency_cdf([Series(lab, v["abandoned"]["resolution_hist_ms"],
                              v["abandoned"]["resolution_ms"].get("p50"),
                              v["abandoned"]["resolution_ms"].get("p99"), "-", colour)
                       for v, lab, colour in zip(vs, labels, colours)],
                      f"Abandoned transactions ({both}): time until one stops mattering "
                      "(RocketMQ: decisive check-back; Kafka: fenced or timed out); "
                      + ", ".join(f"{lab} {v['abandoned']['n']:,}" for v, lab in zip(vs, labels)),
                      pngs["abandoned.png"], xlabel="ms from abandoned to resolved (log scale)",
                      logit=False)

    lines = [f"# txbroker bench report ({both})", ""]
    for v, lab in zip(vs, labels):
        lines.append(f"**PASS** {lab}: no violations (run {v.get('run_id')})."
                     if v["violation_total"] == 0 else
                     f"**FAIL** {lab}: {v['violation_total']:,} violations (run {v.get('run_id')}).")
    lines += ["", "| figure | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(vs)]
    tables = [dict(summary_rows(v)) for v in vs]
    names = list(dict.fromkeys(n for t in tables for n in t))
    lines += [f"| {n} | " + " | ".join(t.get(n, "–") for t in tables) + " |" for n in names]
    lines += [f"| {k} | " + " | ".join(_violation_cell(v, k) for v in vs) + " |" for k in VIOLATIONS]
    notes = [n for v in vs for n in summary_notes(v)]
    if any(not v.get("checks_apply", True) for v in vs):
        notes.append("¹ check figures apply to RocketMQ only: Kafka transactions have no "
                     "check-back, so there is nothing to count")
    lines += [""] + [f"{n}." for n in dict.fromkeys(notes)]
    for v, lab in zip(vs, labels):
        lines += _details(v, lab, len(vs) > 1)
    lines += ["", "Plots: time axes count seconds from each run's first send, in " + ", ".join(
                  f"{plots.fmt_seconds(v['timeline_bucket_s'])} buckets ({lab})"
                  for v, lab in zip(vs, labels)) + "; faults are shaded and labelled.", "",
              "![throughput](throughput.png)", "", "![latency distribution](latency_cdf.png)", "",
              "![latency over time](latency_over_time.png)", "",
              "![abandoned transactions](abandoned.png)", "", "![check-backs](checks.png)", ""]
    for name, png in pngs.items():
        fs.write_bytes(join(out_uri, name), png.getvalue())
    fs.write_text(join(out_uri, "report.md"), "\n".join(lines))
    return [join(out_uri, f) for f in FILES]


def _details(v: dict, label: str, titled: bool) -> list[str]:
    """One protocol's tables: kinds, violations with sample ids, checks, latency, windows."""
    h = "###" if titled else "##"
    lines = [""] + ([f"## {label}", ""] if titled else [])
    lines += [f"{h} Transactions by kind", "", "| kind | count |", "|---|---:|"]
    lines += [f"| {k} | {n:,} |" for k, n in sorted(v["by_kind"].items())]
    lines += ["", f"{h} Violations", "", "| kind | count | sample trace ids |", "|---|---:|---|"]
    lines += [f"| {k} | {_violation_cell(v, k)} | "
              f"{', '.join(map(str, v['violation_samples'][k])) or '–'} |" for k in VIOLATIONS]
    if v.get("checks_apply", True):
        lines += ["", f"{h} Checks", "", "| kind | count |", "|---|---:|"]
        lines += [f"| {k} | {v['checks'].get(k, 0):,} |" for k in CHECK_KINDS]
    lines += ["", f"{h} Latency (ms)", "", "| | n | p50 | p90 | p99 | p99.9 | max |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, q in v["latency_ms"].items():
        lines.append(f"| {name} | {q['n']:,} | " + " | ".join(
            _fmt(q.get(k)) for k in ("p50", "p90", "p99", "p99.9", "max")) + " |")
    if v.get("windows"):
        lines += ["", f"{h} Around the faults (by transaction start time)", "",
                  "| window | from (s) | to (s) | transactions | committed tx/s | violations |",
                  "|---|---:|---:|---:|---:|---:|"]
        t0 = v["t0_ms"]
        lines += [f"| {w['name']} | {(w['from_ms'] - t0) / 1000:,.1f} | {(w['to_ms'] - t0) / 1000:,.1f} "
                  f"| {w['transactions']:,} | {_fmt(w['committed_tx_per_s'])} | {w['violations']:,} |"
                  for w in v["windows"]]
    b = v["broker"]
    if v.get("checks_apply", True):
        lines += ["", (f"Broker settings assumed by the trace: transaction_timeout "
                       f"{b['transaction_timeout']} s, check interval "
                       f"{b['transaction_check_interval']} s, check max {b['transaction_check_max']}.")]
    return lines
