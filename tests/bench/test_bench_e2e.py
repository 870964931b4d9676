"""A few thousand transactions through a real broker: every outcome as the trace says."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from bench_helpers import E2E_BROKER, E2E_TRANSACTIONS

from bench.trace.report import FILES
from bench.trace.verify import VERIFY_FILE


def test_end_to_end_has_no_violations_and_the_scripted_checks(e2e_run):
    work, summary, timings = e2e_run
    assert summary["violation_total"] == 0, summary["violations"]
    assert summary["transactions"] == E2E_TRANSACTIONS
    trace = pq.read_table(work / "trace").to_pylist()
    commits = sum(r["expected_outcome"] == "commit" for r in trace)
    scripted = sum(r["expected_checks"] for r in trace)
    assert commits > 0 and scripted > 0
    # Every committed transaction delivered exactly once, nothing else.
    deliveries = pq.read_table(work / "results" / "deliveries").to_pylist()
    assert len(deliveries) == commits == summary["deliveries"]
    delivered = {d["tx"] for d in deliveries}
    assert delivered == {r["id"] for r in trace if r["expected_outcome"] == "commit"}
    # Exactly the scripted checks; a `never` row is checked check_max times, then discarded.
    assert summary["expected_checks"] == scripted
    assert summary["checks"]["expected"] == scripted
    assert summary["checks"]["duplicate"] == summary["checks"]["unexpected"] == 0
    results = {r["id"]: r for r in pq.read_table(work / "results" / "transactions").to_pylist()}
    for row in trace:
        got = results[row["id"]]
        undecided = [p for p in got["check_phase"] if p == "undecided"]
        assert len(undecided) == row["expected_checks"], (row, got)
        if row["kind"] == "never":
            assert len(undecided) == E2E_BROKER.transaction_check_max
            assert got["final_state"] == "unknown"
        else:
            assert got["final_state"] == row["expected_outcome"]
    on_disk = json.loads((work / "results" / VERIFY_FILE).read_text())
    assert on_disk["violation_total"] == 0
    assert set(timings) == {"generate", "replay", "verify", "report"}


def test_report_writes_markdown_and_plots(e2e_run):
    work, _summary, _ = e2e_run
    for name in FILES:
        path = work / "report" / name
        assert path.stat().st_size > 0, name
    assert (work / "report" / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (work / "report" / "report.md").read_text()
    assert "**PASS**" in text
    assert f"| transactions | {E2E_TRANSACTIONS:,} |" in text
