"""Records shared by both store implementations: built once, so ``isinstance`` and
equality behave the same whichever implementation is active."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

DEFAULT_TRACE_MAX = 200


@dataclass(slots=True)
class Execution:
    """One running statechart execution, held by the store as the live object.

    Slots keep ``id``/``version`` cheap to reach on the hot path.
    """

    id: Hashable
    definition_id: str = ""
    status: str = "running"
    outcome: Any = None
    active_path: tuple[str, ...] = ()
    history: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    version: int = 0
    parent_id: Hashable | None = None
    child_id: Hashable | None = None
    children: dict[Hashable, Any] = field(default_factory=dict)


class OutboxEntry(NamedTuple):
    """An event emitted by a commit, owed to a relay until acked by ``seq``."""

    seq: int
    target_id: Hashable | None
    event: Any


class SpawnEntry(NamedTuple):
    """An intent to create a child execution for an AND-state region."""

    seq: int
    parent_id: Hashable
    child_id: Hashable
    root_path: Any
    context: dict[Any, Any]


class TimerOp(NamedTuple):
    """Arm (``"schedule"``, at ``fire_at`` epoch seconds) or disarm (``"cancel"``) the
    timer of a state path."""

    action: Literal["schedule", "cancel"]
    path: Hashable
    fire_at: float | None = None
