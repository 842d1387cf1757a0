"""Running the core on connections: how a connection is made and checked, the array
adapters, one statement's run, and the sync and async pools of a store."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import select
import threading
import time
from typing import Any

from .._errors import StoreError
from ._core import _ARRAYS, _RECONNECT_FIRST, _RECONNECT_MAX, _UNIQUE, _closed, _Core, _Op, _Query

# --- running the core: connections ----------------------------------------------------------


def _connect_kwargs(core: _Core, deadline: float | None = None) -> dict[str, Any]:
    """How every connection of a store is made: autocommit (each statement is its own
    transaction), and no prepared statements at all with ``prepare=False``; see
    :func:`_connect_timeout`."""
    kwargs = _connect_timeout(core, deadline)
    if not core.prepare:
        kwargs["prepare_threshold"] = None
    return kwargs


def _connect_timeout(core: _Core, deadline: float | None = None) -> dict[str, Any]:
    """Autocommit, and a connection attempt that gives up by ``deadline`` (by the store's
    ``timeout`` without one): a server that takes a connection and never answers would
    otherwise hold it for psycopg's default of 130 s. libpq counts whole seconds, at
    least 2. A ``connect_timeout`` in the conninfo is the user's, and kept."""
    kwargs: dict[str, Any] = {"autocommit": True}
    if core.connect_timeout is None:
        from psycopg.conninfo import conninfo_to_dict

        try:
            core.connect_timeout = "connect_timeout" in conninfo_to_dict(core.conninfo)
        except Exception:  # noqa: BLE001 - connecting reports a bad conninfo
            core.connect_timeout = False
    if not core.connect_timeout:
        left = core.timeout if deadline is None else min(deadline - time.monotonic(), core.timeout)
        kwargs["connect_timeout"] = max(2, math.ceil(left))
    return kwargs


_DUMPERS: list[tuple[type, type]] = []


def _array_dumpers() -> list[tuple[type, type]]:
    """Binary dumpers of the four one-dimensional array parameters, the array format
    written directly: psycopg's generic list dumper is Python that works out the
    dimensions and walks nested lists at every call, for each of the dozen arrays of a
    typical commit (measured in one process: the client's CPU time per typical commit fell
    from about 390 to 340 µs). A ``None`` item is a NULL, as there."""
    from struct import Struct

    from psycopg import pq
    from psycopg.adapt import Dumper, PyFormat, Transformer
    from psycopg.postgres import types

    empty = Struct("!iiI").pack  # no dimension, no NULL, the element type
    head = Struct("!iiIii").pack  # 1 dimension, has NULL, element type, size, lower bound 1
    size = Struct("!i").pack
    null = size(-1)
    item8 = {"float8": Struct("!id").pack, "int8": Struct("!iq").pack}

    class _ArrayDumper(Dumper):
        format = pq.Format.BINARY
        element_oid = 0

        def dump(self, obj: Any) -> bytes:
            if not obj:
                return empty(0, 0, self.element_oid)
            parts = [b""]
            hasnull = 0
            for item in obj:
                if item is None:
                    hasnull = 1
                    parts.append(null)
                else:
                    data = self.item(item)
                    parts.append(size(len(data)))
                    parts.append(data)
            parts[0] = head(1, hasnull, self.element_oid, len(obj), 1)
            return b"".join(parts)

        def item(self, item: Any) -> Any:
            return item

    class _TextArrayDumper(_ArrayDumper):
        def __init__(self, cls: type, context: Any = None) -> None:
            super().__init__(cls, context)
            # The connection's own text dumper: its client encoding, its refusals.
            self.item = Transformer(context).get_dumper("", PyFormat.BINARY).dump  # type: ignore[method-assign,assignment]

    class _Item8ArrayDumper(_ArrayDumper):
        pack = staticmethod(item8["int8"])

        def dump(self, obj: Any) -> bytes:
            if not obj:
                return empty(0, 0, self.element_oid)
            pack = self.pack
            return head(1, 0, self.element_oid, len(obj), 1) + b"".join(
                [pack(8, item) for item in obj]
            )

    dumpers: list[tuple[type, type]] = []
    for cls, name in _ARRAYS.items():
        info = types[name]
        base: type = _ArrayDumper
        attrs: dict[str, Any] = {
            "oid": info.array_oid,
            "element_oid": info.oid,
            "__module__": __name__,
        }
        if name == "text":
            base = _TextArrayDumper
        elif name in item8:
            base = _Item8ArrayDumper
            attrs["pack"] = staticmethod(item8[name])
        dumpers.append((cls, type(f"{cls.__name__}Dumper", (base,), attrs)))
    return dumpers


