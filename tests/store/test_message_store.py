"""MessageStore on real files: roll-over, restart, crash recovery, queues, offsets, guard, retention."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.store import SEG, opened
from support.store import store_config as cfg
from support.waiting import eventually

from txbroker.config import BrokerConfig
from txbroker.store.commitlog import END_MARKER_SIZE
from txbroker.store.message_store import GetStatus, MessageStore, PutStatus
from txbroker.store.offsets import ConsumerOffsetStore
from txbroker.store.record import (
    BLANK_MAGIC,
    TRANSACTION_PREPARED_TYPE,
    Message,
    create_offset_msg_id,
    decode_record,
    record_size,
    tag_hash,
)
from txbroker.store.segment import MappedSegment


def body_for(size_on_disk: int, topic: str = "T") -> bytes:
    """A body that makes the whole record exactly ``size_on_disk`` bytes (no properties)."""
    return b"b" * (size_on_disk - record_size(0, len(topic), 0))


async def test_put_get_and_queue_offsets(tmp_path):
    store = await opened(cfg(tmp_path))
    results = [await store.put(Message("T", i % 2, b"m%d" % i, properties={"TAGS": "A" if i % 3 else "B"}))
               for i in range(20)]
    assert all(r.status is PutStatus.OK for r in results)
    assert [r.queue_offset for r in results if True][:4] == [0, 0, 1, 1]
    got = store.get("T", 0, 0, 100)
    assert got.status is GetStatus.FOUND and got.next_offset == 10
    assert [m.body for m in got.messages()] == [b"m%d" % i for i in range(0, 20, 2)]
    read = store.read(results[3].physical_offset)
    assert read is not None and read.body == b"m3" and read.msg_id == results[3].msg_id
    by_id = store.read_by_msg_id(results[3].msg_id.lower())
    assert by_id is not None and by_id.body == b"m3"
    # Another broker's id for the same offset names nothing here; garbage is an error.
    other = create_offset_msg_id("127.0.0.2", 10911, results[3].physical_offset)
    assert store.read_by_msg_id(other) is None
    with pytest.raises(ValueError):
        store.read_by_msg_id("not-an-id")
    await store.close()


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_put_chain_stops_at_the_first_refusal(tmp_path, mode):
    """A commit's op record must never be stored without its final message before it."""
    store = await opened(cfg(tmp_path, flush_mode=mode))
    ok = await store.put_chain([Message("T", 0, b"first"), Message("T", 0, b"second")])
    assert [r.status for r in ok] == [PutStatus.OK, PutStatus.OK]
    assert ok[1].physical_offset == ok[0].physical_offset + ok[0].size
    refused = await store.put_chain([Message("", 0, b"no topic"), Message("T", 0, b"orphan")])
    assert [r.status for r in refused] == [PutStatus.MESSAGE_ILLEGAL]
    assert [m.body for m in store.get("T", 0, 0, 10).messages()] == [b"first", b"second"]
    await store.close()


async def test_get_statuses(tmp_path):
    store = await opened(cfg(tmp_path))
    assert store.get("none", 0, 0, 1).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    for i in range(5):
        await store.put(Message("T", 0, b"x", properties={"TAGS": "A"}))
    assert store.get("T", 0, 5, 1).status is GetStatus.OFFSET_OVERFLOW_ONE
    bad = store.get("T", 0, 9, 1)
    assert bad.status is GetStatus.OFFSET_OVERFLOW_BADLY and bad.next_offset == 5
    miss = store.get("T", 0, 0, 10, tag_filter={tag_hash("B")})
    assert miss.status is GetStatus.NO_MATCHED_MESSAGE and miss.next_offset == 5
    hit = store.get("T", 0, 0, 2, tag_filter={tag_hash("A")})
    assert hit.status is GetStatus.FOUND and len(hit.raw) == 2 and hit.next_offset == 2
    small = store.get("T", 0, 0, 10, max_bytes=1)
    assert len(small.raw) == 1  # at least one message even when it is larger than max_bytes
    await store.close()


async def test_prepared_records_are_not_indexed(tmp_path):
    store = await opened(cfg(tmp_path))
    r = await store.put(Message("T", 0, b"half", sys_flag=TRANSACTION_PREPARED_TYPE))
    assert r.status is PutStatus.OK and r.queue_offset == 0
    assert store.max_offset("T", 0) == 0
    assert store.read(r.physical_offset).body == b"half"
    await store.close()


