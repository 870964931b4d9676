"""The data-directory lock: exclusive, names its holder, dies with its process, touches nothing
when refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.store import opened
from support.store import store_config as cfg

from txbroker.store.lock import LOCK_FILE, DataDirInUseError, DataDirLock
from txbroker.store.message_store import MessageStore

REPO_ROOT = Path(__file__).resolve().parents[2]
HOLDER = ("import sys, time\n"
          "from pathlib import Path\n"
          "from txbroker.store.lock import DataDirLock\n"
          "DataDirLock(Path(sys.argv[1])).acquire()\n"
          "print('locked', flush=True)\n"
          "time.sleep(60)\n")


def test_second_lock_is_refused_naming_the_holder_until_released(tmp_path) -> None:
    first = DataDirLock(tmp_path / "d")
    first.acquire()
    assert first.held and (tmp_path / "d" / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    second = DataDirLock(tmp_path / "d")
    with pytest.raises(DataDirInUseError) as err:
        second.acquire()
    assert err.value.pid == os.getpid() and not second.held
    assert str(err.value) == (f"data directory {tmp_path / 'd'} is in use by another broker "
                              f"(pid {os.getpid()})")
    first.release()
    second.acquire()
    assert second.held
    second.release()


def test_lock_file_of_a_killed_holder_does_not_block(tmp_path) -> None:
    data = tmp_path / "d"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(data)], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(DataDirInUseError) as err:
            DataDirLock(data).acquire()
        assert err.value.pid == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        holder.stdout.close()
    assert (data / LOCK_FILE).read_text() == f"{holder.pid}\n"  # the stale file is still there
    lock = DataDirLock(data)
    lock.acquire()
    assert (data / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    lock.release()


async def test_a_store_in_use_is_not_opened_twice_and_not_touched(tmp_path) -> None:
    config = cfg(tmp_path, flush_interval=60.0, offset_persist_interval=60.0)  # no writes meanwhile
    store = await opened(config)
    root = Path(config.data_dir)
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}
    assert "abort" in before
    with pytest.raises(DataDirInUseError):
        MessageStore(config).open()
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()} == before
    await store.close()
    again = MessageStore(config)  # closed: the lock went with it
    assert again.open().clean
    await again.start()
    await again.close()


async def test_fresh_directory_reports_new_not_unclean(tmp_path) -> None:
    config = cfg(tmp_path)
    store = MessageStore(config)
    report = store.open()
    assert report.new and report.describe() == "new data directory"
    await store.start()
    await store.close()
    again = MessageStore(config)
    report = again.open()
    assert not report.new and report.describe().startswith("clean restart: ")
    await again.start()
    await again.close()
