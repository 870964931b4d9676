"""``txbroker bench``: the PySpark trace bench (generate, replay, verify, report, run).

Every command takes ``--master`` (default ``local[*]``; ``spark://HOST:PORT`` runs the same job
on a cluster).  ``verify`` and ``run`` exit 1 when any violation is found; bad options exit 2
with one ``error:`` line.
"""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path

import click

from bench.trace.spec import (
    DEFAULT_MIX,
    BrokerSettings,
    SpecError,
    TraceMeta,
    parse_mix,
)

_master = click.option("--master", default="local[*]", show_default=True,
                       help="Spark master (local[*], local[N] or spark://HOST:PORT)")


def _errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
    return wrapper


def _spark(master: str):
    from bench.trace.spark import session
    return session(master)


def _trace_options(fn):
    for opt in reversed([
        click.option("--seed", type=int, default=1, show_default=True),
        click.option("--topics", type=int, default=4, show_default=True),
        click.option("--producers", type=int, default=4, show_default=True,
                     help="producer groups (each is replayed by one Spark task)"),
        click.option("--mix", default=DEFAULT_MIX, show_default=True, help="KIND=WEIGHT,..."),
        click.option("--body-bytes", default="uniform:64:512", show_default=True,
                     help="const:V | uniform:A:B | exp:MEAN[:MAX]"),
        click.option("--local-tx-ms", default="uniform:0:20", show_default=True,
                     help="local transaction duration, same forms"),
        click.option("--rate", type=float, default=2000.0, show_default=True,
                     help="mean scheduled arrival rate, transactions/s"),
        click.option("--transaction-timeout", type=float, default=1.0, show_default=True,
                     help="broker setting the expectations assume (s)"),
        click.option("--check-interval", type=float, default=0.5, show_default=True,
                     help="broker transaction_check_interval the expectations assume (s)"),
        click.option("--check-max", type=int, default=3, show_default=True,
                     help="broker transaction_check_max the expectations assume"),
    ]):
        fn = opt(fn)
    return fn


def _meta(transactions, seed, topics, producers, mix, body_bytes, local_tx_ms, rate,
          transaction_timeout, check_interval, check_max) -> TraceMeta:
    return TraceMeta(transactions=transactions, seed=seed, topics=topics, producers=producers,
                     rate=rate, mix=parse_mix(mix), body_bytes=body_bytes, local_tx_ms=local_tx_ms,
                     broker=BrokerSettings(transaction_timeout, check_interval, check_max))


@click.group("bench")
def bench() -> None:
    """Replay traffic traces at scale with Spark and verify every transaction's outcome."""


@bench.command("generate")
@click.option("--transactions", "-n", type=int, required=True)
@click.option("--out", type=click.Path(file_okay=False), required=True)
@_trace_options
@_master
@_errors
def generate_cmd(transactions, out, master, **opts) -> None:
    """Write a trace (Parquet, deterministic for --seed)."""
    import time

    from bench.trace.generate import generate, validate

    meta = _meta(transactions, **opts)
    validate(meta)
    spark = _spark(master)
    t = time.perf_counter()
    generate(spark, meta, Path(out))
    click.echo(f"wrote {transactions:,} transactions to {out} in {time.perf_counter() - t:.1f} s")


@bench.command("replay")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False, exists=True), required=True)
@click.option("--namesrv", required=True, help="HOST:PORT of the broker's name server")
@click.option("--out", type=click.Path(file_okay=False), required=True)
@click.option("--concurrency", type=int, default=64, show_default=True,
              help="transactions in flight per Spark task")
@click.option("--tasks", type=int, default=None, help="Spark tasks [default: parallelism]")
@click.option("--check-concurrency", type=int, default=1024, show_default=True,
              help="check-backs answered at once per producer (the SDK drops beyond 16x this)")
@click.option("--rate", type=float, default=None,
              help="override the trace schedule: transactions/s (0 = as fast as possible)")
@_master
@_errors
def replay_cmd(trace_dir, namesrv, out, concurrency, tasks, check_concurrency, rate,
               master) -> None:
    """Replay a trace against a running broker; results are Parquet."""
    from bench.trace.replay import replay

    s = replay(_spark(master), trace_dir, namesrv, out, tasks=tasks, concurrency=concurrency,
               rate=rate, check_concurrency=check_concurrency)
    click.echo(f"run {s['run_id']}: {s['deliveries']:,} deliveries recorded in {out}")


@bench.command("verify")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False, exists=True), required=True)
@click.option("--results", type=click.Path(file_okay=False, exists=True), required=True)
@click.option("--grace-ms", type=float, default=500.0, show_default=True,
              help="a check this soon after the decision is a race, not a violation")
@_master
@_errors
def verify_cmd(trace_dir, results, grace_ms, master) -> None:
    """Join expectations with deliveries; exit 1 on any violation."""
    from bench.trace.verify import verify

    v = verify(_spark(master), trace_dir, results, grace_ms=grace_ms)
    for name, n in v["violations"].items():
        click.echo(f"{name:<26} {n:>10,}" + (f"  e.g. {v['violation_samples'][name]}" if n else ""))
    click.echo(f"checks: {v['checks']} (scripted {v['expected_checks']:,})")
    click.echo(f"throughput {v['throughput_tx_per_s']:,.0f} tx/s; "
               f"{'PASS' if v['violation_total'] == 0 else 'FAIL'}")
    sys.exit(1 if v["violation_total"] else 0)


@bench.command("report")
@click.option("--results", type=click.Path(file_okay=False, exists=True), required=True)
@click.option("--out", type=click.Path(file_okay=False), required=True)
@_errors
def report_cmd(results, out) -> None:
    """Markdown + PNG plots from a verified results directory."""
    from bench.trace.report import report

    for path in report(results, out):
        click.echo(str(path))


@bench.command("run")
@click.option("--transactions", "-n", type=int, default=10_000, show_default=True)
@click.option("--namesrv", default=None, help="use this broker instead of an embedded one")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="where trace/, results/ and report/ go [default: a new temp dir]")
@click.option("--concurrency", type=int, default=64, show_default=True)
@click.option("--tasks", type=int, default=None)
@click.option("--check-concurrency", type=int, default=1024, show_default=True,
              help="check-backs answered at once per producer (the SDK drops beyond 16x this)")
@click.option("--replay-rate", type=float, default=None,
              help="override the trace schedule (0 = as fast as possible)")
@_trace_options
@_master
@_errors
def run_cmd(transactions, namesrv, work_dir, concurrency, tasks, check_concurrency, replay_rate,
            master, **opts) -> None:
    """generate + replay + verify + report; exit 1 on any violation."""
    from rich.console import Console

    from bench.trace.generate import validate
    from bench.trace.run import run_all, summary_table

    meta = _meta(transactions, **opts)
    validate(meta)
    work = Path(work_dir or tempfile.mkdtemp(prefix="txbroker-bench-run-"))
    console = Console(stderr=True)
    summary, timings = run_all(_spark(master), meta, work, namesrv, tasks=tasks,
                               concurrency=concurrency, rate=replay_rate,
                               check_concurrency=check_concurrency, console=console)
    Console().print(summary_table(summary, timings))
    click.echo(f"report: {work / 'report' / 'report.md'}")
    sys.exit(1 if summary["violation_total"] else 0)
