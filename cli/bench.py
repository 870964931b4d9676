"""``txbroker bench``: the PySpark trace bench (generate, replay, verify, report, run).

Every Spark command takes ``--master`` (default ``local[*]``; ``spark://HOST:PORT`` runs the
same job on a cluster, with ``--driver-host`` and ``--executor-python`` when the defaults do not
fit) and sends Spark's own output (JVM banner, log4j lines, progress bars) to a log file it
names on stderr, unless ``--verbose``.  Traces, results and reports are paths or URIs
(``hdfs://``, ``s3a://``, ``file://``: anything Hadoop's FileSystem reads), written and read
through Spark.  ``verify`` and ``run`` exit 1 when any violation is found; bad options exit 2
with one ``error:`` line.  The commands need the ``bench`` extra (Spark, Arrow, pandas, numpy,
matplotlib): without it each says so in one ``error:`` line naming the install command, before
doing anything else (:mod:`txbroker.bench.extras`).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import click

from txbroker.bench import extras
from txbroker.bench.trace.embedded import EmbeddedBrokerError
from txbroker.bench.trace.fs import has_scheme, join, local_path
from txbroker.bench.trace.spark import (
    is_local,
    local_master,
    master_addresses,
    route_address,
)
from txbroker.bench.trace.spec import (
    META_FILE,
    BrokerSettings,
    KafkaSettings,
    SpecError,
    TraceMeta,
    parse_mix,
)
from txbroker.bench.trace.spec import consumer_restarts as restart_schedule
from txbroker.cli.common import CommandError, command_name


def _spark_options(log_default: str):
    """``--master``, ``--verbose`` and ``--spark-log`` (default described by ``log_default``)."""
    def decorate(fn):
        for opt in reversed([
            click.option("--master", default="local[*]", show_default=True,
                         help="Spark master (local[*], local[N] or spark://HOST:PORT)"),
            click.option("--spark-log", type=click.Path(dir_okay=False), default=None,
                         help=f"file for Spark's output and log [default: {log_default}]"),
            click.option("--verbose", "-v", is_flag=True,
                         help="show Spark's output (log4j lines, progress bars) on the terminal"),
            click.option("--driver-host", default=None,
                         help="address executors reach this driver at [default: 127.0.0.1 for "
                              "local[*], else this machine's address on the route to the master]"),
            click.option("--executor-python", default=None,
                         help="Python the executors run, a path or a name on each worker's PATH, "
                              "same major.minor as this one [default: $PYSPARK_PYTHON, else "
                              f"python{sys.version_info[0]}.{sys.version_info[1]}]"),
        ]):
            fn = opt(fn)
        return fn
    return decorate


def _errors(*needs: str):
    """One-line errors for a bench command that imports ``needs`` (checked first)."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            what = command_name(click.get_current_context(silent=True))
            try:
                extras.require(*needs)
                return fn(*args, **kwargs)
            except (extras.MissingExtraError, ModuleNotFoundError) as exc:
                line = extras.explain(exc)
                if line is None:
                    raise
                raise CommandError(what, None, line) from None
        return _spec_errors(wrapper)
    return decorate


def _spec_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except EmbeddedBrokerError as exc:  # its first line says why, the rest is the log's end
            click.echo(f"error: {command_name(click.get_current_context(silent=True))}: {exc}",
                       err=True)
            sys.exit(1)
        except OSError as exc:  # a work dir, trace or results path the machine refuses
            where = f": {exc.filename}" if exc.filename else ""
            why = f"{exc.strerror}{where}" if exc.strerror else str(exc)
            raise CommandError(command_name(click.get_current_context(silent=True)), None, why) from None
    return wrapper


def _driver_host(master: str, driver_host: str | None) -> str:
    return driver_host or ("127.0.0.1" if is_local(master) else route_address(master))


