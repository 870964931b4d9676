"""Network namespaces for fault injection: one namespace and address per node, silent cuts.

Every node of a cluster under test (name servers, controller or etcd members, brokers, the
client) gets its own network namespace ``<prefix><pid>-<node>`` holding ``lo`` and ``eth0`` with
an address on ``<subnet>.0/24`` (by default ``txbc`` and ``10.213.0``; the etcd runs use
``txbe`` and ``10.214.0``, so a run of each can go on side by side and neither sweeps the
other's namespaces).  The ``eth0`` ends are veth pairs whose other ends sit on a bridge inside a
namespace of its own (``txbc<pid>-br``): the subnet exists only inside namespaces this module
created, and the host namespace's interfaces and routes are never touched (every command is
``ip -n <ns>`` / ``tc -n <ns>``, or ``ip netns exec <ns>`` for a process).

**Cuts.**  A cut A->B drops every IP packet A sends to B, silently for both: an HTB qdisc on
A's ``eth0`` with a pass-through default class and a class whose leaf is the ``blackhole``
qdisc, and one u32 filter per cut steering ``dst B`` into it.  No FIN, no RST, no error on
A's sockets: an established connection stalls, a new one times out.  (A ``blackhole`` route
is not silent for the sender: a local ``connect`` to a blackholed address fails at once with
EINVAL, so it would be a different fault.)  ARP is not IP and passes, so healing is instant:
delete the filter and TCP's retransmissions carry on.  A two-way cut is two one-way cuts.
Each cut is proved before it counts: a TCP connect from A to a closed port of B must time
out (reachable, it would be refused).

**Processes.**  ``ip netns exec <ns> <argv>`` runs a node: iproute2 enters the namespace and
``exec``s the command, so the pid is the node's own (SIGSTOP, SIGCONT and SIGKILL reach it).

**The client.**  Addresses on the subnet are reachable only from inside a namespace, so the
process that drives load and checks histories enters the client's namespace itself with
``setns(2)`` (:meth:`Network.inside`, ctypes: Python 3.11 has no ``os.setns``).  Only the
calling thread moves, so everything that opens sockets must run on that thread (an asyncio
loop does); the ``ip``/``tc`` commands name their namespace and work from anywhere.  One
process then holds the SDK's objects, the history and the controller polls: no second
process, no history file to hand over (:mod:`txbroker.bench.chaos.partitions` still writes
one, for post-mortems).

**Cleanup.**  :class:`Network` is a context manager and also registers an ``atexit`` hook, so
an exception, Ctrl-C or a normal exit deletes every namespace it made (deleting a namespace
deletes its veth ends; the bridge goes with its namespace).  A run killed with SIGKILL leaves
its namespaces behind: the next :meth:`Network.up` deletes every ``<prefix><pid>-*`` namespace
of its own prefix whose pid is no longer alive.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Self

PREFIX = "txbc"
SUBNET = "10.213.0"
#: The prefix and subnet of the etcd runs (``--partitions --etcd``).
ETCD_PREFIX = "txbe"
ETCD_SUBNET = "10.214.0"
#: ``setns(2)``'s namespace type for network namespaces.
CLONE_NEWNET = 0x40000000
#: A port nothing listens on: a reachable node refuses a connect to it, a cut one is silent.
PROBE_PORT = 9
#: Seconds any one ``ip``/``tc`` command may take.
COMMAND_TIMEOUT = 10.0


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be used here; the message says why, in one line."""


