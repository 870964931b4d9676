"""``txbroker bench run`` on a standalone Spark cluster that behaves like several machines on
one: a master and a worker started by the test (tests/support/spark_standalone.py), the worker
with its own ``HOME``, work dir and a Python **without txbroker**, the driver started as a
user would start it, from an empty directory with its own ``HOME`` and ``TMPDIR``.

What it proves: the executors ran the bench from the code the job shipped (the only txbroker
they could import), on the worker; every piece of data went to the work dir given as a
``file://`` URI (as it would to ``hdfs://``); the driver and the broker were reached at the
addresses passed explicitly; and nothing of the bench landed anywhere else.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.spark_standalone import StandaloneSpark, child_env

TRANSACTIONS = 2000

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_bench_run_on_a_standalone_cluster_whose_worker_has_no_txbroker(tmp_path):
    shared = tmp_path / "shared"
    driver = tmp_path / "driver"
    for d in (shared, driver / "cwd", driver / "home", driver / "tmp"):
        d.mkdir(parents=True)
    work_uri = (shared / "work").as_uri()
    with StandaloneSpark(tmp_path / "spark") as cluster:
        env = child_env(HOME=str(driver / "home"), TMPDIR=str(driver / "tmp"))
        argv = [str(Path(sys.executable).parent / "txbroker"), "bench", "run",
                "--master", cluster.master_url, "-n", str(TRANSACTIONS), "--producers", "2",
                "--tasks", "2", "--work-dir", work_uri, "--broker-host", "127.0.0.1",
                "--driver-host", "127.0.0.1", "--executor-python", str(cluster.worker_python)]
        try:
            run = subprocess.run(argv, cwd=driver / "cwd", env=env, capture_output=True,
                                 text=True, timeout=300, check=False)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"bench run did not finish in 300 s\n{exc.stderr}\n{cluster.log_tail()}")
        spark_log = shared / "work" / "spark.log"
        context = (f"exit {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr[-4000:]}\n"
                   f"{cluster.log_tail()}\n--- spark.log ---\n"
                   f"{spark_log.read_text(errors='replace')[-4000:] if spark_log.exists() else ''}")
        assert run.returncode == 0, context
        executor_logs = sorted(cluster.worker_dir.glob("app-*/*/stderr"))

    # The verdict, as the user reads it and as written to the work dir.
    rows = {c[0].strip(): c[1].strip() for c in
            (line.strip().strip("│").split("│") for line in run.stdout.splitlines()) if len(c) == 2}
    assert rows.get("violations") == "0", context
    assert rows.get("transactions") == f"{TRANSACTIONS:,}", context
    work = shared / "work"
    assert f"report: {work / 'report' / 'report.md'}" in run.stdout
    verified = json.loads((work / "results" / "rocketmq" / "verify.json").read_text())
    assert verified["violation_total"] == 0 and verified["transactions"] == TRANSACTIONS
    assert verified["deliveries"] == verified["expected_commits"] > 0
    assert (work / "trace" / "_txbroker_trace.json").is_file()
    for data in ("trace", "results/rocketmq/transactions", "results/rocketmq/deliveries"):
        assert list((work / data).glob("part-*.parquet")), data
    assert "**PASS**" in (work / "report" / "report.md").read_text()

    # The executors ran on the worker, with the worker's Python, from the zip the job shipped.
    assert executor_logs, f"no executor ran on the worker\n{context}"
    shipped = [p for p in cluster.worker_dir.glob("app-*/*/*.zip") if "txbroker" in p.name]
    assert shipped, sorted(str(p) for p in _files(cluster.worker_dir))
    ran_python = "\n".join(p.read_text(errors="replace") for p in executor_logs)
    assert "PythonRunner" in ran_python, ran_python[-3000:]
    calls = cluster.python_calls.read_text() if cluster.python_calls.exists() else ""
    assert "pyspark.daemon" in calls, f"the worker's Python never ran a task: {calls!r}"

    # Nothing of the bench outside the work dir: no Parquet, no metadata, no report file.
    bench_files = [p for p in _files(tmp_path)
                   if (p.suffix in (".parquet", ".png", ".md") or p.name.startswith("_txbroker")
                       or p.name == "verify.json")
                   and work not in p.parents]
    assert not bench_files, bench_files
    assert not any((driver / "cwd").iterdir())          # the driver's current directory
    assert not any((driver / "tmp").iterdir()), sorted((driver / "tmp").iterdir())
    assert not _files(cluster.worker_home)               # the worker's HOME
    assert not _files(cluster.worker_tmp)                # and its temp dir
