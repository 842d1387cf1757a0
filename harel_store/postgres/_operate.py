"""Seeing what a PostgreSQL store holds and pruning it (PRODUCTION.md sections 8 and 9):
the schema step that adds when outbox and spawn entries were committed and when marks and
commit ids were recorded (``timestamptz`` on the database's clock; PostgreSQL keeps the
default of the ``ALTER`` for the rows already there, so they count as made at the
migration), the indexes the overview reads, and each operation as a generator of
statements run by the stores like the core's."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .. import _checks, _operate

if TYPE_CHECKING:
    from ._core import _Core, _Op

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


def overview(core: _Core, now: Any) -> _Op:
    from ._core import _Query

    now = time.time() if now is None else _checks.as_now(now)
    s = core.sql.schema
    rows = yield _Query(_overview(s), {"now": now})
    figures = dict(zip(_operate.OVERVIEW_KEYS, rows[0]))
    for key in ("outbox_oldest_age", "spawns_oldest_age"):
        age = figures[key]
        figures[key] = None if age is None else max(0.0, float(age))
    return figures


def list_executions(core: _Core, after: Any, limit: Any) -> _Op:
    from ._core import _Query

    after = _operate.as_after(after)
    limit = _operate.as_page(limit)
    s = core.sql.schema
    if after is None:
        rows = yield _Query(f"SELECT id FROM {s}.executions ORDER BY id LIMIT %s", (limit,))
    else:
        rows = yield _Query(
            f"SELECT id FROM {s}.executions WHERE id > %s ORDER BY id LIMIT %s", (after, limit)
        )
    return [eid for (eid,) in rows]


def prune_step(core: _Core, table: str, older_than: float, batch: int) -> _Op:
    """Delete up to ``batch`` rows of ``table`` (``processed`` or ``commit_ids``) recorded
    more than ``older_than`` seconds ago, in a transaction of its own: how many."""
    from ._core import _Query

    key = "event_id" if table == "processed" else "commit_id"
    n = yield _Query(_prune(core.sql.schema, table, key), (older_than, batch))
    return n


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
