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
    """Base class of the store's own errors (conflicts, fencing, schema problems)."""


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