def unavailable_reason() -> str | None:
    """Why this machine cannot run namespace faults (None: it can)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root to inject network faults)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the '{tool}' command (iproute2) is not installed"
    return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    if check and proc.returncode != 0:
        raise NetnsUnavailable(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def list_namespaces() -> list[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _ns_re(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}(\d+)-\S+")


def sweep_leftovers(prefix: str = PREFIX) -> list[str]:
    """Delete the namespaces (``prefix`` ones only) of runs whose process is gone; returns
    their names."""
    removed = []
    ns_re = _ns_re(prefix)
    for name in list_namespaces():
        m = ns_re.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        _run("ip", "netns", "del", name, check=False)
        removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Node:
    name: str
    ns: str
    addr: str
    #: 1-based: the host part of ``addr`` and the u32 filter priority of cuts towards it.
    index: int

    def exec_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.ns, *argv]


class Network:
    """Namespaces, a bridge and one address per node; cuts between any two of them."""

    def __init__(self, names: list[str], *, prefix: str = PREFIX, subnet: str = SUBNET) -> None:
        if len(set(names)) != len(names) or not names or len(names) > 200:
            raise ValueError("node names must be unique, 1..200 of them")
        if not re.fullmatch(r"[a-z]{1,8}", prefix):
            raise ValueError(f"namespace prefix {prefix!r}: 1-8 lower-case letters")
        if not re.fullmatch(r"10\.\d{1,3}\.\d{1,3}", subnet):
            raise ValueError(f"subnet {subnet!r}: the first three parts of a 10.x.y.0/24")
        self.prefix = prefix
        tag = f"{prefix}{os.getpid()}"
        self.bridge_ns = f"{tag}-br"
        self.nodes = {n: Node(n, f"{tag}-{n}", f"{subnet}.{i}", i) for i, n in enumerate(names, 1)}
        self.cuts: set[tuple[str, str]] = set()
        self._made: list[str] = []
        self._shaped: set[str] = set()

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    # --- lifecycle ---------------------------------------------------------------------------
    def up(self) -> Self:
        reason = unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        sweep_leftovers(self.prefix)
        atexit.register(self.down)
        try:
            self._add_ns(self.bridge_ns)
            _run("ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.bridge_ns, "link", "set", "br0", "up")
            for node in self.nodes.values():
                self._add_ns(node.ns)
                port = f"v{node.index}"
                _run("ip", "-n", self.bridge_ns, "link", "add", port, "type", "veth",
                     "peer", "name", "eth0", "netns", node.ns)
                _run("ip", "-n", self.bridge_ns, "link", "set", port, "master", "br0")
                _run("ip", "-n", self.bridge_ns, "link", "set", port, "up")
                _run("ip", "-n", node.ns, "link", "set", "lo", "up")
                _run("ip", "-n", node.ns, "addr", "add", f"{node.addr}/24", "dev", "eth0")
                _run("ip", "-n", node.ns, "link", "set", "eth0", "up")
        except BaseException:
            self.down()
            raise
        return self

    def _add_ns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._made.append(name)

    def down(self) -> None:
        """Delete every namespace this network made (idempotent; never raises)."""
        while self._made:
            name = self._made.pop()
            with contextlib.suppress(Exception):
                _run("ip", "netns", "del", name, check=False)
        self.cuts.clear()
        self._shaped.clear()
        with contextlib.suppress(Exception):
            atexit.unregister(self.down)

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # --- cuts --------------------------------------------------------------------------------
    def _shape(self, src: Node) -> None:
        """The HTB root with a pass-through class and a black-hole class, once per node."""
        if src.name in self._shaped:
            return
        tc = ("tc", "-n", src.ns)
        _run(*tc, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10")
        for cls in ("1:10", "1:20"):
            _run(*tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", cls, "htb",
                 "rate", "10gbit", "quantum", "60000")
        _run(*tc, "qdisc", "add", "dev", "eth0", "parent", "1:20", "handle", "20:", "blackhole")
        self._shaped.add(src.name)

    def cut(self, src: str, dst: str) -> None:
        """Drop every packet ``src`` sends to ``dst`` (one way), silently."""
        if (src, dst) in self.cuts:
            return
        s, d = self.nodes[src], self.nodes[dst]
        self._shape(s)
        _run("tc", "-n", s.ns, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip",
             "prio", str(d.index), "u32", "match", "ip", "dst", f"{d.addr}/32", "flowid", "1:20")
        self.cuts.add((src, dst))

    def heal(self, src: str, dst: str) -> None:
        if (src, dst) not in self.cuts:
            return
        s, d = self.nodes[src], self.nodes[dst]
        _run("tc", "-n", s.ns, "filter", "del", "dev", "eth0", "parent", "1:", "prio", str(d.index))
        self.cuts.discard((src, dst))

    def partition(self, side_a: list[str], side_b: list[str], *, oneway: bool = False) -> None:
        """Cut every node of ``side_a`` from every node of ``side_b`` (a->b only if ``oneway``)."""
        for a in side_a:
            for b in side_b:
                self.cut(a, b)
                if not oneway:
                    self.cut(b, a)

    def heal_all(self) -> None:
        for src, dst in sorted(self.cuts):
            self.heal(src, dst)

    # --- probes ------------------------------------------------------------------------------
    def probe(self, src: str, dst: str, port: int = PROBE_PORT, timeout: float = 1.0) -> str:
        """A TCP connect from ``src``'s namespace to ``dst``: "connected", "refused" (reachable,
        nothing listening), "timeout" (silence) or "error: ..." (a noisy failure)."""
        out: list[str] = []
        addr = self.nodes[dst].addr
        ns_path = f"/run/netns/{self.nodes[src].ns}"

        def attempt() -> None:
            try:
                _setns(ns_path)  # this thread only
                with socket.create_connection((addr, port), timeout=timeout):
                    out.append("connected")
            except ConnectionRefusedError:
                out.append("refused")
            except TimeoutError:
                out.append("timeout")
            except OSError as exc:
                out.append(f"error: {exc}")

        t = threading.Thread(target=attempt, name=f"probe-{src}-{dst}", daemon=True)
        t.start()
        t.join(timeout + 5.0)
        return out[0] if out else "timeout"

    def prove_cut(self, src: str, dst: str, timeout: float = 1.0) -> bool:
        """True when ``src`` -> ``dst`` is silent (a connect times out, nothing refused)."""
        return self.probe(src, dst, timeout=timeout) == "timeout"

    @contextlib.contextmanager
    def inside(self, name: str) -> Iterator[Node]:
        """Move the calling thread into ``name``'s namespace, and back on exit."""
        node = self.nodes[name]
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(f"/run/netns/{node.ns}")
            try:
                yield node
            finally:
                if _libc.setns(home, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns back to the starting namespace: {os.strerror(err)}")
        finally:
            os.close(home)
