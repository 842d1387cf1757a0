"""``SqliteStore``: the durable store for one machine, on the standard library's ``sqlite3``.

Any number of store objects, in any threads and processes, may share one database file.
One store object holds one connection; threads may share it, and its calls then take
turns (each holds the object's lock), so a transaction never sees another thread's
statements. ``":memory:"`` is a private database of one store object, gone when it
closes.

Schema (version :data:`SCHEMA_VERSION`, created on first open; :data:`MIGRATIONS` is a
list whose index is the version it upgrades from, recorded in ``harel_store_schema``):

- ``executions(id, version, epoch, body)``: the codec's blob beside its broken-out
  ``version`` and the writer ``epoch``.
- ``outbox(seq, target_id, event, lease_until)`` and ``spawns(seq, parent_id, child_id,
  root_path, context, lease_until)``: ``seq`` an ``AUTOINCREMENT`` key, so seqs start at 1,
  are never reused and leave no gap (a refused commit rolls back, allocating nothing).
- ``processed(execution_id, event_id)``: the dedupe marks.
- ``timers(seq, execution_id, path, fire_at, lease_until)``: ``seq`` is the arming
  order; re-arming replaces the row, so it gets a new ``seq`` and no lease.
- ``trace(n, execution_id, idx, step)`` and ``trace_index(execution_id, next_index,
  steps)``: the ring, trimmed in SQL, and the per-execution monotonic index. A step is
  stored as it was handed; ``idx`` is the index it was stamped with, added on read when
  the step carries no ``"index"`` of its own.
- ``commit_ids(execution_id, commit_id, digest, version)``: a SHA-256 of the commit's body
  in the codec's canonical encoding, and the version the commit produced.
- ``work(n)``: a counter bumped by each commit that enqueues outbox or spawn entries or
  arms a timer; :meth:`SqliteStore.wait_for_work` polls it.

Every write is one ``BEGIN IMMEDIATE`` transaction: it takes the write lock before it
reads, so two writers never both read a version and then race to write it, and a busy
database is waited out by the busy timeout (a deferred ``BEGIN`` that upgrades a read
lock fails at once with "database is locked" instead). Under that lock the CAS is
``UPDATE ... WHERE id = ? AND version = ?``, or an ``INSERT`` when no row exists; of two
writers at the same version exactly one wins, in any processes. The database runs in WAL
mode, so readers never wait for the writer.

Costs, for a database of N executions: ``load``, ``save``, ``commit``, ``is_processed``,
``delete_timer``, acks and ``forget`` are index lookups (``O(log N)`` each, plus what the
call writes); ``commit`` trims the trace ring by deleting just the overflow;
``due_timers``/``claim_due_timers`` walk the ``(fire_at, seq)`` index over the due timers
only; ``claim_outbox``/``claim_spawns`` walk the seq order over the leased entries they
skip and the ones they return; ``pending_*`` and ``read_trace`` read what they return;
``stats`` counts rows, ``O(N)``, about a millisecond per hundred thousand rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from . import _checks, _codec, _transfer
from ._codec import JSON, Codec, JsonCodec
from ._digest import Digest
from ._errors import IdempotencyConflict, StaleWriter, StoreConflict, StoreError
from ._records import DEFAULT_TRACE_MAX, OutboxEntry, SpawnEntry, TimerOp

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "JSON",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AsyncSqliteStore",
    "Codec",
    "JsonCodec",
    "SqliteStore",
]

SCHEMA_TABLE = "harel_store_schema"

# MIGRATIONS[v] takes a database from schema version v to v + 1; never edit a released one.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        f"CREATE TABLE {SCHEMA_TABLE} (version INTEGER NOT NULL)",
        f"INSERT INTO {SCHEMA_TABLE} (version) VALUES (0)",
        (
            "CREATE TABLE executions ("
            " id TEXT PRIMARY KEY, version INTEGER NOT NULL, epoch INTEGER, body BLOB NOT NULL)"
        ),
        (
            "CREATE TABLE outbox ("
            " seq INTEGER PRIMARY KEY AUTOINCREMENT, target_id TEXT, event BLOB NOT NULL,"
            " lease_until REAL NOT NULL DEFAULT 0)"
        ),
        (
            "CREATE TABLE spawns ("
            " seq INTEGER PRIMARY KEY AUTOINCREMENT, parent_id TEXT NOT NULL,"
            " child_id TEXT NOT NULL, root_path BLOB NOT NULL, context BLOB NOT NULL,"
            " lease_until REAL NOT NULL DEFAULT 0)"
        ),
        (
            "CREATE TABLE processed ("
            " execution_id TEXT NOT NULL, event_id TEXT NOT NULL,"
            " PRIMARY KEY (execution_id, event_id)) WITHOUT ROWID"
        ),
        (
            "CREATE TABLE timers ("
            " seq INTEGER PRIMARY KEY AUTOINCREMENT, execution_id TEXT NOT NULL,"
            " path TEXT NOT NULL, fire_at REAL NOT NULL, lease_until REAL NOT NULL DEFAULT 0,"
            " UNIQUE (execution_id, path))"
        ),
        "CREATE INDEX timers_by_fire_at ON timers (fire_at, seq)",
        (
            "CREATE TABLE trace ("
            " n INTEGER PRIMARY KEY, execution_id TEXT NOT NULL, idx INTEGER NOT NULL,"
            " step BLOB NOT NULL)"
        ),
        "CREATE INDEX trace_by_execution ON trace (execution_id, n)",
        (
            "CREATE TABLE trace_index ("
            " execution_id TEXT PRIMARY KEY, next_index INTEGER NOT NULL,"
            " steps INTEGER NOT NULL) WITHOUT ROWID"
        ),
        (
            "CREATE TABLE commit_ids ("
            " execution_id TEXT NOT NULL, commit_id TEXT NOT NULL, digest BLOB NOT NULL,"
            " version INTEGER NOT NULL, PRIMARY KEY (execution_id, commit_id)) WITHOUT ROWID"
        ),
        "CREATE TABLE work (id INTEGER PRIMARY KEY CHECK (id = 1), n INTEGER NOT NULL)",
        "INSERT INTO work (id, n) VALUES (1, 0)",
    ),
]
SCHEMA_VERSION = len(MIGRATIONS)
# What the migrations make, by name: a database at SCHEMA_VERSION must hold all of it.
SCHEMA_OBJECTS = frozenset(
    sql.split()[2] for step in MIGRATIONS for sql in step if sql.startswith("CREATE ")
)

SYNCHRONOUS = ("NORMAL", "FULL")
BUSY_TIMEOUT_MAX = (2**31 - 1) / 1000  # SQLite's busy timeout is an int of milliseconds
_MEMORY = ":memory:"
_POLL_FIRST = 0.002  # wait_for_work: the first pause between two looks at the counter,
_POLL_MAX = 0.02  # doubled up to this one (the latency of a wake-up)
_LOOK_GRACE = 0.1  # AsyncSqliteStore.wait_for_work: how long past its timeout a look may take

_CAS = "UPDATE executions SET version = ?, body = ? WHERE id = ? AND version = ?"
_CAS_EPOCH = (
    "UPDATE executions SET version = ?, body = ?, epoch = ?"
    " WHERE id = ? AND version = ? AND (epoch IS NULL OR epoch <= ?)"
)
_FIND = "SELECT version, epoch FROM executions WHERE id = ?"
_LOAD = "SELECT version, body FROM executions WHERE id = ?"
_INSERT = "INSERT INTO executions (id, version, epoch, body) VALUES (?, ?, ?, ?)"
_EMIT = "INSERT INTO outbox (target_id, event) VALUES (?, ?)"
_MARK = "INSERT OR IGNORE INTO processed (execution_id, event_id) VALUES (?, ?)"
_ARM = "INSERT OR REPLACE INTO timers (execution_id, path, fire_at) VALUES (?, ?, ?)"
_DISARM = "DELETE FROM timers WHERE execution_id = ? AND path = ?"
_SPAWN = "INSERT INTO spawns (parent_id, child_id, root_path, context) VALUES (?, ?, ?, ?)"
_DONE = "SELECT digest, version FROM commit_ids WHERE execution_id = ? AND commit_id = ?"
_RECORD = "INSERT INTO commit_ids (execution_id, commit_id, digest, version) VALUES (?, ?, ?, ?)"
_BUMP = "UPDATE work SET n = n + 1"
_TRACE_INDEX = "SELECT next_index, steps FROM trace_index WHERE execution_id = ?"
_FORGET = tuple(
    f"DELETE FROM {table} WHERE {column} = ?"
    for table, column in (
        ("executions", "id"),
        ("processed", "execution_id"),
        ("timers", "execution_id"),
        ("trace", "execution_id"),
        ("trace_index", "execution_id"),
        ("commit_ids", "execution_id"),
    )
)
_STATS = "SELECT " + ", ".join(
    f"(SELECT count(*) FROM {table})"
    for table in ("executions", "outbox", "spawns", "timers", "processed", "trace_index", "trace")
)
_STATS_KEYS = ("executions", "outbox", "spawns", "timers", "processed", "traces", "trace_steps")
_CLAIM = {
    "outbox": (
        "SELECT seq, target_id, event FROM outbox WHERE lease_until <= ? ORDER BY seq LIMIT ?",
        "UPDATE outbox SET lease_until = ? WHERE seq = ?",
    ),
    "spawns": (
        (
            "SELECT seq, parent_id, child_id, root_path, context FROM spawns"
            " WHERE lease_until <= ? ORDER BY seq LIMIT ?"
        ),
        "UPDATE spawns SET lease_until = ? WHERE seq = ?",
    ),
}
_CLAIM_TIMERS = (
    "SELECT seq, execution_id, path, fire_at FROM timers"
    " WHERE fire_at <= ? AND lease_until <= ? ORDER BY fire_at, seq LIMIT ?"
)
_LEASE_TIMER = "UPDATE timers SET lease_until = ? WHERE seq = ?"


# Copying (SqliteStore._dump and _restore): the tables a copy reads and writes, and the
# names of what they hold.
_COPIED = (
    ("executions", "executions"), ("processed", "processed marks"), ("commit_ids", "commit ids"),
    ("trace_index", "trace rings"), ("timers", "timers"), ("outbox", "outbox entries"),
    ("spawns", "spawn intents"),
)  # fmt: skip
_HELD = "SELECT " + ", ".join(f"(SELECT count(*) FROM {table})" for table, _ in _COPIED)
_HELD_KEYS = tuple(what for _, what in _COPIED)
_DUMP_TOTAL = "SELECT 1 + " + " + ".join(f"(SELECT count(*) FROM {t})" for t, _ in _COPIED)
_LAST_SEQS = "SELECT name, seq FROM sqlite_sequence WHERE name IN ('outbox', 'spawns')"
_SEQ_UPDATE = "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?"
_RESTORE_MARK = "INSERT INTO processed (execution_id, event_id) VALUES (?, ?)"
_RESTORE_STEP = "INSERT INTO trace (execution_id, idx, step) VALUES (?, ?, ?)"
_RESTORE_RING = "INSERT INTO trace_index (execution_id, next_index, steps) VALUES (?, ?, ?)"
_RESTORE_TIMER = "INSERT INTO timers (execution_id, path, fire_at) VALUES (?, ?, ?)"
_RESTORE_EMIT = "INSERT INTO outbox (seq, target_id, event) VALUES (?, ?, ?)"
_RESTORE_SPAWN = (
    "INSERT INTO spawns (seq, parent_id, child_id, root_path, context) VALUES (?, ?, ?, ?, ?)"
)
# The statement of a restore per kind of row of _transfer.durable_rows, each with a batch of
# rows (no table refers to another).
_RESTORE = {
    "execution": _INSERT, "mark": _RESTORE_MARK, "commit": _RECORD, "step": _RESTORE_STEP,
    "trace": _RESTORE_RING, "timer": _RESTORE_TIMER, "outbox": _RESTORE_EMIT,
    "spawn": _RESTORE_SPAWN,
}  # fmt: skip
_BATCH = 500  # rows per executemany while restoring


def _closed() -> ValueError:
    return ValueError("I/O operation on a closed store")


def _uri(path: str) -> str:
    """What ``sqlite3.connect`` is given for ``path``: a ``file:`` URI that names the file
    and nothing else. A SQLite built with ``SQLITE_USE_URI`` would read a path that starts
    with ``file:`` as a URI itself (``file::memory:``, ``file:x.db?mode=ro``)."""
    if path == _MEMORY:
        return path
    quoted = urllib.parse.quote_from_bytes(os.fsencode(path), safe="/")
    # "file://" starts an authority: an absolute path follows an empty one.
    return f"file://{quoted}" if quoted.startswith("/") else f"file:{quoted}"


def _options(
    path: Any, trace_max: Any, codec: Any, synchronous: Any, busy_timeout: Any, clock: Any
) -> tuple[str, int | None, Any, str, float, Callable[[], float]]:
    """The constructor's arguments, checked (shared by the sync and async stores)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    if not path:
        raise ValueError("path must not be empty (':memory:' opens a private in-memory database)")
    if "\0" in path:  # in a URI, SQLite would end the file name there
        raise ValueError(f"path must not hold a NUL character, got {path!r}")
    if path.endswith(os.sep) or (os.altsep is not None and path.endswith(os.altsep)):
        raise ValueError(f"path must name a file, not a directory: {path!r} ends with a separator")
    size = _checks.as_trace_max(trace_max)
    if codec is None:
        codec = JSON
    else:
        _checks.as_codec(codec)
    if not isinstance(synchronous, str):
        raise TypeError(f"synchronous must be a str, got {type(synchronous).__name__}")
    if synchronous.upper() not in SYNCHRONOUS:
        raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
    timeout = _checks.as_time(busy_timeout, "busy_timeout")
    if not timeout > 0.0:
        raise ValueError(f"busy_timeout must be a positive number of seconds, got {busy_timeout!r}")
    if timeout > BUSY_TIMEOUT_MAX:
        raise ValueError(
            f"busy_timeout must be at most {BUSY_TIMEOUT_MAX} seconds (SQLite's limit, "
            f"2**31 - 1 milliseconds: about 24.8 days), got {busy_timeout!r}"
        )
    if clock is None:
        clock = time.time
    elif not callable(clock):
        raise TypeError(f"clock must be a function giving seconds, got {type(clock).__name__}")
    return path, size, codec, synchronous.upper(), timeout, clock


