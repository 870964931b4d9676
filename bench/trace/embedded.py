"""A throwaway ``txbroker serve`` subprocess on free loopback ports with a temp data dir, set up
with the broker settings a trace was generated for (so its expectations hold)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

from txbroker.bench.trace.spec import BrokerSettings

_READY = re.compile(r"txbroker ready broker=(\S+) namesrv=(\S+)")


class EmbeddedBroker:
    def __init__(self, settings: BrokerSettings, data_dir: str | None = None) -> None:
        self.settings = settings
        self._tmp = None if data_dir else tempfile.mkdtemp(prefix="txbroker-bench-")
        self.data_dir = Path(data_dir or self._tmp)
        self.proc: subprocess.Popen | None = None
        self.namesrv_addr = ""
        self.broker_addr = ""

    def argv(self) -> list[str]:
        s = self.settings
        return [sys.executable, "-c", "from txbroker.cli.main import main; main()", "serve",
                "--listen-host", "127.0.0.1", "--broker-port", "0", "--namesrv-port", "0",
                "--metrics-port", "-1", "--data-dir", str(self.data_dir / "data"),
                "--segment-size", str(64 * 1024 * 1024),
                "--transaction-timeout", str(s.transaction_timeout),
                "--transaction-check-interval", str(s.transaction_check_interval),
                "--transaction-check-max", str(s.transaction_check_max),
                "--log-level", "WARNING"]

    def __enter__(self) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "broker.log", "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=subprocess.PIPE, stderr=log,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        deadline = time.monotonic() + 30
        line = b""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = _READY.search(line.decode(errors="replace"))
            if m:
                self.broker_addr, self.namesrv_addr = m.group(1), m.group(2)
                return self
        self.close()
        raise RuntimeError(f"broker did not start: {line!r}\n{self.log_text()}")

    def log_text(self) -> str:
        try:
            return (self.data_dir / "broker.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.close()
