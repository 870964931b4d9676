"""txbroker side by side with RabbitMQ and NATS JetStream: ``python -m txbroker.bench.peers``.

One load driver, one table, so the README's comparison can be re-run by anyone with the two
Debian packages (``apt-get install rabbitmq-server nats-server``) and the ``bench`` extra (the
clients).  Every case sends ``--messages`` messages (default 20,000) of 256 B from
``--producers`` coroutines (default 64) in this one process on uvloop, each producer waiting for
its message's answer before the next, each on its own connection unless the case says otherwise;
every server runs alone with this client (started fresh for each case and pass, stopped after);
``--repeat`` passes (default 3), interleaved (the second pass runs the cases in reverse order),
and the medians printed.  The cases:

* **rabbitmq-tx** — RabbitMQ AMQP 0-9-1 on a durable queue: a channel per producer in
  ``tx.select`` mode, each message a persistent ``basic.publish`` then ``tx.commit`` (aio-pika);
* **nats-ack** — NATS JetStream publish, waiting for the PubAck, into a stream with file
  storage (nats-py); **nats-ack-shared** — the same with all producers on one connection;
* **txbroker-tx** / **txbroker-tx-sync** — committed transactions, async and sync flush: half
  SEND_MESSAGE_V2, then the one-way END_TRANSACTION commit, driven by ``bench.broker``'s own raw
  driver (``run_row``, ``--kind tx --client raw``, one connection per producer, a consumer
  draining the topic; a transaction counts when that consumer has seen it);
* **txbroker-plain** — plain sends (SEND_MESSAGE_V2, answered), async flush, the same driver.

Columns: msgs/s (acknowledged messages / the time from the first send to the last answer, or for
txbroker to the last message its consumer saw), p50/p99 of one send as its producer sees it (for
txbroker transactions: half sent to END_TRANSACTION written; for RabbitMQ: publish + commit),
server CPU µs per message (utime + stime of the server's processes from ``/proc``, the whole
process tree for RabbitMQ and NATS, the broker process for txbroker, read before and after the
load, so set-up and shut-down are left out; the kernel counts 10 ms ticks), this client's CPU
µs per message (``time.process_time``), and a ratio of msgs/s: txbroker's transaction against
NATS publish-ack, its sync-flush transaction against RabbitMQ's ``tx.commit``.  What each
acknowledgement promises differs: see docs/bench.md ("Side by side with RabbitMQ and NATS").

A server whose program is not on PATH is skipped with one line naming its package; the machine
(cores, CPU model, kernel), the date and every server's version head the table; ``--json FILE``
writes the same rows for the README.  Each run is bounded by ``--max-seconds``; a run that ends
short of its messages, or whose server does not hold them all afterwards, makes the exit status 1.

Usage: ``python -m txbroker.bench.peers [--messages 20000] [--repeat 3] [--producers 64]
[--cases rabbitmq-tx,nats-ack,...] [--max-seconds 300] [--json FILE]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import orjson

from txbroker.bench.broker import BrokerProc, Tally, _percentile, run_row
from txbroker.bench.extras import require, run_main
from txbroker.bench.peer_servers import (
    NatsServer,
    RabbitServer,
    ServerError,
    find_server,
    missing_line,
)

BODY = b"p" * 256
QUEUE = "txbroker-peers"
STREAM, SUBJECT = "TXBROKER_PEERS", "txbroker.peers"
#: ``bench.broker.run_row`` also reports ratios to a raw echo; this table does not use them.
NO_ECHO = (1.0, 1.0)
#: Seconds to set up or tear down a case's connections (outside the measured window).
SETUP_SECONDS = 60.0
PROG = "python -m txbroker.bench.peers"


@dataclass(frozen=True)
class Case:
    """One row: ``server`` names what runs it; the ratio column is msgs/s over ``against``'s."""

    key: str
    label: str
    server: str
    against: str | None = None


