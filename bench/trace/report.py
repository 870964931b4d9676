"""``bench report``: Markdown plus three PNG plots from a verified results directory.

Plots: throughput over time (started / decided / delivered per second), latency CDFs (send,
decision, end to end) and checks by kind.  matplotlib runs on the Agg backend: no display.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.trace.spec import SpecError
from bench.trace.verify import CHECK_KINDS, VERIFY_FILE, VIOLATIONS

FILES = ("report.md", "throughput.png", "latency_cdf.png", "checks.png")


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return f"{v:,}"


def summary_rows(v: dict) -> list[tuple[str, str]]:
    """The figures ``bench run`` prints and the report opens with."""
    lat = v["latency_ms"]
    rows = [("transactions", _fmt(v["transactions"])),
            ("throughput (tx/s, sends)", _fmt(v["throughput_tx_per_s"])),
            ("send window (s)", _fmt(v["send_seconds"])),
            ("deliveries / expected commits", f"{v['deliveries']:,} / {v['expected_commits']:,}"),
            ("checks expected / received as expected", f"{v['expected_checks']:,} / {v['checks']['expected']:,}")]
    for name in ("send_ms", "decision_ms", "end_to_end_ms"):
        q = lat[name]
        rows.append((f"{name} p50 / p99 / max", f"{_fmt(q.get('p50'))} / {_fmt(q.get('p99'))} / {_fmt(q.get('max'))}"))
    rows.append(("violations", _fmt(v["violation_total"])))
    return rows


def report(results_dir: str | Path, out: str | Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pyarrow.parquet as pq

    results_dir, out = Path(results_dir), Path(out)
    try:
        v = json.loads((results_dir / VERIFY_FILE).read_text())
    except FileNotFoundError:
        raise SpecError(f"{results_dir}: no {VERIFY_FILE}; run `txbroker bench verify` first") from None
    out.mkdir(parents=True, exist_ok=True)
    tx = pq.read_table(results_dir / "transactions",
                       columns=["id", "start_ms", "half_ms", "decided_ms"]).to_pydict()
    dl = pq.read_table(results_dir / "deliveries", columns=["tx", "recv_ms"]).to_pydict()

    tl = v["timeline"] or [{"second": 0, "started": 0, "decided": 0, "delivered": 0}]
    fig, ax = plt.subplots(figsize=(8, 4))
    for col in ("started", "decided", "delivered"):
        ax.plot([p["second"] for p in tl], [p[col] for p in tl], label=col)
    ax.set_xlabel("seconds since first send")
    ax.set_ylabel("transactions / s")
    ax.set_title("Throughput over time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=100)
    plt.close(fig)

    first_recv: dict[int, float] = {}
    for t, at in zip(dl["tx"], dl["recv_ms"]):
        if t not in first_recv or at < first_recv[t]:
            first_recv[t] = at
    series: dict[str, list[float]] = {"send": [], "decision": [], "end to end": []}
    for i, start, half, decided in zip(tx["id"], tx["start_ms"], tx["half_ms"], tx["decided_ms"]):
        if start is None:
            continue
        for name, at in (("send", half), ("decision", decided), ("end to end", first_recv.get(i))):
            if at is not None:
                series[name].append(at - start)
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, values in series.items():
        values.sort()
        if values:
            n = len(values)
            ax.plot(values, [k / n for k in range(1, n + 1)], label=name)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("ms since send_message_in_transaction was called")
    ax.set_ylabel("fraction of transactions")
    ax.set_title("Latency CDF")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(list(CHECK_KINDS), [v["checks"].get(k, 0) for k in CHECK_KINDS])
    ax.axhline(v["expected_checks"], color="gray", linestyle="--", label="scripted by the trace")
    ax.set_title("Checks received by kind")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "checks.png", dpi=100)
    plt.close(fig)

    lines = [f"# txbroker bench report (run {v.get('run_id')})", "",
             "**PASS**: no violations." if v["violation_total"] == 0 else
             f"**FAIL**: {v['violation_total']:,} violations.", "",
             "| figure | value |", "|---|---:|"]
    lines += [f"| {k} | {val} |" for k, val in summary_rows(v)]
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
    b = v["broker"]
    settings = (f"Broker settings assumed by the trace: transaction_timeout "
                f"{b['transaction_timeout']} s, check interval {b['transaction_check_interval']} s, "
                f"check max {b['transaction_check_max']}.")
    lines += ["", settings, "",
              "![throughput](throughput.png)", "", "![latency CDF](latency_cdf.png)", "",
              "![checks](checks.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    return [out / f for f in FILES]
