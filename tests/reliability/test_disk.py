"""Disk faults: the disk guard refuses writes clearly while reads go on; a real disk that fills
up (a small tmpfs) is refused clearly, loses nothing and resumes when space returns; a damaged
commitlog tail at start-up is truncated and the broker serves.

The guard's threshold is ``disk_max_used_ratio``.  Two ways to cross it: a ratio below the data
disk's real usage (a subprocess broker, restarted with a higher ratio), and, live under load, a
disk-usage probe injected into an in-process :class:`Broker` whose numbers the test moves up and
down (the probe models the disk the way an injected clock models time; everything else is real).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from support.waiting import eventually

from txbroker.bench.chaos.driver import LedgerListener
from txbroker.bench.chaos.ledger import Ledger
from txbroker.broker import Broker
from txbroker.client import Consumer, Message, Producer, TransactionProducer
from txbroker.client.errors import ClientError
from txbroker.store.message_store import DISK_PROBE_INTERVAL


async def consume_keys(namesrv: str, group: str, topic: str, want: int, timeout: float = 3.0) -> list[str]:
    got: list[str] = []
    consumer = Consumer(group, namesrv, from_where="first", long_poll_timeout=0.5)
    consumer.subscribe(topic)
    async with consumer:
        while len(got) < want and (msg := await consumer.poll(timeout)) is not None:
            got.append(msg.keys)
    return got


async def send_keys(namesrv: str, topic: str, keys: list[str]) -> None:
    async with Producer("disk_pg", namesrv) as producer:
        for k in keys:
            await producer.send(Message(topic, k.encode() * 20, keys=k))


async def test_disk_guard_refuses_writes_clearly_reads_continue_writes_resume(broker_process):
    proc = broker_process(flush_mode="sync")
    before = [f"b{i}" for i in range(30)]
    await send_keys(proc.namesrv_addr, "DiskTopic", before)
    proc.stop()

    proc.restart(disk_max_used_ratio=0.0001)  # any real disk is fuller than this
    refusals = []
    async with Producer("disk_pg", proc.namesrv_addr, retries=0) as producer:
        for i in range(5):
            with pytest.raises(ClientError) as err:
                await producer.send(Message("DiskTopic", b"refused", keys=f"r{i}"))
            refusals.append(str(err.value))
    assert all("disk" in r.lower() for r in refusals), refusals
    ledger = Ledger()
    tx = TransactionProducer("disk_tx_pg", proc.namesrv_addr, listener=LedgerListener(ledger), retries=0)
    await tx.start()
    try:
        ledger.begin("t0", "commit")
        with pytest.raises(ClientError, match="(?i)disk"):
            await tx.send_message_in_transaction(Message("DiskTopic", b"half", keys="t0"), "t0")
    finally:
        await tx.shutdown()
    # Reads go on while writes are refused.
    assert sorted(await consume_keys(proc.namesrv_addr, "disk_cg", "DiskTopic", len(before))) == sorted(before)

    proc.restart(disk_max_used_ratio=1.0)  # space is back
    after = [f"a{i}" for i in range(10)]
    await send_keys(proc.namesrv_addr, "DiskTopic", after)
    got = await consume_keys(proc.namesrv_addr, "disk_cg2", "DiskTopic", len(before) + len(after))
    assert sorted(got) == sorted(before + after)  # nothing refused was stored


class Disk:
    """The data disk as the broker's disk-guard probe sees it (``shutil.disk_usage``'s shape):
    the test moves ``used`` up and down; the probe calls are counted."""

    def __init__(self, total: int = 100 * 2**30) -> None:
        self.total = total
        self.used = total // 2
        self.probes = 0

    def usage(self, path: str) -> tuple[int, int, int]:
        self.probes += 1
        return self.total, self.used, self.total - self.used

    def set_used(self, ratio: float) -> None:
        self.used = int(self.total * ratio)


LOAD_TOPIC = "DiskLoadTopic"
#: Per producer; the phases below stop the load long before (bounded count and time).
MAX_SENDS = 3000
#: The broker must notice a change of the disk within one probe interval, on its own; this is
#: what the client-side measurement may add (a round trip on two shared cores).
NOTICE_SLACK = 1.0


class Load:
    """What the producers were told, with the moment they were told it (monotonic seconds)."""

    def __init__(self) -> None:
        self.acked: list[tuple[float, str]] = []
        self.refused: list[tuple[float, str, str]] = []
        self.stop = asyncio.Event()

    def acked_keys(self, prefix: str = "") -> list[str]:
        return [k for _t, k in self.acked if k.startswith(prefix)]

    def acked_after(self, t: float, prefix: str) -> list[float]:
        return [at for at, k in self.acked if at > t and k.startswith(prefix)]

    def refused_after(self, t: float, prefix: str) -> list[float]:
        return [at for at, k, _e in self.refused if at > t and k.startswith(prefix)]


async def plain_load(namesrv: str, n: int, load: Load) -> None:
    # retries=0: every refusal is one answer of the broker, and is reported as such.
    async with Producer(f"disk_load_pg{n}", namesrv, retries=0) as producer:
        for i in range(MAX_SENDS):
            if load.stop.is_set():
                break
            key = f"p{n}-{i}"
            try:
                await producer.send(Message(LOAD_TOPIC, key.encode() * 16, keys=key))
            except ClientError as exc:
                load.refused.append((time.monotonic(), key, str(exc)))
            else:
                load.acked.append((time.monotonic(), key))
            await asyncio.sleep(0.005)


async def tx_load(producer: TransactionProducer, ledger: Ledger, load: Load) -> None:
    for i in range(MAX_SENDS):
        if load.stop.is_set():
            break
        key = f"t{i}"
        ledger.begin(key, "commit")
        try:
            await producer.send_message_in_transaction(Message(LOAD_TOPIC, key.encode() * 16, keys=key), key)
        except ClientError as exc:
            ledger.send_failed(key)
            load.refused.append((time.monotonic(), key, str(exc)))
        else:
            load.acked.append((time.monotonic(), key))
        await asyncio.sleep(0.005)


class HoldingListener(LedgerListener):
    """Holds the local transaction of one key until ``release`` is set: its commit then reaches
    the broker at a moment the test chooses."""

    def __init__(self, ledger: Ledger, hold: str) -> None:
        super().__init__(ledger)
        self.hold = hold
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def execute_local_transaction(self, msg, arg):
        if arg == self.hold:
            self.holding.set()
            await self.release.wait()
        return super().execute_local_transaction(msg, arg)





@pytest.mark.slow
async def test_disk_guard_under_load_refuses_clearly_reads_go_on_writes_resume_live(broker_config):
    disk = Disk()
    # The test default transaction_check_max (15 checks, 0.2 s apart) is far shorter than the
    # full-disk period: no check may be sent, or counted, while the store refuses writes, or a
    # half whose commit the full disk refused would be discarded.
    broker = Broker(broker_config.replace(disk_max_used_ratio=0.9), disk_usage=disk.usage)
    await broker.start()
    namesrv = broker.namesrv_addr
    ledger, load = Ledger(), Load()
    received: list[tuple[float, str]] = []
    listener = HoldingListener(ledger, "t-held")
    tx = TransactionProducer("disk_load_tx_pg", namesrv, listener=listener, retries=0)
    consumer = Consumer("disk_load_cg", namesrv, from_where="first", long_poll_timeout=0.5)
    consumer.subscribe(LOAD_TOPIC)
    consuming_done = asyncio.Event()

    async def consume() -> None:
        while not consuming_done.is_set():
            msg = await consumer.poll(0.2)
            if msg is not None:
                received.append((time.monotonic(), msg.keys))
                if msg.keys.startswith("t"):
                    ledger.delivered(msg.keys, msg.queue_id, msg.queue_offset)

    tasks: list[asyncio.Task] = []
    try:
        # The topic exists before the load starts, so every producer routes to all its queues.
        await send_keys(namesrv, LOAD_TOPIC, ["p-warm"])
        load.acked.append((time.monotonic(), "p-warm"))
        await tx.start()
        await consumer.start()
        tasks.append(asyncio.create_task(consume()))
        tasks += [asyncio.create_task(plain_load(namesrv, n, load)) for n in range(2)]
        tasks.append(asyncio.create_task(tx_load(tx, ledger, load)))
        async with asyncio.timeout(90):
            # 1. Space: everything is stored.
            await eventually(lambda: all(len(load.acked_keys(p)) >= 20 for p in ("p0-", "p1-", "t")), 15,
                        "20 acknowledged sends per producer")
            assert not load.refused, load.refused[:3]
            # One transaction's half is stored now, its commit is sent once the disk is full.
            ledger.begin("t-held", "commit")
            tasks.append(asyncio.create_task(tx.send_message_in_transaction(
                Message(LOAD_TOPIC, b"held", keys="t-held"), "t-held")))
            await eventually(listener.holding.is_set, 5, "the held transaction's half stored")

            # 2. The disk fills up above disk_max_used_ratio: the broker notices by itself.
            filled_at = time.monotonic()
            disk.set_used(0.95)
            await eventually(lambda: all(load.refused_after(filled_at, p) for p in ("p0-", "p1-", "t")),
                        DISK_PROBE_INTERVAL + 5, "sends and half sends refused")
            first_refusal = min(at for at, _k, _e in load.refused)
            assert first_refusal - filled_at < DISK_PROBE_INTERVAL + NOTICE_SLACK
            # A commit arriving now cannot be applied: the half stays pending, nothing visible
            # (check-backs answer "commit" again and are refused again until space returns).
            listener.release.set()
            # Each load loop has one send in flight at a time and each has had one refused since
            # the disk filled, so whatever was in flight before has landed: from here nothing is
            # accepted while the disk stays full, through at least two more probes.
            acked_when_full = len(load.acked)
            refused_when_full = len(load.refused)
            probes_when_full = disk.probes
            stored_before = set(load.acked_keys("p"))
            # Reads go on: the running consumer gets everything stored before, and a consumer
            # group that joins now reads it all from the start.
            await eventually(lambda: stored_before <= {k for _t, k in received}, 10,
                        "the running consumer received every plain send stored before")
            late = await consume_keys(namesrv, "disk_full_cg", LOAD_TOPIC, len(stored_before) + 10_000,
                                      timeout=1.0)
            assert stored_before <= set(late) and len(late) == len(set(late))
            assert set(late) <= stored_before | set(ledger.txns)
            # Two more probes, a probe interval apart, both still answering "full".
            await eventually(lambda: disk.probes >= probes_when_full + 2, 2 * DISK_PROBE_INTERVAL + 5,
                        "the broker probing the disk again while it is full")
            probed_at = time.monotonic()
            await eventually(lambda: all(load.refused_after(probed_at, p) for p in ("p0-", "p1-", "t")),
                             5, "every load loop answered again after those probes")
            assert len(load.acked) == acked_when_full, load.acked[acked_when_full:][:3]
            assert all(load.refused_after(first_refusal + DISK_PROBE_INTERVAL, p)
                       for p in ("p0-", "p1-", "t")), "refusals stopped while the disk was full"
            assert len(load.refused) > refused_when_full
            assert broker.tx.pending_count() >= 1 and "t-held" not in {k for _t, k in received}
            assert "disk" in broker.store.stats()["disk_refusal"]

            # 3. Space returns: sends resume on the same broker, no restart.
            freed_at = time.monotonic()
            disk.set_used(0.5)
            await eventually(lambda: all(load.acked_after(freed_at, p) for p in ("p0-", "p1-", "t")),
                        DISK_PROBE_INTERVAL + 5, "sends and half sends accepted again")
            first_ack = min(load.acked_after(freed_at, ""))
            assert first_ack - freed_at < DISK_PROBE_INTERVAL + NOTICE_SLACK
            await eventually(lambda: all(len(load.acked_after(freed_at, p)) >= 20 for p in ("p0-", "p1-", "t")),
                        15, "20 acknowledged sends per producer after space returned")
            load.stop.set()
            await asyncio.gather(*tasks[1:])

            # 4. Settle: commits the full disk refused are applied through check-backs.
            await eventually(lambda: broker.tx.pending_count() == 0, 20, "every half resolved")
            committed = {k for k, t in ledger.txns.items() if t.truth == "commit"}
            want = set(load.acked_keys("p")) | committed
            await eventually(lambda: want <= {k for _t, k in received}, 20, "every stored message consumed")
            await asyncio.sleep(1.0)  # the behaviour under test: no duplicate arrives in this window
            consuming_done.set()
            await tasks[0]
    finally:
        load.stop.set()
        consuming_done.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await consumer.shutdown()
        await tx.shutdown()
        await broker.stop()

    counts = Counter(k for _t, k in received)
    assert [k for k, n in counts.items() if n != 1] == []  # exactly once
    refused_keys = {k for _t, k, _e in load.refused}
    assert set(counts) == want and not refused_keys & set(counts)  # nothing refused was stored
    refusals = [e for _t, _k, e in load.refused]
    assert all("disk" in e.lower() for e in refusals), [e for e in refusals if "disk" not in e.lower()][:3]
    report = ledger.verify(pending_at_end=0)
    assert not (report.lost or report.duplicated or report.wrongly_delivered or report.unknown_delivered), \
        report.table()
    assert report.half_send_failed > 0 and committed
    # The commit the full disk refused was applied by a check-back, once.
    assert counts["t-held"] == 1 and ledger.txns["t-held"].checks >= 1


def last_segment(data_dir: Path) -> tuple[Path, int]:
    segs = sorted(p for p in (data_dir / "commitlog").iterdir() if p.is_file())
    seg = segs[-1]
    raw = seg.read_bytes()
    end = len(raw.rstrip(b"\x00"))
    assert end > 0
    return seg, end


def damage_tail(seg: Path, end: int, damage: str) -> None:
    with open(seg, "r+b") as f:
        if damage == "flip-last-record":
            f.seek(end - 12)
            data = bytearray(f.read(8))
            f.seek(end - 12)
            f.write(bytes(b ^ 0xA5 for b in data))
        else:
            f.seek(end)
            f.write(b"\x00\x00\x01\x00\xda\xa3\x20\xa7" + b"\xff" * 64)  # a torn record header


@pytest.mark.parametrize("damage", ["flip-last-record", "garbage-after-end"])
@pytest.mark.slow
async def test_corrupted_segment_tail_is_truncated_and_broker_serves(broker_process, damage):
    proc = broker_process(flush_mode="sync")
    keys = [f"k{i}" for i in range(40)]
    await send_keys(proc.namesrv_addr, "TailTopic", keys)
    proc.kill()
    seg, end = last_segment(proc.data_dir)
    damage_tail(seg, end, damage)

    proc.start()
    got = await consume_keys(proc.namesrv_addr, "tail_cg", "TailTopic", len(keys))
    expected = keys[:-1] if damage == "flip-last-record" else keys
    assert set(expected) <= set(got) <= set(keys)
    assert len(got) == len(set(got))
    more = [f"m{i}" for i in range(5)]
    await send_keys(proc.namesrv_addr, "TailTopic", more)
    proc.stop()
    proc.start()
    got2 = await consume_keys(proc.namesrv_addr, "tail_cg2", "TailTopic", len(got) + len(more))
    assert set(more) <= set(got2) and set(got) <= set(got2)
    assert "Traceback" not in proc.log_tail()


async def test_async_flush_loses_nothing_acknowledged_before_a_process_kill(broker_process):
    # A flush interval far longer than the test: acknowledged bytes live only in mapped pages,
    # which outlive a killed process.
    proc = broker_process(flush_mode="async", flush_interval=60.0)
    keys = [f"s{i}" for i in range(200)]
    await send_keys(proc.namesrv_addr, "AsyncTopic", keys)
    proc.kill()
    proc.start()
    got = await consume_keys(proc.namesrv_addr, "async_cg", "AsyncTopic", len(keys))
    assert sorted(got) == sorted(keys)


def fill(path: Path) -> None:
    """Take every byte left on ``path``'s file system."""
    with open(path, "wb") as filler, pytest.raises(OSError):
        for _ in range(200):
            filler.write(b"\0" * 65536)
            filler.flush()


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 3 MiB tmpfs: the broker's data dir runs out of space for real (ENOSPC).

    Mounting needs root (as on CI); without it the test is skipped with the reason."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                                           capture_output=True, check=False).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")

    def resize(mib: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={mib}m", str(mnt)], check=True)

    try:
        yield mnt, resize
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
async def test_real_disk_full_refuses_clearly_keeps_everything_and_resumes(broker_process, small_disk):
    mnt, resize = small_disk
    # The ratio guard is off (1.0): the broker meets the full disk itself, when a commitlog or
    # consume-queue segment cannot be allocated.
    proc = broker_process(data_dir=mnt / "data", flush_mode="sync", disk_max_used_ratio=1.0,
                          segment_size=512 * 1024)
    acked: list[str] = []
    refusal = ""
    async with Producer("full_pg", proc.namesrv_addr, retries=0) as producer:
        for i in range(2000):  # 3 MiB hold far fewer than 2000 bodies of 4 KiB
            try:
                await producer.send(Message("FullTopic", os.urandom(4096), keys=f"k{i}"))
            except ClientError as exc:
                refusal = str(exc)
                break
            acked.append(f"k{i}")
        assert refusal, "the disk never filled"
        assert "space" in refusal.lower() or "disk" in refusal.lower(), refusal
        assert len(acked) > 50
        # Still full: refused again, clearly, and the broker stays up.
        with pytest.raises(ClientError):
            await producer.send(Message("FullTopic", os.urandom(4096), keys="again"))
        # With the last bytes taken too, a new topic cannot be recorded: refused as such, not
        # as "no such topic".
        fill(mnt / "filler")
        with pytest.raises(ClientError, match="No space left"):
            await producer.send(Message("FullNewTopic", b"n", keys="n0"))
    assert proc.alive(), proc.log_tail()
    # Reads go on from a full disk.
    assert sorted(await consume_keys(proc.namesrv_addr, "full_cg", "FullTopic", len(acked))) == sorted(acked)

    (mnt / "filler").unlink()
    resize(16)  # space comes back: writes resume without a restart
    after = [f"a{i}" for i in range(20)]
    await send_keys(proc.namesrv_addr, "FullTopic", after)
    await send_keys(proc.namesrv_addr, "FullNewTopic", ["n1"])

    # A crash now loses nothing acknowledged, and nothing refused was stored.
    proc.kill()
    proc.start()
    got = await consume_keys(proc.namesrv_addr, "full_cg2", "FullTopic", len(acked) + len(after) + 2)
    assert sorted(got) == sorted(acked + after)
    assert await consume_keys(proc.namesrv_addr, "full_cg3", "FullNewTopic", 2) == ["n1"]