def _spark(master: str, verbose: bool, log_file: Path, driver_host: str | None,
           executor_python: str | None):
    """Start (or join) the SparkSession; return it and the seconds that took."""
    from txbroker.bench.trace.spark import session

    if not verbose:
        click.echo(f"Spark log: {log_file} (--verbose shows it here)", err=True)
    t = time.perf_counter()
    spark = session(master, log_file=None if verbose else log_file,
                    driver_host=_driver_host(master, driver_host), executor_python=executor_python)
    return spark, time.perf_counter() - t


def _shown(uri: str) -> str:
    """A written file as the user reads it: a local path when it is one, else the URI."""
    path = local_path(uri)
    return str(path) if path is not None else uri


def _wall(t0: float, startup: float) -> str:
    return f"{time.perf_counter() - t0:.1f} s wall, including {startup:.1f} s Spark start-up"


def _local_dir(target: str) -> Path | None:
    """The local directory a path or ``file:`` URI names; None on any other filesystem."""
    return local_path(target) if has_scheme(target) else Path(target)


def _under(directory: str, *names: str) -> str:
    """A file under a directory the user named, shown the way they named it."""
    return _shown(join(directory, *names)) if has_scheme(directory) else str(Path(directory, *names))


def _beside(directory: str) -> Path:
    """``DIR.spark.log`` next to a local directory the command replaces (so not inside it);
    for a directory on another filesystem, ``<temp dir>/txbroker-bench-NAME.spark.log``."""
    local = _local_dir(directory)
    if local is None:
        name = directory.rstrip("/").rsplit("/", 1)[-1] or "out"
        return Path(tempfile.gettempdir()) / f"txbroker-bench-{name}.spark.log"
    d = local.absolute()  # "." has no name to add to
    return d.with_name(d.name + ".spark.log")


def _inside(directory: str, name: str) -> Path:
    """``DIR/NAME`` for a local directory; else ``<temp dir>/txbroker-bench-NAME``."""
    local = _local_dir(directory)
    return local / name if local is not None else Path(tempfile.gettempdir()) / f"txbroker-bench-{name}"


def _trace_options(fn):
    for opt in reversed([
        click.option("--seed", type=int, default=1, show_default=True,
                     help="random seed: the same seed and options give the same trace"),
        click.option("--topics", type=int, default=4, show_default=True,
                     help="topics the transactions spread over (BenchT0, BenchT1, ...)"),
        click.option("--producers", type=int, default=16, show_default=True,
                     help="producer groups (each replayed by one Spark task); Kafka runs one "
                          "producer's transactions one after another, so this bounds its concurrency"),
        click.option("--mix", default="production", show_default=True,
                     help="production (0.88 commit, 0.09 rollback, 0.015 unknown_commit, 0.01 "
                          "unknown_rollback, 0.005 never), stress (a quarter undecided) or "
                          "KIND=WEIGHT,..."),
        click.option("--body-bytes", default="uniform:64:512", show_default=True,
                     help="const:V | uniform:A:B | exp:MEAN[:MAX] | lognormal:MEDIAN:SIGMA[:MAX] "
                          "| pareto:MIN:ALPHA[:MAX]"),
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
        click.option("--arrival", default="poisson", show_default=True,
                     help="poisson | uniform | bursts:ON_S:OFF_S:FACTOR | diurnal:PERIOD_S:AMPLITUDE"),
        click.option("--producer-skew", type=float, default=0.0, show_default=True,
                     help="Zipf exponent of the producer a transaction belongs to (0: uniform)"),
        click.option("--key-skew", type=float, default=0.0, show_default=True,
                     help="Zipf exponent of the business key over --key-space (0: uniform)"),
        click.option("--key-space", type=int, default=100_000, show_default=True,
                     help="distinct business keys (key-0, key-1, ...)"),
        click.option("--messages", default="const:1", show_default=True,
                     help="messages per transaction (DIST), each on a topic of its own draw"),
        click.option("--crash-fraction", type=float, default=0.5, show_default=True,
                     help="share of the undecided rows whose producer dies mid-transaction"),
        click.option("--restart-ms", default="uniform:100:500", show_default=True,
                     help="DIST of the time until a dead producer's replacement starts"),
        click.option("--consumers", type=int, default=2, show_default=True,
                     help="delivery consumer tasks the replay records with"),
        click.option("--consumer-restarts", type=int, default=0, show_default=True,
                     help="consumer restarts spread evenly over the trace (1 s down each)"),
        click.option("--kafka-transaction-timeout", type=float, default=10.0, show_default=True,
                     help="Kafka transaction.timeout.ms the expectations assume (s)"),
    ]):
        fn = opt(fn)
    return fn


