"""RocketMQ 5.x clients over gRPC beside the remoting path: ``python -m txbroker.bench.grpc``.

One ``txbroker serve --grpc-port 0`` per pass runs in its own process (ephemeral ports, temp data
dir, async flush) and carries every row asked for (``--rows``), each gRPC row beside its remoting
twin, interleaved:

* **send** — the unmodified ``rocketmq-python-client`` (5.1.2) sending normal messages to the
  gRPC endpoint (SendMessage), beside the txbroker SDK's ``Producer.send`` over remoting;
* **tx** — committed transactions: through the 5.x client a half by SendMessage
  (``message_type=TRANSACTION``), then EndTransaction commit; through the SDK
  ``send_message_in_transaction`` (half, then END_TRANSACTION commit);
* **consume** — ``--backlog`` messages stored beforehand, then consumed by one group: a
  SimpleConsumer's receive (POP) and an ack per message, beside the SDK Consumer's ``poll``
  (pull, offsets committed by the consumer);
* **timer** — timer messages sent at ``--timer-rate`` per second in all, each due on the first
  whole second at least ``--delay`` seconds after its send (``delivery_timestamp`` over gRPC,
  which the 5.x Python client sends in whole seconds; the SDK's ``deliver_time_ms`` at the same
  instants), then the topic read back: a timer's lateness is its delivered record's store
  timestamp minus ``TIMER_OUT_MS`` (the time it was due), both stamped by the broker's clock.

Every row runs ``--processes`` load processes (``bench/grpc_load.py``), each with ``--senders``
threads (5.x client) or coroutines (SDK) sharing one client, for ``--seconds`` (bounded by
``--max-sends`` calls per process).  This process never loads the 5.x client itself: its protobuf
names are those of txbroker's gRPC stubs, so the client stays in the load processes and the
broker's stubs in the broker process.  Each process starts its client and makes one warm-up call
before the window opens (an SDK Consumer starts inside it: once started it pulls ahead, and the
window would find the backlog already in its buffer); the window opens for every process of the
row at once.  SDK consumers share the topic's queues statically, one process at most per queue.

Per row: messages counted (sends or transactions answered, messages acked or polled, timers
sent), msgs/s
(over the time from the window's start to the last one counted), p50/p99 of one call as its
sender sees it (for consume: one receive with its acks, or one poll), the broker process's CPU
µs per message (``/proc/<pid>/stat`` before and after the window, 10 ms ticks; a timer row's
window lasts until its last timer was delivered and read back) and the load processes' (their
own CPU time over the window, every thread); a timer row adds lateness p50/p99.  Each row is
checked: a send, tx or timer row's topic must hold every message the load processes stored, warm-ups included; a consume
row must consume messages and no more than the backlog (a message is invisible for longer than
the window once received).  A row failing its check is listed under the table and the exit
status is 1.

``--repeat N`` runs N passes, each on a fresh broker, the rows in reverse order in odd passes, and
prints the medians, then each gRPC row against its remoting twin: the median over the passes of
each pass's ratio (msgs/s, broker CPU per message), since both rows of a pass saw the same
machine.  ``--json`` prints one document (``rows`` of medians, ``ratios``, ``passes`` with every
run) instead of the table.

Usage: ``python -m txbroker.bench.grpc [--rows send,tx,consume,timer] [--seconds 3]
[--processes 2] [--senders 8] [--max-sends 100000] [--backlog 100000] [--timer-rate 10000]
[--delay 1] [--repeat 3] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
import typing
from dataclasses import asdict, dataclass, fields
from importlib import metadata
from pathlib import Path

import orjson

from txbroker.bench.broker import REPO, BrokerProc, preload
from txbroker.bench.extras import MissingExtraError, run_main
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.store.record import PROPERTY_TIMER_OUT_MS, decode_records

PROG = "python -m txbroker.bench.grpc"
ROW_NAMES = ("send", "tx", "consume", "timer")
PATHS = ("grpc", "remoting")
QUEUES = 4
BROKER_NAME = "bench-grpc"
#: The 5.x client's distribution, from the ``bench`` extra; checked by name, never imported here.
CLIENT_DIST = "rocketmq-python-client"
#: Bounds on a load process's start (client start-up and warm-up call) and on its report after
#: the window closes (its last calls time out after 10 s; a transaction is two calls).
START_TIMEOUT_S = 60.0
REPORT_SLACK_S = 60.0
#: A report line carries every call's latency: asyncio's 64 KiB line limit is far too small.
REPORT_LINE_LIMIT = 1 << 26
#: How long after the last timer's due time the topic may take to hold every timer.
TIMER_GRACE_S = 30.0
#: Records per pull when a timer row's topic is read back.
PULL_BATCH = 512


@dataclass
class Run:
    """One row of one pass."""

    path: str
    row: str
    messages: int
    errors: int
    seconds: float
    msgs_per_s: float
    p50_ms: float
    p99_ms: float
    broker_us_per_msg: float
    client_us_per_msg: float
    #: What the row's check compares: messages the load processes stored (warm-ups included)
    #: against what the topic holds; for a consume row the backlog against what was consumed.
    expected: int
    found: int
    #: Timer rows: each delivered record's store time minus its due time.
    lateness_p50_ms: float = 0.0
    lateness_p99_ms: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.path} {self.row}"

    def problem(self) -> str | None:
        """Why this run fails its check, or None."""
        if self.errors:
            return f"{self.errors} calls failed"
        if self.row == "consume":
            return None if 0 < self.found <= self.expected else \
                f"{self.found:,} consumed of a backlog of {self.expected:,}"
        return None if self.found == self.expected else \
            f"{self.found:,} in the topic of {self.expected:,} stored"


class LoadProcess:
    """One ``bench.grpc_load`` process: started, waited for until ready, released into the
    window with one line on its stdin, then read for its report (each wait bounded)."""

    def __init__(self, path: str, row: str, address: str, topic: str, args: argparse.Namespace,
                 log: Path, index: int, of: int) -> None:
        self.cmd = [sys.executable, "-P", "-m", "txbroker.bench.grpc_load", path, row, address, topic,
                    "--senders", str(args.senders), "--seconds", str(args.seconds),
                    "--max", str(args.max_sends), "--rate", str(args.timer_rate / of),
                    "--delay", str(args.delay), "--index", str(index), "--of", str(of),
                    "--broker", BROKER_NAME]
        self.what = f"{path} {row} load process for {address}"
        #: Its stderr (a file: a pipe nobody reads during the window could fill and stall it).
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None
        #: Its report was read: it is only shutting its client down now.
        self.reported = False

    async def start(self) -> None:
        with self.log.open("wb") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *self.cmd, cwd=REPO, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=err, limit=REPORT_LINE_LIMIT)

    async def event(self, timeout: float) -> dict:
        """The process's next JSON line; its own error line or its end becomes a RuntimeError."""
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the line instead of
            # raising when Ctrl-C's cancellation meets a line that just arrived, and the run
            # went on through the whole window and the next row.
            async with asyncio.timeout(timeout):
                line = await self.proc.stdout.readline()
        except TimeoutError:
            raise RuntimeError(f"{self.what}: no answer within {timeout:g} s") from None
        if not line:
            await self.close()
            err = self.log.read_text(errors="replace").strip().splitlines()
            raise RuntimeError(f"{self.what} ended: {err[-1] if err else 'no output'}")
        event = json.loads(line)
        if "error" in event:
            raise RuntimeError(event["error"])
        self.reported = "count" in event
        return event

    def go(self) -> None:
        self.proc.stdin.write(b"go\n")

    async def close(self) -> None:
        """Wait (bounded) for a process that reported to shut its client down; kill one that
        did not (the row failed, or the run was interrupted: it may be waiting for the window)."""
        if self.proc is None or self.proc.returncode is not None:
            return
        if self.reported:
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
                return
            except TimeoutError:
                pass
        self.proc.kill()
        await self.proc.wait()


