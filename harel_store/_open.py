"""The one line: ``open_store(url)`` / ``open_async_store(url)``.

URLs follow SQLAlchemy's convention: ``memory:``; ``sqlite://`` (in memory),
``sqlite:///relative.db``, ``sqlite:////absolute.db``; ``postgresql://…`` and
``postgres://…`` (a libpq URL, passed through). Backends are imported only when their
scheme is opened, so ``import harel_store`` needs nothing beyond the standard library.
"""

from __future__ import annotations

from typing import Any

from ._protocols import AsyncExecutionStore, ExecutionStore
from ._redact import redact  # the one redaction, below the stores that use it

__all__ = ["SCHEMES", "open_async_store", "open_store", "private_store", "redact", "sqlite_file"]

SCHEMES = ("memory", "sqlite", "postgresql", "postgres")


def _split(url: Any) -> tuple[str, str]:
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    scheme, colon, rest = url.partition(":")
    scheme = scheme.lower()
    if not colon or scheme not in SCHEMES:
        known = ", ".join(f"{s}:" for s in SCHEMES)
        raise ValueError(f"unknown store URL {redact(url)!r}: the known schemes are {known}")
    return scheme, rest


def _memory_path(rest: str, url: str) -> None:
    if rest not in ("", "//"):
        raise ValueError(f"a memory store takes no path: {redact(url)!r} (use 'memory:')")


def _memory(rest: str, url: str, sync: bool, options: dict[str, Any]) -> Any:
    _memory_path(rest, url)
    if sync:
        from ._store import DictStore

        return DictStore(**options)
    from ._aio import AsyncDictStore

    return AsyncDictStore(**options)


def _sqlite_path(rest: str, url: str) -> str:
    """The file a SQLite URL names, or ``":memory:"``."""
    if not rest.startswith("//"):
        raise ValueError(f"a SQLite URL is sqlite:// or sqlite:///path.db, got {redact(url)!r}")
    path = rest[2:]
    if path and not path.startswith("/"):
        raise ValueError(f"a SQLite URL is sqlite:// or sqlite:///path.db, got {redact(url)!r}")
    if "?" in path:
        # SQLAlchemy reads a query string as options; taken as part of the file name, it
        # would make a database of another name, without the options.
        raise ValueError(
            f"a SQLite URL takes no query string (give the options to open_store as "
            f"keywords, e.g. synchronous='FULL'), got {redact(url)!r}"
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


def private_store(url: str) -> bool:
    """Whether the store of ``url`` lives only as long as the object that opens it:
    ``memory:``, or ``sqlite://`` (SQLite in memory). A URL that :func:`open_store`
    refuses by itself raises its ``ValueError`` here, and nothing is opened."""
    scheme, rest = _split(url)
    if scheme == "memory":
        _memory_path(rest, url)
        return True
    return scheme == "sqlite" and _sqlite_path(rest, url) == ":memory:"


def _sqlite(rest: str, url: str, sync: bool, options: dict[str, Any]) -> Any:
    path = _sqlite_path(rest, url)
    from . import sqlite

    return (sqlite.SqliteStore if sync else sqlite.AsyncSqliteStore)(path, **options)


def _postgres(rest: str, url: str, sync: bool, options: dict[str, Any]) -> Any:
    from . import postgres

    return (postgres.PostgresStore if sync else postgres.AsyncPostgresStore)(url, **options)


_OPENERS = {"memory": _memory, "sqlite": _sqlite, "postgresql": _postgres, "postgres": _postgres}


def open_store(url: str, **options: Any) -> ExecutionStore:
    """The store ``url`` names, opened; ``options`` are its constructor's keywords
    (``trace_max``, ``codec``, ``synchronous``, ...; an unknown one is a ``TypeError``).

    ==============================  ==============================================
    ``memory:``                     :class:`~harel_store.DictStore`
    ``sqlite:///relative/path.db``  :class:`~harel_store.sqlite.SqliteStore` on that
                                    file (``sqlite:////absolute/path.db``), or
                                    ``sqlite://``: a private database in memory
    ``postgresql://…``              :class:`~harel_store.postgres.PostgresStore`
                                    (``postgres://`` too; the URL goes to libpq as
                                    it is)
    ==============================  ==============================================

    An unknown scheme, or a URL its scheme does not take (a path after ``memory:``, a
    query string after a SQLite path), raises ``ValueError``, with any password in the
    URL hidden. The backend is imported only when its scheme is opened: PostgreSQL needs
    the ``postgres`` extra, and says so in an ``ImportError``. Every store is a context
    manager."""
    scheme, rest = _split(url)
    store: ExecutionStore = _OPENERS[scheme](rest, url, True, options)
    return store


def open_async_store(url: str, **options: Any) -> AsyncExecutionStore:
    """The ``async`` twin of :func:`open_store`: :class:`~harel_store.AsyncDictStore`,
    :class:`~harel_store.sqlite.AsyncSqliteStore` or
    :class:`~harel_store.postgres.AsyncPostgresStore` for the same URLs and options. Every
    async store is an async context manager."""
    scheme, rest = _split(url)
    store: AsyncExecutionStore = _OPENERS[scheme](rest, url, False, options)
    return store
