"""The unmodified RocketMQ 5.x Node.js client (npm ``rocketmq-client-nodejs``) for the gRPC
tests: installed once into a cache directory, exactly as ``tests/grpc/node5/package-lock.json``
pins it (the client and every transitive package), and reused by later test sessions.

The cache directory is ``$TXBROKER_TEST_CACHE`` or ``~/.cache/txbroker-tests``; the install
lives in a subdirectory named after the lock file's hash, so a changed lock installs afresh.
Concurrent sessions (pytest-xdist workers) take a file lock, so one installs and the others
reuse it.  Where ``node`` or ``npm`` is missing, :func:`missing` says which, for a skip.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "grpc" / "node5"
PACKAGE_FILES = ("package.json", "package-lock.json")
#: ``npm ci`` of the pinned lock: a cold cache downloads ~55 packages.
INSTALL_TIMEOUT_S = 600.0
#: The client's ``engines`` field.
MIN_NODE = (16, 19)


class InstallError(RuntimeError):
    """``npm ci`` failed (the message holds npm's last lines)."""


def missing() -> str | None:
    """Why the Node.js client cannot run here (one line), or None."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found on PATH: the Node.js 5.x client tests need Node.js >= 16.19 and npm"
    out = subprocess.run(["node", "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    try:
        version = tuple(int(p) for p in out.strip().lstrip("v").split(".")[:2])
    except ValueError:
        return f"`node --version` printed {out.strip()!r}, not a version"
    if version < MIN_NODE:
        return f"node {out.strip()} is older than 16.19, which rocketmq-client-nodejs needs"
    return None


def cache_root() -> Path:
    env = os.environ.get("TXBROKER_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "txbroker-tests"


def install() -> Path:
    """The ``node_modules`` directory holding the pinned client, installed if not there yet."""
    digest = hashlib.sha256()
    for name in PACKAGE_FILES:
        digest.update((PACKAGE_DIR / name).read_bytes())
    key = digest.hexdigest()[:16]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"node5-{key}"
    marker = target / ".installed"
    with open(root / "node5.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            for name in PACKAGE_FILES:
                shutil.copyfile(PACKAGE_DIR / name, target / name)
            run = subprocess.run(
                ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                check=False, cwd=target, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
            if run.returncode != 0:
                tail = (run.stderr or run.stdout).strip().splitlines()[-5:]
                raise InstallError(f"npm ci of rocketmq-client-nodejs into {target} failed "
                                   f"(exit {run.returncode}): {' | '.join(tail)}")
            marker.write_text(key)
    return target / "node_modules"
