"""Seeing what a SQLite store holds and pruning it (PRODUCTION.md sections 8 and 9): the
schema step that adds when outbox and spawn entries were committed and when marks and
commit ids were recorded (wall-clock seconds, the database's ``julianday('now')``), the
indexes the overview reads, and the queries. Rows that predate the step count as made at
the migration."""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from .. import _checks, _operate
from ._connection import _closed, _id, _read_failed

_log = logging.getLogger("harel_store.sqlite")
NOW = "((julianday('now') - 2440587.5) * 86400.0)"


def _rebuild(table: str, columns: str, shape: str, stamp: str, key: str = "") -> tuple[str, ...]:
    """Statements giving ``table`` a ``stamp`` column defaulting to the time of the insert:
    SQLite adds no column with such a default, so the table is made anew and filled. The
    queues keep their AUTOINCREMENT; the other tables are WITHOUT ROWID, as before."""
    steps: tuple[str, ...] = (
        f"ALTER TABLE {table} RENAME TO old_{table}",
        f"CREATE TABLE {table} ({shape}, {stamp} REAL NOT NULL DEFAULT ({NOW})"
        + (f", PRIMARY KEY ({key})) WITHOUT ROWID" if key else ")"),
        f"INSERT INTO {table} ({columns}) SELECT {columns} FROM old_{table}",
    )
    if not key:  # the AUTOINCREMENT high-water mark goes on: no seq is ever handed out twice
        steps += (
            f"DELETE FROM sqlite_sequence WHERE name = '{table}'",
            f"UPDATE sqlite_sequence SET name = '{table}' WHERE name = 'old_{table}'",
        )
    return (*steps, f"DROP TABLE old_{table}")


# Schema version 1 -> 2.
MIGRATION: tuple[str, ...] = (
    *_rebuild(
        "outbox",
        "seq, target_id, event, lease_until",
        "seq INTEGER PRIMARY KEY AUTOINCREMENT, target_id TEXT, event BLOB NOT NULL,"
        " lease_until REAL NOT NULL DEFAULT 0",
        "committed_at",
    ),
    *_rebuild(
        "spawns",
        "seq, parent_id, child_id, root_path, context, lease_until",
        "seq INTEGER PRIMARY KEY AUTOINCREMENT, parent_id TEXT NOT NULL,"
        " child_id TEXT NOT NULL, root_path BLOB NOT NULL, context BLOB NOT NULL,"
        " lease_until REAL NOT NULL DEFAULT 0",
        "committed_at",
    ),
    *_rebuild(
        "processed",
        "execution_id, event_id",
        "execution_id TEXT NOT NULL, event_id TEXT NOT NULL",
        "recorded_at",
        "execution_id, event_id",
    ),
    *_rebuild(
        "commit_ids",
        "execution_id, commit_id, digest, version",
        "execution_id TEXT NOT NULL, commit_id TEXT NOT NULL, digest BLOB NOT NULL,"
        " version INTEGER NOT NULL",
        "recorded_at",
        "execution_id, commit_id",
    ),
    # Partial: a claim's "lease_until <= ?" cannot use them, so claims keep their plan.
    "CREATE INDEX outbox_leases ON outbox (lease_until) WHERE lease_until > 0",
    "CREATE INDEX spawns_leases ON spawns (lease_until) WHERE lease_until > 0",
    "CREATE INDEX timers_leases ON timers (lease_until) WHERE lease_until > 0",
    "CREATE INDEX processed_by_recorded_at ON processed (recorded_at)",  # gone in version 3
    "CREATE INDEX commit_ids_by_recorded_at ON commit_ids (recorded_at)",
)

