"""``bench run --cluster 2 --fault-plan PLAN``: the trace against a 2-group cluster the bench
starts, with the master of one group SIGKILLed during the replay: 0 violations, for both
designs.  A RocketMQ half that could not be sent while the group had no master is sent again
as a new transaction, and a half stored although its send failed is rolled back as an orphan
(docs/bench.md, "What a row means per protocol"); Kafka producers continue their sequences on
the promoted slave, and a transaction the failover failed runs again on a new instance of its
transactional id.  The kill is recorded beside the results, verify counts anomalies per fault
window and the report marks the fault on its time plots."""

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


def test_both_designs_through_a_master_kill_have_no_violation(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    work = tmp_path / "work"
    argv = [str(Path(sys.executable).parent / "txbroker"), "bench", "run", "-n", "2400",
            "--protocol", "both", "--cluster", "2", "--fault-plan", str(plan),
            "--replay-rate", "200", "--producers", "8", "--work-dir", str(work),
            "--master", "local[4]"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=840, check=False,
                         stdin=subprocess.DEVNULL)
    context = f"exit {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr[-4000:]}"
    assert run.returncode == 0, context
    for protocol in ("rocketmq", "kafka"):
        results = work / "results" / protocol
        faults = json.loads((results / "faults.json").read_text())
        assert [f["action"] for f in faults] == ["kill-master"], (protocol, faults)
        assert faults[0]["target"].startswith("broker-a-"), faults
        verified = json.loads((results / "verify.json").read_text())
        assert verified["violation_total"] == 0, (protocol, verified["violations"])
        assert verified["deliveries"] >= verified["expected_commits"] > 0
        windows = verified["windows"]
        assert len(windows) >= 2, windows  # before the kill, during / after it
    report = (work / "report" / "report.md").read_text()
    assert "kill-master" in report
    for name in ("latency_cdf.png", "throughput.png"):
        assert (work / "report" / name).stat().st_size > 10_000
