"""Check-pass cost and transaction-state recovery: ``python -m txbroker.bench.txcheck``.

Builds a real store (temp dir) holding ``--resolved`` decided transactions (half + op record;
every tenth one committed, so it also has its final message) and ``--pending`` undecided
halves, all through ``TransactionalMessageService`` — the same code path as the broker.  The
pending halves were "sent" on a real loopback connection whose client counts the
CHECK_TRANSACTION_STATE requests it receives (and never answers, so they stay pending).

Then, with an injected clock:

* *pass, none due*: every pending half is younger than its immunity (the walk alone);
* *pass, all due*: every pending half is checked (read back, re-encoded, sent one-way, count
  persisted in one record);

each the median of ``--repeat`` passes; then the store and service are reopened twice and
``recover()`` is timed: from the clean-close snapshot, and without it (the full replay a
crash leads to).  Target: a pass over 1,000,000 resolved and
1,000 pending halves in <= 100 ms.

Usage: ``python -m txbroker.bench.txcheck [--resolved 1000000] [--pending 1000] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from txbroker.bench.clock import ManualClock
from txbroker.bench.rows import print_rows, run_in_data_dir
from txbroker.config import BrokerConfig
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.server import RemotingServer
from txbroker.service.clients import ClientRegistry
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.transaction.service import TransactionalMessageService
from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message

GROUP = "PG_BENCH"
COMMIT, ROLLBACK = 8, 12


def _config(data_dir: str) -> BrokerConfig:
    return BrokerConfig(data_dir=data_dir, broker_port=0, namesrv_port=-1, metrics_port=-1,
                        segment_size=256 * 1024 * 1024, flush_mode="async",
                        transaction_check_interval=3600.0, transaction_timeout=6.0,
                        transaction_check_max=1_000_000, check_concurrency=64)


def _half(i: int, prefix: str) -> Message:
    return Message(topic="BenchTopic", queue_id=i % 4, body=b"x" * 64,
                   properties={"TRAN_MSG": "true", "PGROUP": GROUP, "UNIQ_KEY": f"{prefix}{i:030d}",
                               "TAGS": "T", "KEYS": f"k{i}"},
                   sys_flag=4, born_timestamp=int(time.time() * 1000))


async def _open(cfg: BrokerConfig, clock: ManualClock) -> tuple[MessageStore, TransactionalMessageService, float, float]:
    store = MessageStore(cfg, clock=clock, store_host=("127.0.0.1", 10911))
    t0 = time.perf_counter()
    store.open()
    t1 = time.perf_counter()
    await store.start()
    tx = TransactionalMessageService(cfg, store, ClientRegistry(clock=clock), BrokerMetrics(),
                                     clock=clock)
    t2 = time.perf_counter()
    tx.recover()
    t3 = time.perf_counter()
    await tx.start()
    return store, tx, t1 - t0, t3 - t2


async def run(resolved: int, pending: int, repeat: int, data_dir: str) -> list[tuple[str, str]]:
    cfg = _config(data_dir)
    clock = ManualClock()
    store, tx, _, _ = await _open(cfg, clock)
    rows: list[tuple[str, str]] = []

    t0 = time.perf_counter()
    for i in range(resolved):
        r = await tx.prepare(_half(i, "R"), None)
        await tx.end_transaction(commit_log_offset=r.physical_offset,
                                 tran_state_table_offset=r.queue_offset, producer_group=GROUP,
                                 commit_or_rollback=COMMIT if i % 10 == 0 else ROLLBACK)
    build_resolved = time.perf_counter() - t0
    rows.append((f"build: {resolved:,} resolved transactions (half + op; 1 in 10 committed)",
                 f"{build_resolved:,.1f} s ({resolved / max(build_resolved, 1e-9):,.0f} tx/s)"))

    # a real producer connection that receives the checks
    server = RemotingServer(cfg)
    conns: list = []

    async def hello(conn, cmd: RemotingCommand) -> RemotingCommand:
        conns.append(conn)
        return cmd.response(ResponseCode.SUCCESS)

    server.register(int(RequestCode.HEART_BEAT), hello)
    port = await server.start("127.0.0.1", 0)
    client = RemotingClient(f"127.0.0.1:{port}")
    received = 0

    def on_check(cmd: RemotingCommand) -> None:
        nonlocal received
        received += 1

    client.register(RequestCode.CHECK_TRANSACTION_STATE, on_check)
    await client.connect()
    await client.invoke(RemotingCommand.request(RequestCode.HEART_BEAT, {}), 5.0)
    conn = conns[0]

    t0 = time.perf_counter()
    for i in range(pending):
        await tx.prepare(_half(i, "P"), conn)
    rows.append((f"build: {pending:,} pending halves", f"{time.perf_counter() - t0:,.2f} s"))
    assert tx.pending_count() == pending

    idle, busy = [], []
    for _ in range(repeat):
        report = await tx.check_now()  # clock not advanced: none due
        assert report.due == 0
        idle.append(report.elapsed)
    for n in range(1, repeat + 1):
        clock.advance(10.0)
        report = await tx.check_now()
        assert report.sent == pending, report
        busy.append(report.elapsed)
        deadline = time.monotonic() + 30
        while received < n * pending and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    rows.append((f"check pass, {resolved:,} resolved + {pending:,} pending, none due (median of {repeat})",
                 f"{statistics.median(idle) * 1000:,.2f} ms"))
    rows.append(((f"check pass, {resolved:,} resolved + {pending:,} pending, all due: "
                 f"{pending:,} checks sent (median of {repeat})"),
                 f"{statistics.median(busy) * 1000:,.2f} ms"))
    rows.append(("checks received by the producer", f"{received:,} of {repeat * pending:,}"))

    await client.close()
    await server.close(1.0)
    await tx.close()
    await store.close()

    store, tx, open_s, recover_s = await _open(cfg, clock)
    rows.append((f"restart: store.open() ({store.max_physical_offset / 1e6:,.0f} MB commitlog)",
                 f"{open_s:,.2f} s"))
    assert tx.recovered_from_snapshot and tx.pending_count() == pending
    rows.append(("restart: recover() from the clean-close snapshot", f"{recover_s:,.3f} s"))
    await tx.close()
    await store.close()

    tx.snapshot_path.unlink()  # as after a crash: no snapshot, full replay
    store, tx, _, recover_s = await _open(cfg, clock)
    assert not tx.recovered_from_snapshot and tx.pending_count() == pending
    rows.append(("restart: recover() without snapshot (full replay, as after a crash)",
                 f"{recover_s:,.2f} s"))
    await tx.close()
    await store.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--resolved", type=int, default=1_000_000)
    ap.add_argument("--pending", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--data-dir", default=None, help="default: a fresh temp dir, removed after")
    args = ap.parse_args()
    if args.resolved < 0 or args.pending < 1 or args.repeat < 1:
        ap.error("--resolved >= 0, --pending >= 1 and --repeat >= 1")
    print_rows(run_in_data_dir(lambda d: run(args.resolved, args.pending, args.repeat, d), args.data_dir, "txcheck-"))

if __name__ == "__main__":
    main()
