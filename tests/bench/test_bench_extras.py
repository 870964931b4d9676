"""Without the optional dependencies (``pip install -e .`` only), every bench command and
every ``python -m txbroker.bench.X`` entry point that needs an extra fails with one error line
naming the install command, exit 1, before doing any work; ``--help`` still works.

Nothing is uninstalled: each run is a real subprocess whose imports of the extras' modules
fail, through a ``sitecustomize`` on its PYTHONPATH that puts a blocking finder first on
``sys.meta_path`` (what Python does when a package is absent: ModuleNotFoundError naming it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCH_LINE = "is not installed (it comes with the 'bench' extra): pip install -e '.[bench]'"
EVERY_EXTRA = ("pyspark", "py4j", "pyarrow", "pandas", "numpy", "matplotlib", "aiokafka",
               "hypothesis")

BLOCKER = textwrap.dedent("""
    import sys

    BLOCKED = set({blocked!r})

    class Absent:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Absent())
""")


def _run(tmp_path: Path, blocked: tuple[str, ...], *args: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(blocked)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_the_blocker_really_hides_the_modules(tmp_path) -> None:
    proc = _run(tmp_path, EVERY_EXTRA, "-c", "import numpy")
    assert proc.returncode == 1 and "ModuleNotFoundError: No module named 'numpy'" in proc.stderr
    # and hides nothing else: the broker's own dependencies still import
    assert _run(tmp_path, EVERY_EXTRA, "-c", "import orjson, rich, click, uvloop").returncode == 0


@pytest.mark.parametrize("args", [
    ("generate", "-n", "10", "--out", "out/trace"),
    ("replay", "--trace", "trace", "--namesrv", "127.0.0.1:9", "--out", "out/results"),
    ("verify", "--trace", "trace", "--results", "results"),
    ("report", "--results", "results", "--out", "out/report"),
    ("run", "-n", "10", "--work-dir", "out/work"),
], ids=lambda a: a[0])
def test_every_bench_command_names_the_install_command(tmp_path, args) -> None:
    line = _one_line(_run(tmp_path, EVERY_EXTRA, "-m", "txbroker", "bench", *args))
    assert line == f"error: bench {args[0]}: pyspark {BENCH_LINE}", line
    assert not (tmp_path / "out").exists()  # nothing written, no Spark log, no work dir


@pytest.mark.parametrize("missing", ["numpy", "matplotlib"])
@pytest.mark.parametrize("command", ["report", "run"])
def test_report_and_run_name_the_one_module_missing(tmp_path, command, missing) -> None:
    """Spark present, one drawing module not (``bench run`` used to die in numpy's import)."""
    args = ("--results", "r", "--out", "out") if command == "report" else ("--work-dir", "out")
    line = _one_line(_run(tmp_path, (missing,), "-m", "txbroker", "bench", command, *args))
    assert line == f"error: bench {command}: {missing} {BENCH_LINE}", line
    assert not (tmp_path / "out").exists()


def test_help_needs_no_extra(tmp_path) -> None:
    for args in (("bench", "--help"), ("bench", "run", "--help"), ("--help",)):
        proc = _run(tmp_path, EVERY_EXTRA, "-m", "txbroker", *args)
        assert proc.returncode == 0 and "Usage:" in proc.stdout, (args, proc.stderr)


def test_kafka_bench_names_the_install_command(tmp_path) -> None:
    line = _one_line(_run(tmp_path, EVERY_EXTRA, "-m", "txbroker.bench.kafka", "--seconds", "0.1"))
    assert line == f"error: python -m txbroker.bench.kafka: aiokafka {BENCH_LINE}", line


def test_codec_fuzz_names_the_test_extra(tmp_path) -> None:
    line = _one_line(_run(tmp_path, EVERY_EXTRA, "-m", "txbroker.bench.chaos.codecfuzz",
                          "--examples", "1"))
    assert line == ("error: python -m txbroker.bench.chaos.codecfuzz: hypothesis is not installed "
                    "(it comes with the 'test' extra): pip install -e '.[test]'"), line
