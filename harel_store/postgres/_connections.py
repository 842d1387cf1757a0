"""Running the core on connections: how a connection is made and checked, the array
adapters, one statement's run, and the sync and async pools of a store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import select
import time
from typing import Any

from .._errors import StoreError
from .._redact import redact
from ._core import _NO_RETRY, _RECONNECT_FIRST, _RECONNECT_MAX, _closed, _Core
from ._statements import _ARRAYS, _UNIQUE, _Op, _Query

_log = logging.getLogger("harel_store.postgres")
_log.addHandler(logging.NullHandler())  # unconfigured logging prints nothing of ours

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


def _adapt(conn: Any, lent: bool = True) -> None:
    """Give each parameter one type whatever its value, so a query is prepared once per
    connection (psycopg prepares a query anew for each set of parameter types): every
    int a bigint, not one of int2/int4/int8 by its size; each array its element type,
    not "unknown" when it is empty. A connection ``lent`` to one call at a time gets its
    own cursor (:func:`_cursor`)."""
    if not _DUMPERS:
        from psycopg.types.numeric import Int8BinaryDumper, Int8Dumper

        _DUMPERS[:] = [(int, Int8Dumper), (int, Int8BinaryDumper), *_array_dumpers()]
    for kind, dumper in _DUMPERS:
        conn.adapters.register_dumper(kind, dumper)
    if lent:
        conn.harel_store_cursor = conn.cursor(binary=True)


def _cursor(conn: Any) -> Any:
    """The binary cursor a statement outside a pipeline runs on: on a connection lent to
    one call at a time, its own, made with it, rather than one per statement as
    ``conn.execute`` makes (a cursor and its adapters cost about 9 µs to make); the call
    reads its rows before its next statement, and the cursor holds that result until
    then. A new one on a connection threads share."""
    try:
        return conn.harel_store_cursor
    except AttributeError:
        return conn.cursor(binary=True)


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


# Read with a transaction's BEGIN, in its round trip: the transaction's id, and what
# tells its server from another (a restart or a failover) when the id is looked up.
# It also sets, for the transaction only (as SET LOCAL: nothing left on the connection
# for a pooler's next client), generic plans for the batch statements it runs: on its
# cost estimates the planner keeps a custom plan for small arrays, planning the write
# anew at each call (0.3 ms) where the generic plan runs as fast.
_XACT = (
    "SELECT pg_current_xact_id()::text, pg_postmaster_start_time()::text,"
    " set_config('plan_cache_mode', 'force_generic_plan', true)"
)
_XACT_STATUS = "SELECT pg_xact_status(%s::xid8), pg_postmaster_start_time()::text"


def _execute(conn: Any, query: _Query, xact: list[Any]) -> Any:
    """Run ``query``, with the ``BEGIN`` and ``COMMIT`` it asks for in its round trip;
    with ``BEGIN``, the transaction's id and server go into ``xact`` (see
    :class:`_InDoubt`)."""
    if not (query.begin or query.commit):
        return _cursor(conn).execute(query.sql, query.params, prepare=query.prepare)
    if query.begin:
        xact[:] = [None, None, None]  # in a transaction from here: its id comes after
    with conn.pipeline():
        if query.begin:
            conn.execute("BEGIN", prepare=False)
            began = conn.execute(_XACT, prepare=False)
        cur = conn.execute(query.sql, query.params, prepare=query.prepare, binary=True)
        if query.commit:
            conn.execute("COMMIT", prepare=False)
    if query.begin:
        xact[:] = [*began.fetchone()[:2], _server_of(conn)]
    return cur


async def _aexecute(conn: Any, query: _Query, xact: list[Any]) -> Any:
    """:func:`_execute` on an async connection."""
    if not (query.begin or query.commit):
        return await _cursor(conn).execute(query.sql, query.params, prepare=query.prepare)
    if query.begin:
        xact[:] = [None, None, None]
    async with conn.pipeline():
        if query.begin:
            await conn.execute("BEGIN", prepare=False)
            began = await conn.execute(_XACT, prepare=False)
        cur = await conn.execute(query.sql, query.params, prepare=query.prepare, binary=True)
        if query.commit:
            await conn.execute("COMMIT", prepare=False)
    if query.begin:
        xact[:] = [*(await began.fetchone())[:2], _server_of(conn)]
    return cur


class _InDoubt(Exception):
    """The connection of an operation was lost inside a transaction it began with
    ``_Query.begin`` (a batch's, or a group write's): its ``op``, not yet closed, the
    transaction's id, server start and server (``xact``, ``None`` until the ``BEGIN``'s
    round trip is back), the error (``lost``), and whether the round trip that failed
    carried the ``COMMIT`` (else the transaction cannot have committed). The store
    settles it (:func:`_settle`)."""

    def __init__(self, op: _Op, xact: list[Any], lost: BaseException, at_commit: bool) -> None:
        super().__init__(str(lost))
        self.op, self.xact, self.lost, self.at_commit = op, xact, lost, at_commit


def _doubt(op: _Op, xact: list[Any], query: _Query, exc: BaseException) -> _InDoubt | None:
    if not (xact and _lost_connection(exc)):
        return None
    return _InDoubt(op, xact, exc, query.commit or query.sql == "COMMIT")


def _status(doubt: _InDoubt, conn: Any, row: Any) -> str | None:
    """What became of the transaction of ``doubt``, by ``row`` (:data:`_XACT_STATUS` on
    ``conn``): ``None`` when ``conn`` is on another server, or one restarted since."""
    _, started, server = doubt.xact
    if row is None or _server_of(conn) != server or row[1] != started:
        return None
    return row[0]  # type: ignore[no-any-return]


def _settled(core: _Core, name: str, doubt: _InDoubt, status: str | None) -> Any:
    """The next step of ``doubt``'s operation once ``status`` is known: the query its
    operation yields after a commit that landed (or its result, as a ``StopIteration``),
    else the error to raise: nothing was applied (``aborted``; retry), or the outcome
    is unknown (the server could not tell, or is another: a failover)."""
    op, lost = doubt.op, doubt.lost
    if status == "committed":
        _log.info("%s: %s() committed, although its connection was lost", core.describe(), name)
        return op.send(None)  # the rows of its last write are lost: nothing to trim after
    op.close()
    if status == "aborted":
        _log.info("%s: %s() was not applied (its connection was lost)", core.describe(), name)
        error = _failed(core, name, lost, wrote_nothing=True)
    else:
        error = _failed(core, name, lost, True)
    error.__cause__ = _cause(core, lost)
    raise error


def _settle(core: _Core, name: str, doubt: _InDoubt, get: Any, put: Any) -> Any:
    """The result of the operation of ``doubt``: a transaction that cannot have
    committed, or that the same server says committed or aborted (asked on a new
    connection), is settled; else the outcome stays unknown. One round trip, only
    after a lost connection."""
    status = "aborted" if not doubt.at_commit else None
    conn = None
    try:
        if status is None and doubt.xact[0] is not None:
            try:
                conn = get()
                row = conn.execute(_XACT_STATUS, (doubt.xact[0],), prepare=False).fetchone()
                status = _status(doubt, conn, row)
            except Exception:  # noqa: BLE001 - then the outcome stays unknown
                status = None
        try:
            query = _settled(core, name, doubt, status)
        except StopIteration as stop:
            return stop.value
        return _run_on(conn, doubt.op, query)
    finally:
        if conn is not None:
            put(conn)


async def _asettle(core: _Core, name: str, doubt: _InDoubt, get: Any, put: Any) -> Any:
    """:func:`_settle` on the event loop."""
    status = "aborted" if not doubt.at_commit else None
    conn = None
    try:
        if status is None and doubt.xact[0] is not None:
            try:
                conn = await get()
                cur = await conn.execute(_XACT_STATUS, (doubt.xact[0],), prepare=False)
                status = _status(doubt, conn, await cur.fetchone())
            except Exception:  # noqa: BLE001 - then the outcome stays unknown
                status = None
        try:
            query = _settled(core, name, doubt, status)
        except StopIteration as stop:
            return stop.value
        return await _arun_on(conn, doubt.op, query)
    finally:
        if conn is not None:
            await put(conn)


def _run_on(conn: Any, op: _Op, query: _Query) -> Any:
    """Run ``op`` to its end on ``conn``, starting with ``query``. A connection that saw
    the server turn read-only or go away is closed (:func:`_condemned`): the pool never
    hands it out again."""
    import psycopg

    xact: list[Any] = []
    try:
        while True:
            try:
                cur = _execute(conn, query, xact)
            except psycopg.errors.UniqueViolation as exc:
                if not (query.unique and exc.diag.table_name == _RACED):
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
        doubt = _doubt(op, xact, query, exc)
        if doubt is None:
            op.close()  # now: what it sets back on failure (a commit's version) is set back
        _after_error(conn, exc)
        if _condemned(exc):
            _discarding(conn, exc)
            with contextlib.suppress(Exception):
                conn.close()
        if doubt is not None:
            raise doubt from exc
        clear = _clear(exc)
        if clear is exc:
            raise
        raise clear from exc


async def _arun_on(conn: Any, op: _Op, query: _Query) -> Any:
    """:func:`_run_on` on an async connection."""
    import psycopg

    xact: list[Any] = []
    try:
        while True:
            try:
                cur = await _aexecute(conn, query, xact)
            except psycopg.errors.UniqueViolation as exc:
                if not (query.unique and exc.diag.table_name == _RACED):
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
        doubt = _doubt(op, xact, query, exc)
        if doubt is None:
            op.close()
        if _in_transaction(conn):
            with contextlib.suppress(Exception):
                await conn.rollback()
        if _condemned(exc):
            _discarding(conn, exc)
            with contextlib.suppress(Exception):
                await conn.close()
        if doubt is not None:
            raise doubt from exc
        clear = _clear(exc)
        if clear is exc:
            raise
        raise clear from exc


def _server_of(conn: Any) -> str:
    """The host and port ``conn`` was made to (``?`` once libpq has let go of them)."""
    try:
        return f"{conn.pgconn.host.decode()}:{conn.pgconn.port.decode()}"
    except Exception:  # noqa: BLE001 - a log line's detail
        return "?"


def _discarding(conn: Any, exc: BaseException) -> None:
    """Log a connection closed for ``exc`` (read-only or leaving server, or lost)."""
    code = _sqlstate(exc)
    why = f"SQLSTATE {code}" if code else _LOST
    _log.warning("closing a connection to %s, not to be used again: %s", _server_of(conn), why)


# The one table whose unique violation a commit reads as a race (another try of the same
# commit id landed first); any other is an error of the schema (see _failed).
_RACED = "commit_ids"


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


# --- what a driver error means to the caller --------------------------------------------------
#
# Every psycopg error becomes a StoreError (chaining it) that says which of two kinds it is.
# "Retry": the same call may pass later, on another connection or after the server is
# back; the store itself retries once the calls that cannot apply anything twice. "Fix
# the setup": it will fail again until someone changes the database, the role or the
# server. By SQLSTATE (https://www.postgresql.org/docs/current/errcodes-appendix.html).

_RETRY = {
    "25006": "the session is read-only: a hot standby, a primary demoted by a failover, "
    "or default_transaction_read_only; a retry on a new connection reaches the primary "
    "once there is one (list every host, with target_session_attrs=read-write)",
    "40001": "a serialization failure (a concurrent transaction)",
    "40P01": "a deadlock with a concurrent transaction",
    "55P03": "a lock was not granted in time (lock_timeout)",
    "57014": "the statement was cancelled (statement_timeout, or a cancel request)",
    "57P01": "the server is shutting down, or an administrator ended the session",
    "57P02": "the server crashed and is restarting",
    "57P03": "the server is starting up or shutting down",
    "53000": "the server is short of a resource",
    "53200": "the server is out of memory",
    "53300": "the server has too many connections",
}
_SETUP = {
    "42501": "the role lacks a privilege the store needs: USAGE and CREATE on its schema "
    "(CREATE only to create or upgrade it), and SELECT, INSERT, UPDATE, DELETE on its "
    "tables and USAGE, SELECT, UPDATE on its sequences",
    "42P01": "a table of the store is missing (dropped, or the schema was changed by hand)",
    "3F000": "the store's schema is missing (dropped while the store was open)",
    "42703": "a column of the store's tables is missing (the schema was changed by hand)",
    "42883": "a function the store calls is missing",
    "23505": "a unique constraint refused a row the store wrote: its tables or sequences "
    "were changed outside harel_store",
    "23502": "a column refused a NULL the store wrote: its tables were changed by hand",
    "53100": "the server's disk is full",
    "54000": "a value is beyond a limit of PostgreSQL",
    "28000": "the server refused the role (pg_hba.conf, or the role cannot log in)",
    "28P01": "the password was refused",
    "3D000": "the database does not exist",
}
_LOST = "the connection was lost"
_CONDEMNING = frozenset(["25006", "57P01", "57P02", "57P03"])


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None)


def _lost_connection(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection is gone or going: a psycopg error without a
    SQLSTATE that is not the client's own refusal, a connection exception (class 08) or
    the server ending the session (57P01-57P03)."""
    import psycopg

    code = _sqlstate(exc)
    if code is None:
        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
    return code.startswith("08") or code in ("57P01", "57P02", "57P03")


