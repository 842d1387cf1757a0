"""``PostgresStore``: the durable store for many processes on many machines, on psycopg 3.

It needs the extra ``pip install 'harel-store[postgres]'`` (psycopg 3), imported only when
a store is made: ``import harel_store`` never needs psycopg.

Any number of store objects, in any processes and machines, may share one database (one
store object is used by one thread, or one event loop, at a time). Each store keeps its
tables in one PostgreSQL schema (``schema=``, default ``harel_store``): stores with
different schemas in one database do not see each other.

Schema (version :data:`SCHEMA_VERSION`; :data:`MIGRATIONS` is a list whose index is the
version it upgrades from, recorded in ``harel_store_schema``). Every encoded value is a
``bytea``: one tag byte (``t`` when the codec returned ``str``, stored as UTF-8; ``b``
for ``bytes``) and the data, so decoding gets back what encoding returned.

- ``executions(id, version, epoch, body)``: the codec's blob beside its broken-out
  ``version`` and the writer ``epoch``.
- ``outbox(seq, target_id, event, lease_until)`` and ``spawns(seq, parent_id, child_id,
  root_path, context, lease_until)``: ``seq`` from a sequence (``outbox_seq``,
  ``spawns_seq``), so seqs start at 1 and increase in the order they are allocated; a
  commit that is refused allocates none, one killed in flight may leave a gap.
- ``processed(execution_id, event_id)``: the dedupe marks.
- ``timers(execution_id, path, fire_at, seq, lease_until)``: one row per timer; ``seq``
  (``timers_seq``) is the arming order; re-arming gives the row a new ``seq`` and no lease.
- ``trace(execution_id, idx, step)`` and ``trace_index(execution_id, next_index)``: the
  ring and the per-execution monotonic index. ``idx`` is the index a step was stamped
  with, added on read when the step carries no ``"index"`` of its own; the ring is
  trimmed by ``idx``, deleting just the overflow.
- ``commit_ids(execution_id, commit_id, digest, version)``: a SHA-256 of the commit's
  body in the codec's canonical encoding, and the version the commit produced.

**One round trip per commit.** A commit is one SQL statement, a data-modifying ``WITH``
(:meth:`_Sql.commit`), run in autocommit mode, so it is one transaction and one network
round trip, and prepared once per connection (``prepare=True``). It holds only the parts
the commit uses (a save is the CAS and the commit id's parts): PostgreSQL plans a statement of this kind anew
at each call, and planning parts that write nothing was most of a save's time. Its first parts read
the commit id and the stored row; ``UPDATE executions ... WHERE id = ... AND version = ...``
is the CAS (a concurrent writer's update makes PostgreSQL re-check the ``WHERE`` against
the new row, so of two writers at one version exactly one updates), and a first write is
an ``INSERT ... ON CONFLICT (id) DO NOTHING`` (of two first writers exactly one inserts).
Every other part (emits, the mark, timers, spawns, the trace step, the commit id, the
``pg_notify``) writes only ``WHERE EXISTS`` a row from the CAS, so a refused commit
writes nothing and takes no seq. Timer ops are reduced to the last op per path before
they are sent (the final state is the same; one statement cannot touch a row twice).
Only a refused commit may need a second statement, to tell a conflict from a replay that
raced it. Loads, acks, claims, ``forget`` and ``stats`` are one statement each too.

**Claims** lease rows with ``FOR UPDATE SKIP LOCKED`` and leases on the database clock
(``now()``), so relays on machines with different clocks agree. **Wake-ups**: a commit
that makes work calls ``pg_notify`` inside its own statement, so the notification is sent
when the data is committed and never before; :meth:`PostgresStore.wait_for_work`
uses ``LISTEN`` on a connection of its own, opened at its first call, and begins each
wait with an empty statement on it: the notifications of every commit that returned
before the wait arrive before that statement's reply. Work committed before the
``LISTEN`` is seen from the seq counters, read when the store opened and again at every
(re)connection of the listener (a seq taken by a commit still in flight then wakes the
wait early: the claim that follows finds nothing yet, and the commit's notification wakes
the next wait). A dropped connection can cost a spurious wake-up, never a missed one.

**Connections** come from a pool of the store (:class:`_Pool`, :class:`_AsyncPool`):
``pool_size`` at most, the one that opened the store kept open. A connection is checked
as it leaves the pool, without a round trip: a closed socket, or one the server wrote to
while the connection was idle (a restart's "terminating connection"), gets it replaced,
and a new connection is made by the call that needs it. So the first call after a
server restart reconnects; while the server is down a call tries again until
``timeout``, then raises :class:`~harel_store.StoreError`. Reads, acks and claims are
retried once on a new connection when theirs fails mid-call; a commit is not (it may
have been applied): it raises a ``StoreError`` that says so, and a retry with the same
``commit_id`` is recognised.

**Copying**: ``_dump`` streams a ``REPEATABLE READ`` snapshot through server-side
cursors, ``_restore`` writes into an empty schema in one transaction that locks its
tables (:func:`harel_store.copy_store`, ``python -m harel_store copy``).

**PgBouncer** in transaction mode does not keep a server connection's prepared
statements across transactions (before PgBouncer 1.21 and its
``max_prepared_statements``): pass ``prepare=False``, which prepares nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import math
import re
import select
import threading
import time
import weakref
from collections.abc import Generator, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from . import _checks, _codec, _transfer
from ._codec import JSON
from ._digest import Digest, body_digest
from ._errors import IdempotencyConflict, StaleWriter, StoreConflict, StoreError
from ._records import DEFAULT_TRACE_MAX, OutboxEntry, SpawnEntry, TimerOp

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "AsyncPostgresStore", "PostgresStore"]

INSTALL = "pip install 'harel-store[postgres]'"
SCHEMA_TABLE = "harel_store_schema"
DEFAULT_SCHEMA = "harel_store"
DEFAULT_POOL_SIZE = 4

# MIGRATIONS[v] takes a schema from version v to v + 1; never edit a released one.
# "{s}" is the store's schema, quoted.
_QUEUE = "WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000)"
MIGRATIONS: list[tuple[str, ...]] = [
    (
        f"CREATE TABLE {{s}}.{SCHEMA_TABLE} (version integer NOT NULL)",
        f"INSERT INTO {{s}}.{SCHEMA_TABLE} (version) VALUES (0)",
        (
            "CREATE TABLE {s}.executions ("
            " id text PRIMARY KEY, version bigint NOT NULL, epoch bigint, body bytea NOT NULL)"
        ),
        (
            "CREATE TABLE {s}.outbox ("
            " seq bigint GENERATED BY DEFAULT AS IDENTITY (SEQUENCE NAME {s}.outbox_seq)"
            " PRIMARY KEY, target_id text, event bytea NOT NULL,"
            " lease_until timestamptz NOT NULL DEFAULT '-infinity') " + _QUEUE
        ),
        (
            "CREATE TABLE {s}.spawns ("
            " seq bigint GENERATED BY DEFAULT AS IDENTITY (SEQUENCE NAME {s}.spawns_seq)"
            " PRIMARY KEY, parent_id text NOT NULL, child_id text NOT NULL,"
            " root_path bytea NOT NULL, context bytea NOT NULL,"
            " lease_until timestamptz NOT NULL DEFAULT '-infinity') " + _QUEUE
        ),
        (
            "CREATE TABLE {s}.processed ("
            " execution_id text NOT NULL, event_id text NOT NULL,"
            " PRIMARY KEY (execution_id, event_id))"
        ),
        (
            "CREATE TABLE {s}.timers ("
            " execution_id text NOT NULL, path text NOT NULL, fire_at float8 NOT NULL,"
            " seq bigint NOT NULL GENERATED BY DEFAULT AS IDENTITY (SEQUENCE NAME {s}.timers_seq),"
            " lease_until timestamptz NOT NULL DEFAULT '-infinity',"
            " PRIMARY KEY (execution_id, path)) " + _QUEUE
        ),
        "CREATE INDEX timers_by_fire_at ON {s}.timers (fire_at, seq)",
        (
            "CREATE TABLE {s}.trace ("
            " execution_id text NOT NULL, idx bigint NOT NULL, step bytea NOT NULL,"
            " PRIMARY KEY (execution_id, idx))"
        ),
        (
            "CREATE TABLE {s}.trace_index ("
            " execution_id text PRIMARY KEY, next_index bigint NOT NULL)"
        ),
        (
            "CREATE TABLE {s}.commit_ids ("
            " execution_id text NOT NULL, commit_id text NOT NULL, digest bytea NOT NULL,"
            " version bigint NOT NULL, PRIMARY KEY (execution_id, commit_id))"
        ),
    ),
]
SCHEMA_VERSION = len(MIGRATIONS)

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
_LEASE_MAX = 1e10  # seconds (three centuries): a longer lease would overflow a timestamp
_TEXT = b"t"[0]
_TIMEOUT_MAX = threading.TIMEOUT_MAX  # the longest wait a lock takes
_RECONNECT_FIRST, _RECONNECT_MAX = 0.05, 1.0  # pauses between tries to connect, in seconds


def _closed() -> ValueError:
    return ValueError("I/O operation on a closed store")


def _import_psycopg() -> Any:
    """psycopg, or an ``ImportError`` that names the extra."""
    try:
        import psycopg
    except ImportError as exc:
        raise ImportError(f"harel_store.postgres needs psycopg 3: {INSTALL} ({exc})") from exc
    return psycopg


# --- the statements ----------------------------------------------------------------------


def _ring(s: str, when: str) -> str:
    """The parts of a ``WITH`` that append ``%(step)s`` (an array of no step or one) to
    the ring of ``%(id)s`` and trim it to ``%(keep)s`` steps (``0``: keep all), ``when``
    the condition to append."""
    return f"""
