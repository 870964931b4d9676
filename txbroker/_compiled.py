"""Which implementation of the hot path runs: compiled or pure Python.

Two kinds of extension modules are built by ``setup.py`` (with Cython; skipped with one warning
line when no C compiler is there):

* :data:`TWINS`, ``_x.pyx`` twins of the hottest pure functions of a reference module (frame
  split, JSON header, typed header decoders, record decode), which the reference module loads
  itself and falls back from;
* :data:`COMPILED`, plain Python modules of the transaction path compiled as they are into an
  extension of the same name: Python's import system prefers the extension when both exist,
  so the same source runs compiled, or interpreted.

``TXBROKER_NO_EXTENSIONS=1`` makes every ``txbroker`` module load from its ``.py`` source and the
references skip their twins, so the suite can run against both (the README's test command) and
a suspected compiler problem can be ruled out without a rebuild.  Measured gains are in
docs/bench.md, "Compiled hot path".
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings

#: Cython twins (``.pyx``) of functions of a reference module.
TWINS = (
    "txbroker.remoting._codec",
    "txbroker.remoting._header_codec",
    "txbroker.store._record",
)

#: Plain modules compiled whole: the code every transaction runs (send and END handlers, the
#: transaction service and its index, the connection core, the store's put path).
COMPILED = (
    "txbroker.remoting.command",
    "txbroker.remoting.connection",
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
    "txbroker.store.results",
    "txbroker.store.segment",
)

ENV = "TXBROKER_NO_EXTENSIONS"


_SOURCE = ((importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),)


class _Chooser(importlib.abc.MetaPathFinder):
    """Finds ``txbroker`` modules: from source only when :data:`ENV` is set; otherwise it
    steps in only for an extension older than the source it was built from (an editable
    install whose ``.py`` or ``.pyx`` was edited since ``pip install -e .``), which would run
    code that is no longer the source: then the source runs, with one warning.  A compiled
    twin's reference module skips the twin by itself (its import fails here)."""

    def __init__(self, source_only: bool) -> None:
        self.source_only = source_only
        self.stale: list[str] = []

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if not name.startswith("txbroker.") or not path:
            return None
        if self.source_only:
            return _source_spec(name, path, target)
        if name not in _BUILT:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            return None
        built = os.stat(spec.origin).st_mtime
        source = spec.origin.split(".", 1)[0] + _BUILT[name]
        if not os.path.exists(source) or os.stat(source).st_mtime <= built:
            return None
        if not self.stale:
            warnings.warn(f"txbroker: {spec.origin} is older than {source}; running the "
                          "source modules of stale builds (pip install -e . rebuilds them)",
                          RuntimeWarning, stacklevel=2)
        self.stale.append(name)
        if _BUILT[name] == ".pyx":
            raise ImportError(f"{name} is older than its source")
        return _source_spec(name, path, target)


#: Every extension module -> the suffix of the source it is built from.
_BUILT = {**{name: ".pyx" for name in TWINS}, **{name: ".py" for name in COMPILED}}


def _source_spec(name, path, target):  # type: ignore[no-untyped-def]
    for entry in path:
        spec = importlib.machinery.FileFinder(entry, *_SOURCE).find_spec(name, target)
        if spec is not None:
            return spec
    return None


def install() -> None:
    """Called first thing by ``txbroker/__init__``: puts :class:`_Chooser` first."""
    if not any(isinstance(f, _Chooser) for f in sys.meta_path):
        sys.meta_path.insert(0, _Chooser(bool(os.environ.get(ENV))))


def in_use() -> str:
    """"compiled" when every extension is there and chosen, "pure Python" when none is (not
    built, or switched off), else how many of them (for ``txbroker --version``, the start-up log
    and the benchmarks).  Looks the modules up without importing them."""
    names = TWINS + COMPILED
    compiled = sum(1 for name in names if _is_extension(name))
    if compiled == len(names):
        return "compiled"
    return "pure Python" if not compiled else f"compiled ({compiled} of {len(names)} modules)"


def _is_extension(name: str) -> bool:
    if os.environ.get(ENV):
        return False
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        return False
    return spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
