"""Remoting round trips on loopback, against the raw ceiling of a minimal asyncio echo.

    python -m txbroker.bench.remoting [--seconds 3] [--body 256]
    python -m txbroker.bench.remoting --cpu [--round-trips 20000] [--reps 3]

The server runs in a separate process (this machine has 2 cores: one serves, one loads), on
uvloop.  Three servers are measured in one run, each in its own process:

* **echo** — the ceiling: a minimal ``asyncio.Protocol`` that sends back every length-prefixed
  frame it receives, one write per read.  No decoding, no dispatch.
* **txbroker** — :class:`RemotingServer` with a no-op handler that answers each request with
  its body (so both directions carry the same bytes as the echo).

Two load generators: **raw**, a minimal protocol that sends pre-encoded request frames and
counts whole answer frames (it measures the server, not the client), and **client**, the real
:class:`RemotingClient` with ``invoke`` (end to end, what the SDK sees).  Each cell runs for a
bounded time after a short warm-up; passes are interleaved and the median is reported.
Shapes: 1 connection sequential, 1 connection with 64 requests in flight, 64 connections with
one in flight each.

Round trips per second on this shared 2-core machine move with whatever else runs, so
``--cpu`` measures cost instead of rate: a fixed number of :class:`RemotingClient` round trips
per shape against the txbroker server process, and the CPU time each process spent on them
(the server reports its own), in µs per round trip, median of ``--reps`` interleaved passes.
Other processes slow it down only through shared caches, not by taking turns on the cores.
The two ends stay in two processes, as in a deployment: in one process they would share the
connection core's code with two classes, which costs the interpreter's attribute caches more
than either end pays on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

from txbroker.config import BrokerConfig
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codec import encode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.server import RemotingServer, new_event_loop

CODE = 10
WARMUP = 0.3


# --- servers (child process) -------------------------------------------------------------------


class _Echo(asyncio.Protocol):
    """The ceiling: echo whole length-prefixed frames, one write per read."""

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        end = 0
        n = len(buf)
        while n - end >= 4:
            size = 4 + int.from_bytes(buf[end:end + 4], "big")
            if n - end < size:
                break
            end += size
        if end:
            self.transport.write(bytes(buf[:end]))
            del buf[:end]


async def _serve(kind: str) -> None:
    loop = asyncio.get_running_loop()
    if kind == "echo":
        server = await loop.create_server(_Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
    else:
        remoting = RemotingServer(BrokerConfig(max_connections=1024))

        async def noop(conn, cmd):
            return cmd.response(body=cmd.body)

        remoting.register(CODE, noop)
        port = await remoting.start("127.0.0.1", 0)
    print(f"PORT {port}", flush=True)
    # Each line from the parent asks for this process's CPU seconds so far; EOF ends it.
    while await loop.run_in_executor(None, sys.stdin.readline):
        print(f"CPU {time.process_time()!r}", flush=True)


# --- load generators ---------------------------------------------------------------------------


class _RawLoad(asyncio.Protocol):
    """Keeps ``depth`` frames in flight on one connection and counts answers."""

    def __init__(self, frame: bytes, depth: int, stats: dict) -> None:
        self.frame, self.depth, self.stats = frame, depth, stats
        self.buf = bytearray()

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.frame * self.depth)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        end = done = 0
        n = len(buf)
        while n - end >= 4:
            size = 4 + int.from_bytes(buf[end:end + 4], "big")
            if n - end < size:
                break
            end += size
            done += 1
        if end:
            del buf[:end]
            self.stats["n"] += done
            if self.stats["run"]:
                self.transport.write(self.frame * done)


async def _measure(stats: dict, seconds: float) -> float:
    await asyncio.sleep(WARMUP)
    n0, t0 = stats["n"], time.perf_counter()
    await asyncio.sleep(seconds)
    n1, t1 = stats["n"], time.perf_counter()
    stats["run"] = False
    return (n1 - n0) / (t1 - t0)


async def raw_load(port: int, frame: bytes, conns: int, depth: int, seconds: float,
                   stats: dict | None = None) -> float:
    """Round trips/s over ``seconds`` after the warm-up.  ``stats["n"]``, when the caller passes
    ``stats``, counts every answer, warm-up included, to divide the server's CPU time by."""
    loop = asyncio.get_running_loop()
    if stats is None:
        stats = {}
    stats.update(n=0, run=True)
    transports = []
    for _ in range(conns):
        t, _p = await loop.create_connection(lambda: _RawLoad(frame, depth, stats), "127.0.0.1", port)
        transports.append(t)
    rate = await _measure(stats, seconds)
    for t in transports:
        t.close()
    return rate


