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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

#: ``prctl`` option: the signal a child gets when its parent (thread) dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    """The C library's ``prctl``, or None where there is none (then children outlive a
    killed parent)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


class _Spawner:
    """Forks every child from one long-lived thread, with the parent-death signal set."""

    def __init__(self) -> None:
        self.prctl = _prctl()
        self._lock = threading.Lock()
        self._thread: ThreadPoolExecutor | None = None

    def popen(self, argv: list[str], **kwargs: object) -> subprocess.Popen:
        if self.prctl is None:
            return subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]
        with self._lock:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="txbroker-spawn")
            thread = self._thread
        parent, prctl = os.getpid(), self.prctl

        def die_with_parent() -> None:
            # Runs in the child between fork and exec: two system calls, nothing that locks.
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the prctl: no signal comes
                os.kill(os.getpid(), signal.SIGKILL)

        return thread.submit(subprocess.Popen, argv, preexec_fn=die_with_parent,  # type: ignore[arg-type]
                             **kwargs).result()


#: One per process: the thread that forks children must outlive them.
_SPAWNER = _Spawner()


def spawn(argv: list[str], **kwargs: object) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)``, the child killed when this process dies (Linux;
    see the module docstring for elsewhere)."""
    return _SPAWNER.popen(argv, **kwargs)


def dies_with_parent() -> bool:
    """Whether children of :func:`spawn` die with this process here."""
    return _SPAWNER.prctl is not None
