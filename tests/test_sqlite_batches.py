"""What is SQLite's own in commit_many, the batch acks and group commit: one transaction
per batch, one statement per table, one wake-up bump, and the async store's group commit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from harel_store import Commit, Execution, StoreConflict, StoreError, TimerOp
from harel_store.sqlite import AsyncSqliteStore, SqliteStore

_OPENED: list[SqliteStore] = []


def opened(path: Path, **options: Any) -> SqliteStore:
    """A store this module closes after each test (an unclosed one warns when collected)."""
    store = SqliteStore(path, **options)
    _OPENED.append(store)
    return store


@pytest.fixture(autouse=True)
def _close_stores() -> Any:
    yield
    while _OPENED:
        _OPENED.pop().close()


def typical(n: int, exe: Any = None) -> Commit:
    exe = exe or Execution(id=f"o{n}", context={"n": n})
    return Commit(
        exe,
        [("billing", {"n": n})],
        f"evt-{n}",
        [TimerOp("schedule", "pay", 1e9 + n)],
        [(f"o{n}/c", "region", {})],
        {"step": n},
        commit_id=f"c-{n}",
    )


class Statements:
    """The SQL a connection runs, by its first word."""

    def __init__(self, store: SqliteStore) -> None:
        self.sql: list[str] = []
        store._conn.set_trace_callback(self.sql.append)  # type: ignore[union-attr]

    def count(self, prefix: str) -> int:
        return sum(1 for sql in self.sql if sql.lstrip().upper().startswith(prefix))


def test_a_batch_is_one_transaction_with_a_statement_per_table(tmp_path: Path) -> None:
    counts = {}
    for size in (10, 200):
        store = opened(tmp_path / f"{size}.db")
        seen = Statements(store)
        assert store.commit_many([typical(n) for n in range(size)]) == [None] * size
        assert seen.count("BEGIN") == 1 and seen.count("COMMIT") == 1
        assert seen.count("UPDATE WORK") == 1  # one wake-up bump
        counts[size] = len(seen.sql)
        assert len(store.pending_outbox()) == size
        store.close()
    assert counts[200] == counts[10]  # not one statement per commit


def test_the_trace_ring_is_trimmed_across_batches(tmp_path: Path) -> None:
    store = opened(tmp_path / "t.db", trace_max=3)
    exes = [Execution(id=f"e{i}") for i in range(3)]
    for step in range(5):
        store.commit_many([Commit(e, [], trace={"step": step}) for e in exes])
    for e in exes:
        assert [(s["step"], s["index"]) for s in store.read_trace(e.id)] == [(2, 2), (3, 3), (4, 4)]
    assert store.stats()["trace_steps"] == 9


def test_rings_in_every_state_end_as_single_commits_leave_them(tmp_path: Path) -> None:
    # The batch takes a ring's last index with its execution's row and trims by it alone:
    # rings full, partly full, empty, of an execution with no row yet, across trace_max
    # changes, must end as the single commit (which reads both ends) leaves them.
    def run(store: SqliteStore, batched: bool) -> list[dict[str, list[Any]]]:
        store.trace_max = 4
        exes = {name: Execution(id=name) for name in ("full", "part", "none", "new", "pre")}
        for name in ("full", "part", "none"):
            store.commit(exes[name], [])
        for k in range(6):
            store.append_trace("full", {"pre": k})
        store.append_trace("part", {"pre": 0})
        store.append_trace("pre", {"pre": 0})  # a ring before its execution's first commit
        states = []
        for round, keep in enumerate((4, 2, 2, 2, 5, 0, 3, 3, None)):
            store.trace_max = keep
            step = None if round == 4 else {"r": round}  # a batch with no step at all
            commits = [Commit(e, [], trace=step) for e in exes.values()]
            if batched:
                assert store.commit_many(commits) == [None] * len(commits)
            else:
                for c in commits:
                    store.commit(c.exe, [], trace=c.trace)
            states.append({name: store.read_trace(name) for name in exes})
        return states

    assert run(opened(tmp_path / "b.db"), True) == run(opened(tmp_path / "s.db"), False)


def test_a_batch_reads_rings_with_the_executions(tmp_path: Path) -> None:
    store = opened(tmp_path / "t.db", trace_max=2)
    exes = [Execution(id=f"e{i}") for i in range(3)]
    store.commit_many([Commit(e, [], trace={"s": 0}) for e in exes])
    seen = Statements(store)
    store.commit_many([Commit(e, [], trace={"s": 1}) for e in exes])
    assert seen.count("SELECT") == 1  # the executions, with their rings' last index
    assert [s["s"] for s in store.read_trace("e0")] == [0, 1]


def test_timer_ops_end_as_their_last_op_left_them(tmp_path: Path) -> None:
    store = opened(tmp_path / "t.db")
    a, b = Execution(id="a"), Execution(id="b")
    store.commit(b, [], timers=[TimerOp("schedule", "old", 1.0)])
    ops_a = [TimerOp("schedule", "p", 5.0), TimerOp("schedule", "q", 6.0)]
    ops_a += [TimerOp("cancel", "q"), TimerOp("schedule", "p", 7.0)]
    ops_b = [TimerOp("cancel", "old"), TimerOp("schedule", "old", 2.0), TimerOp("cancel", "x")]
    store.commit_many([Commit(a, timers=ops_a), Commit(b, timers=ops_b)])
    assert store.due_timers(100.0) == [("b", "old", 2.0), ("a", "p", 7.0)]


def test_refused_and_replayed_commits_write_nothing(tmp_path: Path) -> None:
    store = opened(tmp_path / "r.db")
    first = typical(1)
    store.commit_many([first])
    replay = typical(1, Execution(id="o1", context={"n": 1}))
    stale = Commit(Execution(id="o2"), [("x", "lost")])
    store.commit(Execution(id="o2"), [])
    outcomes = store.commit_many([replay, stale, typical(3)])
    assert outcomes[0] is None and replay.exe.version == 1
    assert isinstance(outcomes[1], StoreConflict) and stale.exe.version == 0
    assert outcomes[2] is None
    assert [e.event for e in store.pending_outbox()] == [{"n": 1}, {"n": 3}]


def test_a_batch_that_fails_in_the_database_writes_nothing(tmp_path: Path) -> None:
    store = opened(tmp_path / "f.db")
    exes = [Execution(id=f"e{i}") for i in range(3)]
    store._conn.execute(
        "CREATE TRIGGER no_b BEFORE INSERT ON spawns BEGIN SELECT RAISE(ABORT, 'no'); END"
    )  # type: ignore[union-attr]
    batch = [Commit(e, [("x", 1)], spawns=[("c", "r", {})] if e.id == "e2" else ()) for e in exes]
    with pytest.raises(Exception, match="nothing was written"):
        store.commit_many(batch)
    assert [e.version for e in exes] == [0, 0, 0]
    assert store.stats()["executions"] == 0 and store.pending_outbox() == []


def test_a_statement_that_fails_after_some_of_its_rows_takes_the_batch_back(
    tmp_path: Path,
) -> None:
    # The batch's inserts are OR FAIL (no statement journal): the rows a failing statement
    # already wrote go with the ROLLBACK of the whole transaction, not on their own.
    store = opened(tmp_path / "g.db", trace_max=2)
    exes = [Execution(id=f"e{i}") for i in range(3)]
    for exe in exes:
        store.commit(exe, [("x", 0)], trace={"n": 0})
    before = store.stats(), [store.read_trace(e.id) for e in exes], store.pending_outbox()
    store._conn.execute(  # type: ignore[union-attr]
        "CREATE TRIGGER no_e2 BEFORE INSERT ON trace WHEN NEW.execution_id = 'e2'"
        " BEGIN SELECT RAISE(FAIL, 'no'); END"
    )
    batch = [Commit(e, [("x", 1)], "m1", trace={"n": 1}) for e in exes]
    with pytest.raises(StoreError, match="nothing was written"):
        store.commit_many(batch)
    assert [e.version for e in exes] == [1, 1, 1]
    assert (store.stats(), [store.read_trace(e.id) for e in exes], store.pending_outbox()) == (
        before
    )
    assert not any(store.is_processed(e.id, "m1") for e in exes)
    store._conn.execute("DROP TRIGGER no_e2")  # type: ignore[union-attr]
    assert store.commit_many(batch) == [None, None, None]
    assert [[step["n"] for step in store.read_trace(e.id)] for e in exes] == [[0, 1]] * 3


def test_batch_acks_are_one_transaction_each(tmp_path: Path) -> None:
    store = opened(tmp_path / "a.db")
    store.commit_many([typical(n) for n in range(50)])
    seen = Statements(store)
    store.ack_outbox_many(range(1, 51))
    store.ack_spawn_many(range(1, 26))
    store.delete_timer_many([(f"o{n}", "pay", 1e9 + n) for n in range(50)])
    assert seen.count("BEGIN") == 3 and seen.count("DELETE") == 3
    assert store.stats()["outbox"] == 0 and store.stats()["spawns"] == 25
    assert store.stats()["timers"] == 0


def test_group_commit_shares_transactions_and_a_lone_caller_goes_alone(tmp_path: Path) -> None:
    async def main() -> tuple[int, int, list[Any]]:
        async with AsyncSqliteStore(tmp_path / "g.db", synchronous="FULL") as store:
            sync: SqliteStore = store._opening.result()
            seen = await asyncio.get_running_loop().run_in_executor(store._pool, Statements, sync)
            await store.commit(Execution(id="alone"), [("x", 0)])
            alone = seen.count("BEGIN")
            stale = Execution(id="alone")  # version 0: conflicts, alone in its outcome
            exes = [Execution(id=f"t{i}") for i in range(32)]
            results = await asyncio.gather(
                store.commit(stale, [("x", "lost")]),
                *(store.commit(e, [("x", i)], f"ev{i}") for i, e in enumerate(exes)),
                store.commit(Execution(id="bad"), [("x", object())]),
                return_exceptions=True,
            )
            assert [e.version for e in exes] == [1] * 32
            assert len(await store.pending_outbox()) == 33
            return alone, seen.count("BEGIN") - alone, results

    alone, shared, results = asyncio.run(main())
    assert alone == 1
    assert shared < 33 // 2  # 34 calls shared a few transactions
    assert isinstance(results[0], StoreConflict)
    assert results[1:33] == [None] * 32
    assert isinstance(results[33], TypeError)


def test_two_commits_of_one_execution_from_two_tasks_go_in_order(tmp_path: Path) -> None:
    async def main() -> list[Any]:
        async with AsyncSqliteStore(tmp_path / "o.db") as store:
            a = Execution(id="a")
            await store.commit(a, [])
            b = Execution(id="a", version=1)
            return await asyncio.gather(
                store.commit(Execution(id="z"), []),
                store.commit(a, [("x", 1)]),
                store.commit(b, [("x", 2)]),
                return_exceptions=True,
            )

    results = asyncio.run(main())
    assert results[0] is None and results[1] is None
    assert isinstance(results[2], StoreConflict)  # a second write of version 1: it lost