CASES = (
    Case("rabbitmq-tx", "RabbitMQ AMQP tx.commit, durable queue, persistent", "rabbitmq"),
    Case("nats-ack", "NATS JetStream publish-ack, file storage", "nats"),
    Case("nats-ack-shared", "NATS JetStream publish-ack, one connection", "nats"),
    Case("txbroker-tx", "txbroker transaction, async flush", "txbroker", "nats-ack"),
    Case("txbroker-tx-sync", "txbroker transaction, sync flush", "txbroker", "rabbitmq-tx"),
    Case("txbroker-plain", "txbroker plain send, async flush", "txbroker"),
)
BY_KEY = {c.key: c for c in CASES}
#: server -> (program, Debian package, client module, client distribution).
SERVERS = {
    "rabbitmq": ("rabbitmq-server", "rabbitmq-server", "aio_pika", "aio-pika"),
    "nats": ("nats-server", "nats-server", "nats", "nats-py"),
}


@dataclass
class Figures:
    """One run of one case, or (:func:`median`) the medians over its passes."""

    messages: float
    seconds: float
    msgs_per_s: float
    p50_ms: float
    p99_ms: float
    server_us_per_msg: float
    client_us_per_msg: float


def median(runs: list[Figures]) -> Figures:
    return Figures(**{f.name: statistics.median(getattr(r, f.name) for r in runs)
                      for f in fields(Figures)})


async def drive(send: Callable[[int], Awaitable[None]], producers: int, messages: int,
                max_seconds: float, server_cpu: Callable[[], float]) -> Figures:
    """``producers`` coroutines call ``send(index)`` one message after the other until
    ``messages`` were started (``bench.broker``'s Tally bounds count and time, as for txbroker's
    rows); the window is from the first send to the last answer."""
    loop = asyncio.get_running_loop()
    tally = Tally(messages)
    server0, client0 = server_cpu(), time.process_time()
    start = loop.time()
    stop_at = start + max_seconds

    async def producer(idx: int) -> None:
        while tally.may_start(stop_at):
            t0 = time.perf_counter()
            await send(idx)
            tally.latencies.append(time.perf_counter() - t0)
            tally.sent += 1

    await asyncio.gather(*(producer(i) for i in range(producers)))
    elapsed = loop.time() - start
    client_s, server_s = time.process_time() - client0, server_cpu() - server0
    latencies = sorted(tally.latencies)
    count = max(tally.sent, 1)
    return Figures(messages=tally.sent, seconds=elapsed,
                   msgs_per_s=tally.sent / elapsed if elapsed > 0 else 0.0,
                   p50_ms=_percentile(latencies, 0.50) * 1e3,
                   p99_ms=_percentile(latencies, 0.99) * 1e3,
                   server_us_per_msg=server_s * 1e6 / count,
                   client_us_per_msg=client_s * 1e6 / count)


# --- the cases ---------------------------------------------------------------------------------


async def rabbitmq_tx(server: RabbitServer, producers: int, messages: int,
                      max_seconds: float) -> tuple[Figures, int, str]:
    """``tx.select`` channels (publisher confirms off: AMQP allows one of the two per channel),
    one connection each; returns the figures, the durable queue's message count afterwards and
    the server's version from its connection properties."""
    import aio_pika

    conns = []
    try:
        for _ in range(producers):
            conns.append(await aio_pika.connect(host="127.0.0.1", port=server.port,
                                                timeout=SETUP_SECONDS))
        channels = [await c.channel(publisher_confirms=False) for c in conns]
        await channels[0].declare_queue(QUEUE, durable=True)
        txs = [ch.transaction() for ch in channels]
        for tx in txs:
            await tx.select()
        exchanges = [ch.default_exchange for ch in channels]

        async def send(idx: int) -> None:
            await exchanges[idx].publish(
                aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=QUEUE)
            await txs[idx].commit()

        figures = await drive(send, producers, messages, max_seconds, server.cpu)
        check = await conns[0].channel()
        held = (await check.declare_queue(QUEUE, durable=True, passive=True)
                ).declaration_result.message_count
        props = conns[0].transport.connection.server_properties or {}
        version = props.get("version", "")
        return figures, held, version.decode() if isinstance(version, bytes) else str(version)
    finally:
        for c in conns:
            await c.close()


