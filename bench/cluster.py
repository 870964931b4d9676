"""Committed transactions per second across cluster layouts: ``python -m txbroker.bench.cluster``.

Every row is measured in one run, each on fresh processes (loopback, ephemeral data dirs),
with the SDK load of :mod:`txbroker.bench.broker` (P coroutines calling
``send_message_in_transaction`` on TransactionProducers whose listener commits, one Consumer
counting what it sees):

* **single** — one ``txbroker serve`` with its embedded name server;
* **2 groups** — a ``txbroker namesrv`` and two masters (``broker-a``, ``broker-b``): the SDK
  spreads the sends over both groups' queues;
* **async+slave** — one group: ASYNC_MASTER (id 0) and a slave (id 1), classic roles;
* **sync+slave** — the same with SYNC_MASTER: a send is answered once the slave holds it.

Per row: transactions seen by the consumer, committed tx/s (seen / window), p50 of one
transaction as the producer sees it, the CPU µs per transaction of all broker processes
together (``/proc/<pid>/stat``, masters and slaves) and of this load process.  For the slave
rows the replication lag is sampled every 0.2 s from both brokers' status: the largest number
of consume-queue entries (messages, over every topic) the slave was behind its master.  The
last line is sync/async, the share of ASYNC_MASTER's rate that SYNC_MASTER keeps.

``--repeat N`` runs the rows N times, interleaved, and prints medians.
Usage: ``python -m txbroker.bench.cluster [--seconds 5] [--producers 32] [--repeat 1]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from txbroker.bench.broker import (
    QUEUES,
    TOPIC,
    BrokerProc,
    SdkLoad,
    Tally,
    proc_cpu_seconds,
)
from txbroker.bench.chaos.cluster import ServiceProcess
from txbroker.bench.chaos.process import BrokerProcess, free_port
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand

ROWS = ("single", "2 groups", "async+slave", "sync+slave")
DRAIN_SECONDS = 15.0
LAG_SAMPLE = 0.2


class Deployment:
    """What one row runs: ``namesrv`` for the clients, the masters' addresses, the brokers'
    pids (for CPU) and, for a group with a slave, the (master, slave) pair to sample."""

    def __init__(self, row: str, root: Path) -> None:
        self.row, self.root = row, root
        self.single: BrokerProc | None = None
        self.namesrv_proc: ServiceProcess | None = None
        self.brokers: list[BrokerProcess] = []
        self.namesrv = ""
        self.masters: list[str] = []
        #: What ``SdkLoad`` gives its clients for TLS: these deployments are plaintext.
        self.client_tls = None

    def start(self) -> None:
        if self.row == "single":
            self.single = BrokerProc("async", str(self.root / "single")).__enter__()
            self.namesrv, self.masters = self.single.namesrv, [self.single.addr]
            return
        self.namesrv_proc = ServiceProcess(["namesrv", "--port", "0", "--log-level", "WARNING"],
                                           r"^txbroker namesrv ready addr=(\S+)$",
                                           self.root / "namesrv.log").start()
        self.namesrv = self.namesrv_proc.addr
        if self.row == "2 groups":
            layout = [("broker-a", 0, "ASYNC_MASTER"), ("broker-b", 0, "ASYNC_MASTER")]
        else:
            role = "SYNC_MASTER" if self.row == "sync+slave" else "ASYNC_MASTER"
            layout = [("broker-a", 0, role), ("broker-a", 1, role)]
        for name, broker_id, role in layout:
            settings = {"listen_host": "127.0.0.1", "broker_port": free_port(), "ha_port": free_port(),
                        "metrics_port": -1, "namesrv_addr": self.namesrv, "broker_name": name,
                        "broker_id": broker_id, "broker_role": role, "flush_mode": "async",
                        "default_queue_nums": QUEUES, "segment_size": 256 * 1024 * 1024,
                        "log_level": "WARNING", "transaction_check_interval": 60,
                        "transaction_timeout": 60, "metadata_sync_interval": 1.0}
            proc = BrokerProcess(self.root / f"{name}-{broker_id}", settings,
                                 self.root / f"{name}-{broker_id}.log")
            proc.start()
            self.brokers.append(proc)
            if broker_id == 0:
                self.masters.append(proc.broker_addr)

    def pids(self) -> list[int]:
        if self.single is not None:
            assert self.single.proc is not None
            return [self.single.proc.pid]
        return [b.pid for b in self.brokers]

    def cpu(self) -> float:
        return sum(proc_cpu_seconds(pid) for pid in self.pids())

    def pair(self) -> tuple[str, str] | None:
        if self.row in ("async+slave", "sync+slave"):
            return self.brokers[0].broker_addr, self.brokers[1].broker_addr
        return None

    def stop(self) -> None:
        if self.single is not None:
            self.single.__exit__()
        for b in self.brokers:
            b.stop()
        if self.namesrv_proc is not None:
            self.namesrv_proc.stop()


async def _invoke(addr: str, code: int, ext: dict[str, str] | None = None) -> RemotingCommand:
    client = RemotingClient(addr)
    await client.connect()
    try:
        return await client.invoke(RemotingCommand.request(code, ext or {}), 10)
    finally:
        await client.close()


async def _create_topic(dep: Deployment) -> None:
    for addr in dep.masters:
        resp = await _invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": TOPIC, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES), "perm": "6"})
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"topic not created at {addr}: {resp.code} {resp.remark}")


async def _entries(addr: str) -> int:
    """Consume-queue entries over every topic of the broker at ``addr`` (from its status)."""
    doc = orjson.loads((await _invoke(addr, RequestCode.BROKER_STATUS)).body)
    return sum(q["maxOffset"] for t in doc["topics"].values() for q in t["queues"])


async def _sample_lag(pair: tuple[str, str], done: asyncio.Event, out: list[int]) -> None:
    master, slave = pair
    while not done.is_set():
        m, s = await asyncio.gather(_entries(master), _entries(slave))
        out.append(max(0, m - s))
        await asyncio.sleep(LAG_SAMPLE)


@dataclass
class Result:
    seen: int
    tps: float
    p50_ms: float
    broker_us: float
    client_us: float
    lag_max: int | None


async def run_row(dep: Deployment, producers: int, seconds: float, max_tx: int) -> Result:
    loop = asyncio.get_running_loop()
    await _create_topic(dep)
    await asyncio.sleep(0.5)  # the name server learns the topic with the next registration
    tally = Tally(max_tx)
    load = SdkLoad(dep, producers, False, tally, True)  # type: ignore[arg-type]
    await load.start()
    lags: list[int] = []
    done = asyncio.Event()
    pair = dep.pair()
    sampler = asyncio.create_task(_sample_lag(pair, done, lags)) if pair else None
    try:
        broker0, client0 = dep.cpu(), time.process_time()
        start = loop.time()
        await asyncio.gather(*(load.produce(i, start + seconds) for i in range(producers)))
        deadline = loop.time() + DRAIN_SECONDS
        while tally.seen < tally.sent and loop.time() < deadline:
            await asyncio.sleep(0.02)
        client1, broker1 = time.process_time(), dep.cpu()
    finally:
        done.set()
        if sampler is not None:
            await sampler
        await load.close()
    elapsed = (tally.last_seen or loop.time()) - start
    count = max(tally.seen, 1)
    lat = sorted(tally.latencies)
    return Result(tally.seen, tally.seen / elapsed if elapsed > 0 else 0.0,
                  lat[len(lat) // 2] * 1e3 if lat else 0.0,
                  (broker1 - broker0) * 1e6 / count, (client1 - client0) * 1e6 / count,
                  max(lags) if pair else None)


def measure(row: str, producers: int, seconds: float, max_tx: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="txbroker-bench-cluster-") as tmp:
        dep = Deployment(row, Path(tmp))
        try:
            dep.start()
            return asyncio.run(run_row(dep, producers, seconds, max_tx))
        finally:
            dep.stop()


def median_result(results: list[Result]) -> Result:
    def med(name: str) -> float:
        return statistics.median(getattr(r, name) for r in results)
    lags = [r.lag_max for r in results if r.lag_max is not None]
    return Result(int(med("seen")), med("tps"), med("p50_ms"), med("broker_us"), med("client_us"),
                  int(statistics.median(lags)) if lags else None)


def table(results: dict[str, Result]) -> str:
    lines = [(f"{'row':<12} {'tx seen':>8} {'tx/s':>8} {'p50 ms':>7} {'broker µs/tx':>13} "
             f"{'client µs/tx':>13} {'lag max msgs':>13}")]
    for row, r in results.items():
        lag = "-" if r.lag_max is None else str(r.lag_max)
        lines.append(f"{row:<12} {r.seen:>8} {r.tps:>8.0f} {r.p50_ms:>7.2f} {r.broker_us:>13.0f} "
                     f"{r.client_us:>13.0f} {lag:>13}")
    if "sync+slave" in results and "async+slave" in results and results["async+slave"].tps:
        ratio = results["sync+slave"].tps / results["async+slave"].tps
        lines.append(f"sync/async committed tx/s: {ratio:.2f} (target >= 0.70)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Result]:
    ap = argparse.ArgumentParser(prog="python -m txbroker.bench.cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="load window per row")
    ap.add_argument("--producers", type=int, default=32, help="concurrent transactions")
    ap.add_argument("--max-tx", type=int, default=1_000_000, help="bound on transactions per row")
    ap.add_argument("--repeat", type=int, default=1, help="runs per row (medians)")
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of " + ", ".join(ROWS))
    args = ap.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    for r in rows:
        if r not in ROWS:
            ap.error(f"unknown row {r!r} (known: {', '.join(ROWS)})")
    runs: dict[str, list[Result]] = {r: [] for r in rows}
    for _ in range(args.repeat):
        for r in rows:
            runs[r].append(measure(r, args.producers, args.seconds, args.max_tx))
    results = {r: median_result(v) for r, v in runs.items()}
    print(f"cluster bench: {args.producers} concurrent transactions, {args.seconds:g} s per row, "
          f"repeat {args.repeat}")
    print(table(results))
    return results


if __name__ == "__main__":
    main()
