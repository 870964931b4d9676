"""Which implementation of the hot-path modules runs: compiled or pure Python.

The modules listed in :data:`COMPILED` are plain Python, and the build also compiles them
with Cython into extension modules of the same name (``setup.py``; skipped with a warning
when no C compiler is there).  Python's import system prefers the extension when both exist,
so a built tree runs compiled.  ``TXBROKER_NO_EXTENSIONS=1`` makes every ``txbroker`` module
load from its ``.py`` source instead, so the same source runs interpreted: the suite runs
against both (README), and a suspected compiler problem can be ruled out without a rebuild.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

#: Modules compiled by setup.py: the code every transaction runs (docs/bench.md, "Compiled hot path").
COMPILED = (
    "txbroker.remoting.codec",
    "txbroker.remoting.command",
    "txbroker.remoting.connection",
    "txbroker.remoting.header_codec",
    "txbroker.remoting.headers",
    "txbroker.service.processors.send",
    "txbroker.service.processors.transaction",
    "txbroker.service.transaction.bridge",
    "txbroker.service.transaction.history",
    "txbroker.service.transaction.index",
    "txbroker.service.transaction.locks",
    "txbroker.service.transaction.messages",
    "txbroker.service.transaction.pending",
    "txbroker.service.transaction.service",
    "txbroker.service.transaction.state",
    "txbroker.store.append",
    "txbroker.store.consumequeue",
    "txbroker.store.message_store",
    "txbroker.store.record",
    "txbroker.store.results",
    "txbroker.store.segment",
)

ENV = "TXBROKER_NO_EXTENSIONS"


class _SourceOnly(importlib.abc.MetaPathFinder):
    """Finds ``txbroker.*`` modules among source files only, so an extension module built
    beside a ``.py`` file is never picked."""

    _loaders = ((importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),)

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if not name.startswith("txbroker.") or not path:
            return None
        for entry in path:
            spec = importlib.machinery.FileFinder(entry, *self._loaders).find_spec(name, target)
            if spec is not None:
                return spec
        return None


def install() -> None:
    """Called first thing by ``txbroker/__init__``: with :data:`ENV` set, source only."""
    if os.environ.get(ENV) and not any(isinstance(f, _SourceOnly) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceOnly())


def in_use() -> str:
    """"compiled" when the hot path runs as extension modules, else "pure Python" (for the
    start-up log line and ``txbroker --version``)."""
    compiled = [name for name in COMPILED
                if isinstance(getattr(sys.modules.get(name), "__loader__", None),
                              importlib.machinery.ExtensionFileLoader)]
    if not compiled:
        return "pure Python"
    return "compiled" if len(compiled) == len(COMPILED) else f"compiled ({len(compiled)} of {len(COMPILED)} modules)"
