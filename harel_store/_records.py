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

    Built by keywords, e.g. ``Execution(id="e1", definition_id="order")``; every field but
    ``id`` has a default. A store reads and writes only ``id`` and ``version``; the other
    fields are the engine's, kept as they are. A store takes any object with a hashable
    ``id`` and a writable integer ``version``, not only this class (a durable store then
    needs a codec for it). Slots keep ``id``/``version`` cheap to reach on the hot path.
    """

    #: The execution's key in the store: any hashable in a memory store, a ``str`` in a
    #: durable one.
    id: Hashable
    #: The statechart definition this execution runs.
    definition_id: str = ""
    #: Where the execution stands, in the engine's words (``"running"``,
    #: ``"completed"``, ...).
    status: str = "running"
    #: What a finished execution produced.
    outcome: Any = None
    #: The active state configuration, as the path of states from the root.
    active_path: tuple[str, ...] = ()
    #: What the history states remember.
    history: dict[str, Any] = field(default_factory=dict)
    #: The execution's own data.
    context: dict[str, Any] = field(default_factory=dict)
    #: The optimistic-concurrency version: ``0`` until the first ``save`` or ``commit``,
    #: which bump it by one each.
    version: int = 0
    #: The execution that forked this one, for a region child of an AND-state.
    parent_id: Hashable | None = None
    #: The id of a child execution, as the engine links them.
    child_id: Hashable | None = None
    #: The region children an AND-state waits for at its join, by child id.
    children: dict[Hashable, Any] = field(default_factory=dict)


class OutboxEntry(NamedTuple):
    """An event emitted by a commit, owed to a relay until acked by ``seq``."""

    #: The ack token: a store's outbox seqs start at 1 and only ever increase.
    seq: int
    #: The execution to deliver the event to, or ``None`` for an untargeted event.
    target_id: Hashable | None
    #: The event the commit emitted (from a durable store, a decoded copy of it).
    event: Any


class SpawnEntry(NamedTuple):
    """An intent to create a child execution for an AND-state region, owed to a relay
    until acked by ``seq``."""

    #: The ack token: a store's spawn seqs start at 1 and only ever increase.
    seq: int
    #: The execution whose commit asked for the child.
    parent_id: Hashable
    #: The id the child is to be created under (a relay creates it once: it skips an id
    #: that ``load`` already finds).
    child_id: Hashable
    #: The region's root state, where the child starts.
    root_path: Any
    #: The child's initial context: a ``dict`` copy of the mapping the commit was handed.
    context: dict[Any, Any]


class TimerOp(NamedTuple):
    """Arm (``"schedule"``, at ``fire_at`` epoch seconds) or disarm (``"cancel"``) the
    timer of a state path.

    One timer per execution and path: scheduling a path that is armed re-arms it at the
    new ``fire_at``."""

    #: ``"schedule"`` or ``"cancel"``; any other action is refused.
    action: Literal["schedule", "cancel"]
    #: The state path the timer belongs to.
    path: Hashable
    #: When a scheduled timer fires, in seconds (a finite real number, kept as a
    #: ``float``); unused by ``"cancel"``.
    fire_at: float | None = None


class Commit(NamedTuple):
    """One event-boundary write for ``commit_many``: the arguments of ``commit``, in its
    order, with its defaults.

    ``store.commit_many([Commit(exe, emits, "ev-1"), ...])`` checks and applies each one
    exactly as ``commit`` would apply it alone, in one transaction on a durable store."""

    #: The execution to write (compare-and-set on its ``version``).
    exe: Any
    #: The ``(target_id, event)`` pairs to enqueue in the outbox.
    emits: Any = ()
    #: The event this step handled, marked so a redelivery is skipped.
    processed_event_id: Hashable | None = None
    #: The :class:`TimerOp` to apply.
    timers: Any = ()
    #: The ``(child_id, root_path, context)`` spawn intents to enqueue.
    spawns: Any = ()
    #: The trace step to record, or ``None``.
    trace: Any = None
    #: The commit's idempotency key: a replay of it writes nothing.
    commit_id: str | None = None
    #: The writer epoch to fence with, or ``None``.
    epoch: int | None = None
