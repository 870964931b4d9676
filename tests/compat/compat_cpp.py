"""Run the RocketMQ C++ client driver (``cpp_driver.py``) in a bounded subprocess.

The client library is native code reached through ctypes: a protocol mistake by the broker
can make it segfault or hang rather than raise.  Every run is therefore a separate process
with its own ``HOME`` (the client writes its logs under ``~/logs/rocketmq-cpp``), a hard
deadline, and SIGKILL of exactly that process when the deadline passes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

DRIVER = Path(__file__).with_name("cpp_driver.py")


def client_available() -> bool:
    """True when the ``compat`` extra is installed and its native library loads.

    Checked in a child process, so the test runner itself never loads native client code.
    """
    try:
        probe = subprocess.run([sys.executable, "-c", "import rocketmq.client"],
                               capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@dataclass
class CppRun:
    """One driver process: its events (parsed JSON lines), exit code and stderr tail."""

    spec: dict
    home: Path
    proc: asyncio.subprocess.Process | None = None
    events: list[dict] = field(default_factory=list)
    returncode: int | None = None
    stderr: str = ""
    _reader: asyncio.Task | None = None
    _started: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> CppRun:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HOME": str(self.home)}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, str(DRIVER), json.dumps(self.spec), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self._reader = asyncio.ensure_future(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                # The driver keeps stdout for events only; anything else here is a bug.
                self.events.append({"event": "unparsed", "line": line.decode(errors="replace")})
                continue
            self.events.append(ev)
            if ev.get("event") == "started":
                self._started.set()

    async def wait_started(self, timeout: float = 15.0) -> None:
        """Wait until a push consumer reported ``started`` (fails if the process died)."""
        waiter = asyncio.ensure_future(self._started.wait())
        assert self._reader is not None
        await asyncio.wait({waiter, self._reader}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not self._started.is_set():
            await self.finish(1.0)
            raise AssertionError(f"C++ consumer did not start: {self.describe()}")

    async def finish(self, timeout: float) -> CppRun:
        """Wait for exit within ``timeout`` s; SIGKILL the process if it overruns."""
        assert self.proc is not None
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            if self.proc.returncode is None:
                self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            await asyncio.wait_for(self._reader, 5)
        assert self.proc.stderr is not None
        self.stderr = (await self.proc.stderr.read()).decode(errors="replace")[-4000:]
        self.returncode = self.proc.returncode
        return self

    def of(self, event: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == event]

    def describe(self) -> str:
        return (f"exit={self.returncode} events={self.events[-20:]!r}\n"
                f"stderr tail: {self.stderr[-1500:]}\nclient log: {self.client_log()[-3000:]}")

    def client_log(self) -> str:
        logs = sorted((self.home / "logs").rglob("*")) if (self.home / "logs").exists() else []
        return "".join(p.read_text(errors="replace") for p in logs if p.is_file())

    def assert_clean(self) -> None:
        assert self.returncode == 0, self.describe()
        assert self.of("done"), self.describe()
        assert not self.of("error"), self.describe()
        assert not self.of("unparsed"), self.describe()


async def run_cpp(home: Path, timeout: float = 25.0, **spec: object) -> CppRun:
    """Run one scenario to completion (bounded by ``timeout``) and return what it reported."""
    run = CppRun(dict(spec), home)
    await run.start()
    return await run.finish(timeout)
