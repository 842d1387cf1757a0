"""The two environment switches, parsed in one place.

``setup.py`` loads this file by path (the package is not importable while it
builds), so it must stay free of imports from the package.

A switch is on when its variable is set to any non-empty value other than
``"0"`` (surrounding whitespace ignored): ``1``, ``yes``, ``true`` all turn it
on; unset, empty and ``0`` leave it off.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

NO_EXTENSIONS = "HAREL_STORE_NO_EXTENSIONS"
REQUIRE_EXTENSIONS = "HAREL_STORE_REQUIRE_EXTENSIONS"


def is_truthy(value: str | None) -> bool:
    """Whether an environment value turns a switch on."""
    if value is None:
        return False
    value = value.strip()
    return value not in ("", "0")


def switches(environ: Mapping[str, str] | None = None) -> tuple[bool, bool]:
    """Return ``(no_extensions, require_extensions)``; both on is a ``ValueError``."""
    env = os.environ if environ is None else environ
    no_ext = is_truthy(env.get(NO_EXTENSIONS))
    require = is_truthy(env.get(REQUIRE_EXTENSIONS))
    if no_ext and require:
        raise ValueError(
            f"{NO_EXTENSIONS} and {REQUIRE_EXTENSIONS} are both set: "
            "a build or import cannot both skip and require the compiled store"
        )
    return no_ext, require


# The durable stores' hot modules, which a build also compiles with Cython from the very
# source the pure install runs (pure-Python mode: no twin to keep in step). The compiled
# module sits beside its .py and shadows it; HAREL_STORE_NO_EXTENSIONS at import loads the
# .py instead (prefer_sources). The memory stores' modules are not among them: the pure
# DictStore stays pure Python where the compiled store is built.
COMPILED_SOURCES = (
    "harel_store._codec",
    "harel_store.sqlite._batch",
    "harel_store.sqlite._connection",
    "harel_store.sqlite._store",
)


class _Sources:
    """A meta path finder that loads each of :data:`COMPILED_SOURCES` from its ``.py``."""

    @staticmethod
    def find_spec(
        name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name not in COMPILED_SOURCES or not path:
            return None
        leaf = name.rpartition(".")[2] + ".py"
        for entry in path:
            source = os.path.join(entry, leaf)
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(name, source)
        return None


def prefer_sources() -> None:
    """Make the modules of :data:`COMPILED_SOURCES` load from their source, compiled or
    not (``HAREL_STORE_NO_EXTENSIONS`` at import): before any of them is imported."""
    if _Sources not in sys.meta_path:
        sys.meta_path.insert(0, _Sources)
