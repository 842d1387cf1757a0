"""What :func:`harel_store.copy_store` reads from a SQLite database and writes into one:
the rows of a snapshot as the records of :mod:`harel_store._transfer`, and those records
written back. The store's ``_dump`` and ``_restore`` hold the lock and the transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from .._digest import Digest
from .._records import OutboxEntry, SpawnEntry
from .._transfer import durable_row_keys
from ._schema import (
    _BATCH,
    _BUMP_BY,
    _DUMP_TOTAL,
    _HELD,
    _HELD_KEYS,
    _LAST_SEQS,
    _RESTORE,
    _SEQ_UPDATE,
)


def held(conn: sqlite3.Connection) -> dict[str, int]:
    """How many of each copied thing the database holds (all ``0``: it is empty)."""
    return dict(zip(_HELD_KEYS, conn.execute(_HELD).fetchone()))


def dump_rows(conn: sqlite3.Connection, codec: Any, canonical: Any) -> Iterator[tuple[Any, ...]]:
    """The records of everything the database holds, read by ``conn`` (in the caller's
    read transaction). Commit bodies come as :class:`~harel_store.Digest` objects of
    ``canonical``'s encoding."""
    yield ("total", conn.execute(_DUMP_TOTAL).fetchone()[0])
    decode_exe = codec.decode_execution
    decode = codec.decode_value
    for version, epoch, data in conn.execute("SELECT version, epoch, body FROM executions"):
        exe = decode_exe(data)
        exe.version = version
        yield ("execution", exe, epoch)
    for eid, event_id in conn.execute("SELECT execution_id, event_id FROM processed"):
        yield ("mark", eid, event_id)
    for eid, commit_id, version, digest in conn.execute(
        "SELECT execution_id, commit_id, version, digest FROM commit_ids"
    ):
        yield ("commit", eid, commit_id, version, Digest(bytes(digest), canonical))
    # The rings: trace_index and trace, both in execution id order, merged.
    steps = conn.execute("SELECT execution_id, idx, step FROM trace ORDER BY execution_id, idx")
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
            next_index = row[1] + 1  # past the last step (an empty ring: its row's)
            row = steps.fetchone()
        yield ("trace", eid, next_index, ring)
    steps.close()
    for timer in conn.execute("SELECT execution_id, path, fire_at FROM timers ORDER BY seq"):
        yield ("timer", *timer)
    for seq, target, event in conn.execute("SELECT seq, target_id, event FROM outbox ORDER BY seq"):
        yield ("outbox", OutboxEntry(seq, target, decode(event)))
    for seq, parent, child, root_path, context in conn.execute(
        "SELECT seq, parent_id, child_id, root_path, context FROM spawns ORDER BY seq"
    ):
        entry = SpawnEntry(seq, parent, child, decode(root_path), decode(context))
        yield ("spawn", entry)
    last = dict(conn.execute(_LAST_SEQS).fetchall())
    yield ("seqs", last.get("outbox", 0), last.get("spawns", 0))


def write_rows(conn: sqlite3.Connection, rows: Iterable[tuple[str, tuple[Any, ...]]]) -> None:
    """Write the rows of :func:`harel_store._transfer.durable_rows` by ``conn`` (in the
    caller's write transaction), in batches per table."""
    batches: dict[str, list[tuple[Any, ...]]] = {sql: [] for sql in _RESTORE.values()}

    def add(sql: str, row: tuple[Any, ...]) -> None:
        batch = batches[sql]
        batch.append(row)
        if len(batch) >= _BATCH:
            conn.executemany(sql, batch)
            batch.clear()

    seqs: tuple[int, int] = (0, 0)
    timers = 0
    for kind, row in rows:
        if kind == "seqs":
            seqs = row
        else:
            durable_row_keys(kind, row)
            if kind == "timer":  # its place in arming order: its seq (see _RESTORE_TIMER)
                timers += 1
                row = (*row, timers)
            elif kind == "trace":  # (execution id, next index, steps): the steps say the rest
                row = row[:2]
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
    if work:  # waiting relays wake up; the counter moves past the timers' seqs
        conn.execute(_BUMP_BY, (timers + 1,))
