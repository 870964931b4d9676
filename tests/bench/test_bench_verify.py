"""verify must be able to fail: a deliberately wrong result set reports each kind of violation,
and a redelivery of the same queue offset is counted but is none."""

from __future__ import annotations

import json
import shutil

from bench_helpers import read_rows, write_rows
from click.testing import CliRunner

from txbroker.bench.trace.verify import VIOLATIONS, verify
from txbroker.cli.main import main


def _copy(work, dest):
    shutil.copytree(work / "results" / "rocketmq", dest)
    for p in dest.rglob("verify.json"):
        p.unlink()
    return dest


def _pick(trace, kind, n=1, skip=()):
    out = [r for r in trace if r["kind"] == kind and r["id"] not in skip][:n]
    assert len(out) == n, f"trace has too few {kind} rows"
    return out


def test_each_violation_kind_is_reported(spark, e2e_run, tmp_path):
    work, _, _ = e2e_run
    res = _copy(work, tmp_path / "results")
    trace, _ = read_rows(work / "trace")
    used: set[int] = set()

    def take(kind):
        row = _pick(trace, kind, skip=used)[0]
        used.add(row["id"])
        return row["id"]

    missing_delivery, twice, failed, raced, unexpected, redelivered = (take("commit") for _ in range(6))
    wrongly_delivered, mismatch = take("rollback"), take("rollback")
    extra_check = take("never")
    lost_checks = take("unknown_commit")

    deliveries, dschema = read_rows(res / "deliveries")
    by_tx = {d["tx"]: d for d in deliveries}
    deliveries = [d for d in deliveries if d["tx"] != missing_delivery]
    # A second copy at another offset is a duplicate; the same offset again a redelivery.
    deliveries.append({**by_tx[twice], "queue_offset": by_tx[twice]["queue_offset"] + 10 ** 6})
    deliveries.append({**by_tx[redelivered], "recv_ms": by_tx[redelivered]["recv_ms"] + 1000})
    template = dict(by_tx[twice])
    deliveries.append({**template, "tx": wrongly_delivered})
    deliveries.append({**template, "tx": 10 ** 9})
    write_rows(res / "deliveries", deliveries, dschema)

    txs, tschema = read_rows(res / "transactions")
    for t in txs:
        if t["id"] == failed:
            t["error"] = "SendError: injected"
        elif t["id"] == mismatch:
            t["final_state"] = "commit"
        elif t["id"] in (raced, unexpected):
            late = 100.0 if t["id"] == raced else 5000.0
            t["check_ms"] = [*t["check_ms"], t["decided_ms"] + late]
            t["check_phase"] = [*t["check_phase"], "decided"]
        elif t["id"] == extra_check:
            t["check_ms"] = [*t["check_ms"], t["check_ms"][-1] + 500.0]
            t["check_phase"] = [*t["check_phase"], "undecided"]
        elif t["id"] == lost_checks:
            keep = [i for i, p in enumerate(t["check_phase"]) if p != "undecided"]
            t["check_ms"] = [t["check_ms"][i] for i in keep]
            t["check_phase"] = [t["check_phase"][i] for i in keep]
    write_rows(res / "transactions", txs, tschema)

    v = verify(spark, work / "trace", res)
    # One message per transaction here: nothing can be partly delivered.
    assert v["violations"] == {**dict.fromkeys(VIOLATIONS, 1), "partial_delivery": 0}, v["violations"]
    assert v["violation_total"] == len(VIOLATIONS) - 1
    assert v["redeliveries"] == 1
    assert v["violation_samples"]["committed_not_delivered"] == [missing_delivery]
    assert v["violation_samples"]["aborted_but_delivered"] == [wrongly_delivered]
    assert v["violation_samples"]["delivered_twice"] == [twice]
    assert v["violation_samples"]["unknown_delivery"] == [10 ** 9]
    assert v["violation_samples"]["send_failed"] == [failed]
    assert v["violation_samples"]["outcome_mismatch"] == [mismatch]
    assert v["violation_samples"]["unexpected_checks"] == [unexpected]
    assert v["violation_samples"]["duplicate_checks"] == [extra_check]
    assert v["violation_samples"]["missing_checks"] == [lost_checks]
    assert v["checks"]["raced"] == 1  # within the grace: reported, not a violation

    # The command's exit code follows the verdict.
    runner = CliRunner()
    bad = runner.invoke(main, ["bench", "verify", "--trace", str(work / "trace"),
                               "--results", str(res), "--master", "local[2]"])
    assert bad.exit_code == 1, bad.output
    assert "FAIL" in bad.output and "committed_not_delivered" in bad.output
    clean = _copy(work, tmp_path / "clean")
    good = runner.invoke(main, ["bench", "verify", "--trace", str(work / "trace"),
                                "--results", str(clean), "--master", "local[2]"])
    assert good.exit_code == 0, good.output
    assert "PASS" in good.output


def test_verify_refuses_a_directory_that_is_not_results(spark, e2e_run, tmp_path):
    work, _, _ = e2e_run
    r = CliRunner().invoke(main, ["bench", "verify", "--trace", str(work / "trace"),
                                  "--results", str(tmp_path)])
    assert r.exit_code == 2
    assert "not a results directory" in r.output


def test_the_summary_says_how_the_replay_was_paced(spark, e2e_run, tmp_path):
    """verify and the report say whether the replay kept to the trace schedule, a fixed rate
    or ran unthrottled (read from the results' metadata), and what schedule_lag_ms means then."""
    work, summary, _ = e2e_run
    assert summary["pacing"] == {"mode": "schedule", "rate": 2000.0}  # the e2e run's trace
    assert summary["latency_ms"]["schedule_lag_ms"]["n"] == summary["transactions"]
    for rate, words, meaning in ((None, "trace schedule (2,000 tx/s mean)", "due: its start time in the trace"),
                                 (250.0, "fixed rate (250 tx/s, --replay-rate)", "due: its trace id / the rate"),
                                 (0, "unthrottled (--replay-rate 0)", "not lateness")):
        res = _copy(work, tmp_path / f"results-{rate}")
        meta_file = res / "_txbroker_results.json"
        meta = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps({**meta, "rate": rate}))
        (res / "._txbroker_results.json.crc").unlink(missing_ok=True)  # Hadoop's checksum of the old text
        r = CliRunner().invoke(main, ["bench", "verify", "--trace", str(work / "trace"),
                                      "--results", str(res)])
        assert r.exit_code == 0, r.output
        lines = r.stdout.splitlines()
        assert f"replay pacing: {words}" in lines, r.stdout
        [note] = [line for line in lines if line.startswith("schedule_lag_ms: ")]
        assert meaning in note, note
        out = tmp_path / f"report-{rate}"
        rep = CliRunner().invoke(main, ["bench", "report", "--results", str(res), "--out", str(out)])
        assert rep.exit_code == 0, rep.output
        md = (out / "report.md").read_text()
        assert f"| replay pacing | {words} |" in md and "| schedule_lag_ms p50 / p99 / max |" in md
        assert meaning in md
