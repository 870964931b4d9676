"""What the in-process benchmarks share (``bench.txcheck``, ``bench.pending``): running one
measuring coroutine on uvloop in a data directory, and printing its ``measure | result`` rows."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import uvloop

Rows = list[tuple[str, str]]


def run_in_data_dir(measure: Callable[[str], Coroutine[Any, Any, Rows]], data_dir: str | None,
                    prefix: str) -> Rows:
    """``measure(data_dir)`` on uvloop, in ``data_dir`` or in a fresh temporary directory
    removed afterwards."""
    if data_dir:
        return uvloop.run(measure(data_dir))
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        return uvloop.run(measure(str(Path(tmp) / "data")))


def print_rows(rows: Rows) -> None:
    width = max(len(k) for k, _ in rows)
    print(f"{'measure'.ljust(width)} | result")
    print(f"{'-' * width}-|-{'-' * 24}")
    for k, v in rows:
        print(f"{k.ljust(width)} | {v}")