class SqliteStore(_transfer.Uncopyable):
    """The durable ``ExecutionStore`` for one machine (see the module docstring).

    ``path`` is a database file, created if missing, or ``":memory:"``; it is always a
    file name, never a URI (``"file:x.db"`` is the file of that name). ``codec``
    encodes executions and values (default: :data:`JSON`; see :class:`JsonCodec` for the
    protocol and how to plug in an execution class of one's own).
    ``synchronous`` is SQLite's: ``"NORMAL"`` (a commit survives the process being
    killed; the last commits before a power loss or OS crash may be lost) or ``"FULL"``
    (an fsync per commit: it survives those too). ``busy_timeout`` is how long a call
    waits for another writer before it gives up, in seconds, at most
    :data:`BUSY_TIMEOUT_MAX` (about 24.8 days). ``clock`` gives the wall-clock seconds
    that leases are timed by (``time.time``: it must agree across processes); a claim reads
    it once it holds the write lock, so waiting for that lock takes nothing off the lease.

    A failure of the database itself (a file this process may read but not write, a
    damaged file, a full disk) raises :class:`~harel_store.StoreError` chaining the
    driver's error; a write that fails writes nothing.
    """

    preserves_identity = False
    durable = True
    _copy_hint = "open another store on the same file"

    __slots__ = (
        "__weakref__",
        "_canonical",
        "_clock",
        "_codec",
        "_conn",
        "_lock",
        "_path",
        "_seen_work",
        "_trace_max",
    )

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
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.RLock()  # re-entrant: caller code runs under it
        path, size, codec, synchronous, timeout, clock = _options(
            path, trace_max, codec, synchronous, busy_timeout, clock
        )
        self._path = path
        self._trace_max = size
        self._codec = codec
        self._canonical = getattr(codec, "canonical_value", None) or codec.encode_value
        self._clock = clock
        try:
            conn = sqlite3.connect(
                _uri(path),
                uri=True,
                timeout=timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite database {path!r}: {exc}") from exc
        try:
            _prepare(conn, path, synchronous, timeout)
            self._seen_work = conn.execute("SELECT n FROM work").fetchone()[0]
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"cannot open the SQLite database {path!r}: {exc}") from exc
            raise
        self._conn = conn

    def __repr__(self) -> str:
        state = "closed" if self._conn is None else "open"
        return f"<{type(self).__name__} {self._path!r} {state}>"

    def __enter__(self) -> Self:
        if self._conn is None:
            raise _closed()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def path(self) -> str:
        """The database file, or ``":memory:"``."""
        return self._path

    @property
    def trace_max(self) -> int | None:
        """Steps kept per execution; ``0``/``None`` keeps all. A change applies to an
        execution's ring at its next append."""
        return self._trace_max

    @trace_max.setter
    def trace_max(self, value: int | None) -> None:
        self._trace_max = _checks.as_trace_max(value)

    # --- executions --------------------------------------------------------------------

    def load(self, execution_id: str) -> Any:
        """A new object decoded from the stored execution, with the stored ``version``;
        ``None`` when there is none."""
        if self._conn is None:
            raise _closed()
        _id(execution_id, "execution_id")
        with self._lock:  # _read_one, inlined: a load is the hottest read
            conn = self._conn
            if conn is None:
                raise _closed()
            try:
                row = conn.execute(_LOAD, (execution_id,)).fetchone()
            except sqlite3.Error as exc:
                raise _read_failed(self._path, exc) from exc
        if row is None:
            return None
        exe = self._codec.decode_execution(row[1])
        exe.version = row[0]
        return exe

    def save(self, exe: Any, *, epoch: int | None = None) -> None:
        """CAS-write ``exe`` and bump ``exe.version``: it succeeds when no row exists for
        ``exe.id`` or the stored version equals ``exe.version``, else raises
        :class:`StoreConflict`. With ``epoch``, a greater stored epoch raises
        :class:`StaleWriter` first; a greater ``epoch`` is stored."""
        if self._conn is None:
            raise _closed()
        eid = _checks.durable_exe_id(exe)
        _text(eid, "execution id")
        if epoch is not None:
            epoch = _checks.durable_epoch(epoch)
        version = _checks.durable_exe_version(exe)
        blob = self._encode_exe(exe, eid)
        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            _begin(conn, self._path)
            try:
                _cas(conn, eid, version, blob, epoch)
                _checks.set_version(exe, version + 1)
                conn.execute("COMMIT")
            except BaseException as exc:
                _rollback(conn, exe, version)
                if isinstance(exc, sqlite3.Error):
                    raise _write_failed(self._path, exc) from exc
                raise

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
        """The event-boundary write, in one transaction: save ``exe`` (CAS), enqueue
        ``emits``, mark ``processed_event_id``, apply ``timers``, enqueue ``spawns``,
        record ``trace``. All or nothing, and durable once it returns.

        With ``commit_id``, a commit this execution already applied with an equal body
        writes nothing and sets ``exe.version`` to the version it produced; another body
        raises :class:`IdempotencyConflict`. That check comes before the epoch check
        (:class:`StaleWriter`) and the CAS (:class:`StoreConflict`).
        """
        if self._conn is None:
            raise _closed()
        eid = _checks.durable_exe_id(exe)
        body = _checks.commit_body(emits, processed_event_id, timers, spawns, trace, str_ids=True)
        if commit_id is not None:
            commit_id = _checks.as_commit_id(commit_id)
        _texts(eid, body, commit_id)
        if epoch is not None:
            epoch = _checks.durable_epoch(epoch)
        version = _checks.durable_exe_version(exe)

        # Encode everything before the transaction: a value the codec refuses is a
        # TypeError naming it, and nothing is written.
        blob = self._encode_exe(exe, eid)
        encode = self._encode
        events = [
            (target, encode(event, "the event of emits", i))
            for i, (target, event) in enumerate(body.emits)
        ]
        born = [
            (
                eid,
                child_id,
                encode(root_path, "the root_path of spawns", i),
                encode(context, "the context of spawns", i),
            )
            for i, (child_id, root_path, context) in enumerate(body.spawns)
        ]
        step = None if body.trace is None else encode(body.trace, "the trace step")
        digest = None if commit_id is None else self._digest(body, commit_id)
        armed = False
        for op in body.timers:
            if op[0] == "schedule":
                armed = True
                break

        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            _begin(conn, self._path)
            try:
                if digest is not None:
                    done = conn.execute(_DONE, (eid, commit_id)).fetchone()
                    if done is not None:
                        conn.execute("ROLLBACK")
                        if done[0] != digest:
                            raise IdempotencyConflict(eid, commit_id)  # type: ignore[arg-type]
                        _checks.set_version(exe, done[1])
                        return
                new = version + 1
                _cas(conn, eid, version, blob, epoch)
                if events:
                    if len(events) == 1:
                        conn.execute(_EMIT, events[0])
                    else:
                        conn.executemany(_EMIT, events)
                if body.processed_event_id is not None:
                    conn.execute(_MARK, (eid, body.processed_event_id))
                for action, path, fire_at in body.timers:
                    if action == "schedule":
                        conn.execute(_ARM, (eid, path, fire_at))
                    else:
                        conn.execute(_DISARM, (eid, path))
                if born:
                    conn.executemany(_SPAWN, born)
                if step is not None:
                    self._push_step(conn, eid, step)
                if digest is not None:
                    conn.execute(_RECORD, (eid, commit_id, digest, new))
                if events or born or armed:
                    conn.execute(_BUMP)
                _checks.set_version(exe, new)
                conn.execute("COMMIT")
            except BaseException as exc:
                _rollback(conn, exe, version)
                if isinstance(exc, sqlite3.Error):
                    raise _write_failed(self._path, exc) from exc
                raise

    def is_processed(self, execution_id: str, event_id: str) -> bool:
        """Whether a commit of ``execution_id`` recorded ``event_id`` as handled."""
        if self._conn is None:
            raise _closed()
        _id(execution_id, "execution_id")
        _id(event_id, "event_id")
        row = self._read_one(
            "SELECT 1 FROM processed WHERE execution_id = ? AND event_id = ?",
            (execution_id, event_id),
        )
        return row is not None

    # --- outbox and spawns -------------------------------------------------------------

    def pending_outbox(self) -> list[OutboxEntry]:
        """The unacked outbox entries, oldest first, leased ones included."""
        rows = self._read("SELECT seq, target_id, event FROM outbox ORDER BY seq", ())
        return self._outbox_entries(rows)

    def ack_outbox(self, seq: int) -> None:
        """Drop the outbox entry ``seq`` (ending its lease); an unknown or already-acked
        seq is a no-op."""
        if self._conn is None:
            raise _closed()
        if type(seq) is not int:
            seq = _checks.as_int(seq, "seq")
        if _checks.INT64_MIN <= seq <= _checks.INT64_MAX:  # any other int is no seq of ours
            self._write_one("DELETE FROM outbox WHERE seq = ?", (seq,))

    def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        """Lease up to ``limit`` unacked outbox entries that no live lease holds, oldest
        first, for ``lease`` seconds: until then no claim of any store object on this
        database returns them; unacked after it, they are claimable again."""
        return self._outbox_entries(self._claim("outbox", limit, lease))

    def pending_spawns(self) -> list[SpawnEntry]:
        """The unacked spawn intents, oldest first, leased ones included."""
        rows = self._read(
            "SELECT seq, parent_id, child_id, root_path, context FROM spawns ORDER BY seq", ()
        )
        return self._spawn_entries(rows)

    def ack_spawn(self, seq: int) -> None:
        """Drop the spawn intent ``seq`` (ending its lease); an unknown or already-acked
        seq is a no-op."""
        if self._conn is None:
            raise _closed()
        if type(seq) is not int:
            seq = _checks.as_int(seq, "seq")
        if _checks.INT64_MIN <= seq <= _checks.INT64_MAX:  # any other int is no seq of ours
            self._write_one("DELETE FROM spawns WHERE seq = ?", (seq,))

    def claim_spawns(self, limit: int = 100, *, lease: float = 30.0) -> list[SpawnEntry]:
        """:meth:`claim_outbox` for the spawn intents."""
        return self._spawn_entries(self._claim("spawns", limit, lease))

    # --- timers ------------------------------------------------------------------------

    def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        """``(execution_id, path, fire_at)`` of every armed timer with ``fire_at <= now``,
        oldest ``fire_at`` first (ties in arming order), leased ones included."""
        if self._conn is None:
            raise _closed()
        now = _checks.as_now(now)
        return self._read(
            "SELECT execution_id, path, fire_at FROM timers WHERE fire_at <= ?"
            " ORDER BY fire_at, seq",
            (now,),
        )

    def claim_due_timers(
        self, now: float, limit: int = 100, *, lease: float = 30.0
    ) -> list[tuple[str, str, float]]:
        """Lease up to ``limit`` due timers that no live lease holds, oldest ``fire_at``
        first, for ``lease`` seconds (see :meth:`claim_outbox`). Deleting or re-arming a
        timer ends its lease."""
        if self._conn is None:
            raise _closed()
        now = _checks.as_now(now)
        limit = _checks.as_limit(limit)
        lease = _checks.as_lease(lease)
        if not limit:
            return []
        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            _begin(conn, self._path)
            try:
                clock = self._now()  # under the write lock: waiting for it takes no lease time
                rows = conn.execute(_CLAIM_TIMERS, (now, clock, limit)).fetchall()
                if rows:
                    until = clock + lease
                    conn.executemany(_LEASE_TIMER, [(until, row[0]) for row in rows])
                conn.execute("COMMIT")
            except BaseException as exc:
                _rollback(conn)
                if isinstance(exc, sqlite3.Error):
                    raise _write_failed(self._path, exc) from exc
                raise
        return [row[1:] for row in rows]

    def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        """Disarm the timer only if it still fires at ``fire_at``, so a sweep that read it
        before a re-arm cannot delete the re-armed timer. Ends its lease."""
        if self._conn is None:
            raise _closed()
        _id(execution_id, "execution_id")
        _id(path, "path")
        fire_at = _checks.as_time(fire_at, "fire_at")
        self._write_one(
            "DELETE FROM timers WHERE execution_id = ? AND path = ? AND fire_at = ?",
            (execution_id, path, fire_at),
        )

    # --- trace -------------------------------------------------------------------------

    def append_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        """Record a trace step for ``execution_id`` outside a commit."""
        self._record_trace(execution_id, entry)

    def read_trace(self, execution_id: str) -> list[dict[str, Any]]:
        """The recent steps of ``execution_id``, oldest first, decoded anew (or ``[]``)."""
        if self._conn is None:
            raise _closed()
        _id(execution_id, "execution_id")
        rows = self._read(
            "SELECT idx, step FROM trace WHERE execution_id = ? ORDER BY n", (execution_id,)
        )
        decode = self._codec.decode_value
        steps = []
        for index, data in rows:
            step = decode(data)
            if "index" not in step:
                step["index"] = index
            steps.append(step)
        return steps

    # --- retention, monitoring, wake-ups -----------------------------------------------

    def forget(self, execution_id: str) -> None:
        """Drop an execution with its processed marks, armed timers, trace ring, trace
        index, commit ids and writer epoch, in one transaction. Pending outbox and spawn
        entries stay: they are owed to a relay. An unknown id is a no-op."""
        if self._conn is None:
            raise _closed()
        _id(execution_id, "execution_id")
        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            _begin(conn, self._path)
            try:
                for sql in _FORGET:
                    conn.execute(sql, (execution_id,))
                conn.execute("COMMIT")
            except BaseException as exc:
                _rollback(conn)
                if isinstance(exc, sqlite3.Error):
                    raise _write_failed(self._path, exc) from exc
                raise

    def stats(self) -> dict[str, int]:
        """Counts for monitoring, read in one snapshot (each a count of rows)."""
        return dict(zip(_STATS_KEYS, self._read_one(_STATS, ())))

    def wait_for_work(self, timeout: float) -> bool:
        """``True`` as soon as any store object on this database has committed outbox or
        spawn entries or armed a timer since this object was opened or since its previous
        ``wait_for_work`` returned; ``False`` after ``timeout`` seconds without one. It
        looks at a counter row, pausing 2 ms between looks at first and up to 20 ms."""
        if self._conn is None:
            raise _closed()
        timeout = _checks.as_timeout(timeout)
        deadline = time.monotonic() + timeout
        pause = _POLL_FIRST
        while not self._take_work():
            left = deadline - time.monotonic()
            if left <= 0.0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2.0, _POLL_MAX)
        return True

    def close(self) -> None:
        """Close the database connection; a second close does nothing. Every other method
        of a closed store raises ``ValueError``."""
        with self._lock:
            conn = self._conn
            if conn is not None:
                self._conn = None
                conn.close()

    def _record_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        if self._conn is None:
            raise _closed()
        step = _checks.trace_step(entry, "trace entry")
        _id(execution_id, "execution_id")
        data = self._encode(step, "the trace entry")
        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            _begin(conn, self._path)
            try:
                self._push_step(conn, execution_id, data)
                conn.execute("COMMIT")
            except BaseException as exc:
                _rollback(conn)
                if isinstance(exc, sqlite3.Error):
                    raise _write_failed(self._path, exc) from exc
                raise

    # --- copying (harel_store.copy_store) ----------------------------------------------

    def _dump(self) -> Iterator[tuple[Any, ...]]:
        """Everything the database holds, as the records of :mod:`harel_store._copy`,
        read in one read transaction: a snapshot, while other store objects go on
        writing. This object's lock is held until the iterator is exhausted or closed, so
        other threads' calls on it wait meanwhile. Commit bodies come as
        :class:`~harel_store.Digest` objects of the codec's canonical encoding."""
        if self._conn is None:
            raise _closed()
        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            conn.execute("BEGIN")  # deferred: the snapshot is taken by the first read
            try:
                yield ("total", conn.execute(_DUMP_TOTAL).fetchone()[0])
                decode_exe = self._codec.decode_execution
                decode = self._codec.decode_value
                for version, epoch, data in conn.execute(
                    "SELECT version, epoch, body FROM executions"
                ):
                    exe = decode_exe(data)
                    exe.version = version
                    yield ("execution", exe, epoch)
                for eid, event_id in conn.execute("SELECT execution_id, event_id FROM processed"):
                    yield ("mark", eid, event_id)
                canonical = self._canonical
                for eid, commit_id, version, digest in conn.execute(
                    "SELECT execution_id, commit_id, version, digest FROM commit_ids"
                ):
                    yield ("commit", eid, commit_id, version, Digest(bytes(digest), canonical))
                # The rings: trace_index and trace, both in execution id order, merged.
                steps = conn.execute(
                    "SELECT execution_id, idx, step FROM trace ORDER BY execution_id, n"
                )
                row = steps.fetchone()
                for eid, next_index in conn.execute(
                    "SELECT execution_id, next_index FROM trace_index ORDER BY execution_id"
                ):
                    ring = []
                    while row is not None and row[0] < eid:  # a step of no ring: none is
                        row = steps.fetchone()
                    while row is not None and row[0] == eid:
                        step = decode(row[2])
                        if "index" not in step:
                            step["index"] = row[1]
                        ring.append(step)
                        row = steps.fetchone()
                    yield ("trace", eid, next_index, ring)
                steps.close()
                for timer in conn.execute(
                    "SELECT execution_id, path, fire_at FROM timers ORDER BY seq"
                ):
                    yield ("timer", *timer)
                for seq, target, event in conn.execute(
                    "SELECT seq, target_id, event FROM outbox ORDER BY seq"
                ):
                    yield ("outbox", OutboxEntry(seq, target, decode(event)))
                for seq, parent, child, root_path, context in conn.execute(
                    "SELECT seq, parent_id, child_id, root_path, context FROM spawns ORDER BY seq"
                ):
                    entry = SpawnEntry(seq, parent, child, decode(root_path), decode(context))
                    yield ("spawn", entry)
                last = dict(conn.execute(_LAST_SEQS).fetchall())
                yield ("seqs", last.get("outbox", 0), last.get("spawns", 0))
            except sqlite3.Error as exc:
                raise _read_failed(self._path, exc) from exc
            finally:
                if self._conn is conn and conn.in_transaction:
                    conn.execute("ROLLBACK")

    def _restore(self, records: Iterable[tuple[Any, ...]]) -> None:
        """Write the records of :mod:`harel_store._copy` into this empty database (else
        :class:`~harel_store.StoreError`) in one transaction, which checks emptiness
        first: all or nothing. Ids must be ``str`` (else ``TypeError``); commit bodies are
        digested with this store's codec (a :class:`~harel_store.Digest` of the same
        encoding is taken as it is); each ring keeps its last ``trace_max`` steps. Seq
        counters continue after the copied ones; waiting relays are woken."""
        if self._conn is None:
            raise _closed()
        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            _begin(conn, self._path)
            try:
                held = conn.execute(_HELD).fetchone()
                if any(held):
                    raise _transfer.not_empty(self, dict(zip(_HELD_KEYS, held)))
                try:
                    self._write_records(conn, records)
                except sqlite3.IntegrityError as exc:
                    raise ValueError(
                        f"the records to copy hold the same thing twice ({exc}); "
                        "nothing was written"
                    ) from None
                except UnicodeEncodeError as exc:  # the driver's, binding an id
                    raise _not_utf8(exc.object, exc.start, "a text of a record to copy") from None
                conn.execute("COMMIT")
            except BaseException as exc:
                if self._conn is conn:
                    _rollback(conn)
                if isinstance(exc, sqlite3.Error):
                    raise _write_failed(self._path, exc) from exc
                raise

    def _write_records(self, conn: sqlite3.Connection, records: Iterable[Any]) -> None:
        """:meth:`_restore`'s writes, inside its transaction, in batches per table."""
        batches: dict[str, list[tuple[Any, ...]]] = {sql: [] for sql in _RESTORE.values()}

        def add(sql: str, row: tuple[Any, ...]) -> None:
            batch = batches[sql]
            batch.append(row)
            if len(batch) >= _BATCH:
                conn.executemany(sql, batch)
                batch.clear()

        seqs: tuple[int, int] = (0, 0)
        rows = _transfer.durable_rows(
            records, encode=self._encode, encode_exe=self._encode_exe,
            canonical=self._canonical, digest=self._digest, keep=self._trace_max,
        )  # fmt: skip
        for kind, row in rows:
            if kind == "seqs":
                seqs = row
            else:
                add(_RESTORE[kind], row)
        for sql, batch in batches.items():
            if batch:
                conn.executemany(sql, batch)
        # AUTOINCREMENT continues after the greatest seq it has seen or been told of.
        for table, last in zip(("outbox", "spawns"), seqs):
            if conn.execute(_SEQ_UPDATE, (last, table)).rowcount == 0 and last:
                conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, last))
        work = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM outbox) OR EXISTS (SELECT 1 FROM spawns)"
            " OR EXISTS (SELECT 1 FROM timers)"
        ).fetchone()[0]
        if work:
            conn.execute(_BUMP)

    # --- helpers -----------------------------------------------------------------------

    def _take_work(self) -> bool:
        """Whether the work counter moved since this object last saw it (and see it)."""
        with self._lock:
            n = self._work_count()
            if n == self._seen_work:
                return False
            self._seen_work = n
            return True

    def _work_count(self) -> int:
        """The work counter, marking nothing seen."""
        n: int = self._read_one("SELECT n FROM work", ())[0]
        return n

    def _now(self) -> float:
        now = self._clock()
        if type(now) is not float or now - now != 0.0:
            now = _checks.as_clock(now)
        return now

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            try:
                return conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise _read_failed(self._path, exc) from exc

    def _read_one(self, sql: str, params: tuple[Any, ...]) -> Any:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            try:
                return conn.execute(sql, params).fetchone()
            except sqlite3.Error as exc:
                raise _read_failed(self._path, exc) from exc

    def _write_one(self, sql: str, params: tuple[Any, ...]) -> None:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            _begin(conn, self._path)
            try:
                conn.execute(sql, params)
                conn.execute("COMMIT")
            except BaseException as exc:
                _rollback(conn)
                if isinstance(exc, sqlite3.Error):
                    raise _write_failed(self._path, exc) from exc
                raise

    def _claim(self, table: str, limit: Any, lease: Any) -> list[tuple[Any, ...]]:
        if self._conn is None:
            raise _closed()
        limit = _checks.as_limit(limit)
        lease = _checks.as_lease(lease)
        if not limit:
            return []
        select, update = _CLAIM[table]
        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            _begin(conn, self._path)
            try:
                clock = self._now()  # under the write lock: waiting for it takes no lease time
                rows = conn.execute(select, (clock, limit)).fetchall()
                if rows:
                    until = clock + lease
                    conn.executemany(update, [(until, row[0]) for row in rows])
                conn.execute("COMMIT")
            except BaseException as exc:
                _rollback(conn)
                if isinstance(exc, sqlite3.Error):
                    raise _write_failed(self._path, exc) from exc
                raise
        return rows

    def _outbox_entries(self, rows: list[Any]) -> list[OutboxEntry]:
        decode = self._codec.decode_value
        return [OutboxEntry(seq, target, decode(event)) for seq, target, event in rows]

    def _spawn_entries(self, rows: list[Any]) -> list[SpawnEntry]:
        decode = self._codec.decode_value
        return [
            SpawnEntry(seq, parent, child, decode(root_path), decode(context))
            for seq, parent, child, root_path, context in rows
        ]

    def _push_step(self, conn: sqlite3.Connection, eid: str, data: Any) -> None:
        """Append an encoded step to the ring of ``eid`` and trim the ring to
        ``trace_max``, deleting only the overflow."""
        row = conn.execute(_TRACE_INDEX, (eid,)).fetchone()
        index, steps = (0, 1) if row is None else (row[0], row[1] + 1)
        conn.execute(
            "INSERT INTO trace (execution_id, idx, step) VALUES (?, ?, ?)", (eid, index, data)
        )
        keep = self._trace_max
        if keep and steps > keep:
            conn.execute(
                "DELETE FROM trace WHERE n IN"
                " (SELECT n FROM trace WHERE execution_id = ? ORDER BY n LIMIT ?)",
                (eid, steps - keep),
            )
            steps = keep
        if row is None:
            conn.execute(
                "INSERT INTO trace_index (execution_id, next_index, steps) VALUES (?, 1, 1)", (eid,)
            )
        else:
            conn.execute(
                "UPDATE trace_index SET next_index = ?, steps = ? WHERE execution_id = ?",
                (index + 1, steps, eid),
            )

    def _encode_exe(self, exe: Any, eid: str) -> Any:
        return _codec.encode_execution(self._codec, exe, eid)

    def _encode(self, value: Any, what: str, i: int = -1) -> Any:
        return _codec.encode_value(self._codec, value, what, i)

    def _digest(self, body: _checks.Body, commit_id: str) -> bytes:
        """What a replay of ``commit_id`` is compared with: a SHA-256 of the body in the
        codec's canonical encoding."""
        value = [
            [[target, event] for target, event in body.emits],
            body.processed_event_id,
            [[action, path, fire_at] for action, path, fire_at in body.timers],
            [[child, root, context] for child, root, context in body.spawns],
            body.trace,
        ]
        try:
            data = self._canonical(value)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise TypeError(f"cannot encode the body of commit {commit_id!r}: {exc}") from exc
        if type(data) is str:
            data = data.encode("utf-8", "surrogatepass")
        return hashlib.sha256(data).digest()


