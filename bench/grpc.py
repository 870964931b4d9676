"""RocketMQ 5.x clients over gRPC beside the remoting path: ``python -m txbroker.bench.grpc``.

One ``txbroker serve --grpc-port 0`` per pass runs in its own process (ephemeral ports, temp data
dir, async flush) and carries four rows, interleaved:

* **grpc send** — the unmodified ``rocketmq-python-client`` (5.1.2) sending normal messages to
  the gRPC endpoint: SendMessage, each answered;
* **remoting send** — the txbroker SDK's ``Producer.send`` to the same broker over the 4.x
  remoting protocol;
* **grpc tx** — committed transactions through the 5.x client: a half by SendMessage
  (``message_type=TRANSACTION``), then EndTransaction commit;
* **remoting tx** — the SDK's ``send_message_in_transaction`` (half, then END_TRANSACTION
  commit).

Every row runs ``--processes`` load processes (``bench/grpc_load.py``), each with ``--senders``
threads (5.x client) or coroutines (SDK) sharing one producer, for ``--seconds`` (bounded by
``--max-sends`` per process).  This process never loads the 5.x client itself: its protobuf
names are those of txbroker's gRPC stubs, so the client stays in the load processes and the
broker's stubs in the broker process.  Each process starts its client and sends one warm-up
message before the window opens; the window opens for every process of the row at once.

Per row: messages (sends or transactions answered), msgs/s, p50/p99 of one send as its sender
sees it (for tx: half sent to commit answered, or sent one-way by the SDK), the broker process's
CPU µs per message (``/proc/<pid>/stat`` before and after the window, 10 ms ticks) and the load
processes' (their own CPU time over the window, every thread).  After each row the topic's
queues are asked for their max offsets: every message a load process stored (the warm-up
included) must be there, or the row is marked and the exit status is 1.

``--repeat N`` runs N passes, each on a fresh broker, the rows in reverse order in odd passes, and
prints the medians, then the gRPC rows against their remoting twins: the median over the
passes of each pass's ratio (msgs/s, broker CPU per message), since both rows of a pass saw the
same machine.  ``--json`` prints one document (``rows`` of medians, ``ratios``, ``passes``
with every run) instead of the table.

Usage: ``python -m txbroker.bench.grpc [--seconds 3] [--processes 2] [--senders 8]
[--max-sends 100000] [--repeat 3] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import typing
from dataclasses import asdict, dataclass, fields
from importlib import metadata
from pathlib import Path

import orjson

from txbroker.bench.broker import REPO, BrokerProc
from txbroker.bench.extras import MissingExtraError, run_main
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand

#: The rows of a pass, in the order of even passes: each gRPC row beside its remoting twin.
ROWS = (("grpc", "send"), ("remoting", "send"), ("grpc", "tx"), ("remoting", "tx"))
QUEUES = 4
#: The 5.x client's distribution, from the ``bench`` extra; checked by name, never imported here.
CLIENT_DIST = "rocketmq-python-client"
#: Bounds on a load process's start (client start-up and warm-up send) and on its report after
#: the window closes (its last sends time out after 10 s; a transaction is two calls).
START_TIMEOUT_S = 60.0
REPORT_SLACK_S = 60.0
#: A report line carries every send's latency: asyncio's 64 KiB line limit is far too small.
REPORT_LINE_LIMIT = 1 << 26


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
    #: Messages the load processes stored (warm-ups included) and what the topic holds.
    expected: int
    stored: int

    @property
    def label(self) -> str:
        return f"{self.path} {self.row}"


class LoadProcess:
    """One ``bench.grpc_load`` process: started, waited for until ready, released into the
    window with one line on its stdin, then read for its report (each wait bounded)."""

    def __init__(self, path: str, row: str, address: str, topic: str, args: argparse.Namespace,
                 log: Path) -> None:
        self.cmd = [sys.executable, "-P", "-m", "txbroker.bench.grpc_load", path, row, address, topic,
                    "--senders", str(args.senders), "--seconds", str(args.seconds),
                    "--max", str(args.max_sends)]
        self.what = f"{path} {row} load process for {address}"
        #: Its stderr (a file: a pipe nobody reads during the window could fill and stall it).
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("wb") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *self.cmd, cwd=REPO, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=err, limit=REPORT_LINE_LIMIT)

    async def event(self, timeout: float) -> dict:
        """The process's next JSON line; its own error line or its end becomes a RuntimeError."""
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raise RuntimeError(f"{self.what}: no answer within {timeout:g} s") from None
        if not line:
            await self.close()
            err = self.log.read_text(errors="replace").strip().splitlines()
            raise RuntimeError(f"{self.what} ended: {err[-1] if err else 'no output'}")
        event = json.loads(line)
        if "error" in event:
            raise RuntimeError(event["error"])
        return event

    def go(self) -> None:
        self.proc.stdin.write(b"go\n")

    async def close(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def create_topic(addr: str, topic: str) -> None:
    """Created up front with 4 queues, so that both paths route it alike from their first send."""
    client = RemotingClient(addr)
    await client.connect()
    try:
        resp = await client.invoke(RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES),
            "perm": "6"}), 10)
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"topic {topic} not created at {addr}: {resp.code} {resp.remark}")
    finally:
        await client.close()


