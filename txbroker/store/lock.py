"""The data-directory lock: one broker per data directory.

Two brokers on one directory destroy each other's data: the second removes the first's
``abort`` marker and rewrites its ``checkpoint``, so a later crash of the first is recovered as
a clean stop and its acknowledged messages vanish.  Like RocketMQ's store ``lock`` file, the
store therefore holds an exclusive ``flock`` on ``<data_dir>/lock`` from before it reads or
writes anything in the directory until it closes.  ``flock`` belongs to the open file, so the
kernel drops it when the holder exits however it exits (SIGKILL included): a lock file left
behind by a dead broker never blocks a restart.  The holder writes its pid into the file so a
refused broker can name it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

#: The lock file's name inside the data directory (RocketMQ's store uses the same name).
LOCK_FILE = "lock"


class DataDirInUseError(Exception):
    """Another process holds the data directory's lock."""

    def __init__(self, directory: Path, pid: int | None) -> None:
        self.directory = directory
        self.pid = pid
        holder = f"pid {pid}" if pid is not None else "pid unknown"
        super().__init__(f"data directory {directory} is in use by another broker ({holder})")


class DataDirLock:
    """An exclusive, non-blocking lock on one data directory, held until :meth:`release`."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(os.path.abspath(directory))
        self.path = self.directory / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Create the directory if needed and take the lock, or raise
        :class:`DataDirInUseError` having changed nothing in the directory."""
        if self._fd is not None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise DataDirInUseError(self.directory, pid) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)  # closing drops the lock too
            raise
        self._fd = fd

    def release(self) -> None:
        """Drop the lock.  The file stays: deleting it would let a third process lock a fresh
        file while a second still waits on the old one."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _read_pid(fd: int) -> int | None:
    """The pid the holder wrote, or None if it has not written it yet (or wrote garbage)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
