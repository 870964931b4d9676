"""A standalone Spark cluster on loopback that behaves like machines of their own: a master and
one worker started with ``spark-class`` (the ``pyspark`` package's), the worker with its own
``HOME``, work dir, scratch dirs and a Python that does **not** have txbroker.

Why the worker's Python is built the way it is: a real worker machine has a Python of the
driver's major.minor with txbroker's third-party packages, and nothing of txbroker.  Here that
is a fresh venv (``--without-pip``, from the same base interpreter) whose site-packages links
every entry of the driver's site-packages except txbroker's own (its package, its dist-info and
the editable-install hooks); :func:`worker_venv` checks that ``import txbroker`` fails in it, so
whatever txbroker code an executor runs came with the job.  ``worker_python`` is a small script
that notes each start in ``python_calls`` and then runs that venv's python: a job that ignored
the Python it was told to use would leave the note empty.

Use::

    with StandaloneSpark(tmp_path / "spark") as cluster:
        cluster.master_url, cluster.worker_python, cluster.python_calls, cluster.worker_dir,
        cluster.worker_home, cluster.worker_tmp, cluster.log_tail()
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Self

from txbroker.bench.chaos.process import free_port

#: Bound on the master's and the worker's start-up (two JVMs on a shared 2-core machine).
START_TIMEOUT = 90.0


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _is_txbroker(name: str) -> bool:
    return "txbroker" in name.lower()


def worker_venv(root: Path) -> Path:
    """A venv at ``root`` with the driver's third-party packages and no txbroker; returns its
    python.  Raises AssertionError if txbroker is importable there after all."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    target = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    source = Path(sysconfig.get_paths()["purelib"])
    for entry in source.iterdir():
        if _is_txbroker(entry.name) or (entry.suffix == ".pth" and "txbroker" in entry.read_text()):
            continue
        link = target / entry.name
        if not link.exists():
            link.symlink_to(entry, target_is_directory=entry.is_dir())
    code = ("import uvloop, orjson, click, rich\n"
            "try:\n import txbroker\nexcept ImportError:\n print('no txbroker')\n"
            "else:\n print('txbroker at', txbroker.__file__)")
    probe = subprocess.run([str(python), "-P", "-c", code], cwd=root, capture_output=True, text=True, timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "no txbroker", probe.stdout
    return python


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything naming a Python or settings for Spark, or
    a venv (the in-process Spark fixture sets some of them here), plus ``extra``."""
    return {**{k: v for k, v in os.environ.items()
               if not k.startswith(("PYSPARK_", "SPARK_"))
               and k not in ("VIRTUAL_ENV", "PYTHONPATH")}, **extra}


def _clean_env(**extra: str) -> dict[str, str]:
    """:func:`child_env` for a Spark daemon: loopback, small heap, this pyspark's Spark."""
    return {**child_env(), "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m", **extra}


class StandaloneSpark:
    """Master and worker JVMs under ``root``; stopped (their process groups killed) on exit."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.worker_dir = self.root / "worker" / "work"
        self.worker_home = self.root / "worker" / "home"
        self.worker_tmp = self.root / "worker" / "tmp"
        self.worker_python: Path | None = None
        self.python_calls = self.root / "worker" / "python-calls.log"
        self.master_log = self.root / "master.log"
        self.worker_log = self.root / "worker.log"
        self._procs: list[subprocess.Popen] = []

    def _spawn(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        with open(log, "ab") as out:
            self._procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                env=env, cwd=self.root, start_new_session=True))

    def _wait_for(self, log: Path, text: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if text in log.read_text(errors="replace"):
                return
            if any(p.poll() is not None for p in self._procs):
                break
            time.sleep(0.3)
        raise AssertionError(f"{log.name}: no {text!r} within {START_TIMEOUT:g} s\n{self.log_tail()}")

    def __enter__(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            venv_python = worker_venv(self.root / "worker" / "venv")
            self.worker_python = venv_python.parent / "python-noted"
            self.worker_python.write_text(f'#!/bin/sh\necho "$*" >> "{self.python_calls}"\n'
                                          f'exec "{venv_python}" "$@"\n')
            self.worker_python.chmod(0o755)
            spark_class = str(spark_home() / "bin" / "spark-class")
            master_home = self.root / "master" / "home"
            master_home.mkdir(parents=True)
            # The REST submission server would take fixed port 6066: off.
            self._spawn([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                         "--port", str(self.port), "--webui-port", str(free_port())],
                        self.master_log,
                        _clean_env(HOME=str(master_home),
                                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false"))
            self._wait_for(self.master_log, "I have been elected leader")
            for d in (self.worker_dir, self.worker_home, self.worker_tmp,
                      self.root / "worker" / "local"):
                d.mkdir(parents=True, exist_ok=True)
            worker_env = _clean_env(
                HOME=str(self.worker_home), TMPDIR=str(self.worker_tmp),
                SPARK_WORKER_DIR=str(self.worker_dir),
                SPARK_LOCAL_DIRS=str(self.root / "worker" / "local"),
                PATH=f"{venv_python.parent}:/usr/bin:/bin")
            self._spawn([spark_class, "org.apache.spark.deploy.worker.Worker", self.master_url,
                         "--host", "127.0.0.1", "--cores", "4", "--memory", "1g",
                         "--work-dir", str(self.worker_dir), "--webui-port", str(free_port())],
                        self.worker_log, worker_env)
            self._wait_for(self.worker_log, "Successfully registered with master")
        except BaseException:
            self.close()
            raise
        return self

    def log_tail(self, n: int = 3000) -> str:
        parts = []
        for log in (self.master_log, self.worker_log):
            if log.exists():
                parts.append(f"--- {log.name} ---\n{log.read_text(errors='replace')[-n:]}")
        return "\n".join(parts)

    def close(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in reversed(self._procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # the group: executor JVMs and Python workers the worker started
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
        self._procs.clear()

    def __exit__(self, *exc: object) -> None:
        self.close()