async def nats_ack(server: NatsServer, producers: int, messages: int, max_seconds: float,
                   shared: bool) -> tuple[Figures, int, str]:
    """JetStream publishes waiting for their PubAck, one connection per producer (or one for
    all); returns the figures, the stream's message count afterwards and the version."""
    import nats
    from nats.js.api import StorageType

    conns = []
    try:
        for _ in range(1 if shared else producers):
            conns.append(await nats.connect(f"nats://127.0.0.1:{server.port}",
                                            connect_timeout=SETUP_SECONDS,
                                            allow_reconnect=False))
        streams = [c.jetstream() for c in conns]
        await streams[0].add_stream(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE)

        async def send(idx: int) -> None:
            await streams[idx % len(streams)].publish(SUBJECT, BODY, timeout=10.0)

        figures = await drive(send, producers, messages, max_seconds, server.cpu)
        info = await streams[0].stream_info(STREAM)
        return figures, info.state.messages, server.version
    finally:
        for c in conns:
            await c.close()


async def txbroker_row(broker: BrokerProc, kind: str, producers: int, messages: int,
                       max_seconds: float) -> tuple[Figures, int, str]:
    """``bench.broker``'s raw row as ``--kind tx|plain --client raw --connections each`` runs
    it, with 256-byte bodies; "held" is what its consumer saw."""
    r = await run_row(broker, kind, "raw", producers, False, max_seconds, messages, NO_ECHO, BODY)
    figures = Figures(messages=r.sent, seconds=r.seconds, msgs_per_s=r.tps, p50_ms=r.p50_ms,
                      p99_ms=r.p99_ms, server_us_per_msg=r.broker_us, client_us_per_msg=r.client_us)
    return figures, int(r.seen), importlib.metadata.version("txbroker")


@contextlib.contextmanager
def _txbroker(flush: str) -> Iterator[BrokerProc]:
    with tempfile.TemporaryDirectory(prefix="txbroker-peers-") as d, BrokerProc(flush, d) as broker:
        yield broker


def run_case(runner: asyncio.Runner, case: Case, programs: dict[str, str],
             args: argparse.Namespace) -> tuple[Figures, int, str]:
    """Start the case's server, run the case against it, stop the server (also on error)."""
    bounds = (args.producers, args.messages, args.max_seconds)
    if case.server == "rabbitmq":
        with RabbitServer(programs["rabbitmq"]) as server:
            return runner.run(rabbitmq_tx(server, *bounds))
    if case.server == "nats":
        with NatsServer(programs["nats"]) as server:
            return runner.run(nats_ack(server, *bounds, shared=case.key == "nats-ack-shared"))
    flush = "sync" if case.key == "txbroker-tx-sync" else "async"
    kind = "plain" if case.key == "txbroker-plain" else "tx"
    with _txbroker(flush) as broker:
        return runner.run(txbroker_row(broker, kind, *bounds))


# --- the table ---------------------------------------------------------------------------------


def machine() -> dict[str, str | int]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    return {"cores": os.cpu_count() or 0, "cpu": model or platform.processor(),
            "kernel": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "uvloop": importlib.metadata.version("uvloop")}


def rows_of(cases: list[Case], results: dict[str, list[Figures]]) -> list[dict]:
    """One dict per case run: its medians, and the msgs/s ratio to its ``against`` case when
    that ran too."""
    medians = {key: median(runs) for key, runs in results.items() if runs}
    rows = []
    for case in cases:
        if case.key not in medians:
            continue
        m = medians[case.key]
        base = medians.get(case.against or "")
        ratio = m.msgs_per_s / base.msgs_per_s if base is not None and base.msgs_per_s else None
        rows.append({"case": case.key, "label": case.label, **asdict(m), "ratio": ratio,
                     "ratio_to": case.against if ratio is not None else None})
    return rows