def _meta(transactions, seed, topics, producers, mix, body_bytes, local_tx_ms, rate,
          transaction_timeout, check_interval, check_max, arrival, producer_skew, key_skew,
          key_space, messages, crash_fraction, restart_ms, consumers, consumer_restarts,
          kafka_transaction_timeout) -> TraceMeta:
    if consumer_restarts < 0:
        raise SpecError("--consumer-restarts must be >= 0")
    span_ms = transactions * 1000.0 / rate if rate > 0 else 0.0
    return TraceMeta(transactions=transactions, seed=seed, topics=topics, producers=producers,
                     rate=rate, mix=parse_mix(mix), body_bytes=body_bytes, local_tx_ms=local_tx_ms,
                     broker=BrokerSettings(transaction_timeout, check_interval, check_max),
                     arrival=arrival, producer_skew=producer_skew, key_skew=key_skew,
                     key_space=key_space, messages=messages, crash_fraction=crash_fraction,
                     restart_ms=restart_ms, consumers=consumers,
                     consumer_restarts=restart_schedule(consumer_restarts, max(consumers, 1), span_ms),
                     kafka=KafkaSettings(round(kafka_transaction_timeout * 1000)))


@click.group("bench")
def bench() -> None:
    """Replay traffic traces at scale with Spark and verify every transaction's outcome."""


@bench.command("generate")
@click.option("--transactions", "-n", type=int, required=True,
              help="transactions in the trace (one row each)")
@click.option("--out", required=True, help="directory (path or URI) the trace replaces")
@_trace_options
@_spark_options("OUT.spark.log")
@_errors(*extras.SPARK)
def generate_cmd(transactions, out, master, verbose, spark_log, driver_host, executor_python,
                 **opts) -> None:
    """Write a trace (Parquet, deterministic for --seed)."""
    from txbroker.bench.trace.generate import generate, validate

    t0 = time.perf_counter()
    meta = _meta(transactions, **opts)
    validate(meta)
    spark, startup = _spark(master, verbose, Path(spark_log or _beside(out)), driver_host,
                            executor_python)
    t = time.perf_counter()
    generate(spark, meta, out)
    click.echo(f"wrote {transactions:,} transactions to {out} in {time.perf_counter() - t:.1f} s "
               f"({_wall(t0, startup)})")


@bench.command("describe")
@click.argument("trace_dir", metavar="TRACE")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of text")
@_spark_options("<temp dir>/txbroker-bench-describe.spark.log")
@_errors(*extras.SPARK)
def describe_cmd(trace_dir, as_json, master, verbose, spark_log, driver_host,
                 executor_python) -> None:
    """What a trace contains (Spark aggregations: nothing per row reaches the driver)."""
    from txbroker.bench.trace.describe import describe, describe_text

    local = _local_dir(trace_dir)
    if local is not None and not local.is_dir():
        raise FileNotFoundError(2, "no such trace directory", trace_dir)
    if local is not None and not (local / META_FILE).is_file():
        raise SpecError(f"{trace_dir}: not a trace (no {META_FILE}); "
                        "write one with `txbroker bench generate`")
    log = spark_log or Path(tempfile.gettempdir(), "txbroker-bench-describe.spark.log")
    spark, _ = _spark(master, verbose, Path(log), driver_host, executor_python)
    doc = describe(spark, trace_dir)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        for line in describe_text(doc):
            click.echo(line)


@bench.command("replay")
@click.option("--trace", "trace_dir", required=True, help="trace directory (path or URI)")
@click.option("--namesrv", required=True,
              help="HOST:PORT of the name server (several separated by ';'); executors dial it too")
@click.option("--out", required=True, help="directory (path or URI) the results replace")
@click.option("--concurrency", type=int, default=64, show_default=True,
              help="transactions in flight per Spark task")
