"""``bench run``: generate → replay → verify → report in one go, against ``--namesrv`` or an
embedded broker started with the trace's broker settings.  Progress on stderr, a summary table
at the end; returns the verify summary (the caller turns violations into the exit code).

``work`` is a path or a URI (:mod:`txbroker.bench.trace.fs`): ``trace/``, ``results/`` and
``report/`` are written there through Spark and Hadoop's FileSystem, never the driver's disk."""

from __future__ import annotations

import time
from pathlib import Path

from txbroker.bench.trace import generate as gen
from txbroker.bench.trace.embedded import EmbeddedBroker
from txbroker.bench.trace.fs import WorkFS, join
from txbroker.bench.trace.replay import replay
from txbroker.bench.trace.report import report, summary_rows
from txbroker.bench.trace.spec import TraceMeta
from txbroker.bench.trace.verify import verify


def run_all(spark, meta: TraceMeta, work: str | Path, namesrv: str | None, *, tasks: int | None,
            concurrency: int, rate: float | None, check_concurrency: int = 1024, console=None,
            broker_host: str = "127.0.0.1", advertise: str = "") -> tuple[dict, dict[str, float]]:
    """Run every step; ``broker_host`` and ``advertise`` place the embedded broker (unused
    with ``namesrv``)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    work = WorkFS(spark).qualify(work)
    trace_dir, results_dir, report_dir = (join(work, name) for name in ("trace", "results", "report"))
    timings: dict[str, float] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        step = progress.add_task("generate", total=meta.transactions)
        t = time.perf_counter()
        gen.generate(spark, meta, trace_dir)
        timings["generate"] = time.perf_counter() - t
        progress.update(step, completed=meta.transactions)

        step = progress.add_task("replay (deliveries)", total=None)

        def on_progress(done: int, total: int) -> None:
            progress.update(step, completed=done, total=total)

        t = time.perf_counter()
        if namesrv:
            replay(spark, trace_dir, namesrv, results_dir, tasks=tasks, concurrency=concurrency,
                   rate=rate, check_concurrency=check_concurrency, on_progress=on_progress)
        else:
            with EmbeddedBroker(meta.broker, host=broker_host, advertise=advertise) as broker:
                replay(spark, trace_dir, broker.namesrv_addr, results_dir, tasks=tasks,
                       concurrency=concurrency, rate=rate, check_concurrency=check_concurrency, on_progress=on_progress)
        timings["replay"] = time.perf_counter() - t

        step = progress.add_task("verify", total=1)
        t = time.perf_counter()
        summary = verify(spark, trace_dir, results_dir)
        timings["verify"] = time.perf_counter() - t
        progress.update(step, completed=1)

        step = progress.add_task("report", total=1)
        t = time.perf_counter()
        report(spark, results_dir, report_dir)
        timings["report"] = time.perf_counter() - t
        progress.update(step, completed=1)
    return summary, timings


def summary_table(summary: dict, timings: dict[str, float]):
    from rich.table import Table

    table = Table(title="txbroker bench")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, secs in timings.items():
        table.add_row(f"{name} (s)", f"{secs:,.1f}")
    for name, value in summary_rows(summary):
        table.add_row(name, value)
    for name, n in summary["violations"].items():
        if n:
            table.add_row(f"[red]{name}[/red]", f"{n:,}")
    return table