def _cas(conn: sqlite3.Connection, eid: str, version: int, blob: Any, epoch: int | None) -> None:
    """Write the execution at ``version + 1`` if no row exists or the row is at
    ``version`` (and, with ``epoch``, claimed at no greater epoch). Call it inside a
    ``BEGIN IMMEDIATE`` transaction."""
    if epoch is None:
        hit = conn.execute(_CAS, (version + 1, blob, eid, version)).rowcount
    else:
        hit = conn.execute(_CAS_EPOCH, (version + 1, blob, epoch, eid, version, epoch)).rowcount
    if hit == 1:
        return
    row = conn.execute(_FIND, (eid,)).fetchone()
    if row is None:
        conn.execute(_INSERT, (eid, version + 1, epoch, blob))
    elif epoch is not None and row[1] is not None and row[1] > epoch:
        raise StaleWriter(eid, epoch, row[1])
    else:
        raise StoreConflict(eid, version, row[0])


def _begin(conn: sqlite3.Connection, path: str) -> None:
    """Open a write transaction, waiting up to ``busy_timeout`` for another writer's lock;
    a lock held longer is a ``StoreError``, not the driver's ``database is locked``."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        if not (isinstance(exc, sqlite3.OperationalError) and _is_busy(exc)):
            raise _write_failed(path, exc) from exc
        raise StoreError(
            f"the SQLite database {path!r} stayed locked by another writer for longer than "
            f"busy_timeout: nothing was written ({exc})"
        ) from exc


def _write_failed(path: str, exc: sqlite3.Error) -> StoreError:
    """The driver's error from a write transaction (rolled back), as the store's own: a
    file it may read but not write, a damaged file, a full disk."""
    return StoreError(f"writing to the SQLite database {path!r} failed, nothing was written: {exc}")


def _read_failed(path: str, exc: sqlite3.Error) -> StoreError:
    return StoreError(f"reading the SQLite database {path!r} failed: {exc}")


def _id(value: Any, what: str) -> None:
    """An id of a durable store (a ``str``) that SQLite can hold (see :func:`_text`)."""
    if type(value) is not str:
        _checks.str_id(value, what)
    _text(value, what)


def _text(text: Any, what: str, i: int = -1) -> None:
    """Refuse a ``str`` that SQLite cannot hold, before anything is written (``what % i``
    names it): the driver hands SQLite text as UTF-8, which has no lone surrogates."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _not_utf8(text, exc.start, what if i < 0 else what % i) from None


