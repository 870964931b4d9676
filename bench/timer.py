"""Timer message lateness under load: ``python -m txbroker.bench.timer [--rate 10000]
[--seconds 10] [--delay 2.0] [--producers 4]``.

A fresh ``txbroker serve`` runs in its own process (ephemeral ports, temp data dir); this
process sends timer messages (SDK ``Producer.send`` with ``deliver_time_ms``) at ``--rate``
per second for ``--seconds``, each due ``--delay`` seconds after it is sent, so from
``--delay`` seconds on the broker takes in and delivers timers at the same rate at once.  One
SDK consumer drains the topic.  A timer's lateness is its delivered record's store timestamp
minus ``TIMER_OUT_MS`` (the time it was due): both stamped by the broker's clock, so it is the
time from "due" to "visible in its topic", whatever the consumer's own lag.

Prints the sent and achieved rate, the timers delivered (all of them, or the bench says how
many are missing), lateness p50 / p99 / max and how many came more than 100 ms late, and the
broker's CPU µs per timer (from ``/proc/<pid>/stat``; a send, a timer record, a settle share
and the delivered record).  The load generator shares the machine's cores with the broker:
compare rows of one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from txbroker.bench.chaos.process import BrokerProcess
from txbroker.bench.rows import print_rows
from txbroker.client import Consumer, Message, Producer
from txbroker.client.admin import AdminClient
from txbroker.store.record import PROPERTY_TIMER_OUT_MS

TOPIC = "BenchTimer"
#: How long, past the last timer's due time, the consumer may take to see everything.
DRAIN_GRACE = 30.0
#: Sends are issued in ticks of this many seconds (a burst of rate * TICK each).
TICK = 0.01


def broker_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def send_at_rate(namesrv: str, rate: int, seconds: float, delay_ms: int,
                       producers: int) -> tuple[int, float]:
    """Send ``rate`` timers per second for ``seconds``; returns (sent, achieved rate)."""
    total = int(rate * seconds)
    clients = [Producer(f"PG_BENCH_TIMER_{i}", namesrv) for i in range(producers)]
    for p in clients:
        await p.start()
    sent = 0
    start = time.monotonic()
    try:
        while sent < total:
            due_count = min(total, int((time.monotonic() - start) * rate) + 1)
            if due_count <= sent:
                await asyncio.sleep(TICK)
                continue
            now_ms = int(time.time() * 1000)
            burst = [clients[i % producers].send(Message(TOPIC, b"t" * 64, keys=str(i),
                                                         deliver_time_ms=now_ms + delay_ms))
                     for i in range(sent, due_count)]
            await asyncio.gather(*burst)
            sent = due_count
    finally:
        for p in clients:
            await p.shutdown()
    return sent, sent / (time.monotonic() - start)


async def drain(namesrv: str, want: int, deadline: float, out: list[float | None]) -> None:
    consumer = Consumer("CG_BENCH_TIMER", namesrv, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe(TOPIC)
    async with consumer:
        while len(out) < want and time.monotonic() < deadline:
            msg = await consumer.poll(1.0)
            if msg is not None:  # no TIMER_OUT_MS: a send retried past its time, stored as is
                due = msg.properties.get(PROPERTY_TIMER_OUT_MS)
                out.append(msg.store_timestamp - int(due) if due else None)


async def measure(args: argparse.Namespace, data_dir: Path) -> list[tuple[str, str]]:
    proc = BrokerProcess(data_dir, {"listen_host": "127.0.0.1", "broker_port": 0,
                                    "namesrv_port": 0, "metrics_port": -1},
                         data_dir.parent / "broker.log")
    proc.start()
    try:
        async with AdminClient(proc.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, 8)
        total = int(args.rate * args.seconds)
        lateness: list[float | None] = []
        deadline = time.monotonic() + args.seconds + args.delay + DRAIN_GRACE
        draining = asyncio.create_task(drain(proc.namesrv_addr, total, deadline, lateness))
        pid = proc.proc.pid
        cpu0 = broker_cpu_seconds(pid)
        sent, achieved = await send_at_rate(proc.namesrv_addr, args.rate, args.seconds,
                                            int(args.delay * 1000), args.producers)
        await draining
        cpu = broker_cpu_seconds(pid) - cpu0
    finally:
        proc.stop()
    ordered = sorted(v for v in lateness if v is not None)
    immediate = len(lateness) - len(ordered)
    sent_text = (f"{sent:,} at {achieved:,.0f}/s (asked {args.rate:,}/s), due {args.delay:g} s "
                 "after their send")
    rows = [("timers sent", sent_text),
            ("timers delivered", f"{len(lateness):,}" + ("" if len(lateness) == sent else
                                                         f" ({sent - len(lateness):,} missing)")
             + (f", {immediate:,} of them sent (retried) after their time" if immediate else ""))]
    if ordered:
        rows += [("lateness p50", f"{percentile(ordered, 0.50):.0f} ms"),
                 ("lateness p99", f"{percentile(ordered, 0.99):.0f} ms"),
                 ("lateness max", f"{ordered[-1]:.0f} ms"),
                 ("mean", f"{statistics.fmean(ordered):.1f} ms"),
                 ("over 100 ms late", f"{sum(1 for v in ordered if v > 100):,}"),
                 ("early (< 0 ms)", f"{sum(1 for v in ordered if v < 0):,}"),
                 ("broker CPU per timer", f"{cpu / max(sent, 1) * 1e6:.0f} µs")]
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=10_000, help="timers sent per second")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long they are sent")
    ap.add_argument("--delay", type=float, default=2.0, help="each is due this long after its send")
    ap.add_argument("--producers", type=int, default=4, help="SDK producers sending")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="txb-timer-bench-") as tmp:
        rows = asyncio.run(measure(args, Path(tmp) / "data"))
    print_rows(rows)


if __name__ == "__main__":
    main()
