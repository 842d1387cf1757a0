"""The SQLite store's schema: :data:`MIGRATIONS` (the list whose index is the version it
upgrades from), every SQL statement the stores run, and what happens at open: the schema
checked (a foreign, newer or damaged database is refused, unchanged), then created or
upgraded. The schema is read here, so a test that swaps ``MIGRATIONS`` patches this module."""

from __future__ import annotations

import logging
import sqlite3
import time

from .._errors import StoreError
from . import _operate
from ._connection import _MEMORY, _is_busy, _rollback

SCHEMA_TABLE = "harel_store_schema"
_log = logging.getLogger("harel_store.sqlite")

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
    _operate.MIGRATION,
    # 2 -> 3: fewer pages and statements per commit (issue 27 item 7). Timers and the trace
    # ring are keyed by what the hot path looks them up by (WITHOUT ROWID: no separate
    # index to write); a timer's seq, its arming order, is taken from the work counter
    # (which every arming bumps) instead of an AUTOINCREMENT, so the counter first moves
    # past every seq kept. Marks and commit ids lose their recorded_at indexes: prune walks
    # the keys instead, and no commit writes an index for it.
    (
        "ALTER TABLE timers RENAME TO old_timers",
        (
            "CREATE TABLE timers ("
            " execution_id TEXT NOT NULL, path TEXT NOT NULL, fire_at REAL NOT NULL,"
            " seq INTEGER NOT NULL, lease_until REAL NOT NULL DEFAULT 0,"
            " PRIMARY KEY (execution_id, path)) WITHOUT ROWID"
        ),
        (
            "INSERT INTO timers (execution_id, path, fire_at, seq, lease_until)"
            " SELECT execution_id, path, fire_at, seq, lease_until FROM old_timers"
        ),
        "DROP TABLE old_timers",
        "CREATE INDEX timers_by_fire_at ON timers (fire_at, seq)",
        "CREATE INDEX timers_leases ON timers (lease_until) WHERE lease_until > 0",
        "UPDATE work SET n = max(n, (SELECT coalesce(max(seq), 0) FROM timers)) + 1",
        "ALTER TABLE trace RENAME TO old_trace",
        (
            "CREATE TABLE trace ("
            " execution_id TEXT NOT NULL, idx INTEGER NOT NULL, step BLOB NOT NULL,"
            " PRIMARY KEY (execution_id, idx)) WITHOUT ROWID"
        ),
        "INSERT INTO trace (execution_id, idx, step) SELECT execution_id, idx, step FROM old_trace",
        "DROP TABLE old_trace",
        "DROP INDEX processed_by_recorded_at",
        "DROP INDEX commit_ids_by_recorded_at",
    ),
    # 3 -> 4: a step no longer writes its ring's row: the next index follows the ring's
    # last step (its indexes are consecutive), and the row keeps only what an empty ring
    # needs, the index its first step gets (a ring copied in empty keeps its next index).
    (
        "ALTER TABLE trace_index RENAME TO old_trace_index",
        (
            "CREATE TABLE trace_index ("
            " execution_id TEXT PRIMARY KEY, next_index INTEGER NOT NULL) WITHOUT ROWID"
        ),
        (
            "INSERT INTO trace_index (execution_id, next_index)"
            " SELECT execution_id, next_index FROM old_trace_index"
        ),
        "DROP TABLE old_trace_index",
    ),
]
SCHEMA_VERSION = len(MIGRATIONS)


def _objects() -> frozenset[str]:
    """What the migrations leave, by name: a database at SCHEMA_VERSION must hold all of
    it. A table's indexes go with it when it is renamed or dropped."""
    tables: set[str] = set()
    indexes: dict[str, str] = {}  # index -> its table
    for step in MIGRATIONS:
        for sql in step:
            words = sql.split()
            if words[:2] == ["CREATE", "TABLE"]:
                tables.add(words[2])
            elif words[:2] == ["CREATE", "INDEX"]:
                indexes[words[2]] = words[4]
            elif words[:2] == ["DROP", "INDEX"]:
                del indexes[words[2]]
            elif words[:2] == ["DROP", "TABLE"] or words[3:5] == ["RENAME", "TO"]:
                tables.discard(words[2])  # renamed: "old_..." only ever to be dropped
                indexes = {name: t for name, t in indexes.items() if t != words[2]}
    return frozenset(tables | set(indexes))


