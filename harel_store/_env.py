"""The two environment switches, parsed in one place.

``setup.py`` loads this file by path (the package is not importable while it
builds), so it must stay free of imports from the package.

A switch is on when its variable is set to any non-empty value other than
``"0"`` (surrounding whitespace ignored): ``1``, ``yes``, ``true`` all turn it
on; unset, empty and ``0`` leave it off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

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
