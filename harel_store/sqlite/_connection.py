"""The SQLite store's connection: the constructor's arguments, checked; the file name as
SQLite is given it; write transactions; the driver's errors as the store's own."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from .. import _checks
from .._codec import JSON
from .._errors import StoreError, shown

SYNCHRONOUS = ("NORMAL", "FULL")
BUSY_TIMEOUT_MAX = (2**31 - 1) / 1000  # SQLite's busy timeout is an int of milliseconds
_MEMORY = ":memory:"


def _closed() -> ValueError:
    return ValueError("I/O operation on a closed store")


def _uri(path: str) -> str:
    """What ``sqlite3.connect`` is given for ``path``: a ``file:`` URI that names the file
    and nothing else. A SQLite built with ``SQLITE_USE_URI`` would read a path that starts
    with ``file:`` as a URI itself (``file::memory:``, ``file:x.db?mode=ro``)."""
    if path == _MEMORY:
        return path
    quoted = urllib.parse.quote_from_bytes(os.fsencode(path), safe="/")
    # "file://" starts an authority: an absolute path follows an empty one.
    return f"file://{quoted}" if quoted.startswith("/") else f"file:{quoted}"


def _options(
    path: Any, trace_max: Any, codec: Any, synchronous: Any, busy_timeout: Any, clock: Any
) -> tuple[str, int | None, Any, str, float, Callable[[], float]]:
    """The constructor's arguments, checked (shared by the sync and async stores)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    path = str.__str__(path)  # a str subclass's own methods and repr are not called again
    if not path:
        raise ValueError("path must not be empty (':memory:' opens a private in-memory database)")
    if "\0" in path:  # in a URI, SQLite would end the file name there
        raise ValueError(f"path must not hold a NUL character, got {path!r}")
    if path.endswith(os.sep) or (os.altsep is not None and path.endswith(os.altsep)):
        raise ValueError(f"path must name a file, not a directory: {path!r} ends with a separator")
    size = _checks.as_trace_max(trace_max)
    if codec is None:
        codec = JSON
    else:
        _checks.as_codec(codec)
    if not isinstance(synchronous, str):
        raise TypeError(f"synchronous must be a str, got {type(synchronous).__name__}")
    level = str.__str__(synchronous).upper()
    if level not in SYNCHRONOUS:
        raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {shown(synchronous)}")
    timeout = _checks.as_time(busy_timeout, "busy_timeout")
    if not timeout > 0.0:
        raise ValueError(
            f"busy_timeout must be a positive number of seconds, got {shown(busy_timeout)}"
        )
    if timeout > BUSY_TIMEOUT_MAX:
        raise ValueError(
            f"busy_timeout must be at most {BUSY_TIMEOUT_MAX} seconds (SQLite's limit, "
            f"2**31 - 1 milliseconds: about 24.8 days), got {shown(busy_timeout)}"
        )
    if clock is None:
        clock = time.time
    elif not callable(clock):
        raise TypeError(f"clock must be a function giving seconds, got {type(clock).__name__}")
    return path, size, codec, level, timeout, clock