async def _invoke(addr: str, code: int, header: dict, what: str) -> RemotingCommand:
    """One request on a connection of its own; an answer other than SUCCESS is a RuntimeError
    naming ``what`` and ``addr``."""
    client = RemotingClient(addr)
    await client.connect()
    try:
        resp = await client.invoke(RemotingCommand.request(code, header), 10)
    finally:
        await client.close()
    if resp.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"{what} at {addr}: {resp.code} {resp.remark}")
    return resp


async def create_topic(addr: str, topic: str) -> None:
    """Created up front with 4 queues, so that both paths route it alike from their first call."""
    await _invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES), "perm": "6"},
        f"create topic {topic}")


async def max_offsets(addr: str, topic: str) -> list[int]:
    """Each queue's max offset: on a fresh topic, the messages it holds."""
    return [int((await _invoke(addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(q)},
                               f"max offset of {topic} queue {q}")).ext_fields["offset"])
            for q in range(QUEUES)]


async def timer_lateness(addr: str, topic: str, want: int, deadline: float) -> list[float]:
    """Read ``topic`` from its start once it holds ``want`` records (or ``deadline``, monotonic,
    passed); each record's store timestamp minus its ``TIMER_OUT_MS``, in ms."""
    while sum(await max_offsets(addr, topic)) < want and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    client = RemotingClient(addr)
    await client.connect()
    late: list[float] = []
    try:
        for qid, end in enumerate(await max_offsets(addr, topic)):
            offset = 0
            while offset < end:
                resp = await client.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE, {
                    "consumerGroup": f"GROUP_{topic}", "topic": topic, "queueId": str(qid),
                    "queueOffset": str(offset), "maxMsgNums": str(PULL_BATCH), "sysFlag": "2",
                    "commitOffset": "-1", "suspendTimeoutMillis": "0", "subscription": "*",
                    "subVersion": "0"}), 10)
                if resp.code != ResponseCode.SUCCESS:
                    raise RuntimeError(f"reading {topic} queue {qid} back at {addr}: "
                                       f"{resp.code} {resp.remark}")
                for m in decode_records(resp.body):
                    due = m.properties.get(PROPERTY_TIMER_OUT_MS)
                    if due is None:
                        raise RuntimeError(f"{topic} at {addr} holds a message delivered without a timer")
                    late.append(float(m.store_timestamp - int(due)))
                offset = int(resp.ext_fields["nextBeginOffset"])
    finally:
        await client.close()
    return late


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def run_row(broker: BrokerProc, path: str, row: str, topic: str,
                  args: argparse.Namespace, logs: Path) -> Run:
    """One row on ``broker``: the topic made (and filled, for consume), the load processes
    started and ready, the window opened for all at once, their reports gathered, the row
    checked."""
    await create_topic(broker.addr, topic)
    if row == "consume":
        stored = await preload(broker.addr, args.backlog, topic=topic)
        if stored < args.backlog:
            raise RuntimeError(f"only {stored:,} of a backlog of {args.backlog:,} stored in {topic}")
    address = broker.grpc if path == "grpc" else broker.namesrv
    # SDK consumers share the queues statically (bench/grpc_load.py): one queue each at least.
    n = min(args.processes, QUEUES) if (path, row) == ("remoting", "consume") else args.processes
    procs = [LoadProcess(path, row, address, topic, args, logs / f"{topic}-{i}.log", i, n)
             for i in range(n)]
    try:
        for p in procs:
            await p.start()
        await asyncio.gather(*(p.event(START_TIMEOUT_S) for p in procs))
        cpu0 = broker.cpu()
        for p in procs:
            p.go()
        reports = await asyncio.gather(*(p.event(args.seconds + REPORT_SLACK_S) for p in procs))
        late: list[float] = []
        if row == "timer":
            want = sum(r["count"] + r["extra"] for r in reports)
            late = sorted(await timer_lateness(broker.addr, topic, want,
                                               time.monotonic() + args.delay + 1 + TIMER_GRACE_S))
        cpu1 = broker.cpu()
    finally:
        for p in procs:
            await p.close()
    count = sum(r["count"] for r in reports)
    active = max(max(r["active_s"] for r in reports), 1e-9)
    latencies = sorted(x for r in reports for x in r["latencies_ms"])
    per = max(count, 1)
    sent = sum(r["count"] + r["extra"] for r in reports)
    if row == "consume":
        expected, found = args.backlog, sent
    elif row == "timer":
        expected, found = sent, len(late)
    else:
        expected, found = sent, sum(await max_offsets(broker.addr, topic))
    return Run(path=path, row=row, messages=count, errors=sum(r["errors"] for r in reports),
               seconds=active, msgs_per_s=count / active,
               p50_ms=_percentile(latencies, 0.50), p99_ms=_percentile(latencies, 0.99),
               broker_us_per_msg=(cpu1 - cpu0) * 1e6 / per,
               client_us_per_msg=sum(r["cpu_s"] for r in reports) * 1e6 / per,
               expected=expected, found=found,
               lateness_p50_ms=_percentile(late, 0.50), lateness_p99_ms=_percentile(late, 0.99))