def _condemned(exc: BaseException) -> bool:
    """Whether a connection that raised ``exc`` may never be used again: its server is
    read-only (25006: a standby, or demoted) or leaving, or the connection is lost."""
    return _sqlstate(exc) in _CONDEMNING or _lost_connection(exc)


def _read_only(exc: BaseException) -> bool:
    """Whether ``exc`` says the server is read-only (25006): the pool's other idle
    connections are on it too."""
    return _sqlstate(exc) == "25006"


def _may_retry(exc: BaseException, name: str) -> bool:
    """Whether the store retries the operation ``name`` once, on another connection,
    after ``exc``: an operation that cannot apply anything twice after a lost connection,
    and any operation the server refused for a reason of the moment (read-only, a
    serialization failure, a deadlock) before applying anything; never a commit's, whose
    arguments may be iterators it has read (see _NO_RETRY)."""
    if name in _NO_RETRY:
        return False
    return _lost_connection(exc) or _sqlstate(exc) in ("25006", "40001", "40P01")


# A connection refused at startup has no SQLSTATE in psycopg: libpq's text says why.
_BUSY_AT_START = ("starting up", "shutting down", "recovery mode", "too many", "slots")


def _why(exc: BaseException, connecting: bool = False) -> tuple[bool, str]:
    """Whether ``exc`` (raised while ``connecting``, or by a statement) means "retry",
    and why."""
    code = _sqlstate(exc)
    if code is None and (connecting or str(exc).startswith("connection failed")):
        text = str(exc)
        if "FATAL:" not in text:
            return True, "the server cannot be reached (down, restarting, or a wrong host or port)"
        if not any(busy in text for busy in _BUSY_AT_START):
            return False, (
                "the server refused the connection (the database, the role, its password, "
                "or pg_hba.conf)"
            )
        return True, "the server is starting, shutting down or full"
    if _lost_connection(exc):
        return True, _RETRY.get(code or "", _LOST)
    if code is None:
        return False, "the driver refused the call"
    if code in _RETRY or code.startswith("40"):
        return True, _RETRY.get(code, "a transaction rollback")
    return False, _SETUP.get(code, "an error of the database, not of the moment")


