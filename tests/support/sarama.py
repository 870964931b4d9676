"""The sarama test program (tests/kafka/sarama/main.go): building it offline and running it.

Debian ships sarama as Go source (``golang-github-shopify-sarama-dev``, sarama 1.22, under
/usr/share/gocode) for ``golang-go``: the program is built in GOPATH mode with no network
(``GO111MODULE=off``, ``GOPROXY=off``), once per source: the binary is cached under a
directory the caller gives (pytest's cache), keyed by the hash of the source, the Go version
and the sarama version, so later runs start at once.  A run prints one JSON object per line;
:class:`Run` collects them while the program runs."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "kafka" / "sarama" / "main.go"
GOPATH_SYSTEM = Path("/usr/share/gocode")
SARAMA_DIR = GOPATH_SYSTEM / "src" / "github.com" / "Shopify" / "sarama"
BUILD_TIMEOUT_S = 300


class BuildError(RuntimeError):
    pass


def missing() -> str | None:
    """Why the sarama program cannot be built here (one line), or None."""
    if shutil.which("go") is None:
        return "`go` not found on PATH: the sarama tests need Debian's golang-go (apt-get install golang-go)"
    if not (SARAMA_DIR / "consumer_group.go").exists():
        return (f"sarama's source is not under {SARAMA_DIR}: the sarama tests need "
                "golang-github-shopify-sarama-dev (apt-get install golang-github-shopify-sarama-dev)")
    return None


def _sarama_version() -> str:
    """The Debian package's version, from its changelog when there, else sarama's own."""
    changelog = Path("/usr/share/doc/golang-github-shopify-sarama-dev/changelog.Debian.gz")
    if changelog.exists():
        import gzip

        return gzip.decompress(changelog.read_bytes()).splitlines()[0].decode(errors="replace")
    return str(max(p.stat().st_mtime_ns for p in SARAMA_DIR.glob("*.go")))


def build(cache_dir: Path) -> Path:
    """The built program, from the cache when its key matches."""
    go_version = subprocess.run(["go", "version"], check=True, capture_output=True, text=True,
                                timeout=60).stdout.strip()
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(go_version.encode())
    digest.update(_sarama_version().encode())
    key = digest.hexdigest()[:16]
    cache_dir.mkdir(parents=True, exist_ok=True)
    binary = cache_dir / f"sarama-{key}"
    with open(cache_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return binary
        (cache_dir / "gopath").mkdir(exist_ok=True)
        env = {**os.environ, "GO111MODULE": "off", "GOFLAGS": "", "GOPROXY": "off",
               "CGO_ENABLED": "0", "GOPATH": f"{GOPATH_SYSTEM}:{cache_dir / 'gopath'}",
               "GOCACHE": str(cache_dir / "gocache")}
        partial = cache_dir / f"sarama-{key}.partial"
        run = subprocess.run(["go", "build", "-o", str(partial), str(SOURCE)], env=env,
                             check=False, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if run.returncode != 0:
            tail = (run.stderr or run.stdout).strip().splitlines()[-8:]
            raise BuildError(f"go build of {SOURCE} failed (exit {run.returncode}): {' | '.join(tail)}")
        partial.rename(binary)
        for old in cache_dir.glob("sarama-*"):
            if old != binary and not old.name.endswith((".lock", ".partial")):
                old.unlink(missing_ok=True)
    return binary


class Run:
    """One running subcommand; ``events`` fills as it prints."""

    def __init__(self, proc: asyncio.subprocess.Process, args: tuple[str, ...]) -> None:
        self.proc, self.args = proc, args
        self.events: list[dict] = []
        self.stderr = b""
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, binary: Path, *args: str) -> Run:
        proc = await asyncio.create_subprocess_exec(
            str(binary), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        return cls(proc, args)

    async def _read(self) -> None:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        err = asyncio.ensure_future(self.proc.stderr.read())
        while line := await self.proc.stdout.readline():
            self.events.append(json.loads(line))
        self.stderr = await err

    def of(self, event: str) -> list[dict]:
        return [e for e in self.events if e["event"] == event]

    def terminate(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float) -> int:
        """The exit code; the program is killed (and the test fails) past ``timeout``."""
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"sarama {' '.join(self.args)} still running after {timeout} s; "
                                 f"events: {self.events[-5:]}") from None
        await self._reader
        return code

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


async def run(binary: Path, *args: str, timeout: float = 60.0) -> list[dict]:
    """Runs a subcommand to its end; its events.  A non-zero exit fails with its last words."""
    r = await Run.start(binary, *args)
    code = await r.wait(timeout)
    assert code == 0, f"sarama {' '.join(args)} exited {code}: {r.events[-3:]} {r.stderr[-500:]!r}"
    return r.events
