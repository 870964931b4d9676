"""Build of txbroker's optional compiled twins of its hottest pure functions.

Everything else (metadata, packages, dependencies) is in setup.cfg; this file only lists the
Cython extensions.  Each ``_x.pyx`` is the compiled twin of a pure-Python module that stays the
reference (``txbroker/remoting/codec.py`` for ``_codec.pyx``): the package works without them,
so a machine without a C compiler (or without Cython, as in a build without isolation) still
installs txbroker, with one warning line, and runs the pure-Python code.
"""

from __future__ import annotations

import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

#: module name -> its Cython source.
EXTENSIONS = {
    "txbroker.remoting._codec": "txbroker/remoting/_codec.pyx",
    "txbroker.remoting._header_codec": "txbroker/remoting/_header_codec.pyx",
    "txbroker.store._record": "txbroker/store/_record.pyx",
}


def _warn(why: object) -> None:
    print(f"WARNING: txbroker's compiled codec was not built ({why}); "
          "installing the pure-Python package", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that turns a failed compile into a warning: the extensions are an option."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler/toolchain failure means "no extension"
            _warn(exc)

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - as in run(): this extension is optional
            _warn(exc)


def _extensions() -> list:
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError as exc:
        _warn(exc)
        return []
    try:
        return cythonize([Extension(name, [src]) for name, src in EXTENSIONS.items()],
                         compiler_directives={"language_level": "3"}, quiet=True)
    except Exception as exc:  # noqa: BLE001 - a Cython error leaves the pure-Python package
        _warn(exc)
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
