"""The next commitlog segment is preallocated off the event loop; a roll-over only renames it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from support.waiting import eventually

from txbroker.config import BrokerConfig
from txbroker.store.allocate import SPARE_NAME
from txbroker.store.message_store import MessageStore, PutStatus
from txbroker.store.record import Message

SEG = 64 * 1024


def cfg(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(data_dir=str(tmp_path / "data"), segment_size=SEG, max_message_size=8192,
                        consume_queue_entries=4096, flush_interval=0.05)


class FallocateThreads:
    """Records the thread of every ``posix_fallocate`` call, then does the real one."""

    def __init__(self) -> None:
        self.real = os.posix_fallocate
        self.calls: list[tuple[int, int]] = []

    def __call__(self, fd: int, offset: int, length: int) -> None:
        self.calls.append((threading.get_ident(), length))
        self.real(fd, offset, length)


async def spare_ready(store: MessageStore) -> None:
    assert store.commitlog is not None
    await eventually(lambda: store.commitlog.allocator.ready, 5, "a spare segment preallocated")


async def test_roll_over_puts_never_preallocate_on_the_loop_thread(tmp_path, monkeypatch):
    fallocate = FallocateThreads()
    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    store = MessageStore(cfg(tmp_path))
    store.open()
    await store.start()
    loop_thread = threading.get_ident()
    body = os.urandom(4000)
    for _roll in range(3):
        await spare_ready(store)  # the disk keeps up: every roll finds its segment ready
        rolled = len(store.commitlog.segments) + 1
        while len(store.commitlog.segments) < rolled:
            assert (await store.put(Message("T", 0, body))).status is PutStatus.OK
    segment_calls = [thread for thread, length in fallocate.calls if length == SEG]
    assert len(segment_calls) >= 3
    assert loop_thread not in segment_calls, "a put preallocated a commitlog segment on the loop"
    assert len(store.get("T", 0, 0, 1000).messages()) == store.max_offset("T", 0)
    await store.close()
    assert not (tmp_path / "data" / "commitlog" / SPARE_NAME).exists()


async def test_a_spare_left_behind_is_not_read_as_a_segment(tmp_path):
    """A spare found at open (a crash left it; it may be only partly allocated) is no segment:
    the log still ends where it did, and the file is made again."""
    store = MessageStore(cfg(tmp_path))
    store.open()
    await store.start()
    r = await store.put(Message("T", 0, b"kept"))
    end = store.max_physical_offset
    await store.close()
    spare = tmp_path / "data" / "commitlog" / SPARE_NAME
    spare.write_bytes(b"\x00" * 100)
    again = MessageStore(cfg(tmp_path))
    report = again.open()
    assert report.clean and report.end_offset == end and not spare.exists()
    assert [m.physical_offset for m in again.scan(0)] == [r.physical_offset]
    assert len(again.commitlog.segments) == 1
    await again.start()
    assert spare.stat().st_size == SEG
    await again.close()