async def echo_ceiling(conns: int, depth: int, seconds: float, body_size: int = 256) -> tuple[float, float]:
    """The raw echo's round trips/s and its CPU µs per round trip, in a fresh echo process.

    For benchmarks that quote their figures against the ceiling measured in the same run
    (``bench/broker.py``), since this shared machine's absolute rates move between runs.
    """
    frame = encode(RemotingCommand.request(CODE, {"topic": "BenchTopic", "queueId": "0"},
                                           os.urandom(body_size)))
    echo = _ServerProcess("echo")
    try:
        stats: dict = {}
        cpu0 = echo.cpu()
        rate = await raw_load(echo.port, frame, conns, depth, seconds, stats)
        cpu_us = (echo.cpu() - cpu0) * 1e6 / max(stats["n"], 1)
    finally:
        echo.stop()
    return rate, cpu_us


async def client_load(port: int, body: bytes, conns: int, depth: int, seconds: float) -> float:
    stats = {"n": 0, "run": True}
    clients = [RemotingClient(f"127.0.0.1:{port}") for _ in range(conns)]
    for c in clients:
        await c.connect()

    async def worker(c: RemotingClient) -> None:
        while stats["run"]:
            await c.invoke(RemotingCommand.request(CODE, {"topic": "BenchTopic", "queueId": "0"}, body), 10.0)
            stats["n"] += 1

    tasks = [asyncio.create_task(worker(c)) for c in clients for _ in range(depth)]
    rate = await _measure(stats, seconds)
    await asyncio.gather(*tasks)
    for c in clients:
        await c.close()
    return rate


# --- CPU per round trip (one process) ----------------------------------------------------------