ring AS (
    INSERT INTO {s}.trace_index AS ti (execution_id, next_index)
    SELECT %(id)s, 1 WHERE cardinality(%(step)s::bytea[]) > 0 AND {when}
    ON CONFLICT (execution_id) DO UPDATE SET next_index = ti.next_index + 1
    RETURNING next_index
), step AS (
    INSERT INTO {s}.trace (execution_id, idx, step)
    SELECT %(id)s, next_index - 1, (%(step)s::bytea[])[1] FROM ring
), trim AS (
    DELETE FROM {s}.trace AS tr USING ring
    WHERE %(keep)s::bigint > 0 AND tr.execution_id = %(id)s
      AND tr.idx < ring.next_index - %(keep)s::bigint
)"""


def _commit_sql(s: str, shape: tuple[bool, bool, bool, bool, bool, bool]) -> str:
    """The data-modifying ``WITH`` of a commit (see the module docstring) holding the
    CAS, the commit id's parts, and just the other parts ``shape`` asks for
    (:meth:`_Sql.commit`); its result row is the same whatever the shape."""
    emits, mark, arm, disarm, spawn, step = shape
    parts = [
        f"""done AS (
    SELECT digest, version FROM {s}.commit_ids
    WHERE execution_id = %(id)s AND commit_id = ANY (%(cid)s::text[])
), cur AS (
    SELECT version, epoch FROM {s}.executions WHERE id = %(id)s
), upd AS (
    UPDATE {s}.executions
    SET version = %(new)s::bigint, body = %(body)s::bytea,
        epoch = coalesce((%(epoch)s::bigint[])[1], epoch)
    WHERE id = %(id)s AND version = %(old)s::bigint
      AND (epoch IS NULL OR cardinality(%(epoch)s::bigint[]) = 0
           OR epoch <= (%(epoch)s::bigint[])[1])
      AND NOT EXISTS (SELECT FROM done)
    RETURNING 1
), ins AS (
    INSERT INTO {s}.executions (id, version, epoch, body)
    SELECT %(id)s, %(new)s::bigint, (%(epoch)s::bigint[])[1], %(body)s::bytea
    WHERE NOT EXISTS (SELECT FROM done) AND NOT EXISTS (SELECT FROM cur)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
), ok AS (
    SELECT FROM upd UNION ALL SELECT FROM ins
)"""
    ]
    if emits:
        parts.append(f"""emit AS (
    INSERT INTO {s}.outbox (target_id, event)
    SELECT t, e FROM unnest(%(targets)s::text[], %(events)s::bytea[]) WITH ORDINALITY AS u (t, e, o)
    WHERE EXISTS (SELECT FROM ok) ORDER BY o
)""")
    if mark:
        parts.append(f"""mark AS (
    INSERT INTO {s}.processed (execution_id, event_id)
    SELECT %(id)s, e FROM unnest(%(pev)s::text[]) AS e WHERE EXISTS (SELECT FROM ok)
    ON CONFLICT DO NOTHING
)""")
    if arm:
        parts.append(f"""arm AS (
    INSERT INTO {s}.timers AS tm (execution_id, path, fire_at)
    SELECT %(id)s, p, f FROM unnest(%(arm)s::text[], %(at)s::float8[]) WITH ORDINALITY AS u (p, f, o)
    WHERE EXISTS (SELECT FROM ok) ORDER BY o
    ON CONFLICT (execution_id, path) DO UPDATE
    SET fire_at = excluded.fire_at, seq = excluded.seq, lease_until = '-infinity'
)""")
    if disarm:
        parts.append(f"""disarm AS (
    DELETE FROM {s}.timers
    WHERE execution_id = %(id)s AND path = ANY (%(disarm)s::text[]) AND EXISTS (SELECT FROM ok)
)""")
    if spawn:
        parts.append(f"""spawn AS (
    INSERT INTO {s}.spawns (parent_id, child_id, root_path, context)
    SELECT %(id)s, c, r, x
    FROM unnest(%(children)s::text[], %(roots)s::bytea[], %(contexts)s::bytea[])
        WITH ORDINALITY AS u (c, r, x, o)
    WHERE EXISTS (SELECT FROM ok) ORDER BY o
)""")
    if step:
        parts.append(_ring(s, "EXISTS (SELECT FROM ok)").strip())
    parts.append(f"""rec AS (
    INSERT INTO {s}.commit_ids (execution_id, commit_id, digest, version)
    SELECT %(id)s, c, d, %(new)s::bigint
    FROM unnest(%(cid)s::text[], %(digest)s::bytea[]) AS u (c, d)
    WHERE EXISTS (SELECT FROM ok)
)""")
    wake = emits or arm or spawn
    if wake:
        parts.append("""wake AS (
    SELECT pg_notify(%(channel)s, '') WHERE EXISTS (SELECT FROM ok)
)""")
    woken = "(SELECT count(*) FROM wake)" if wake else "0::bigint"
    return f"""