_OVERVIEW = (
    "SELECT (SELECT count(*) FROM executions), (SELECT count(*) FROM outbox),"
    " (SELECT count(*) FROM spawns), (SELECT count(*) FROM timers),"
    " (SELECT count(*) FROM processed), (SELECT count(*) FROM commit_ids),"
    " (SELECT committed_at FROM outbox ORDER BY seq LIMIT 1),"
    " (SELECT committed_at FROM spawns ORDER BY seq LIMIT 1),"
    " (SELECT count(*) FROM outbox WHERE lease_until > 0 AND lease_until > ?),"
    " (SELECT count(*) FROM spawns WHERE lease_until > 0 AND lease_until > ?),"
    " (SELECT count(*) FROM timers WHERE lease_until > 0 AND lease_until > ?),"
    " (SELECT count(*) FROM outbox WHERE lease_until > 0 AND lease_until <= ?)"
    " + (SELECT count(*) FROM spawns WHERE lease_until > 0 AND lease_until <= ?)"
    " + (SELECT count(*) FROM timers WHERE lease_until > 0 AND lease_until <= ?),"
    " (SELECT count(*) FROM timers WHERE fire_at <= ?),"
    " (SELECT min(fire_at) FROM timers WHERE fire_at > ?),"
    f" {NOW}"
)
_LIST = "SELECT id FROM executions WHERE id > ? ORDER BY id LIMIT ?"
_LIST_FIRST = "SELECT id FROM executions ORDER BY id LIMIT ?"
# Prune walks a table's keys a window at a time: no index on recorded_at for every commit
# to write (schema 3), and each transaction reads one window of rows.
_KEYS = {"processed": "event_id", "commit_ids": "commit_id"}
_SHOW = {
    "epoch": "SELECT epoch FROM executions WHERE id = ?",
    "outbox": "SELECT seq, event, lease_until, committed_at FROM outbox WHERE target_id = ?"
    " ORDER BY seq",
    "spawns": "SELECT seq, parent_id, child_id, lease_until, committed_at FROM spawns"
    " WHERE parent_id = ? OR child_id = ? ORDER BY seq",
    "timers": "SELECT path, fire_at, lease_until FROM timers WHERE execution_id = ?"
    " ORDER BY fire_at, seq",
    "processed": "SELECT count(*) FROM processed WHERE execution_id = ?",
    "commit_ids": "SELECT count(*) FROM commit_ids WHERE execution_id = ?",
}


def overview(store: Any, now: Any) -> dict[str, Any]:
    """The figures of PRODUCTION.md section 8, read in one statement (one snapshot)."""
    clock = store._now()
    now = clock if now is None else _checks.as_now(now)
    # Plain placeholders, in order: numbered ones with a sequence are deprecated (3.12).
    row = store._read_one(
        _OVERVIEW,
        (
            clock,
            clock,
            clock,
            clock,
            clock,
            clock,
            now,
            now,
        ),
    )
    figures = dict(zip(_operate.OVERVIEW_KEYS, row))
    wall = row[-1]
    figures["outbox_oldest_age"] = _operate.age(wall, figures["outbox_oldest_age"])
    figures["spawns_oldest_age"] = _operate.age(wall, figures["spawns_oldest_age"])
    return figures


def list_executions(store: Any, after: Any, limit: Any) -> list[str]:
    after = _operate.as_after(after)
    limit = _operate.as_page(limit)
    if after is None:
        rows = store._read(_LIST_FIRST, (limit,))
    else:
        rows = store._read(_LIST, (after, limit))
    return [eid for (eid,) in rows]


def prune(store: Any, older_than: Any, batch: int = _operate.PRUNE_BATCH) -> dict[str, int]:
    """Delete what was recorded more than ``older_than`` seconds ago, a transaction per
    ``batch`` rows; the lock is let go between batches, so committers wait one batch at
    most."""
    older_than = _operate.as_older_than(older_than)
    deleted = dict.fromkeys(_operate.PRUNE_KEYS, 0)
    for table in _operate.PRUNE_KEYS:
        after: tuple[Any, Any] | None = None
        while True:
            n, after = _prune_window(store, table, older_than, after, batch)
            deleted[table] += n
            if after is None:
                break
    return deleted