async def stored_count(addr: str, topic: str) -> int:
    """Messages in ``topic``'s queues: the sum of their max offsets (a fresh topic)."""
    client = RemotingClient(addr)
    await client.connect()
    try:
        total = 0
        for qid in range(QUEUES):
            resp = await client.invoke(RemotingCommand.request(
                RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(qid)}), 10)
            if resp.code != ResponseCode.SUCCESS:
                raise RuntimeError(f"max offset of {topic} queue {qid} at {addr}: {resp.remark}")
            total += int(resp.ext_fields["offset"])
        return total
    finally:
        await client.close()


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def run_row(broker: BrokerProc, path: str, row: str, topic: str,
                  args: argparse.Namespace, logs: Path) -> Run:
    """One row on ``broker``: the load processes started and ready, the window opened for all
    at once, their reports gathered, the topic counted."""
    await create_topic(broker.addr, topic)
    address = broker.grpc if path == "grpc" else broker.namesrv
    procs = [LoadProcess(path, row, address, topic, args, logs / f"{topic}-{i}.log")
             for i in range(args.processes)]
    try:
        for p in procs:
            await p.start()
        await asyncio.gather(*(p.event(START_TIMEOUT_S) for p in procs))
        cpu0 = broker.cpu()
        for p in procs:
            p.go()
        reports = await asyncio.gather(*(p.event(args.seconds + REPORT_SLACK_S) for p in procs))
        cpu1 = broker.cpu()
    finally:
        for p in procs:
            await p.close()
    count = sum(r["count"] for r in reports)
    seconds = max(r["seconds"] for r in reports)
    latencies = sorted(x for r in reports for x in r["latencies_ms"])
    per = max(count, 1)
    return Run(path=path, row=row, messages=count, errors=sum(r["errors"] for r in reports),
               seconds=seconds, msgs_per_s=count / seconds if seconds > 0 else 0.0,
               p50_ms=_percentile(latencies, 0.50), p99_ms=_percentile(latencies, 0.99),
               broker_us_per_msg=(cpu1 - cpu0) * 1e6 / per,
               client_us_per_msg=sum(r["cpu_s"] for r in reports) * 1e6 / per,
               expected=sum(r["stored"] for r in reports),
               stored=await stored_count(broker.addr, topic))


async def run_pass(index: int, args: argparse.Namespace) -> list[Run]:
    """Every row on one fresh broker, in reverse order in odd passes."""
    order = ROWS if index % 2 == 0 else ROWS[::-1]
    runs = []
    with tempfile.TemporaryDirectory(prefix="txbroker-bench-grpc-") as d, \
            BrokerProc("async", d, serve_args=("--grpc-port", "0")) as broker:
        for path, row in order:
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


