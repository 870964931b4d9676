"""``bench run --cluster 2 --fault-plan PLAN``: the trace against a 2-group cluster the bench
starts, with the master of one group SIGKILLed during the replay.  Nothing acknowledged may be
lost through the failover: the only violations allowed are transactions whose half could not
be sent while the group had no master (the client saw the error; the replay does not retry
them yet), each of which, on a commit row, also counts as not delivered.  The kill is
recorded beside the results, verify counts anomalies per fault window and the report marks
the fault on its time plots.  Kafka transactions through the same kill have no violation at
all: the promoted slave continues every producer's sequence, and a transaction the failover
failed runs again on a new instance of its transactional id."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(900)]

PLAN = """\
# seconds from each replay's first transaction
- {at: 3, action: kill-master, group: broker-a, restart_after: 4}
"""


def test_a_cluster_whose_master_is_killed_loses_nothing_acknowledged(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    work = tmp_path / "work"
    argv = [str(Path(sys.executable).parent / "txbroker"), "bench", "run", "-n", "2400",
            "--protocol", "rocketmq", "--cluster", "2", "--fault-plan", str(plan),
            "--replay-rate", "200", "--producers", "8", "--work-dir", str(work),
            "--master", "local[4]"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=840, check=False,
                         stdin=subprocess.DEVNULL)
    context = f"exit {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr[-4000:]}"
    assert run.returncode == 0, context
    for protocol in ("rocketmq",):
        results = work / "results" / protocol
        faults = json.loads((results / "faults.json").read_text())
        assert [f["action"] for f in faults] == ["kill-master"], (protocol, faults)
        assert faults[0]["target"].startswith("broker-a-"), faults
        verified = json.loads((results / "verify.json").read_text())
        bad = verified["violations"]
        failed = bad["send_failed"]
        assert bad["committed_not_delivered"] <= failed, bad
        assert verified["violation_total"] - bad["committed_not_delivered"] - failed == 0, bad
        assert verified["deliveries"] >= verified["expected_commits"] - failed > 0
        windows = verified["windows"]
        assert len(windows) >= 2, windows  # before the kill, during / after it
    report = (work / "report" / "report.md").read_text()
    assert "kill-master" in report
    for name in ("latency_cdf.png", "throughput.png"):
        assert (work / "report" / name).stat().st_size > 10_000


def test_kafka_transactions_through_a_master_kill_have_no_violation(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    work = tmp_path / "work"
    argv = [str(Path(sys.executable).parent / "txbroker"), "bench", "run", "-n", "2400",
            "--protocol", "kafka", "--cluster", "2", "--fault-plan", str(plan),
            "--replay-rate", "200", "--producers", "8", "--work-dir", str(work),
            "--master", "local[4]"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=840, check=False,
                         stdin=subprocess.DEVNULL)
    context = f"exit {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr[-4000:]}"
    assert run.returncode == 0, context
    results = work / "results" / "kafka"
    faults = json.loads((results / "faults.json").read_text())
    assert [f["action"] for f in faults] == ["kill-master"], faults
    assert faults[0]["target"].startswith("broker-a-"), faults
    verified = json.loads((results / "verify.json").read_text())
    assert verified["violation_total"] == 0, verified["violations"]
    assert verified["deliveries"] >= verified["expected_commits"] > 0
    assert len(verified["windows"]) >= 2, verified["windows"]
    assert "kill-master" in (work / "report" / "report.md").read_text()
