"""Shared fixtures: a real broker, in-process or as a subprocess.

Everything here is real: a broker bound to 127.0.0.1 port 0 with a temp data dir, TCP, files,
signals.  Settings are small so tests stay fast (1 MiB segments, check interval 0.2 s,
transaction timeout 0.5 s).

* ``broker_config`` — a :class:`BrokerConfig` for tests; derive variants with
  ``broker_config.replace(flush_mode="sync", ...)``.
* ``broker`` — a started in-process :class:`txbroker.broker.Broker` built from
  ``broker_config``; stopped (gracefully) after the test.  Use ``broker.broker_addr`` /
  ``broker.namesrv_addr`` / ``broker.store`` / ``broker.tx`` / ``broker.registry``.
* ``broker_client`` — a connected :class:`RemotingClient` to ``broker``.
* ``broker_process`` — a factory: ``proc = broker_process(data_dir=None, **overrides)`` starts
  ``txbroker serve`` in a subprocess (overrides are BrokerConfig field names → values), waits
  for its ready line and returns a :class:`BrokerProcess` with ``.broker_addr``,
  ``.namesrv_addr``, ``.data_dir``, ``.kill()`` (SIGKILL), ``.stop()`` (SIGTERM + wait, returns
  the exit code), ``.restart(**overrides)`` (same data dir, new ports) and ``.log_text()``.
  Every process is killed at teardown.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from txbroker.config import BrokerConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_RE = re.compile(r"^txbroker ready broker=(\S+) namesrv=(\S+)$")
#: Settings every test broker shares (small and fast); a test overrides what it needs.
TEST_SETTINGS = {
    "listen_host": "127.0.0.1",
    "broker_port": 0,
    "namesrv_port": 0,
    "metrics_port": -1,
    "segment_size": 1024 * 1024,
    "max_message_size": 256 * 1024,
    "consume_queue_entries": 4096,
    "flush_mode": "async",
    "flush_interval": 0.05,
    "offset_persist_interval": 0.2,
    "transaction_check_interval": 0.2,
    "transaction_timeout": 0.5,
    "max_pull_suspend": 5.0,
    "shutdown_grace": 2.0,
}


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(data_dir=str(tmp_path / "data"), **TEST_SETTINGS)


@pytest.fixture
async def broker(broker_config: BrokerConfig):
    from txbroker.broker import Broker

    b = Broker(broker_config)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


@pytest.fixture
async def broker_client(broker):
    from txbroker.remoting.client import RemotingClient

    client = RemotingClient(broker.broker_addr)
    await client.connect()
    try:
        yield client
    finally:
        await client.close()


class BrokerProcess:
    """A ``txbroker serve`` subprocess on ephemeral ports with its own data dir."""

    def __init__(self, data_dir: Path, log_path: Path, overrides: dict[str, object]) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.overrides = dict(overrides)
        self.proc: subprocess.Popen | None = None
        self.broker_addr = ""
        self.namesrv_addr = ""

    def argv(self) -> list[str]:
        settings = {**TEST_SETTINGS, **self.overrides, "data_dir": str(self.data_dir)}
        args = [sys.executable, "-c", "from cli.main import main; main()", "serve"]
        for key, value in settings.items():
            opt = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                args.append(opt if value else "--no-" + opt[2:])
            else:
                args += [opt, str(value)]
        return args

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        if self.alive():
            raise RuntimeError("broker process already running; stop() or kill() it first")
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process lifetime
        self.proc = subprocess.Popen(self.argv(), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                     stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        line = self._read_ready(timeout)
        m = READY_RE.match(line)
        if not m:
            self.kill()
            raise RuntimeError(f"unexpected first stdout line {line!r}\n{self.log_text()}")
        self.broker_addr, self.namesrv_addr = m.group(1), m.group(2)
        return self

    def _read_ready(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        buf = b""
        deadline = time.monotonic() + timeout
        try:
            while b"\n" not in buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.kill()
                    raise TimeoutError(f"broker not ready within {timeout}s\n{self.log_text()}")
                if sel.select(remaining):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    if not chunk:
                        code = self.proc.wait(5)
                        raise RuntimeError(f"broker exited with {code} before ready\n{self.log_text()}")
                    buf += chunk
        finally:
            sel.close()
        return buf.split(b"\n", 1)[0].decode().strip()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash, no shutdown code runs."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait: the graceful path.  Returns the exit code."""
        if self.proc is None:
            return None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise
        return self.proc.returncode

    def restart(self, **overrides: object) -> BrokerProcess:
        """Stop if running (gracefully), then start on the same data dir (ports may change)."""
        self.stop()
        self.overrides.update(overrides)
        return self.start()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc is not None:
            self.kill()
            if self.proc.stdout is not None:
                self.proc.stdout.close()


@pytest.fixture
def broker_process(tmp_path: Path):
    procs: list[BrokerProcess] = []

    def factory(data_dir: str | os.PathLike[str] | None = None, **overrides: object) -> BrokerProcess:
        n = len(procs)
        d = Path(data_dir) if data_dir is not None else tmp_path / f"proc{n}-data"
        p = BrokerProcess(d, tmp_path / f"proc{n}.log", overrides)
        procs.append(p)
        return p.start()

    yield factory
    for p in procs:
        p.close()
