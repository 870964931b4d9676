"""``bench run --resume WORK`` after the driver died: the real CLI in subprocesses, the first
killed (its whole process group: the driver, its JVM and the embedded broker, as when the
machine goes down) once the replay phase started; the resumed run keeps the trace, replays
against a fresh broker and finds every outcome as the trace says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TRANSACTIONS = 3000

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark"), pytest.mark.timeout(900)]


def _txbroker() -> str:
    return str(Path(sys.executable).parent / "txbroker")


def _table(stdout: str) -> dict[str, str]:
    return {c[0].strip(): c[1].strip() for c in
            (line.strip().strip("│").split("│") for line in stdout.splitlines()) if len(c) == 2}


def test_resume_after_a_killed_driver_skips_generate_and_passes(tmp_path):
    work = tmp_path / "work"
    first = subprocess.Popen([_txbroker(), "bench", "run", "-n", str(TRANSACTIONS),
                              "--work-dir", str(work)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        marker = work / "_phases" / "generate.json"
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert first.poll() is None, first.stdout.read().decode(errors="replace")
            assert time.monotonic() < deadline, "generate did not finish within 300 s"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        first.stdout.close()
    assert not (work / "_phases" / "replay-rocketmq.json").exists()
    options = json.loads((work / "run.json").read_text())
    assert options["meta"]["transactions"] == TRANSACTIONS
    trace_files = {p: p.stat().st_mtime_ns for p in (work / "trace").rglob("*") if p.is_file()}
    assert any(p.suffix == ".parquet" for p in trace_files)
    generated = marker.read_text()

    # No -n here: the options come from run.json.
    resumed = subprocess.run([_txbroker(), "bench", "run", "--resume", str(work)],
                             capture_output=True, text=True, timeout=600, check=False)
    context = f"exit {resumed.returncode}\n{resumed.stdout}\n{resumed.stderr[-3000:]}"
    assert resumed.returncode == 0, context
    table = _table(resumed.stdout)
    assert table.get("violations") == "0", context
    assert table.get("transactions") == f"{TRANSACTIONS:,}", context
    assert "generate (done before)" in resumed.stderr, context
    # The trace was not written again: same files, same mtimes, same marker.
    assert {p: p.stat().st_mtime_ns for p in (work / "trace").rglob("*") if p.is_file()} == trace_files
    assert marker.read_text() == generated
    for phase in ("replay-rocketmq", "verify-rocketmq", "report"):
        assert json.loads((work / "_phases" / f"{phase}.json").read_text())["phase"] == phase
    results = json.loads((work / "results" / "rocketmq" / "_txbroker_results.json").read_text())
    assert results["protocol"] == "rocketmq" and results["consumers"] >= 1
    assert results["broker_cpu_seconds"] > 0 and results["driver_peak_rss_mb"] > 0
    verified = json.loads((work / "results" / "rocketmq" / "verify.json").read_text())
    assert verified["violation_total"] == 0 and verified["transactions"] == TRANSACTIONS