# The public name of a core operation, where it differs ("ack" of the outbox: ack_outbox).
_PUBLIC = {
    ("ack", "outbox"): "ack_outbox", ("ack", "spawns"): "ack_spawn",
    ("claim", "outbox"): "claim_outbox", ("claim", "spawns"): "claim_spawns",
    ("pending", "outbox"): "pending_outbox", ("pending", "spawns"): "pending_spawns",
    ("record_trace", None): "append_trace",
}  # fmt: skip


def _public(name: str, args: tuple[Any, ...]) -> str:
    """What the caller called: the public method that runs the core's ``name``."""
    table = args[0] if name in ("ack", "claim", "pending") else None
    return _PUBLIC.get((name, table), name)


def _failed(
    core: _Core,
    name: str,
    exc: BaseException,
    applied_unknown: bool = False,
    *,
    wrote_nothing: bool = False,
) -> StoreError:
    """The :class:`StoreError` the psycopg error ``exc`` of the operation ``name`` becomes
    (the caller raises it ``from exc``): where, what the server said and its SQLSTATE,
    and whether to retry or to fix the setup. ``applied_unknown``: the operation writes,
    so when the connection was lost it may have been applied; ``wrote_nothing``: it is
    known to have written nothing, and the message says so."""
    where = f"PostgreSQL ({core.describe()})"
    if _lost_connection(exc):
        head = f"the connection to {where} failed during {name}()"
        if applied_unknown:
            head += (
                "; whether it was applied is unknown (load to see; a commit retried with "
                "its commit_id is recognised)"
            )
    elif _sqlstate(exc) is not None:
        head = f"{where} refused {name}()"
        if not wrote_nothing:
            head += "; nothing of it was applied"
    else:
        head = f"{name}() failed on {where}"
    if wrote_nothing:
        head += "; nothing was written"
    return StoreError(f"{head}: {_said(core, exc)}")


