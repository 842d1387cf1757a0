"""A database an earlier schema version wrote, opened by this code: everything it held is
still there, through the API and row by row, and the store goes on from it.

``tests/data/schema_v2.sqlite`` was written by the code of schema version 2 (commit
04d905c) with ``trace_max=3`` and a clock at 1000.0: five executions (``e0`` .. ``e4``) each
committed with two emits, a mark, two timers (``t``, ``u``), a spawn, a trace step and a
commit id, then 1 to 5 more commits each with a mark, a step and a commit id (``e2``
re-arming ``t`` each time); a ring of its own for ``lonely`` (``append_trace``);
``e3``'s ``u`` cancelled; the last outbox seq (10) and spawn seq (5) acked; one outbox
entry and one timer leased for 1e9 seconds."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from harel_store import Execution, TimerOp
from harel_store.sqlite import SCHEMA_VERSION, SqliteStore

DATA = Path(__file__).parent / "data"
DUE = [
    ("e0", "t", 100.0), ("e2", "t", 100.0), ("e4", "t", 100.0), ("e1", "t", 101.0),
    ("e3", "t", 101.0), ("e0", "u", 200.0), ("e1", "u", 201.0), ("e2", "u", 202.0),
    ("e4", "u", 204.0),
]  # fmt: skip
RINGS = {"e0": (0, 1), "e1": (0, 1, 2), "e2": (1, 2, 3), "e3": (2, 3, 4), "e4": (3, 4, 5)}


def _copy(tmp_path: Path) -> Path:
    path = tmp_path / "v2.sqlite"
    shutil.copy(DATA / "schema_v2.sqlite", path)
    return path


def _rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_the_v2_database_is_what_its_docstring_says(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    assert _rows(path, "SELECT version FROM harel_store_schema") == [(2,)]


def test_a_v2_database_opens_with_everything_in_it(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    marks = _rows(path, "SELECT execution_id, event_id, recorded_at FROM processed")
    commits = _rows(
        path, "SELECT execution_id, commit_id, digest, version, recorded_at FROM commit_ids"
    )
    outbox = _rows(path, "SELECT seq, target_id, event, lease_until, committed_at FROM outbox")
    spawns = _rows(path, "SELECT * FROM spawns")
    with SqliteStore(path, trace_max=3, clock=lambda: 1000.0) as store:
        assert store.stats() == {
            "executions": 5, "outbox": 9, "spawns": 4, "timers": 9, "processed": 20,
            "traces": 6, "trace_steps": 15,
        }  # fmt: skip
        assert store.due_timers(300.0) == DUE  # ties in arming order: e2 re-armed t last
        for eid, indexes in RINGS.items():
            trace = store.read_trace(eid)
            assert [step["index"] for step in trace] == list(indexes)
            assert [step["step"] for step in trace] == list(
                range(indexes[-1] - len(indexes) + 1, indexes[-1] + 1)
            )
        assert store.read_trace("lonely") == [{"step": "outside a commit", "index": 0}]
        exe = store.load("e2")
        assert exe.version == 4 and exe.active_path == ("root", "s2")
        assert store.is_processed("e4", "ev4-5") and store.is_processed("e0", "ev0")
        assert [e.seq for e in store.pending_outbox()] == list(range(1, 10))
        assert [e.seq for e in store.claim_outbox(5, lease=1.0)] == [2, 3, 4, 5, 6]  # 1 leased
        assert store.claim_due_timers(300.0, 2, lease=1.0) == DUE[1:3]  # e0's t is leased
        figures = store.overview()
        assert figures["commit_ids"] == 20 and figures["timers_leased"] == 3

        # The store goes on: seqs after the acked ones, indexes after the rings', a replay.
        e0 = store.load("e0")
        store.commit(e0, [], "ev0-1", trace={"step": 1}, commit_id="c-0-1")  # a replay
        assert e0.version == 2 and store.read_trace("e0")[-1]["index"] == 1
        store.commit(e0, [(None, "next")], trace={"step": "next"}, spawns=[("c", "r", {})],
                     timers=[TimerOp("schedule", "t", 100.0)], commit_id="new")  # fmt: skip
        assert store.pending_outbox()[-1].seq == 11 and store.pending_spawns()[-1].seq == 6
        assert [s["index"] for s in store.read_trace("e0")] == [0, 1, 2]
        store.commit(e0, [], trace={"step": "again"})
        assert [s["index"] for s in store.read_trace("e0")] == [1, 2, 3]
        store.append_trace("lonely", {"step": "more"})
        assert [s["index"] for s in store.read_trace("lonely")] == [0, 1]
        assert store.due_timers(100.0)[-1] == ("e0", "t", 100.0)  # re-armed: last of its tie
        store.commit(Execution(id="e5"), [], timers=[TimerOp("schedule", "t", 100.0)])
        assert store.due_timers(100.0)[-1] == ("e5", "t", 100.0)

    # Row by row: nothing lost, stamps kept.
    assert _rows(path, "SELECT version FROM harel_store_schema") == [(SCHEMA_VERSION,)]
    now = set(_rows(path, "SELECT execution_id, event_id, recorded_at FROM processed"))
    assert set(marks) <= now
    now = set(
        _rows(path, "SELECT execution_id, commit_id, digest, version, recorded_at FROM commit_ids")
    )
    assert set(commits) <= now
    now = _rows(path, "SELECT seq, target_id, event, lease_until, committed_at FROM outbox")
    assert all(row in now or row[0] in (2, 3, 4, 5, 6) for row in outbox)
    assert set(spawns) <= set(_rows(path, "SELECT * FROM spawns"))


def test_version_3_writes_no_index_per_commit_that_only_prune_reads(tmp_path: Path) -> None:
    """Schema 3: marks and commit ids have no recorded_at index, timers and the ring no
    index beside their key (the hot path's lookups), and no AUTOINCREMENT on timers."""
    path = _copy(tmp_path)
    SqliteStore(path).close()
    names = {name for (name,) in _rows(path, "SELECT name FROM sqlite_master")}
    assert (
        not {"processed_by_recorded_at", "commit_ids_by_recorded_at", "trace_by_execution"} & names
    )
    assert not {n for n in names if n.startswith(("old_", "sqlite_autoindex_timers"))}
    assert _rows(path, "SELECT name FROM sqlite_sequence ORDER BY name") == [
        ("outbox",),
        ("spawns",),
    ]
    (n,) = _rows(path, "SELECT n FROM work")[0]
    assert n > max(seq for (seq,) in _rows(path, "SELECT seq FROM timers"))


def test_prune_walks_windows_of_keys_young_and_old_mixed(tmp_path: Path) -> None:
    """Old marks and commit ids between young ones, in key order, with windows smaller than
    the tables: exactly the old ones go, whichever windows they fall in."""
    from harel_store.sqlite import _operate

    path = tmp_path / "p.db"
    with SqliteStore(path) as store:
        for i in range(30):
            exe = Execution(id=f"e{i:02d}")
            for k in range(4):
                store.commit(exe, [], f"ev{k}", commit_id=f"c{k}")
        conn = sqlite3.connect(path)
        with conn:  # every third execution's marks and ids recorded an hour ago
            for table in ("processed", "commit_ids"):
                conn.execute(
                    f"UPDATE {table} SET recorded_at = recorded_at - 3600"
                    " WHERE CAST(substr(execution_id, 2) AS INTEGER) % 3 = 0"
                )
        conn.close()
        assert _operate.prune(store, 60, batch=7) == {"processed": 40, "commit_ids": 40}
        assert _operate.prune(store, 60, batch=7) == {"processed": 0, "commit_ids": 0}
        for i in range(30):
            assert store.is_processed(f"e{i:02d}", "ev2") is (i % 3 != 0)
        assert store.stats()["processed"] == 80


def test_a_ring_numbers_on_from_its_last_step_or_a_copied_empty_rings_index() -> None:
    """Schema 4: no step writes its ring's row. The next index follows the ring's last
    step; a ring copied in empty keeps its next index in its row; a commit, a batch and
    append_trace all number alike, and a copy out says the same."""
    from harel_store import Commit

    with SqliteStore(":memory:", trace_max=3) as store:
        store._restore([
            ("trace", "ghost", 7, []), ("trace", "ghost2", 4, []),
            ("trace", "full", 9, [{"a": 1}, {"a": 2}]), ("seqs", 0, 0),
        ])  # fmt: skip
        store.append_trace("ghost", {"x": 1})
        store.commit(Execution(id="full"), [], trace={"x": 1})
        assert store.commit_many([
            Commit(Execution(id="ghost2"), trace={"y": 1}),
            Commit(Execution(id="full", version=1), trace={"y": 1}),
            Commit(Execution(id="fresh"), trace={"y": 1}),
        ]) == [None, None, None]  # fmt: skip
        store.commit(Execution(id="fresh", version=1), [], trace={"z": 1})
        indexes = {
            eid: [step["index"] for step in store.read_trace(eid)]
            for eid in ("ghost", "ghost2", "full", "fresh")
        }
        assert indexes == {"ghost": [7], "ghost2": [4], "full": [8, 9, 10], "fresh": [0, 1]}
        rings = {r[1]: r[2] for r in store._dump() if r[0] == "trace"}
        assert rings == {"fresh": 2, "full": 11, "ghost": 8, "ghost2": 5}
        assert store.stats()["traces"] == 4