def _adapt(conn: Any) -> None:
    """Give each parameter one type whatever its value, so a query is prepared once per
    connection (psycopg prepares a query anew for each set of parameter types): every
    int a bigint, not one of int2/int4/int8 by its size; each array its element type,
    not "unknown" when it is empty."""
    if not _DUMPERS:
        from psycopg.types.numeric import Int8BinaryDumper, Int8Dumper

        _DUMPERS[:] = [(int, Int8Dumper), (int, Int8BinaryDumper), *_array_dumpers()]
    for kind, dumper in _DUMPERS:
        conn.adapters.register_dumper(kind, dumper)


def _idle_sound(conn: Any) -> bool:
    """Whether ``conn``, idle in the pool, is open and its server has written nothing to
    it: a check without a round trip. An idle connection that listens to nothing is sent
    nothing but the "terminating connection" error that a restart or
    ``pg_terminate_backend`` sends before the socket closes; libpq reads that error and
    still calls the connection sound until it reads the end of the stream, so any byte
    waiting on the socket condemns it (a statement sent on it would fail after the
    fact, and a commit's outcome would then be unknown)."""
    pgconn = conn.pgconn
    return not (conn.closed or pgconn.status != _CONN_OK or _readable(pgconn.socket))


def _readable(fd: int) -> bool:
    poll = getattr(select, "poll", None)
    if poll is None:  # Windows
        return bool(select.select([fd], [], [], 0)[0])
    poller = poll()
    poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


_TUPLES_OK = 2  # psycopg.pq.ExecStatus.TUPLES_OK
# libpq's CONNECTION_OK and PQTRANS_IDLE (pq.ConnStatus.OK, pq.TransactionStatus.IDLE),
# compared with the ints pgconn returns: conn.info's enums cost a microsecond a read.
_CONN_OK = 0
_TX_IDLE = 0


def _has_rows(cur: Any) -> bool:
    """Whether the statement returned rows (``cur.description is not None``, without
    the column objects psycopg builds for it at every call)."""
    res = cur.pgresult
    return res is not None and bool(res.nfields or res.status == _TUPLES_OK)


def _run_on(conn: Any, op: _Op, query: _Query) -> Any:
    """Run ``op`` to its end on ``conn``, starting with ``query``."""
    import psycopg

    try:
        while True:
            try:
                cur = conn.execute(query.sql, query.params, prepare=query.prepare, binary=True)
            except psycopg.errors.UniqueViolation:
                if not query.unique:
                    raise
                result: Any = _UNIQUE
            except psycopg.Error:
                if not query.tolerant:
                    raise
                result = None  # the operation's outcome was settled before it
            else:
                result = cur.fetchall() if _has_rows(cur) else cur.rowcount
            try:
                query = op.send(result)
            except StopIteration as stop:
                return stop.value
    except BaseException as exc:
        op.close()  # now: what it sets back on failure (a commit's version) is set back
        _after_error(conn, exc)
        clear = _clear(exc)
        if clear is exc:
            raise
        raise clear from exc