def row_order(rows: list[str]) -> list[tuple[str, str]]:
    """Each gRPC row beside its remoting twin, in the order ``--rows`` names them."""
    return [(path, row) for row in rows for path in PATHS]


async def run_pass(index: int, args: argparse.Namespace) -> list[Run]:
    """Every row on one fresh broker, in reverse order in odd passes."""
    order = row_order(args.rows)
    runs = []
    with tempfile.TemporaryDirectory(prefix="txbroker-bench-grpc-") as d, \
            BrokerProc("async", d, serve_args=("--grpc-port", "0", "--broker-name", BROKER_NAME)) as broker:
        for path, row in (order if index % 2 == 0 else order[::-1]):
            topic = f"BenchGrpc{index}{path.title()}{row.title()}"
            run = await run_row(broker, path, row, topic, args, Path(d))
            print(f"  pass {index + 1}: {run.label}: {run.messages:,} in {run.seconds:.1f} s, "
                  f"{run.msgs_per_s:,.0f} msgs/s, broker {run.broker_us_per_msg:.1f} µs/msg",
                  file=sys.stderr)
            runs.append(run)
    return runs


def _median_run(runs: list[Run]) -> Run:
    first = runs[0]
    values = {f.name: statistics.median(getattr(r, f.name) for r in runs)
              for f in fields(Run) if f.name not in ("path", "row")}
    return Run(path=first.path, row=first.row, **values)


