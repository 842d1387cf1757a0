"""Choose the store implementation for this process: the compiled ``_store_c`` when it
is built and loads, else the pure ``_store_py``. ``HAREL_STORE_NO_EXTENSIONS`` forces
pure; ``HAREL_STORE_REQUIRE_EXTENSIONS`` turns a missing compiled module into an error.
Type checkers read the pure module."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._env import REQUIRE_EXTENSIONS, switches

NO_EXTENSIONS, _REQUIRE = switches()

if TYPE_CHECKING or NO_EXTENSIONS:
    from ._store_py import DictStore

    IMPLEMENTATION = "pure"
else:
    try:
        from ._store_c import DictStore

        IMPLEMENTATION = "compiled"
    except ImportError as exc:
        if _REQUIRE:
            raise ImportError(
                f"{REQUIRE_EXTENSIONS} is set but the compiled store cannot be imported: {exc}"
            ) from exc
        from ._store_py import DictStore

        IMPLEMENTATION = "pure"

__all__ = ["IMPLEMENTATION", "DictStore"]
