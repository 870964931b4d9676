"""RabbitMQ and NATS server processes for ``bench.peers``, from the installed Debian packages.

Each server is started by the benchmark itself, alone on loopback: free ports, a temporary data
directory and a configuration of its own (nothing of ``/etc`` or ``/var/lib`` is read or
written, and no system service is touched), made ready before the first message and stopped
at the end, also when the run fails or is interrupted (the servers are context managers and run
in a session of their own, so a stop reaches every process they started).

A package that is not installed is not an error: :func:`find_server` returns None and the
benchmark prints one line naming it (:func:`missing_line`) and skips its rows.

Server CPU is the sum over the server's process tree (:func:`tree_cpu_seconds`): RabbitMQ is a
shell script that runs ``beam.smp``, which runs helper processes of its own; reading only the
started process would count the shell's nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

#: Seconds a server may take to answer its protocol's greeting after start (RabbitMQ boots an
#: Erlang VM and its database first: several seconds on this machine), and to stop.
START_SECONDS = 120.0
STOP_SECONDS = 60.0
#: The AMQP 0-9-1 protocol header a client sends first; a ready broker answers with a
#: Connection.Start method frame (frame type 1).
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


class ServerError(RuntimeError):
    """A server did not start or answered what no ready server answers."""


def find_server(program: str) -> str | None:
    """The path of ``program`` on PATH, or None: the package is not installed here."""
    return shutil.which(program)


def missing_line(name: str, program: str, package: str) -> str:
    """The one line a run without ``program`` prints for the rows of ``name`` it skips."""
    return (f"{name}: skipped: {program} not found on PATH (package {package}: "
            f"apt-get install {package})")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server that cannot bind port 0 and tell."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of process ``root`` and every live descendant, plus what
    their children already reaped used (``/proc/<pid>/stat`` utime, stime, cutime, cstime):
    a helper that exits between two readings moves into its parent's cutime, so the sum only
    grows."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # exited between the listing and the read
            continue
        rest = stat[stat.rindex(")") + 2:].split()  # comm may hold spaces; fields from 3 on
        pid = int(entry.name)
        parent[pid] = int(rest[1])
        ticks[pid] = sum(int(v) for v in rest[11:15])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(child for child, ppid in parent.items() if ppid == pid)
    return total / os.sysconf("SC_CLK_TCK")


def _stop_session(proc: subprocess.Popen) -> None:
    """SIGTERM to ``proc`` (the server's graceful stop), bounded; then SIGKILL to its whole
    session (``proc`` leads it), so that no helper it started outlives the benchmark."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _log_tail(path: Path, lines: int = 3) -> str:
    """The server log's last lines on one line, for an error that must stay one line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " / ".join(tail) or "(empty log)"


class _Server:
    """What both servers share: a temporary directory, a process in its own session, a bounded
    wait for the greeting, a stop that reaches every process, and the CPU of the tree."""

    name = ""

    def __init__(self, program: str) -> None:
        self.program = program
        self.port = 0
        self.version = ""
        self.proc: subprocess.Popen | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix=f"txbroker-peers-{self.name}-")
        self.dir = Path(self._tmp.name)
        self.log = self.dir / "server.log"

    def cpu(self) -> float:
        assert self.proc is not None
        return tree_cpu_seconds(self.proc.pid)

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        with open(self.log, "ab") as log:
            return subprocess.Popen(argv, env=env, cwd=self.dir, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _greeting(self, sock: socket.socket) -> str | None:
        """The version if the server on ``sock`` answered as a ready one; None to try again."""
        raise NotImplementedError

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"{self.name} exited with {self.proc.returncode} before it was "
                                  f"ready on 127.0.0.1:{self.port}; its log ends: "
                                  f"{_log_tail(self.log)}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                    sock.settimeout(5)
                    version = self._greeting(sock)
                if version is not None:
                    self.version = version
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise ServerError(f"{self.name} not ready on 127.0.0.1:{self.port} after "
                          f"{START_SECONDS:g} s; its log ends: {_log_tail(self.log)}")

    def _start(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self._start()
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _stop_helpers(self) -> None:
        """Stop what the server needs beside its own process (nothing, unless overridden)."""

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc is not None:
                _stop_session(self.proc)
        finally:
            try:
                self._stop_helpers()
            finally:
                self._tmp.cleanup()


class RabbitServer(_Server):
    """``rabbitmq-server`` on 127.0.0.1: its own node name, Erlang distribution port and
    port mapper (``epmd``, started here and stopped with it, so the machine's is untouched),
    its database, logs, cookie and configuration in the temporary directory, no plugins."""

    name = "rabbitmq"

    def __init__(self, program: str) -> None:
        super().__init__(program)
        self.epmd: subprocess.Popen | None = None

    def _script(self) -> str:
        """Debian links ``/usr/sbin/rabbitmq-server`` to a wrapper that switches to the
        ``rabbitmq`` user and the system's directories; the script beside it runs the server
        as the caller, with the environment given here."""
        real = Path(os.path.realpath(self.program))
        beside = real.with_name("rabbitmq-server")
        return str(beside) if beside.is_file() else self.program

    def _start(self) -> None:
        self.port = free_port()
        epmd_port, dist_port = free_port(), free_port()
        epmd = shutil.which("epmd")
        if epmd is None:
            raise ServerError("rabbitmq: epmd not found on PATH (package erlang-base)")
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n")
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")
        env = dict(os.environ, HOME=str(self.dir), ERL_EPMD_PORT=str(epmd_port),
                   ERL_EPMD_ADDRESS="127.0.0.1",
                   RABBITMQ_NODENAME=f"txbroker-peers-{os.getpid()}@localhost",
                   RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT=str(self.port),
                   RABBITMQ_DIST_PORT=str(dist_port),
                   RABBITMQ_CONF_ENV_FILE=str(self.dir / "rabbitmq-env.conf"),
                   RABBITMQ_CONFIG_FILE=str(self.dir / "rabbitmq.conf"),
                   RABBITMQ_ADVANCED_CONFIG_FILE=str(self.dir / "advanced.config"),
                   RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "enabled_plugins"),
                   RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
                   RABBITMQ_LOG_BASE=str(self.dir / "log"),
                   RABBITMQ_PID_FILE=str(self.dir / "rabbitmq.pid"))
        self.epmd = self._spawn([epmd, "-port", str(epmd_port), "-address", "127.0.0.1"], env)
        self.proc = self._spawn([self._script()], env)

    def _greeting(self, sock: socket.socket) -> str | None:
        """The AMQP header answered by a Connection.Start frame: the listener is up, which
        RabbitMQ opens last in its boot.  The version comes from the client's connection."""
        sock.sendall(AMQP_HEADER)
        first = sock.recv(1)
        return "" if first == b"\x01" else None

    def _stop_helpers(self) -> None:
        if self.epmd is not None:
            _stop_session(self.epmd)


class NatsServer(_Server):
    """``nats-server`` on 127.0.0.1 with JetStream, file storage in the temporary directory."""

    name = "nats"

    def _start(self) -> None:
        self.port = free_port()
        self.proc = self._spawn([self.program, "-a", "127.0.0.1", "-p", str(self.port),
                                 "-js", "-sd", str(self.dir / "jetstream")])

    def _greeting(self, sock: socket.socket) -> str | None:
        """NATS greets with ``INFO {json}``; ready for the benchmark once JetStream is on."""
        line = sock.makefile("rb").readline(64 * 1024)
        if not line.startswith(b"INFO "):
            return None
        info = json.loads(line[5:])
        return str(info.get("version", "")) if info.get("jetstream") else None