def _cannot_open(core: _Core, exc: BaseException) -> StoreError:
    """:func:`_failed` for opening the store."""
    said = _said(core, exc, connecting=True)
    return StoreError(f"cannot open the PostgreSQL store {core.describe()}: {said}")


def _unreachable(core: _Core, exc: BaseException) -> StoreError:
    """:func:`_failed` for a connection the pool could not make: in time, or at all (the
    server refused it: tried no more)."""
    said = _said(core, exc, connecting=True)
    if not _why(exc, True)[0]:
        return StoreError(f"cannot connect to PostgreSQL ({core.describe()}): {said}")
    return StoreError(
        f"no connection to PostgreSQL ({core.describe()}) within {core.timeout:g} s: {said}"
    )


def _cause(core: _Core, exc: BaseException) -> BaseException | None:
    """What a :class:`StoreError` made of ``exc`` chains: ``exc``, or when its text would
    show a password of the conninfo (libpq quotes what it cannot use of it), a copy of
    it that does not (``None`` when none can be made)."""
    text = str(exc)
    shown = redact(text, core.conninfo)
    if shown == text:
        return exc
    try:
        return type(exc)(shown)
    except Exception:  # noqa: BLE001 - then nothing is chained
        return None


def _said(core: _Core, exc: BaseException, connecting: bool = False) -> str:
    """What the driver said (never a password: :func:`harel_store._redact.redact`), its
    SQLSTATE, and what to do: retry, or fix the setup."""
    diag: Any = getattr(exc, "diag", None)
    primary = diag.message_primary if diag is not None else None
    if primary:  # the server's words, without the statement psycopg quotes after them
        said = " ".join(part for part in (primary, diag.message_detail, diag.message_hint) if part)
    else:
        said = str(exc)
    # One line (libpq's hints come on lines of their own), without a password.
    said = " ".join(redact(said, core.conninfo).split()) or type(exc).__name__
    code = _sqlstate(exc)
    if code is not None:
        said = f"{said} [SQLSTATE {code}]"
    retry, why = _why(exc, connecting)
    advice = f"Retry: {why}" if retry else f"Fix the setup, a retry will fail too: {why}"
    return f"{said}{' ' if said[-1] in '.?!' else '. '}{advice}"


