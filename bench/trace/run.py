"""``bench run``: generate → replay → verify → report in one go, against ``--namesrv`` or an
embedded broker started with the trace's broker settings.  Progress on stderr, a summary table
at the end; returns the verify summary (the caller turns violations into the exit code).

``work`` is a path or a URI (:mod:`txbroker.bench.trace.fs`): ``trace/``, ``results/`` and
``report/`` are written there through Spark and Hadoop's FileSystem, never the driver's disk.

Phases and resume: the run's options go to ``WORK/run.json`` first; each phase (``generate``,
per protocol ``replay-<p>`` and ``verify-<p>``, then ``report``) writes
``WORK/_phases/<phase>.json`` when it is complete.  ``--resume WORK`` reads ``run.json`` back,
skips every phase with a marker and runs the others from their start (a replay again whole,
against a fresh embedded broker: its transactions cannot be continued by another driver).

Progress, per phase: rows done / total with rate and ETA.  A replay's rows are counted by its
tasks (:class:`~txbroker.bench.trace.tasks.ProgressServer`), its deliveries against the
messages the trace expects delivered; generate, verify and report have no row counts, so their
bar is Spark's tasks done / total (the status tracker of the phase's job group).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from txbroker.bench.trace import faultplan, kafka_replay
from txbroker.bench.trace import generate as gen
from txbroker.bench.trace import replay as rocketmq_replay
from txbroker.bench.trace.cluster import EmbeddedCluster
from txbroker.bench.trace.embedded import EmbeddedBroker
from txbroker.bench.trace.fs import WorkFS, join
from txbroker.bench.trace.report import report, summary_rows
from txbroker.bench.trace.spec import SpecError, TraceMeta
from txbroker.bench.trace.tasks import ProgressServer
from txbroker.bench.trace.verify import FAULTS_FILE, VERIFY_FILE, verify

RUN_FILE = "run.json"
PHASES_DIR = "_phases"
PROTOCOLS = ("rocketmq", "kafka")


@dataclass(frozen=True)
class Replayer:
    """A protocol's replay: ``replay(spark, trace_dir, address, out, *, tasks, consumers,
    concurrency, rate, progress, broker_pids) -> dict``, the address it is given for an
    embedded broker or cluster (name server, Kafka bootstrap), and the run option naming an
    external one (``namesrv``, ``bootstrap``)."""

    replay: Callable[..., dict]
    embedded_address: Callable[[EmbeddedBroker | EmbeddedCluster], str]
    external: str


#: One line per protocol; a protocol missing here is refused by ``bench run --protocol``.
REPLAYS: dict[str, Replayer] = {
    "rocketmq": Replayer(rocketmq_replay.replay, lambda broker: broker.namesrv_addr, "namesrv"),
    "kafka": Replayer(kafka_replay.replay, lambda broker: broker.bootstrap, "bootstrap"),
}
#: Seconds between a replay's start and its first transaction (the replays' ``lead_s``): a
#: fault plan's times count from there.
LEAD_S = 2.0


def parse_protocols(text: str) -> list[str]:
    """``rocketmq`` | ``kafka`` | ``both`` -> the protocols to replay, in order."""
    wanted = list(PROTOCOLS) if text == "both" else [text]
    for p in wanted:
        if p not in PROTOCOLS:
            raise SpecError(f"--protocol: {text!r}: expected rocketmq, kafka or both")
        if p not in REPLAYS:
            raise SpecError(f"--protocol {text}: this build has no {p} replay "
                            f"(replays: {', '.join(REPLAYS)})")
    return wanted


class RunDir:
    """``WORK``'s run options and phase markers."""

    def __init__(self, fs: WorkFS, work: str) -> None:
        self.fs, self.work = fs, work

    def write_options(self, options: dict) -> None:
        self.fs.write_text(join(self.work, RUN_FILE), json.dumps(options, indent=2) + "\n")

    def read_options(self) -> dict:
        path = join(self.work, RUN_FILE)
        try:
            return json.loads(self.fs.read_text(path))
        except FileNotFoundError:
            raise SpecError(f"--resume {self.work}: not a bench run work dir (no {RUN_FILE})") from None
        except ValueError as exc:
            raise SpecError(f"{path}: invalid run options: {exc}") from None

    def finished(self, phase: str) -> float | None:
        """The seconds ``phase`` took, from its marker; None if it has no complete marker (one
        a driver killed while writing it, empty or cut short, does not count: the phase runs
        again)."""
        try:
            body = json.loads(self.fs.read_text(join(self.work, PHASES_DIR, f"{phase}.json")))
            return float(body["seconds"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def mark(self, phase: str, seconds: float, **extra: object) -> None:
        body = {"phase": phase, "seconds": round(seconds, 3), "finished": time.time(), **extra}
        self.fs.publish_text(join(self.work, PHASES_DIR, f"{phase}.json"), json.dumps(body) + "\n")


def run_options(meta: TraceMeta, namesrv: str | None, *, tasks: int | None, consumers: int | None,
                concurrency: int, rate: float | None, check_concurrency: int,
                broker_host: str, advertise: str, protocols: list[str],
                bootstrap: str | None = None, cluster: int | None = None,
                fault_plan: str | None = None) -> dict:
    """What ``run.json`` holds: everything ``--resume`` needs to run the same bench again (the
    fault plan by its path: it is read again on resume)."""
    return {"meta": asdict(meta), "namesrv": namesrv, "bootstrap": bootstrap, "cluster": cluster,
            "fault_plan": fault_plan, "tasks": tasks, "consumers": consumers,
            "concurrency": concurrency, "rate": rate, "check_concurrency": check_concurrency,
            "broker_host": broker_host, "advertise": advertise, "protocols": protocols}


def check_targets(protocols: list[str], namesrv: str | None, bootstrap: str | None,
                  cluster: int | None, fault_plan: str | None) -> None:
    """What the run replays against must fit the protocols: an external cluster needs the
    address of each protocol, a fault plan a cluster the bench starts (it kills its processes)."""
    external = {"namesrv": namesrv, "bootstrap": bootstrap}
    if any(external.values()):
        if cluster:
            raise SpecError("--cluster starts a cluster; --namesrv / --bootstrap name an external one")
        for p in protocols:
            option = REPLAYS[p].external
            if not external[option]:
                raise SpecError(f"--protocol {p} against an external cluster needs --{option}")
    if fault_plan and not cluster:
        raise SpecError("--fault-plan needs --cluster GROUPS: faults are applied to the "
                        "processes of a cluster the bench starts")


def _rate_column():
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        """Rows (or tasks) per second, as rich measures them over the last seconds."""

        def render(self, task) -> Text:
            speed = task.finished_speed or task.speed
            return Text("" if speed is None else f"{speed:,.0f}/s", style="progress.data.speed")

    return RateColumn()


class _Poller:
    """Calls ``update`` every ``interval`` seconds in a thread until closed (and once at the
    end)."""

    def __init__(self, update: Callable[[], None], interval: float = 0.25) -> None:
        self.update, self.interval = update, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-progress-poll", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.update()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.update()


def progress_lines(progress) -> list[str]:
    """One plain line per bar still running: where the bars cannot be redrawn (the console is
    a log file or a pipe: rich then draws them once, at the end), these are printed every
    :data:`LOG_PROGRESS_S` instead, so an hour-long run in a log is not silent."""
    lines = []
    for task in progress.tasks:
        if not task.total or task.completed >= task.total:
            continue
        speed = task.speed
        line = f"{task.description}: {task.completed:,.0f} / {task.total:,.0f}"
        if speed:
            left = max(0.0, task.total - task.completed) / speed
            line += f", {speed:,.0f}/s, about {_duration(left)} left"
        lines.append(line)
    return lines


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


#: Seconds between the plain progress lines of a console that is not a terminal.
LOG_PROGRESS_S = 30.0


def _spark_tasks(spark, group: str) -> tuple[int, int]:
    """(tasks done, tasks known) over the jobs of ``group`` so far."""
    tracker = spark.sparkContext.statusTracker()
    done = total = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in (job.stageIds if job is not None else ()):
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                done += stage.numCompletedTasks
                total += stage.numTasks
    return done, total


def run_all(spark, meta: TraceMeta, work: str | Path, namesrv: str | None, *, tasks: int | None,
            concurrency: int, rate: float | None, check_concurrency: int = 1024, console=None,
            broker_host: str = "127.0.0.1", advertise: str = "", consumers: int | None = None,
            protocols: list[str] | None = None, resume: bool = False, bootstrap: str | None = None,
            cluster: int | None = None, fault_plan: str | None = None) -> tuple[dict, dict[str, float]]:
    """Run every phase not done yet; ``broker_host`` and ``advertise`` place the embedded
    broker (unused with ``namesrv``).  With ``resume`` the options come from ``WORK/run.json``
    and the arguments after ``work`` are ignored.  Returns the verify summary (of the first
    protocol; ``by_protocol`` holds each one's and ``violation_total`` sums them) and the
    seconds of each phase."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    fs = WorkFS(spark)
    work = fs.qualify(work)
    rundir = RunDir(fs, work)
    if resume:
        opts = rundir.read_options()
        try:
            meta = TraceMeta.from_dict(opts["meta"])
        except (KeyError, TypeError) as exc:
            raise SpecError(f"{join(work, RUN_FILE)}: invalid run options: {exc}") from None
    else:
        opts = run_options(meta, namesrv, tasks=tasks, consumers=consumers, concurrency=concurrency,
                           rate=rate, check_concurrency=check_concurrency, broker_host=broker_host,
                           advertise=advertise, protocols=protocols or ["rocketmq"],
                           bootstrap=bootstrap, cluster=cluster, fault_plan=fault_plan)
        rundir.write_options(opts)
        fs.delete(join(work, PHASES_DIR))  # an earlier run's markers do not apply to this one
    protocols = list(opts["protocols"])
    for p in protocols:
        if p not in REPLAYS:
            raise SpecError(f"{join(work, RUN_FILE)}: this build has no {p} replay")
    check_targets(protocols, opts.get("namesrv"), opts.get("bootstrap"), opts.get("cluster"),
                  opts.get("fault_plan"))
    faults = faultplan.load_plan(opts["fault_plan"]) if opts.get("fault_plan") else []
    trace_dir, report_dir = join(work, "trace"), join(work, "report")
    timings: dict[str, float] = {}
    summaries: dict[str, dict] = {}
    server = ProgressServer(spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1"))
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      _rate_column(), TimeElapsedColumn(), TimeRemainingColumn(),
                      console=console, transient=False) as progress:
            plain = None
            if not progress.console.is_terminal:
                def log_lines() -> None:
                    for line in progress_lines(progress):
                        progress.console.print(line, highlight=False)

                plain = _Poller(log_lines, LOG_PROGRESS_S)

            def step(name: str, work_fn: Callable[[], object], output: str | None = None,
                     bar: bool = True) -> None:
                """Run phase ``name`` unless its marker exists; mark it when it completes.
                ``output``: the phase's directory, removed first (a run that died in the phase
                may have left part of it)."""
                before = rundir.finished(name)
                if before is not None:
                    timings[name] = before
                    progress.add_task(f"{name} (done before)", total=1, completed=1)
                    return
                if output is not None and resume:  # WORK has our run.json: its parts are ours
                    fs.delete(output)
                group = f"txbroker-bench-{name}"
                poller = None
                if bar:
                    task_bar = progress.add_task(name, total=None)

                    def update() -> None:
                        done, total = _spark_tasks(spark, group)
                        progress.update(task_bar, completed=done, total=total or None)

                    spark.sparkContext.setJobGroup(group, f"bench {name}")
                    poller = _Poller(update)
                t = time.perf_counter()
                try:
                    work_fn()
                finally:
                    if poller is not None:
                        poller.close()
                        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
                if bar:  # stages Spark skipped (their output reused) never complete a task
                    progress.update(task_bar, total=1, completed=1)
                timings[name] = time.perf_counter() - t
                rundir.mark(name, timings[name])

            def _phases(step) -> None:
                step("generate", lambda: gen.generate(spark, meta, trace_dir), output=trace_dir)
                for p in protocols:
                    results = join(work, "results", p)
                    step(f"replay-{p}", lambda p=p, results=results: _replay(
                        spark, p, meta, opts, trace_dir, results, progress, server, faults),
                         output=results, bar=False)
                    step(f"verify-{p}", lambda results=results: verify(spark, trace_dir, results))
                    summaries[p] = json.loads(fs.read_text(join(results, VERIFY_FILE)))
                step("report", lambda: report(spark, [join(work, "results", p) for p in protocols],
                                              report_dir), output=report_dir)
            try:
                _phases(step)
            finally:
                if plain is not None:
                    plain.close()
    finally:
        server.close()
    summary = dict(summaries[protocols[0]])
    if len(protocols) > 1:
        summary["by_protocol"] = summaries
        summary["violation_total"] = sum(s["violation_total"] for s in summaries.values())
    return summary, timings


def _replay(spark, protocol: str, meta: TraceMeta, opts: dict, trace_dir: str, results: str,
            progress, server: ProgressServer, faults: list[faultplan.Fault]) -> dict:
    """One protocol's replay phase with its two bars (rows replayed, messages delivered),
    against the external cluster, a cluster started for it (with the fault plan applied), or
    an embedded broker."""
    from pyspark.sql import functions as F

    trace = spark.read.parquet(trace_dir)
    count = F.col("messages") if "messages" in trace.columns else F.lit(1)
    expected = trace.filter("expected_outcome = 'commit'").agg(F.sum(count)).first()[0] or 0
    rows_bar = progress.add_task(f"replay-{protocol}", total=meta.transactions)
    dl_bar = progress.add_task(f"  deliveries-{protocol}", total=int(expected))
    server.reset(f"replay-{protocol}")
    server.reset(f"deliveries-{protocol}")

    def update() -> None:
        progress.update(rows_bar, completed=server.done(f"replay-{protocol}"))
        progress.update(dl_bar, completed=server.done(f"deliveries-{protocol}"))

    poller = _Poller(update)
    kwargs = {"tasks": opts["tasks"], "consumers": opts["consumers"],
              "concurrency": opts["concurrency"], "rate": opts["rate"], "progress": server,
              "lead_s": LEAD_S}
    if protocol == "rocketmq":
        kwargs["check_concurrency"] = opts["check_concurrency"]
    replayer = REPLAYS[protocol]
    try:
        external = opts.get(replayer.external)
        if external:
            return replayer.replay(spark, trace_dir, external, results, **kwargs)
        if opts.get("cluster"):
            return _replay_on_cluster(spark, replayer, meta, int(opts["cluster"]), faults,
                                      trace_dir, results, kwargs)
        with EmbeddedBroker(meta.broker, host=opts["broker_host"],
                            advertise=opts["advertise"]) as broker:
            assert broker.proc is not None
            return replayer.replay(spark, trace_dir, replayer.embedded_address(broker), results,
                                   broker_pids=[broker.proc.pid], **kwargs)
    finally:
        poller.close()


def _replay_on_cluster(spark, replayer: Replayer, meta: TraceMeta, groups: int,
                       faults: list[faultplan.Fault], trace_dir: str, results: str,
                       kwargs: dict) -> dict:
    """The replay against a cluster started for it, the fault plan running from the replay's
    first transaction; what the plan did goes to ``results/faults.json`` (verify counts
    anomalies per fault window, the report marks them on every time plot)."""
    with EmbeddedCluster(groups, meta.broker, partitionable=faultplan.needs_proxies(faults)) as cluster:
        runner = None
        if faults:
            runner = faultplan.FaultRunner(faults, cluster, time.time() * 1000 + LEAD_S * 1000)
            runner.start()
        try:
            summary = replayer.replay(spark, trace_dir, replayer.embedded_address(cluster), results,
                                      broker_pids=cluster.broker_pids(), **kwargs)
        finally:
            events = runner.stop() if runner is not None else None
        if events is not None:
            WorkFS(spark).write_text(join(results, FAULTS_FILE), json.dumps(events, indent=1) + "\n")
            summary["fault_errors"] = runner.errors
        return summary


def summary_table(summary: dict, timings: dict[str, float]):
    """Phase timings, then the figures: one column per protocol when several ran."""
    from rich.table import Table

    by_protocol = summary.get("by_protocol") or {summary.get("protocol", "rocketmq"): summary}
    table = Table(title="txbroker bench")
    table.add_column("figure")
    for p in by_protocol:
        table.add_column(p if len(by_protocol) > 1 else "value", justify="right")
    blank = [""] * (len(by_protocol) - 1)
    for name, secs in timings.items():
        table.add_row(f"{name} (s)", f"{secs:,.1f}", *blank)
    columns = [dict(summary_rows(v)) for v in by_protocol.values()]
    names = list(dict.fromkeys(n for col in columns for n in col))
    for name in names:
        table.add_row(name, *(col.get(name, "–") for col in columns))
    bad = sorted({n for v in by_protocol.values() for n, c in v["violations"].items() if c})
    for name in bad:
        table.add_row(f"[red]{name}[/red]", *(f"{v['violations'].get(name, 0):,}"
                                               for v in by_protocol.values()))
    return table
