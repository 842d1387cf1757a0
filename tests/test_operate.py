"""Seeing what a store holds and pruning it (PRODUCTION.md sections 8 and 9): the
overview's figures against what the store was given, paging through execution ids, the
cost of an overview on a large store, a prune beside committing processes, and a
database written by the previous schema version opened, migrated and kept whole."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from _helpers import best, commit_three, fill, settled

from harel_store import Execution, TimerOp
from harel_store.sqlite import SCHEMA_VERSION, AsyncSqliteStore, SqliteStore

DATA = Path(__file__).parent / "data"


def test_overview_figures(tmp_path: Path) -> None:
    clock = [1000.0]
    with SqliteStore(tmp_path / "s.db", clock=lambda: clock[0]) as store:
        assert store.overview() == {
            "executions": 0, "outbox": 0, "spawns": 0, "timers": 0, "processed": 0,
            "commit_ids": 0, "outbox_oldest_age": None, "spawns_oldest_age": None,
            "outbox_leased": 0, "spawns_leased": 0, "timers_leased": 0,
            "expired_leases": 0, "timers_due": 0, "next_timer_at": None,
        }  # fmt: skip
        commit_three(store)
        time.sleep(0.05)
        store.claim_outbox(2, lease=5.0)
        store.claim_spawns(1, lease=100.0)
        store.claim_due_timers(1000.0, 5, lease=5.0)
        figures = store.overview()
        assert figures["executions"] == 3 and figures["outbox"] == 6 and figures["spawns"] == 3
        assert figures["timers"] == 3 and figures["processed"] == 3
        assert figures["commit_ids"] == 3
        assert 0.04 <= figures["outbox_oldest_age"] < 60
        assert 0.04 <= figures["spawns_oldest_age"] < 60
        assert (figures["outbox_leased"], figures["spawns_leased"]) == (2, 1)
        assert figures["timers_leased"] == 1 and figures["expired_leases"] == 0
        assert figures["timers_due"] == 1 and figures["next_timer_at"] == 1010.0
        assert store.overview(now=1015.0)["timers_due"] == 2
        assert store.overview(now=math.inf)["next_timer_at"] is None
        clock[0] = 1010.0  # the outbox and timer leases ran out, the spawn's did not
        figures = store.overview()
        assert figures["expired_leases"] == 3 and figures["outbox_leased"] == 0
        assert figures["spawns_leased"] == 1 and figures["timers_due"] == 2
        store.ack_outbox_many([e.seq for e in store.pending_outbox()])
        assert store.overview()["outbox_oldest_age"] is None
        with pytest.raises(ValueError, match="now"):
            store.overview(now=math.nan)


def test_list_executions_pages_in_id_order(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "s.db") as store:
        fill(store, 250)
        seen: list[str] = []
        after = None
        while page := store.list_executions(after=after, limit=100):
            seen += page
            after = page[-1]
        assert seen == sorted(seen) == [f"e{i:07d}" for i in range(250)]
        assert store.list_executions() == seen[:100]
        assert store.list_executions(limit=0) == []
        with pytest.raises(TypeError, match="after"):
            store.list_executions(after=3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="limit"):
            store.list_executions(limit=-1)


def test_overview_is_cheap_on_a_large_store(tmp_path: Path) -> None:
    """100 times the executions (and marks and commit ids) with the same queues: the
    queue figures come from indexes (no scan of a queue), so the overview costs no more
    than counting the rows (``stats``) plus a little, and stays far below a second. The
    counts themselves are SQLite's count(*), which walks the smallest index: linear, a
    few milliseconds for 100,000 executions."""
    stores = []
    for n in (1_000, 100_000):
        store = SqliteStore(tmp_path / f"{n}.db")
        fill(store, n)
        for i in range(50):
            store.commit(store.load(f"e{i:07d}"), [(None, i)], timers=[TimerOp("schedule", "t", i)])
        store.claim_outbox(10)
        stores.append(store)
    try:
        small, large = (best(s.overview, runs=7) for s in stores)
        counting = best(stores[1].stats, runs=7)
        assert large < 3 * counting + 0.002 and large < 0.1, (small, large, counting)
        plan = " ".join(
            str(row)
            for row in stores[1]._conn.execute(
                "EXPLAIN QUERY PLAN " + _overview_sql(), (0.0,) * _overview_sql().count("?")
            )  # type: ignore[union-attr]
        )
        assert "outbox_leases" in plan and "timers_leases" in plan and "timers_by_fire_at" in plan
        assert "processed_by_recorded_at" not in plan  # the overview reads no mark
    finally:
        for store in stores:
            store.close()


def _overview_sql() -> str:
    from harel_store.sqlite import _operate

    return _operate._OVERVIEW


def test_prune_deletes_what_is_older_than_the_horizon(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "s.db") as store:
        fill(store, 30)
        time.sleep(0.3)
        fill(store, 20, start=30)
        assert store.prune(3600) == {"processed": 0, "commit_ids": 0}
        assert store.prune(0.2) == {"processed": 30, "commit_ids": 30}
        assert store.stats()["processed"] == 20
        assert not store.is_processed("e0000000", "ev0")
        assert store.is_processed("e0000030", "ev30")
        # A pruned commit id no longer recognises its replay: it applies as a new commit.
        exe = store.load("e0000000")
        assert exe.version == 1
        store.commit(exe, (), processed_event_id="again", commit_id="c0")
        assert store.load("e0000000").version == 2
        for bad in (-1, math.nan, math.inf):
            with pytest.raises(ValueError, match="older_than"):
                store.prune(bad)
        with pytest.raises(TypeError, match="older_than"):
            store.prune("7d")  # type: ignore[arg-type]


def test_prune_bounded_batches(tmp_path: Path) -> None:
    from harel_store.sqlite import _operate

    with SqliteStore(tmp_path / "s.db") as store:
        fill(store, 2500)
        assert _operate.prune(store, 0, batch=1000) == {"processed": 2500, "commit_ids": 2500}


def _writer(path: str, worker: int, n: int, out: Any) -> None:
    with SqliteStore(path) as store:
        slowest = 0.0
        for i in range(n):
            eid = f"w{worker}-{i % 20}"
            exe = store.load(eid) or Execution(id=eid)
            start = time.perf_counter()
            store.commit(
                exe, (), processed_event_id=f"w{worker}-ev{i}", commit_id=f"w{worker}-c{i}"
            )
            slowest = max(slowest, time.perf_counter() - start)
        out.put((worker, slowest))


def test_prune_beside_committing_processes(tmp_path: Path) -> None:
    """Two processes commit while a prune deletes 40,000 old rows in batches: nothing
    recorded after the horizon is lost, and no commit waits for the whole prune."""
    path = str(tmp_path / "s.db")
    with SqliteStore(path) as store:
        fill(store, 20_000)
    time.sleep(0.2)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    workers = [ctx.Process(target=_writer, args=(path, w, 300, out)) for w in range(2)]
    for p in workers:
        p.start()
    with SqliteStore(path) as store:
        time.sleep(0.3)
        start = time.perf_counter()
        deleted = store.prune(0.15)
        took = time.perf_counter() - start
    results = dict(out.get(timeout=120) for _ in workers)
    for p in workers:
        p.join(60)
        assert p.exitcode == 0
    assert deleted["processed"] >= 20_000 and deleted["commit_ids"] >= 20_000
    with SqliteStore(path) as store:
        for w in range(2):
            for i in range(300):
                recent = store.is_processed(f"w{w}-{i % 20}", f"w{w}-ev{i}")
                assert recent or deleted["processed"] > 20_000
        marks = store.stats()["processed"]
        assert marks + deleted["processed"] - 20_000 == 600
    # generous: a commit waited for a batch or two, never for the whole prune
    assert max(results.values()) < max(took, 0.05) + 2.0


# The columns of schema version 1 (later versions add some, and drop trace's rowid n).
V1_COLUMNS = {
    "executions": "id, version, epoch, body",
    "outbox": "seq, target_id, event, lease_until",
    "spawns": "seq, parent_id, child_id, root_path, context, lease_until",
    "processed": "execution_id, event_id",
    "commit_ids": "execution_id, commit_id, digest, version",
    "timers": "seq, execution_id, path, fire_at, lease_until",
    "trace": "execution_id, idx, step",
}


def test_previous_schema_version_opens_migrates_and_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    shutil.copy(DATA / "schema_v1.sqlite", path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM harel_store_schema").fetchall() == [(1,)]
        before = {t: conn.execute(f"SELECT {c} FROM {t} ORDER BY 1, 2").fetchall()
                  for t, c in V1_COLUMNS.items()}  # fmt: skip
    conn.close()
    started = time.time()
    with SqliteStore(path) as store:
        figures = store.overview()
        assert figures["executions"] == 5 and figures["processed"] == 10
        assert figures["commit_ids"] == 10 and figures["outbox"] == 9
        assert figures["outbox_leased"] == 1
        assert 0 <= figures["outbox_oldest_age"] < time.time() - started + 5
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT version FROM harel_store_schema").fetchall() == [
            (SCHEMA_VERSION,)
        ]
        for table, rows in before.items():
            kept = conn.execute(f"SELECT {V1_COLUMNS[table]} FROM {table} ORDER BY 1, 2").fetchall()
            assert all(row in kept for row in rows), table
        stamps = conn.execute("SELECT min(recorded_at), max(recorded_at) FROM processed").fetchone()
        assert started - 5 < stamps[0] <= stamps[1] < time.time() + 5
    finally:
        conn.close()
    with SqliteStore(path) as store:
        seqs = [e.seq for e in store.pending_outbox()]
        store.commit(store.load("e0"), [(None, "new")])
        assert store.pending_outbox()[-1].seq == 11 > max(seqs)  # seq 10 was acked: never again
        assert store.is_processed("e3", "ev3b")
        assert store.prune(3600) == {"processed": 0, "commit_ids": 0}


def test_a_migration_is_logged_and_nothing_on_the_hot_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "old.db"
    shutil.copy(DATA / "schema_v1.sqlite", path)
    with caplog.at_level("DEBUG", logger="harel_store"), SqliteStore(path) as store:
        assert [r.levelname for r in caplog.records] == ["INFO"]
        said = caplog.records[0].getMessage()
        assert f"schema migrated from version 1 to {SCHEMA_VERSION}" in said
        caplog.clear()
        for i in range(50):
            store.commit(store.load("e1"), [(None, i)], processed_event_id=f"hot{i}")
        store.ack_outbox_many([e.seq for e in store.claim_outbox(100)])
        assert caplog.records == []


async def _take_over(store: Any, clock: list[float], caplog: pytest.LogCaptureFixture) -> None:
    await settled(
        store.commit(
            Execution(id="a"), [(None, 1), (None, 2), (None, 3)], spawns=[("c", ("r",), {})],
            timers=[TimerOp("schedule", "t", 50.0)],
        )
    )  # fmt: skip
    with caplog.at_level("INFO", logger="harel_store"):
        first = await settled(store.claim_outbox(2, lease=10.0))
        assert len(await settled(store.claim_outbox(5, lease=10.0))) == 1  # no takeover
        await settled(store.claim_spawns(5, lease=10.0))
        await settled(store.claim_due_timers(100.0, 5, lease=10.0))
        assert caplog.records == []
        clock[0] = 111.0  # every lease ran out
        assert len(await settled(store.claim_outbox(2, lease=10.0))) == 2
        assert len(await settled(store.claim_spawns(5, lease=10.0))) == 1
        assert len(await settled(store.claim_due_timers(111.0, 5, lease=10.0))) == 1
    said = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert [(name, level) for name, level, _ in said] == [("harel_store.sqlite", "WARNING")] * 3
    assert "took over 2 outbox entries" in said[0][2]
    assert said[0][2].endswith(f": {first[0].seq}, {first[1].seq}"), said[0][2]
    assert "took over 1 spawn intents" in said[1][2]
    assert "took over 1 timers" in said[2][2] and said[2][2].endswith("('a', 't')")


def test_a_lease_taken_over_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = [100.0]
    with SqliteStore(tmp_path / "s.db", clock=lambda: clock[0]) as store:
        asyncio.run(_take_over(store, clock, caplog))


def test_a_lease_taken_over_is_logged_async(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [100.0]

    async def main() -> None:
        async with AsyncSqliteStore(tmp_path / "s.db", clock=lambda: clock[0]) as store:
            await _take_over(store, clock, caplog)

    asyncio.run(main())
