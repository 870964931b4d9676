"""A few thousand transactions through a real broker: every outcome as the trace says."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
from bench_helpers import E2E_BROKER, E2E_TRANSACTIONS

from txbroker.bench.trace.plots import (
    MAX_BUCKETS,
    MIN_BUCKETS,
    bucket_count,
    bucket_seconds,
    fmt_seconds,
)
from txbroker.bench.trace.report import FILES
from txbroker.bench.trace.verify import VERIFY_FILE


def test_end_to_end_has_no_violations_and_the_scripted_checks(e2e_run):
    work, summary, timings = e2e_run
    assert summary["violation_total"] == 0, summary["violations"]
    assert summary["transactions"] == E2E_TRANSACTIONS
    trace = pq.read_table(work / "trace").to_pylist()
    commits = sum(r["expected_outcome"] == "commit" for r in trace)
    scripted = sum(r["expected_checks"] for r in trace)
    assert commits > 0 and scripted > 0
    # Every committed transaction delivered exactly once, nothing else.
    deliveries = pq.read_table(work / "results" / "rocketmq" / "deliveries").to_pylist()
    assert len(deliveries) == commits == summary["deliveries"]
    delivered = {d["tx"] for d in deliveries}
    assert delivered == {r["id"] for r in trace if r["expected_outcome"] == "commit"}
    # Exactly the scripted checks; a `never` row is checked check_max times, then discarded.
    assert summary["expected_checks"] == scripted
    assert summary["checks"]["expected"] == scripted
    assert summary["checks"]["duplicate"] == summary["checks"]["unexpected"] == 0
    results = {r["id"]: r for r in pq.read_table(work / "results" / "rocketmq" / "transactions").to_pylist()}
    for row in trace:
        got = results[row["id"]]
        undecided = [p for p in got["check_phase"] if p == "undecided"]
        assert len(undecided) == row["expected_checks"], (row, got)
        if row["kind"] == "never":
            assert len(undecided) == E2E_BROKER.transaction_check_max
            assert got["final_state"] == "unknown"
        else:
            assert got["final_state"] == row["expected_outcome"]
    on_disk = json.loads((work / "results" / "rocketmq" / VERIFY_FILE).read_text())
    assert on_disk["violation_total"] == 0
    assert set(timings) == {"generate", "replay-rocketmq", "verify-rocketmq", "report"}


def test_report_writes_markdown_and_plots(spark, e2e_run):
    from matplotlib.image import imread

    work, summary, _ = e2e_run
    assert FILES == ("report.md", "throughput.png", "latency_cdf.png", "latency_over_time.png",
                     "checks.png", "abandoned.png")
    drawn = [n for n in FILES[1:] if n != "abandoned.png" or summary["abandoned"]["n"]]
    for name in drawn:
        path = work / "report" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        pixels = imread(path)[..., :3]
        assert pixels.shape[0] >= 400 and pixels.shape[1] >= 800, (name, pixels.shape)
        # Drawn on, not a blank canvas: a fair share of ink, in several colours.
        ink = np.any(pixels < 0.9, axis=-1).mean()
        colours = len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0))
        assert ink > 0.03 and colours > 20, (name, ink, colours)
    text = (work / "report" / "report.md").read_text()
    assert "**PASS**" in text
    assert f"| transactions | {E2E_TRANSACTIONS:,} |" in text
    for name in FILES[1:]:
        assert f"]({name})" in text, name

    # The plots draw verify's per-bucket counts; a run of a few seconds gets sub-second buckets.
    span, step, timeline = summary["span_seconds"], summary["timeline_bucket_s"], summary["timeline"]
    assert 1.0 < span < 60.0 and step == bucket_seconds(span) < 1.0
    assert MIN_BUCKETS <= bucket_count(span, step) == len(timeline) <= MAX_BUCKETS
    assert f"in {fmt_seconds(step)} buckets (rocketmq)" in text
    assert sum(b["started"] for b in timeline) == E2E_TRANSACTIONS
    assert sum(b["delivered"] for b in timeline) == summary["deliveries"]
    assert sum(sum(b[p] for p in ("running", "undecided", "decided"))
               for b in summary["check_timeline"]) == sum(summary["checks"].values())