async def _arun_on(conn: Any, op: _Op, query: _Query) -> Any:
    """:func:`_run_on` on an async connection."""
    import psycopg

    try:
        while True:
            try:
                cur = await conn.execute(
                    query.sql, query.params, prepare=query.prepare, binary=True
                )
            except psycopg.errors.UniqueViolation:
                if not query.unique:
                    raise
                result: Any = _UNIQUE
            except psycopg.Error:
                if not query.tolerant:
                    raise
                result = None
            else:
                result = await cur.fetchall() if _has_rows(cur) else cur.rowcount
            try:
                query = op.send(result)
            except StopIteration as stop:
                return stop.value
    except BaseException as exc:
        op.close()
        if _in_transaction(conn):
            with contextlib.suppress(Exception):
                await conn.rollback()
        clear = _clear(exc)
        if clear is exc:
            raise
        raise clear from exc


def _in_transaction(conn: Any) -> bool:
    """Whether ``conn`` is left in a transaction (only opening runs one of several
    statements)."""
    return not conn.closed and conn.pgconn.transaction_status != _TX_IDLE


def _after_error(conn: Any, exc: BaseException) -> None:
    if _in_transaction(conn):
        with contextlib.suppress(Exception):
            conn.rollback()


def _clear(exc: BaseException) -> BaseException:
    """A ``ValueError`` for a text PostgreSQL cannot hold (refused by psycopg before it
    sends anything, or by the server for an array: either way nothing is written); any
    other error as it is."""
    from psycopg import DataError

    if isinstance(exc, DataError) and ("NUL" in str(exc) or "0x00" in str(exc)):
        return ValueError(f"PostgreSQL text cannot hold NUL characters (0x00): {exc}")
    return exc


def _lost(core: _Core, name: str, exc: BaseException, applied_unknown: bool) -> StoreError:
    if applied_unknown:
        return StoreError(
            f"the connection to PostgreSQL ({core.describe()}) failed during {name}(); "
            f"whether it was applied is unknown (load to see; a commit retried with its "
            f"commit_id is recognised): {exc}"
        )
    return StoreError(f"the connection to PostgreSQL ({core.describe()}) failed: {exc}")


def _cannot_open(core: _Core, exc: BaseException) -> StoreError:
    return StoreError(f"cannot open the PostgreSQL store {core.describe()}: {exc}")


