"""The core both PostgreSQL stores share: every operation once, as a generator of the
statements it needs run (no I/O), with its checks and encodings."""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Generator
from typing import Any

from .. import _checks, _codec
from .._codec import JSON
from .._digest import body_digest
from .._errors import IdempotencyConflict, StaleWriter, StoreConflict, StoreError
from .._records import OutboxEntry, SpawnEntry
from .._redact import redact
from . import _batch, _operate, _tagged
from ._schema import (
    _INSPECT,
    _SQL_CACHE,
    _STATS_KEYS,
    INSTALL,
    MIGRATIONS,
    SCHEMA_TABLE,
    _Sql,
    schema_objects,
)
from ._statements import (
    _UNIQUE,
    _Blobs,
    _Floats,
    _Op,
    _pack,
    _Query,
    _restore_version,
    _Shape,
    _Single,
    _Texts,
    _unpack,
)

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
_LEASE_MAX = 1e10  # seconds (three centuries): a longer lease would overflow a timestamp
_TIMEOUT_MAX = threading.TIMEOUT_MAX  # the longest wait a lock takes
_RECONNECT_FIRST, _RECONNECT_MAX = 0.05, 1.0  # pauses between tries to connect, in seconds


def _unreadable(conninfo: str) -> str | None:
    """Why libpq cannot read ``conninfo``, or ``None``: its parser's message (which quotes
    what it refused: a password too, when its percent-encoding is bad or an unclosed '['
    makes it quote the whole URL), shown without any password."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        said = " ".join(redact(str(exc), conninfo).split())
    else:
        return None
    return f"libpq cannot read the conninfo {redact(conninfo)!r}: {said}"


def _closed() -> ValueError:
    return ValueError("I/O operation on a closed store")


def _import_psycopg() -> Any:
    """psycopg, or an ``ImportError`` that names the extra."""
    try:
        import psycopg
    except ImportError as exc:
        raise ImportError(f"harel_store.postgres needs psycopg 3: {INSTALL} ({exc})") from exc
    return psycopg


_log = logging.getLogger("harel_store.postgres")

# --- the core: every operation once, as a generator of statements -------------------------


class _Core:
    """What the sync and async stores share: the checked options, the statements, and
    each operation as a generator that checks and encodes its arguments, yields the
    statements to run (each is sent back its rows, or its row count when it returns
    none) and returns the operation's result. It does no I/O: the stores run it."""

    __slots__ = (
        "canonical",
        "channel",
        "codec",
        "connect_timeout",
        "conninfo",
        "marks",
        "plain_json",
        "pool_size",
        "prepare",
        "schema",
        "sql",
        "timeout",
        "trace_max",
    )

    def __init__(
        self,
        conninfo: Any,
        trace_max: Any,
        codec: Any,
        schema: Any,
        pool_size: Any,
        prepare: Any,
        timeout: Any,
    ) -> None:
        if not isinstance(conninfo, str):
            raise TypeError(
                f"conninfo must be a str (a libpq URL or key=value string), "
                f"got {type(conninfo).__name__}"
            )
        problem = _unreadable(conninfo)
        if problem is not None:  # raised here, where no driver error is in flight to chain
            raise ValueError(problem)
        self.conninfo = conninfo
        self.trace_max = _checks.as_trace_max(trace_max)
        if codec is None:
            codec = JSON
        else:
            _checks.as_codec(codec)
        self.codec = codec
        self.canonical = getattr(codec, "canonical_value", None) or codec.encode_value
        self.plain_json = _tagged.is_plain_json(codec)
        if not isinstance(schema, str):
            raise TypeError(f"schema must be a str, got {type(schema).__name__}")
        if not _SCHEMA_NAME.match(schema) or schema.lower().startswith("pg_"):
            raise ValueError(
                "schema must be a PostgreSQL identifier of 1 to 63 letters, digits and "
                f"underscores, not starting with a digit or 'pg_', got {schema!r}"
            )
        self.schema = schema
        size = _checks.as_int(pool_size, "pool_size")
        if size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size!r}")
        self.pool_size = size
        if type(prepare) is not bool:
            raise TypeError(f"prepare must be a bool, got {type(prepare).__name__}")
        self.prepare = prepare
        seconds = _checks.as_time(timeout, "timeout")
        if not 0.0 < seconds <= _TIMEOUT_MAX:
            raise ValueError(
                f"timeout must be a positive number of seconds up to {_TIMEOUT_MAX:g}, "
                f"got {timeout!r}"
            )
        self.timeout = seconds
        self.connect_timeout: bool | None = None  # whether conninfo sets one; read later
        channel = f"harel_store.{schema}"
        if len(channel.encode()) > 63:
            channel = "harel_store." + hashlib.sha256(schema.encode()).hexdigest()[:32]
        self.channel = channel
        sql = _SQL_CACHE.get(schema)
        if sql is None:
            sql = _SQL_CACHE[schema] = _Sql(schema)
        self.sql = sql
        self.marks: tuple[Any, ...] | None = None

    def describe(self) -> str:
        """The server and schema, for messages (never the password)."""
        try:
            from psycopg.conninfo import conninfo_to_dict

            parts = conninfo_to_dict(self.conninfo)
        except Exception:  # noqa: BLE001 - a message must not fail
            return f"schema {self.schema!r}"
        host = parts.get("host") or parts.get("hostaddr") or "localhost"
        port = f":{parts['port']}" if parts.get("port") else ""
        db = parts.get("dbname") or parts.get("user") or ""
        # A password with a '/' libpq did not read as one lands in the host or port.
        return redact(f"{host}{port}/{db} schema {self.schema!r}", self.conninfo)

    # --- opening -----------------------------------------------------------------------

    def open(self) -> _Op:
        """Check the schema, refusing a foreign or newer one before changing anything;
        create or upgrade it under an advisory lock; read the seq marks."""
        sql = self.sql
        version = yield from self._schema_version()
        if version != len(MIGRATIONS):
            yield _Query("BEGIN")
            # Serializes every store opening this schema while it is created or migrated.
            key = int.from_bytes(
                hashlib.sha256(f"harel_store:{self.schema}".encode()).digest()[:8],
                "big",
                signed=True,
            )
            yield _Query("SELECT pg_advisory_xact_lock(%s)", (key,))
            version = yield from self._schema_version()
            if version is None:
                yield _Query(sql.create_schema)
                version = 0
            for step in range(version, len(MIGRATIONS)):
                for statement in MIGRATIONS[step]:
                    yield _Query(statement.format(s=sql.schema))
                yield _Query(sql.set_version, (step + 1,))
            yield _Query("COMMIT")
            if version:
                _log.info(
                    "%s: schema migrated from version %d to %d",
                    self.describe(), version, len(MIGRATIONS),
                )  # fmt: skip
        self.marks = tuple((yield _Query(sql.marks))[0])

    def _schema_version(self) -> Generator[_Query, Any, int | None]:
        """The schema version of this package's tables, ``0`` for an empty schema,
        ``None`` for none; a ``StoreError`` for a schema that is not this package's, is
        newer than it, or is damaged (its version row, or a table, index or sequence its
        version must have, missing)."""
        [(exists, names, indexes)] = yield _Query(_INSPECT, {"s": self.schema})
        if not exists:
            return None
        if SCHEMA_TABLE not in names:
            if names:
                shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
                raise StoreError(
                    f"{self.describe()}: the schema is not harel_store's: it holds {shown} "
                    f"and no {SCHEMA_TABLE} table; nothing was changed"
                )
            return 0
        rows = yield _Query(self.sql.version)
        if len(rows) != 1 or rows[0][0] is None or rows[0][0] < 0:
            raise StoreError(
                f"{self.describe()}: the {SCHEMA_TABLE} table is damaged ({rows[:3]!r}); "
                "nothing was changed"
            )
        version: int = rows[0][0]
        if version == len(MIGRATIONS):
            missing = schema_objects(MIGRATIONS).difference(names, indexes)
            if missing:
                raise StoreError(
                    f"{self.describe()}: the harel_store schema (version {version}) is "
                    f"damaged: it lacks {', '.join(sorted(missing))}; nothing was changed"
                )
        if version > len(MIGRATIONS):
            raise StoreError(
                f"{self.describe()} has harel_store schema version {version}, newer than "
                f"this harel_store's ({len(MIGRATIONS)}): upgrade harel_store to open it; "
                "nothing was changed"
            )
        return version

    def marks_moved(self, marks: Any) -> bool:
        """Whether any seq was allocated since the marks last read (and remember these)."""
        marks = tuple(marks)
        moved: bool = marks != self.marks
        self.marks = marks
        return moved

    # --- executions --------------------------------------------------------------------

    def load(self, execution_id: Any) -> _Op:
        if type(execution_id) is not str:
            _checks.str_id(execution_id, "execution_id")
        _checks.durable_key(execution_id, "execution_id")
        rows = yield _Query(self.sql.load, (execution_id,), True)
        if not rows:
            return None
        version, body = rows[0]
        exe = self.codec.decode_execution(_unpack(body))
        exe.version = version
        return exe

    def save(self, exe: Any, epoch: Any) -> _Op:
        return (yield from self.commit(exe, (), None, (), (), None, None, epoch))

    def commit(
        self,
        exe: Any,
        emits: Any,
        processed_event_id: Any,
        timers: Any,
        spawns: Any,
        trace: Any,
        commit_id: Any,
        epoch: Any,
    ) -> _Op:
        # Checked and encoded at the call, as the other operations are at their first
        # step: the stores call an operation and take its first step before any I/O.
        return self.run_commit(
            self.prepare_commit(
                exe, emits, processed_event_id, timers, spawns, trace, commit_id, epoch
            )
        )

    def prepare_commit(
        self,
        exe: Any,
        emits: Any,
        processed_event_id: Any,
        timers: Any,
        spawns: Any,
        trace: Any,
        commit_id: Any,
        epoch: Any,
    ) -> _Single:
        """A commit checked and encoded, before any I/O (:meth:`run_commit` writes it)."""
        eid = _checks.durable_exe_id(exe)
        body = _checks.commit_body(emits, processed_event_id, timers, spawns, trace, str_ids=True)
        if commit_id is not None:
            commit_id = _checks.as_commit_id(commit_id)
        _checks.durable_keys(eid, body, commit_id)
        if epoch is not None:
            epoch = _checks.durable_epoch(epoch)
        version = _checks.durable_exe_version(exe)

        # Encode everything before the statement: a value the codec refuses is a
        # TypeError naming it, and nothing is written.
        blob = _pack(self._encode_exe(exe, eid))
        targets = _Texts([target for target, _ in body.emits])
        children = _Texts([spawn[0] for spawn in body.spawns])
        encoded = _tagged.encode_body(body, commit_id is not None) if self.plain_json else None
        if encoded is None:
            events, roots, contexts, step, sha = self._encode_body(body, commit_id)
        else:
            events, roots, contexts, step, sha = encoded
        # The last op on a path decides its final state; one statement writes each row once.
        final: dict[Any, float | None] = {}
        for action, path, fire_at in body.timers:
            final.pop(path, None)
            final[path] = fire_at if action == "schedule" else None
        arm = _Texts([path for path, at in final.items() if at is not None])
        disarm = _Texts([path for path, at in final.items() if at is None])
        # The parameters the statement of this shape reads (_Sql.commit): a part of one
        # row as scalars, of more as arrays. None is ever NULL, whose type psycopg does not
        # know (it would prepare the statement again): no epoch is -1 (an epoch is at
        # least 0), no commit id an empty digest (a digest has 32 bytes), an emit to no
        # target one of the arrays.
        params = {
            "id": eid,
            "old": version,
            "new": version + 1,
            "epoch": -1 if epoch is None else epoch,
            "body": blob,
            "cid": "" if commit_id is None else commit_id,
            "digest": b"" if commit_id is None else sha,
            "keep": self.trace_max or 0,
            "channel": self.channel,
        }
        one_emit = len(events) == 1 and targets[0] is not None
        if one_emit:
            params["target"] = targets[0]
            params["event"] = events[0]
        elif events:
            params["targets"] = targets
            params["events"] = events
        if body.processed_event_id is not None:
            params["pev"] = body.processed_event_id
        if len(arm) == 1:
            params["path"] = arm[0]
            params["fire_at"] = final[arm[0]]
        elif arm:
            params["arm"] = arm
            params["at"] = _Floats([final[path] for path in arm])
        if disarm:
            params["disarm"] = disarm
        if children:
            params["children"] = children
            params["roots"] = roots
            params["contexts"] = contexts
        if step:
            params["step"] = step[0]
        shape: _Shape = (
            1 if one_emit else 2 if events else 0,
            body.processed_event_id is not None,
            min(len(arm), 2),
            bool(disarm),
            bool(children),
            bool(step),
        )
        return _Single(exe, eid, version, shape, params, commit_id, epoch)

    def run_commit(self, single: _Single) -> _Op:
        """The statements of a commit :meth:`prepare_commit` made."""
        exe, eid, version, shape, params, commit_id, epoch = single
        keep = params["keep"]
        # The version is set before anything is written (as SQLite sets it inside its
        # transaction): an execution that refuses it (frozen, or a setter that raises)
        # is refused with nothing written. Anything but an applied commit sets it back,
        # a failed statement included (the runner closes the operation at once).
        _checks.set_version(exe, version + 1)
        try:
            missed = yield from self._commit(exe, eid, version, shape, params, commit_id, epoch)
        except BaseException:
            _restore_version(exe, version)
            raise
        if missed:
            yield self._trim(eid, keep)
        return None

    def _commit(
        self,
        exe: Any,
        eid: str,
        version: int,
        shape: _Shape,
        params: dict[str, Any],
        commit_id: str | None,
        epoch: int | None,
    ) -> Generator[_Query, Any, bool]:
        """:meth:`commit`'s statements: whether it was applied with a trace step whose
        trim may have missed steps; raises, or sets the version of a replay, else."""
        recheck = {"id": eid, "cid": commit_id}
        for _ in range(2):
            rows = yield _Query(self.sql.commit(shape), params, True, unique=True)
            if rows is not _UNIQUE:
                ok, found, found_epoch, _, missed = rows[0]
                if ok:
                    return bool(missed)
                if commit_id is None and found is not None:
                    if epoch is not None and found_epoch is not None and found_epoch > epoch:
                        raise StaleWriter(eid, epoch, found_epoch)
                    if found != version:
                        raise StoreConflict(eid, version, found)
            # Refused by a writer the statement did not see (a concurrent first write, an
            # update or a forget after its snapshot), or a unique violation on the commit
            # id: another try of this very commit may have landed. Look again.
            rows = yield _Query(self.sql.recheck, recheck)
            found, found_epoch, done, done_version = rows[0]
            if done is not None:
                self._replayed(exe, eid, commit_id, params["digest"], done, done_version)
                return False
            if epoch is not None and found_epoch is not None and found_epoch > epoch:
                raise StaleWriter(eid, epoch, found_epoch)
            if found is not None and found != version:
                break
            # No row now (forgotten meanwhile), or the version this commit expects: it
            # wrote nothing, so it may run once more, on a snapshot that sees why.
        raise StoreConflict(eid, version, found)

    def _replayed(
        self, exe: Any, eid: str, commit_id: Any, digest: Any, done: bytes, done_version: int
    ) -> None:
        if done != digest:
            raise IdempotencyConflict(eid, commit_id)
        _checks.set_version(exe, done_version)

    def commit_many(self, commits: Any) -> _Op:
        return (yield from _batch.commit_many(self, commits))

    def is_processed(self, execution_id: Any, event_id: Any) -> _Op:
        _checks.str_id(execution_id, "execution_id")
        _checks.str_id(event_id, "event_id")
        _checks.durable_key(execution_id, "execution_id")
        _checks.durable_key(event_id, "event_id")
        rows = yield _Query(self.sql.is_processed, (execution_id, event_id), True)
        return rows[0][0]

    # --- outbox, spawns, timers --------------------------------------------------------

    def pending(self, table: str) -> _Op:
        rows = yield _Query(self.sql.pending[table])
        return self._entries(table, rows)

    def ack(self, table: str, seq: Any) -> _Op:
        if type(seq) is not int:
            seq = _checks.as_int(seq, "seq")
        if _checks.INT64_MIN <= seq <= _checks.INT64_MAX:  # no other seq can be stored
            yield _Query(self.sql.ack[table], (seq,), True)

    def ack_outbox_many(self, seqs: Any) -> _Op:
        return (yield from _batch.ack_many(self, "outbox", seqs))

    def ack_spawn_many(self, seqs: Any) -> _Op:
        return (yield from _batch.ack_many(self, "spawns", seqs))

    def claim(self, table: str, limit: Any, lease: Any) -> _Op:
        limit = _checks.as_limit(limit)
        lease = min(_checks.as_lease(lease), _LEASE_MAX)
        if not limit:
            return []
        rows = yield _Query(self.sql.claim[table], (lease, limit), True)
        rows.sort()
        taken = [row[0] for row in rows if row[-1]]
        if taken:
            _operate.log_takeover(self.describe(), table, taken)
        return self._entries(table, rows)

    def due_timers(self, now: Any) -> _Op:
        now = _checks.as_now(now)
        rows = yield _Query(self.sql.due_timers, (now,), True)
        return rows

    def claim_due_timers(self, now: Any, limit: Any, lease: Any) -> _Op:
        now = _checks.as_now(now)
        limit = _checks.as_limit(limit)
        lease = min(_checks.as_lease(lease), _LEASE_MAX)
        if not limit:
            return []
        rows = yield _Query(self.sql.claim_timers, (lease, now, limit), True)
        rows.sort()
        taken = [(eid, path) for _, _, eid, path, was in rows if was]
        if taken:
            _operate.log_takeover(self.describe(), "timers", taken)
        return [(eid, path, fire_at) for fire_at, _, eid, path, _ in rows]

    def delete_timer(self, execution_id: Any, path: Any, fire_at: Any) -> _Op:
        _checks.str_id(execution_id, "execution_id")
        _checks.str_id(path, "path")
        _checks.durable_key(execution_id, "execution_id")
        _checks.durable_key(path, "path")
        fire_at = _checks.as_time(fire_at, "fire_at")
        yield _Query(self.sql.delete_timer, (execution_id, path, fire_at), True)

    def delete_timer_many(self, timers: Any) -> _Op:
        return (yield from _batch.delete_timer_many(self, timers))

    # --- trace, retention, monitoring --------------------------------------------------

    def record_trace(self, execution_id: Any, entry: Any) -> _Op:
        step = _checks.trace_step(entry, "trace entry")
        _checks.str_id(execution_id, "execution_id")
        _checks.durable_key(execution_id, "execution_id")
        keep = self.trace_max or 0
        params = {
            "id": execution_id,
            "step": _pack(self._encode(step, "the trace entry")),
            "keep": keep,
        }
        rows = yield _Query(self.sql.record_trace, params, True)
        if rows[0][0]:
            yield self._trim(execution_id, keep)

    def _trim(self, execution_id: str, keep: int) -> _Query:
        """The trim to ``keep`` steps of a ring whose append raced another (see
        ``_schema._MISSED``), run once the append has committed: the ring holds no more
        than ``trace_max`` steps when the call returns."""
        return _Query(self.sql.trim, {"id": execution_id, "keep": keep}, True, tolerant=True)

    def read_trace(self, execution_id: Any) -> _Op:
        _checks.str_id(execution_id, "execution_id")
        _checks.durable_key(execution_id, "execution_id")
        rows = yield _Query(self.sql.read_trace, (execution_id,), True)
        decode = self.codec.decode_value
        steps = []
        for index, data in rows:
            step = decode(_unpack(data))
            if "index" not in step:
                step["index"] = index
            steps.append(step)
        return steps

    def forget(self, execution_id: Any) -> _Op:
        _checks.str_id(execution_id, "execution_id")
        _checks.durable_key(execution_id, "execution_id")
        # The execution's row, then its ring's, are locked first, in the order every
        # writer locks them: a commit or an append in flight holds them until it has
        # landed, one that comes later waits for the forget; the deletes, a statement
        # later, see everything the writers before wrote (_Sql.lock).
        params = {"id": execution_id}
        yield _Query("BEGIN")
        yield _Query(self.sql.lock, params, True)
        yield _Query(self.sql.forget, params, True)
        yield _Query("COMMIT")

    def stats(self) -> _Op:
        rows = yield _Query(self.sql.stats)
        return dict(zip(_STATS_KEYS, rows[0]))

    def overview(self, now: Any) -> _Op:
        rows = yield _Query(*_operate.overview(self.sql.schema, now))
        return _operate.overview_figures(rows)

    def list_executions(self, after: Any, limit: Any) -> _Op:
        rows = yield _Query(*_operate.list_executions(self.sql.schema, after, limit))
        return [eid for (eid,) in rows]

    def show(self, execution_id: Any) -> _Op:
        """One execution as the ``show`` command prints it, read in one snapshot."""
        _checks.str_id(execution_id, "execution_id")
        _checks.durable_key(execution_id, "execution_id")
        yield _Query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        exe = yield from self.load(execution_id)
        trace = yield from self.read_trace(execution_id)
        rows = {}
        for part, sql in _operate.show(self.sql.schema).items():
            rows[part] = yield _Query(sql, {"id": execution_id})
        yield _Query("COMMIT")
        decode = self.codec.decode_value
        return _operate.shown(execution_id, exe, trace, rows, lambda e: decode(_unpack(e)))

    def prune_step(self, table: str, older_than: float, batch: int, after: Any) -> _Op:
        rows = yield _Query(*_operate.prune_step(self.sql.schema, table, older_than, batch, after))
        return _operate.pruned(rows, batch)

    # --- helpers -----------------------------------------------------------------------

    def _entries(self, table: str, rows: list[Any]) -> list[Any]:
        """The entries of ``rows`` (a claim's end with one more column)."""
        decode = self.codec.decode_value
        if table == "outbox":
            return [OutboxEntry(row[0], row[1], decode(_unpack(row[2]))) for row in rows]
        return [
            SpawnEntry(row[0], row[1], row[2], decode(_unpack(row[3])), decode(_unpack(row[4])))
            for row in rows
        ]

    def _encode_body(
        self, body: _checks.Body, commit_id: str | None
    ) -> tuple[_Blobs, _Blobs, _Blobs, _Blobs, bytes | None]:
        """The packed events, spawn roots and contexts, and trace step of ``body``, and
        its digest when it has a ``commit_id``, each encoded by the codec."""
        encode = self._encode
        events = _Blobs(
            [
                _pack(encode(event, "the event of emits", i))
                for i, (_, event) in enumerate(body.emits)
            ]
        )
        roots = _Blobs()
        contexts = _Blobs()
        for i, (_, root_path, context) in enumerate(body.spawns):
            roots.append(_pack(encode(root_path, "the root_path of spawns", i)))
            contexts.append(_pack(encode(context, "the context of spawns", i)))
        step = _Blobs()
        if body.trace is not None:
            step.append(_pack(encode(body.trace, "the trace step")))
        sha = None if commit_id is None else self._digest(body, commit_id)
        return events, roots, contexts, step, sha

    def _encode_exe(self, exe: Any, eid: str) -> Any:
        return _codec.encode_execution(self.codec, exe, eid)

    def _encode(self, value: Any, what: str, i: int = -1) -> Any:
        return _codec.encode_value(self.codec, value, what, i)

    def _digest(self, body: _checks.Body, commit_id: str) -> bytes:
        """What a replay of ``commit_id`` is compared with: a SHA-256 of the body in the
        codec's canonical encoding (:func:`harel_store.body_digest`, as every
        durable store)."""
        try:
            return body_digest(self.canonical, body)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise TypeError(f"cannot encode the body of commit {commit_id!r}: {exc}") from exc


# Operations that write what a retry could write twice, or whose arguments may be
# iterators they have read (the batches); the others are retried once on a new
# connection when theirs fails.
_NO_RETRY = frozenset(
    ["commit", "commit_many", "save", "record_trace", "ack_outbox_many", "ack_spawn_many",
     "delete_timer_many"]
)  # fmt: skip
