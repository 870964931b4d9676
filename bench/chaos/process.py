"""A ``txbroker serve`` subprocess: started, killed, stopped and restarted on its data dir.

The chaos driver kills and restarts the broker many times; clients keep their name-server
address, so unless the settings name ports the broker gets a fixed free loopback port and
comes back on it (the name server is then served on the broker port: one address for
everything).  The tests and the bench's embedded broker use the same class with ephemeral
ports (``broker_port=0``).  With ``kafka_port`` in the settings the ready line also names the
Kafka listener (``kafka=H:P``, in :attr:`BrokerProcess.kafka_addr` / ``.kafka_port``); a port
given there is pinned, so Kafka clients find a restarted broker at the same address (``0``
lets each start pick one).  The subprocess runs the installed ``txbroker`` package from the
caller's working directory (relative paths mean the same to both), and dies with the process
that started it (``lifeline.py``).
"""

from __future__ import annotations

import collections
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from txbroker.bench.chaos.lifeline import spawn

READY_RE = re.compile(r"^txbroker ready broker=(\S+) namesrv=(\S+)(?: kafka=(\S+))?(?: grpc=(\S+))?"
                      r"(?: workers=(\S+))?$")


#: Ports this process handed out lately: the kernel may give a port just released to the next
#: bind(0), and a broker given the same port twice (broker_port = ha_port) refuses to start.
_RECENT_PORTS: collections.deque[int] = collections.deque(maxlen=1024)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now and not handed out by this process lately (bounded tries)."""
    for _ in range(64):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _RECENT_PORTS:
            break
    _RECENT_PORTS.append(port)
    return port


class BrokerProcess:
    """One broker subprocess; ``settings`` are BrokerConfig field names -> values."""

    def __init__(self, data_dir: Path, settings: dict[str, object], log_path: Path) -> None:
        self.data_dir = Path(data_dir)
        self.settings = dict(settings)
        if "broker_port" not in self.settings:  # not evaluated when given: the host may be another namespace's
            self.settings["broker_port"] = free_port(str(self.settings.get("listen_host", "127.0.0.1")))
        self.settings.setdefault("namesrv_port", -1)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.broker_addr = ""
        self.namesrv_addr = ""
        self.kafka_addr = ""  # "H:P" of the Kafka listener, "" when it is off
        self.grpc_addr = ""  # "H:P" of the gRPC endpoint, "" when it is off
        self.worker_addrs: list[str] = []  # with workers > 1: every worker's broker address

    def argv(self) -> list[str]:
        # -P: the current directory is not put on sys.path, so a ``txbroker``, ``cli`` or
        # ``bench`` folder there cannot stand in for the installed package.
        args = [sys.executable, "-P", "-m", "txbroker", "serve", "--data-dir", str(self.data_dir)]
        for key, value in self.settings.items():
            opt = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                args.append(opt if value else "--no-" + opt[2:])
            else:
                args += [opt, str(value)]
        return args

    def start(self, timeout: float = 30.0) -> float:
        """Start and wait for the ready line; returns the seconds it took (recovery time).

        Raises RuntimeError when the broker exits first (its first line says with which code,
        the rest is what it wrote to stderr) and TimeoutError when it is not ready in time.
        """
        if self.alive():
            raise RuntimeError("broker process already running; stop() or kill() it first")
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            log_start = self._log_size()
            with open(self.log_path, "ab") as log:
                self.proc = spawn(self.argv(), stdout=subprocess.PIPE, stderr=log,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
            line = self._ready_line(deadline)
            m = READY_RE.match(line or "")
            if m:
                self.broker_addr, self.namesrv_addr = m.group(1), m.group(2)
                self.kafka_addr = m.group(3) or ""
                self.grpc_addr = m.group(4) or ""
                self.worker_addrs = m.group(5).split(";") if m.group(5) else []
                return time.monotonic() - t0
            self.kill()
            printed = self._log_from(log_start)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"broker not ready within {timeout}s\n{printed}")
            if line is not None:
                raise RuntimeError(f"unexpected first stdout line {line!r}\n{printed}")
            if "address already in use" not in printed.lower():
                raise RuntimeError(f"broker exited with {self.proc.returncode} before ready\n{printed}")
            time.sleep(0.2)  # the old socket may linger briefly after a SIGKILL: start again

    def _ready_line(self, deadline: float) -> str | None:
        assert self.proc is not None and self.proc.stdout is not None
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    return None
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    return None
                buf += chunk
        return buf.split(b"\n", 1)[0].decode(errors="replace").strip()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash, no shutdown code runs."""
        if self.proc is None:
            return
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait: the graceful path.  Returns the exit code."""
        if self.proc is None:
            return None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def restart(self, **settings: object) -> BrokerProcess:
        """Stop gracefully if running, then start on the same data dir with ``settings`` changed."""
        self.stop()
        self.settings.update(settings)
        self.start()
        return self

    @property
    def kafka_port(self) -> int:
        """The Kafka listener's bound port, -1 when it is off."""
        return int(self.kafka_addr.rsplit(":", 1)[1]) if self.kafka_addr else -1

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, n: int = 8000) -> str:
        """The last ``n`` characters the broker (all its runs) wrote to stderr."""
        return self._log_from(0)[-n:]

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _log_from(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")[-8000:]
        except OSError:
            return ""
