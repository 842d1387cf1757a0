"""``PostgresStore``: the sync store, running the shared core (:mod:`._core`) on a pool."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .. import _checks, _transfer
from .._digest import Digest
from .._errors import StoreError
from .._records import DEFAULT_TRACE_MAX, Commit, OutboxEntry, SpawnEntry, TimerOp

if TYPE_CHECKING:
    from typing_extensions import Self

from . import _operate
from ._connections import (
    _cannot_open,
    _cause,
    _clear,
    _connect_retrying,
    _connect_timeout,
    _failed,
    _InDoubt,
    _may_retry,
    _Pool,
    _public,
    _read_only,
    _run_on,
    _seconds,
    _settle,
    _why,
)
from ._core import (
    _NO_RETRY,
    _RECONNECT_FIRST,
    _RECONNECT_MAX,
    _TIMEOUT_MAX,
    _closed,
    _Core,
    _import_psycopg,
)
from ._schema import _BATCH, _COPIED, DEFAULT_POOL_SIZE, DEFAULT_SCHEMA
from ._statements import _pack, _unpack

_log = logging.getLogger("harel_store.postgres")


class PostgresStore(_transfer.Uncopyable):
    """The durable ``ExecutionStore`` on PostgreSQL (see the module docstring).

    ``conninfo`` is a libpq URL (``postgresql://user@host:5432/db``) or key=value string,
    passed to psycopg. ``schema`` is the PostgreSQL schema of the store's tables, created
    on first open. ``codec`` encodes executions and values (default: JSON, see
    :mod:`harel_store._codec`). ``pool_size`` is the most connections the store opens at
    once (one is kept open; ``wait_for_work`` opens one more). ``prepare=False`` prepares
    no statement (PgBouncer in transaction mode). ``timeout`` is how long a call waits
    for a connection before it raises :class:`~harel_store.StoreError`. The connections
    come from a psycopg-pool ``ConnectionPool`` (the ``postgres`` extra installs it);
    each is replaced after ``max_lifetime`` seconds, and :meth:`pool_stats` returns the
    pool's statistics. ``connect_timeout`` bounds a connection attempt (unless the
    conninfo sets one); opening tries again for that long while the server cannot be
    reached.

    Opening connects, checks the schema (creating or upgrading it under an advisory lock),
    and raises ``StoreError`` when the server cannot be reached or the schema is foreign
    or newer.
    """

    preserves_identity = False
    durable = True
    _copy_hint = "open another store on the same conninfo and schema"

    __slots__ = ("__weakref__", "_core", "_listening", "_polls", "_pool")

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
        lifetime = _seconds(max_lifetime, "max_lifetime")
        connecting = _seconds(connect_timeout, "connect_timeout")
        self._pool: _Pool | None = None
        self._polls = False
        self._listening = threading.Lock()  # wait_for_work's turn on the listener
        psycopg = _import_psycopg()
        core = self._core = _Core(conninfo, trace_max, codec, schema, pool_size, prepare, timeout)
        try:
            conn = _connect_retrying(core, connecting)
        except psycopg.Error as exc:
            raise _cannot_open(core, exc) from _cause(core, exc)
        try:
            op = core.open()
            _run_on(conn, op, next(op))
        except BaseException as exc:
            conn.close()
            if isinstance(exc, psycopg.Error):
                raise _cannot_open(core, exc) from exc
            raise
        conn.close()  # its errors are the clear ones; the pool makes its own
        pool = self._pool = _Pool(core, lifetime, connecting)
        weakref.finalize(self, pool.close)

    def __repr__(self) -> str:
        state = "closed" if self._pool is None or self._pool.closed else "open"
        return f"<{type(self).__name__} {self._core.describe()} {state}>"

    def __enter__(self) -> Self:
        self._open_pool()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def schema(self) -> str:
        """The PostgreSQL schema of the store's tables."""
        return self._core.schema

    @property
    def trace_max(self) -> int | None:
        """Steps kept per execution; ``0``/``None`` keeps all. A change applies to an
        execution's ring at its next append."""
        return self._core.trace_max

    @trace_max.setter
    def trace_max(self, value: int | None) -> None:
        self._core.trace_max = _checks.as_trace_max(value)

    # --- executions --------------------------------------------------------------------

    def load(self, execution_id: str) -> Any:
        """A new object decoded from the stored execution, with the stored ``version``;
        ``None`` when there is none."""
        return self._run("load", execution_id)

    def save(self, exe: Any, *, epoch: int | None = None) -> None:
        """CAS-write ``exe`` and bump ``exe.version``: it succeeds when no row exists for
        ``exe.id`` or the stored version equals ``exe.version``, else raises
        :class:`StoreConflict`. With ``epoch``, a greater stored epoch raises
        :class:`StaleWriter` first; a greater ``epoch`` is stored."""
        self._run("save", exe, epoch)

    def commit(
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
        """The event-boundary write, in one statement and one transaction: save ``exe``
        (CAS), enqueue ``emits``, mark ``processed_event_id``, apply ``timers``, enqueue
        ``spawns``, record ``trace``. All or nothing, and durable once it returns.

        With ``commit_id``, a commit this execution already applied with an equal body
        writes nothing and sets ``exe.version`` to the version it produced; another body
        raises :class:`IdempotencyConflict`. That check comes before the epoch check
        (:class:`StaleWriter`) and the CAS (:class:`StoreConflict`).
        """
        self._run("commit", exe, emits, processed_event_id, timers, spawns, trace, commit_id, epoch)

    def commit_many(self, commits: Iterable[Commit]) -> list[StoreError | None]:
        """Each :class:`~harel_store.Commit` of ``commits`` as :meth:`commit` applies it,
        in order, in one transaction: per commit ``None`` (applied, or a replay of its
        ``commit_id``) or the :class:`StoreConflict`, :class:`StaleWriter` or
        :class:`IdempotencyConflict` that :meth:`commit` would have raised, which wrote
        nothing and does not stop the others. Every commit is checked and encoded before
        the first is written: bad input in any (``TypeError``/``ValueError`` naming
        ``commits[i]``, two commits of one execution) raises and writes nothing. A batch
        costs a fixed number of statements whatever its size and wakes waiting relays
        once; durable once it returns. An empty batch is ``[]``, with no transaction."""
        return self._run("commit_many", commits)  # type: ignore[no-any-return]

    def is_processed(self, execution_id: str, event_id: str) -> bool:
        """Whether a commit of ``execution_id`` recorded ``event_id`` as handled."""
        return self._run("is_processed", execution_id, event_id)  # type: ignore[no-any-return]

    # --- outbox and spawns -------------------------------------------------------------

    def pending_outbox(self) -> list[OutboxEntry]:
        """The unacked outbox entries, oldest first, leased ones included."""
        return self._run("pending", "outbox")  # type: ignore[no-any-return]

    def ack_outbox(self, seq: int) -> None:
        """Drop the outbox entry ``seq`` (ending its lease); an unknown or already-acked
        seq is a no-op."""
        self._run("ack", "outbox", seq)

    def ack_outbox_many(self, seqs: Iterable[int]) -> None:
        """:meth:`ack_outbox` each of ``seqs`` in one statement and one transaction; every
        seq is checked (an ``int``) before anything is acked."""
        self._run("ack_outbox_many", seqs)

    def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        """Lease up to ``limit`` unacked outbox entries that no live lease holds, oldest
        first, for ``lease`` seconds of the database clock: until then no claim of any
        store object on this schema returns them; unacked after it, they are claimable
        again."""
        return self._run("claim", "outbox", limit, lease)  # type: ignore[no-any-return]

    def pending_spawns(self) -> list[SpawnEntry]:
        """The unacked spawn intents, oldest first, leased ones included."""
        return self._run("pending", "spawns")  # type: ignore[no-any-return]

    def ack_spawn(self, seq: int) -> None:
        """Drop the spawn intent ``seq`` (ending its lease); an unknown or already-acked
        seq is a no-op."""
        self._run("ack", "spawns", seq)

    def ack_spawn_many(self, seqs: Iterable[int]) -> None:
        """:meth:`ack_outbox_many` for the spawn intents."""
        self._run("ack_spawn_many", seqs)

    def claim_spawns(self, limit: int = 100, *, lease: float = 30.0) -> list[SpawnEntry]:
        """:meth:`claim_outbox` for the spawn intents."""
        return self._run("claim", "spawns", limit, lease)  # type: ignore[no-any-return]

    # --- timers ------------------------------------------------------------------------

    def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        """``(execution_id, path, fire_at)`` of every armed timer with ``fire_at <= now``,
        oldest ``fire_at`` first (ties in arming order), leased ones included."""
        return self._run("due_timers", now)  # type: ignore[no-any-return]

    def claim_due_timers(
        self, now: float, limit: int = 100, *, lease: float = 30.0
    ) -> list[tuple[str, str, float]]:
        """Lease up to ``limit`` due timers that no live lease holds, oldest ``fire_at``
        first, for ``lease`` seconds (see :meth:`claim_outbox`). Deleting or re-arming a
        timer ends its lease."""
        return self._run("claim_due_timers", now, limit, lease)  # type: ignore[no-any-return]

    def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        """Disarm the timer only if it still fires at ``fire_at``, so a sweep that read it
        before a re-arm cannot delete the re-armed timer. Ends its lease."""
        self._run("delete_timer", execution_id, path, fire_at)

    def delete_timer_many(self, timers: Iterable[tuple[str, str, float]]) -> None:
        """:meth:`delete_timer` each ``(execution_id, path, fire_at)`` of ``timers`` in one
        statement and one transaction; every triple is checked before anything is
        deleted."""
        self._run("delete_timer_many", timers)

    # --- trace -------------------------------------------------------------------------

    def append_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        """Record a trace step for ``execution_id`` outside a commit."""
        self._run("record_trace", execution_id, entry)

    def read_trace(self, execution_id: str) -> list[dict[str, Any]]:
        """The recent steps of ``execution_id``, oldest first, decoded anew (or ``[]``)."""
        return self._run("read_trace", execution_id)  # type: ignore[no-any-return]

    # --- retention, monitoring, wake-ups -----------------------------------------------

    def forget(self, execution_id: str) -> None:
        """Drop an execution with its processed marks, armed timers, trace ring, trace
        index, commit ids and writer epoch, in one transaction. Pending outbox and spawn
        entries stay: they are owed to a relay. An unknown id is a no-op."""
        self._run("forget", execution_id)

    def stats(self) -> dict[str, int]:
        """Counts for monitoring, read in one snapshot (each a count of rows)."""
        return self._run("stats")  # type: ignore[no-any-return]

    def overview(self, *, now: float | None = None) -> dict[str, Any]:
        """What the store holds, for an operator: row counts (``executions``, ``outbox``,
        ``spawns``, ``timers``, ``processed``, ``commit_ids``), the age in seconds of the
        oldest pending outbox and spawn entry (the database's clock), live and expired
        leases, the timers due at ``now`` and the next one after it (``now`` defaults to
        this machine's clock), read in one statement. The README lists the keys."""
        return self._run("overview", now)  # type: ignore[no-any-return]

    def list_executions(self, *, after: str | None = None, limit: int = 100) -> list[str]:
        """Up to ``limit`` execution ids in id order, those after ``after`` (the last id of
        the previous page)."""
        return self._run("list_executions", after, limit)  # type: ignore[no-any-return]

    def prune(self, older_than: float) -> dict[str, int]:
        """Delete the processed marks and commit ids recorded more than ``older_than``
        seconds ago (the database's clock), in every execution, walking each table's keys
        a few thousand at a time, a transaction each (no index on when a row was
        recorded: commits would write it); how many of each it deleted. An event whose
        mark was pruned is no longer deduplicated."""
        return _operate.prune(self._run, older_than)

    def wait_for_work(self, timeout: float) -> bool:
        """``True`` as soon as any store object on this schema has committed outbox or
        spawn entries or armed a timer since this object was opened or since its previous
        ``wait_for_work`` returned; ``False`` after ``timeout`` seconds without one.

        It uses ``LISTEN`` on a connection of its own, opened at the first call and
        reopened when it drops (until ``timeout``: then :class:`StoreError`). Threads that
        wait on one store take turns on it, each for no longer than its ``timeout``."""
        pool = self._open_pool()
        timeout = _checks.as_timeout(timeout)
        deadline = time.monotonic() + timeout
        if not self._listening.acquire(timeout=-1 if timeout > _TIMEOUT_MAX else timeout):
            return False
        try:
            return self._wait_for_work(pool, deadline)
        finally:
            self._listening.release()

    def _wait_for_work(self, pool: _Pool, deadline: float) -> bool:
        import psycopg

        pause = _RECONNECT_FIRST
        polled = 0.0
        while True:
            if pool.closed:  # by close() in another thread, which closed the listener
                raise _closed()
            try:
                if not self._core.prepare:
                    # prepare=False says a transaction pooler (PgBouncer) is in between:
                    # a LISTEN would stay on whichever server connection ran it.
                    if self._marks_moved(pool):
                        return True
                    left = deadline - time.monotonic()
                    if left <= 0.0:
                        return False
                    polled = min(max(polled * 2.0, _RECONNECT_FIRST), _RECONNECT_MAX, left)
                    time.sleep(polled)
                    continue
                if pool.listener is None and self._listen(pool, deadline):
                    return True
                # A round trip: the notifications of every commit that returned before
                # this call arrive before its reply (see _listen).
                pool.listener.execute("", prepare=False)
                left = deadline - time.monotonic()
                waiting = pool.listener.notifies(
                    timeout=None if left == float("inf") else max(left, 0.0), stop_after=1
                )
                with contextlib.closing(waiting):  # it holds the connection's lock
                    woken = next(waiting, None) is not None
                if woken:  # later notifications of work committed by now are this wake-up's
                    for _ in pool.listener.notifies(timeout=0.0):
                        pass
                return woken
            except psycopg.Error as exc:
                pool.drop_listener()
                if pool.closed:
                    raise _closed() from None
                left = deadline - time.monotonic()
                if left <= 0.0 or not _why(exc)[0]:
                    raise _failed(self._core, "wait_for_work", exc) from _cause(self._core, exc)
                time.sleep(min(pause, left))
                pause = min(pause * 2.0, _RECONNECT_MAX)

    def _marks_moved(self, pool: _Pool) -> bool:
        """Whether any seq moved since the marks last read, on a pooled connection."""
        core = self._core
        if not self._polls:  # said once per store
            self._polls = True
            _log.warning(
                "wait_for_work polls %s (prepare=False: LISTEN does not cross a transaction "
                "pooler such as PgBouncer)",
                core.describe(),
            )
        conn = pool.get()
        try:
            return core.marks_moved(conn.execute(core.sql.marks, prepare=False).fetchone())
        finally:
            pool.put(conn)

    def pool_stats(self) -> dict[str, int]:
        """The connection pool's statistics (psycopg-pool's ``get_stats()``: ``pool_size``,
        ``pool_available``, ``requests_waiting``, ``connections_num`` and the others)."""
        return self._open_pool().stats()

    def close(self) -> None:
        """Close the connections; a second close does nothing. Every other method of a
        closed store raises ``ValueError``."""
        if self._pool is not None:
            self._pool.close()

    def _record_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        self._run("record_trace", execution_id, entry)

    # --- copying (harel_store.copy_store) ----------------------------------------------

    def _dump(self) -> Iterator[tuple[Any, ...]]:
        """Everything the schema holds, as the records of :mod:`harel_store._copy`, read
        in one ``REPEATABLE READ`` transaction (a snapshot, while other store objects go
        on writing) through server-side cursors, so a large store streams. A connection
        of the pool is taken until the iterator is exhausted or closed. Commit bodies
        come as :class:`~harel_store.Digest` objects of the codec's canonical
        encoding."""
        import psycopg

        pool = self._open_pool()
        core = self._core
        dump = core.sql.dump
        decode = core.codec.decode_value
        conn = pool.get()
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

                def rows(kind: str) -> Iterator[Any]:
                    with conn.cursor(f"harel_store_dump_{kind}", binary=True) as cur:
                        cur.itersize = _BATCH
                        cur.execute(dump[kind])
                        yield from cur

                yield ("total", conn.execute(dump["total"]).fetchone()[0])
                for version, epoch, body in rows("execution"):
                    exe = core.codec.decode_execution(_unpack(body))
                    exe.version = version
                    yield ("execution", exe, epoch)
                for eid, event_id in rows("mark"):
                    yield ("mark", eid, event_id)
                for eid, commit_id, version, digest in rows("commit"):
                    digest = Digest(bytes(digest), core.canonical)
                    yield ("commit", eid, commit_id, version, digest)
                ring: tuple[str, int, list[Any]] | None = None
                for eid, next_index, idx, data in rows("trace"):
                    if ring is None or ring[0] != eid:
                        if ring is not None:
                            yield ("trace", *ring)
                        ring = (eid, next_index, [])
                    if data is not None:
                        step = decode(_unpack(data))
                        if "index" not in step:
                            step["index"] = idx
                        ring[2].append(step)
                if ring is not None:
                    yield ("trace", *ring)
                for timer in rows("timer"):
                    yield ("timer", *timer)
                for seq, target, event in rows("outbox"):
                    yield ("outbox", OutboxEntry(seq, target, decode(_unpack(event))))
                for seq, parent, child, root, context in rows("spawn"):
                    entry = SpawnEntry(
                        seq, parent, child, decode(_unpack(root)), decode(_unpack(context))
                    )
                    yield ("spawn", entry)
                yield ("seqs", *conn.execute(dump["seqs"]).fetchone())
        except psycopg.Error as exc:
            raise _failed(core, "copy_store", exc) from exc
        finally:
            pool.put(conn)

    def _restore(self, records: Iterable[tuple[Any, ...]]) -> None:
        """Write the records of :mod:`harel_store._copy` into this empty schema (else
        :class:`~harel_store.StoreError`) in one transaction, which locks the tables
        against other writers and checks emptiness first: all or nothing. Ids must be
        ``str`` (else ``TypeError``); commit bodies are digested with this store's codec (a
        :class:`~harel_store.Digest` of the same encoding is taken as it is); each
        ring keeps its last ``trace_max`` steps. Seqs continue after the copied ones;
        waiting relays are woken."""
        import psycopg

        pool = self._open_pool()
        restore = self._core.sql.restore
        committing = False  # the writes are done: a lost connection leaves it unknown
        conn = pool.get()
        try:
            with conn.transaction():
                conn.execute(restore["lock"])
                held = conn.execute(restore["held"]).fetchone()
                if any(held):
                    raise _transfer.not_empty(self, dict(zip((what for _, what in _COPIED), held)))
                try:
                    self._write_records(conn, records)
                except psycopg.errors.UniqueViolation as exc:
                    raise ValueError(
                        f"the records to copy hold the same thing twice ({exc.diag.message_detail}); "
                        "nothing was written"
                    ) from None
                committing = True
        except psycopg.Error as exc:
            clear = _clear(exc)
            if clear is not exc:
                raise clear from exc
            raise _failed(
                self._core, "copy_store", exc, applied_unknown=committing,
                wrote_nothing=not committing,
            ) from exc  # fmt: skip
        finally:
            pool.put(conn)

    def _write_records(self, conn: Any, records: Iterable[Any]) -> None:
        """:meth:`_restore`'s writes, inside its transaction, in batches per table."""
        core = self._core
        restore = core.sql.restore
        batches: dict[str, list[tuple[Any, ...]]] = {}

        def add(kind: str, row: tuple[Any, ...]) -> None:
            batch = batches.setdefault(kind, [])
            batch.append(row)
            if len(batch) >= _BATCH:
                flush(kind)

        def flush(kind: str) -> None:
            batch = batches.pop(kind, None)
            if batch:
                with conn.cursor() as cur:
                    cur.executemany(restore[kind], batch)

        def encode(value: Any, what: str) -> bytes:
            return _pack(core._encode(value, what))

        seqs: tuple[int, int] = (0, 0)
        rows = _transfer.durable_rows(
            records, encode=encode, encode_exe=lambda exe, eid: _pack(core._encode_exe(exe, eid)),
            canonical=core.canonical, digest=core._digest, keep=core.trace_max,
        )  # fmt: skip
        for kind, row in rows:
            _transfer.durable_row_keys(kind, row)
            if kind == "seqs":
                seqs = row
            elif kind == "trace":
                add(kind, row[:2])  # trace_index here holds no count of the steps
            else:
                add(kind, row)
        for kind in list(batches):
            flush(kind)
        # The sequences continue after the greatest seq copied or told of.
        for statement, last in zip(restore["seqs"], seqs):
            conn.execute(statement, (last, last))
        conn.execute(restore["wake"], (core.channel,))

    # --- helpers -----------------------------------------------------------------------

    def _run(self, name: str, *args: Any) -> Any:
        """Run the core's operation ``name`` on a connection of the pool."""
        import psycopg  # not "from psycopg import": that costs a Python call each time

        self._open_pool()
        method = getattr(self._core, name)
        for attempt in range(2):
            op = method(*args)
            try:
                query = next(op)
            except StopIteration as stop:
                return stop.value
            pool = self._open_pool()
            try:
                conn = pool.get()
            except BaseException:
                op.close()  # the operation ends now (a commit sets back the version it set)
                raise
            doubt = None
            try:
                return _run_on(conn, op, query)
            except _InDoubt as exc:  # lost inside a transaction of a batch
                doubt = exc
            except psycopg.Error as exc:
                op.close()
                if _read_only(exc):  # so are the others of the pool: none is used again
                    pool.drop_idle()
                if attempt or not _may_retry(exc, name):
                    shown = _public(name, args)
                    raise _failed(self._core, shown, exc, name in _NO_RETRY) from exc
                _log.info(
                    "%s: retrying %s after %s", self._core.describe(), name, type(exc).__name__
                )
            finally:
                pool.put(conn)
            if doubt is not None:
                return _settle(self._core, _public(name, args), doubt, pool.get, pool.put)
        raise AssertionError("unreachable")

    def _open_pool(self) -> _Pool:
        pool = self._pool
        if pool is None or pool.closed:
            raise _closed()
        return pool

    def _listen(self, pool: _Pool, deadline: float) -> bool:
        """Open the listening connection; whether any seq moved since the marks.

        A listening session is sent the notifications of the transactions that
        committed after its ``LISTEN``: while it is idle, or at the latest before the
        reply to its next statement (psycopg keeps those for ``notifies()``). The marks,
        read after the ``LISTEN``, cover what committed before it."""
        import psycopg

        core = self._core
        conn = psycopg.Connection.connect(core.conninfo, **_connect_timeout(core, deadline))
        try:
            conn.execute(f'LISTEN "{core.channel}"')
            marks = conn.execute(core.sql.marks).fetchone()
            if pool.closed:
                raise _closed()
        except BaseException:
            conn.close()
            raise
        pool.listener = conn
        return core.marks_moved(marks)
