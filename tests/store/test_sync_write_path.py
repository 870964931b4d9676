"""Sync flush's segments write zeros ahead of their data (so a group commit's fdatasync
writes data blocks, not extent conversions), hold the same bytes as any segment, and every
send acknowledged in sync mode survives a SIGKILL of the broker process."""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import time
from pathlib import Path

import pytest
from support.store import opened
from support.store import store_config as cfg

from txbroker.client import Message, Producer
from txbroker.client.errors import ClientError
from txbroker.config import BrokerConfig
from txbroker.store.message_store import MessageStore, PutStatus
from txbroker.store.record import Message as StoreMessage
from txbroker.store.record import decode_offset_msg_id
from txbroker.store.segment import ZERO_AHEAD, MappedSegment

SEGMENT = 4 * ZERO_AHEAD


#: ``ioctl(FS_IOC_FIEMAP)``: a file's extents as the file system keeps them (linux/fiemap.h).
FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_UNWRITTEN = 0x800
FIEMAP_EXTENT_LAST = 0x1
_HEAD = struct.Struct("=QQIIII")
_EXTENT = struct.Struct("=QQQQQIIII")


def written_bytes(path: Path) -> int | None:
    """Bytes of ``path`` in written extents (not preallocated-unwritten ones), after syncing
    it; None where the file system cannot say."""
    count = 64
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(_HEAD.pack(0, 2**64 - 1, FIEMAP_FLAG_SYNC, 0, count, 0) + bytes(_EXTENT.size * count))
        try:
            fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
        except OSError:
            return None
    finally:
        os.close(fd)
    mapped = _HEAD.unpack_from(buf)[3]
    total = 0
    for i in range(mapped):
        _logical, _physical, length, _r1, _r2, flags, *_ = _EXTENT.unpack_from(buf, _HEAD.size + i * _EXTENT.size)
        if not flags & FIEMAP_EXTENT_UNWRITTEN:
            total += length
    return total


def reports_unwritten_extents(directory: Path) -> bool:
    """The file system tells preallocated-but-unwritten blocks from written ones (ext4, XFS)."""
    seg = MappedSegment(directory / "probe", 0, SEGMENT, create=True)
    try:
        return written_bytes(seg.path) == 0
    finally:
        seg.destroy()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_only_sync_flush_writes_zeros_ahead_of_the_data(tmp_path, mode):
    if not reports_unwritten_extents(tmp_path):
        pytest.skip("this file system does not report unwritten extents")
    store = await opened(cfg(tmp_path, flush_mode=mode, segment_size=SEGMENT))
    results = [await store.put(StoreMessage("T", 0, b"z" * 500)) for _ in range(10)]
    assert all(r.status is PutStatus.OK for r in results)
    seg = store.commitlog.segments[-1]
    if mode == "sync":
        assert written_bytes(seg.path) >= seg.wrote + ZERO_AHEAD // 2
        assert seg.read(seg.wrote, ZERO_AHEAD) == bytes(ZERO_AHEAD)
    else:  # async flush is left as it was: only the blocks the records went to
        assert seg.wrote <= written_bytes(seg.path) < ZERO_AHEAD
    # Crossing the zeroed window writes the next one.
    for _ in range(3000):
        if (await store.put(StoreMessage("T", 0, b"z" * 500))).physical_offset > ZERO_AHEAD:
            break
    if mode == "sync":
        assert written_bytes(seg.path) >= seg.wrote + ZERO_AHEAD // 2
    assert [m.body for m in store.get("T", 0, 0, 10).messages()] == [b"z" * 500] * 10
    await store.close()


def test_zeros_ahead_leave_the_bytes_a_plain_segment_holds(tmp_path):
    size = 3 * ZERO_AHEAD
    (tmp_path / "plain").mkdir()
    (tmp_path / "ahead").mkdir()
    plain = MappedSegment(tmp_path / "plain" / f"{0:020d}", 0, size, create=True)
    ahead = MappedSegment(tmp_path / "ahead" / f"{0:020d}", 0, size, create=True, zero_ahead=True)
    chunks = [bytes([1 + i % 250]) * (37 + 3011 * i) for i in range(40)]  # across windows
    for chunk in chunks:
        assert plain.append(chunk) == ahead.append(chunk)
    assert ahead.wrote == plain.wrote == sum(map(len, chunks)) > ZERO_AHEAD
    assert ahead.read(0, ahead.wrote) == b"".join(chunks)
    ahead.sync()
    ahead.close()
    plain.close()
    assert ((tmp_path / "ahead" / f"{0:020d}").read_bytes()
            == (tmp_path / "plain" / f"{0:020d}").read_bytes())


def test_a_full_zero_ahead_segment_refuses_and_writes_nothing(tmp_path):
    seg = MappedSegment(tmp_path / f"{0:020d}", 0, 4096, create=True, zero_ahead=True)
    seg.append(b"a" * 4000)
    with pytest.raises(Exception, match="do not fit"):
        seg.append(b"b" * 100)
    assert seg.wrote == 4000 and seg.read(4000, 96) == bytes(96)
    seg.close()
    assert os.path.getsize(tmp_path / f"{0:020d}") == 4096


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
                except (ClientError, OSError, TimeoutError):  # the kill: a send cut off, never acknowledged
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