WITH {", ".join(parts)}
SELECT EXISTS (SELECT FROM ok), (SELECT version FROM cur), (SELECT epoch FROM cur),
    (SELECT digest FROM done), (SELECT version FROM done), {woken}"""


# Copying (PostgresStore._dump and _restore): the tables a copy reads and writes, and the
# names of what they hold.
_COPIED = (
    ("executions", "executions"), ("processed", "processed marks"), ("commit_ids", "commit ids"),
    ("trace_index", "trace rings"), ("timers", "timers"), ("outbox", "outbox entries"),
    ("spawns", "spawn intents"),
)  # fmt: skip
_BATCH = 500  # rows per executemany while restoring


class _Sql:
    """The statements of one schema (``s`` is its quoted name)."""

    def __init__(self, schema: str) -> None:
        s = f'"{schema}"'
        self.schema = s
        self.create_schema = f"CREATE SCHEMA {s}"
        self.version = f"SELECT version FROM {s}.{SCHEMA_TABLE}"
        self.set_version = f"UPDATE {s}.{SCHEMA_TABLE} SET version = %s"
        self.marks = "SELECT " + ", ".join(
            f"pg_sequence_last_value('{s}.{name}'::regclass)"
            for name in ("outbox_seq", "spawns_seq", "timers_seq")
        )
        self._commits: dict[tuple[bool, ...], str] = {}
        self.recheck = f"""
