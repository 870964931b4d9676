"""Commitlog replication between two real stores over loopback TCP: byte-identical logs, slave
consume queues, segment rolls, restarts, SYNC_MASTER statuses, divergence after a failover."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from support.store import opened
from support.store import store_config as cfg
from support.waiting import eventually

from txbroker.store.ha_codec import SlaveHandshake, encode_ack, encode_slave_handshake
from txbroker.store.ha_master import HAMaster
from txbroker.store.ha_slave import HASlave
from txbroker.store.message_store import GetStatus, MessageStore, PutStatus
from txbroker.store.record import Message


def msg(i: int, size: int = 300, queue_id: int | None = None) -> Message:
    return Message(topic="T", queue_id=i % 3 if queue_id is None else queue_id, body=bytes([i % 251]) * size,
                   properties={"TAGS": f"t{i % 2}", "KEYS": f"k{i}"})


def log_bytes(store: MessageStore) -> bytes:
    assert store.commitlog is not None
    return b"".join(seg.read(0, seg.wrote) for seg in store.commitlog.segments)


def log_files(store: MessageStore) -> dict[str, bytes]:
    assert store.commitlog is not None
    return {p.name: p.read_bytes() for p in sorted(store.commitlog.dir.iterdir()) if p.name.isdigit()}


async def pair(tmp_path: Path, **kw):
    master = await opened(cfg(tmp_path / "m", **kw))
    slave = await opened(cfg(tmp_path / "s", **kw))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01)
    host, port = await ha.start()
    follower = HASlave(slave, lambda: f"{host}:{port}", heartbeat=0.05, backoff=0.02, max_backoff=0.2)
    follower.start()
    return master, slave, ha, follower


async def caught_up(master: MessageStore, slave: MessageStore) -> None:
    await eventually(lambda: slave.max_physical_offset == master.max_physical_offset,
                     msg=lambda: f"slave at {slave.max_physical_offset}, master at {master.max_physical_offset}")


async def shut(*things) -> None:
    for t in things:
        await t.close()


async def test_identical_commitlogs_and_queues_across_segment_rolls(tmp_path):
    master, slave, ha, follower = await pair(tmp_path)
    try:
        for i in range(600):  # ~200 KiB over 64 KiB segments: several rolls with blank fillers
            assert (await master.put(msg(i))).status is PutStatus.OK
        await caught_up(master, slave)
        assert len(master.commitlog.segments) >= 3
        await master.close()
        await slave.close()
        assert log_files(master) == log_files(slave)
        master2 = await opened(cfg(tmp_path / "m"))
        slave2 = await opened(cfg(tmp_path / "s"))
        try:
            for qid in range(3):
                assert slave2.max_offset("T", qid) == master2.max_offset("T", qid) == 200
                for off in (0, 57, 199):
                    a, b = master2.get("T", qid, off, 5), slave2.get("T", qid, off, 5)
                    assert (a.status, a.next_offset, a.raw) == (b.status, b.next_offset, b.raw)
        finally:
            await shut(master2, slave2)
    finally:
        await shut(follower, ha)
        await shut(master, slave)


async def test_slave_queues_answer_reads_while_following(tmp_path):
    master, slave, ha, follower = await pair(tmp_path)
    seen = []
    slave.add_listener(lambda t, q, m: seen.append((t, q, m)))
    try:
        for i in range(30):
            await master.put(msg(i))
        await caught_up(master, slave)
        got = slave.get("T", 1, 0, 100)
        assert got.status is GetStatus.FOUND and len(got.raw) == 10
        assert [m.body for m in got.messages()] == [m.body for m in master.get("T", 1, 0, 100).messages()]
        assert ("T", 1, 10) in seen  # the listeners (long polling) heard of the new entries
        assert ha.slaves()[0].ack_offset == master.max_physical_offset
        assert ha.confirm_offset == master.max_physical_offset
    finally:
        await shut(follower, ha, master, slave)


async def test_batch_ending_mid_record_is_indexed_only_when_complete(tmp_path):
    master = await opened(cfg(tmp_path / "m"))
    slave = await opened(cfg(tmp_path / "s"))
    try:
        for i in range(3):
            await master.put(msg(i, queue_id=0))
        data = log_bytes(master)
        first = master.get("T", 0, 0, 1).messages()[0].store_size
        slave.append_replicated(0, data[:first + 10])
        assert slave.max_offset("T", 0) == 1
        slave.append_replicated(first + 10, data[first + 10:len(data) - 1])
        assert slave.max_offset("T", 0) == 2
        slave.append_replicated(len(data) - 1, data[-1:])
        assert slave.max_offset("T", 0) == 3
        assert slave.get("T", 0, 0, 10).raw == master.get("T", 0, 0, 10).raw
    finally:
        await shut(master, slave)


async def test_slave_restart_resumes_from_its_max_offset(tmp_path):
    master, slave, ha, follower = await pair(tmp_path)
    try:
        for i in range(100):
            await master.put(msg(i))
        await caught_up(master, slave)
        await shut(follower, slave)
        for i in range(100, 250):
            await master.put(msg(i))
        slave = await opened(cfg(tmp_path / "s"))
        resumed_from = slave.max_physical_offset
        assert 0 < resumed_from < master.max_physical_offset
        follower = HASlave(slave, lambda: f"{ha.host}:{ha.port}", heartbeat=0.05, backoff=0.02)
        follower.start()
        await caught_up(master, slave)
        assert log_bytes(slave) == log_bytes(master)
        assert slave.max_offset("T", 0) == master.max_offset("T", 0)
    finally:
        await shut(follower, ha, master, slave)


async def test_slave_started_empty_follows_from_the_masters_min_offset(tmp_path):
    master = await opened(cfg(tmp_path / "m", file_reserved_time=60))
    slave = await opened(cfg(tmp_path / "s", file_reserved_time=60))
    for i in range(600):
        await master.put(msg(i))
    assert await master.delete_expired(now=time.time() + 120) >= 1
    assert master.min_physical_offset > 0
    ha = HAMaster(master, heartbeat=0.05, poll=0.01)
    await ha.start()
    follower = HASlave(slave, lambda: (ha.host, ha.port), heartbeat=0.05)
    follower.start()
    try:
        await caught_up(master, slave)
        assert slave.min_physical_offset == master.min_physical_offset
        assert log_bytes(slave) == log_bytes(master)
        for qid in range(3):
            lo = master.min_offset("T", qid)
            assert slave.max_offset("T", qid) == master.max_offset("T", qid)
            assert slave.get("T", qid, lo + 5, 3).raw == master.get("T", qid, lo + 5, 3).raw
    finally:
        await shut(follower, ha, master, slave)


async def test_sync_master_statuses(tmp_path):
    master, slave, ha, follower = await pair(tmp_path)
    master.set_replication(lambda end: ha.wait_replicated(end, 5.0, 1))
    try:
        await eventually(lambda: ha.slaves() and ha.slaves()[0].connected)
        r = await master.put(msg(1))
        assert r.status is PutStatus.OK
        assert ha.slaves()[0].ack_offset >= r.physical_offset + r.size  # OK only once acked
        rs = await master.put_batch([msg(i) for i in range(5)])
        assert [x.status for x in rs] == [PutStatus.OK] * 5
        # The slave stops acking (its task is gone, its socket stays open): time-out.
        await follower.close()
        master.set_replication(lambda end: ha.wait_replicated(end, 0.1, 1))
        await eventually(lambda: not ha.slaves()[0].connected, msg="the master noticed the closed slave")
        r = await master.put(msg(2))
        assert r.status is PutStatus.SLAVE_NOT_AVAILABLE  # none connected: at once
        assert master.read(r.physical_offset) is not None  # stored all the same
    finally:
        await shut(follower, ha, master, slave)


async def test_flush_slave_timeout_when_the_slave_stops_acking(tmp_path):
    master = await opened(cfg(tmp_path / "m"))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01)
    host, port = await ha.start()
    master.set_replication(lambda end: ha.wait_replicated(end, 0.2, 1))
    # A peer that handshakes and acks once, then reads nothing and acks nothing.
    from txbroker.store.ha_codec import (
        SlaveHandshake,
        encode_ack,
        encode_slave_handshake,
    )
    _, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(encode_slave_handshake(SlaveHandshake(7)) + encode_ack(0))
        await eventually(lambda: ha.slaves() and ha.slaves()[0].connected)
        r = await master.put(msg(1))
        assert r.status is PutStatus.FLUSH_SLAVE_TIMEOUT
        assert ha.slaves()[0].slave_id == 7
    finally:
        writer.close()
        await shut(ha, master)


async def test_wait_acked_waits_for_the_named_slaves_only(tmp_path):
    """``wait_acked``: True once every named slave acked the offset; False at the time-out,
    at once for an id with no connection, and as soon as a slave waited for disconnects."""
    master, slave, ha, follower = await pair(tmp_path)
    _, silent = await asyncio.open_connection(ha.host, ha.port)  # id 7: acks 0, then nothing
    try:
        silent.write(encode_slave_handshake(SlaveHandshake(7)) + encode_ack(0))
        await eventually(lambda: {s.slave_id for s in ha.slaves() if s.connected} == {1, 7})
        r = await master.put(msg(1))
        end = r.physical_offset + r.size
        assert await ha.wait_acked(end, {1}, 5.0) is True
        assert await ha.wait_acked(end, (), 5.0) is True
        started = time.monotonic()
        assert await ha.wait_acked(end, {1, 7}, 0.2) is False  # 7 never acks
        assert 0.15 < time.monotonic() - started < 2.0
        started = time.monotonic()
        assert await ha.wait_acked(end, {1, 9}, 5.0) is False  # no slave 9: not waited for
        waiting = asyncio.ensure_future(ha.wait_acked(end, {7}, 5.0))
        await asyncio.sleep(0.05)
        silent.close()
        assert await waiting is False
        assert time.monotonic() - started < 2.0  # its disconnection ended the wait
    finally:
        silent.close()
        await shut(follower, ha, master, slave)


async def test_sync_master_without_slave_is_not_available(tmp_path):
    master = await opened(cfg(tmp_path / "m"))
    ha = HAMaster(master)
    await ha.start()
    master.set_replication(lambda end: ha.wait_replicated(end, 5.0, 1))
    try:
        rs = await master.put_chain([msg(1), msg(2)])
        assert [r.status for r in rs] == [PutStatus.SLAVE_NOT_AVAILABLE] * 2
        master.set_replication(None)
        assert (await master.put(msg(3))).status is PutStatus.OK
    finally:
        await shut(ha, master)


async def test_diverged_slave_cuts_past_the_new_epoch_start_then_follows(tmp_path):
    """A was master under epoch 1; B replicated part of it, was promoted under epoch 2 and
    wrote more; A wrote more under epoch 1 meanwhile.  A rejoins as B's slave: it cuts what B
    never had and ends byte-identical to B."""
    a = await opened(cfg(tmp_path / "a"))
    b = await opened(cfg(tmp_path / "b"))
    ha_a = HAMaster(a, heartbeat=0.05, poll=0.01)
    await ha_a.start()
    ha_a.become(1)
    follower_b = HASlave(b, lambda: (ha_a.host, ha_a.port), heartbeat=0.05)
    follower_b.start()
    for i in range(50):
        await a.put(msg(i))
    await caught_up(a, b)
    common = b.max_physical_offset
    await shut(follower_b, ha_a)
    for i in range(50, 80):  # only A holds these
        await a.put(msg(i))
    assert b.cut_torn_tail() == common
    ha_b = HAMaster(b, heartbeat=0.05, poll=0.01)
    await ha_b.start()
    ha_b.become(2)
    assert b.epochs.entries == [(1, 0), (2, common)]
    for i in range(100, 120):  # B's own writes under epoch 2
        await b.put(msg(i, size=500))
    follower_a = HASlave(a, lambda: (ha_b.host, ha_b.port), heartbeat=0.05)
    follower_a.start()
    try:
        await caught_up(b, a)
        assert log_bytes(a) == log_bytes(b)
        assert a.epochs.entries == [(1, 0), (2, common)]
        for qid in range(3):
            assert a.get("T", qid, 0, 100).raw == b.get("T", qid, 0, 100).raw
        assert follower_a.master_epoch == 2
    finally:
        await shut(follower_a, ha_b, a, b)


async def test_visible_limit_hides_entries_past_it(tmp_path):
    store = await opened(cfg(tmp_path))
    try:
        rs = [await store.put(msg(i, queue_id=0)) for i in range(5)]
        store.visible_limit = rs[3].physical_offset + rs[3].size - 1  # mid-way through record 3
        got = store.get("T", 0, 0, 10)
        assert len(got.raw) == 3 and got.next_offset == 3
        assert store.get("T", 0, 3, 10).status is GetStatus.OFFSET_OVERFLOW_ONE
        store.visible_limit = None
        assert len(store.get("T", 0, 0, 10).raw) == 5
    finally:
        await store.close()


_KILLED_SLAVE = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from support.store import opened, store_config
from txbroker.store.ha_slave import HASlave
from pathlib import Path

async def main():
    slave = await opened(store_config(Path({root!r})))
    HASlave(slave, lambda: ("127.0.0.1", {port}), heartbeat=0.05).start()
    while slave.max_physical_offset < {target}:
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_slave_killed_recovers_and_resumes(tmp_path):
    master = await opened(cfg(tmp_path / "m"))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01)
    await ha.start()
    for i in range(300):
        await master.put(msg(i))
    tests_dir = str(Path(__file__).resolve().parent.parent)
    code = _KILLED_SLAVE.format(tests=tests_dir, root=str(tmp_path / "s"), port=ha.port,
                                target=master.max_physical_offset // 2)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.strip() == b"ready"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
    slave = await opened(cfg(tmp_path / "s"))
    follower = HASlave(slave, lambda: (ha.host, ha.port), heartbeat=0.05)
    follower.start()
    try:
        await caught_up(master, slave)
        assert log_bytes(slave) == log_bytes(master)
        assert slave.max_offset("T", 2) == master.max_offset("T", 2) == 100
    finally:
        await shut(follower, ha, master, slave)
