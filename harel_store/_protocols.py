"""The store contracts, as ``runtime_checkable`` protocols that every store satisfies,
checked under ``mypy --strict``: an engine written against them runs on any store."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._errors import StoreError
from ._records import Commit, OutboxEntry, SpawnEntry, TimerOp

if TYPE_CHECKING:
    from typing_extensions import Self

#: ``(target_id, event)``: an event a commit emits, ``None`` for no target.
Emit = tuple["str | None", Any]
#: ``(child_id, root_path, context)``: a region child a commit asks for.
Spawn = tuple[str, Any, Mapping[str, Any]]
#: ``(execution_id, path, fire_at)``: a due timer, as ``delete_timer`` takes it back.
DueTimer = tuple[Any, Any, float]


@runtime_checkable
class ExecutionStore(Protocol):
    """Where a running engine keeps its executions, outbox, dedupe marks, timers,
    spawn intents and trace: every sync store of this package (memory, SQLite,
    PostgreSQL) has all of these methods.

    Ids are typed as ``str``, what every store takes (a memory store takes any hashable
    too); ids a store hands back are typed ``Any``.
    """

    def load(self, execution_id: str) -> Any:
        """The execution saved under ``execution_id``, or ``None``: the very object in a
        memory store, a fresh decoded copy in a durable one."""

    def save(self, exe: Any, *, epoch: int | None = None) -> None:
        """Write ``exe`` under ``exe.id`` with a compare-and-set on ``version``, then bump
        ``exe.version``; a stale copy raises :class:`~harel_store.StoreConflict`."""

    def commit(
        self,
        exe: Any,
        emits: Iterable[Emit],
        processed_event_id: str | None = None,
        timers: Iterable[TimerOp] = (),
        spawns: Iterable[Spawn] = (),
        trace: Mapping[str, Any] | None = None,
        *,
        commit_id: str | None = None,
        epoch: int | None = None,
    ) -> None:
        """The event-boundary write, all or nothing: :meth:`save` ``exe``, enqueue the
        ``(target_id, event)`` pairs of ``emits``, mark ``processed_event_id`` handled,
        apply the :class:`~harel_store.TimerOp` of ``timers``, enqueue the
        ``(child_id, root_path, context)`` triples of ``spawns`` and record the ``trace``
        step. A replay of ``commit_id`` writes nothing; an ``epoch`` older than the
        execution's raises :class:`~harel_store.StaleWriter`."""

    def commit_many(self, commits: Iterable[Commit]) -> list[StoreError | None]:
        """Each :class:`~harel_store.Commit` as :meth:`commit` applies it, in one
        transaction on a durable store: per commit ``None`` (applied, or a replay) or the
        refusal :meth:`commit` would have raised; bad input refuses the whole batch."""

    def is_processed(self, execution_id: str, event_id: str) -> bool:
        """Whether a commit of ``execution_id`` marked ``event_id`` handled."""

    def pending_outbox(self) -> list[OutboxEntry]:
        """The unacked outbox entries, oldest first, in a new list."""

    def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        """Up to ``limit`` unacked outbox entries nobody holds, leased for ``lease``
        seconds (an unacked one comes back when its lease runs out)."""

    def ack_outbox(self, seq: int) -> None:
        """Drop the outbox entry ``seq`` once delivered."""

    def ack_outbox_many(self, seqs: Iterable[int]) -> None:
        """:meth:`ack_outbox` each of ``seqs``, in one transaction."""

    def pending_spawns(self) -> list[SpawnEntry]:
        """The unacked spawn intents, oldest first, in a new list."""

    def claim_spawns(self, limit: int = 100, *, lease: float = 30.0) -> list[SpawnEntry]:
        """:meth:`claim_outbox` for the spawn intents."""

    def ack_spawn(self, seq: int) -> None:
        """Drop the spawn intent ``seq`` once its child exists."""

    def ack_spawn_many(self, seqs: Iterable[int]) -> None:
        """:meth:`ack_spawn` each of ``seqs``, in one transaction."""

    def due_timers(self, now: float) -> list[DueTimer]:
        """``(execution_id, path, fire_at)`` of every armed timer with
        ``fire_at <= now``."""

    def claim_due_timers(
        self, now: float, limit: int = 100, *, lease: float = 30.0
    ) -> list[DueTimer]:
        """:meth:`claim_outbox` for the timers due at ``now``."""

    def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        """Disarm the timer of ``execution_id`` and ``path`` only if it still fires at
        ``fire_at``, so a re-armed timer survives a stale sweep."""

    def delete_timer_many(self, timers: Iterable[tuple[str, str, float]]) -> None:
        """:meth:`delete_timer` each ``(execution_id, path, fire_at)``, in one
        transaction."""

    def append_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        """Record a trace step outside a commit."""

    def read_trace(self, execution_id: str) -> list[dict[str, Any]]:
        """The recent trace steps of ``execution_id``, oldest first, each stamped with
        its ``index``, in a new list."""

    def forget(self, execution_id: str) -> None:
        """Drop the execution and everything it holds."""

    def stats(self) -> dict[str, int]:
        """What the store holds, counted."""

    def overview(self, *, now: float | None = None) -> dict[str, Any]:
        """What the store holds and whether its relays and sweepers keep up."""

    def list_executions(self, *, after: str | None = None, limit: int = 100) -> list[str]:
        """A page of execution ids, after ``after``."""

    def prune(self, older_than: float) -> dict[str, int]:
        """Delete marks and commit ids recorded more than ``older_than`` seconds ago."""

    def wait_for_work(self, timeout: float) -> bool:
        """Whether work was committed (by another thread, task or process) before
        ``timeout`` seconds ran out."""

    def close(self) -> None:
        """Release what the store holds."""

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class AsyncExecutionStore(Protocol):
    """The ``async def`` twin of :class:`ExecutionStore`: the same methods, as
    coroutines, on every async store (``AsyncDictStore``, ``AsyncSqliteStore``,
    ``AsyncPostgresStore``), and an async context manager."""

    async def load(self, execution_id: str) -> Any:
        """:meth:`ExecutionStore.load`."""

    async def save(self, exe: Any, *, epoch: int | None = None) -> None:
        """:meth:`ExecutionStore.save`."""

    async def commit(
        self,
        exe: Any,
        emits: Iterable[Emit],
        processed_event_id: str | None = None,
        timers: Iterable[TimerOp] = (),
        spawns: Iterable[Spawn] = (),
        trace: Mapping[str, Any] | None = None,
        *,
        commit_id: str | None = None,
        epoch: int | None = None,
    ) -> None:
        """:meth:`ExecutionStore.commit`."""

    async def commit_many(self, commits: Iterable[Commit]) -> list[StoreError | None]:
        """:meth:`ExecutionStore.commit_many`."""

    async def is_processed(self, execution_id: str, event_id: str) -> bool:
        """:meth:`ExecutionStore.is_processed`."""

    async def pending_outbox(self) -> list[OutboxEntry]:
        """:meth:`ExecutionStore.pending_outbox`."""

    async def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        """:meth:`ExecutionStore.claim_outbox`."""

    async def ack_outbox(self, seq: int) -> None:
        """:meth:`ExecutionStore.ack_outbox`."""

    async def ack_outbox_many(self, seqs: Iterable[int]) -> None:
        """:meth:`ExecutionStore.ack_outbox_many`."""

    async def pending_spawns(self) -> list[SpawnEntry]:
        """:meth:`ExecutionStore.pending_spawns`."""

    async def claim_spawns(self, limit: int = 100, *, lease: float = 30.0) -> list[SpawnEntry]:
        """:meth:`ExecutionStore.claim_spawns`."""

    async def ack_spawn(self, seq: int) -> None:
        """:meth:`ExecutionStore.ack_spawn`."""

    async def ack_spawn_many(self, seqs: Iterable[int]) -> None:
        """:meth:`ExecutionStore.ack_spawn_many`."""

    async def due_timers(self, now: float) -> list[DueTimer]:
        """:meth:`ExecutionStore.due_timers`."""

    async def claim_due_timers(
        self, now: float, limit: int = 100, *, lease: float = 30.0
    ) -> list[DueTimer]:
        """:meth:`ExecutionStore.claim_due_timers`."""

    async def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        """:meth:`ExecutionStore.delete_timer`."""

    async def delete_timer_many(self, timers: Iterable[tuple[str, str, float]]) -> None:
        """:meth:`ExecutionStore.delete_timer_many`."""

    async def append_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        """:meth:`ExecutionStore.append_trace`."""

    async def read_trace(self, execution_id: str) -> list[dict[str, Any]]:
        """:meth:`ExecutionStore.read_trace`."""

    async def forget(self, execution_id: str) -> None:
        """:meth:`ExecutionStore.forget`."""

    async def stats(self) -> dict[str, int]:
        """:meth:`ExecutionStore.stats`."""

    async def overview(self, *, now: float | None = None) -> dict[str, Any]:
        """As :meth:`ExecutionStore.overview`."""

    async def list_executions(self, *, after: str | None = None, limit: int = 100) -> list[str]:
        """As :meth:`ExecutionStore.list_executions`."""

    async def prune(self, older_than: float) -> dict[str, int]:
        """As :meth:`ExecutionStore.prune`."""

    async def wait_for_work(self, timeout: float) -> bool:
        """:meth:`ExecutionStore.wait_for_work`."""

    async def close(self) -> None:
        """:meth:`ExecutionStore.close`."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...