def summarise(passes: list[list[Run]], rows: list[str]) -> dict:
    """Medians per row, and per gRPC row the median of its per-pass ratios to the remoting twin."""
    by_label: dict[str, list[Run]] = {}
    for runs in passes:
        for r in runs:
            by_label.setdefault(r.label, []).append(r)
    medians = [_median_run(by_label[f"{p} {r}"]) for p, r in row_order(rows)]
    ratios = []
    for row in rows:
        pairs = [({r.label: r for r in runs}[f"grpc {row}"], {r.label: r for r in runs}[f"remoting {row}"])
                 for runs in passes]
        rate = [g.msgs_per_s / m.msgs_per_s for g, m in pairs if m.msgs_per_s > 0]
        cpu = [g.broker_us_per_msg / m.broker_us_per_msg for g, m in pairs if m.broker_us_per_msg > 0]
        ratios.append({"row": row, "msgs_per_s": statistics.median(rate) if rate else 0.0,
                       "broker_cpu_per_msg": statistics.median(cpu) if cpu else 0.0})
    return {"rows": [asdict(m) for m in medians], "ratios": ratios}


def failed_runs(passes: list[list[Run]]) -> list[str]:
    """One line per run that failed its check."""
    return [f"pass {i + 1} {r.label}: {r.problem()}"
            for i, runs in enumerate(passes) for r in runs if r.problem()]


