"""``list_executions`` of the memory stores: pages through execution ids in the order the
store first held them, each page costing what it returns, without a write on the commit
path.

The store's table of executions is a dict, in insertion order but with no way to start
an iteration in its middle. :class:`Listing` keeps that order in a list, built on the
first call and then brought up to date lazily: executions added since are the last keys
of the dict (read with ``reversed``, in proportion to how many), and ``forget`` leaves a
hole, which a later page skips. Holes are squeezed out once they outnumber the ids. An
id forgotten since a page returned it still says where that page ended (until two
squeezes later), so a cleaner may forget what it lists.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import islice
from typing import Any

from ._errors import shown

_HOLE: Any = object()
_SLACK = 64


class Listing:
    """The order of a memory store's executions, for ``list_executions``."""

    __slots__ = ("holes", "ids", "next", "was", "was_before")

    def __init__(self) -> None:
        self.ids: list[Any] = []
        self.next: dict[Hashable, int] = {}  # id -> where the page after it starts
        self.was: dict[Hashable, int] = {}  # forgotten id -> the same
        self.was_before: dict[Hashable, int] = {}  # forgotten before the last squeeze
        self.holes = 0

    def forgot(self, execution_id: Hashable) -> None:
        """``forget`` dropped ``execution_id`` from the store."""
        at = self.next.pop(execution_id, None)
        if at is None:
            return
        self.ids[at - 1] = _HOLE
        self.was[execution_id] = at
        self.holes += 1

    def page(self, slots: dict[Hashable, Any], after: Any, limit: int) -> list[Any]:
        """Up to ``limit`` ids of ``slots`` holding an execution, after ``after``."""
        self._catch_up(slots)
        if after is None:
            at = 0
        else:
            try:
                found = self.next.get(after)
                if found is None:
                    found = self.was.get(after)
                    if found is None:
                        found = self.was_before.get(after)
            except TypeError:
                raise TypeError(f"after must be None or an execution id, got {shown(after)}")
            if found is None:
                raise ValueError(
                    f"after={shown(after)} is not an execution id this store has listed"
                )
            at = found
        page: list[Any] = []
        ids = self.ids
        size = len(ids)
        while at < size and len(page) < limit:
            eid = ids[at]
            at += 1
            if eid is not _HOLE and slots[eid].exe is not None:
                page.append(eid)
        return page

    def _catch_up(self, slots: dict[Hashable, Any]) -> None:
        ids = self.ids
        new = len(slots) - (len(ids) - self.holes)
        if new > 0:
            # A forgotten id made again is a key added at the end, like any other.
            added = list(islice(reversed(slots), new))
            added.reverse()
            for eid in added:
                old = self.next.get(eid)
                if old is not None:  # re-made before this listing saw it forgotten
                    ids[old - 1] = _HOLE
                    self.holes += 1
                ids.append(eid)
                self.next[eid] = len(ids)
                self.was.pop(eid, None)
                self.was_before.pop(eid, None)
        if self.holes > len(ids) - self.holes + _SLACK:
            self._squeeze()

    def _squeeze(self) -> None:
        """Drop the holes. Ids forgotten since the previous squeeze keep pointing where
        their page ended; those forgotten before it are let go."""
        kept: list[Any] = []
        moved: dict[int, int] = {}  # old position -> new
        for at, eid in enumerate(self.ids):
            moved[at] = len(kept)
            if eid is not _HOLE:
                kept.append(eid)
        moved[len(self.ids)] = len(kept)
        self.ids = kept
        self.next = {eid: at + 1 for at, eid in enumerate(kept)}
        self.was_before = {eid: moved[at] for eid, at in self.was.items()}
        self.was = {}
        self.holes = 0
