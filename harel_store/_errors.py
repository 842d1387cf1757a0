"""The exceptions every store raises, defined once so ``except`` works whichever store
and implementation is active; and how a message names a value (:func:`shown`) or the
exception it passes on (:func:`reason`)."""

from __future__ import annotations

import reprlib
from collections.abc import Hashable
from typing import Any

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80  # a message names a value; it does not dump it


def shown(value: object) -> str:
    """``value`` as a message names it: its ``repr``, cut short past 80 characters
    (``reprlib``); a value whose ``repr`` raises is named by its type and address
    (``<T instance at 0x...>``). A message never fails over the value it names, so the
    error it was meant for is the one raised."""
    try:
        return _REPR.repr(value)
    except Exception:  # noqa: BLE001 - any error of the caller's repr; BaseExceptions pass
        return f"<{type(value).__name__} instance at {id(value):#x}>"


def reason(exc: BaseException) -> str:
    """What ``exc`` says (its ``str``), or its type's name when that raises."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - as in shown()
        return f"<{type(exc).__name__}>"


class StoreError(Exception):
    """Base class of the store's own errors (conflicts, fencing, schema problems), and
    what a durable store raises when its database fails: no exception of a driver
    (``sqlite3``, ``psycopg``) reaches the caller; the driver's is its ``__cause__``.

    On PostgreSQL the message of a database failure gives the server's SQLSTATE and
    ends with what to do. *Retry*: the call may pass later (the store has already
    retried once, on a new connection, the calls that cannot apply anything twice):
    the connection was lost, the server is shutting down, crashed or is starting
    (``57P01``, ``57P02``, ``57P03``, class ``08``), the session is read-only, as on a
    standby after a failover (``25006``), a serialization failure or a deadlock
    (``40001``, ``40P01``), a lock or statement timeout (``55P03``, ``57014``), too
    many connections (``53300``). When the connection was lost during a write, the
    message says whether it was applied is unknown: load to see, or retry a commit with
    its ``commit_id``, which is recognised. *Fix the setup*: it will fail again until
    the database, the role or the server is changed: a missing privilege (``42501``), a
    missing table or schema (``42P01``, ``3F000``), a unique violation in rows the store
    never writes twice (``23505``: its tables were changed by hand), a full disk
    (``53100``), a refused login. On SQLite, a read-only or damaged file, a full disk
    or a dropped table is a ``StoreError`` saying that nothing was written, and a lock
    held past ``busy_timeout`` one that says so (retry).
    """


class StoreConflict(StoreError):
    """A CAS failure: a different object is stored under ``execution_id`` at another version.

    ``expected`` is the version the caller held, ``found`` the one in the store. Reload
    and retry, or drop the stale work.
    """

    def __init__(self, execution_id: Hashable, expected: Any, found: Any) -> None:
        super().__init__(execution_id, expected, found)
        self.execution_id = execution_id
        self.expected = expected
        self.found = found

    def __str__(self) -> str:
        return (
            f"execution {self.execution_id!r}: expected version {self.expected!r}, "
            f"store holds version {self.found!r}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.execution_id, self.expected, self.found))


class IdempotencyConflict(StoreError):
    """``commit_id`` was already applied for ``execution_id`` with a different body."""

    def __init__(self, execution_id: Hashable, commit_id: str) -> None:
        super().__init__(execution_id, commit_id)
        self.execution_id = execution_id
        self.commit_id = commit_id

    def __str__(self) -> str:
        return (
            f"execution {self.execution_id!r}: commit id {self.commit_id!r} was already "
            "applied with a different body"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.execution_id, self.commit_id))


class StaleWriter(StoreError):
    """A writer at ``epoch`` was fenced off: ``execution_id`` is claimed at ``current``."""

    def __init__(self, execution_id: Hashable, epoch: int, current: int) -> None:
        super().__init__(execution_id, epoch, current)
        self.execution_id = execution_id
        self.epoch = epoch
        self.current = current

    def __str__(self) -> str:
        return (
            f"execution {self.execution_id!r}: writer epoch {self.epoch!r} is stale, "
            f"the execution is claimed at epoch {self.current!r}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.execution_id, self.epoch, self.current))