async def cpu_per_round_trip(server: _ServerProcess, body: bytes, conns: int, depth: int,
                             round_trips: int) -> tuple[float, float]:
    """CPU µs per round trip of this (client) process and of the server process.

    A warm-up of a tenth of the round trips runs first (connections made, caches warm);
    ``conns * depth`` workers then share exactly ``round_trips`` invokes.
    """
    clients = [RemotingClient(f"127.0.0.1:{server.port}") for _ in range(conns)]
    for c in clients:
        await c.connect()
    left = 0

    async def worker(c: RemotingClient) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await c.invoke(RemotingCommand.request(CODE, {"topic": "BenchTopic", "queueId": "0"}, body), 10.0)

    async def run(n: int) -> None:
        nonlocal left
        left = n
        await asyncio.gather(*(worker(c) for c in clients for _ in range(depth)))

    try:
        await run(max(round_trips // 10, conns * depth))
        server0, client0 = server.cpu(), time.process_time()
        await run(round_trips)
        client1, server1 = time.process_time(), server.cpu()
        return (client1 - client0) * 1e6 / round_trips, (server1 - server0) * 1e6 / round_trips
    finally:
        for c in clients:
            await c.close()


async def _run_cpu(body_size: int, round_trips: int,
                   reps: int) -> list[tuple[str, list[float], list[float]]]:
    """Per shape: client and server CPU µs per round trip of each pass."""
    body = os.urandom(body_size)
    samples: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label, _, _ in SHAPES}
    server = _ServerProcess("txbroker")
    try:
        for _ in range(reps):
            for label, conns, depth in SHAPES:
                client_us, server_us = await cpu_per_round_trip(server, body, conns, depth, round_trips)
                samples[label][0].append(client_us)
                samples[label][1].append(server_us)
    finally:
        server.stop()
    return [(label, client, srv) for label, (client, srv) in samples.items()]


def _print_cpu(rows: list[tuple[str, list[float], list[float]]], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"CPU µs per round trip, RemotingClient and RemotingServer processes, "
                        f"{args.body}-byte bodies, uvloop (median of {args.reps} interleaved "
                        f"passes, {args.round_trips:,} round trips each; min-max)")
    table.add_column("shape")
    table.add_column("client process", justify="right")
    table.add_column("server process", justify="right")
    table.add_column("both", justify="right")
    for label, client, server in rows:
        both = [c + s for c, s in zip(client, server, strict=True)]
        table.add_row(label, *(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
                               for v in (client, server, both)))
    Console(width=150).print(table)


# --- driver ------------------------------------------------------------------------------------


class _ServerProcess:
    def __init__(self, kind: str) -> None:
        # As this module was started (``-m`` when installed, else the file), so that the server
        # runs the same txbroker as the load.
        me = ["-m", __spec__.name] if __spec__ is not None else [os.path.abspath(__file__)]
        self.proc = subprocess.Popen([sys.executable, *me, "--serve", kind],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"{kind} server did not start: {line!r}")
        self.port = int(line.split()[1])

    def cpu(self) -> float:
        """The server process's CPU seconds so far (user + system)."""
        self.proc.stdin.write("cpu\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("CPU "):
            raise RuntimeError(f"server did not report its CPU time: {line!r}")
        return float(line.split()[1])

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


SHAPES = [("1 connection, sequential", 1, 1),
          ("1 connection, 64 in flight", 1, 64),
          ("64 connections, 1 in flight each", 64, 1)]


async def _run(seconds: float, body_size: int, reps: int) -> list[tuple[str, float, float, float]]:
    """Median over ``reps`` interleaved passes, so that load from other processes on this
    shared machine hits the ceiling and txbroker alike and the ratios stay comparable."""
    body = os.urandom(body_size)
    frame = encode(RemotingCommand.request(CODE, {"topic": "BenchTopic", "queueId": "0"}, body))
    cell = seconds / reps
    samples: dict[tuple[str, str], list[float]] = {}
    echo, broker = _ServerProcess("echo"), _ServerProcess("txbroker")
    try:
        for _ in range(reps):
            for label, conns, depth in SHAPES:
                for variant, run in (
                        ("ceiling", raw_load(echo.port, frame, conns, depth, cell)),
                        ("server", raw_load(broker.port, frame, conns, depth, cell)),
                        ("client", client_load(broker.port, body, conns, depth, cell))):
                    samples.setdefault((label, variant), []).append(await run)
    finally:
        echo.stop()
        broker.stop()
    return [(label, *(statistics.median(samples[(label, v)]) for v in ("ceiling", "server", "client")))
            for label, _, _ in SHAPES]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured time per cell")
    parser.add_argument("--reps", type=int, default=3, help="interleaved passes (median)")
    parser.add_argument("--body", type=int, default=256, help="body bytes per request")
    parser.add_argument("--cpu", action="store_true",
                        help="CPU µs per round trip of the client and of the server process")
    parser.add_argument("--round-trips", type=int, default=20000,
                        help="round trips per cell with --cpu")
    parser.add_argument("--serve", choices=["echo", "txbroker"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(_serve(args.serve))
        return
    if args.cpu:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            _print_cpu(runner.run(_run_cpu(args.body, args.round_trips, max(1, args.reps))), args)
        return
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        rows = runner.run(_run(args.seconds, args.body, max(1, args.reps)))

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Remoting round trips/s, loopback, {args.body}-byte bodies, uvloop, "
                        f"server in its own process (median of {args.reps} passes, "
                        f"{args.seconds:g} s per cell)")
    table.add_column("shape")
    table.add_column("raw echo ceiling", justify="right")
    table.add_column("txbroker server (raw load)", justify="right")
    table.add_column("% of ceiling", justify="right")
    table.add_column("txbroker server + RemotingClient", justify="right")
    table.add_column("% of ceiling", justify="right")
    for label, ceiling, server, e2e in rows:
        table.add_row(label, f"{ceiling:,.0f}", f"{server:,.0f}", f"{100 * server / ceiling:.0f} %",
                      f"{e2e:,.0f}", f"{100 * e2e / ceiling:.0f} %")
    console = Console(width=150)
    console.print(table)
    label, ceiling, server, e2e = rows[-1]
    console.print(f"{label}: txbroker server at {100 * server / ceiling:.0f} % of the raw ceiling "
                  f"(target >= 50 %), {100 * e2e / ceiling:.0f} % end to end with RemotingClient.")


if __name__ == "__main__":
    main()
