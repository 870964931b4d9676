"""Disk faults: the disk guard refuses writes clearly while reads go on; a damaged commitlog
tail at start-up is truncated and the broker serves.

The guard's threshold is ``disk_max_used_ratio``: a ratio below the data disk's real usage is a
full disk as far as the broker can tell, and raising it again is space coming back.
"""

from __future__ import annotations

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