def _seconds(value: Any, name: str) -> float:
    """A constructor's number of seconds (``max_lifetime``, ``connect_timeout``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return float(value)


def _say_unreachable(core: _Core, within: float, exc: BaseException) -> None:
    _log.warning(
        "%s cannot be reached, trying again for %g s: %s",
        core.describe(),
        within,
        " ".join(redact(str(exc), core.conninfo).split()),
    )


def _connect_retrying(core: _Core, within: float) -> Any:
    """A new connection, tried again with back-off for ``within`` seconds while the
    server cannot be reached (refused at once for a reason of the setup)."""
    import psycopg

    deadline = time.monotonic() + within
    pause = _RECONNECT_FIRST
    said = False
    while True:
        try:
            conn = psycopg.Connection.connect(core.conninfo, **_connect_kwargs(core, deadline))
        except psycopg.Error as exc:
            if deadline - time.monotonic() <= pause or not _why(exc, True)[0]:
                raise
            if not said:  # once per wait, not per try
                said = True
                _say_unreachable(core, within, exc)
            time.sleep(pause)
            pause = min(pause * 2.0, _RECONNECT_MAX)
        else:
            _adapt(conn)
            return conn


async def _aconnect_retrying(core: _Core, within: float) -> Any:
    """:func:`_connect_retrying` on the event loop."""
    import psycopg

    deadline = time.monotonic() + within
    pause = _RECONNECT_FIRST
    said = False
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(
                core.conninfo, **_connect_kwargs(core, deadline)
            )
        except psycopg.Error as exc:
            if deadline - time.monotonic() <= pause or not _why(exc, True)[0]:
                raise
            if not said:
                said = True
                _say_unreachable(core, within, exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2.0, _RECONNECT_MAX)
        else:
            _adapt(conn)
            return conn


class _Pooled:
    """What the sync and the async pool share: psycopg-pool's options, the log line of a
    failover, the check of a connection as it is taken, and the account of the
    connections lent to calls and of those made outside the pool.

    The store checks a connection itself as it takes it (:func:`_idle_sound`, no round
    trip) rather than through psycopg-pool's ``check`` callback: the pool sleeps with
    back-off (a second, then two...) after each connection that fails its check, so
    after a restart, with every idle connection dead, a call would wait seconds per dead
    connection. A dead one is closed and handed back, and the next is taken at once.
    When no connection comes in time because none can be made, one attempt in the
    calling thread or task says why (the pool's workers only log it)."""

    __slots__ = ("_connecting", "_core", "_lent", "_lifetime", "_pool", "_server", "_spare")

    def __init__(self, core: _Core, max_lifetime: float, connect_timeout: float) -> None:
        self._core = core
        self._lifetime = max_lifetime
        self._connecting = connect_timeout
        self._pool: Any = None
        self._lent: set[int] = set()  # the pool's connections in calls' hands
        self._spare: set[int] = set()  # connections made outside the pool, closed on put
        self._server: str | None = None  # where the last new connection went

    def _options(self) -> dict[str, Any]:
        """psycopg-pool's keywords: at most ``pool_size``, one kept open."""
        core = self._core
        return {
            "kwargs": _connect_kwargs(core, time.monotonic() + self._connecting),
            "min_size": 1,
            "max_size": core.pool_size,
            "timeout": core.timeout,
            "max_lifetime": self._lifetime,
            "name": f"harel_store {core.describe()}",
        }

    def _configured(self, conn: Any) -> None:
        """Each new connection of the pool: the adapters, and a log line when it went to
        another server than the one before (a failover, with a multi-host URL)."""
        _adapt(conn)
        server, before = _server_of(conn), self._server
        self._server = server
        if before is not None and server != before:
            _log.warning(
                "%s: new connections go to %s, no longer to %s (a failover?)",
                self._core.describe(),
                server,
                before,
            )

    def _taken(self, conn: Any) -> bool:
        """Whether ``conn``, just taken from the pool, is sound (then it is lent)."""
        if _idle_sound(conn):
            self._lent.add(id(conn))
            return True
        _log.info("discarded a dead connection to %s", self._core.describe())
        return False

    def _all_lent(self, final: bool) -> StoreError | None:
        """The error of a call that got no connection because all are in use (``None``
        when it may wait on, not ``final``)."""
        core = self._core
        if not final:
            return None
        return StoreError(
            f"no connection to PostgreSQL ({core.describe()}) within {core.timeout:g} s: "
            f"all {core.pool_size} of pool_size are in use"
        )

    def _unreached(self, exc: BaseException) -> StoreError:
        error = _unreachable(self._core, exc)
        error.__cause__ = _cause(self._core, exc)
        return error

    def _said_read_only(self) -> None:
        _log.warning(
            "%s turned read-only: every pooled connection is replaced", self._core.describe()
        )

    def stats(self) -> dict[str, int]:
        """psycopg-pool's ``get_stats()`` (empty before a pool is opened)."""
        return {} if self._pool is None else dict(self._pool.get_stats())


class _Pool(_Pooled):
    """The sync store's connections, on psycopg-pool's ``ConnectionPool``: at most
    ``pool_size``, one kept open, each replaced after ``max_lifetime`` seconds (see
    :class:`_Pooled` for how a connection is taken)."""

    __slots__ = ("closed", "listener")

    def __init__(self, core: _Core, max_lifetime: float, connect_timeout: float) -> None:
        from psycopg_pool import PoolTimeout

        super().__init__(core, max_lifetime, connect_timeout)
        self.closed = False
        self.listener: Any = None  # wait_for_work's connection, outside the count
        self._pool = self._opened()
        try:  # the first call finds its connection made, not a second one on the way
            self._pool.wait(core.timeout)
        except PoolTimeout:  # which closed that pool
            got = self._no_connection()
            if isinstance(got, StoreError):
                self.close()
                raise got from None
            self.put(got)
            self._pool = self._opened()  # the server answers again
        except BaseException:
            self.close()
            raise

    def _opened(self) -> Any:
        from psycopg_pool import ConnectionPool

        return ConnectionPool(
            self._core.conninfo, configure=self._configured, open=True, **self._options()
        )

    def get(self) -> Any:
        """A sound connection; raises ``StoreError`` when none comes within the store's
        ``timeout``."""
        from psycopg_pool import PoolClosed, PoolTimeout

        deadline = time.monotonic() + self._core.timeout
        while True:
            if self.closed:
                raise _closed()
            left = deadline - time.monotonic()
            try:  # a server that is down is found out within connect_timeout
                conn = self._pool.getconn(max(min(left, self._connecting), 0.0))
            except PoolClosed:
                raise _closed() from None
            except PoolTimeout:
                got = self._no_connection(final=time.monotonic() >= deadline)
                if isinstance(got, StoreError):
                    raise got from None
                if got is None:
                    continue
                return got
            if self._taken(conn):
                return conn
            with contextlib.suppress(Exception):
                conn.close()
            self._pool.putconn(conn)

    def _no_connection(self, final: bool = True) -> Any:
        """Why no connection came: all in use (an error when ``final``, else ``None``),
        or none could be made: then one attempt here, which tells the driver's reason
        (an error: the server is down), or is the connection the call gets (the server
        is back while psycopg-pool's workers still back off, for seconds)."""
        if len(self._lent) >= self._core.pool_size:
            return self._all_lent(final)
        try:
            conn = _connect_retrying(self._core, 0.0)
        except Exception as exc:  # noqa: BLE001 - a psycopg error, given as the reason
            return self._unreached(exc)
        self._spare.add(id(conn))
        return conn

    def put(self, conn: Any) -> None:
        """Take back a connection from :meth:`get` (psycopg-pool discards a closed one,
        or one left in a transaction)."""
        if id(conn) in self._spare:  # made outside the pool
            self._spare.discard(id(conn))
            with contextlib.suppress(Exception):
                conn.close()
            return
        self._lent.discard(id(conn))
        if self.closed:
            with contextlib.suppress(Exception):
                conn.close()
        with contextlib.suppress(Exception):  # the pool closed meanwhile
            self._pool.putconn(conn)

    def drop_idle(self) -> None:
        """Retire every connection (their server turned read-only: new ones may reach
        the primary): the idle ones now, those in use when they come back."""
        self._pool.drain()
        self._said_read_only()

    def close(self) -> None:
        """Close every connection (one in use, when it comes back); idempotent."""
        self.closed = True
        self._pool.close(timeout=1.0)
        self.drop_listener()

    def drop_listener(self) -> None:
        conn, self.listener = self.listener, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class _AsyncPool(_Pooled):
    """The async store's connections, on psycopg-pool's ``AsyncConnectionPool`` (see
    :class:`_Pooled`): one pool for the event loop the store runs on.

    psycopg-pool runs a pool's workers as tasks of the loop that opened it, so a store
    used under one ``asyncio.run`` after another opens a pool on each loop it meets, and
    lets go of the pool of the loop before without awaiting anything on it. Each pool
    has a keeper, a task of its loop that closes it when cancelled: by :meth:`close`, or
    by ``asyncio.run`` as the loop ends. Without it a loop that ends with the pool open
    can wait for ever: a worker of psycopg-pool that is cancelled while it connects
    takes the cancellation for a failed connection and waits for its next task
    (``tests/test_postgres.py``,
    ``test_an_async_store_left_open_lets_its_event_loop_end``)."""

    __slots__ = ("_keeper", "_loop", "_opening", "closed", "listener", "recorder")

    def __init__(self, core: _Core, max_lifetime: float, connect_timeout: float) -> None:
        super().__init__(core, max_lifetime, connect_timeout)
        self.closed = False
        self.listener: Any = None  # wait_for_work's connection, outside the count
        self.recorder: Any = None  # _record_trace's sync connection
        self._loop: asyncio.AbstractEventLoop | None = None  # the pool's
        self._keeper: asyncio.Task[None] | None = None
        self._opening: asyncio.Task[None] | None = None

    async def get(self) -> Any:
        """A sound connection; raises ``StoreError`` when none comes within the store's
        ``timeout``."""
        from psycopg_pool import PoolClosed, PoolTimeout

        pool = self._pool
        if pool is None or self._loop is not asyncio.get_running_loop():
            pool = await self._current()
        cancelling = getattr(asyncio.current_task(), "cancelling", None)  # Python 3.11+
        asked = cancelling() if cancelling is not None else 0
        deadline = time.monotonic() + self._core.timeout
        while True:
            if self.closed:
                raise _closed()
            left = deadline - time.monotonic()
            try:
                conn = await pool.getconn(max(min(left, self._connecting), 0.0))
            except PoolClosed:
                raise _closed() from None
            except PoolTimeout:
                got = await self._no_connection(final=time.monotonic() >= deadline)
                if isinstance(got, StoreError):
                    raise got from None
                if got is None:
                    continue
                return got
            if cancelling is not None and cancelling() > asked:
                # Cancelled as the pool handed it over: psycopg-pool waits with
                # asyncio.wait_for, which then returns the connection and swallows the
                # cancellation (before Python 3.12). Honoured here.
                await pool.putconn(conn)
                raise asyncio.CancelledError
            if self._taken(conn):
                return conn
            with contextlib.suppress(Exception):
                await conn.close()
            await pool.putconn(conn)

    async def _no_connection(self, final: bool = True) -> Any:
        """:meth:`_Pool._no_connection`."""
        if len(self._lent) >= self._core.pool_size:
            return self._all_lent(final)
        try:
            conn = await _aconnect_retrying(self._core, 0.0)
        except Exception as exc:  # noqa: BLE001 - a psycopg error, given as the reason
            return self._unreached(exc)
        self._spare.add(id(conn))
        return conn

    async def put(self, conn: Any) -> None:
        """:meth:`_Pool.put`."""
        if id(conn) in self._spare:
            self._spare.discard(id(conn))
            with contextlib.suppress(Exception):
                await conn.close()
            return
        self._lent.discard(id(conn))
        if self.closed:
            with contextlib.suppress(Exception):
                await conn.close()
        with contextlib.suppress(Exception):
            await self._pool.putconn(conn)

    async def _current(self) -> Any:
        """The pool of the running loop, opened by the first call on that loop (the
        calls that come meanwhile wait for it)."""
        if self.closed:
            raise _closed()
        loop = asyncio.get_running_loop()
        opening = self._opening
        if opening is None or opening.get_loop() is not loop or opening.done():
            if self._loop is not None and self._loop is not loop:
                self._leave()
            opening = self._opening = loop.create_task(self._open())
            opening.add_done_callback(_retrieved)
        await asyncio.shield(opening)
        return self._pool

    async def _open(self) -> None:
        """Open a pool on the running loop, with its keeper, and wait for its first
        connection (so the first call does not make a second one)."""
        from psycopg_pool import AsyncConnectionPool, PoolTimeout

        loop = asyncio.get_running_loop()
        pool: Any = AsyncConnectionPool(
            self._core.conninfo, configure=self._aconfigured, open=False, **self._options()
        )
        await pool.open()
        keeper = loop.create_task(_keep(pool), name=f"{pool.name} keeper")
        try:
            await pool.wait(self._connecting)
        except PoolTimeout:  # which closed that pool
            keeper.cancel()
            got = await self._no_connection()
            if isinstance(got, StoreError):
                raise got from None
            await self.put(got)
            pool = AsyncConnectionPool(  # the server answers again
                self._core.conninfo, configure=self._aconfigured, open=False, **self._options()
            )
            await pool.open()
            keeper = loop.create_task(_keep(pool), name=f"{pool.name} keeper")
        except BaseException:
            keeper.cancel()
            raise
        if self.closed:
            keeper.cancel()
            raise _closed()
        self._pool, self._loop, self._keeper = pool, loop, keeper

    async def _aconfigured(self, conn: Any) -> None:
        self._configured(conn)

    def _leave(self) -> None:
        """Let go of the pool of another loop: closed by its keeper as that loop ended,
        or, when that loop is left open, when it runs again."""
        keeper, self._keeper = self._keeper, None
        self._pool = self._loop = None
        self._lent.clear()
        if keeper is not None and not keeper.done():
            with contextlib.suppress(RuntimeError):  # that loop is closed
                keeper.get_loop().call_soon_threadsafe(keeper.cancel)

    async def drop_idle(self) -> None:
        """:meth:`_Pool.drop_idle`."""
        if self._pool is not None and self._loop is asyncio.get_running_loop():
            await self._pool.drain()
            self._said_read_only()

    async def close(self) -> None:
        """Close every connection (one in use, when it comes back); idempotent."""
        self.closed = True
        pool, keeper = self._pool, self._keeper
        if pool is not None and keeper is not None and self._loop is asyncio.get_running_loop():
            with contextlib.suppress(Exception):
                await pool.close(timeout=1.0)
            keeper.cancel()
        else:
            self._leave()
        await self.drop_listener()
        self._close_recorder()

    def close_now(self) -> None:
        """:meth:`close` without an event loop, for a store collected unclosed: the pool
        is left to its keeper, and the listening connection closed here (closing an idle
        psycopg async connection awaits nothing, so its coroutine is run here)."""
        self.closed = True
        self._leave()
        listener, self.listener = self.listener, None
        if listener is not None:
            closing = listener.close()
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


async def _keep(pool: Any) -> None:
    """Wait until cancelled, then close ``pool`` (see :class:`_AsyncPool`). As its loop
    ends, the pool's scheduler task is cancelled too, and psycopg-pool's ``close``
    raises that after it has stopped the workers: nothing more is owed then (the idle
    connections it took out are closed as they are dropped)."""
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await pool.close(timeout=1.0)


def _retrieved(task: asyncio.Future[None]) -> None:
    """Mark a shared opening's failure as seen, should every caller awaiting it have
    been cancelled (each that awaits it gets the error)."""
    if not task.cancelled():
        task.exception()