def summarise(passes: list[list[Run]]) -> dict:
    """Medians per row, and per gRPC row the median of its per-pass ratios to the remoting twin."""
    by_label: dict[str, list[Run]] = {}
    for runs in passes:
        for r in runs:
            by_label.setdefault(r.label, []).append(r)
    medians = [_median_run(by_label[f"{p} {r}"]) for p, r in ROWS]
    ratios = []
    for row in ("send", "tx"):
        pairs = [({r.label: r for r in runs}[f"grpc {row}"], {r.label: r for r in runs}[f"remoting {row}"])
                 for runs in passes]
        rate = [g.msgs_per_s / m.msgs_per_s for g, m in pairs if m.msgs_per_s > 0]
        cpu = [g.broker_us_per_msg / m.broker_us_per_msg for g, m in pairs if m.broker_us_per_msg > 0]
        ratios.append({"row": row, "msgs_per_s": statistics.median(rate) if rate else 0.0,
                       "broker_cpu_per_msg": statistics.median(cpu) if cpu else 0.0})
    return {"rows": [asdict(m) for m in medians], "ratios": ratios}


def short_rows(passes: list[list[Run]]) -> list[str]:
    """Runs whose topic does not hold what their load processes stored, or that had errors."""
    return [f"pass {i + 1} {r.label}: {r.stored:,} stored of {r.expected:,}, {r.errors} errors"
            for i, runs in enumerate(passes) for r in runs
            if r.stored != r.expected or r.errors]


def print_report(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"RocketMQ 5.x gRPC and remoting on one broker (medians of {doc['repeat']} "
                        f"interleaved passes, {doc['seconds']:g} s per row, {doc['processes']} "
                        f"processes × {doc['senders']} senders)")
    for col in ("row", "messages", "msgs/s", "p50 ms", "p99 ms", "broker µs/msg", "client µs/msg"):
        table.add_column(col, justify="left" if col == "row" else "right")
    for r in doc["rows"]:
        table.add_row(f"{r['path']} {r['row']}", f"{r['messages']:,.0f}", f"{r['msgs_per_s']:,.0f}",
                      f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['broker_us_per_msg']:.1f}",
                      f"{r['client_us_per_msg']:.1f}")
    console = Console(width=120)
    console.print(table)
    for ratio in doc["ratios"]:
        console.print(f"grpc {ratio['row']} / remoting {ratio['row']} (median of per-pass ratios): "
                      f"msgs/s {ratio['msgs_per_s']:.2f}, broker CPU per message "
                      f"{ratio['broker_cpu_per_msg']:.2f}")
    for line in doc["short"]:
        console.print(f"[red]not all stored:[/red] {line}")


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


class _Parser(argparse.ArgumentParser):
    """Bad options are one ``error:`` line (argparse adds the usage above it), exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        print(f"error: python -m txbroker.bench.grpc: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> dict:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=duration, default=3.0, help="load time per row and pass")
    ap.add_argument("--processes", type=count, default=2,
                    help="load processes per row (the 5.x client is synchronous)")
    ap.add_argument("--senders", type=count, default=8,
                    help="threads (5.x client) or coroutines (SDK) per load process, on one producer")
    ap.add_argument("--max-sends", type=count, default=100_000,
                    help="sends per load process and row at most (bounds a fast run)")
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
    doc = {"seconds": args.seconds, "processes": args.processes, "senders": args.senders,
           "repeat": args.repeat, "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
           "client": f"{CLIENT_DIST} {metadata.version(CLIENT_DIST)}", **summarise(passes),
           "short": short_rows(passes), "passes": [[asdict(r) for r in runs] for runs in passes]}
    if args.json:
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    else:
        print_report(doc)
    if doc["short"]:
        sys.exit(1)
    return doc


def _main() -> dict:
    try:
        return main()
    except RuntimeError as exc:  # a broker or load process that failed: one line, no traceback
        print(f"error: python -m txbroker.bench.grpc: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    run_main(_main, "python -m txbroker.bench.grpc")
