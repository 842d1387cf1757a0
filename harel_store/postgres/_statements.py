"""What the PostgreSQL core's operations and the batches share: the statements they
yield, a commit checked and encoded, and the typed array parameters."""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any, NamedTuple

_TEXT = b"t"[0]


class _Query(NamedTuple):
    """One statement an operation needs run: ``prepare`` for the hot ones; with
    ``unique``, a unique violation is sent back as :data:`_UNIQUE` instead of raised;
    ``tolerant``, a statement run once the operation's outcome is settled (the trim
    after an append): its failure is sent back as ``None``, and never raised as the
    operation's. ``begin``/``commit``: ``BEGIN`` sent before it, ``COMMIT`` after it, in
    the same round trip (a pipeline): the transaction's first and last statements cost no
    round trip of their own."""

    sql: str
    params: Any = None
    prepare: bool | None = None
    unique: bool = False
    tolerant: bool = False
    begin: bool = False
    commit: bool = False


_UNIQUE = object()
# A commit's shape (_Sql.commit): its emits (0, 1 to a target, 2 for more or one to no
# target: see _Core.prepare_commit), whether a mark,
# how many timers to arm (0, 1, 2 for more), whether timers to disarm, spawns, a step.
_Shape = tuple[int, bool, int, bool, bool, bool]
_Op = Generator[_Query, Any, Any]


class _Single(NamedTuple):
    """One commit checked and encoded: the parameters of its statement."""

    exe: Any
    eid: str
    version: int
    shape: _Shape
    params: dict[str, Any]
    commit_id: str | None
    epoch: int | None


def _restore_version(exe: Any, version: int) -> None:
    """Set back the version a commit that was not applied had set (as SQLite's
    rollback does); the error being raised is the one to show."""
    with contextlib.suppress(Exception):
        if exe.version != version:
            exe.version = version


def _pack(data: str | bytes) -> bytes:
    """An encoded value as stored: a tag byte, then UTF-8 (``str``) or the bytes."""
    if type(data) is str:
        return b"t" + data.encode("utf-8", "surrogatepass")
    return b"b" + data  # type: ignore[operator]


def _unpack(data: bytes) -> str | bytes:
    if data[0] == _TEXT:
        return data[1:].decode("utf-8", "surrogatepass")
    return data[1:]


class _Texts(list):  # type: ignore[type-arg]
    """A ``text[]`` parameter, typed even when empty (see :func:`_adapt`)."""


class _Blobs(list):  # type: ignore[type-arg]
    """A ``bytea[]`` parameter."""


class _Floats(list):  # type: ignore[type-arg]
    """A ``float8[]`` parameter."""


class _Ints(list):  # type: ignore[type-arg]
    """A ``bigint[]`` parameter."""


_ARRAYS = {_Texts: "text", _Blobs: "bytea", _Floats: "float8", _Ints: "int8"}