SELECT (SELECT version FROM {s}.executions WHERE id = %(id)s),
    (SELECT epoch FROM {s}.executions WHERE id = %(id)s),
    (SELECT digest FROM {s}.commit_ids
        WHERE execution_id = %(id)s AND commit_id = ANY (%(cid)s::text[])),
    (SELECT version FROM {s}.commit_ids
        WHERE execution_id = %(id)s AND commit_id = ANY (%(cid)s::text[]))"""
        self.record_trace = f"WITH {_ring(s, 'true').strip()} SELECT 1"
        self.load = f"SELECT version, body FROM {s}.executions WHERE id = %s"
        self.is_processed = (
            f"SELECT EXISTS (SELECT FROM {s}.processed WHERE execution_id = %s AND event_id = %s)"
        )
        self.pending = {
            "outbox": f"SELECT seq, target_id, event FROM {s}.outbox ORDER BY seq",
            "spawns": (
                f"SELECT seq, parent_id, child_id, root_path, context FROM {s}.spawns ORDER BY seq"
            ),
        }
        self.ack = {table: f"DELETE FROM {s}.{table} WHERE seq = %s" for table in self.pending}
        columns = {
            "outbox": "target_id, event",
            "spawns": "parent_id, child_id, root_path, context",
        }
        self.claim = {
            table: f"""
UPDATE {s}.{table} AS q SET lease_until = now() + make_interval(secs => %s)
FROM (
    SELECT seq FROM {s}.{table} WHERE lease_until <= now()
    ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED
) AS c
WHERE q.seq = c.seq
RETURNING q.seq, {", ".join(f"q.{c}" for c in cols.split(", "))}"""
            for table, cols in columns.items()
        }
        self.due_timers = (
            f"SELECT execution_id, path, fire_at FROM {s}.timers WHERE fire_at <= %s"
            " ORDER BY fire_at, seq"
        )
        self.claim_timers = f"""
