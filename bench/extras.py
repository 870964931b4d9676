"""The benchmarks' optional dependencies, and the one error line a missing one becomes.

``pip install -e .`` installs the broker, the SDK and the CLI; the Spark trace bench
(``txbroker bench ...``), the Kafka and peers benches and the profiler need the ``bench`` extra,
and the large codec fuzz run needs hypothesis from the ``test`` extra.  A command run without them
should say which install command fixes it, in one line, before it starts any work, rather
than die in a traceback from the first module that imports one (numpy, deep inside report
drawing, was the usual one).  Commands name what they need with :func:`require`; the CLI and
the ``python -m`` entry points turn :class:`MissingExtraError` (and a ``ModuleNotFoundError``
of a module listed here that slipped past) into that line with :func:`explain`.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: Top-level module (or program) -> the extra that installs it (setup.cfg extras_require).
EXTRA_OF = {
    "pyspark": "bench", "py4j": "bench", "pyarrow": "bench", "pandas": "bench",
    "numpy": "bench", "matplotlib": "bench", "aiokafka": "bench", "py-spy": "bench",
    "aio_pika": "bench", "nats": "bench", "trustme": "bench", "rocketmq-python-client": "bench",
    "hypothesis": "test",
}
#: What every Spark command imports (the session, Arrow transfers), dependencies before the
#: modules that need them: pandas without numpy fails with a plain ImportError naming neither.
SPARK = ("pyspark", "py4j", "numpy", "pyarrow", "pandas")
#: What drawing the report adds.
REPORT = ("matplotlib",)


def install_command(extra: str) -> str:
    return f"pip install -e '.[{extra}]'"


class MissingExtraError(RuntimeError):
    """``name`` (a module or a program) is not installed; ``extra`` installs it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.extra = EXTRA_OF[name]
        super().__init__(f"{name} is not installed (it comes with the '{self.extra}' extra): "
                         f"{install_command(self.extra)}")


def require(*modules: str) -> None:
    """Import ``modules`` now; :class:`MissingExtraError` for the first one missing."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # absent, or present but missing one of its own
            raise MissingExtraError(_extra_module(exc) or name) from None


def require_program(name: str) -> str:
    """The path of ``name`` beside this interpreter or on PATH (an extra's executable)."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise MissingExtraError(name)
    return found


def _extra_module(exc: ImportError) -> str | None:
    top = (exc.name or "").partition(".")[0]
    return top if top in EXTRA_OF else None


def explain(exc: BaseException) -> str | None:
    """The one-line reason if ``exc`` is a missing optional dependency, else None."""
    if isinstance(exc, MissingExtraError):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError):
        name = _extra_module(exc)
        return None if name is None else str(MissingExtraError(name))
    return None


def run_main(main: Callable[[], T], prog: str) -> T:
    """Run a ``python -m`` entry point: a missing extra is ``error: PROG: ...``, exit 1."""
    try:
        return main()
    except (MissingExtraError, ModuleNotFoundError) as exc:
        fail_if_missing(exc, prog)
        raise


def fail_if_missing(exc: BaseException, prog: str) -> None:
    """Exit 1 with one error line if ``exc`` is a missing optional dependency; otherwise
    return, and the caller re-raises."""
    line = explain(exc)
    if line is not None:
        print(f"error: {prog}: {line}", file=sys.stderr)
        raise SystemExit(1) from None
