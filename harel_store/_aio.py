"""``AsyncDictStore``: the ``async def`` face of the selected ``DictStore``.

It holds a sync store and awaits nothing: each coroutine runs its sync method to the
end before it returns, so no other task of the loop can interleave mid-method and no
lock is needed. The logic lives once, in the sync store.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

from ._records import DEFAULT_TRACE_MAX, OutboxEntry, SpawnEntry, TimerOp
from ._store import DictStore

if typing.TYPE_CHECKING:  # Self is in typing from Python 3.11 on
    from typing_extensions import Self


class AsyncDictStore:
    """The in-memory ``AsyncExecutionStore``; see :class:`DictStore` for each method."""

    __slots__ = ("_store",)

    _sync_type: ClassVar[type[Any]] = DictStore
    preserves_identity = True
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
        return self._store.load(execution_id)

    async def save(self, exe: Any, *, epoch: int | None = None) -> None:
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
        self._store.commit(
            exe, emits, processed_event_id, timers, spawns, trace, commit_id=commit_id, epoch=epoch
        )

    async def is_processed(self, execution_id: Hashable, event_id: Hashable) -> bool:
        return self._store.is_processed(execution_id, event_id)  # type: ignore[no-any-return]

    async def pending_outbox(self) -> list[OutboxEntry]:
        return self._store.pending_outbox()  # type: ignore[no-any-return]

    async def ack_outbox(self, seq: int) -> None:
        self._store.ack_outbox(seq)

    async def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        return self._store.claim_outbox(limit, lease=lease)  # type: ignore[no-any-return]

    async def pending_spawns(self) -> list[SpawnEntry]:
        return self._store.pending_spawns()  # type: ignore[no-any-return]

    async def ack_spawn(self, seq: int) -> None:
        self._store.ack_spawn(seq)

    async def claim_spawns(self, limit: int = 100, *, lease: float = 30.0) -> list[SpawnEntry]:
        return self._store.claim_spawns(limit, lease=lease)  # type: ignore[no-any-return]

    async def due_timers(self, now: float) -> list[tuple[Hashable, Hashable, float]]:
        return self._store.due_timers(now)  # type: ignore[no-any-return]

    async def claim_due_timers(
        self, now: float, limit: int = 100, *, lease: float = 30.0
    ) -> list[tuple[Hashable, Hashable, float]]:
        return self._store.claim_due_timers(now, limit, lease=lease)  # type: ignore[no-any-return]

    async def delete_timer(self, execution_id: Hashable, path: Hashable, fire_at: float) -> None:
        self._store.delete_timer(execution_id, path, fire_at)

    async def append_trace(self, execution_id: Hashable, entry: Mapping[str, Any]) -> None:
        self._store.append_trace(execution_id, entry)

    async def read_trace(self, execution_id: Hashable) -> list[dict[str, Any]]:
        return self._store.read_trace(execution_id)  # type: ignore[no-any-return]

    async def forget(self, execution_id: Hashable) -> None:
        self._store.forget(execution_id)

    async def stats(self) -> dict[str, int]:
        return self._store.stats()  # type: ignore[no-any-return]

    async def close(self) -> None:
        self._store.close()

    def _record_trace(self, execution_id: Hashable, entry: Mapping[str, Any]) -> None:
        self._store._record_trace(execution_id, entry)

    def _dump(self) -> Iterator[tuple[Any, ...]]:
        """The sync store's records, for :func:`harel_store.copy_store` (plain ``def``:
        nothing in a memory store waits)."""
        return self._store._dump()  # type: ignore[no-any-return]

    def _restore(self, records: Iterable[tuple[Any, ...]]) -> None:
        self._store._restore(records)
