"""The bench commands' success paths through click, as an operator runs them.

One small ``bench run`` (embedded ``txbroker serve`` subprocess on loopback), then ``bench
generate`` and ``bench report`` on what it left.  The commands build their SparkSession with
``getOrCreate``, so inside the test session they reuse the shared ``spark`` fixture's JVM; the
settings the commands apply to it (shuffle partitions) are put back afterwards.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import click
import pyarrow.parquet as pq
from bench_helpers import E2E_BROKER
from click.testing import CliRunner

from txbroker.bench.trace.report import FILES
from txbroker.bench.trace.verify import VERIFY_FILE
from txbroker.cli.main import main

#: The smallest trace that still has every kind of row (and so every kind of check).
TRANSACTIONS = 300
TRACE_OPTIONS = ["--seed", "11", "--topics", "2", "--producers", "2", "--mix", "stress",
                 "--transaction-timeout", str(E2E_BROKER.transaction_timeout),
                 "--check-interval", str(E2E_BROKER.transaction_check_interval),
                 "--check-max", str(E2E_BROKER.transaction_check_max),
                 "--master", "local[2]"]


def _summary(output: str) -> dict[str, str]:
    """The summary table's rows: figure → value (rich draws cells between │ bars)."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 2 and cells[0]:
            rows[cells[0]] = cells[1]
    return rows


def test_bench_run_generate_and_report_through_the_cli(spark, tmp_path, monkeypatch):
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    runner = CliRunner()
    # no --work-dir: the run makes a temp dir (here under tmp_path) and names it at the end
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    try:
        run = runner.invoke(main, ["bench", "run", "--transactions", str(TRANSACTIONS),
                                   "--tasks", "2", *TRACE_OPTIONS])
        assert run.exit_code == 0, (run.exit_code, run.output, run.exception)
        last = run.stdout.splitlines()[-1]
        m = re.fullmatch(r"work dir (\S+) \(trace/, results/, report/, spark\.log; [\d.,]+ MB\) is "
                         r"left for inspection; remove it with rm -r (\S+)", last)
        assert m and m.group(1) == m.group(2), run.stdout
        work = Path(m.group(1))
        assert work.parent == tmp_path and work.name.startswith("txbroker-bench-run-")
        table = _summary(run.stdout)
        assert table["violations"] == "0", run.stdout
        assert table["transactions"] == f"{TRANSACTIONS:,}", run.stdout
        # the trace's schedule was followed, and the lag against it is shown and explained
        assert table["replay pacing"] == "trace schedule (2,000 tx/s mean)", run.stdout
        assert "schedule_lag_ms p50 / p99 / max" in table
        assert any(line.startswith("schedule_lag_ms: how late each transaction's send began")
                   for line in run.stdout.splitlines()), run.stdout
        trace = pq.read_table(work / "trace").to_pylist()
        commits = sum(r["expected_outcome"] == "commit" for r in trace)
        scripted = sum(r["expected_checks"] for r in trace)
        assert len(trace) == TRANSACTIONS and commits > 0 and scripted > 0
        assert {r["kind"] for r in trace} == {"commit", "rollback", "unknown_commit",
                                              "unknown_rollback", "never"}
        assert table["deliveries / expected commits"] == f"{commits:,} / {commits:,}", run.stdout
        assert table["checks expected / received as expected"] == f"{scripted:,} / {scripted:,}"
        assert set(table) >= {"Spark start-up (s)", "generate (s)", "replay-rocketmq (s)",
                              "verify-rocketmq (s)", "report (s)", "wall (s)"}
        assert float(table["wall (s)"]) >= float(table["replay-rocketmq (s)"])
        assert f"report: {work / 'report' / 'report.md'}" in run.stdout
        verified = json.loads((work / "results" / "rocketmq" / VERIFY_FILE).read_text())
        assert verified["violation_total"] == 0 and verified["transactions"] == TRANSACTIONS
        for name in FILES:
            assert (work / "report" / name).stat().st_size > 0, name
        assert "**PASS**" in (work / "report" / "report.md").read_text()

        # The same options and seed through `bench generate`: the very same trace.
        again = tmp_path / "again"
        gen = runner.invoke(main, ["bench", "generate", "--transactions", str(TRANSACTIONS),
                                   "--out", str(again), *TRACE_OPTIONS])
        assert gen.exit_code == 0, (gen.output, gen.exception)
        assert re.search(rf"^wrote {TRANSACTIONS:,} transactions to {re.escape(str(again))} "
                         r"in \d+\.\d s \(\d+\.\d s wall, including \d+\.\d s Spark start-up\)$",
                         gen.stdout, re.MULTILINE), gen.stdout
        assert sorted(pq.read_table(again).to_pylist(), key=lambda r: r["id"]) == \
            sorted(trace, key=lambda r: r["id"])
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)

    # `bench report` on the run's results writes the same files elsewhere and lists them.
    out = tmp_path / "report2"
    rep = runner.invoke(main, ["bench", "report", "--results", str(work / "results" / "rocketmq"), "--out", str(out)])
    assert rep.exit_code == 0, (rep.output, rep.exception)
    assert rep.stdout.split() == [str(out / name) for name in FILES]
    for name in FILES:
        assert (out / name).stat().st_size > 0, name
    assert (out / "report.md").read_text() == (work / "report" / "report.md").read_text()


def test_every_bench_option_has_help():
    """``--help`` explains every option of every bench command (run's -n, --concurrency,
    --tasks, --seed and --topics had none)."""
    runner = CliRunner()
    group = main.commands["bench"]
    for name, command in group.commands.items():
        out = runner.invoke(main, ["bench", name, "--help"], terminal_width=200).stdout
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, (name, param.opts)
                assert param.help.split()[0] in out, (name, param.opts, out)
    out = runner.invoke(main, ["bench", "run", "--help"], terminal_width=200).stdout
    for text in ("transactions in the generated trace", "transactions in flight per Spark task",
                 "Spark tasks replaying", "random seed", "topics the transactions spread over"):
        assert text in out, (text, out)


def test_unusable_work_dir_is_one_error_line_before_spark_starts(tmp_path):
    """A work dir the machine refuses is one ``error:`` line (exit 1), not a traceback, and
    no Spark JVM is started for a run that cannot write its results."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = CliRunner().invoke(main, ["bench", "run", "--transactions", "10",
                                       "--work-dir", str(blocker / "work")])
    assert result.exit_code == 1, result.output
    assert result.stderr == f"error: bench run: Not a directory: {blocker / 'work'}\n"
