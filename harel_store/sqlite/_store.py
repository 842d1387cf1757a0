"""``SqliteStore``: the sync store, one connection per store object (see the package
docstring)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .. import _checks, _codec, _transfer
from .._digest import body_digest
from .._errors import IdempotencyConflict, StaleWriter, StoreConflict, StoreError, reason
from .._records import DEFAULT_TRACE_MAX, Commit, OutboxEntry, SpawnEntry, TimerOp
from . import _batch, _copying, _operate
from ._connection import (
    _closed,
    _id,
    _not_utf8,
    _options,
    _read_failed,
    _set_back,
    _text,
    _texts,
    _Transaction,
    _uri,
)
from ._schema import (
    _ARM,
    _BUMP,
    _BUMP_BY,
    _CAS,
    _CAS_EPOCH,
    _CLAIM,
    _CLAIM_TIMERS,
    _DISARM,
    _DONE,
    _EMIT,
    _FIND,
    _FORGET,
    _INSERT,
    _LEASE_TIMER,
    _LOAD,
    _MARK,
    _NEW_RING,
    _RING,
    _SPAWN,
    _STATS,
    _STATS_KEYS,
    _STEP,
    _TRACE_INDEX,
    _TRIM,
    _prepare,
    _work_counter,
)

if TYPE_CHECKING:
    from typing_extensions import Self

_CLAIM_ID = (
    "INSERT INTO commit_ids (execution_id, commit_id, digest, version) VALUES (?, ?, ?, ?)"
    " ON CONFLICT DO NOTHING"
)
_DELETE_TIMERS = "DELETE FROM timers WHERE (execution_id, path, fire_at) IN (VALUES {})"
_new = tuple.__new__
_POLL_FIRST = 0.002  # wait_for_work: the first pause between two looks at the counter,
_POLL_MAX = 0.02  # doubled up to this one (the latency of a wake-up)


class SqliteStore(_transfer.Uncopyable):
    """The durable ``ExecutionStore`` for one machine (see :mod:`harel_store.sqlite`).

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
        "_plain",
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
        self._plain = _codec.plain_values(codec)
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
            self._seen_work = _work_counter(conn, path)
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
        with self._transaction(lambda: _set_back(exe, version)) as conn:
            _cas(conn, eid, version, blob, epoch)
            _checks.set_version(exe, version + 1)

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
        p = self._prepare(exe, emits, processed_event_id, timers, spawns, trace, commit_id, epoch)
        eid, version, digest, events = p.eid, p.version, p.digest, p.events

        with self._transaction(lambda: _set_back(exe, version)) as conn:
            new = version + 1
            # The id is recorded first: a replay is found by the insert that records it
            # (one statement fewer than a look-up then an insert); a refusal rolls it back.
            if (
                digest is not None
                and not conn.execute(_CLAIM_ID, (eid, commit_id, digest, new)).rowcount
            ):
                done = conn.execute(_DONE, (eid, commit_id)).fetchone()
                conn.execute("ROLLBACK")
                if done[0] != digest:
                    raise IdempotencyConflict(eid, p.commit_id)  # type: ignore[arg-type]
                _checks.set_version(exe, done[1])
                return
            _cas(conn, eid, version, p.blob, p.epoch)
            if events:
                if len(events) == 1:
                    conn.execute(_EMIT, events[0])
                else:
                    conn.executemany(_EMIT, events)
            if p.mark is not None:
                conn.execute(_MARK, (eid, p.mark))
            armed = p.armed
            if armed:  # the counter first: each arming takes its seq from it (_ARM)
                conn.execute(_BUMP_BY, (armed,))
            for action, path, fire_at in p.timers:
                if action == "schedule":
                    armed -= 1
                    conn.execute(_ARM, (eid, path, fire_at, armed))
                else:
                    conn.execute(_DISARM, (eid, path))
            if p.born:
                conn.executemany(_SPAWN, p.born)
            if p.step is not None:
                self._push_step(conn, eid, p.step)
            if (events or p.born) and not p.armed:
                conn.execute(_BUMP)
            _checks.set_version(exe, new)

    def _prepare(
        self,
        exe: Any,
        emits: Any,
        processed_event_id: Any,
        timers: Any,
        spawns: Any,
        trace: Any,
        commit_id: Any,
        epoch: Any,
    ) -> _batch.Prepared:
        """A commit checked and encoded, before any transaction: a value the codec refuses
        is a TypeError naming it, and nothing is written."""
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
        events, born, step = self._encode_body(eid, body)
        digest = None if commit_id is None else self._digest(body, commit_id)
        armed = 0
        for op in body.timers:
            if op[0] == "schedule":
                armed += 1

        return _new(_batch.Prepared, (  # tuple.__new__: the NamedTuple's own __new__ is Python
            exe, eid, version, blob, epoch, events, body.processed_event_id, body.timers, born,
            step, commit_id, digest, armed,
        ))  # fmt: skip

    def _encode_body(self, eid: str, body: _checks.Body) -> tuple[list[Any], list[Any], Any]:
        """The rows of the events and spawns, and the trace step, encoded."""
        if self._plain:  # JsonCodec's encode_value called as is: it gives a str or raises
            encode_value = self._codec.encode_value
            try:
                return (
                    [(target, encode_value(event)) for target, event in body.emits],
                    [
                        (eid, child_id, encode_value(root_path), encode_value(context))
                        for child_id, root_path, context in body.spawns
                    ],
                    None if body.trace is None else encode_value(body.trace),
                )
            except (TypeError, ValueError, OverflowError, RecursionError):
                pass  # encoded again below, where the error names the value
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
        return events, born, step

    def commit_many(self, commits: Iterable[Commit]) -> list[StoreError | None]:
        """Each :class:`~harel_store.Commit` as :meth:`commit` applies it, all in one
        transaction (one fsync), written with one statement per table for the whole
        batch: per commit ``None`` (applied, or a replay of its ``commit_id``) or the
        :class:`~harel_store.StoreConflict`, :class:`~harel_store.StaleWriter` or
        :class:`~harel_store.IdempotencyConflict` that :meth:`commit` would have raised,
        which wrote nothing. Every commit is checked and encoded before the transaction:
        bad input in any raises (naming ``commits[i]``) and writes nothing. Durable once
        it returns; after a crash, all of its applied commits are there or none."""
        if self._conn is None:
            raise _closed()
        return self._write_batch(self._prepare_batch(commits))

    def _prepare_batch(self, commits: Any) -> list[_batch.Prepared]:
        prepared = []
        for i, c in enumerate(_checks.batch(commits)):
            try:
                prepared.append(self._prepare(*c))
            except (TypeError, ValueError) as exc:
                raise _checks.in_batch(exc, i) from exc
        _checks.no_twins([p.eid for p in prepared])
        return prepared

    def _commit_group(self, items: list[tuple[Any, tuple[Any, ...]]]) -> list[Exception | None]:
        """The commits of many callers (``AsyncSqliteStore``'s group commit) in one
        transaction: each caller's outcome, its own bad input included; a lone one takes
        :meth:`commit`'s path."""
        if len(items) == 1:
            exe, emits, mark, timers, spawns, trace, commit_id, epoch = items[0][1]
            try:
                self.commit(
                    exe, emits, mark, timers, spawns, trace, commit_id=commit_id, epoch=epoch
                )
            except (TypeError, ValueError, IdempotencyConflict, StaleWriter, StoreConflict) as e:
                return [e]
            return [None]
        outcomes: list[Exception | None] = [None] * len(items)
        prepared, at = [], []
        for i, (_, args) in enumerate(items):
            try:
                prepared.append(self._prepare(*args))
            except (TypeError, ValueError) as exc:
                outcomes[i] = exc
            else:
                at.append(i)
        for i, outcome in zip(at, self._write_batch(prepared)):
            outcomes[i] = outcome
        return outcomes

    def _ack_group(self, table: str, seqs: list[int]) -> list[None]:
        self._delete_seqs(table, seqs)
        return [None] * len(seqs)

    def _delete_timer_group(self, triples: list[tuple[Any, Any, float]]) -> list[Exception | None]:
        """The timer deletions of many callers (``AsyncSqliteStore``'s group commit) in one
        transaction: each caller's outcome, its own bad ids included."""
        outcomes: list[Exception | None] = [None] * len(triples)
        good = []
        for i, triple in enumerate(triples):
            try:
                _timer_ids(triple)
            except (TypeError, ValueError) as exc:
                outcomes[i] = exc
            else:
                good.append(triple)
        self._write_many(_DELETE_TIMERS, good)
        return outcomes

    def _write_batch(self, batch: list[_batch.Prepared]) -> list[StoreError | None]:
        """Write prepared commits in one transaction; their outcomes."""
        if not batch:
            return []
        applied: list[_batch.Prepared] = []

        def undo() -> None:
            for p in applied:
                _set_back(p.exe, p.version)

        with self._transaction(undo) as conn:
            outcomes, applied[:], replays = _batch.write(conn, batch, self._trace_max)
            for p in applied:
                _checks.set_version(p.exe, p.version + 1)
        for p, version in replays:
            _checks.set_version(p.exe, version)
        return outcomes

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

    def ack_outbox_many(self, seqs: Iterable[int]) -> None:
        """:meth:`ack_outbox` each of ``seqs``, in one transaction (all checked first)."""
        self._delete_seqs("outbox", seqs)

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

    def ack_spawn_many(self, seqs: Iterable[int]) -> None:
        """:meth:`ack_spawn` each of ``seqs``, in one transaction (all checked first)."""
        self._delete_seqs("spawns", seqs)

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
        taken: list[Any] = []
        with self._transaction() as conn:
            clock = self._now()  # under the write lock: waiting for it takes no lease time
            rows = conn.execute(_CLAIM_TIMERS, (now, clock, limit)).fetchall()
            if rows:
                taken = _operate.taken_over(conn, "timers", clock, rows[-1][2])
                until = clock + lease
                conn.executemany(_LEASE_TIMER, [(until, row[0], row[1]) for row in rows])
        if taken:
            _operate.log_takeover(self._path, "timers", taken)
        return rows

    def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        """Disarm the timer only if it still fires at ``fire_at``, so a sweep that read it
        before a re-arm cannot delete the re-armed timer. Ends its lease."""
        if self._conn is None:
            raise _closed()
        _timer_ids((execution_id, path, fire_at))
        fire_at = _checks.as_time(fire_at, "fire_at")
        self._write_one(
            "DELETE FROM timers WHERE execution_id = ? AND path = ? AND fire_at = ?",
            (execution_id, path, fire_at),
        )

    def delete_timer_many(self, timers: Iterable[tuple[str, str, float]]) -> None:
        """:meth:`delete_timer` each ``(execution_id, path, fire_at)`` of ``timers``, in one
        transaction (all checked first)."""
        if self._conn is None:
            raise _closed()
        triples = _checks.timer_triples(timers)
        for i, triple in enumerate(triples):
            _timer_ids(triple, i)
        self._write_many(_DELETE_TIMERS, triples)

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
            "SELECT idx, step FROM trace WHERE execution_id = ? ORDER BY idx", (execution_id,)
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
        with self._transaction() as conn:
            for sql in _FORGET:
                conn.execute(sql, (execution_id,))

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

    def overview(self, *, now: float | None = None) -> dict[str, Any]:
        """What the store holds, for an operator: row counts (``executions``, ``outbox``,
        ``spawns``, ``timers``, ``processed``, ``commit_ids``), the age in seconds of the oldest
        pending outbox and spawn entry, live and expired leases, the timers due at
        ``now`` and the next one after it; ``now`` defaults to the store's clock), read
        in one statement from indexes and table counts. The README lists the keys."""
        return _operate.overview(self, now)

    def list_executions(self, *, after: str | None = None, limit: int = 100) -> list[str]:
        """Up to ``limit`` execution ids in id order, those after ``after`` (the last id of
        the previous page)."""
        return _operate.list_executions(self, after, limit)

    def prune(self, older_than: float) -> dict[str, int]:
        """Delete the processed marks and commit ids recorded more than ``older_than``
        seconds ago, in every execution, a few thousand rows per transaction; how many
        of each it deleted. An event whose mark was pruned is no longer deduplicated."""
        return _operate.prune(self, older_than)

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
        with self._transaction() as conn:
            self._push_step(conn, execution_id, data)

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
                yield from _copying.dump_rows(conn, self._codec, self._canonical)
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
        with self._transaction() as conn:
            held = _copying.held(conn)
            if any(held.values()):
                raise _transfer.not_empty(self, held)
            try:
                rows = _transfer.durable_rows(
                    records, encode=self._encode, encode_exe=self._encode_exe,
                    canonical=self._canonical, digest=self._digest, keep=self._trace_max,
                )  # fmt: skip
                _copying.write_rows(conn, rows)
            except sqlite3.IntegrityError as exc:
                raise ValueError(
                    f"the records to copy hold the same thing twice ({exc}); nothing was written"
                ) from None
            except UnicodeEncodeError as exc:  # the driver's, binding an id
                raise _not_utf8(exc.object, exc.start, "a text of a record to copy") from None

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
        with self._lock:
            conn = self._conn
            if conn is None:
                raise _closed()
            try:
                return _work_counter(conn, self._path)
            except sqlite3.Error as exc:
                raise _read_failed(self._path, exc) from exc

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

    def _transaction(self, undo: Callable[[], None] | None = None) -> _Transaction:
        """``with self._transaction(undo) as conn``: one write transaction (see
        :class:`~harel_store.sqlite._connection._Transaction`)."""
        return _Transaction(self, undo)

    def _write_one(self, sql: str, params: tuple[Any, ...]) -> None:
        with self._transaction() as conn:
            conn.execute(sql, params)

    def _delete_seqs(self, table: str, seqs: Iterable[int]) -> None:
        if self._conn is None:
            raise _closed()
        ours = [
            (seq,)
            for seq in _checks.seqs(seqs, "seqs")
            if _checks.INT64_MIN <= seq <= _checks.INT64_MAX  # any other int is no seq of ours
        ]
        self._write_many(f"DELETE FROM {table} WHERE seq IN (VALUES {{}})", ours)

    def _write_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """``sql`` for all ``rows`` (its ``{}`` being their ``VALUES`` list), a chunk per
        statement, in one transaction."""
        if not rows:
            return
        with self._transaction() as conn:
            _batch.each_chunk(conn, sql, rows)

    def _claim(self, table: str, limit: Any, lease: Any) -> list[tuple[Any, ...]]:
        if self._conn is None:
            raise _closed()
        limit = _checks.as_limit(limit)
        lease = _checks.as_lease(lease)
        if not limit:
            return []
        select, update = _CLAIM[table]
        taken: list[Any] = []
        with self._transaction() as conn:
            clock = self._now()  # under the write lock: waiting for it takes no lease time
            rows = conn.execute(select, (clock, limit)).fetchall()
            if rows:
                taken = _operate.taken_over(conn, table, clock, rows[-1][0])
                until = clock + lease
                conn.executemany(update, [(until, row[0]) for row in rows])
        if taken:
            _operate.log_takeover(self._path, table, taken)
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
        first, last = conn.execute(_RING, (eid, eid)).fetchone()
        if last is not None:  # the ring's indexes are consecutive
            index = last + 1
        else:  # an empty ring: a new one, or one copied in empty
            row = conn.execute(_TRACE_INDEX, (eid,)).fetchone()
            if row is None:
                conn.execute(_NEW_RING, (eid, 0))
            first = index = 0 if row is None else row[0]
        conn.execute(_STEP, (eid, index, data))
        keep = self._trace_max
        if keep and index - first >= keep:  # one range: the overflow
            conn.execute(_TRIM, (eid, index - keep))

    def _encode_exe(self, exe: Any, eid: str) -> Any:
        return _codec.encode_execution(self._codec, exe, eid)

    def _encode(self, value: Any, what: str, i: int = -1) -> Any:
        return _codec.encode_value(self._codec, value, what, i)

    def _digest(self, body: _checks.Body, commit_id: str) -> bytes:
        """What a replay of ``commit_id`` is compared with: a SHA-256 of the body in the
        codec's canonical encoding (:func:`harel_store._digest.body_digest`)."""
        try:
            return body_digest(self._canonical, body)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise TypeError(
                f"cannot encode the body of commit {commit_id!r}: {reason(exc)}"
            ) from exc


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


def _timer_ids(triple: tuple[Any, Any, Any], i: int = -1) -> None:
    """The ids of a ``(execution_id, path, fire_at)`` of :meth:`SqliteStore.delete_timer`
    (``i`` its place in ``delete_timer_many``'s ``timers``): ``str`` ids SQLite can hold."""
    execution_id, path, _ = triple
    if i < 0:
        _id(execution_id, "execution_id")
        _id(path, "path")
    else:
        _id(execution_id, f"the execution id of timers[{i}]")
        _id(path, f"the path of timers[{i}]")
