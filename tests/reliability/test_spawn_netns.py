"""Children of ``lifeline.spawn`` start in the network namespace of the thread that spawns them.

Every child is forked by one long-lived spawner thread, which inherits the namespace of the
thread that created it.  The partition bench runs its client inside a namespace
(``Network.inside``); when that was a process's first spawn, the spawner stayed there and
every later broker of the process started in that namespace, refusing the host's loopback
clients (a pytest worker whose every later test failed with "connection refused").

Root only, with iproute2 (skipped with the reason otherwise).
"""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from txbroker.bench.chaos.lifeline import THREAD_NETNS, _Spawner
from txbroker.bench.chaos.netns import CLONE_NEWNET, PREFIX, _libc, unavailable_reason

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def _child_netns(spawner: _Spawner) -> str:
    proc = spawner.popen(["readlink", "/proc/self/ns/net"], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=10)
    return out.strip()


def _in_namespace(name: str, spawner: _Spawner) -> str:
    """What a child spawned from a thread inside namespace ``name`` reports."""
    got: list[str] = []
    errors: list[BaseException] = []

    def inside() -> None:
        fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            assert _libc.setns(fd, CLONE_NEWNET) == 0, "setns failed"
            got.append(_child_netns(spawner))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
        finally:
            os.close(fd)

    t = threading.Thread(target=inside)  # a throwaway thread: namespaces are per thread
    t.start()
    t.join(20)
    if errors:
        raise errors[0]
    assert got, "the spawn inside the namespace did not finish"
    return got[0]


def test_children_start_in_the_spawning_threads_namespace() -> None:
    name = f"{PREFIX}{os.getpid()}-spawn"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        ns_inode = f"net:[{os.stat(f'/run/netns/{name}').st_ino}]"  # a bind mount of the namespace
        host = os.readlink(THREAD_NETNS)
        assert host != ns_inode
        spawner = _Spawner()
        # The first spawn comes from inside the namespace: it creates the spawner thread there.
        assert _in_namespace(name, spawner) == ns_inode
        assert _child_netns(spawner) == host
        assert _in_namespace(name, spawner) == ns_inode
        assert _child_netns(spawner) == host
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=10)