@click.option("--tasks", type=int, default=None,
              help="Spark tasks replaying, each a share of the producer groups [default: "
                   "parallelism, at most the trace's producers]")
@click.option("--check-concurrency", type=int, default=1024, show_default=True,
              help="check-backs answered at once per producer (the SDK drops beyond 16x this)")
@click.option("--rate", type=float, default=None,
              help="override the trace schedule: transactions/s (0 = as fast as possible)")
@click.option("--consumers", type=int, default=None,
              help="delivery tasks, each consuming a fixed share of the queues, running beside "
                   "the replay tasks [default: the trace's, else 2]")
@_spark_options("OUT.spark.log")
@_errors(*extras.SPARK)
def replay_cmd(trace_dir, namesrv, out, concurrency, tasks, check_concurrency, rate, consumers,
               master, verbose, spark_log, driver_host, executor_python) -> None:
    """Replay a trace against a running broker; results are Parquet."""
    from txbroker.bench.trace.replay import replay

    t0 = time.perf_counter()
    if consumers is not None and consumers < 1:
        raise SpecError("--consumers must be >= 1")
    master = local_master(master, (tasks or os.cpu_count() or 1) + (consumers or 2))
    spark, startup = _spark(master, verbose, Path(spark_log or _beside(out)), driver_host,
                            executor_python)
    s = replay(spark, trace_dir, namesrv, out, tasks=tasks, consumers=consumers,
               concurrency=concurrency, rate=rate, check_concurrency=check_concurrency)
    click.echo(f"run {s['run_id']}: {s['deliveries']:,} deliveries recorded in {out} "
               f"({_wall(t0, startup)})")


@bench.command("verify")
@click.option("--trace", "trace_dir", required=True, help="trace directory (path or URI)")
@click.option("--results", required=True, help="results directory (path or URI)")
@click.option("--grace-ms", type=float, default=500.0, show_default=True,
              help="a check this soon after the decision is a race, not a violation")
@_spark_options("RESULTS/verify.spark.log")
@_errors(*extras.SPARK)
def verify_cmd(trace_dir, results, grace_ms, master, verbose, spark_log, driver_host,
               executor_python) -> None:
    """Join expectations with deliveries; exit 1 on any violation."""
    from txbroker.bench.trace.report import pacing_text, summary_notes
    from txbroker.bench.trace.verify import verify

    t0 = time.perf_counter()
    spark, startup = _spark(master, verbose, Path(spark_log or _inside(results, "verify.spark.log")),
                            driver_host, executor_python)
    v = verify(spark, trace_dir, results, grace_ms=grace_ms)
    for name, n in v["violations"].items():
        click.echo(f"{name:<26} {n:>10,}" + (f"  e.g. {v['violation_samples'][name]}" if n else ""))
    if v["checks_apply"]:
        click.echo(f"checks: {v['checks']} (scripted {v['expected_checks']:,})")
    else:
        click.echo("checks: none (Kafka transactions have no check-back; check figures apply "
                   "to RocketMQ only)")
    click.echo(f"{v['protocol']}: {v['committed']:,} committed, {v['redeliveries']:,} redeliveries "
               "(same offset received again: not a violation)")
    for w in v["windows"]:
        rate = "–" if w["committed_tx_per_s"] is None else f"{w['committed_tx_per_s']:,.0f}"
        click.echo(f"window {w['name']}: {w['transactions']:,} started, {rate} committed tx/s, "
                   f"{w['violations']:,} violations")
    click.echo(f"replay pacing: {pacing_text(v['pacing'])}")
    for note in summary_notes(v):
        click.echo(note)
    click.echo(f"verified in {_wall(t0, startup)}")
    click.echo(f"throughput {v['throughput_tx_per_s']:,.0f} tx/s; "
               f"{'PASS' if v['violation_total'] == 0 else 'FAIL'}")
    sys.exit(1 if v["violation_total"] else 0)


@bench.command("report")
@click.option("--results", required=True, multiple=True,
              help="verified results directory (path or URI); twice (one per protocol) for a "
                   "side-by-side report")
