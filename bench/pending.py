"""Broker memory per pending half, check-pass time and recovery time at many pending halves:
``python -m txbroker.bench.pending [--halves 1000000]``.

The halves are prepared in-process through ``TransactionalMessageService.prepare`` on a real
``MessageStore`` (temp dir): the code path a half SEND takes in ``txbroker serve`` minus the
socket and the frame decode.  Why not over the wire: filling a million halves through a
socket costs minutes of CPU on both sides and measures the transport, while what is measured
here is what the *service* keeps per pending half, which is the same either way; in-process
the fill takes a fraction of that and the process that is measured holds nothing else.
Halves carry RocketMQ-shaped properties (a 32-hex-character ``UNIQ_KEY``, ``KEYS``, ``TAGS``,
``PGROUP``) and ``--body`` byte bodies.

Memory, both ways, over the fill:

* *tracemalloc*: Python allocations still alive after the fill, per half;
* *RSS*: growth of the process's anonymous resident memory (``RssAnon`` in
  ``/proc/self/status``: the store's mapped files are file-backed and not counted), minus
  what tracemalloc itself used for its traces, per half.

Both include the service's cache of recently prepared halves (bounded by its body bytes; the
commit path builds final messages from it): the table shows its share separately, measured by
tracemalloc when it is emptied.

The check pass (``check_now``, the periodic pass) runs against a stub producer connection that
counts the CHECK_TRANSACTION_STATE requests (the socket is not what is measured).  The first
``--due`` halves are stored 3 s before the rest (``transaction_timeout`` is 6 s): a pass at
that moment finds none due; 3 s later exactly those ``--due`` halves are due and are checked.
Then the service and store are closed and reopened: ``recover()`` from the clean-close
snapshot, and without it (the full replay after a crash).

The fill stops early at ``--max-seconds`` (the table says how many halves it reached);
progress goes to stderr every 5 %.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

from txbroker.bench.clock import ManualClock
from txbroker.bench.rows import print_rows, run_in_data_dir
from txbroker.config import BrokerConfig
from txbroker.service.clients import ClientRegistry
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.transaction.service import TransactionalMessageService
from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message

GROUP = "PG_BENCH"
IMMUNITY_S = 6.0


@dataclass
class StubConnection:
    """A producer connection that is always writable and counts the checks sent to it."""

    checks: int = 0
    closed: bool = False
    writable: bool = True
    peer: str = "stub"

    def send_oneway(self, cmd: object) -> None:
        self.checks += 1


def _config(data_dir: str) -> BrokerConfig:
    return BrokerConfig(data_dir=data_dir, broker_port=0, namesrv_port=-1, metrics_port=-1,
                        segment_size=256 * 1024 * 1024, flush_mode="async",
                        transaction_check_interval=3600.0, transaction_timeout=IMMUNITY_S,
                        transaction_check_max=1_000_000, check_concurrency=1 << 30)


def rss_anon() -> int:
    """Anonymous resident memory of this process in bytes (0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def _open(cfg: BrokerConfig, clock: ManualClock) -> tuple[MessageStore, TransactionalMessageService, float]:
    store = MessageStore(cfg, clock=clock, store_host=("127.0.0.1", 10911))
    store.open()
    await store.start()
    tx = TransactionalMessageService(cfg, store, ClientRegistry(clock=clock), BrokerMetrics(),
                                     clock=clock)
    t0 = time.perf_counter()
    tx.recover()
    took = time.perf_counter() - t0
    await tx.start()
    return store, tx, took


async def _fill(tx: TransactionalMessageService, conn: StubConnection, start: int, end: int,
                total: int, body: bytes, prefix: str, deadline: float) -> int:
    """Prepare halves ``start..end-1``; returns where it stopped (``end`` unless out of time)."""
    step = max(1, total // 20)
    for i in range(start, end):
        msg = Message(topic="BenchTopic", queue_id=i % 4, body=body,
                      properties={"TRAN_MSG": "true", "PGROUP": GROUP,
                                  "UNIQ_KEY": f"{prefix}{i:012X}", "TAGS": "TagA",
                                  "KEYS": f"order-{i}"},
                      sys_flag=4, born_timestamp=int(time.time() * 1000))
        result = await tx.prepare(msg, conn)
        assert result.ok, result
        if (i + 1) % step == 0:
            print(f"  filled {i + 1:,} of {total:,}", file=sys.stderr, flush=True)
            if time.monotonic() > deadline:
                return i + 1
    return end


async def run(halves: int, due: int, body_size: int, repeat: int, max_seconds: float,
              data_dir: str) -> list[tuple[str, str]]:
    cfg = _config(data_dir)
    clock = ManualClock()
    store, tx, _ = await _open(cfg, clock)
    conn = StubConnection()
    body = b"x" * body_size
    prefix = os.urandom(10).hex().upper()
    rows: list[tuple[str, str]] = []

    rss0 = rss_anon()
    tracemalloc.start()
    traced0 = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    deadline = time.monotonic() + max_seconds
    filled = await _fill(tx, conn, 0, min(due, halves), halves, body, prefix, deadline)
    clock.advance(IMMUNITY_S / 2)
    if filled == min(due, halves):
        filled = await _fill(tx, conn, filled, halves, halves, body, prefix, deadline)
    fill_s = time.perf_counter() - t0
    traced = tracemalloc.get_traced_memory()[0] - traced0
    rss = rss_anon() - rss0 - tracemalloc.get_tracemalloc_memory()
    recent = tx._recent_bytes
    tx._recent.clear()  # what the cache of recent halves held, by tracemalloc
    cache = traced - (tracemalloc.get_traced_memory()[0] - traced0)
    tx._recent_bytes = 0
    tracemalloc.stop()
    assert tx.pending_count() == filled
    n = max(filled, 1)
    rows.append(("pending halves", f"{filled:,}" + ("" if filled == halves else
                                                    f" (of {halves:,}: --max-seconds reached)")))
    rows.append((f"fill ({body_size} B bodies, under tracemalloc)",
                 f"{fill_s:,.1f} s ({filled / max(fill_s, 1e-9):,.0f} halves/s)"))
    rows.append(("bytes per pending half, tracemalloc (Python objects alive)", f"{traced / n:,.0f} B"))
    rows.append(("bytes per pending half, RSS (RssAnon growth - tracemalloc's own)", f"{rss / n:,.0f} B"))
    rows.append((f"  of which the recent-halves cache ({recent / 1e6:,.1f} MB of bodies)",
                 f"{cache / n:,.0f} B"))
    rows.append(("bytes per pending half without that cache, tracemalloc",
                 f"{(traced - cache) / n:,.0f} B"))

    idle, busy = [], []
    for _ in range(repeat):
        report = await tx.check_now()
        assert report.due == 0, report
        idle.append(report.elapsed)
    clock.advance(IMMUNITY_S / 2)
    n_due = min(due, filled)
    for _ in range(repeat):
        sent = conn.checks
        report = await tx.check_now()
        assert report.due == n_due and conn.checks - sent == n_due, report
        busy.append(report.elapsed)
    rows.append((f"check pass, none due (median of {repeat})", f"{statistics.median(idle) * 1000:,.2f} ms"))
    rows.append((f"check pass, {n_due:,} due and checked (median of {repeat})",
                 f"{statistics.median(busy) * 1000:,.2f} ms"))

    await tx.close()
    await store.close()
    store, tx, took = await _open(cfg, clock)
    assert tx.recovered_from_snapshot and tx.pending_count() == filled
    rows.append(("restart: recover() from the clean-close snapshot", f"{took:,.2f} s"))
    await tx.close()
    await store.close()
    tx.snapshot_path.unlink()
    store, tx, took = await _open(cfg, clock)
    assert not tx.recovered_from_snapshot and tx.pending_count() == filled
    rows.append(("restart: recover() without snapshot (full replay, as after a crash)",
                 f"{took:,.2f} s"))
    await tx.close()
    await store.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--halves", type=int, default=1_000_000)
    ap.add_argument("--due", type=int, default=1_000, help="halves due at the second pass")
    ap.add_argument("--body", type=int, default=256, help="body bytes per half")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=600.0, help="bound on the fill")
    ap.add_argument("--data-dir", default=None, help="default: a fresh temp dir, removed after")
    args = ap.parse_args(argv)
    if args.halves < 1 or args.due < 0 or args.body < 1 or args.repeat < 1:
        ap.error("--halves >= 1, --due >= 0, --body >= 1 and --repeat >= 1")
    print_rows(run_in_data_dir(lambda d: run(args.halves, args.due, args.body, args.repeat, args.max_seconds, d), args.data_dir, "pending-"))

if __name__ == "__main__":
    main()
