"""The exceptions every store raises, defined once so ``except`` works whichever store
and implementation is active."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


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
