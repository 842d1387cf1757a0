"""Seeing what a PostgreSQL store holds and pruning it (PRODUCTION.md sections 8 and 9):
the schema step that adds when outbox and spawn entries were committed and when marks and
commit ids were recorded (``timestamptz`` on the database's clock; PostgreSQL keeps the
default of the ``ALTER`` for the rows already there, so they count as made at the
migration), the indexes the overview reads (schema 2; schema 3 drops those on when marks
and commit ids were recorded, which every commit wrote: prune walks the keys instead), and
each operation as a generator of statements run by the stores like the core's."""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import _checks, _operate

_log = logging.getLogger("harel_store.postgres")

_STAMPS = (("outbox", "committed_at"), ("spawns", "committed_at"),
           ("processed", "recorded_at"), ("commit_ids", "recorded_at"))  # fmt: skip

# Schema version 1 -> 2. Partial lease indexes: a claim's "lease_until <= now()" cannot
# use them, so claims keep their plans, and a commit (lease '-infinity') never touches them.
MIGRATION: tuple[str, ...] = (
    *(
        f"ALTER TABLE {{s}}.{table} ADD COLUMN {column} timestamptz NOT NULL DEFAULT now()"
        for table, column in _STAMPS
    ),
    *(
        f"CREATE INDEX {table}_leases ON {{s}}.{table} (lease_until)"
        " WHERE lease_until > '-infinity'"
        for table in ("outbox", "spawns", "timers")
    ),
    "CREATE INDEX processed_by_recorded_at ON {s}.processed (recorded_at)",
    "CREATE INDEX commit_ids_by_recorded_at ON {s}.commit_ids (recorded_at)",
)


def _leased(s: str, table: str, live: bool) -> str:
    test = "> now()" if live else "<= now()"
    return (
        f"(SELECT count(*) FROM {s}.{table} WHERE lease_until > '-infinity' AND lease_until {test})"
    )


def _overview(s: str) -> str:
    counts = ", ".join(
        f"(SELECT count(*) FROM {s}.{t})"
        for t in ("executions", "outbox", "spawns", "timers", "processed", "commit_ids")
    )
    oldest = ", ".join(
        f"extract(epoch FROM now() - (SELECT committed_at FROM {s}.{t} ORDER BY seq LIMIT 1))"
        for t in ("outbox", "spawns")
    )
    leased = ", ".join(_leased(s, t, True) for t in ("outbox", "spawns", "timers"))
    expired = " + ".join(_leased(s, t, False) for t in ("outbox", "spawns", "timers"))
    return (
        f"SELECT {counts}, {oldest}, {leased}, {expired},"
        f" (SELECT count(*) FROM {s}.timers WHERE fire_at <= %(now)s),"
        f" (SELECT min(fire_at) FROM {s}.timers WHERE fire_at > %(now)s)"
    )


# Schema version 2 -> 3: marks and commit ids lose their recorded_at indexes, which every
# commit wrote (two more index entries in its typical statement); prune walks the tables'
# keys a window at a time instead (_prune), as the SQLite store's does.
UNINDEXED: tuple[str, ...] = (
    "DROP INDEX {s}.processed_by_recorded_at",
    "DROP INDEX {s}.commit_ids_by_recorded_at",
)


def _prune(s: str, table: str, key: str, first: bool) -> str:
    """One window of ``batch`` keys of ``table``, from its first key or after the one
    given: the rows of it recorded before the horizon deleted (found by their ``ctid``:
    a join could read the whole table), how many, how many keys the window held, and
    its last key."""
    after = "" if first else f" WHERE (execution_id, {key}) > (%(eid)s, %(key)s)"
    return f"""
WITH w AS (
    SELECT ctid, execution_id, {key}, recorded_at FROM {s}.{table}{after}
    ORDER BY execution_id, {key} LIMIT %(batch)s
), d AS (
    DELETE FROM {s}.{table} WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM w WHERE recorded_at < now() - make_interval(secs => %(age)s)))
      AND recorded_at < now() - make_interval(secs => %(age)s)
    RETURNING 1
), last AS (
    SELECT execution_id, {key} FROM w ORDER BY execution_id DESC, {key} DESC LIMIT 1
)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM w),
    (SELECT execution_id FROM last), (SELECT {key} FROM last)"""


def overview(schema: str, now: Any) -> tuple[str, dict[str, float]]:
    """The statement of ``overview`` and its parameters."""
    now = time.time() if now is None else _checks.as_now(now)
    return _overview(schema), {"now": now}


def overview_figures(rows: list[Any]) -> dict[str, Any]:
    figures = dict(zip(_operate.OVERVIEW_KEYS, rows[0]))
    for key in ("outbox_oldest_age", "spawns_oldest_age"):
        age = figures[key]
        figures[key] = None if age is None else max(0.0, float(age))
    return figures