def _prune_window(
    store: Any, table: str, older_than: float, after: Any, batch: int
) -> tuple[int, Any]:
    """In one transaction, delete the rows recorded more than ``older_than`` seconds ago
    among the ``batch`` keys of ``table`` that follow ``after`` (from the first key when
    ``None``): how many, and the last key of the window (``None`` when it was the last)."""
    key = f"(execution_id, {_KEYS[table]})"
    start = "" if after is None else f" AND {key} > (?, ?)"
    with store._transaction() as conn:
        end = conn.execute(
            f"SELECT execution_id, {_KEYS[table]} FROM {table} WHERE 1{start}"
            f" ORDER BY execution_id, {_KEYS[table]} LIMIT 1 OFFSET ?",
            (*(after or ()), batch - 1),
        ).fetchone()
        stop = "" if end is None else f" AND {key} <= (?, ?)"
        n = conn.execute(
            f"DELETE FROM {table} WHERE recorded_at < {NOW} - ?{start}{stop}",
            (older_than, *(after or ()), *(end or ())),
        ).rowcount
    return int(n), None if end is None else tuple(end)


def show(store: Any, execution_id: Any) -> dict[str, Any] | None:
    """One execution as the ``show`` command prints it, read in one snapshot; ``None``
    when the store holds nothing of it."""
    _id(execution_id, "execution_id")
    decode = store._codec.decode_value
    eid = execution_id
    exe = store.load(eid)
    trace = store.read_trace(eid)
    with store._lock:
        conn = store._conn
        if conn is None:
            raise _closed()
        try:
            epoch = conn.execute(_SHOW["epoch"], (eid,)).fetchone()
            outbox = conn.execute(_SHOW["outbox"], (eid,)).fetchall()
            spawns = conn.execute(_SHOW["spawns"], (eid, eid)).fetchall()
            timers = conn.execute(_SHOW["timers"], (eid,)).fetchall()
            (marks,) = conn.execute(_SHOW["processed"], (eid,)).fetchone()
            (commits,) = conn.execute(_SHOW["commit_ids"], (eid,)).fetchone()
            (wall,) = conn.execute(f"SELECT {NOW}").fetchone()
        except sqlite3.Error as exc:
            raise _read_failed(store._path, exc) from exc
    return _operate.execution_view(
        eid,
        exe,
        trace,
        (None if epoch is None else epoch[0], marks, commits),
        (
            [(s, decode(e), lu, wall - at) for s, e, lu, at in outbox],
            [(s, p, c, lu, wall - at) for s, p, c, lu, at in spawns],
            timers,
        ),
    )


# The leases a claim takes over: those that ran out, up to the last row claimed (a claim
# takes the first claimable rows in its order). The partial lease index answers it; with
# no lease run out, the range it reads is empty.
_TAKEN = {
    table: f"SELECT seq FROM {table} WHERE lease_until > 0 AND lease_until <= ? AND seq <= ?"
    " ORDER BY seq"
    for table in ("outbox", "spawns")
}
_TAKEN["timers"] = (
    "SELECT execution_id, path FROM timers WHERE lease_until > 0 AND lease_until <= ?"
    " AND fire_at <= ? ORDER BY fire_at, seq"
)


def taken_over(conn: sqlite3.Connection, table: str, clock: float, last: Any) -> Any:
    """The leases of ``table`` that ran out by ``clock`` a claim ending at ``last`` (its
    last seq, or a timer's ``fire_at``) takes over, a list (empty: none): their seqs, a
    timer's ``(execution_id, path)``. Typed ``Any``: the store's claim starts from
    ``taken = 0``."""
    rows = conn.execute(_TAKEN[table], (clock, last)).fetchall()
    return [row[0] for row in rows] if table != "timers" else rows


def log_takeover(path: str, table: str, taken: Any) -> None:
    _operate.log_takeover(_log, path, table, taken)
