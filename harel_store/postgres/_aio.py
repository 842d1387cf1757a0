"""``AsyncPostgresStore``: the async twin, running the same core (:mod:`._core`) on an
async pool."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import _checks, _transfer
from .._errors import StoreError
from .._records import DEFAULT_TRACE_MAX, Commit, OutboxEntry, SpawnEntry, TimerOp

if TYPE_CHECKING:
    from typing_extensions import Self

from .._group import Group
from . import _batch, _operate
from ._connections import (
    _aconnect_retrying,
    _adapt,
    _arun_on,
    _asettle,
    _AsyncPool,
    _cannot_open,
    _cause,
    _condemned,
    _connect_kwargs,
    _connect_timeout,
    _failed,
    _InDoubt,
    _may_retry,
    _public,
    _read_only,
    _retrieved,
    _run_on,
    _seconds,
    _why,
)
from ._core import _NO_RETRY, _RECONNECT_FIRST, _RECONNECT_MAX, _closed, _Core, _import_psycopg
from ._schema import DEFAULT_POOL_SIZE, DEFAULT_SCHEMA

_log = logging.getLogger("harel_store.postgres")


class _Item(NamedTuple):
    """A caller's part of a group write, and the caller's task."""

    name: str
    part: Any
    caller: asyncio.Task[Any] | None

    @property
    def cancelled(self) -> bool:
        """Whether its caller was asked to cancel (``Task.cancel`` counts that at once,
        before the caller runs again; Python 3.10 does not count, and lands the write)."""
        cancelling = getattr(self.caller, "cancelling", None)
        return cancelling is not None and cancelling() > 0


class AsyncPostgresStore(_transfer.Uncopyable):
    """The ``async`` twin of :class:`PostgresStore`, with the same arguments, on
    psycopg's async connections: no call blocks the event loop.

    The constructor does no I/O: the store opens (connects, checks or creates the
    schema, reads the seq marks) at its first call, or at ``async with``; a server that
    cannot be reached (tried again for ``connect_timeout``) or a refused schema raises
    its ``StoreError`` from there, and ``wait_for_work`` counts work from then. Its
    connections come from a psycopg-pool ``AsyncConnectionPool`` opened on the event
    loop the store runs on; under a later event loop (one ``asyncio.run`` after
    another) it opens another there: a store may outlive an ``asyncio.run``, serving
    one loop at a time. :meth:`pool_stats` returns the statistics of the pool in use.

    ``_record_trace``, the plain-``def`` recorder of every store, blocks on a sync
    connection of its own: call it off the event loop.
    """

    preserves_identity = False
    durable = True
    _copy_hint = "open another store on the same conninfo and schema"

    def __init__(
        self,
        conninfo: str,
        *,
        trace_max: int | None = DEFAULT_TRACE_MAX,
        codec: Any = None,
        schema: str = DEFAULT_SCHEMA,
        pool_size: int = DEFAULT_POOL_SIZE,
        prepare: bool = True,
        timeout: float = 30.0,
        max_lifetime: float = 3600.0,
        connect_timeout: float = 3.0,
    ) -> None:
        self._closed = True
        lifetime = _seconds(max_lifetime, "max_lifetime")
        connecting = _seconds(connect_timeout, "connect_timeout")
        _import_psycopg()
        self._core = _Core(conninfo, trace_max, codec, schema, pool_size, prepare, timeout)
        self._pool = _AsyncPool(self._core, lifetime, connecting)
        self._opened = False
        self._polls = False  # wait_for_work said it polls
        self._opening: asyncio.Task[None] | None = None
        self._looks: set[asyncio.Future[None]] = set()  # wait_for_work's, running
        self._owed = False  # a wake-up taken and not yet returned
        self._group: Group[_Item] | None = None  # the group commit of a loop
        self._group_loop: asyncio.AbstractEventLoop | None = None
        weakref.finalize(self, self._pool.close_now)
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self._core.describe()} {state}>"

    async def __aenter__(self) -> Self:
        if self._closed:
            raise _closed()
        await self._ready()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def schema(self) -> str:
        return self._core.schema

    @property
    def trace_max(self) -> int | None:
        """Steps kept per execution; ``0``/``None`` keeps all. A change applies to the
        calls made after it."""
        return self._core.trace_max

    @trace_max.setter
    def trace_max(self, value: int | None) -> None:
        self._core.trace_max = _checks.as_trace_max(value)

    async def load(self, execution_id: str) -> Any:
        return await self._run("load", execution_id)

    async def save(self, exe: Any, *, epoch: int | None = None) -> None:
        single = self._core.prepare_commit(exe, (), None, (), (), None, None, epoch)
        outcome = await self._grouped("save", ("one", single))
        if outcome is not None:
            raise outcome

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
        """See :meth:`PostgresStore.commit`. Commits and acks of concurrent tasks share
        transactions (group commit): each is checked and encoded in its caller, then
        written with those of the others that came while the previous write was in
        flight; a lone call is written at once, in one statement."""
        single = self._core.prepare_commit(
            exe, emits, processed_event_id, timers, spawns, trace, commit_id, epoch
        )
        outcome = await self._grouped("commit", ("one", single))
        if outcome is not None:
            raise outcome

    async def commit_many(self, commits: Iterable[Commit]) -> list[StoreError | None]:
        """See :meth:`PostgresStore.commit_many`; the batch shares its transaction with
        the commits and acks of concurrent tasks (see :meth:`commit`)."""
        batch = _batch.prepare(self._core, commits)
        if not batch:
            return []
        outcomes: list[StoreError | None] = await self._grouped("commit_many", ("many", batch))
        return outcomes

    async def is_processed(self, execution_id: str, event_id: str) -> bool:
        return await self._run("is_processed", execution_id, event_id)  # type: ignore[no-any-return]

    async def pending_outbox(self) -> list[OutboxEntry]:
        return await self._run("pending", "outbox")  # type: ignore[no-any-return]

    async def ack_outbox(self, seq: int) -> None:
        await self._ack("ack_outbox", "outbox", seq)

    async def ack_outbox_many(self, seqs: Iterable[int]) -> None:
        """See :meth:`PostgresStore.ack_outbox_many`."""
        kept = _batch.checked_seqs(seqs)
        if kept:
            await self._grouped("ack_outbox_many", ("delete", "outbox", kept))

    async def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        return await self._run("claim", "outbox", limit, lease)  # type: ignore[no-any-return]

    async def pending_spawns(self) -> list[SpawnEntry]:
        return await self._run("pending", "spawns")  # type: ignore[no-any-return]

    async def ack_spawn(self, seq: int) -> None:
        await self._ack("ack_spawn", "spawns", seq)

    async def ack_spawn_many(self, seqs: Iterable[int]) -> None:
        """See :meth:`PostgresStore.ack_spawn_many`."""
        kept = _batch.checked_seqs(seqs)
        if kept:
            await self._grouped("ack_spawn_many", ("delete", "spawns", kept))

    async def claim_spawns(self, limit: int = 100, *, lease: float = 30.0) -> list[SpawnEntry]:
        return await self._run("claim", "spawns", limit, lease)  # type: ignore[no-any-return]

    async def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        return await self._run("due_timers", now)  # type: ignore[no-any-return]

    async def claim_due_timers(
        self, now: float, limit: int = 100, *, lease: float = 30.0
    ) -> list[tuple[str, str, float]]:
        return await self._run("claim_due_timers", now, limit, lease)  # type: ignore[no-any-return]

    async def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        await self._run("delete_timer", execution_id, path, fire_at)

    async def delete_timer_many(self, timers: Iterable[tuple[str, str, float]]) -> None:
        """See :meth:`PostgresStore.delete_timer_many`."""
        triples = _batch.checked_triples(timers)
        if triples:
            await self._grouped("delete_timer_many", ("delete", "timers", triples))

    async def append_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        await self._run("record_trace", execution_id, entry)

    async def read_trace(self, execution_id: str) -> list[dict[str, Any]]:
        return await self._run("read_trace", execution_id)  # type: ignore[no-any-return]

    async def forget(self, execution_id: str) -> None:
        await self._run("forget", execution_id)

    async def overview(self, *, now: float | None = None) -> dict[str, Any]:
        """See :meth:`PostgresStore.overview`."""
        return await self._run("overview", now)  # type: ignore[no-any-return]

    async def list_executions(self, *, after: str | None = None, limit: int = 100) -> list[str]:
        """See :meth:`PostgresStore.list_executions`."""
        return await self._run("list_executions", after, limit)  # type: ignore[no-any-return]

    async def prune(self, older_than: float) -> dict[str, int]:
        """See :meth:`PostgresStore.prune`."""
        return await _operate.aprune(self._run, older_than)

    async def stats(self) -> dict[str, int]:
        return await self._run("stats")  # type: ignore[no-any-return]

    async def wait_for_work(self, timeout: float) -> bool:
        """See :meth:`PostgresStore.wait_for_work`; it waits on the event loop, for at most
        ``timeout`` seconds even while another call of this store waits on the same
        listening connection. A wake-up that a call cancelled before it returned had
        taken is the next call's."""
        if self._closed:
            raise _closed()
        import psycopg

        timeout = _checks.as_timeout(timeout)
        if not self._opened:
            await self._ready()
        deadline = time.monotonic() + timeout
        if not self._core.prepare:
            return await self._poll(deadline)
        pause = _RECONNECT_FIRST
        while True:
            if self._owed:
                self._owed = False
                return True
            if self._closed:
                raise _closed()
            left = deadline - time.monotonic()
            # A look ends by the deadline by itself, unless it waits for another call's
            # look on the one listening connection: then this call stops waiting at its
            # deadline. A task of its own, waited for with asyncio.wait: it runs on when
            # this call is cancelled or gives up, and a wake-up it takes is kept in _owed.
            shared = bool(self._looks) and left != float("inf")
            look = asyncio.ensure_future(self._look(deadline))
            self._looks.add(look)
            look.add_done_callback(self._looks.discard)
            look.add_done_callback(_retrieved)  # one given up may still fail
            try:
                await asyncio.wait((look,), timeout=max(left, 0.0) if shared else None)
            except BaseException:
                look.cancel()
                raise
            if not look.done():
                look.cancel()
                if self._owed:
                    continue
                return False
            if look.cancelled():  # by close()
                raise _closed()
            exc = look.exception()
            if exc is None:
                if self._owed:
                    continue
                return False
            if not isinstance(exc, psycopg.Error):
                raise exc
            await self._pool.drop_listener()
            if self._closed:
                raise _closed()
            left = deadline - time.monotonic()
            if left <= 0.0 or not _why(exc)[0]:
                raise _failed(self._core, "wait_for_work", exc) from _cause(self._core, exc)
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2.0, _RECONNECT_MAX)

    async def _poll(self, deadline: float) -> bool:
        """``wait_for_work`` with ``prepare=False``, which says a transaction pooler
        (PgBouncer) is in between, where a LISTEN would stay on whichever server
        connection ran it: whether any seq moved since the marks, read on a pooled
        connection with growing pauses until ``deadline``."""
        core = self._core
        if not self._polls:  # said once per store
            self._polls = True
            _log.warning(
                "wait_for_work polls %s (prepare=False: LISTEN does not cross a transaction "
                "pooler such as PgBouncer)",
                core.describe(),
            )
        import psycopg

        pause = 0.0
        while True:
            if self._closed:
                raise _closed()
            conn = await self._pool.get()
            try:
                cur = await conn.execute(core.sql.marks, prepare=False)
                if core.marks_moved(await cur.fetchone()):
                    return True
            except psycopg.Error as exc:
                if deadline - time.monotonic() <= 0.0 or not _why(exc)[0]:
                    raise _failed(core, "wait_for_work", exc) from _cause(core, exc)
            finally:
                await self._pool.put(conn)
            left = deadline - time.monotonic()
            if left <= 0.0:
                return False
            pause = min(max(pause * 2.0, _RECONNECT_FIRST), _RECONNECT_MAX, left)
            await asyncio.sleep(pause)

    async def _look(self, deadline: float) -> None:
        """One look for work, until ``deadline``: a wake-up found is put in ``_owed``
        before anything else is awaited."""
        pool = self._pool
        if pool.listener is None and await self._listen(deadline):
            self._owed = True
            return
        # A round trip first (see PostgresStore.wait_for_work).
        await pool.listener.execute("", prepare=False)
        left = deadline - time.monotonic()
        waiting = pool.listener.notifies(
            timeout=None if left == float("inf") else max(left, 0.0), stop_after=1
        )
        async with contextlib.aclosing(waiting):
            if await anext(waiting, None) is None:
                return
            self._owed = True
        # Later notifications of work committed by now are this wake-up's.
        async for _ in pool.listener.notifies(timeout=0.0):
            pass

    def pool_stats(self) -> dict[str, int]:
        """The statistics of the connection pool in use (psycopg-pool's
        ``get_stats()``: ``pool_size``, ``pool_available``, ``requests_waiting``,
        ``connections_num`` and the others), counted since it was opened on the event
        loop the store last ran on; empty before the first call opens one."""
        if self._closed:
            raise _closed()
        return self._pool.stats()

    async def close(self) -> None:
        """Close the connections; a second close does nothing. Every other method of a
        closed store raises ``ValueError``."""
        if self._closed:
            return
        self._closed = True
        for look in list(self._looks):  # waiting on the listening connection
            look.cancel()
        group = self._group
        if group is not None and self._group_loop is asyncio.get_running_loop():
            await group.wait()  # the writes already asked for land first
        await self._pool.close()

    def _record_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        """The plain-``def`` recorder, as on every store: it blocks on a sync connection
        of its own, so call it off the event loop. As the store's first call it opens the
        store on that connection."""
        if self._closed:
            raise _closed()
        import psycopg

        core = self._core
        op = core.record_trace(execution_id, entry)
        query = next(op)
        pool = self._pool
        if pool.recorder is None:
            try:
                conn = psycopg.Connection.connect(core.conninfo, **_connect_kwargs(core))
            except psycopg.Error as exc:
                if self._opened:
                    raise _failed(core, "_record_trace", exc) from _cause(core, exc)
                raise _cannot_open(core, exc) from _cause(core, exc)
            _adapt(conn, lent=False)  # threads may share it
            pool.recorder = conn
        if not self._opened:
            opening = core.open()
            try:
                _run_on(pool.recorder, opening, next(opening))
            except psycopg.Error as exc:
                pool._close_recorder()
                raise _cannot_open(core, exc) from exc
            self._opened = True
        try:
            _run_on(pool.recorder, op, query)
        except psycopg.Error as exc:
            if pool.recorder.closed or _condemned(exc):
                pool._close_recorder()
            raise _failed(core, "_record_trace", exc, True) from exc

    # --- helpers -----------------------------------------------------------------------

    async def _ack(self, name: str, table: str, seq: Any) -> None:
        if type(seq) is not int:
            seq = _checks.as_int(seq, "seq")
        if _checks.INT64_MIN <= seq <= _checks.INT64_MAX:  # no other seq can be stored
            await self._grouped(name, ("delete", table, [seq]))
        elif self._closed:
            raise _closed()

    async def _grouped(self, name: str, part: Any) -> Any:
        """``part``'s outcome, written by the group commit of this loop (see
        :func:`._batch.write_group`)."""
        if self._closed:
            raise _closed()
        if not self._opened:
            await self._ready()
        if part[0] == "one":
            _batch.probe_version(part[1].exe)
        elif part[0] == "many":
            for p in part[1]:
                _batch.probe_version(p.exe)
        loop = asyncio.get_running_loop()
        group = self._group
        if group is None or self._group_loop is not loop:
            group = self._group = Group(self._write_group)
            self._group_loop = loop
        return await group.run(_Item(name, part, asyncio.current_task()))

    async def _write_group(self, items: list[_Item]) -> list[Any]:
        """The group's write: every part in one transaction on one pooled connection.
        The parts of callers cancelled while it waited for the connection are left out
        (nothing of theirs written). A write of deletes alone may run twice, so it is
        retried once, as ``_run`` retries."""
        import psycopg

        outcomes: list[Any] = [None] * len(items)
        retry = False
        for attempt in range(2):
            conn = await self._pool.get()
            name = items[0].name if len(items) == 1 else "commit (a group write)"
            try:
                taken = [i for i, item in enumerate(items) if not item.cancelled]
                if not taken:
                    return outcomes
                parts = [items[i].part for i in taken]
                retry = all(part[0] == "delete" for part in parts)
                op = _batch.write_group(self._core, parts)
                try:
                    written = await _arun_on(conn, op, next(op))
                except _InDoubt as doubt:  # lost inside the transaction
                    await self._pool.put(conn)
                    conn = None
                    written = await _asettle(
                        self._core, name, doubt, self._pool.get, self._pool.put
                    )
                for i, outcome in zip(taken, written):
                    outcomes[i] = outcome
                return outcomes
            except psycopg.Error as exc:
                if _read_only(exc):
                    await self._pool.drop_idle()
                if attempt or not (retry and _may_retry(exc, "ack")):
                    raise _failed(self._core, name, exc, not retry) from exc
                _log.info(
                    "%s: retrying %s after %s",
                    self._core.describe(),
                    items[0].name,
                    type(exc).__name__,
                )
            finally:
                if conn is not None:
                    await self._pool.put(conn)
        raise AssertionError("unreachable")

    async def _run(self, name: str, *args: Any) -> Any:
        import psycopg

        if self._closed:
            raise _closed()
        if not self._opened:
            await self._ready()
        method = getattr(self._core, name)
        for attempt in range(2):
            op = method(*args)
            try:
                query = next(op)
            except StopIteration as stop:
                return stop.value
            try:
                conn = await self._pool.get()
            except BaseException:
                op.close()  # see PostgresStore._run
                raise
            doubt = None
            try:
                return await _arun_on(conn, op, query)
            except _InDoubt as exc:  # lost inside a transaction of a batch
                doubt = exc
            except psycopg.Error as exc:
                op.close()
                if _read_only(exc):  # see PostgresStore._run
                    await self._pool.drop_idle()
                if attempt or not _may_retry(exc, name):
                    shown = _public(name, args)
                    raise _failed(self._core, shown, exc, name in _NO_RETRY) from exc
                _log.info(
                    "%s: retrying %s after %s", self._core.describe(), name, type(exc).__name__
                )
            finally:
                await self._pool.put(conn)
            if doubt is not None:
                shown = _public(name, args)
                return await _asettle(self._core, shown, doubt, self._pool.get, self._pool.put)
        raise AssertionError("unreachable")

    async def _ready(self) -> None:
        """Open the store if it is not yet. Concurrent first calls share one opening (a
        task of the running loop, shielded from a caller's cancellation), so they open
        one connection, not one each."""
        if self._opened:
            return
        loop = asyncio.get_running_loop()
        opening = self._opening
        if opening is None or opening.get_loop() is not loop or opening.cancelled():
            opening = self._opening = loop.create_task(self._open())
            opening.add_done_callback(_retrieved)
        try:
            await asyncio.shield(opening)
        finally:
            if opening.done() and self._opening is opening:
                self._opening = None  # opened, or failed: the next call tries again

    async def _open(self) -> None:
        """Connect (trying again for ``connect_timeout`` while the server cannot be
        reached), check or create the schema, read the seq marks; then open the pool of
        this loop (its own connections: the errors of this one are the clear ones)."""
        import psycopg

        core = self._core
        try:
            conn = await _aconnect_retrying(core, self._pool._connecting)
        except psycopg.Error as exc:
            raise _cannot_open(core, exc) from _cause(core, exc)
        try:
            op = core.open()
            await _arun_on(conn, op, next(op))
        except BaseException as exc:
            await conn.close()
            if isinstance(exc, psycopg.Error):
                raise _cannot_open(core, exc) from exc
            raise
        await conn.close()
        if self._closed:
            raise _closed()
        self._opened = True

    async def _listen(self, deadline: float) -> bool:
        import psycopg

        core = self._core
        conn = await psycopg.AsyncConnection.connect(
            core.conninfo, **_connect_timeout(core, deadline)
        )
        try:
            await conn.execute(f'LISTEN "{core.channel}"')
            cur = await conn.execute(core.sql.marks)
            marks = await cur.fetchone()
            if self._closed:
                raise _closed()
        except BaseException:
            await conn.close()
            raise
        self._pool.listener = conn
        return core.marks_moved(marks)