SCHEMA_OBJECTS = _objects()

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
# A timer's seq: the work counter, which the commit moved on by its number of armings
# first; the k-th from the end gets n - k.
_ARM = (
    "INSERT INTO timers (execution_id, path, fire_at, seq)"
    " VALUES (?, ?, ?, (SELECT n FROM work) - ?)"
    " ON CONFLICT (execution_id, path) DO UPDATE"
    " SET fire_at = excluded.fire_at, seq = excluded.seq, lease_until = 0"
)
_DISARM = "DELETE FROM timers WHERE execution_id = ? AND path = ?"
_SPAWN = "INSERT INTO spawns (parent_id, child_id, root_path, context) VALUES (?, ?, ?, ?)"
_DONE = "SELECT digest, version FROM commit_ids WHERE execution_id = ? AND commit_id = ?"
_RECORD = "INSERT INTO commit_ids (execution_id, commit_id, digest, version) VALUES (?, ?, ?, ?)"
_BUMP = "UPDATE work SET n = n + 1"
_BUMP_BY = "UPDATE work SET n = n + ?"
_WORK = "SELECT n FROM work"
# A ring's first and last index (each found at one end of the key), and an empty ring's
# next index.
_RING = (
    "SELECT (SELECT min(idx) FROM trace WHERE execution_id = ?),"
    " (SELECT max(idx) FROM trace WHERE execution_id = ?)"
)
_TRACE_INDEX = "SELECT next_index FROM trace_index WHERE execution_id = ?"
_NEW_RING = "INSERT INTO trace_index (execution_id, next_index) VALUES (?, ?)"
_STEP = "INSERT INTO trace (execution_id, idx, step) VALUES (?, ?, ?)"
_TRIM = "DELETE FROM trace WHERE execution_id = ? AND idx <= ?"
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
    "SELECT execution_id, path, fire_at FROM timers"
    " WHERE fire_at <= ? AND lease_until <= ? ORDER BY fire_at, seq LIMIT ?"
)
_LEASE_TIMER = "UPDATE timers SET lease_until = ? WHERE execution_id = ? AND path = ?"


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
_RESTORE_RING = "INSERT INTO trace_index (execution_id, next_index) VALUES (?, ?)"
# Timers in arming order, each with its place k: seq = the counter + k (moved on after).
_RESTORE_TIMER = (
    "INSERT INTO timers (execution_id, path, fire_at, seq)"
    " VALUES (?, ?, ?, (SELECT n FROM work) + ?)"
)
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


# Pages the WAL may hold before a commit copies them into the database (SQLite's default
# is 1,000). Each such checkpoint costs two fsyncs, and a batch of 100 commits writes about
# 150-250 pages (one per execution for the ring and the dedupe marks): at 1,000, every
# fifth batch paid one. 4,000 pages: a WAL of up to 16 MiB (4 KiB pages) before it restarts.
WAL_AUTOCHECKPOINT = 4000


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


def _prepare_once(conn: sqlite3.Connection, path: str, synchronous: str) -> None:
    """Check the schema, refusing a foreign or newer one before changing anything; then
    WAL mode and ``synchronous``; then create or upgrade the schema."""
    version = _schema_version(conn, path)
    if path != _MEMORY:
        conn.execute("PRAGMA journal_mode = WAL").fetchone()
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    # The statement journal of an upsert (timers) in memory: past 64 KiB SQLite spills it
    # to a temporary file, page by page. The store's other temporary structures are small
    # (the IN lists of a batch); its ORDER BYs follow indexes.
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT}")
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
        if version:
            _log.info("%s: schema migrated from version %d to %d", path, version, SCHEMA_VERSION)
    except BaseException:
        _rollback(conn)
        raise


def _schema_version(conn: sqlite3.Connection, path: str) -> int:
    """The schema version of this package's tables, ``0`` for an empty database; a
    ``StoreError`` for a database that is not this package's, is newer than it, or is
    damaged: a row the schema needs (the version, the work counter) missing or
    malformed, or a table or index missing."""
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
        raise _damaged(path, f"its {SCHEMA_TABLE} table holds {rows[:3]!r}, not one version")
    version: int = rows[0][0]
    missing = SCHEMA_OBJECTS - names
    if version == SCHEMA_VERSION and missing:
        raise _damaged(path, f"it lacks {', '.join(sorted(missing))}")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path!r} has harel_store schema version {version}, newer than this "
            f"harel_store's ({SCHEMA_VERSION}): upgrade harel_store to open it; "
            "nothing was changed"
        )
    if "work" in names:
        _work_counter(conn, path)
    return version


def _work_counter(conn: sqlite3.Connection, path: str) -> int:
    """The work counter: the one row of ``work``, an integer, which the schema made; a
    ``StoreError`` of a damaged database when it is missing or malformed."""
    rows = conn.execute(_WORK).fetchall()
    if len(rows) != 1 or type(rows[0][0]) is not int:
        raise _damaged(path, f"its work table holds {rows[:3]!r}, not one counter")
    n: int = rows[0][0]
    return n


def _damaged(path: str, what: str) -> StoreError:
    return StoreError(f"{path!r}: the harel_store database is damaged: {what}; nothing was changed")