def list_executions(schema: str, after: Any, limit: Any) -> tuple[str, tuple[Any, ...]]:
    """The statement of ``list_executions`` and its parameters."""
    after = _operate.as_after(after)
    limit = _operate.as_page(limit)
    if after is None:
        return f"SELECT id FROM {schema}.executions ORDER BY id LIMIT %s", (limit,)
    return f"SELECT id FROM {schema}.executions WHERE id > %s ORDER BY id LIMIT %s", (after, limit)


def prune_step(
    schema: str, table: str, older_than: float, batch: int, after: tuple[str, str] | None
) -> tuple[str, dict[str, Any]]:
    """The statement deleting what ``table`` (``processed`` or ``commit_ids``) recorded
    more than ``older_than`` seconds ago among its ``batch`` keys after ``after`` (from
    its first key when ``None``), a transaction of its own, and its parameters."""
    if table not in _operate.PRUNE_KEYS:
        raise ValueError(f"no table {table!r} to prune")
    key = "event_id" if table == "processed" else "commit_id"
    params: dict[str, Any] = {"age": older_than, "batch": batch}
    if after is not None:
        params["eid"], params["key"] = after
    return _prune(schema, table, key, after is None), params


def pruned(rows: list[Any], batch: int) -> tuple[int, tuple[str, str] | None]:
    """What a window of :func:`prune_step` deleted, and the key the next one starts
    after (``None``: the table's last window was read)."""
    [(deleted, seen, eid, key)] = rows
    return int(deleted), None if seen < batch else (eid, key)


def _lease(column: str = "lease_until") -> str:
    return f"CASE WHEN {column} > '-infinity' THEN extract(epoch FROM {column})::float8 END"


def show(schema: str) -> dict[str, str]:
    """The statements ``show`` reads one execution with (parameter ``id``), run in one
    read-only snapshot: its epoch, counts of marks and commit ids and the database's clock;
    the outbox entries to it and the spawn intents it made or is the child of, with their
    leases (seconds since the epoch, ``None`` when not leased) and ages; its timers."""
    s = schema
    age = "extract(epoch FROM now() - committed_at)::float8"
    return {
        "figures": (
            f"SELECT (SELECT epoch FROM {s}.executions WHERE id = %(id)s),"
            f" (SELECT count(*) FROM {s}.processed WHERE execution_id = %(id)s),"
            f" (SELECT count(*) FROM {s}.commit_ids WHERE execution_id = %(id)s)"
        ),
        "outbox": f"SELECT seq, event, {_lease()}, {age} FROM {s}.outbox"
        " WHERE target_id = %(id)s ORDER BY seq",
        "spawns": f"SELECT seq, parent_id, child_id, {_lease()}, {age} FROM {s}.spawns"
        " WHERE parent_id = %(id)s OR child_id = %(id)s ORDER BY seq",
        "timers": f"SELECT path, fire_at, {_lease()} FROM {s}.timers"
        " WHERE execution_id = %(id)s ORDER BY fire_at, seq",
    }


def shown(eid: str, exe: Any, trace: list[Any], rows: dict[str, list[Any]], decode: Any) -> Any:
    """What ``show`` prints of ``eid``, from the rows of :func:`show`'s statements
    (``decode`` reading an outbox event as stored); ``None`` when the store holds nothing
    of it."""
    [counted] = rows["figures"]
    outbox = [(s, decode(e), lu, at) for s, e, lu, at in rows["outbox"]]
    return _operate.execution_view(
        eid, exe, trace, counted, (outbox, rows["spawns"], rows["timers"])
    )


def prune(run: Any, older_than: Any, batch: int = _operate.PRUNE_BATCH) -> dict[str, int]:
    """``prune`` of the sync store, ``run`` being its way to run a core operation."""
    older_than = _operate.as_older_than(older_than)
    deleted = dict.fromkeys(_operate.PRUNE_KEYS, 0)
    for table in _operate.PRUNE_KEYS:
        after = None
        while True:
            n, after = run("prune_step", table, older_than, batch, after)
            deleted[table] += n
            if after is None:
                break
    return deleted


async def aprune(run: Any, older_than: Any, batch: int = _operate.PRUNE_BATCH) -> dict[str, int]:
    """``prune`` of the async store: each batch waits its turn on the pool."""
    older_than = _operate.as_older_than(older_than)
    deleted = dict.fromkeys(_operate.PRUNE_KEYS, 0)
    for table in _operate.PRUNE_KEYS:
        after = None
        while True:
            n, after = await run("prune_step", table, older_than, batch, after)
            deleted[table] += n
            if after is None:
                break
    return deleted


def log_takeover(where: str, table: str, taken: list[Any]) -> None:
    """Say that a claim took over ``taken`` (seqs, or timers' ``(execution_id, path)``)."""
    _operate.log_takeover(_log, where, table, taken)