UPDATE {s}.timers AS t SET lease_until = now() + make_interval(secs => %s)
FROM (
    SELECT execution_id, path FROM {s}.timers WHERE fire_at <= %s AND lease_until <= now()
    ORDER BY fire_at, seq LIMIT %s FOR UPDATE SKIP LOCKED
) AS c
WHERE t.execution_id = c.execution_id AND t.path = c.path
RETURNING t.fire_at, t.seq, t.execution_id, t.path"""
        self.delete_timer = (
            f"DELETE FROM {s}.timers WHERE execution_id = %s AND path = %s AND fire_at = %s"
        )
        self.read_trace = f"SELECT idx, step FROM {s}.trace WHERE execution_id = %s ORDER BY idx"
        forget = [
            ("executions", "id"),
            ("processed", "execution_id"),
            ("timers", "execution_id"),
            ("trace", "execution_id"),
            ("trace_index", "execution_id"),
            ("commit_ids", "execution_id"),
        ]
        self.lock = f"SELECT FROM {s}.executions WHERE id = %s FOR UPDATE"
        self.forget = (
            "WITH "
            + ", ".join(
                f"d{i} AS (DELETE FROM {s}.{table} WHERE {column} = %(id)s)"
                for i, (table, column) in enumerate(forget)
            )
            + " SELECT 1"
        )
        copied = ", ".join(f"{s}.{table}" for table, _ in _COPIED)
        self.dump = {
            "total": "SELECT 1 + "
            + " + ".join(f"(SELECT count(*) FROM {s}.{table})" for table, _ in _COPIED),
            "execution": f"SELECT version, epoch, body FROM {s}.executions",
            "mark": f"SELECT execution_id, event_id FROM {s}.processed",
            "commit": f"SELECT execution_id, commit_id, version, digest FROM {s}.commit_ids",
            "trace": (
                f"SELECT ti.execution_id, ti.next_index, t.idx, t.step FROM {s}.trace_index ti"
                f" LEFT JOIN {s}.trace t USING (execution_id) ORDER BY ti.execution_id, t.idx"
            ),
            "timer": f"SELECT execution_id, path, fire_at FROM {s}.timers ORDER BY seq",
            "outbox": f"SELECT seq, target_id, event FROM {s}.outbox ORDER BY seq",
            "spawn": (
                f"SELECT seq, parent_id, child_id, root_path, context FROM {s}.spawns ORDER BY seq"
            ),
            "seqs": (
                f"SELECT coalesce(pg_sequence_last_value('{s}.outbox_seq'::regclass), 0),"
                f" coalesce(pg_sequence_last_value('{s}.spawns_seq'::regclass), 0)"
            ),
        }
        self.restore = {
            "lock": f"LOCK TABLE {copied}, {s}.trace IN EXCLUSIVE MODE",
            "held": "SELECT "
            + ", ".join(f"(SELECT count(*) FROM {s}.{table})" for table, _ in _COPIED),
            "execution": (
                f"INSERT INTO {s}.executions (id, version, epoch, body) VALUES (%s, %s, %s, %s)"
            ),
            "mark": f"INSERT INTO {s}.processed (execution_id, event_id) VALUES (%s, %s)",
            "commit": (
                f"INSERT INTO {s}.commit_ids (execution_id, commit_id, digest, version)"
                " VALUES (%s, %s, %s, %s)"
            ),
            "step": f"INSERT INTO {s}.trace (execution_id, idx, step) VALUES (%s, %s, %s)",
            "trace": f"INSERT INTO {s}.trace_index (execution_id, next_index) VALUES (%s, %s)",
            "timer": f"INSERT INTO {s}.timers (execution_id, path, fire_at) VALUES (%s, %s, %s)",
            "outbox": f"INSERT INTO {s}.outbox (seq, target_id, event) VALUES (%s, %s, %s)",
            "spawn": (
                f"INSERT INTO {s}.spawns (seq, parent_id, child_id, root_path, context)"
                " VALUES (%s, %s, %s, %s, %s)"
            ),
            "seqs": [
                f"SELECT setval('{s}.{name}_seq'::regclass, greatest("
                f" coalesce(pg_sequence_last_value('{s}.{name}_seq'::regclass), 0),"
                f" (SELECT coalesce(max(seq), 0) FROM {s}.{name}), %s), true)"
                f" WHERE greatest((SELECT coalesce(max(seq), 0) FROM {s}.{name}), %s) > 0"
                for name in ("outbox", "spawns")
            ],
            "wake": (
                f"SELECT pg_notify(%s, '') WHERE EXISTS (SELECT FROM {s}.outbox)"
                f" OR EXISTS (SELECT FROM {s}.spawns) OR EXISTS (SELECT FROM {s}.timers)"
            ),
        }
        self.stats = "SELECT " + ", ".join(
            f"(SELECT count(*) FROM {s}.{table})"
            for table in (
                "executions",
                "outbox",
                "spawns",
                "timers",
                "processed",
                "trace_index",
                "trace",
            )
        )

    def commit(self, shape: tuple[bool, bool, bool, bool, bool, bool]) -> str:
        """The commit statement for a commit of this ``shape``: whether it has emits, a
        processed mark, timers to arm, timers to disarm, spawns, a trace step. The parts
        a commit does not use are left out, so PostgreSQL plans (at each call: its custom
        plans win over a generic one) only what the commit writes; a save is the CAS and
        the commit id's parts. One statement per shape, prepared once per connection; the
        commit id's parts are in every one, so a commit with an id (and its replay) uses
        the statement of the same commit without one."""
        sql = self._commits.get(shape)
        if sql is None:
            sql = self._commits[shape] = _commit_sql(self.schema, shape)
        return sql


_INSPECT = """
SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = %(s)s),
    ARRAY(
        SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') ORDER BY 1
    )"""
_STATS_KEYS = ("executions", "outbox", "spawns", "timers", "processed", "traces", "trace_steps")
_SQL_CACHE: dict[str, _Sql] = {}


# --- the core: every operation once, as a generator of statements -------------------------


class _Query(NamedTuple):
    """One statement an operation needs run: ``prepare`` for the hot ones; with
    ``unique``, a unique violation is sent back as :data:`_UNIQUE` instead of raised."""

    sql: str
    params: Any = None
    prepare: bool | None = None
    unique: bool = False


_UNIQUE = object()
_Op = Generator[_Query, Any, Any]


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
        self.conninfo = conninfo
        self.trace_max = _checks.as_trace_max(trace_max)
        if codec is None:
            codec = JSON
        else:
            _checks.as_codec(codec)
        self.codec = codec
        self.canonical = getattr(codec, "canonical_value", None) or codec.encode_value
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
        return f"{host}{port}/{db} schema {self.schema!r}"

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
        self.marks = tuple((yield _Query(sql.marks))[0])

    def _schema_version(self) -> Generator[_Query, Any, int | None]:
        """The schema version of this package's tables, ``0`` for an empty schema,
        ``None`` for none; a ``StoreError`` for a schema that is not this package's or is
        newer than it."""
        [(exists, names)] = yield _Query(_INSPECT, {"s": self.schema})
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
                f"{self.describe()}: the {SCHEMA_TABLE} table is damaged ({rows[:3]!r})"
            )
        version: int = rows[0][0]
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
        eid = _checks.durable_exe_id(exe)
        body = _checks.commit_body(emits, processed_event_id, timers, spawns, trace, str_ids=True)
        if commit_id is not None:
            commit_id = _checks.as_commit_id(commit_id)
        if epoch is not None:
            epoch = _checks.durable_epoch(epoch)
        version = _checks.durable_exe_version(exe)

        # Encode everything before the statement: a value the codec refuses is a
        # TypeError naming it, and nothing is written.
        blob = _pack(self._encode_exe(exe, eid))
        encode = self._encode
        targets = _Texts()
        events = _Blobs()
        for i, (target, event) in enumerate(body.emits):
            targets.append(target)
            events.append(_pack(encode(event, "the event of emits", i)))
        children = _Texts()
        roots = _Blobs()
        contexts = _Blobs()
        for i, (child_id, root_path, context) in enumerate(body.spawns):
            children.append(child_id)
            roots.append(_pack(encode(root_path, "the root_path of spawns", i)))
            contexts.append(_pack(encode(context, "the context of spawns", i)))
        step = _Blobs()
        if body.trace is not None:
            step.append(_pack(encode(body.trace, "the trace step")))
        cid = _Texts()
        digest = _Blobs()
        if commit_id is not None:
            cid.append(commit_id)
            digest.append(self._digest(body, commit_id))
        # The last op on a path decides its final state; one statement writes each row once.
        final: dict[Any, float | None] = {}
        for action, path, fire_at in body.timers:
            final.pop(path, None)
            final[path] = fire_at if action == "schedule" else None
        arm = _Texts(path for path, at in final.items() if at is not None)
        # Every parameter has one type whatever its value (an optional one is an array
        # of none or one): one prepared statement per connection (see _adapt).
        params = {
            "id": eid,
            "old": version,
            "new": version + 1,
            "epoch": _Ints() if epoch is None else _Ints([epoch]),
            "body": blob,
            "cid": cid,
            "digest": digest,
            "targets": targets,
            "events": events,
            "pev": _Texts()
            if body.processed_event_id is None
            else _Texts([body.processed_event_id]),
            "arm": arm,
            "at": _Floats(final[path] for path in arm),
            "disarm": _Texts(path for path, at in final.items() if at is None),
            "children": children,
            "roots": roots,
            "contexts": contexts,
            "step": step,
            "keep": self.trace_max or 0,
            "channel": self.channel,
        }
        shape = (
            bool(events),
            body.processed_event_id is not None,
            bool(arm),
            bool(params["disarm"]),
            bool(children),
            bool(step),
        )
        for _ in range(2):
            rows = yield _Query(self.sql.commit(shape), params, True, unique=True)
            if rows is not _UNIQUE:
                ok, found, found_epoch, done, done_version = rows[0][:5]
                if done is not None:
                    return self._replayed(exe, eid, commit_id, digest[0], done, done_version)
                if ok:
                    _checks.set_version(exe, version + 1)
                    return None
                if commit_id is None and found is not None:
                    if epoch is not None and found_epoch is not None and found_epoch > epoch:
                        raise StaleWriter(eid, epoch, found_epoch)
                    if found != version:
                        raise StoreConflict(eid, version, found)
            # Refused by a writer the statement did not see (a concurrent first write, an
            # update or a forget after its snapshot), or a unique violation on the commit
            # id: another try of this very commit may have landed. Look again.
            rows = yield _Query(self.sql.recheck, {"id": eid, "cid": cid})
            found, found_epoch, done, done_version = rows[0]
            if done is not None:
                return self._replayed(exe, eid, commit_id, digest[0], done, done_version)
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

    def is_processed(self, execution_id: Any, event_id: Any) -> _Op:
        _checks.str_id(execution_id, "execution_id")
        _checks.str_id(event_id, "event_id")
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

    def claim(self, table: str, limit: Any, lease: Any) -> _Op:
        limit = _checks.as_limit(limit)
        lease = min(_checks.as_lease(lease), _LEASE_MAX)
        if not limit:
            return []
        rows = yield _Query(self.sql.claim[table], (lease, limit), True)
        rows.sort()
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
        return [(eid, path, fire_at) for fire_at, _, eid, path in rows]

    def delete_timer(self, execution_id: Any, path: Any, fire_at: Any) -> _Op:
        _checks.str_id(execution_id, "execution_id")
        _checks.str_id(path, "path")
        fire_at = _checks.as_time(fire_at, "fire_at")
        yield _Query(self.sql.delete_timer, (execution_id, path, fire_at), True)

    # --- trace, retention, monitoring --------------------------------------------------

    def record_trace(self, execution_id: Any, entry: Any) -> _Op:
        step = _checks.trace_step(entry, "trace entry")
        _checks.str_id(execution_id, "execution_id")
        params = {
            "id": execution_id,
            "step": _Blobs([_pack(self._encode(step, "the trace entry"))]),
            "keep": self.trace_max or 0,
        }
        yield _Query(self.sql.record_trace, params, True)

    def read_trace(self, execution_id: Any) -> _Op:
        _checks.str_id(execution_id, "execution_id")
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
        # The execution's row is locked first: a commit in flight holds it until it has
        # landed, and the deletes, a statement later, see everything it wrote.
        yield _Query("BEGIN")
        yield _Query(self.sql.lock, (execution_id,), True)
        yield _Query(self.sql.forget, {"id": execution_id}, True)
        yield _Query("COMMIT")

    def stats(self) -> _Op:
        rows = yield _Query(self.sql.stats)
        return dict(zip(_STATS_KEYS, rows[0]))

    # --- helpers -----------------------------------------------------------------------

    def _entries(self, table: str, rows: list[Any]) -> list[Any]:
        decode = self.codec.decode_value
        if table == "outbox":
            return [OutboxEntry(seq, target, decode(_unpack(event))) for seq, target, event in rows]
        return [
            SpawnEntry(seq, parent, child, decode(_unpack(root)), decode(_unpack(context)))
            for seq, parent, child, root, context in rows
        ]

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


def _pack(data: str | bytes) -> bytes:
    """An encoded value as stored: a tag byte, then UTF-8 (``str``) or the bytes."""
    if type(data) is str:
        return b"t" + data.encode("utf-8", "surrogatepass")
    return b"b" + data  # type: ignore[operator]


def _unpack(data: bytes) -> str | bytes:
    if data[0] == _TEXT:
        return data[1:].decode("utf-8", "surrogatepass")
    return data[1:]


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


class _Texts(list):  # type: ignore[type-arg]
    """A ``text[]`` parameter, typed even when empty (see :func:`_adapt`)."""


class _Blobs(list):  # type: ignore[type-arg]
    """A ``bytea[]`` parameter."""


class _Floats(list):  # type: ignore[type-arg]
    """A ``float8[]`` parameter."""


class _Ints(list):  # type: ignore[type-arg]
    """A ``bigint[]`` parameter."""


_ARRAYS = {_Texts: "text", _Blobs: "bytea", _Floats: "float8", _Ints: "int8"}
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
            else:
                result = cur.fetchall() if _has_rows(cur) else cur.rowcount
            try:
                query = op.send(result)
            except StopIteration as stop:
                return stop.value
    except BaseException as exc:
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
            else:
                result = await cur.fetchall() if _has_rows(cur) else cur.rowcount
            try:
                query = op.send(result)
            except StopIteration as stop:
                return stop.value
    except BaseException as exc:
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


# Operations that write what a retry could write twice; the others are retried once on a
# new connection when theirs fails.
_NO_RETRY = frozenset(["commit", "save", "record_trace"])


class PostgresStore(_transfer.Uncopyable):
    """The durable ``ExecutionStore`` on PostgreSQL (see the module docstring).

    ``conninfo`` is a libpq URL (``postgresql://user@host:5432/db``) or key=value string,
    passed to psycopg. ``schema`` is the PostgreSQL schema of the store's tables, created
    on first open. ``codec`` encodes executions and values (default: JSON, see
    :mod:`harel_store._codec`). ``pool_size`` is the most connections the store opens at
    once (one is kept open; ``wait_for_work`` opens one more). ``prepare=False`` prepares
    no statement (PgBouncer in transaction mode). ``timeout`` is how long a call waits
    for a connection before it raises :class:`~harel_store.StoreError`.

    Opening connects, checks the schema (creating or upgrading it under an advisory lock),
    and raises ``StoreError`` when the server cannot be reached or the schema is foreign
    or newer.
    """

    preserves_identity = False
    durable = True
    _copy_hint = "open another store on the same conninfo and schema"

    __slots__ = ("__weakref__", "_core", "_listening", "_pool")

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
    ) -> None:
        self._pool: _Pool | None = None
        self._listening = threading.Lock()  # wait_for_work's turn on the listener
        psycopg = _import_psycopg()
        core = self._core = _Core(conninfo, trace_max, codec, schema, pool_size, prepare, timeout)
        try:
            conn = psycopg.Connection.connect(core.conninfo, **_connect_kwargs(core))
        except psycopg.Error as exc:
            raise _cannot_open(core, exc) from exc
        try:
            _adapt(conn)
            op = core.open()
            _run_on(conn, op, next(op))
        except BaseException as exc:
            conn.close()
            if isinstance(exc, psycopg.Error):
                raise _cannot_open(core, exc) from exc
            raise
        pool = self._pool = _Pool(core)
        pool.adopt(conn)  # the connection that opened the store serves its calls
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
        while True:
            if pool.closed:  # by close() in another thread, which closed the listener
                raise _closed()
            try:
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
            except psycopg.OperationalError as exc:
                pool.drop_listener()
                if pool.closed:
                    raise _closed() from None
                left = deadline - time.monotonic()
                if left <= 0.0:
                    raise StoreError(
                        f"wait_for_work: no connection to PostgreSQL ({self._core.describe()}) "
                        f"for LISTEN: {exc}"
                    ) from exc
                time.sleep(min(pause, left))
                pause = min(pause * 2.0, _RECONNECT_MAX)

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
        except psycopg.Error as exc:
            clear = _clear(exc)
            if clear is exc:
                raise
            raise clear from exc
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
        tries = 1 if name in _NO_RETRY else 2
        for attempt in range(tries):
            op = method(*args)
            try:
                query = next(op)
            except StopIteration as stop:
                return stop.value
            pool = self._open_pool()
            conn = pool.get()
            try:
                return _run_on(conn, op, query)
            except psycopg.OperationalError as exc:
                op.close()
                if attempt + 1 == tries:
                    raise _lost(self._core, name, exc, name in _NO_RETRY) from exc
            finally:
                pool.put(conn)
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


class AsyncPostgresStore(_transfer.Uncopyable):
    """The ``async`` twin of :class:`PostgresStore`, with the same arguments, on
    psycopg's async connections: no call blocks the event loop.

    The constructor does no I/O: the store opens (connects, checks or creates the
    schema, reads the seq marks) at its first call, or at ``async with``; a server that
    cannot be reached or a refused schema raises its ``StoreError`` from there, and
    ``wait_for_work`` counts work from then. Its connections (:class:`_AsyncPool`) serve
    any event loop, one at a time: a store may outlive an ``asyncio.run``.

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
    ) -> None:
        self._closed = True
        _import_psycopg()
        self._core = _Core(conninfo, trace_max, codec, schema, pool_size, prepare, timeout)
        self._pool = _AsyncPool(self._core)
        self._opened = False
        self._opening: asyncio.Task[None] | None = None
        self._looks: set[asyncio.Future[None]] = set()  # wait_for_work's, running
        self._owed = False  # a wake-up taken and not yet returned
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
        await self._run("save", exe, epoch)

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
        await self._run(
            "commit", exe, emits, processed_event_id, timers, spawns, trace, commit_id, epoch
        )

    async def is_processed(self, execution_id: str, event_id: str) -> bool:
        return await self._run("is_processed", execution_id, event_id)  # type: ignore[no-any-return]

    async def pending_outbox(self) -> list[OutboxEntry]:
        return await self._run("pending", "outbox")  # type: ignore[no-any-return]

    async def ack_outbox(self, seq: int) -> None:
        await self._run("ack", "outbox", seq)

    async def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        return await self._run("claim", "outbox", limit, lease)  # type: ignore[no-any-return]

    async def pending_spawns(self) -> list[SpawnEntry]:
        return await self._run("pending", "spawns")  # type: ignore[no-any-return]

    async def ack_spawn(self, seq: int) -> None:
        await self._run("ack", "spawns", seq)

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

    async def append_trace(self, execution_id: str, entry: Mapping[str, Any]) -> None:
        await self._run("record_trace", execution_id, entry)

    async def read_trace(self, execution_id: str) -> list[dict[str, Any]]:
        return await self._run("read_trace", execution_id)  # type: ignore[no-any-return]

    async def forget(self, execution_id: str) -> None:
        await self._run("forget", execution_id)

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
            if not isinstance(exc, psycopg.OperationalError):
                raise exc
            await self._pool.drop_listener()
            if self._closed:
                raise _closed()
            left = deadline - time.monotonic()
            if left <= 0.0:
                raise StoreError(
                    f"wait_for_work: no connection to PostgreSQL ({self._core.describe()}) "
                    f"for LISTEN: {exc}"
                ) from exc
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2.0, _RECONNECT_MAX)

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

    async def close(self) -> None:
        """Close the connections; a second close does nothing. Every other method of a
        closed store raises ``ValueError``."""
        if self._closed:
            return
        self._closed = True
        for look in list(self._looks):  # waiting on the listening connection
            look.cancel()
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
                    raise _lost(core, "_record_trace", exc, False) from exc
                raise _cannot_open(core, exc) from exc
            _adapt(conn)
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
        except psycopg.OperationalError as exc:
            pool._close_recorder()
            raise _lost(core, "_record_trace", exc, True) from exc

    # --- helpers -----------------------------------------------------------------------

    async def _run(self, name: str, *args: Any) -> Any:
        import psycopg

        if self._closed:
            raise _closed()
        if not self._opened:
            await self._ready()
        method = getattr(self._core, name)
        tries = 1 if name in _NO_RETRY else 2
        for attempt in range(tries):
            op = method(*args)
            try:
                query = next(op)
            except StopIteration as stop:
                return stop.value
            conn = await self._pool.get()
            try:
                return await _arun_on(conn, op, query)
            except psycopg.OperationalError as exc:
                op.close()
                if attempt + 1 == tries:
                    raise _lost(self._core, name, exc, name in _NO_RETRY) from exc
            finally:
                await self._pool.put(conn)
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
        """Connect, check or create the schema, read the seq marks; the connection then
        serves the calls."""
        import psycopg

        core = self._core
        try:
            conn = await psycopg.AsyncConnection.connect(core.conninfo, **_connect_kwargs(core))
        except psycopg.Error as exc:
            raise _cannot_open(core, exc) from exc
        try:
            _adapt(conn)
            op = core.open()
            await _arun_on(conn, op, next(op))
        except BaseException as exc:
            await conn.close()
            if isinstance(exc, psycopg.Error):
                raise _cannot_open(core, exc) from exc
            raise
        if self._closed:
            await conn.close()
            raise _closed()
        self._pool.adopt(conn)
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