def _texts(eid: str, body: _checks.Body, commit_id: str | None) -> None:
    """:func:`_text` for every id of a commit."""
    _text(eid, "execution id")
    if body.processed_event_id is not None:
        _text(body.processed_event_id, "processed_event_id")
    for i, (target, _) in enumerate(body.emits):
        if target is not None:
            _text(target, "emits[%d] target_id", i)
    for i, op in enumerate(body.timers):
        _text(op.path, "timers[%d].path", i)
    for i, spawn in enumerate(body.spawns):
        _text(spawn[0], "spawns[%d] child_id", i)
    if commit_id is not None:
        _text(commit_id, "commit_id")


def _not_utf8(text: str, index: int, what: str) -> ValueError:
    return ValueError(
        f"SQLite text cannot hold lone surrogates: {what} {text!r} has {text[index]!r} "
        f"at index {index}"
    )


def _rollback(conn: sqlite3.Connection, exe: Any = None, version: int | None = None) -> None:
    """Undo the open transaction, and the version a failed commit may have set."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    if exe is not None:
        with contextlib.suppress(Exception):  # the error being raised is the one to show
            if exe.version != version:
                exe.version = version


def _prepare(conn: sqlite3.Connection, path: str, synchronous: str, timeout: float) -> None:
    """:func:`_prepare_once`, tried again while another process holds a lock it needs:
    switching to WAL mode fails at once, without the busy timeout, while another
    connection opens the same fresh file. Each step is safe to repeat."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            _prepare_once(conn, path, synchronous)
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2.0, 0.05)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
    return "locked" in str(exc) or "busy" in str(exc)


