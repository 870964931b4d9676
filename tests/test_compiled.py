"""Which implementation runs (txbroker/_compiled.py): the extensions when built and current,
the sources when switched off or when an extension is older than the source it was built
from (an edited editable install), with one warning."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from txbroker._compiled import COMPILED, ENV, TWINS

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import importlib, json, sys
names = sys.argv[1:]
mods = {n: importlib.import_module(n).__file__ for n in names}
from txbroker._compiled import in_use
from txbroker.remoting import codec
print(json.dumps({"files": mods, "in_use": in_use(), "codec": codec.IMPLEMENTATION}))
"""


def _built() -> bool:
    return all(list((REPO / Path(*name.split(".")[:-1])).glob(name.split(".")[-1] + ".*.so"))
               for name in TWINS + COMPILED)


pytestmark = pytest.mark.skipif(not _built(), reason="the extensions are not built here")


def _copy(tmp_path: Path) -> Path:
    """The package with its built extensions, where file times can be changed freely."""
    shutil.copytree(REPO / "txbroker", tmp_path / "txbroker",
                    ignore=shutil.ignore_patterns("__pycache__", "*.c"))
    return tmp_path


def _probe(root: Path, env_value: str | None, *names: str) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if env_value is not None:
        env[ENV] = env_value
    run = subprocess.run([sys.executable, "-W", "always", "-c", PROBE, *names], cwd=root, env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(run.stdout), run.stderr


def test_a_current_build_runs_compiled(tmp_path) -> None:
    root = _copy(tmp_path)
    doc, err = _probe(root, None, "txbroker.store.append", "txbroker.service.transaction.service")
    assert all(f.endswith(".so") for f in doc["files"].values()), doc
    assert doc["in_use"] == "compiled" and doc["codec"] == "compiled"
    assert "older than" not in err


def test_the_switch_runs_every_module_from_source(tmp_path) -> None:
    root = _copy(tmp_path)
    doc, _ = _probe(root, "1", "txbroker.store.append", "txbroker.service.transaction.service")
    assert all(f.endswith(".py") for f in doc["files"].values()), doc
    assert doc["in_use"] == "pure Python" and doc["codec"] == "python"


def test_an_extension_older_than_its_source_is_not_run(tmp_path) -> None:
    """An edit after the build: the edited module runs from source, the others stay compiled,
    and one warning says how to rebuild."""
    root = _copy(tmp_path)
    later = time.time() + 10
    os.utime(root / "txbroker" / "store" / "append.py", (later, later))
    os.utime(root / "txbroker" / "remoting" / "_codec.pyx", (later, later))
    doc, err = _probe(root, None, "txbroker.store.append", "txbroker.store.segment")
    assert doc["files"]["txbroker.store.append"].endswith("append.py")
    assert doc["files"]["txbroker.store.segment"].endswith(".so")
    assert doc["codec"] == "python"  # the stale twin is skipped by its reference module
    total = len(TWINS) + len(COMPILED)
    assert doc["in_use"] == f"compiled ({total - 2} of {total} modules)"
    assert err.count("older than") == 1 and "pip install -e ." in err