@click.option("--out", required=True, help="directory (path or URI) for report.md and the plots")
@_spark_options("OUT.spark.log")
@_errors(*extras.SPARK, *extras.REPORT)
def report_cmd(results, out, master, verbose, spark_log, driver_host, executor_python) -> None:
    """Markdown + PNG plots from one or two verified results directories."""
    if len(results) > 2:
        raise SpecError(f"--results: at most two results directories (one per protocol), "
                        f"got {len(results)}")
    from txbroker.bench.trace.report import report

    spark, _ = _spark(master, verbose, Path(spark_log or _beside(out)), driver_host,
                      executor_python)
    for uri in report(spark, list(results), out):
        click.echo(_shown(uri))


def _size_mb(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) / 1e6


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _master_host(master: str) -> str:
    return master_addresses(master)[0][0]


def _saved_run(work: str) -> dict:
    """``WORK/run.json`` when WORK is local (read before Spark starts, for its slot count);
    ``{}`` otherwise: the run reads it through Spark anyway."""
    local = _local_dir(work)
    if local is None:
        return {}
    path = local / "run.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"--resume {work}: not a bench run work dir (no run.json)") from None
    except ValueError as exc:
        raise SpecError(f"{path}: invalid run options: {exc}") from None


@bench.command("run")
@click.option("--transactions", "-n", type=int, default=10_000, show_default=True,
              help="transactions in the generated trace")
@click.option("--namesrv", default=None,
              help="use this broker or cluster (name server HOST:PORT, several separated by ';') "
                   "instead of an embedded one")
@click.option("--work-dir", default=None,
              help="where trace/, results/ and report/ go: a path or a URI every executor "
                   "reads (hdfs://, s3a://, file:// on a shared mount) [default: a new local "
                   "temp dir, for local[*] or a master on this machine]")
@click.option("--broker-host", default=None,
              help="interface the embedded broker listens on (0.0.0.0: all) [default: "
                   "127.0.0.1 for local[*], else the driver host]")
@click.option("--advertise", default=None,
              help="address the embedded broker announces to executors [default: --broker-host, "
                   "or the driver host when that is 0.0.0.0]")
@click.option("--concurrency", type=int, default=64, show_default=True,
              help="transactions in flight per Spark task")
@click.option("--tasks", type=int, default=None,
              help="Spark tasks replaying, each a share of the producer groups [default: "
                   "parallelism, at most --producers]")
@click.option("--check-concurrency", type=int, default=1024, show_default=True,
              help="check-backs answered at once per producer (the SDK drops beyond 16x this)")
@click.option("--replay-rate", type=float, default=None,
              help="transactions/s instead of the trace schedule (0 = unthrottled: as fast as "
                   "--concurrency allows); the summary says which was used")
@click.option("--bootstrap", default=None,
              help="Kafka bootstrap HOST:PORT[,HOST:PORT] of an external broker or cluster "
                   "(with --protocol kafka or both, beside --namesrv)")
@click.option("--cluster", "cluster", type=int, default=None, metavar="GROUPS",
              help="start a cluster of GROUPS broker groups (two brokers each, automatic "
                   "failover) for each replay instead of one embedded broker")
@click.option("--fault-plan", "fault_plan", type=click.Path(dir_okay=False), default=None,
              help="YAML/JSON schedule of faults (kill-master, kill, pause, partition) applied to "
                   "the --cluster during each replay; see docs/bench.md")
@click.option("--protocol", "protocol", default="rocketmq", show_default=True,
              type=click.Choice(["rocketmq", "kafka", "both"]),
              help="transaction design(s) the trace is replayed through")
@click.option("--resume", "resume", default=None, metavar="WORK",
              help="finish the run in WORK: its run.json gives the options (the others are "
                   "ignored); phases with a marker in WORK/_phases are skipped")
