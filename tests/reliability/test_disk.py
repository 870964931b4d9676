"""Disk faults: the disk guard refuses writes clearly while reads go on; a real disk that fills
up (a small tmpfs) is refused clearly, loses nothing and resumes when space returns; a damaged
commitlog tail at start-up is truncated and the broker serves.

The guard's threshold is ``disk_max_used_ratio``: a ratio below the data disk's real usage is a
full disk as far as the broker can tell, and raising it again is space coming back.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bench.chaos.driver import LedgerListener
from bench.chaos.ledger import Ledger
from txbroker.client import Consumer, Message, Producer, TransactionProducer
from txbroker.client.errors import ClientError


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
    assert "Traceback" not in proc.log_text()


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
    assert proc.alive(), proc.log_text()
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
