"""Seeing what a PostgreSQL store holds and pruning it (PRODUCTION.md sections 8 and 9):
the schema step that adds when outbox and spawn entries were committed and when marks and
commit ids were recorded (``timestamptz`` on the database's clock; PostgreSQL keeps the
default of the ``ALTER`` for the rows already there, so they count as made at the
migration), the indexes the overview reads, and each operation as a generator of
statements run by the stores like the core's."""

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


def _prune(s: str, table: str, key: str) -> str:
    return (
        f"DELETE FROM {s}.{table} WHERE ({'execution_id'}, {key}) IN ("
        f" SELECT execution_id, {key} FROM {s}.{table}"
        " WHERE recorded_at < now() - make_interval(secs => %s)"
        " ORDER BY recorded_at LIMIT %s)"
    )


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
    schema: str, table: str, older_than: float, batch: int
) -> tuple[str, tuple[Any, ...]]:
    """The statement deleting up to ``batch`` rows of ``table`` (``processed`` or
    ``commit_ids``) recorded more than ``older_than`` seconds ago, a transaction of its
    own, and its parameters."""
    if table not in _operate.PRUNE_KEYS:
        raise ValueError(f"no table {table!r} to prune")
    key = "event_id" if table == "processed" else "commit_id"
    return _prune(schema, table, key), (older_than, batch)


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
        while True:
            n = run("prune_step", table, older_than, batch)
            deleted[table] += n
            if n < batch:
                break
    return deleted


async def aprune(run: Any, older_than: Any, batch: int = _operate.PRUNE_BATCH) -> dict[str, int]:
    """``prune`` of the async store: each batch waits its turn on the pool."""
    older_than = _operate.as_older_than(older_than)
    deleted = dict.fromkeys(_operate.PRUNE_KEYS, 0)
    for table in _operate.PRUNE_KEYS:
        while True:
            n = await run("prune_step", table, older_than, batch)
            deleted[table] += n
            if n < batch:
                break
    return deleted


def log_takeover(where: str, table: str, taken: list[Any]) -> None:
    """Say that a claim took over ``taken`` (seqs, or timers' ``(execution_id, path)``)."""
    _operate.log_takeover(_log, where, table, taken)
