"""The one line: ``open_store(url)`` / ``open_async_store(url)``.

URLs follow SQLAlchemy's convention: ``memory:``; ``sqlite://`` (in memory),
``sqlite:///relative.db``, ``sqlite:////absolute.db``; ``postgresql://…`` and
``postgres://…`` (a libpq URL, passed through). Backends are imported only when their
scheme is opened, so ``import harel_store`` needs nothing beyond the standard library.
"""

from __future__ import annotations

from typing import Any

SCHEMES = ("memory", "sqlite", "postgresql", "postgres")


def _split(url: Any) -> tuple[str, str]:
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    scheme, colon, rest = url.partition(":")
    scheme = scheme.lower()
    if not colon or scheme not in SCHEMES:
        known = ", ".join(f"{s}:" for s in SCHEMES)
        raise ValueError(f"unknown store URL {url!r}: the known schemes are {known}")
    return scheme, rest


def _memory(rest: str, url: str, sync: bool, options: dict[str, Any]) -> Any:
    if rest not in ("", "//"):
        raise ValueError(f"a memory store takes no path: {url!r} (use 'memory:')")
    if sync:
        from ._store import DictStore

        return DictStore(**options)
    from ._aio import AsyncDictStore

    return AsyncDictStore(**options)


def _sqlite_path(rest: str, url: str) -> str:
    """The file a SQLite URL names, or ``":memory:"``."""
    if not rest.startswith("//"):
        raise ValueError(f"a SQLite URL is sqlite:// or sqlite:///path.db, got {url!r}")
    path = rest[2:]
    if path and not path.startswith("/"):
        raise ValueError(f"a SQLite URL is sqlite:// or sqlite:///path.db, got {url!r}")
    if "?" in path:
        # SQLAlchemy reads a query string as options; taken as part of the file name, it
        # would make a database of another name, without the options.
        raise ValueError(
            f"a SQLite URL takes no query string (give the options to open_store as "
            f"keywords, e.g. synchronous='FULL'), got {url!r}"
        )
    return path[1:] or ":memory:"


def sqlite_file(url: str) -> str | None:
    """The database file a ``sqlite:`` URL names; ``None`` for any other URL, or for
    SQLite's in-memory database."""
    scheme, rest = _split(url)
    if scheme != "sqlite":
        return None
    path = _sqlite_path(rest, url)
    return None if path == ":memory:" else path


def _sqlite(rest: str, url: str, sync: bool, options: dict[str, Any]) -> Any:
    path = _sqlite_path(rest, url)
    from . import sqlite

    return (sqlite.SqliteStore if sync else sqlite.AsyncSqliteStore)(path, **options)


def _postgres(rest: str, url: str, sync: bool, options: dict[str, Any]) -> Any:
    from . import postgres

    return (postgres.PostgresStore if sync else postgres.AsyncPostgresStore)(url, **options)


_OPENERS = {"memory": _memory, "sqlite": _sqlite, "postgresql": _postgres, "postgres": _postgres}


def open_store(url: str, **options: Any) -> Any:
    """A store for ``url``; ``options`` are its constructor's keywords (an unknown one is
    a ``TypeError``)."""
    scheme, rest = _split(url)
    return _OPENERS[scheme](rest, url, True, options)


def open_async_store(url: str, **options: Any) -> Any:
    """The ``async`` twin of :func:`open_store`."""
    scheme, rest = _split(url)
    return _OPENERS[scheme](rest, url, False, options)