def print_table(doc: dict) -> None:
    m = doc["machine"]
    print(f"machine: {m['cores']} cores, {m['cpu']}, {m['kernel']}; Python {m['python']}, "
          f"uvloop {m['uvloop']}")
    print(f"date: {doc['date']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()))
    print(f"load: {doc['messages']:,} messages of {len(BODY)} B per run, {doc['producers']} "
          f"producers (one connection each unless said), median of {doc['repeat']} "
          f"pass{'es' if doc['repeat'] > 1 else ''} (interleaved)")
    width = max([len(c.label) for c in CASES])
    print(f"{'case':<{width}} {'msgs/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'server µs/msg':>13} "
          f"{'client µs/msg':>13}  ratio")
    for r in doc["rows"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f} × {r['ratio_to']}"
        print(f"{r['label']:<{width}} {r['msgs_per_s']:>8,.0f} {r['p50_ms']:>7.2f} "
              f"{r['p99_ms']:>7.2f} {r['server_us_per_msg']:>13.1f} "
              f"{r['client_us_per_msg']:>13.1f}  {ratio}")


def _select(spec: str) -> list[Case]:
    keys = [k.strip() for k in spec.split(",") if k.strip()]
    for key in keys:
        if key not in BY_KEY:
            raise SystemExit(f"error: --cases {key!r}: not one of {', '.join(BY_KEY)}")
    return [c for c in CASES if c.key in keys]


def _stop_on_sigterm(signum: int, frame: object) -> None:
    """A terminated benchmark unwinds as an interrupted one does (the running case cancelled,
    then every server it started stopped): SIGTERM becomes the SIGINT that Ctrl-C sends."""
    signal.raise_signal(signal.SIGINT)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000, help="messages per case and pass")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved passes; medians printed")
    ap.add_argument("--producers", type=int, default=64)
    ap.add_argument("--cases", default=",".join(BY_KEY), help="a comma-separated subset of: "
                    + ", ".join(BY_KEY))
    ap.add_argument("--max-seconds", type=float, default=300.0,
                    help="bound on one case's run; a run cut short fails the benchmark")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE",
                    help="also write the rows, machine, date and versions to FILE")
    args = ap.parse_args(argv)
    if args.messages < 1 or args.producers < 1 or args.repeat < 1:
        raise SystemExit("error: --messages, --producers and --repeat must be at least 1")
    cases = _select(args.cases)
    import uvloop

    programs: dict[str, str] = {}
    skipped: list[str] = []
    for server in dict.fromkeys(c.server for c in cases if c.server in SERVERS):
        program, package, module, _ = SERVERS[server]
        found = find_server(program)
        if found is None:
            skipped.append(missing_line(server, program, package))
            print(skipped[-1], flush=True)
        else:
            require(module)  # before any server starts: a missing client is one line
            programs[server] = found
    cases = [c for c in cases if c.server == "txbroker" or c.server in programs]
    versions: dict[str, str] = {}
    clients = {dist: importlib.metadata.version(dist)
               for server, (_, _, _, dist) in SERVERS.items() if server in programs}
    results: dict[str, list[Figures]] = {c.key: [] for c in cases}
    short: list[str] = []
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            for rep in range(args.repeat):
                for case in (cases if rep % 2 == 0 else cases[::-1]):
                    figures, held, version = run_case(runner, case, programs, args)
                    versions[case.server] = version
                    results[case.key].append(figures)
                    if not figures.messages == held == args.messages:
                        short.append(f"{case.key} pass {rep + 1}: {figures.messages:,.0f} sent, "
                                     f"{held:,} held by the server, of {args.messages:,}")
                    print(f"  pass {rep + 1} {case.key}: {figures.msgs_per_s:,.0f} msgs/s, "
                          f"server {figures.server_us_per_msg:.1f} µs/msg", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
    doc = {"machine": machine(),
           "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
           "versions": {**versions, **clients}, "messages": args.messages,
           "producers": args.producers, "repeat": args.repeat, "skipped": skipped,
           "rows": rows_of(cases, results)}
    print_table(doc)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    if short:
        for line in short:
            print(f"WARNING: {line}", file=sys.stderr)
        raise SystemExit(1)
    return doc


def _main() -> None:
    """``main`` for the command line: a server that does not start, and an interrupted or
    terminated run, is one line once every server it started has stopped (the ``with`` blocks
    have run by then)."""
    try:
        run_main(main, PROG)
    except ServerError as exc:
        print(f"error: {PROG}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; every server it started is stopped", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    _main()
