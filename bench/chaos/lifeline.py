"""Child processes that die with the process that started them.

The harness's subprocesses (brokers, the name server, the controller) are stopped by their
owners' ``stop()``/``close()``; a driver killed with SIGKILL runs none of that, and would
leave a whole cluster running, holding its ports and data dirs.  :func:`spawn` starts a child
with Linux's ``PR_SET_PDEATHSIG`` set to SIGKILL (``prctl(2)``, in a ``preexec_fn``, between
fork and exec), so the kernel kills the child when its parent goes, however it goes.

Two details of ``prctl(2)`` shape this module:

* The signal is sent when the *thread* that forked the child exits, not the process.  The
  harness starts processes from other threads (a fault plan restarts a killed broker on its
  own thread, which ends with the plan), so every child is forked by one thread that lives
  as long as the process: :data:`_SPAWNER`'s.
* A parent that dies between fork and the ``prctl`` call sends nothing: the child checks its
  parent is still the one that forked it, and kills itself otherwise.

A child forked by another thread would also inherit *that* thread's network namespace, and
namespaces are per thread (``setns(2)``, used by the partition bench, ``netns.py``).  The
spawner thread is created by whichever thread spawns first: if that one stood inside a
namespace, every later child would start there, unreachable on the caller's loopback (seen as
a test worker whose every broker refused connections after a partition test).  So the
spawner joins the caller's network namespace before it forks, when the two differ: a child
starts where a plain ``Popen`` from the caller would.

Elsewhere (not Linux, or no ``prctl`` in the C library) :func:`spawn` is a plain ``Popen``:
children are stopped by their owners only, and a driver killed with SIGKILL leaves them in
its process group (``kill -- -PGID`` ends them; docs/bench.md, "Against a cluster and under
faults").
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

#: ``prctl`` option: the signal a child gets when its parent (thread) dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1
#: ``setns(2)``'s namespace type for network namespaces (linux/sched.h).
CLONE_NEWNET = 0x40000000
#: The calling thread's network namespace (``/proc/thread-self``: namespaces are per thread).
THREAD_NETNS = "/proc/thread-self/ns/net"


def _libc() -> ctypes.CDLL | None:
    """The C library where it has ``prctl`` (Linux), else None (then children outlive a
    killed parent)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl  # noqa: B018 - the lookup is the check
    except (OSError, AttributeError):
        return None
    return libc


def _netns() -> tuple[int, int] | None:
    """The calling thread's network namespace as (device, inode), None where unknown."""
    try:
        st = os.stat(THREAD_NETNS)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class _Spawner:
    """Forks every child from one long-lived thread, with the parent-death signal set."""

    def __init__(self) -> None:
        self.libc = _libc()
        self._lock = threading.Lock()
        self._thread: ThreadPoolExecutor | None = None

    def popen(self, argv: list[str], **kwargs: object) -> subprocess.Popen:
        if self.libc is None:
            return subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]
        with self._lock:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="txbroker-spawn")
            thread = self._thread
        parent, prctl = os.getpid(), self.libc.prctl
        where = _netns()
        # Opened here: the path names the namespace of the thread that opens it.
        ns_fd = os.open(THREAD_NETNS, os.O_RDONLY) if where is not None else -1

        def die_with_parent() -> None:
            # Runs in the child between fork and exec: two system calls, nothing that locks.
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the prctl: no signal comes
                os.kill(os.getpid(), signal.SIGKILL)

        def fork() -> subprocess.Popen:
            if where is not None and _netns() != where:
                self._join(ns_fd)
            return subprocess.Popen(argv, preexec_fn=die_with_parent,  # noqa: PLW1509 - two system calls, see above
                                    **kwargs)  # type: ignore[call-overload]

        try:
            return thread.submit(fork).result()
        finally:
            if ns_fd >= 0:
                os.close(ns_fd)

    def _join(self, ns_fd: int) -> None:
        """Move the spawner thread into the network namespace ``ns_fd`` names."""
        assert self.libc is not None
        if self.libc.setns(ns_fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns to the caller's network namespace: {os.strerror(err)}")


#: One per process: the thread that forks children must outlive them.
_SPAWNER = _Spawner()


def spawn(argv: list[str], **kwargs: object) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)``, the child killed when this process dies (Linux;
    see the module docstring for elsewhere)."""
    return _SPAWNER.popen(argv, **kwargs)


def dies_with_parent() -> bool:
    """Whether children of :func:`spawn` die with this process here."""
    return _SPAWNER.libc is not None
