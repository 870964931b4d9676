"""The job's own code for executors: the installed ``txbroker`` package as one zip, handed to
``SparkContext.addPyFile`` so every executor imports the driver's txbroker from it.

A worker machine then needs only a Python of the driver's major.minor (PySpark refuses any
other) with txbroker's third-party packages; it never installs txbroker, and a driver with
changed code ships the change with its next job.  The zip is built from wherever the package
is installed, editable installs included: ``txbroker.cli`` and ``txbroker.bench`` come from the
repository's top-level ``cli/`` and ``bench/`` folders there (setup.cfg ``package_dir``), so
they are looked up by name, not only found under ``txbroker/``.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import shutil
import tempfile
import zipfile
from pathlib import Path

from txbroker import __version__

#: Packages whose directories are walked; the last two may live outside the first one.
ROOTS = ("txbroker", "txbroker.cli", "txbroker.bench")


def package_files() -> dict[str, Path]:
    """Archive name (``txbroker/.../x.py``) -> installed file, for every file of the package
    (bytecode caches left out: each worker compiles for itself)."""
    files: dict[str, Path] = {}
    for root in ROOTS:
        spec = importlib.util.find_spec(root)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"package {root} is not installed")
        prefix = root.replace(".", "/")
        for location in spec.submodule_search_locations:
            base = Path(location)
            for path in sorted(base.rglob("*")):
                rel = path.relative_to(base)
                if not path.is_file() or "__pycache__" in rel.parts or path.suffix == ".pyc":
                    continue
                files[f"{prefix}/{rel.as_posix()}"] = path
    return files


def build_zip(dest_dir: Path) -> Path:
    """Write ``txbroker-<version>-<content hash>.zip`` into ``dest_dir`` and return its path.
    The hash names the content, so a changed package is never mistaken for a cached one."""
    files = package_files()
    digest = hashlib.sha256()
    for name, path in sorted(files.items()):
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    target = Path(dest_dir) / f"txbroker-{__version__}-{digest.hexdigest()[:12]}.zip"
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, path in sorted(files.items()):
            zf.write(path, name)
    return target


def ship(spark) -> Path:
    """Add the package zip to ``spark``'s job; returns the zip, which lives in a temp dir
    removed when this process exits (the driver serves it to executors until then)."""
    tmp = tempfile.mkdtemp(prefix="txbroker-code-")
    atexit.register(shutil.rmtree, tmp, True)
    path = build_zip(Path(tmp))
    spark.sparkContext.addPyFile(str(path))
    return path
