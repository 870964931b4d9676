"""topics.json is written off the event loop, and a change shows only once the file holds it."""

from __future__ import annotations

import asyncio
import errno
import os
import threading

import pytest
from support.waiting import eventually

from txbroker.config import BrokerConfig
from txbroker.remoting.codes import ResponseCode
from txbroker.service.topics import TopicConfig, TopicManager, TopicStoreError


class GatedFsync:
    """``os.fsync`` that records its thread and, once armed, holds until released."""

    def __init__(self) -> None:
        self.real = os.fsync
        self.threads: list[int] = []
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, fd: int) -> None:
        self.threads.append(threading.get_ident())
        if self.armed:
            self.entered.set()
            self.release.wait(5)  # on the loop thread this would stall the test, then fail it
        self.real(fd)


async def test_topic_table_is_written_off_the_loop_and_shows_once_written(tmp_path, monkeypatch):
    tm = TopicManager(BrokerConfig(data_dir=str(tmp_path), default_queue_nums=4))
    fsync = GatedFsync()
    fsync.armed = True
    monkeypatch.setattr(os, "fsync", fsync)
    loop_thread = threading.get_ident()
    create = asyncio.create_task(tm.get_or_create("Orders"))
    twin = asyncio.create_task(tm.get_or_create("Orders"))  # a second send for the same new topic
    # the loop keeps running while the table is being written
    await eventually(fsync.entered.is_set, 5, "the topic table written")
    assert tm.get("Orders") is None  # not on disk yet: not visible
    fsync.release.set()
    tc = await create
    assert await twin is tc and tm.get("Orders") == TopicConfig("Orders", 4, 4)
    assert len(fsync.threads) == 1 and fsync.threads[0] != loop_thread  # one write, not on the loop
    assert TopicManager(tm.config).get("Orders") == tc


async def test_a_change_the_disk_refuses_is_never_seen(tmp_path, monkeypatch):
    cfg = BrokerConfig(data_dir=str(tmp_path))
    tm = TopicManager(cfg)
    await tm.create_or_update(TopicConfig("Kept", 2, 2))

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(TopicStoreError) as err:
        await tm.get_or_create("New")
    assert err.value.code == ResponseCode.SERVICE_NOT_AVAILABLE and "No space left" in err.value.remark
    with pytest.raises(TopicStoreError):
        await tm.create_or_update(TopicConfig("Kept", 8, 8))
    with pytest.raises(TopicStoreError):
        await tm.delete("Kept")
    assert tm.get("New") is None and tm.get("Kept") == TopicConfig("Kept", 2, 2)
    monkeypatch.undo()
    again = TopicManager(cfg)
    assert again.get("New") is None and again.get("Kept") == TopicConfig("Kept", 2, 2)
    assert not (tmp_path / "config" / "topics.tmp").exists()