def _begin(conn: sqlite3.Connection, path: str) -> None:
    """Open a write transaction, waiting up to ``busy_timeout`` for another writer's lock;
    a lock held longer is a ``StoreError``, not the driver's ``database is locked``."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        if not (isinstance(exc, sqlite3.OperationalError) and _is_busy(exc)):
            raise _write_failed(path, exc) from exc
        raise StoreError(
            f"the SQLite database {path!r} stayed locked by another writer for longer than "
            f"busy_timeout: nothing was written ({exc})"
        ) from exc


class _Transaction:
    """``with _Transaction(store, undo) as conn``: one write transaction of ``store``, under
    its lock. ``BEGIN IMMEDIATE`` on entry (:func:`_begin`); ``COMMIT`` at the end, unless
    the body ended the transaction itself (a replay rolls its record back). On any
    exception, and when ``COMMIT`` fails: ``ROLLBACK``, then ``undo()`` (which sets back the
    versions the body set, with :func:`_set_back`), then the driver's error raised as the store's own
    (:func:`_write_failed`). A plain class, not a generator: it is on every commit's path."""

    __slots__ = ("_conn", "_store", "_undo")

    def __init__(self, store: Any, undo: Callable[[], None] | None = None) -> None:
        self._store = store
        self._undo = undo
        self._conn: sqlite3.Connection | None = None

    def __enter__(self) -> sqlite3.Connection:
        store = self._store
        store._lock.acquire()
        try:
            conn: sqlite3.Connection | None = store._conn
            if conn is None:
                raise _closed()
            _begin(conn, store._path)
        except BaseException:
            store._lock.release()
            raise
        self._conn = conn
        return conn

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        store = self._store
        conn = self._conn
        assert conn is not None
        try:
            if exc is None:
                try:
                    if conn.in_transaction:
                        conn.execute("COMMIT")
                    return
                except BaseException as failed:
                    self._abort(conn)
                    if isinstance(failed, sqlite3.Error):
                        raise _write_failed(store._path, failed) from failed
                    raise
            self._abort(conn)
            if isinstance(exc, sqlite3.Error):
                raise _write_failed(store._path, exc) from exc
        finally:
            self._conn = None
            store._lock.release()

    def _abort(self, conn: sqlite3.Connection) -> None:
        if self._store._conn is conn:  # caller code (a codec) may have closed the store
            _rollback(conn)
        if self._undo is not None:
            self._undo()


def _write_failed(path: str, exc: sqlite3.Error) -> StoreError:
    """The driver's error from a write transaction (rolled back), as the store's own: a
    file it may read but not write, a damaged file, a full disk."""
    return StoreError(f"writing to the SQLite database {path!r} failed, nothing was written: {exc}")


def _read_failed(path: str, exc: sqlite3.Error) -> StoreError:
    return StoreError(f"reading the SQLite database {path!r} failed: {exc}")


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo the open transaction, if one is open."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _set_back(exe: Any, version: int) -> None:
    """Undo the version a failed commit may have set on ``exe``."""
    with contextlib.suppress(Exception):  # the error being raised is the one to show
        if exe.version != version:
            exe.version = version


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
    return "locked" in str(exc) or "busy" in str(exc)


def _id(value: Any, what: str) -> None:
    """An id of a durable store (a ``str``) that SQLite can hold as a key (see
    :func:`_text`)."""
    if type(value) is not str:
        _checks.str_id(value, what)
    _text(value, what)


def _text(text: Any, what: str, i: int = -1) -> None:
    """Refuse a ``str`` id that SQLite cannot hold as a key, before anything is written
    (``what % i`` names it): the driver hands SQLite text as UTF-8, which has no lone
    surrogates, and a key is at most :data:`harel_store._checks.KEY_BYTES_MAX` bytes of
    it, as in every durable store."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _not_utf8(text, exc.start, what if i < 0 else what % i) from None
    _checks.durable_key(text, what, i)


def _texts(eid: str, body: _checks.Body, commit_id: str | None) -> None:
    """:func:`_text` for every id of a commit (:func:`harel_store._checks.commit_keys`)."""
    # All at once first: ASCII ids that are short together are each short and UTF-8.
    mark = body.processed_event_id
    texts = [eid, "" if mark is None else mark, "" if commit_id is None else commit_id]
    for target, _ in body.emits:
        if target is not None:
            texts.append(target)
    for op in body.timers:
        texts.append(op[1])
    for spawn in body.spawns:
        texts.append(spawn[0])
    joined = "".join(texts)
    if len(joined) <= _checks.KEY_BYTES_MAX and joined.isascii():
        return
    for text, what, i in _checks.commit_keys(eid, body, commit_id):
        if not (text.isascii() and len(text) <= _checks.KEY_BYTES_MAX):  # else plainly fine
            _text(text, what, i)


def _not_utf8(text: str, index: int, what: str) -> ValueError:
    return ValueError(
        f"SQLite text cannot hold lone surrogates: {what} {text!r} has {text[index]!r} "
        f"at index {index}"
    )