@_trace_options
@_spark_options("WORK-DIR/spark.log")
@_errors(*extras.SPARK, *extras.REPORT)
def run_cmd(transactions, namesrv, work_dir, broker_host, advertise, concurrency, tasks,
            check_concurrency, replay_rate, bootstrap, cluster, fault_plan, protocol, resume,
            master, verbose, spark_log, driver_host, executor_python, **opts) -> None:
    """generate + replay + verify + report; exit 1 on any violation."""
    from rich.console import Console

    from txbroker.bench.trace.faultplan import FaultPlanError, load_plan
    from txbroker.bench.trace.generate import validate
    from txbroker.bench.trace.report import summary_notes
    from txbroker.bench.trace.run import (
        check_targets,
        parse_protocols,
        run_all,
        summary_table,
    )

    t0 = time.perf_counter()
    protocols = parse_protocols(protocol)
    if resume is None:
        check_targets(protocols, namesrv, bootstrap, cluster, fault_plan)
        if fault_plan:
            try:
                load_plan(fault_plan)  # every mistake of the file, before Spark starts
            except FaultPlanError as exc:
                raise SpecError("\nerror: ".join(exc.lines)) from None
    if resume is not None:
        if work_dir is not None and work_dir != resume:
            raise SpecError("--resume WORK is the work dir; leave --work-dir out")
        work_dir = resume
    meta = _meta(transactions, **opts)
    validate(meta)
    saved = _saved_run(resume) if resume is not None else {}
    if saved:  # the resumed run's own figures set the slot count below
        tasks = saved.get("tasks")
        producers = saved.get("meta", {}).get("producers", meta.producers)
        consumers = saved.get("meta", {}).get("consumers") or 2
    else:
        producers, consumers = meta.producers, getattr(meta, "consumers", None) or 2
    if (namesrv or bootstrap) and (broker_host or advertise):
        raise SpecError("--broker-host and --advertise place the embedded broker; "
                        "with --namesrv / --bootstrap there is none")
    local = is_local(master)
    if work_dir is None and not (local or _loopback(_master_host(master))):
        raise SpecError("--work-dir is required with a cluster master: a directory every "
                        "executor reads (hdfs://..., s3a://..., or file:///... on a shared mount)")
    driver = _driver_host(master, driver_host)
    broker_host = broker_host or ("127.0.0.1" if local else driver)
    advertise = advertise or (driver if broker_host in ("0.0.0.0", "::") else broker_host)
    if not namesrv and not local and _loopback(advertise) and not _loopback(_master_host(master)):
        click.echo(f"warning: the embedded broker is announced as {advertise}: executors on "
                   "other machines cannot reach it (give --broker-host or --advertise)", err=True)
    work = work_dir or tempfile.mkdtemp(prefix="txbroker-bench-run-")
    local_work = _local_dir(work)
    if local_work is not None:
        local_work.mkdir(parents=True, exist_ok=True)  # an unusable work dir fails before Spark starts
    master = local_master(master, min(tasks or os.cpu_count() or 1, producers) + consumers)
    spark, startup = _spark(master, verbose, Path(spark_log or _inside(work, "spark.log")),
                            driver_host=driver, executor_python=executor_python)
    console = Console(stderr=True)
    summary, timings = run_all(spark, meta, work, namesrv, tasks=tasks,
                               concurrency=concurrency, rate=replay_rate,
                               check_concurrency=check_concurrency, console=console,
                               broker_host=broker_host, advertise=advertise,
                               protocols=protocols, resume=resume is not None,
                               bootstrap=bootstrap, cluster=cluster,
                               fault_plan=str(Path(fault_plan).absolute()) if fault_plan else None)
    timings = {"Spark start-up": startup, **timings, "wall": time.perf_counter() - t0}
    Console().print(summary_table(summary, timings))
    for note in summary_notes(summary):
        click.echo(note)
    click.echo(f"report: {_under(work, 'report', 'report.md')}")
    if work_dir is None:  # made for this run: say it stays, and how big it is
        click.echo(f"work dir {work} (trace/, results/, report/, spark.log; "
                   f"{_size_mb(Path(work)):,.1f} MB) is left for inspection; remove it with "
                   f"rm -r {work}")
    sys.exit(1 if summary["violation_total"] else 0)
