"""``AsyncSqliteStore``: the sync store, run on a thread of its own per store object."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .. import _checks, _transfer
from .._errors import StoreError
from .._group import Group
from .._records import DEFAULT_TRACE_MAX, Commit, OutboxEntry, SpawnEntry, TimerOp
from ._connection import _closed, _options
from ._store import _POLL_FIRST, _POLL_MAX, SqliteStore

if TYPE_CHECKING:
    from typing_extensions import Self

_LOOK_GRACE = 0.1  # AsyncSqliteStore.wait_for_work: how long past its timeout a look may take


class AsyncSqliteStore(_transfer.Uncopyable):
    """The ``async`` twin of :class:`SqliteStore`, with the same arguments.

    Each method runs the sync store's method on one thread of its own (a single-worker
    ``ThreadPoolExecutor`` per store object): ``sqlite3`` blocks on disk I/O, fsyncs and
    busy waits, so no call may run on the event loop, and one thread keeps the
    connection used by one thread at a time with calls run in the order they were made
    (``sqlite3`` releases the GIL while SQLite works). The standard library offers no
    async SQLite driver; a thread hop costs some tens of microseconds (about 0.1 ms on a
    slow machine), the price of a free loop. The database is opened on that thread too, so the constructor does
    not block: a database that cannot be opened raises its ``StoreError`` from the first
    call, or from ``async with``. ``wait_for_work`` pauses with ``asyncio.sleep`` between
    looks, so it keeps the thread free for the store's other calls. A cancelled call may
    still complete on the thread (a commit retried with its ``commit_id`` is
    recognised); ``close()`` closes the database even when it is cancelled.
    """

    preserves_identity = False
    durable = True
    _copy_hint = "open another store on the same file"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        trace_max: int | None = DEFAULT_TRACE_MAX,
        codec: Any = None,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._closed = True
        self._closing: asyncio.Future[None] | None = None
        self._seen_work: int | None = None  # None: still the count read when it opened
        options = _options(path, trace_max, codec, synchronous, busy_timeout, clock)
        self._path = options[0]
        self._trace_max = options[1]
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harel-sqlite")
        self._opening: Future[SqliteStore] = self._pool.submit(
            SqliteStore,
            path,
            trace_max=trace_max,
            codec=codec,
            synchronous=synchronous,
            busy_timeout=busy_timeout,
            clock=clock,
        )
        # Group commit: what tasks issue while the thread writes goes in the next write.
        self._commits: Group[Any] = Group(self._grouped("_commit_group"), key=_first)
        self._outbox_acks: Group[Any] = Group(self._grouped("_ack_group", "outbox"))
        self._spawn_acks: Group[Any] = Group(self._grouped("_ack_group", "spawns"))
        self._timer_deletes: Group[Any] = Group(self._grouped("_delete_timer_group"))
        self._closed = False
        self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self._path!r} {state}>"

    async def __aenter__(self) -> Self:
        if self._closed:
            raise _closed()
        await asyncio.wrap_future(self._opening)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def path(self) -> str:
        return self._path

    @property
    def trace_max(self) -> int | None:
        """Steps kept per execution; ``0``/``None`` keeps all. A change applies to the
        calls made after it."""
        return self._trace_max

    @trace_max.setter
    def trace_max(self, value: int | None) -> None:
        self._trace_max = size = _checks.as_trace_max(value)
        if not self._closed:
            self._pool.submit(self._invoke, "__setattr__", ("trace_max", size), {})

    async def load(self, execution_id: str) -> Any:
        return await self._call("load", execution_id)

    async def save(self, exe: Any, *, epoch: int | None = None) -> None:
        await self._call("save", exe, epoch=epoch)

    async def commit(
        self,
        exe: Any,
        emits: Iterable[tuple[str | None, Any]],
        processed_event_id: str | None = None,
        timers: Iterable[TimerOp] = (),
        spawns: Iterable[tuple[str, Any, Mapping[str, Any]]] = (),
        trace: Mapping[str, Any] | None = None,
        *,
        commit_id: str | None = None,
        epoch: int | None = None,
    ) -> None:
        if self._closed:
            raise _closed()
        args = (exe, emits, processed_event_id, timers, spawns, trace, commit_id, epoch)
        _raise(await self._commits.run((_key(exe), args)))

    async def commit_many(self, commits: Iterable[Commit]) -> list[StoreError | None]:
        """:meth:`SqliteStore.commit_many`, in a transaction of its own."""
        return await self._call("commit_many", commits)  # type: ignore[no-any-return]

    async def is_processed(self, execution_id: str, event_id: str) -> bool:
        return await self._call("is_processed", execution_id, event_id)  # type: ignore[no-any-return]

    async def pending_outbox(self) -> list[OutboxEntry]:
        return await self._call("pending_outbox")  # type: ignore[no-any-return]

    async def ack_outbox(self, seq: int) -> None:
        if self._closed:
            raise _closed()
        _raise(await self._outbox_acks.run(_checks.as_int(seq, "seq")))

    async def ack_outbox_many(self, seqs: Iterable[int]) -> None:
        await self._call("ack_outbox_many", seqs)

    async def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        return await self._call("claim_outbox", limit, lease=lease)  # type: ignore[no-any-return]

    async def pending_spawns(self) -> list[SpawnEntry]:
        return await self._call("pending_spawns")  # type: ignore[no-any-return]

    async def ack_spawn(self, seq: int) -> None:
        if self._closed:
            raise _closed()
        _raise(await self._spawn_acks.run(_checks.as_int(seq, "seq")))

    async def ack_spawn_many(self, seqs: Iterable[int]) -> None:
        await self._call("ack_spawn_many", seqs)

    async def claim_spawns(self, limit: int = 100, *, lease: float = 30.0) -> list[SpawnEntry]:
        return await self._call("claim_spawns", limit, lease=lease)  # type: ignore[no-any-return]

    async def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        return await self._call("due_timers", now)  # type: ignore[no-any-return]

    async def claim_due_timers(
        self, now: float, limit: int = 100, *, lease: float = 30.0
    ) -> list[tuple[str, str, float]]:
        return await self._call("claim_due_timers", now, limit, lease=lease)  # type: ignore[no-any-return]

    async def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        if self._closed:
            raise _closed()
        fire_at = _checks.as_time(fire_at, "fire_at")
        _raise(await self._timer_deletes.run((execution_id, path, fire_at)))

    async def delete_timer_many(self, timers: Iterable[tuple[str, str, float]]) -> None:
        await self._call("delete_timer_many", timers)

    async def append_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        await self._call("append_trace", execution_id, entry)

    async def read_trace(self, execution_id: str) -> list[dict[str, Any]]:
        return await self._call("read_trace", execution_id)  # type: ignore[no-any-return]

    async def forget(self, execution_id: str) -> None:
        await self._call("forget", execution_id)

    async def stats(self) -> dict[str, int]:
        return await self._call("stats")  # type: ignore[no-any-return]

    async def wait_for_work(self, timeout: float) -> bool:
        """See :meth:`SqliteStore.wait_for_work`; the pauses are ``asyncio.sleep``. While
        the store's thread is busy with other calls, it still returns ``False`` soon after
        ``timeout``. Only a call that returns ``True`` marks the work seen: a cancelled
        one leaves it for the next."""
        if self._closed:
            raise _closed()
        timeout = _checks.as_timeout(timeout)
        deadline = time.monotonic() + timeout
        pause = _POLL_FIRST
        while True:
            n = await self._look_at_work(deadline)
            if n is not None:
                if self._seen_work is None:
                    self._seen_work = self._opening.result()._seen_work
                if n != self._seen_work:
                    self._seen_work = n
                    return True
            left = deadline - time.monotonic()
            if left <= 0.0:
                return False
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2.0, _POLL_MAX)

    async def overview(self, *, now: float | None = None) -> dict[str, Any]:
        """See :meth:`SqliteStore.overview`."""
        return await self._call("overview", now=now)  # type: ignore[no-any-return]

    async def list_executions(self, *, after: str | None = None, limit: int = 100) -> list[str]:
        """See :meth:`SqliteStore.list_executions`."""
        return await self._call("list_executions", after=after, limit=limit)  # type: ignore[no-any-return]

    async def prune(self, older_than: float) -> dict[str, int]:
        """See :meth:`SqliteStore.prune`; it runs on the store's thread."""
        return await self._call("prune", older_than)  # type: ignore[no-any-return]

    async def close(self) -> None:
        """Close the database on the store's thread, after the calls queued before it,
        then let the thread end. The close is queued at once, so it happens even if
        this call is cancelled; a later ``close()`` waits for it."""
        if not self._closed:
            self._closed = True
            self._finalizer.detach()
            self._closing = asyncio.ensure_future(self._close_when_drained())
        if self._closing is not None:
            await asyncio.shield(self._closing)

    async def _close_when_drained(self) -> None:
        """The close itself: after the group writes that callers are waiting for."""
        for group in (self._commits, self._outbox_acks, self._spawn_acks, self._timer_deletes):
            await group.wait()
        closing = self._pool.submit(_close_opened, self._opening)
        self._pool.shutdown(wait=False)
        await asyncio.wrap_future(closing)

    def _record_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        """The plain-``def`` recorder, as on every store: it waits for the store's
        thread, so call it off the event loop."""
        if self._closed:
            raise _closed()
        call = functools.partial(self._invoke, "_record_trace", (execution_id, entry), {})
        self._pool.submit(contextvars.copy_context().run, call).result()

    def _grouped(self, name: str, *head: Any) -> Callable[[list[Any]], Awaitable[list[Any]]]:
        """The write of a group: the sync store's ``name`` on the store's thread."""

        async def write(items: list[Any]) -> list[Any]:
            # Not refused once closing: these calls were made before close().
            call = functools.partial(self._invoke, name, (*head, items), {})
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, contextvars.copy_context().run, call)

        return write

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await self._submit(name, *args, **kwargs)

    def _submit(self, name: str, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Queue the sync store's method on the store's thread."""
        if self._closed:
            raise _closed()
        call = functools.partial(self._invoke, name, args, kwargs)
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._pool, contextvars.copy_context().run, call)

    async def _look_at_work(self, deadline: float) -> int | None:
        """The work counter, read on the store's thread; ``None`` when the thread is too
        busy to read it by ``deadline`` (or :data:`_LOOK_GRACE` from now, if later). A
        look given up on, or whose caller is cancelled, is dropped from the queue if it
        has not started; its count is never used."""
        look = self._submit("_work_count")
        try:
            wait = max(deadline - time.monotonic(), _LOOK_GRACE)
            done, _ = await asyncio.wait((look,), timeout=wait)
        finally:
            look.cancel()
        return look.result() if done else None

    def _invoke(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """On the store's thread: the sync store's method (the open error, if any)."""
        return getattr(self._opening.result(), name)(*args, **kwargs)


def _first(item: tuple[Any, ...]) -> Any:
    return item[0]


def _key(exe: Any) -> Any:
    """What keeps two commits of one execution out of one group write; an id the store
    will refuse gets a key of its own (the refusal is its caller's alone)."""
    try:
        eid = exe.id
    except AttributeError:
        return object()
    return eid if type(eid) is str else object()


def _raise(outcome: Any) -> None:
    """A group outcome: ``None``, or the exception its caller raises."""
    if outcome is not None:
        raise outcome


def _close_opened(opening: Future[SqliteStore]) -> None:
    if opening.exception() is None:
        opening.result().close()