def _prepare_once(conn: sqlite3.Connection, path: str, synchronous: str) -> None:
    """Check the schema, refusing a foreign or newer one before changing anything; then
    WAL mode and ``synchronous``; then create or upgrade the schema."""
    version = _schema_version(conn, path)
    if path != _MEMORY:
        conn.execute("PRAGMA journal_mode = WAL").fetchone()
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _schema_version(conn, path)  # another process may have got there first
        for step in range(version, SCHEMA_VERSION):
            for sql in MIGRATIONS[step]:
                conn.execute(sql)
            conn.execute(f"UPDATE {SCHEMA_TABLE} SET version = ?", (step + 1,))
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _schema_version(conn: sqlite3.Connection, path: str) -> int:
    """The schema version of this package's tables, ``0`` for an empty database; a
    ``StoreError`` for a database that is not this package's or is newer than it."""
    names = {
        name
        for (name,) in conn.execute("SELECT name FROM sqlite_master")
        if not name.startswith("sqlite_")
    }
    if SCHEMA_TABLE not in names:
        if names:
            shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
            raise StoreError(
                f"{path!r} is not a harel_store database: it holds {shown} and no "
                f"{SCHEMA_TABLE} table; nothing was changed"
            )
        return 0
    rows = conn.execute(f"SELECT version FROM {SCHEMA_TABLE}").fetchall()
    if len(rows) != 1 or type(rows[0][0]) is not int or rows[0][0] < 0:
        raise StoreError(f"{path!r}: the {SCHEMA_TABLE} table is damaged ({rows[:3]!r})")
    version: int = rows[0][0]
    missing = SCHEMA_OBJECTS - names
    if version == SCHEMA_VERSION and missing:
        raise StoreError(
            f"{path!r}: the harel_store database is damaged: it lacks "
            f"{', '.join(sorted(missing))}; nothing was changed"
        )
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path!r} has harel_store schema version {version}, newer than this "
            f"harel_store's ({SCHEMA_VERSION}): upgrade harel_store to open it; "
            "nothing was changed"
        )
    return version


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
        self._closing: Future[None] | None = None
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
        await self._call(
            "commit",
            exe,
            emits,
            processed_event_id,
            timers,
            spawns,
            trace,
            commit_id=commit_id,
            epoch=epoch,
        )

    async def is_processed(self, execution_id: str, event_id: str) -> bool:
        return await self._call("is_processed", execution_id, event_id)  # type: ignore[no-any-return]

    async def pending_outbox(self) -> list[OutboxEntry]:
        return await self._call("pending_outbox")  # type: ignore[no-any-return]

    async def ack_outbox(self, seq: int) -> None:
        await self._call("ack_outbox", seq)

    async def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        return await self._call("claim_outbox", limit, lease=lease)  # type: ignore[no-any-return]

    async def pending_spawns(self) -> list[SpawnEntry]:
        return await self._call("pending_spawns")  # type: ignore[no-any-return]

    async def ack_spawn(self, seq: int) -> None:
        await self._call("ack_spawn", seq)

    async def claim_spawns(self, limit: int = 100, *, lease: float = 30.0) -> list[SpawnEntry]:
        return await self._call("claim_spawns", limit, lease=lease)  # type: ignore[no-any-return]

    async def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        return await self._call("due_timers", now)  # type: ignore[no-any-return]

    async def claim_due_timers(
        self, now: float, limit: int = 100, *, lease: float = 30.0
    ) -> list[tuple[str, str, float]]:
        return await self._call("claim_due_timers", now, limit, lease=lease)  # type: ignore[no-any-return]

    async def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        await self._call("delete_timer", execution_id, path, fire_at)

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

    async def close(self) -> None:
        """Close the database on the store's thread, after the calls queued before it,
        then let the thread end. The close is queued at once, so it happens even if
        this call is cancelled; a later ``close()`` waits for it."""
        if not self._closed:
            self._closed = True
            self._finalizer.detach()
            self._closing = self._pool.submit(_close_opened, self._opening)
            self._pool.shutdown(wait=False)
        if self._closing is not None:
            await asyncio.shield(asyncio.wrap_future(self._closing))

    def _record_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        """The plain-``def`` recorder, as on every store: it waits for the store's
        thread, so call it off the event loop."""
        if self._closed:
            raise _closed()
        call = functools.partial(self._invoke, "_record_trace", (execution_id, entry), {})
        self._pool.submit(contextvars.copy_context().run, call).result()

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


def _close_opened(opening: Future[SqliteStore]) -> None:
    if opening.exception() is None:
        opening.result().close()
