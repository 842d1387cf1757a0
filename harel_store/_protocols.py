"""The store contracts, as ``runtime_checkable`` protocols any backend can satisfy."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from ._records import OutboxEntry, SpawnEntry, TimerOp

Emit = tuple[Hashable | None, Any]
Spawn = tuple[Hashable, Any, Mapping[Any, Any]]
DueTimer = tuple[Hashable, Hashable, float]


@runtime_checkable
class ExecutionStore(Protocol):
    """Where a running engine keeps its executions, outbox, dedupe marks, timers,
    spawn intents and trace.

    The methods of the specification, which every store has; each store documents what
    it adds (the ``commit_id`` and ``epoch`` keywords, claims, ``forget``, ``stats``).
    """

    def load(self, execution_id: Hashable) -> Any:
        """The execution saved under ``execution_id``, or ``None``: the very object in a
        memory store, a fresh decoded copy in a durable one."""

    def save(self, exe: Any) -> None:
        """Write ``exe`` under ``exe.id`` with a compare-and-set on ``version``, then bump
        ``exe.version``; a stale copy raises :class:`~harel_store.StoreConflict`."""

    def commit(
        self,
        exe: Any,
        emits: Iterable[Emit],
        processed_event_id: Hashable | None = None,
        timers: Iterable[TimerOp] = (),
        spawns: Iterable[Spawn] = (),
        trace: Mapping[str, Any] | None = None,
    ) -> None:
        """The event-boundary write, all or nothing: :meth:`save` ``exe``, enqueue the
        ``(target_id, event)`` pairs of ``emits``, mark ``processed_event_id`` handled,
        apply the :class:`~harel_store.TimerOp` of ``timers``, enqueue the
        ``(child_id, root_path, context)`` triples of ``spawns`` and record the ``trace``
        step."""

    def is_processed(self, execution_id: Hashable, event_id: Hashable) -> bool:
        """Whether a commit of ``execution_id`` marked ``event_id`` handled."""

    def pending_outbox(self) -> list[OutboxEntry]:
        """The unacked outbox entries, oldest first, in a new list."""

    def ack_outbox(self, seq: int) -> None:
        """Drop the outbox entry ``seq`` once delivered."""

    def pending_spawns(self) -> list[SpawnEntry]:
        """The unacked spawn intents, oldest first, in a new list."""

    def ack_spawn(self, seq: int) -> None:
        """Drop the spawn intent ``seq`` once its child exists."""

    def due_timers(self, now: float) -> list[DueTimer]:
        """``(execution_id, path, fire_at)`` of every armed timer with
        ``fire_at <= now``."""

    def delete_timer(self, execution_id: Hashable, path: Hashable, fire_at: float) -> None:
        """Disarm the timer of ``execution_id`` and ``path`` only if it still fires at
        ``fire_at``, so a re-armed timer survives a stale sweep."""

    def append_trace(self, execution_id: Hashable, entry: Mapping[str, Any]) -> None:
        """Record a trace step outside a commit."""

    def read_trace(self, execution_id: Hashable) -> list[dict[str, Any]]:
        """The recent trace steps of ``execution_id``, oldest first, each stamped with
        its ``index``, in a new list."""

    def close(self) -> None:
        """Release what the store holds; a store is also a context manager that closes
        it."""


@runtime_checkable
class AsyncExecutionStore(Protocol):
    """The ``async def`` twin of :class:`ExecutionStore`: the same methods, as
    coroutines."""

    async def load(self, execution_id: Hashable) -> Any:
        """:meth:`ExecutionStore.load`."""

    async def save(self, exe: Any) -> None:
        """:meth:`ExecutionStore.save`."""

    async def commit(
        self,
        exe: Any,
        emits: Iterable[Emit],
        processed_event_id: Hashable | None = None,
        timers: Iterable[TimerOp] = (),
        spawns: Iterable[Spawn] = (),
        trace: Mapping[str, Any] | None = None,
    ) -> None:
        """:meth:`ExecutionStore.commit`."""

    async def is_processed(self, execution_id: Hashable, event_id: Hashable) -> bool:
        """:meth:`ExecutionStore.is_processed`."""

    async def pending_outbox(self) -> list[OutboxEntry]:
        """:meth:`ExecutionStore.pending_outbox`."""

    async def ack_outbox(self, seq: int) -> None:
        """:meth:`ExecutionStore.ack_outbox`."""

    async def pending_spawns(self) -> list[SpawnEntry]:
        """:meth:`ExecutionStore.pending_spawns`."""

    async def ack_spawn(self, seq: int) -> None:
        """:meth:`ExecutionStore.ack_spawn`."""

    async def due_timers(self, now: float) -> list[DueTimer]:
        """:meth:`ExecutionStore.due_timers`."""

    async def delete_timer(self, execution_id: Hashable, path: Hashable, fire_at: float) -> None:
        """:meth:`ExecutionStore.delete_timer`."""

    async def append_trace(self, execution_id: Hashable, entry: Mapping[str, Any]) -> None:
        """:meth:`ExecutionStore.append_trace`."""

    async def read_trace(self, execution_id: Hashable) -> list[dict[str, Any]]:
        """:meth:`ExecutionStore.read_trace`."""

    async def close(self) -> None:
        """:meth:`ExecutionStore.close`; an async store is an async context manager."""
