"""Build harel_store: the Cython store when it can be compiled, the pure store otherwise.

``HAREL_STORE_NO_EXTENSIONS`` skips the compiled store; ``HAREL_STORE_REQUIRE_EXTENSIONS``
turns a failed compile into an error instead of a loud fallback to the pure install.
``HAREL_STORE_CYTHON_TRACE=1`` compiles with line tracing for coverage and profilers; it
halves the speed, so release builds never set it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _load_env():
    spec = importlib.util.spec_from_file_location("_harel_store_env", HERE / "harel_store" / "_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ENV = _load_env()
NO_EXTENSIONS, REQUIRE_EXTENSIONS = ENV.switches()
TRACE = ENV.is_truthy(os.environ.get("HAREL_STORE_CYTHON_TRACE"))


def _fallback(reason: str) -> None:
    if REQUIRE_EXTENSIONS:
        raise SystemExit(
            f"error: {ENV.REQUIRE_EXTENSIONS} is set and the compiled store could not be built: {reason}"
        )
    bar = "*" * 78
    sys.stderr.write(
        f"\n{bar}\nWARNING: harel_store's compiled store could not be built:\n  {reason}\n"
        "Installing the PURE-PYTHON store instead: same behaviour, slower.\n"
        f"Set {ENV.REQUIRE_EXTENSIONS}=1 to make this an error.\n{bar}\n\n"
    )
    sys.stderr.flush()


class OptionalBuildExt(build_ext):
    """Compile the store, or fall back to the pure install loudly (or fail, if required)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:  # the modules compile independently: one per core
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        self.failed_extensions: list[str] = []
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure means "no compiler"
            _fallback(f"{type(exc).__name__}: {exc}")
            return
        if not self.inplace and self.extensions and not self.failed_extensions:
            # `pip install . && python -m harel_store` run from the checkout imports the
            # checkout's harel_store/, so it gets the compiled module too, not a silent
            # pure fallback.
            try:
                self.copy_extensions_to_source()
            except OSError as exc:
                print(f"note: compiled store not copied into the source tree: {exc}", file=sys.stderr)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self.failed_extensions.append(ext.name)  # nothing to copy into the source tree
            traceback.print_exc()
            _fallback(f"{type(exc).__name__}: {exc}")


def _extensions() -> list[Extension]:
    if NO_EXTENSIONS:
        print(f"{ENV.NO_EXTENSIONS} is set: building the pure-Python store only", file=sys.stderr)
        return []
    if sys.implementation.name != "cpython":
        _fallback(f"the compiled store needs CPython, not {sys.implementation.name}")
        return []
    try:
        from Cython import __version__ as cython_version
        from Cython.Build import cythonize
    except ImportError as exc:
        _fallback(f"Cython is not installed ({exc})")
        return []
    directives = {
        "language_level": 3,
        "embedsignature": True,
        "embedsignature.format": "clinic",
        "binding": False,
        "boundscheck": False,
        "wraparound": False,
        "initializedcheck": False,
        "cdivision": True,
        # No generated __reduce__: a pickled table would hand out the store's internals.
        "auto_pickle": False,
        "linetrace": TRACE,
        "profile": TRACE,
    }
    macros = [("HAREL_STORE_CYTHON_VERSION", f'"{cython_version}"')]
    if TRACE:
        macros += [("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")]
    ext = Extension("harel_store._store_c", ["harel_store/_store_c.pyx"], define_macros=macros)
    # The durable stores' hot modules, compiled from their own .py with Python's semantics
    # whole: annotations stay hints (Cython would otherwise enforce them, refusing a None
    # or a subclass where the pure module takes it), indexing stays checked, functions
    # introspect as Python's do (binding).
    sources = [
        Extension(name, [name.replace(".", "/") + ".py"], define_macros=macros)
        for name in ENV.COMPILED_SOURCES
    ]
    as_python = {
        "language_level": 3,
        "annotation_typing": False,
        "binding": True,
        "auto_pickle": False,
        "linetrace": TRACE,
        "profile": TRACE,
    }
    try:
        # force: the generated C depends on HAREL_STORE_CYTHON_TRACE, which timestamps miss
        return cythonize(
            [ext], compiler_directives=directives, quiet=True, force=True
        ) + cythonize(sources, compiler_directives=as_python, quiet=True, force=True)
    except Exception as exc:  # noqa: BLE001
        _fallback(f"cythonize failed: {type(exc).__name__}: {exc}")
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
