"""Sync flush's write path: records go into the segment file with ``os.pwrite`` (not through the
mapping), land byte for byte where a mapped write would put them, are read back through the
mapping, and every acknowledged one survives a SIGKILL of the broker process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support.store import opened
from support.store import store_config as cfg

from txbroker.client import Message, Producer
from txbroker.config import BrokerConfig
from txbroker.store.message_store import MessageStore, PutStatus
from txbroker.store.record import Message as StoreMessage
from txbroker.store.record import decode_offset_msg_id
from txbroker.store.segment import MappedSegment


def written_through_syscalls() -> int:
    """Bytes this process has passed to write-family system calls (``wchar``); a store
    into a mapped page never counts here."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


async def test_sync_mode_writes_records_through_the_descriptor(tmp_path):
    store = await opened(cfg(tmp_path, flush_mode="sync", segment_size=1024 * 1024))
    before = written_through_syscalls()
    results = [await store.put(StoreMessage("T", 0, b"w" * 1000)) for _ in range(100)]
    written = written_through_syscalls() - before
    assert all(r.status is PutStatus.OK for r in results)
    stored = sum(r.size for r in results)
    assert written >= stored, f"{written} bytes went through write calls for {stored} bytes of records"
    assert [store.read(r.physical_offset).body for r in results] == [b"w" * 1000] * 100
    await store.close()


def test_pwritten_segment_holds_the_bytes_a_mapped_one_does(tmp_path):
    size = 64 * 1024
    mapped = MappedSegment(tmp_path / f"{0:020d}", 0, size, create=True)
    (tmp_path / "through").mkdir()
    through = MappedSegment(tmp_path / "through" / f"{0:020d}", 0, size, create=True, write_through=True)
    chunks = [bytes([i % 251]) * (37 + 113 * i) for i in range(20)]  # crossing page borders
    for chunk in chunks:
        assert mapped.append(chunk) == through.append(chunk)
    assert through.wrote == mapped.wrote == sum(map(len, chunks))
    assert through.read(0, through.wrote) == b"".join(chunks)  # the mapping sees the pwrites
    through.sync()
    through.close()
    mapped.close()
    assert (tmp_path / "through" / f"{0:020d}").read_bytes() == (tmp_path / f"{0:020d}").read_bytes()


def test_a_full_write_through_segment_refuses_and_writes_nothing(tmp_path):
    seg = MappedSegment(tmp_path / f"{0:020d}", 0, 4096, create=True, write_through=True)
    seg.append(b"a" * 4000)
    with pytest.raises(Exception, match="do not fit"):
        seg.append(b"b" * 100)
    assert seg.wrote == 4000 and seg.read(4000, 96) == bytes(96)
    seg.close()


@pytest.mark.slow
async def test_acknowledged_sync_sends_survive_sigkill_of_the_broker(broker_process):
    # Sixteen producers keep sends in flight while the broker is killed: every send answered
    # SEND_OK (flushed) must be in the data dir, read back by a fresh store, key and body.
    proc = broker_process(flush_mode="sync")
    acked: dict[str, int] = {}
    stop = asyncio.Event()

    async def produce(n: int) -> None:
        async with Producer(f"kill_pg{n}", proc.namesrv_addr, retries=0, send_timeout=3.0) as producer:
            for i in range(100_000):
                if stop.is_set():
                    return
                key = f"p{n}-{i}"
                try:
                    result = await producer.send(Message("KillTopic", key.encode() * 8, keys=key))
                except Exception:  # the kill: a send cut off mid-way was never acknowledged
                    return
                acked[key] = decode_offset_msg_id(result.offset_msg_id)[2]

    tasks = [asyncio.create_task(produce(n)) for n in range(16)]
    deadline = time.monotonic() + 20
    while len(acked) < 2000 and time.monotonic() < deadline and not all(t.done() for t in tasks):
        await asyncio.sleep(0.05)
    proc.kill()  # with sends in flight
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert len(acked) >= 500, f"only {len(acked)} sends acknowledged before the kill"

    store = MessageStore(BrokerConfig(data_dir=str(proc.data_dir), segment_size=1024 * 1024,
                                      max_message_size=256 * 1024, consume_queue_entries=4096))
    report = store.open()
    try:
        assert not report.clean
        for key, phys in acked.items():
            m = store.read(phys)
            assert m is not None and m.keys == key and m.body == key.encode() * 8, key
    finally:
        await store.close()
