"""A ``txbroker serve`` subprocess on a fixed loopback port, so clients survive restarts.

The chaos driver kills and restarts the broker many times; clients keep their name-server
address, so the broker comes back on the same port (the name server is served on the broker
port: one address for everything).
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

READY_RE = re.compile(r"^txbroker ready broker=(\S+) namesrv=(\S+)$")
REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BrokerProcess:
    def __init__(self, data_dir: Path, settings: dict[str, object], log_path: Path) -> None:
        self.data_dir = Path(data_dir)
        self.settings = dict(settings)
        self.settings.setdefault("broker_port", free_port(str(self.settings.get("listen_host", "127.0.0.1"))))
        self.settings.setdefault("namesrv_port", -1)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.broker_addr = ""

    def argv(self) -> list[str]:
        args = [sys.executable, "-c", "from cli.main import main; main()", "serve",
                "--data-dir", str(self.data_dir)]
        for key, value in self.settings.items():
            opt = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                args.append(opt if value else "--no-" + opt[2:])
            else:
                args += [opt, str(value)]
        return args

    def start(self, timeout: float = 30.0) -> float:
        """Start and wait for the ready line; returns the seconds it took (recovery time)."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:  # the old socket may linger briefly after a SIGKILL
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(self.argv(), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                             stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            line = self._ready_line(deadline)
            m = READY_RE.match(line or "")
            if m:
                self.broker_addr = m.group(1)
                return time.monotonic() - t0
            self.kill()
            if self.proc.returncode not in (None, -9) and "in use" not in self.log_tail(2000) \
                    or time.monotonic() > deadline:
                raise RuntimeError(f"broker did not start: {line!r}\n{self.log_tail()}")
            time.sleep(0.2)

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
        if self.proc is None:
            return
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def log_tail(self, n: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""