@pytest.mark.parametrize("slack", [END_MARKER_SIZE, END_MARKER_SIZE - 1, 0, END_MARKER_SIZE + 1])
async def test_roll_over_at_exact_segment_boundaries(tmp_path, slack):
    """Fill a segment so exactly ``slack`` bytes remain, then put: blank filler or next segment."""
    config = cfg(tmp_path, max_message_size=SEG - 1024)
    store = await opened(config)
    first = SEG - 300 - slack
    r0 = await store.put(Message("T", 0, body_for(SEG // 2)))
    r1 = await store.put(Message("T", 0, body_for(first - SEG // 2)))
    assert r0.size + r1.size == first
    r2 = await store.put(Message("T", 0, body_for(300)))
    assert r2.status is PutStatus.OK
    if 300 + END_MARKER_SIZE <= SEG - first:
        assert r2.physical_offset == first  # fits with room for an end marker
    else:
        assert r2.physical_offset == SEG  # rolled; a blank fills the rest
        raw = store.commitlog.segments[0].read(first, 8)
        if SEG - first >= 8:
            assert int.from_bytes(raw[4:8], "big") == BLANK_MAGIC
    expected = [0, r1.physical_offset, r2.physical_offset]
    assert [m.physical_offset for m in store.scan(0)] == expected
    await store.close()
    again = await opened(config)
    assert [m.physical_offset for m in again.get("T", 0, 0, 10).messages()] == expected
    await again.close()


async def test_many_segments_and_clean_restart_does_not_rescan(tmp_path):
    store = await opened(cfg(tmp_path))
    for i in range(600):
        await store.put(Message("T", i % 4, os.urandom(random.Random(i).randint(1, 700))))
    end = store.max_physical_offset
    assert len(store.commitlog.segments) > 3
    await store.close()
    store2 = MessageStore(cfg(tmp_path))
    report = store2.open()
    assert report.clean and report.records_scanned == 0 and report.end_offset == end
    assert sum(store2.max_offset("T", q) for q in range(4)) == 600
    assert len(list(store2.scan(0))) == 600
    await store2.start()
    await store2.close()


def overwrite(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(data)


async def _crash_copy(store: MessageStore) -> None:
    """Leave the files as a killed process would: no clean marker removal, no final flush;
    only the data directory's lock goes, as the kernel drops a dead process's ``flock``.

    The store's background work stops first, as it would with the process: a checkpoint write
    still running in a worker thread could otherwise land after the next open read the old one
    (a killed process's last write either happened before the restart or never)."""
    for task in store._tasks:
        task.cancel()
    await asyncio.gather(*store._tasks, return_exceptions=True)
    for cq in store.queues_.values():
        cq.close()
    store.commitlog.close()
    store._lock.release()


async def test_torn_tail_at_random_byte_is_truncated(tmp_path):
    rng = random.Random(7)
    store = await opened(cfg(tmp_path))
    results = [await store.put(Message("T", 0, os.urandom(rng.randint(10, 500)))) for _ in range(100)]
    await _crash_copy(store)
    last = results[-1]
    seg_path = Path(store.root) / "commitlog" / f"{(last.physical_offset // SEG) * SEG:020d}"
    cut_at = last.physical_offset % SEG + rng.randint(1, last.size - 1)
    overwrite(seg_path, cut_at, bytes(last.size))  # the rest of the record never reached the disk
    again = MessageStore(cfg(tmp_path))
    report = again.open()
    assert not report.clean and report.end_offset == last.physical_offset
    assert report.bytes_cut > 0
    assert again.max_offset("T", 0) == 99
    assert [m.body for m in again.get("T", 0, 0, 200).messages()] == [
        again.read(r.physical_offset).body for r in results[:99]]
    await again.start()
    r = await again.put(Message("T", 0, b"after"))
    assert r.physical_offset == last.physical_offset and r.queue_offset == 99
    await again.close()


async def test_flipped_body_byte_truncates_from_that_record(tmp_path):
    store = await opened(cfg(tmp_path))
    results = [await store.put(Message("T", 1, b"%05d" % i * 20)) for i in range(50)]
    await _crash_copy(store)
    victim = results[30]
    seg_path = Path(store.root) / "commitlog" / f"{(victim.physical_offset // SEG) * SEG:020d}"
    pos = victim.physical_offset % SEG + 90
    overwrite(seg_path, pos, bytes([seg_path.read_bytes()[pos] ^ 0x40]))
    again = MessageStore(cfg(tmp_path))
    report = again.open()
    assert report.end_offset == victim.physical_offset
    assert again.max_offset("T", 1) == 30  # queue entries past the valid log were dropped
    assert len(again.get("T", 1, 0, 100).messages()) == 30
    await again.start()
    await again.close()


async def test_consume_queue_rebuilt_when_missing(tmp_path):
    store = await opened(cfg(tmp_path))
    for i in range(40):
        await store.put(Message("T", i % 2, b"r%d" % i, properties={"TAGS": "X"}))
    await _crash_copy(store)
    import shutil
    shutil.rmtree(Path(store.root) / "consumequeue" / "T" / "1")
    (Path(store.root) / "checkpoint").unlink(missing_ok=True)
    again = MessageStore(cfg(tmp_path))
    report = again.open()
    assert report.queue_entries_repaired == 20
    got = again.get("T", 1, 0, 100, tag_filter={tag_hash("X")})
    assert [m.body for m in got.messages()] == [b"r%d" % i for i in range(1, 40, 2)]
    await again.start()
    await again.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_writer_killed_with_sigkill_loses_nothing_acknowledged(tmp_path, mode):
    data = tmp_path / "data"
    writer = Path(__file__).with_name("writer_proc.py")
    proc = subprocess.Popen([sys.executable, str(writer), str(data), mode, "200000"],
                            stdout=subprocess.PIPE, text=True)
    acked: list[tuple[int, int]] = []
    deadline = time.monotonic() + 20
    target = random.Random(mode).randint(300, 3000)
    try:
        assert proc.stdout is not None
        while len(acked) < target and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            i, status, phys = line.split()
            if status in ("OK", "FLUSH_DISK_TIMEOUT"):
                acked.append((int(i), int(phys)))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    assert len(acked) >= 300
    store = MessageStore(BrokerConfig(data_dir=str(data), segment_size=256 * 1024, max_message_size=8192,
                                      consume_queue_entries=512))
    report = store.open()
    assert not report.clean
    for i, phys in acked:
        m = store.read(phys)
        assert m is not None and m.keys == str(i) and m.body == (b"%08d" % i) * (1 + i % 50)
    total = sum(store.max_offset("Crash", q) for q in range(3))
    assert total >= len(acked)
    # Every indexed entry points at a valid record of its own queue.
    for q in range(3):
        for m in store.get("Crash", q, 0, 10_000, max_bytes=1 << 30).messages():
            assert m.queue_id == q and decode_record(store.read_raw(m.physical_offset), check_crc=True)


async def test_sync_flush_group_commit_shares_flushes(tmp_path):
    import asyncio
    store = await opened(cfg(tmp_path, flush_mode="sync", segment_size=1024 * 1024))
    results = await asyncio.gather(*(store.put(Message("T", 0, b"s" * 100)) for _ in range(500)))
    assert all(r.status is PutStatus.OK for r in results)
    flushes = store.stats()["group_commit_flushes"]
    assert 1 <= flushes < 500
    await store.close()


async def test_disk_guard_refuses_writes_and_resumes(tmp_path):
    usage = {"used": 50}
    store = await opened(cfg(tmp_path, disk_max_used_ratio=0.8),
                         disk_usage=lambda _p: (100, usage["used"], 100 - usage["used"]))
    ok = await store.put(Message("T", 0, b"before"))
    assert ok.status is PutStatus.OK
    usage["used"] = 95
    store.recheck_disk()
    refused = await store.put(Message("T", 0, b"during"))
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE and "disk" in refused.reason
    assert store.get("T", 0, 0, 10).status is GetStatus.FOUND  # reads keep working
    usage["used"] = 60
    store.recheck_disk()
    assert (await store.put(Message("T", 0, b"after"))).status is PutStatus.OK
    assert [m.body for m in store.get("T", 0, 0, 10).messages()] == [b"before", b"after"]
    await store.close()


async def test_segment_preallocation_failure_is_a_clear_refusal(tmp_path, monkeypatch):
    store = await opened(cfg(tmp_path))
    await store.put(Message("T", 0, b"x"))

    def no_space(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    big = body_for(SEG - 200)
    r = await store.put(Message("T", 0, big[:8000]))
    while r.status is PutStatus.OK:
        r = await store.put(Message("T", 0, big[:8000]))
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and "No space" in r.reason
    monkeypatch.undo()
    assert (await store.put(Message("T", 0, b"y"))).status is PutStatus.OK
    await store.close()


async def test_message_limits(tmp_path):
    store = await opened(cfg(tmp_path))
    assert (await store.put(Message("T", 0, b"x" * 9000))).status is PutStatus.MESSAGE_ILLEGAL
    r = await store.put(Message("T", 0, b"x", properties={"k": "v" * 40000}))
    assert r.status is PutStatus.PROPERTIES_SIZE_EXCEEDED
    await store.close()


async def test_retention_deletes_old_segments_and_queue_entries(tmp_path):
    now = [time.time()]
    store = await opened(cfg(tmp_path, file_reserved_time=3600.0), clock=lambda: now[0])
    for i in range(300):
        await store.put(Message("T", 0, b"r" * 500))
    segs = list(store.commitlog.segments)
    assert len(segs) >= 3
    old = time.time() - 7200
    for seg in segs[:2]:
        os.utime(seg.path, (old, old))
    assert await store.delete_expired() == 2
    assert store.min_physical_offset == segs[2].start
    lo = store.min_offset("T", 0)
    assert lo > 0
    assert store.get("T", 0, 0, 1).status is GetStatus.OFFSET_TOO_SMALL
    assert store.get("T", 0, lo, 1).messages()[0].physical_offset >= segs[2].start
    # The active segment is never deleted, however old.
    for seg in store.commitlog.segments:
        os.utime(seg.path, (old, old))
    await store.delete_expired()
    assert len(store.commitlog.segments) == 1
    lo, hi = store.min_offset("T", 0), store.max_offset("T", 0)
    await store.close()
    again = MessageStore(cfg(tmp_path, file_reserved_time=3600.0))
    assert again.open().clean
    assert (again.min_offset("T", 0), again.max_offset("T", 0)) == (lo, hi)
    assert again.get("T", 0, lo - 1, 1).status is GetStatus.OFFSET_TOO_SMALL
    assert len(again.get("T", 0, lo, 1000).raw) == hi - lo
    await again.start()
    await again.close()


async def test_offset_by_time(tmp_path):
    now = [1000.0]
    store = await opened(cfg(tmp_path), clock=lambda: now[0])
    for i in range(10):
        now[0] = 1000.0 + i
        await store.put(Message("T", 0, b"t"))
    assert store.offset_by_time("T", 0, 1_004_000) == 4
    assert store.offset_by_time("T", 0, 0) == 0
    assert store.offset_by_time("T", 0, 9_999_999) == 10
    await store.close()


def test_offset_store_persist_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "consumerOffset.json"
    offsets = ConsumerOffsetStore(path)
    offsets.set("g", "T", 0, 5)
    assert offsets.persist()
    offsets.set("g", "T", 0, 9)

    def crash(src, dst):
        raise OSError("killed before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        offsets.persist()
    monkeypatch.undo()
    assert ConsumerOffsetStore(path).get("g", "T", 0) == 5  # old file intact
    offsets.set("g", "T", 1, 3)
    assert offsets.persist()
    again = ConsumerOffsetStore(path)
    assert (again.get("g", "T", 0), again.get("g", "T", 1)) == (9, 3)
    with pytest.raises(ValueError):
        offsets.set("g", "T", 0, -1)


async def test_slow_flush_answers_flush_disk_timeout_and_keeps_the_data(tmp_path, monkeypatch):
    from txbroker.store.segment import MappedSegment
    real_sync = MappedSegment.sync

    def slow_sync(self):  # a disk that takes longer than sync_flush_timeout
        time.sleep(0.3)
        real_sync(self)

    monkeypatch.setattr(MappedSegment, "sync", slow_sync)
    store = await opened(cfg(tmp_path, flush_mode="sync", sync_flush_timeout=0.05))
    r = await store.put(Message("T", 0, b"slow"))
    assert r.status is PutStatus.FLUSH_DISK_TIMEOUT and r.ok
    assert store.read(r.physical_offset).body == b"slow"
    assert store.get("T", 0, 0, 1).status is GetStatus.FOUND
    await store.close()
    again = MessageStore(cfg(tmp_path))
    assert again.open().clean and again.read(r.physical_offset).body == b"slow"
    await again.start()
    await again.close()


async def test_close_answers_puts_still_waiting_for_a_flush(tmp_path, monkeypatch):
    import asyncio

    from txbroker.store.segment import MappedSegment
    real_sync = MappedSegment.sync

    def slow_sync(self):
        time.sleep(0.05)
        real_sync(self)

    monkeypatch.setattr(MappedSegment, "sync", slow_sync)
    store = await opened(cfg(tmp_path, flush_mode="sync", segment_size=1024 * 1024))
    puts = [asyncio.ensure_future(store.put(Message("T", 0, b"c%d" % i))) for i in range(50)]
    await asyncio.sleep(0.01)  # some flushed, some in flight, some still waiting
    await store.close()
    results = await asyncio.gather(*puts)
    assert all(r.status is PutStatus.OK for r in results)
    again = MessageStore(cfg(tmp_path, segment_size=1024 * 1024))
    again.open()
    assert [m.body for m in again.get("T", 0, 0, 100).messages()] == [b"c%d" % i for i in range(50)]
    await again.start()
    await again.close()


@pytest.mark.parametrize("bad", [
    {"flag": 2**31}, {"queue_id": -1}, {"queue_id": 2**31}, {"born_timestamp": 2**63},
    {"born_host": ("127.0.0.1", 2**40)}, {"reconsume_times": "3"}, {"topic": ""},
    {"topic": "t" * 250}, {"topic": 7}, {"properties": {"k": "\udcff"}}, {"body": None},
    {"body": "text"}, {"sys_flag": None}, {"born_host": None}, {"store_timestamp": 2**70},
])
async def test_invalid_fields_are_refused_before_anything_is_written(tmp_path, bad):
    store = await opened(cfg(tmp_path))
    await store.put(Message("T", 0, b"first"))
    end = store.max_physical_offset
    fields = {"topic": "T", "queue_id": 0, "body": b"x"} | bad
    r = await store.put(Message(**fields))
    assert r.status is PutStatus.MESSAGE_ILLEGAL and r.reason
    assert store.max_physical_offset == end and store.max_offset("T", 0) == 1
    assert (await store.put(Message("T", 0, b"next"))).physical_offset == end
    await store.close()


async def test_property_values_none_skipped_and_non_strings_stringified(tmp_path):
    store = await opened(cfg(tmp_path))
    r = await store.put(Message("T", 0, b"p", properties={"TAGS": "A", "gone": None, "n": 5}))
    m = store.read(r.physical_offset)
    assert m.properties == {"TAGS": "A", "n": "5"}
    assert store.get("T", 0, 0, 1, tag_filter={tag_hash("A")}).status is GetStatus.FOUND
    await store.close()


async def test_listener_sees_each_new_max_offset(tmp_path):
    store = await opened(cfg(tmp_path))
    seen: list[tuple[str, int, int]] = []
    store.add_listener(lambda t, q, m: seen.append((t, q, m)))
    await store.put(Message("T", 1, b"a"))
    await store.put(Message("T", 1, b"b"))
    await store.put(Message("T", 0, b"half", sys_flag=TRANSACTION_PREPARED_TYPE))  # not indexed
    assert seen == [("T", 1, 1), ("T", 1, 2)]
    await store.close()


@pytest.mark.parametrize("where", ["topic_len", "props_len", "topic_utf8", "sys_flag_v6", "physical_offset"])
async def test_damage_outside_the_body_is_caught_by_recovery(tmp_path, where):
    """The body CRC does not cover lengths and text; recovery checks those too, so nothing
    that a later read or scan would choke on is kept."""
    store = await opened(cfg(tmp_path))
    results = [await store.put(Message("Topic", 0, b"%04d" % i, properties={"TAGS": "A"})) for i in range(20)]
    await _crash_copy(store)
    victim = results[12]
    seg_path = Path(store.root) / "commitlog" / f"{(victim.physical_offset // SEG) * SEG:020d}"
    rel = victim.physical_offset % SEG
    topic_at = rel + 88 + 4
    patch = {"topic_len": (topic_at, b"\x09"), "props_len": (topic_at + 6, b"\x7f\x00"),
             "topic_utf8": (topic_at + 1, b"\xff"), "sys_flag_v6": (rel + 36, b"\x00\x00\x00\x10"),
             "physical_offset": (rel + 28, b"\x01")}[where]
    overwrite(seg_path, *patch)
    again = MessageStore(cfg(tmp_path))
    report = again.open()
    assert report.end_offset == victim.physical_offset and report.bytes_cut > 0
    assert [m.body for m in again.scan(0)] == [b"%04d" % i for i in range(12)]
    assert again.max_offset("Topic", 0) == 12
    await again.start()
    await again.close()


@pytest.mark.parametrize("content", [b"{not json", b'{"offsets": {"g": {"T": {"x": 1}}}}',
                                     b'{"offsets": {"g": {"T": {"0": -4}}}}', b"[1, 2]"])
def test_damaged_offset_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / "consumerOffset.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="consumer offsets file .* is damaged"):
        ConsumerOffsetStore(path)
    assert path.read_bytes() == content  # left for the operator, not overwritten


async def test_offsets_persist_across_restart_and_periodically(tmp_path):
    store = await opened(cfg(tmp_path, offset_persist_interval=0.05))
    store.offsets.set("g", "T", 2, 17)
    path = Path(store.root) / "consumerOffset.json"
    await eventually(path.exists, 2, "offsets persisted")
    assert ConsumerOffsetStore(path).get("g", "T", 2) == 17  # persisted before any close
    store.offsets.set("g", "T", 2, 18)
    await store.close()
    again = MessageStore(cfg(tmp_path))
    again.open()
    assert again.offsets.get("g", "T", 2) == 18
    await again.start()
    await again.close()


async def test_full_disk_for_a_new_queue_file_refuses_without_an_unindexed_record(tmp_path, monkeypatch):
    store = await opened(cfg(tmp_path, consume_queue_entries=16))
    for i in range(16):  # fills the first queue file exactly
        assert (await store.put(Message("T", 0, b"%d" % i))).status is PutStatus.OK
    end = store.max_physical_offset

    def no_space(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    r = await store.put(Message("T", 0, b"refused"))
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and "consume-queue" in r.reason
    r = await store.put(Message("New", 0, b"refused too"))
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert store.max_physical_offset == end  # nothing reached the commitlog
    assert "New" not in store.queues()
    assert store.get("T", 0, 0, 100).status is GetStatus.FOUND  # reads keep working
    monkeypatch.undo()
    r = await store.put(Message("T", 0, b"resumed"))
    assert r.status is PutStatus.OK and r.queue_offset == 16 and r.physical_offset == end
    assert [m.body for m in store.get("T", 0, 14, 100).messages()] == [b"14", b"15", b"resumed"]
    await store.close()


async def test_failing_listener_does_not_fail_the_put(tmp_path):
    store = await opened(cfg(tmp_path))
    seen = []

    def broken(t, q, m):
        raise RuntimeError("listener bug")

    store.add_listener(broken)
    store.add_listener(lambda t, q, m: seen.append(m))
    r = await store.put(Message("T", 0, b"x"))
    assert r.status is PutStatus.OK and seen == [1]
    await store.close()


def test_recovery_property_any_damage_point(tmp_path):
    """Whatever single byte is damaged or wherever the tail is torn, open() never raises and
    every record that ends before the damage is recovered intact (seeded, bounded)."""
    import asyncio
    import shutil

    rng = random.Random(2026)

    async def one(root: Path, mode: str) -> None:
        config = cfg(root)
        store = await opened(config)
        results = [await store.put(Message("T", i % 2, os.urandom(rng.randint(0, 900)),
                                           properties={"KEYS": str(i)})) for i in range(rng.randint(5, 150))]
        end = store.max_physical_offset
        await _crash_copy(store)
        spot = rng.randrange(end)
        seg_path = Path(store.root) / "commitlog" / f"{(spot // SEG) * SEG:020d}"
        raw = seg_path.read_bytes()
        if mode == "flip":
            overwrite(seg_path, spot % SEG, bytes([raw[spot % SEG] ^ (1 << rng.randrange(8))]))
        else:
            overwrite(seg_path, spot % SEG, bytes(SEG - spot % SEG))
        again = MessageStore(config)
        report = again.open()
        for i, r in enumerate(results):
            if r.physical_offset + r.size <= spot:
                m = again.read(r.physical_offset)
                assert m is not None and m.keys == str(i), (mode, spot, i)
        assert report.end_offset <= max(spot, results[-1].physical_offset + results[-1].size)
        for q in (0, 1):
            # Header fields outside the body CRC (queue id, timestamps) cannot be checked by
            # anyone; what must hold is that every indexed entry is a whole, valid record.
            for m in again.get("T", q, again.min_offset("T", q), 1000, max_bytes=1 << 30).messages():
                assert m.physical_offset + m.store_size <= report.end_offset
        await again.start()
        assert (await again.put(Message("T", 0, b"after"))).status is PutStatus.OK
        await again.close()

    for n in range(40):
        root = tmp_path / f"case{n}"
        asyncio.run(one(root, "flip" if n % 2 else "tear"))
        shutil.rmtree(root)


async def test_crash_recovery_reads_only_what_was_written(tmp_path):
    """A restart after a crash costs the bytes written, not the preallocated segment: recovery
    must not read the never-written rest of a large segment (reading pages in is what made a
    restart with one record take seconds on a 1 GiB segment).  The kernel's data map of the
    file shows what was read in: pages read through the mapping count as data there."""
    big = 256 * 1024 * 1024
    store = await opened(cfg(tmp_path, segment_size=big))
    r = await store.put(Message("T", 0, b"one record"))
    await _crash_copy(store)
    again = MessageStore(cfg(tmp_path, segment_size=big))
    report = again.open()
    assert not report.clean and report.end_offset == r.physical_offset + r.size
    seg = again.commitlog.segments[0]
    mapped = sum(end - start for start, end in seg.data_ranges(0))
    assert 0 < mapped <= 32 * 1024 * 1024, f"recovery read {mapped} bytes of a {big}-byte segment"
    assert again.read(r.physical_offset).body == b"one record"
    await again.start()
    await again.close()


def test_zero_from_erases_stale_data_past_a_zero_gap(tmp_path):
    """Pages can reach the disk out of order: stale bytes past a zeroed stretch must be erased
    too, or a later recovery could take them for records once new writes reach them."""
    size = 64 * 1024 * 1024
    seg = MappedSegment(tmp_path / f"{0:020d}", 0, size, create=True)
    try:
        seg.append(b"r" * 100)
        seg.write_at(40 * 1024 * 1024, b"stale record bytes")
        seg.write_at(size - 5, b"tail!")
        cut = seg.zero_from(50)
        assert cut == size - 50
        assert seg.read(0, 50) == b"r" * 50
        assert seg.read(50, size - 50).count(0) == size - 50
        assert seg.wrote == 50
    finally:
        seg.destroy()


async def test_get_reads_across_consume_queue_files(tmp_path):
    """A get reads entries a file slice at a time: a batch that crosses into the next queue
    file, a tag filter skipping entries over that boundary, and max_bytes all give exactly
    what an entry-by-entry walk gives."""
    store = await opened(cfg(tmp_path, consume_queue_entries=16))
    for i in range(40):
        await store.put(Message("T", 0, b"m%02d" % i, properties={"TAGS": "A" if i % 3 else "B"}))
    cq = store.queues_[("T", 0)]
    assert len(cq.entries(10, 100)) == 6  # stops at the end of the first file
    assert cq.entries(10, 3) == [cq.get(i) for i in (10, 11, 12)]
    assert cq.entries(40, 5) == [] and cq.entries(39, 5) == [cq.get(39)]

    got = store.get("T", 0, 10, 20)
    assert got.next_offset == 30 and [m.body for m in got.messages()] == [b"m%02d" % i for i in range(10, 30)]
    b_only = store.get("T", 0, 1, 8, tag_filter={tag_hash("B")})
    assert [m.body for m in b_only.messages()] == [b"m%02d" % i for i in range(3, 40, 3)][:8]
    assert b_only.next_offset == 25  # one past the 8th match (m24)
    size = len(got.raw[0])
    capped = store.get("T", 0, 14, 20, max_bytes=3 * size)
    assert len(capped.raw) == 3 and capped.next_offset == 17
    await store.close()


async def test_get_skips_entries_whose_record_is_gone(tmp_path):
    """An entry pointing past the written commitlog (its segment gone) is skipped; a get
    finding only such entries answers OFFSET_FOUND_NULL past them."""
    store = await opened(cfg(tmp_path))
    await store.put(Message("T", 0, b"kept"))
    cq = store.queues_[("T", 0)]
    cq.append(10 ** 9, 100, 0)
    both = store.get("T", 0, 0, 5)
    assert both.status is GetStatus.FOUND and both.next_offset == 2
    assert [m.body for m in both.messages()] == [b"kept"]
    gone = store.get("T", 0, 1, 5)
    assert gone.status is GetStatus.OFFSET_FOUND_NULL and gone.next_offset == 2 and gone.raw == []
    await store.close()
