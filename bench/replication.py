"""Commitlog replication: ``python -m txbroker.bench.replication [--mib 64] [--seconds 3]``.

Two real stores in temporary directories, one event loop (uvloop), replicating over loopback
TCP through :class:`~txbroker.store.ha_master.HAMaster` and
:class:`~txbroker.store.ha_slave.HASlave`:

* *catch-up*: the master is filled with ``--mib`` MiB of 4 KiB messages first; then an empty
  slave connects and the time until its log ends where the master's does gives MB/s (the
  slave writes and indexes every byte; target >= 100 MB/s at 1 GiB);
* *lag under load*: with the slave following, puts run for ``--seconds`` (bounded count too);
  every 5 ms the master's and slave's ends are sampled: lag in bytes, and in ms as the time
  from a master end being reached to the slave holding it (median and max).

Both stores share one loop and the machine's cores, so the figures are for this setup, not
two machines.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from txbroker.bench.rows import Rows, print_rows, run_in_data_dir
from txbroker.config import BrokerConfig
from txbroker.store.ha_master import HAMaster
from txbroker.store.ha_slave import HASlave
from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message

MIB = 1024 * 1024
BODY = 4096


def _config(root: Path, segment_size: int) -> BrokerConfig:
    return BrokerConfig(data_dir=str(root), segment_size=segment_size, max_message_size=8192)


async def _open(root: Path, segment_size: int) -> MessageStore:
    store = MessageStore(_config(root, segment_size))
    store.open()
    await store.start()
    return store


async def run(mib: int, seconds: float, data_dir: str, max_puts: int = 2_000_000) -> Rows:
    root = Path(data_dir)
    # RocketMQ's 1 GiB segments for a full-size run; smaller runs still roll a few times.
    segment_size = 1024 * MIB if mib >= 1024 else max(MIB, mib * MIB // 4)
    master = await _open(root / "master", segment_size)
    ha = HAMaster(master, heartbeat=0.5, poll=0.005)
    await ha.start()
    ha.become(1)
    body = b"x" * BODY
    i = 0
    while master.max_physical_offset < mib * MIB:
        await master.put_batch([Message(topic="Bench", queue_id=(i + k) % 8, body=body) for k in range(64)])
        i += 64
    filled = master.max_physical_offset
    slave = await _open(root / "slave", segment_size)
    follower = HASlave(slave, lambda: (ha.host, ha.port), heartbeat=0.5)
    started = time.perf_counter()
    follower.start()
    while slave.max_physical_offset < filled:
        await asyncio.sleep(0.002)
    catch_up = time.perf_counter() - started
    rows: Rows = [
        ("catch-up: log replicated", f"{filled / MIB:,.1f} MiB ({i:,} messages of {BODY} B)"),
        ("catch-up: time", f"{catch_up:.2f} s"),
        ("catch-up: rate", f"{filled / catch_up / 1e6:,.1f} MB/s"),
    ]
    # Lag under load.
    lag_bytes: list[int] = []
    lag_ms: list[float] = []
    pending: list[tuple[float, int]] = []
    stop = False

    async def sample() -> None:
        while not stop:
            now = time.perf_counter()
            pending.append((now, master.max_physical_offset))
            have = slave.max_physical_offset
            lag_bytes.append(max(0, master.max_physical_offset - have))
            while pending and pending[0][1] <= have:
                lag_ms.append((now - pending.pop(0)[0]) * 1000)
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    deadline = time.perf_counter() + seconds
    puts = 0
    while time.perf_counter() < deadline and puts < max_puts:
        await master.put_batch([Message(topic="Bench", queue_id=k % 8, body=body[:1024]) for k in range(16)])
        puts += 16
        await asyncio.sleep(0)
    load_seconds = seconds - max(0.0, deadline - time.perf_counter())
    while slave.max_physical_offset < master.max_physical_offset:
        await asyncio.sleep(0.002)
    stop = True
    await sampler
    rows += [
        ("lag: put load", f"{puts:,} puts of 1 KiB in {load_seconds:.1f} s ({puts / load_seconds:,.0f}/s)"),
        ("lag: bytes, median / max", f"{statistics.median(lag_bytes or [0]):,.0f} / {max(lag_bytes or [0]):,}"),
        ("lag: ms, median / max", f"{statistics.median(lag_ms or [0]):.1f} / {max(lag_ms or [0]):.1f}"),
    ]
    await follower.close()
    await ha.close()
    await master.close()
    await slave.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=64, help="MiB the master holds before the slave starts")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of the put load for the lag")
    ap.add_argument("--data-dir", default=None, help="where the two stores go (default: a temp dir)")
    args = ap.parse_args()

    async def measure(data_dir: str) -> Rows:
        return await run(args.mib, args.seconds, data_dir)

    print_rows(run_in_data_dir(measure, args.data_dir, "txbroker-replication-"))


if __name__ == "__main__":
    main()
