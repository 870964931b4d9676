"""Store benchmark: ``python -m txbroker.bench.store`` prints put/get/flush/recovery rates and, in the
same run, the raw ceiling of assigning the same bytes into an mmap slice; then how long a
restart after SIGKILL takes against a 1 GiB segment, by bytes written since the last checkpoint
(``--restart-only`` for just those rows).

Bounded in size (a temp dir, deleted afterwards).  Numbers on a shared 2-core machine are
noisy: compare ratios within one run, and use ``--repeat`` to quote medians.
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from txbroker.config import BrokerConfig
from txbroker.store.message_store import MessageStore, PutStatus
from txbroker.store.record import Message, encode_record
from txbroker.store.segment import MappedSegment

SEGMENT = 256 * 1024 * 1024


def config(root: Path, name: str, **kw: object) -> BrokerConfig:
    return BrokerConfig(data_dir=str(root / name), segment_size=SEGMENT, **kw)  # type: ignore[arg-type]


def raw_mmap(root: Path, body: int, count: int) -> float:
    """The ceiling: the same encoded records assigned into a pre-touched mmap."""
    rec = encode_record(Message("BenchTopic", 0, os.urandom(body), properties={"TAGS": "A", "KEYS": "k"}),
                        physical_offset=0, queue_offset=0, store_timestamp=0, store_host=("127.0.0.1", 10911))
    size = len(rec) * count
    path = root / "raw"
    with open(path, "wb") as fh:
        fh.truncate(size)
    with open(path, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), size)
        mm[0:size] = bytes(size)  # pre-touch, as in docs/bench.md "Machine limits"
        n = len(rec)
        start = time.perf_counter()
        pos = 0
        for _ in range(count):
            mm[pos:pos + n] = rec
            pos += n
        elapsed = time.perf_counter() - start
        mm.close()
    path.unlink()
    return count / elapsed


def _main_thread_progress(work: Callable[[], None]) -> float:
    """Iterations/s this thread manages while ``work`` runs in another thread."""
    th = threading.Thread(target=work)
    th.start()
    n = 0
    start = time.perf_counter()
    while th.is_alive():
        n += 1
    elapsed = time.perf_counter() - start
    th.join()
    return n / elapsed


def flush_methods(root: Path, count: int) -> dict[str, tuple[float, float]]:
    """Durable 4 KiB appends through a mapping, made durable two ways: ``mmap.flush`` of the
    dirty page range (msync) and ``os.fdatasync`` on the file's descriptor (the mapping dirties
    the same page-cache pages).  The flushes run in a thread, as the store's do, and the main
    thread counts how far it gets meanwhile: that is the event loop's share while a flush runs.
    Returns method -> (flushes/s, main-thread progress in % of an idle baseline).

    Read the fdatasync flushes/s with care: the main thread here spins without ever releasing
    the GIL, so after each fdatasync the flushing thread waits up to ``sys.getswitchinterval()``
    (5 ms) to get it back — the row is capped near 1 / 5 ms.  A real event loop idles in epoll
    between callbacks and gives the GIL back at once; the group-commit rows show the real cost."""
    size = 64 * 1024 * 1024
    baseline = _main_thread_progress(lambda: time.sleep(0.5))
    out: dict[str, tuple[float, float]] = {}
    for method in ("msync", "fdatasync"):
        path = root / f"flush-{method}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
            rate: list[float] = []

            def flushes(method: str = method, mm: mmap.mmap = mm, fd: int = fd,
                        rate: list[float] = rate, chunk: bytes = os.urandom(4096)) -> None:
                start = time.perf_counter()
                for i in range(count):
                    pos = (i % (size // 4096)) * 4096
                    mm[pos:pos + 4096] = chunk
                    if method == "msync":
                        mm.flush(pos, 4096)
                    else:
                        os.fdatasync(fd)
                rate.append(count / (time.perf_counter() - start))

            progress = _main_thread_progress(flushes)
            out[method] = (rate[0], 100 * progress / baseline)
            mm.close()
        finally:
            os.close(fd)
            path.unlink()
    return out


def _msync_dirty_range(seg: MappedSegment) -> None:
    """The alternative to segment.py's fdatasync: msync of the segment's dirty page range."""
    start = seg.flushed - seg.flushed % mmap.PAGESIZE
    if seg.wrote > start:
        seg._mm.flush(start, seg.wrote - start)


async def put_rate(root: Path, name: str, body: int, count: int, *, mode: str = "async",
                   writers: int = 1) -> tuple[float, MessageStore]:
    store = MessageStore(config(root, name, flush_mode=mode))
    store.open()
    await store.start()
    payload = os.urandom(body)
    per = count // writers

    async def writer(w: int) -> None:
        for i in range(per):
            r = await store.put(Message("BenchTopic", w % 4, payload, properties={"TAGS": "A", "KEYS": "k"}))
            if r.status is not PutStatus.OK:
                raise RuntimeError(f"put failed: {r}")

    start = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    elapsed = time.perf_counter() - start
    return per * writers / elapsed, store


def get_rate(store: MessageStore) -> float:
    n = 0
    start = time.perf_counter()
    for q in range(4):
        off = 0
        while True:
            res = store.get("BenchTopic", q, off, 32)
            if not res.raw:
                break
            n += len(res.raw)
            off = res.next_offset
    return n / (time.perf_counter() - start)


async def recovery_rate(root: Path, name: str) -> tuple[float, int]:
    """Force a full crash recovery of ``name`` and report MB/s of validated log."""
    data = root / name
    (data / "checkpoint").unlink(missing_ok=True)
    (data / "abort").write_bytes(b"")
    store = MessageStore(config(root, name))
    report = store.open()
    await store.start()
    await store.close()
    return report.bytes_scanned / report.seconds / 1e6, report.bytes_scanned


def _write_then_die(data: str, segment: int, written: int, checkpointed: bool) -> None:
    """In a forked child: store ``written`` bytes of 4 KiB records, optionally reach a
    checkpoint, add one record, then SIGKILL itself.  The parent inherits a crashed store."""
    async def work() -> None:
        # No periodic checkpoint: every byte written counts as "since the last checkpoint".
        store = MessageStore(BrokerConfig(data_dir=data, segment_size=segment, flush_interval=3600.0))
        store.open()
        await store.start()
        payload = os.urandom(4096)
        for _ in range(written // 4096):
            await store.put(Message("BenchTopic", 0, payload))
        if checkpointed:
            await store._checkpoint_once()
        await store.put(Message("BenchTopic", 0, payload[:157]))
        os.kill(os.getpid(), signal.SIGKILL)
    asyncio.run(work())


def crash_restart(root: Path, name: str, written: int, *, checkpointed: bool = False,
                  segment: int = 1024 * 1024 * 1024) -> tuple[float, int]:
    """Seconds :meth:`MessageStore.open` takes after a SIGKILL, and the bytes it validated.

    The writer is a forked child killed mid-run, so the parent finds what a broker restarted
    after ``kill -9`` finds: the abort marker, the last checkpoint, written pages in the page
    cache and the rest of a preallocated ``segment`` never written.
    """
    data = str(root / name)
    pid = os.fork()
    if pid == 0:
        try:
            _write_then_die(data, segment, written, checkpointed)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if not os.WIFSIGNALED(status) or os.WTERMSIG(status) != signal.SIGKILL:
        raise RuntimeError(f"crash writer ended with status {status}, not SIGKILL")
    store = MessageStore(BrokerConfig(data_dir=data, segment_size=segment))
    report = store.open()
    if report.clean:
        raise RuntimeError("a store killed with SIGKILL recovered as clean")
    asyncio.run(store.close())
    shutil.rmtree(data, ignore_errors=True)
    return report.seconds, report.bytes_scanned


async def run_once(root: Path, scale: float) -> dict[str, tuple[float, float | None]]:
    out: dict[str, tuple[float, float | None]] = {}
    n256 = int(200_000 * scale)
    n4k = int(40_000 * scale)
    out["raw mmap slice assignment, 256 B"] = (raw_mmap(root, 256, n256), None)
    for method, (rate, loop_share) in flush_methods(root, int(300 * scale)).items():
        chosen = " (chosen)" if method == "fdatasync" else ""
        out[f"durable 4 KiB append via {method}{chosen}"] = (rate, None)
        out[f"loop progress during {method} flushes"] = (loop_share, None)
    rate, store = await put_rate(root, "a256", 256, n256)
    out["put 256 B, async flush"] = (rate, rate * 256 / 1e6)
    await store.close()
    rate, store = await put_rate(root, "a4k", 4096, n4k)
    out["put 4 KiB, async flush"] = (rate, rate * 4096 / 1e6)
    out["get (32 per call), 4 KiB"] = (get_rate(store), None)
    await store.close()
    rate, store = await put_rate(root, "s1", 256, int(2_000 * scale), mode="sync", writers=1)
    out["put 256 B, sync flush, 1 writer"] = (rate, None)
    await store.close()
    rate, store = await put_rate(root, "s64", 256, int(100_000 * scale), mode="sync", writers=64)
    per_flush = int(100_000 * scale) / max(1, int(store.stats()["group_commit_flushes"]))
    out["put 256 B, sync flush (fdatasync), 64 writers"] = (rate, None)
    out["  messages per group-commit flush"] = (per_flush, None)
    await store.close()
    rate, store = await put_rate(root, "s256", 256, int(100_000 * scale), mode="sync", writers=256)
    out["put 256 B, sync flush (fdatasync), 256 writers"] = (rate, None)
    await store.close()
    chosen = MappedSegment.sync
    MappedSegment.sync = _msync_dirty_range  # type: ignore[method-assign]
    try:
        rate, store = await put_rate(root, "s64m", 256, int(100_000 * scale), mode="sync", writers=64)
        out["put 256 B, sync flush (msync variant), 64 writers"] = (rate, None)
        await store.close()
    finally:
        MappedSegment.sync = chosen  # type: ignore[method-assign]
    mbs, scanned = await recovery_rate(root, "a4k")
    out[f"recovery ({scanned / 1e6:.0f} MB validated)"] = (mbs, None)
    return out


def restart_rows(root: Path, scale: float) -> dict[str, tuple[float, float | None]]:
    """Restart after SIGKILL against a 1 GiB segment, by bytes written since the checkpoint."""
    out: dict[str, tuple[float, float | None]] = {}
    mib = 1024 * 1024
    cases = [("1 record", 0, False), ("64 MiB", 64 * mib, False),
             ("1 GiB", int(1024 * mib * scale) // 4096 * 4096, False),
             ("1 GiB checkpointed + 1 record", int(1024 * mib * scale) // 4096 * 4096, True)]
    for label, written, checkpointed in cases:
        seconds, scanned = crash_restart(root, "crash", written, checkpointed=checkpointed)
        out[f"restart after SIGKILL, 1 GiB segment, {label}"] = (seconds, scanned / 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=1, help="runs; the table shows medians")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    ap.add_argument("--restart-only", action="store_true",
                    help="only the restart-after-SIGKILL rows")
    args = ap.parse_args()
    runs: list[dict[str, tuple[float, float | None]]] = []
    for _ in range(args.repeat):
        root = Path(tempfile.mkdtemp(prefix="txbroker-bench-store-"))
        try:
            run = {} if args.restart_only else asyncio.run(run_once(root, args.scale))
            run.update(restart_rows(root, args.scale))  # forks: outside any event loop
            runs.append(run)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    table = Table(title=f"txbroker store (median of {args.repeat})")
    table.add_column("operation")
    table.add_column("rate", justify="right")
    table.add_column("MB/s (restart: MB validated)", justify="right")
    for key in runs[0]:
        rates = [r[key][0] for r in runs if key in r]
        mbs = [r[key][1] for r in runs if key in r and r[key][1] is not None]
        unit = ("s" if key.startswith("restart") else "MB/s" if key.startswith("recovery") else "flushes/s" if key.startswith("durable")
                else "% of idle" if key.startswith("loop") else "" if key.startswith(" ") else "msgs/s")
        fmt = ",.3f" if unit == "s" else ",.0f"
        table.add_row(key, f"{statistics.median(rates):{fmt}} {unit}",
                      f"{statistics.median(mbs):,.0f}" if mbs else "")
    Console().print(table)


if __name__ == "__main__":
    main()
