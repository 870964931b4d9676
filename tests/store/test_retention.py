"""Retention and topic deletion take files off the disk without blocking the event loop.

Which thread unlinks or removes what is recorded by wrapping ``os.unlink`` / ``shutil.rmtree``
(the store itself is real): every deletion must run in the executor, and only once the store's
lists no longer hold the file, so a get running meanwhile on the loop never reaches it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time

from support.store import opened
from support.store import store_config as cfg
from support.waiting import eventually

from txbroker.store.message_store import GetStatus, MessageStore, PutStatus
from txbroker.store.record import Message
from txbroker.store.retention import TRASH_DIR


def listed_paths(store: MessageStore) -> set[str]:
    """Every file the store's lists still hold (commitlog segments and queue files)."""
    assert store.commitlog is not None
    paths = {str(s.path) for s in store.commitlog.segments}
    for cq in store.queues_.values():
        paths.update(str(f.path) for f in cq.files)
    return paths


async def test_retention_deletes_files_off_the_loop_after_the_lists_drop_them(tmp_path, monkeypatch):
    store = await opened(cfg(tmp_path, consume_queue_entries=16, file_reserved_time=3600.0))
    for _ in range(300):
        assert (await store.put(Message("T", 0, b"r" * 500))).status is PutStatus.OK
    assert store.commitlog is not None and len(store.commitlog.segments) >= 3
    old = time.time() - 7200
    for seg in store.commitlog.segments[:2]:
        os.utime(seg.path, (old, old))
    loop_thread = threading.current_thread()
    data = str(store.root)
    unlinked: list[tuple[str, threading.Thread, bool]] = []
    real_unlink = os.unlink

    def recording_unlink(path, *args, **kwargs):
        if str(path).startswith(data):
            unlinked.append((str(path), threading.current_thread(), str(path) in listed_paths(store)))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", recording_unlink)
    assert await store.delete_expired() == 2
    monkeypatch.undo()
    segments = [p for p, _, _ in unlinked if "/commitlog/" in p]
    queue_files = [p for p, _, _ in unlinked if "/consumequeue/" in p]
    assert len(segments) == 2 and queue_files, unlinked
    assert all(thread is not loop_thread for _, thread, _ in unlinked), "a file was deleted on the loop"
    assert not any(listed for _, _, listed in unlinked), "a file was deleted while still listed"
    assert not any(os.path.exists(p) for p, _, _ in unlinked)
    lo = store.min_offset("T", 0)
    assert lo > 0 and store.get("T", 0, lo, 1).status is GetStatus.FOUND
    await store.close()


async def test_delete_topic_renames_on_the_loop_and_removes_in_the_executor(tmp_path, monkeypatch):
    store = await opened(cfg(tmp_path))
    for qid in (0, 1):
        assert (await store.put(Message("Doomed", qid, b"x"))).status is PutStatus.OK
    assert (await store.put(Message("Kept", 0, b"y"))).status is PutStatus.OK
    store.offsets.set("G", "Doomed", 0, 1)
    topic_dir = store.root / "consumequeue" / "Doomed"
    loop_thread = threading.current_thread()
    entered = threading.Event()
    release = threading.Event()
    removed: list[tuple[str, threading.Thread, bool]] = []
    real_rmtree = shutil.rmtree

    def held_rmtree(path, *args, **kwargs):
        removed.append((str(path), threading.current_thread(), topic_dir.exists()))
        entered.set()
        release.wait(10)
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", held_rmtree)
    deleting = asyncio.get_running_loop().create_task(store.delete_topic("Doomed"))
    try:
        await eventually(entered.is_set, msg="the queue directory's removal started")
        # The removal is under way in a thread; the loop keeps serving, and the topic is gone
        # from the store already: a put recreates it from offset 0 in a fresh directory.
        assert store.max_offset("Doomed", 1) == 0
        assert store.offsets.get("G", "Doomed", 0) is None
        again = await store.put(Message("Doomed", 0, b"z"))
        assert again.status is PutStatus.OK and again.queue_offset == 0
    finally:
        release.set()
    assert await deleting == 2
    monkeypatch.undo()
    [(path, thread, original_present)] = removed
    assert thread is not loop_thread, "the queue directory was removed on the loop"
    assert TRASH_DIR in path and not original_present
    assert not os.path.exists(path)
    assert [m.body for m in store.get("Doomed", 0, 0, 10).messages()] == [b"z"]
    assert store.max_offset("Kept", 0) == 1
    await store.close()


async def test_open_removes_queue_directories_a_topic_deletion_left_behind(tmp_path):
    config = cfg(tmp_path)
    store = await opened(config)
    assert (await store.put(Message("T", 0, b"x"))).status is PutStatus.OK
    await store.close()
    # A stop or crash between the rename and the removal leaves the renamed directory.
    leftover = store.root / TRASH_DIR / "Gone.0123" / "0"
    leftover.mkdir(parents=True)
    (leftover / f"{0:020d}").write_bytes(bytes(64 * 20))
    again = MessageStore(config)
    assert again.open().clean
    assert not (store.root / TRASH_DIR).exists()
    assert again.queues() == {"T": [0]}
    await again.start()
    await again.close()