def print_report(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"RocketMQ 5.x gRPC and remoting on one broker (medians of {doc['repeat']} "
                        f"interleaved passes, {doc['seconds']:g} s per row, {doc['processes']} "
                        f"processes × {doc['senders']} senders)")
    for col in ("row", "messages", "msgs/s", "p50 ms", "p99 ms", "broker µs/msg", "client µs/msg",
                "late p50 ms", "late p99 ms"):
        table.add_column(col, justify="left" if col == "row" else "right")
    for r in doc["rows"]:
        late = ((f"{r['lateness_p50_ms']:.0f}", f"{r['lateness_p99_ms']:.0f}") if r["row"] == "timer"
                else ("-", "-"))
        table.add_row(f"{r['path']} {r['row']}", f"{r['messages']:,.0f}", f"{r['msgs_per_s']:,.0f}",
                      f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['broker_us_per_msg']:.1f}",
                      f"{r['client_us_per_msg']:.1f}", *late)
    console = Console(width=140)
    console.print(table)
    if "timer" in doc["row_names"]:
        console.print(f"timer rows: {doc['timer_rate']:,.0f} timers/s asked, each due on the first "
                      f"whole second {doc['delay']:g} s after its send; late = store time - due time")
    for ratio in doc["ratios"]:
        console.print(f"grpc {ratio['row']} / remoting {ratio['row']} (median of per-pass ratios): "
                      f"msgs/s {ratio['msgs_per_s']:.2f}, broker CPU per message "
                      f"{ratio['broker_cpu_per_msg']:.2f}")
    for line in doc["failed"]:
        console.print(f"[red]check failed:[/red] {line}")


def count(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return n


def duration(value: str) -> float:
    x = float(value)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{value}: must be more than 0")
    return x


def row_list(value: str) -> list[str]:
    rows = [r for r in value.split(",") if r]
    bad = [r for r in rows if r not in ROW_NAMES]
    if bad or not rows:
        raise argparse.ArgumentTypeError(f"{value}: rows are {', '.join(ROW_NAMES)}")
    return list(dict.fromkeys(rows))


class _Parser(argparse.ArgumentParser):
    """Bad options are one ``error:`` line (argparse adds the usage above it), exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        print(f"error: {PROG}: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> dict:
    ap = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=row_list, default=list(ROW_NAMES),
                    help=f"which rows, each over gRPC and over remoting: {','.join(ROW_NAMES)}")
    ap.add_argument("--seconds", type=duration, default=3.0, help="load time per row and pass")
    ap.add_argument("--processes", type=count, default=2,
                    help="load processes per row (the 5.x client is synchronous)")
    ap.add_argument("--senders", type=count, default=8,
                    help="threads (5.x client) or coroutines (SDK) per load process, on one client")
    ap.add_argument("--max-sends", type=count, default=100_000,
                    help="calls per load process and row at most (bounds a fast run)")
    ap.add_argument("--backlog", type=count, default=100_000,
                    help="messages stored before each consume row")
    ap.add_argument("--timer-rate", type=duration, default=10_000.0,
                    help="timers sent per second in a timer row, all load processes together")
    ap.add_argument("--delay", type=duration, default=1.0,
                    help="seconds from a timer's send to its due time (at least)")
    ap.add_argument("--repeat", type=count, default=3,
                    help="interleaved passes, each on a fresh broker; medians printed")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    try:  # by its distribution's name: only the load processes import it
        metadata.version(CLIENT_DIST)
    except metadata.PackageNotFoundError:
        raise MissingExtraError(CLIENT_DIST) from None
    import uvloop

    started = time.time()
    passes = []
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        for index in range(args.repeat):
            passes.append(runner.run(run_pass(index, args)))
    doc = {"row_names": args.rows, "seconds": args.seconds, "processes": args.processes,
           "senders": args.senders, "backlog": args.backlog, "timer_rate": args.timer_rate,
           "delay": args.delay, "repeat": args.repeat,
           "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
           "client": f"{CLIENT_DIST} {metadata.version(CLIENT_DIST)}", **summarise(passes, args.rows),
           "failed": failed_runs(passes), "passes": [[asdict(r) for r in runs] for runs in passes]}
    if args.json:
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    else:
        print_report(doc)
    if doc["failed"]:
        sys.exit(1)
    return doc


def _stop_on_sigterm(signum: int, frame: object) -> None:
    """A terminated run unwinds as an interrupted one does: SIGTERM becomes Ctrl-C's SIGINT."""
    signal.raise_signal(signal.SIGINT)


def _main() -> dict:
    """``main`` for the command line: a broker or load process that failed, and an interrupted
    or terminated run, is one line once the broker and the load processes are stopped (the
    ``with`` and ``finally`` blocks have run by then)."""
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        return main()
    except RuntimeError as exc:
        print(f"error: {PROG}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; the broker and load processes it started are stopped",
              file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    run_main(_main, PROG)
