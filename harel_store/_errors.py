"""The exception both store implementations raise, defined once so ``except`` works
whichever implementation is active."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


class StoreConflict(Exception):
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
