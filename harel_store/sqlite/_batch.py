"""A batch of commits in one SQLite transaction: one statement per table for the whole
batch (chunked under SQLite's limit on bound variables), not one per commit.

The caller holds ``BEGIN IMMEDIATE``, so nothing else writes between the reads that decide
each commit's outcome and the writes: the replays, epochs and versions of every
execution are read in one statement each, decided in Python, and only the applied
commits are written.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from .._errors import IdempotencyConflict, StaleWriter, StoreConflict, StoreError

# OR FAIL: a statement that fails keeps the rows it wrote, where the default (ABORT) takes
# them back, which needs a statement journal holding every page the statement changes,
# spilled to a temporary file past 64 KiB: a multi-row insert into 100 rings wrote 100
# pages there. Nothing here outlives a failure: the whole transaction is rolled back.
_VARIABLES = 999  # SQLite's lowest limit on bound variables per statement (before 3.32)
_RANGES = 100  # ranges OR'ed per DELETE: far below SQLite's expression depth limit (1000)
# Each execution with the last index of its trace ring (found at the end of its key), read
# with the row that decides the commit rather than by a statement of its own.
_READ = (
    "SELECT id, version, epoch, (SELECT max(idx) FROM trace WHERE execution_id = id)"
    " FROM executions WHERE id IN ({})"
)
_READ_NO_STEP = "SELECT id, version, epoch, NULL FROM executions WHERE id IN ({})"


class Prepared(NamedTuple):
    """One commit, checked and encoded before any transaction."""

    exe: Any
    eid: str
    version: int
    blob: Any
    epoch: int | None
    events: list[tuple[Any, Any]]
    mark: str | None
    timers: tuple[Any, ...]
    born: list[tuple[Any, ...]]
    step: Any
    commit_id: str | None
    digest: bytes | None
    armed: int  # how many of its timer ops schedule


def _chunks(rows: Sequence[Any], width: int) -> Iterator[Sequence[Any]]:
    size = max(1, _VARIABLES // width)
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def _insert(
    conn: sqlite3.Connection, head: str, rows: Sequence[tuple[Any, ...]], tail: str = ""
) -> None:
    """``head VALUES (...), (...) tail`` for all ``rows``, a chunk per statement."""
    if not rows:
        return
    width = len(rows[0])
    one = "(" + ", ".join("?" * width) + ")"
    for chunk in _chunks(rows, width):
        sql = f"{head} VALUES {', '.join([one] * len(chunk))}{tail}"
        conn.execute(sql, [value for row in chunk for value in row])


def each_chunk(conn: sqlite3.Connection, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """``sql`` with ``{}`` replaced by the ``VALUES`` rows of a chunk of ``rows``, for
    every chunk."""
    width = len(rows[0])
    one = "(" + ", ".join("?" * width) + ")"
    for chunk in _chunks(rows, width):
        conn.execute(
            sql.format(", ".join([one] * len(chunk))), [value for row in chunk for value in row]
        )


def _select_in(conn: sqlite3.Connection, sql: str, keys: Sequence[Any]) -> list[Any]:
    """``sql`` with ``{}`` replaced by the placeholders of ``keys``, a chunk at a time."""
    found: list[Any] = []
    for chunk in _chunks(keys, 1):
        found += conn.execute(sql.format(", ".join("?" * len(chunk))), chunk).fetchall()
    return found


def write(
    conn: sqlite3.Connection, batch: Sequence[Prepared], trace_max: int | None
) -> tuple[list[StoreError | None], list[Prepared], list[tuple[Prepared, int]]]:
    """Decide and write ``batch`` inside the caller's transaction: the outcomes, the
    commits applied (whose versions the caller sets once it commits) and the replays with
    the version each produced."""
    ids = [p.eid for p in batch]
    read = _READ if any(p.step is not None for p in batch) else _READ_NO_STEP
    rows = {
        eid: (version, epoch, last) for eid, version, epoch, last in _select_in(conn, read, ids)
    }
    keyed = [(p.eid, p.commit_id) for p in batch if p.digest is not None]
    done: dict[tuple[str, str], tuple[bytes, int]] = {}
    for chunk in _chunks(keyed, 2):
        sql = (
            "SELECT execution_id, commit_id, digest, version FROM commit_ids"
            " WHERE (execution_id, commit_id) IN (VALUES "
            + ", ".join(["(?, ?)"] * len(chunk))
            + ")"
        )
        for eid, commit_id, digest, version in conn.execute(
            sql, [value for pair in chunk for value in pair]
        ):
            done[eid, commit_id] = (digest, version)

    outcomes: list[StoreError | None] = []
    applied: list[Prepared] = []
    replays: list[tuple[Prepared, int]] = []
    for p in batch:
        if p.digest is not None:
            hit = done.get((p.eid, p.commit_id))  # type: ignore[arg-type]
            if hit is not None:
                if hit[0] != p.digest:
                    outcomes.append(IdempotencyConflict(p.eid, p.commit_id))  # type: ignore[arg-type]
                else:
                    outcomes.append(None)
                    replays.append((p, hit[1]))
                continue
        row = rows.get(p.eid)
        if row is not None:
            if p.epoch is not None and row[1] is not None and row[1] > p.epoch:
                outcomes.append(StaleWriter(p.eid, p.epoch, row[1]))
                continue
            if row[0] != p.version:
                outcomes.append(StoreConflict(p.eid, p.version, row[0]))
                continue
        outcomes.append(None)
        applied.append(p)
    if applied:
        _apply(conn, applied, trace_max, {eid: row[2] for eid, row in rows.items()})
    return outcomes, applied, replays


def _apply(
    conn: sqlite3.Connection,
    applied: list[Prepared],
    trace_max: int | None,
    lasts: dict[str, int | None],
) -> None:
    _insert(
        conn,
        "INSERT OR FAIL INTO executions (id, version, epoch, body)",
        [(p.eid, p.version + 1, p.epoch, p.blob) for p in applied],
        " ON CONFLICT (id) DO UPDATE SET version = excluded.version, body = excluded.body,"
        " epoch = coalesce(excluded.epoch, executions.epoch)",
    )
    _insert(
        conn,
        "INSERT OR FAIL INTO outbox (target_id, event)",
        [e for p in applied for e in p.events],
    )
    _insert(
        conn,
        "INSERT OR IGNORE INTO processed (execution_id, event_id)",
        [(p.eid, p.mark) for p in applied if p.mark is not None],
    )
    # Each path ends as its last op left it, armed in the order of those last ops.
    last: dict[tuple[str, str], Any] = {}
    for p in applied:
        for action, path, fire_at in p.timers:
            last.pop((p.eid, path), None)
            last[p.eid, path] = fire_at if action == "schedule" else None
    cancelled = [key for key, fire_at in last.items() if fire_at is None]
    for chunk in _chunks(cancelled, 2):
        conn.execute(
            "DELETE FROM timers WHERE (execution_id, path) IN (VALUES "
            + ", ".join(["(?, ?)"] * len(chunk))
            + ")",
            [value for key in chunk for value in key],
        )
    armed = [(eid, path, fire_at) for (eid, path), fire_at in last.items() if fire_at is not None]
    if armed:  # seqs in arming order, after every seq given before (see _schema._ARM)
        (n,) = conn.execute("SELECT n FROM work").fetchone()
        _insert(
            conn,
            "INSERT INTO timers (execution_id, path, fire_at, seq)",
            [(*timer, n + 1 + k) for k, timer in enumerate(armed)],
            " ON CONFLICT (execution_id, path) DO UPDATE"
            " SET fire_at = excluded.fire_at, seq = excluded.seq, lease_until = 0",
        )
    _insert(
        conn,
        "INSERT OR FAIL INTO spawns (parent_id, child_id, root_path, context)",
        [b for p in applied for b in p.born],
    )
    stepped = [p for p in applied if p.step is not None]
    if stepped:
        _push_steps(conn, stepped, trace_max, lasts)
    _insert(
        conn,
        "INSERT OR FAIL INTO commit_ids (execution_id, commit_id, digest, version)",
        [(p.eid, p.commit_id, p.digest, p.version + 1) for p in applied if p.digest is not None],
    )
    if armed or any(p.events or p.born for p in applied):
        conn.execute("UPDATE work SET n = n + ?", (len(armed) or 1,))


def _push_steps(
    conn: sqlite3.Connection,
    stepped: list[Prepared],
    keep: int | None,
    lasts: dict[str, int | None],
) -> None:
    """Append one step to the ring of each execution and trim each ring to ``keep``,
    deleting only the overflow (the oldest steps, by the ring's index). ``lasts`` holds
    the last index of the ring of every execution that has a row (``None``: no step)."""
    unknown = [p.eid for p in stepped if p.eid not in lasts]  # no row yet: a new execution
    if unknown:
        lasts = dict(lasts)
        for chunk in _chunks(unknown, 1):
            lasts.update(
                conn.execute(
                    "SELECT e.column1, (SELECT max(idx) FROM trace WHERE execution_id = e.column1)"
                    " FROM (VALUES " + ", ".join(["(?)"] * len(chunk)) + ") AS e",
                    chunk,
                )
            )
    empty = {  # a ring with no step: one copied in empty, or none yet (next index 0)
        eid: index
        for eid, index in _select_in(
            conn,
            "SELECT execution_id, next_index FROM trace_index WHERE execution_id IN ({})",
            [p.eid for p in stepped if lasts[p.eid] is None],
        )
    }
    steps_rows = []
    overflow = []
    new_rings = []
    for p in stepped:
        last = lasts[p.eid]
        if last is not None:  # its indexes are consecutive: the overflow is a range
            index = last + 1
            if keep and index >= keep:
                overflow.append((p.eid, index - keep))
        else:
            if p.eid not in empty:
                new_rings.append((p.eid, 0))
            index = empty.get(p.eid, 0)
        steps_rows.append((p.eid, index, p.step))
    _insert(conn, "INSERT OR FAIL INTO trace_index (execution_id, next_index)", new_rings)
    _insert(conn, "INSERT OR FAIL INTO trace (execution_id, idx, step)", steps_rows)
    for start in range(0, len(overflow), _RANGES):
        chunk = overflow[start : start + _RANGES]
        conn.execute(
            "DELETE FROM trace WHERE "
            + " OR ".join(["execution_id = ? AND idx <= ?"] * len(chunk)),
            [value for pair in chunk for value in pair],
        )