class _Pool:
    """The sync store's connections: at most ``pool_size``, kept open between calls and
    checked without a round trip as they are taken (:func:`_idle_sound`); a new one is
    made in the calling thread when none is idle, trying again until ``timeout`` while
    the server cannot be reached, so the first call after a restart reconnects. (psycopg-
    pool reconnects in the background, with a back-off that can keep calls waiting for
    seconds after the server is back.)"""

    __slots__ = ("_core", "_freed", "_idle", "_open", "_waiters", "closed", "listener")

    def __init__(self, core: _Core) -> None:
        self._core = core
        self._idle: list[Any] = []
        self._open = 0  # connections made and not closed: idle, in use, or being made
        self._freed = threading.Condition(threading.Lock())
        # The threads waiting for a connection, oldest first: each a turn [handed, conn],
        # handed a connection, or None: room to make one.
        self._waiters: collections.deque[list[Any]] = collections.deque()
        self.closed = False
        self.listener: Any = None  # wait_for_work's connection, outside the count

    def adopt(self, conn: Any) -> None:
        """Keep ``conn`` (opened by the store) as an idle connection."""
        with self._freed:
            self._open += 1
            self._give(conn)

    def get(self) -> Any:
        """An idle connection, or a new one; raises ``StoreError`` when none comes
        within the store's ``timeout``. Threads that wait are served in the order they
        came: a connection put back goes to the one that has waited longest."""
        core = self._core
        deadline = None  # read from the clock only when there is a wait
        while True:
            with self._freed:
                if self.closed:
                    raise _closed()
                if self._waiters:
                    conn = None  # in line behind them
                elif self._idle:
                    conn = self._idle.pop()
                elif self._open < core.pool_size:
                    self._open += 1
                    break
                else:
                    conn = None
                if conn is None:
                    if deadline is None:
                        deadline = time.monotonic() + core.timeout
                    turn = [False, None]
                    self._waiters.append(turn)
                    while not (turn[0] or self.closed):
                        left = deadline - time.monotonic()
                        if left <= 0.0:
                            break
                        self._freed.wait(left)
                    if not turn[0]:
                        self._waiters.remove(turn)
                        if self.closed:
                            raise _closed()
                        raise StoreError(
                            f"no connection to PostgreSQL ({core.describe()}) within "
                            f"{core.timeout:g} s: all {core.pool_size} of pool_size are in use"
                        )
                    conn = turn[1]
                    if conn is None:  # room for a new connection, kept for this thread
                        break
            if _idle_sound(conn):
                return conn
            self._discard(conn)
        if deadline is None:
            deadline = time.monotonic() + core.timeout
        try:
            return self._connect(deadline)
        except BaseException:
            self._discard(None)
            raise

    def put(self, conn: Any) -> None:
        """Take back a connection from :meth:`get`: handed to the thread that has waited
        longest, else kept idle, when it is idle and sound."""
        broken = conn.closed or conn.pgconn.status != _CONN_OK
        with self._freed:
            if not (self.closed or broken or _in_transaction(conn)):
                self._give(conn)
                return
        self._discard(conn)

    def _give(self, conn: Any) -> None:
        """With the lock held: ``conn`` to the longest waiting thread, else idle."""
        if self._waiters:
            turn = self._waiters.popleft()
            turn[0], turn[1] = True, conn
            self._freed.notify_all()
        else:
            self._idle.append(conn)

    def close(self) -> None:
        """Close every connection (one in use, when it comes back); idempotent."""
        with self._freed:
            self.closed = True
            idle, self._idle = self._idle, []
            self._freed.notify_all()
        for conn in idle:
            self._discard(conn)
        self.drop_listener()

    def drop_listener(self) -> None:
        conn, self.listener = self.listener, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _connect(self, deadline: float) -> Any:
        """A new connection, trying again until ``deadline`` while the server cannot be
        reached."""
        import psycopg

        core = self._core
        pause = _RECONNECT_FIRST
        while True:
            try:
                conn = psycopg.Connection.connect(core.conninfo, **_connect_kwargs(core, deadline))
            except psycopg.OperationalError as exc:
                if deadline - time.monotonic() <= pause:
                    raise StoreError(
                        f"no connection to PostgreSQL ({core.describe()}) within "
                        f"{core.timeout:g} s: {exc}"
                    ) from exc
                time.sleep(pause)
                pause = min(pause * 2.0, _RECONNECT_MAX)
            else:
                _adapt(conn)
                return conn

    def _discard(self, conn: Any) -> None:
        """Close a connection that leaves the pool (``None``: one that was never made);
        the room it leaves goes to the longest waiting thread."""
        with self._freed:
            if self._waiters and not self.closed:
                turn = self._waiters.popleft()
                turn[0], turn[1] = True, None
                self._freed.notify_all()
            else:
                self._open -= 1
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class _AsyncPool:
    """:class:`_Pool` for the async store, on psycopg's async connections. It runs no
    task of its own, so it serves whichever event loop is running (psycopg-pool's
    ``AsyncConnectionPool`` keeps worker tasks on the loop that opened it: they end with
    that loop, leaving a store used under a later ``asyncio.run`` without them, and they
    hold up the loop's shutdown while they connect)."""

    __slots__ = ("_core", "_idle", "_open", "_waiters", "closed", "listener", "recorder")

    def __init__(self, core: _Core) -> None:
        self._core = core
        self._idle: list[Any] = []
        self._open = 0  # connections made and not closed: idle or in use
        self._waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.closed = False
        self.listener: Any = None  # wait_for_work's connection, outside the count
        self.recorder: Any = None  # _record_trace's sync connection

    def adopt(self, conn: Any) -> None:
        """Keep ``conn`` (opened by the store) as an idle connection."""
        self._open += 1
        self._idle.append(conn)

    async def get(self) -> Any:
        """An idle connection, or a new one; raises ``StoreError`` when none comes
        within the store's ``timeout``. Calls that wait are served in turn: a connection
        put back goes to the one that has waited longest."""
        core = self._core
        deadline = time.monotonic() + core.timeout
        while True:
            if self.closed:
                raise _closed()
            while self._idle:
                conn = self._idle.pop()
                if _idle_sound(conn):
                    return conn
                await self._close(conn)
            if self._open < core.pool_size:
                self._open += 1
                try:
                    return await self._connect(deadline)
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                # asyncio.wait, not wait_for: Python 3.11's wait_for can return the
                # connection and swallow a cancellation that comes with it.
                await asyncio.wait((waiter,), timeout=max(deadline - time.monotonic(), 0.0))
            except BaseException:
                self._forsake(waiter)
                raise
            if not waiter.done():
                self._forsake(waiter)
                raise StoreError(
                    f"no connection to PostgreSQL ({core.describe()}) within {core.timeout:g} s: "
                    f"all {core.pool_size} of pool_size are in use"
                )
            given = waiter.result()
            if given is not None:  # else: room for a new connection, or the pool closed
                if _idle_sound(given):
                    return given
                await self._close(given)

    async def put(self, conn: Any) -> None:
        """Take back a connection from :meth:`get`: handed to the call that has waited
        longest, else kept idle, when it is idle and sound."""
        broken = conn.closed or conn.pgconn.status != _CONN_OK
        if self.closed or broken or _in_transaction(conn):  # (cancelled mid-statement)
            await self._close(conn)
            self._wake()
        else:
            self._give(conn)

    async def close(self) -> None:
        """Close every connection (one in use, when it comes back); idempotent."""
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._close(conn)
        await self.drop_listener()
        self._close_recorder()
        self._wake(every=True)

    def close_now(self) -> None:
        """:meth:`close` without an event loop, for a store collected unclosed: closing
        an idle psycopg async connection awaits nothing, so its coroutine is run here."""
        self.closed = True
        idle, self._idle = self._idle, []
        listener, self.listener = self.listener, None
        for conn in [*idle, listener]:
            if conn is not None:
                closing = conn.close()
                with contextlib.suppress(BaseException):
                    closing.send(None)
                closing.close()
        self._close_recorder()

    async def drop_listener(self) -> None:
        conn, self.listener = self.listener, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    def _close_recorder(self) -> None:
        conn, self.recorder = self.recorder, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    async def _connect(self, deadline: float) -> Any:
        """A new connection, trying again until ``deadline`` while the server cannot be
        reached."""
        import psycopg

        core = self._core
        pause = _RECONNECT_FIRST
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    core.conninfo, **_connect_kwargs(core, deadline)
                )
            except psycopg.OperationalError as exc:
                left = deadline - time.monotonic()
                if left <= pause:
                    raise StoreError(
                        f"no connection to PostgreSQL ({core.describe()}) within "
                        f"{core.timeout:g} s: {exc}"
                    ) from exc
                await asyncio.sleep(pause)
                pause = min(pause * 2.0, _RECONNECT_MAX)
            else:
                _adapt(conn)
                return conn

    async def _close(self, conn: Any) -> None:
        self._open -= 1
        with contextlib.suppress(Exception):
            await conn.close()

    def _forsake(self, waiter: asyncio.Future[Any]) -> None:
        """A wait given up (timed out or cancelled): what was handed to it meanwhile,
        a connection or a look again, goes to the next."""
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        if not waiter.done():
            waiter.cancel()
        elif waiter.result() is not None:
            self._give(waiter.result())
        else:
            self._wake()

    def _give(self, conn: Any) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done() and not waiter.get_loop().is_closed():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    def _wake(self, every: bool = False) -> None:
        """Wake the longest waiting call (``every``: all) to look again: a connection
        closed leaves room for a new one, or the pool closed."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done() and not waiter.get_loop().is_closed():
                waiter.set_result(None)
                if not every:
                    return


def _retrieved(task: asyncio.Future[None]) -> None:
    """Mark a shared opening's failure as seen, should every caller awaiting it have
    been cancelled (each that awaits it gets the error)."""
    if not task.cancelled():
        task.exception()
