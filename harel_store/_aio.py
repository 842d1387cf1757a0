"""``AsyncDictStore``: the ``async def`` face of the selected ``DictStore``.

It holds a sync store and awaits nothing: each coroutine runs its sync method to the
end before it returns, so no other task of the loop can interleave mid-method and no
lock is needed. The logic lives once, in the sync store.
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from time import monotonic
from typing import Any, ClassVar

from . import _checks
from ._records import DEFAULT_TRACE_MAX, OutboxEntry, SpawnEntry, TimerOp
from ._store import DictStore

if typing.TYPE_CHECKING:  # Self is in typing from Python 3.11 on
    from typing_extensions import Self

    from ._errors import StoreError
    from ._records import Commit


class AsyncDictStore:
    """The in-memory ``AsyncExecutionStore``, with the arguments and the methods of
    :class:`DictStore`, as coroutines; see :class:`DictStore` for each method.

    It wraps the :class:`DictStore` picked at import, so it is compiled too where that
    one is. No method awaits: each call runs to its end before another task of the event
    loop can run, so the store is safe across the tasks of one loop without a lock. A
    store is an async context manager.
    """

    __slots__ = ("_store",)

    _sync_type: ClassVar[type[Any]] = DictStore
    #: As :attr:`DictStore.preserves_identity`.
    preserves_identity = True
    #: As :attr:`DictStore.durable`.
    durable = False

    def __init__(
        self,
        *,
        trace_max: int | None = DEFAULT_TRACE_MAX,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._store = self._sync_type(trace_max=trace_max, clock=clock)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self._store.__reduce_ex__(protocol)  # refuses

    @property
    def trace_max(self) -> int | None:
        """Steps kept per execution; ``0``/``None`` keeps all."""
        return self._store.trace_max  # type: ignore[no-any-return]

    @trace_max.setter
    def trace_max(self, value: int | None) -> None:
        self._store.trace_max = value

    async def load(self, execution_id: Hashable) -> Any:
        """The live object saved under ``execution_id``, or ``None``: :meth:`DictStore.load`."""
        return self._store.load(execution_id)

    async def save(self, exe: Any, *, epoch: int | None = None) -> None:
        """CAS-write ``exe`` and bump ``exe.version``: :meth:`DictStore.save`."""
        self._store.save(exe, epoch=epoch)

    async def commit(
        self,
        exe: Any,
        emits: Iterable[tuple[Hashable | None, Any]],
        processed_event_id: Hashable | None = None,
        timers: Iterable[TimerOp] = (),
        spawns: Iterable[tuple[Hashable, Any, Mapping[Any, Any]]] = (),
        trace: Mapping[str, Any] | None = None,
        *,
        commit_id: str | None = None,
        epoch: int | None = None,
    ) -> None:
        """The event-boundary write, all or nothing: :meth:`DictStore.commit`."""
        self._store.commit(
            exe, emits, processed_event_id, timers, spawns, trace, commit_id=commit_id, epoch=epoch
        )

    async def commit_many(self, commits: Iterable[Commit]) -> list[StoreError | None]:
        """Each commit as :meth:`commit` applies it, every one checked first:
        :meth:`DictStore.commit_many`."""
        return self._store.commit_many(commits)  # type: ignore[no-any-return]

    async def is_processed(self, execution_id: Hashable, event_id: Hashable) -> bool:
        """Whether a commit of ``execution_id`` recorded ``event_id`` as handled:
        :meth:`DictStore.is_processed`."""
        return self._store.is_processed(execution_id, event_id)  # type: ignore[no-any-return]

    async def pending_outbox(self) -> list[OutboxEntry]:
        """A copy of the unacked outbox entries, oldest first: :meth:`DictStore.pending_outbox`."""
        return self._store.pending_outbox()  # type: ignore[no-any-return]

    async def ack_outbox(self, seq: int) -> None:
        """Drop the outbox entry ``seq``: :meth:`DictStore.ack_outbox`."""
        self._store.ack_outbox(seq)

    async def ack_outbox_many(self, seqs: Iterable[int]) -> None:
        """Drop each outbox entry of ``seqs``: :meth:`DictStore.ack_outbox_many`."""
        self._store.ack_outbox_many(seqs)

    async def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        """Lease up to ``limit`` unleased outbox entries: :meth:`DictStore.claim_outbox`."""
        return self._store.claim_outbox(limit, lease=lease)  # type: ignore[no-any-return]

    async def pending_spawns(self) -> list[SpawnEntry]:
        """A copy of the unacked spawn intents, oldest first: :meth:`DictStore.pending_spawns`."""
        return self._store.pending_spawns()  # type: ignore[no-any-return]

    async def ack_spawn(self, seq: int) -> None:
        """Drop the spawn intent ``seq``: :meth:`DictStore.ack_spawn`."""
        self._store.ack_spawn(seq)

    async def ack_spawn_many(self, seqs: Iterable[int]) -> None:
        """Drop each spawn intent of ``seqs``: :meth:`DictStore.ack_spawn_many`."""
        self._store.ack_spawn_many(seqs)

    async def claim_spawns(self, limit: int = 100, *, lease: float = 30.0) -> list[SpawnEntry]:
        """Lease up to ``limit`` unleased spawn intents: :meth:`DictStore.claim_spawns`."""
        return self._store.claim_spawns(limit, lease=lease)  # type: ignore[no-any-return]

    async def due_timers(self, now: float) -> list[tuple[Hashable, Hashable, float]]:
        """The armed timers with ``fire_at <= now``: :meth:`DictStore.due_timers`."""
        return self._store.due_timers(now)  # type: ignore[no-any-return]

    async def claim_due_timers(
        self, now: float, limit: int = 100, *, lease: float = 30.0
    ) -> list[tuple[Hashable, Hashable, float]]:
        """Lease up to ``limit`` unleased due timers: :meth:`DictStore.claim_due_timers`."""
        return self._store.claim_due_timers(now, limit, lease=lease)  # type: ignore[no-any-return]

    async def delete_timer(self, execution_id: Hashable, path: Hashable, fire_at: float) -> None:
        """Disarm the timer if it still fires at ``fire_at``: :meth:`DictStore.delete_timer`."""
        self._store.delete_timer(execution_id, path, fire_at)

    async def delete_timer_many(self, timers: Iterable[tuple[Hashable, Hashable, float]]) -> None:
        """Disarm each timer that still fires when its triple says:
        :meth:`DictStore.delete_timer_many`."""
        self._store.delete_timer_many(timers)

    async def append_trace(self, execution_id: Hashable, entry: Mapping[str, Any]) -> None:
        """Record a trace step outside a commit: :meth:`DictStore.append_trace`."""
        self._store.append_trace(execution_id, entry)

    async def read_trace(self, execution_id: Hashable) -> list[dict[str, Any]]:
        """A copy of the recent trace steps: :meth:`DictStore.read_trace`."""
        return self._store.read_trace(execution_id)  # type: ignore[no-any-return]

    async def forget(self, execution_id: Hashable) -> None:
        """Drop an execution and what it holds: :meth:`DictStore.forget`."""
        self._store.forget(execution_id)

    async def stats(self) -> dict[str, int]:
        """Counts for monitoring: :meth:`DictStore.stats`."""
        return self._store.stats()  # type: ignore[no-any-return]

    async def overview(self, *, now: float | None = None) -> dict[str, Any]:
        """What the store holds: :meth:`DictStore.overview`."""
        return self._store.overview(now=now)  # type: ignore[no-any-return]

    async def list_executions(
        self, *, after: Hashable | None = None, limit: int = 100
    ) -> list[Any]:
        """A page of execution ids: :meth:`DictStore.list_executions`."""
        return self._store.list_executions(after=after, limit=limit)  # type: ignore[no-any-return]

    async def prune(self, older_than: float) -> dict[str, int]:
        """Delete old marks and commit ids: :meth:`DictStore.prune`."""
        return self._store.prune(older_than)  # type: ignore[no-any-return]

    async def wait_for_work(self, timeout: float) -> bool:
        """:meth:`DictStore.wait_for_work` for work committed by another task or thread:
        the one method that awaits, pausing with ``asyncio.sleep`` between looks (1 ms at
        first, up to 20 ms) so the loop's other tasks run meanwhile."""
        timeout = _checks.as_timeout(timeout)
        deadline = monotonic() + timeout
        pause = 0.001
        while not self._store.wait_for_work(0.0):
            left = deadline - monotonic()
            if left <= 0.0:
                return False
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2.0, 0.02)
        return True

    async def close(self) -> None:
        """Nothing to release: :meth:`DictStore.close`."""
        self._store.close()

    def _record_trace(self, execution_id: Hashable, entry: Mapping[str, Any]) -> None:
        self._store._record_trace(execution_id, entry)

    def _dump(self) -> Iterator[tuple[Any, ...]]:
        """The sync store's records, for :func:`harel_store.copy_store` (plain ``def``:
        nothing in a memory store waits)."""
        return self._store._dump()  # type: ignore[no-any-return]

    def _restore(self, records: Iterable[tuple[Any, ...]]) -> None:
        self._store._restore(records)
