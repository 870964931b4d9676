"""Build of txbroker's optional compiled hot path (``txbroker/_compiled.py`` says what and why).

Everything else (metadata, packages, dependencies) is in setup.cfg; this file only lists the
Cython extensions, in two kinds:

* **twins**: ``_x.pyx`` files, the compiled twins of the hottest pure functions of a module that
  stays the reference and loads its twin itself (``txbroker/remoting/codec.py`` for
  ``_codec.pyx``);
* **whole modules**: plain ``.py`` modules of the transaction path compiled as they are into an
  extension of the same name, so the same source runs either way.

The package works without them, so a machine without a C compiler (or without Cython, as in a
build without isolation) still installs txbroker, with one warning line, and runs the
pure-Python code.  ``-O1 -g0`` keeps the build inside the README's minute: ``-O3 -g`` took 3.5x
longer to compile and gave no measurable speed (the compiled code spends its time in the
interpreter's C API, not in its own instructions).
"""

from __future__ import annotations

import os
import runpy
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

#: The lists, from the module that also chooses at run time (standard library only).
_LISTS = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                     "txbroker", "_compiled.py"))
_FLAGS = ["-O1", "-g0"]


def _warn(why: object) -> None:
    print(f"WARNING: txbroker's compiled hot path was not built ({why}); "
          "installing the pure-Python package", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that turns a failed compile into a warning (the extensions are an option)
    and compiles on every core."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

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


def _source(name: str, suffix: str) -> str:
    return name.replace(".", "/") + suffix


def _extensions() -> list:
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError as exc:
        _warn(exc)
        return []
    threads = os.cpu_count() or 1
    try:
        twins = cythonize([Extension(name, [_source(name, ".pyx")], extra_compile_args=_FLAGS)
                           for name in _LISTS["TWINS"]],
                          compiler_directives={"language_level": "3"}, quiet=True,
                          nthreads=threads)
        # Plain Python compiled as it is: annotations stay hints (not C type checks), functions
        # stay introspectable like Python's.
        whole = cythonize([Extension(name, [_source(name, ".py")], extra_compile_args=_FLAGS)
                           for name in _LISTS["COMPILED"]],
                          compiler_directives={"language_level": "3", "annotation_typing": False,
                                               "binding": True},
                          quiet=True, nthreads=threads)
    except Exception as exc:  # noqa: BLE001 - a Cython error leaves the pure-Python package
        _warn(exc)
        return []
    return twins + whole


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
