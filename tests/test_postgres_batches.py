"""What only PostgreSQL's batches have (issue 27): a batch of commits is one transaction of
a fixed number of round trips whatever its size, with no savepoint; it sends one
notification; it wakes ``wait_for_work`` in another process; processes committing
overlapping batches lose no update and each CAS has exactly one winner; the async twin;
small batches are not planned at every call.

The contract of ``commit_many`` on every store is in the cross-store tests; here each test
works in a schema of its own on the session's ``pg_server``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import harel_store
from harel_store import Commit, Execution, StaleWriter, StoreConflict, TimerOp

psycopg = pytest.importorskip("psycopg")
postgres = pytest.importorskip("harel_store.postgres")
PostgresStore = postgres.PostgresStore
AsyncPostgresStore = postgres.AsyncPostgresStore

ROOT = str(Path(harel_store.__file__).resolve().parent.parent)


@pytest.fixture
def url(pg_server: Any) -> str:
    return pg_server.url  # type: ignore[no-any-return]


@pytest.fixture
def opened(url: str, pg_schema: str) -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def open_(**options: Any) -> Any:
        options.setdefault("schema", pg_schema)
        store = PostgresStore(options.pop("url", url), **options)
        made.append(store)
        return store

    yield open_
    for store in made:
        store.close()


def typical(exe: Any, k: int) -> Commit:
    return Commit(
        exe,
        [("peer", {"k": k}), (None, {"audit": k})],
        f"in-{exe.id}-{k}",
        [TimerOp("schedule", "root/wait", 1000.0 + k)],
        [(f"{exe.id}/child-{k}", "root/child", {"k": k})],
        {"k": k},
        commit_id=f"c-{exe.id}-{k}",
    )


def child(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen[str], timeout: float = 120.0) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


def test_a_batch_is_one_transaction_of_the_same_round_trips_whatever_its_size(
    opened: Callable[..., Any], url: str
) -> None:
    from test_postgres import WireCounter

    parts = psycopg.conninfo.conninfo_to_dict(url)
    counter = WireCounter(parts.get("host") or "127.0.0.1", int(parts.get("port") or 5432))
    try:
        proxied = psycopg.conninfo.make_conninfo(
            url, host="127.0.0.1", port=counter.port, sslmode="disable", gssencmode="disable"
        )
        store = opened(url=proxied, trace_max=3)
        warm = [Execution(id=f"warm-{i}") for i in range(3)]
        for k in range(2):  # the first batches prepare their statements
            store.commit_many([typical(exe, k) for exe in warm])
        costs = {}
        for n, size in enumerate((10, 200, 10, 200)):
            exes = [Execution(id=f"e{n}-{i}") for i in range(size)]
            for k in range(2):  # the first creates the executions, the second updates them
                before = counter.snapshot()
                assert store.commit_many([typical(exe, k) for exe in exes]) == [None] * size
                after = counter.snapshot()
                idle = (after["Z"] - after["Z:T"]) - (before["Z"] - before["Z:T"])
                assert idle == 1, "one transaction per batch"
                costs[size, k] = after["Z"] - before["Z"]
            assert all(exe.version == 2 for exe in exes)
        assert costs[10, 0] == costs[200, 0] and costs[10, 1] == costs[200, 1], costs
        # BEGIN with the locks, the creation and commit ids, the writes with COMMIT
        assert max(costs.values()) <= 3, costs
        # a batch of executions that exist, with no commit id, has nothing to create
        exes = [Execution(id=f"e1-{i}") for i in range(200)]
        for exe in exes:
            exe.version = 2
        before = counter.snapshot()
        plain = [Commit(exe, [("t", {"k": 1})], None, [], [], {"k": 3}) for exe in exes]
        assert store.commit_many(plain) == [None] * 200
        assert counter.snapshot()["Z"] - before["Z"] == 2
    finally:
        counter.close()


def test_a_batch_takes_no_savepoint_and_runs_a_fixed_number_of_statements(
    opened: Callable[..., Any], url: str, pg_schema: str
) -> None:
    store = opened()

    def statements(pattern: str) -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            row = conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query ILIKE %s",
                (pattern,),
            ).fetchone()
        return int(row[0])

    try:
        statements("%")
    except psycopg.Error:
        pytest.skip("the server does not load pg_stat_statements")
    exes = [Execution(id=f"x{i}") for i in range(300)]
    store.commit_many([typical(exe, 0) for exe in exes])
    savepoints, ours = statements("%savepoint%"), statements(f'%"{pg_schema}".%')
    store.commit_many([typical(exe, 1) for exe in exes])
    assert statements("%savepoint%") == savepoints
    assert statements(f'%"{pg_schema}".%') - ours <= 3, "lock, create, write"


def test_a_ring_another_writer_appends_to_while_a_batch_waits_is_trimmed(
    opened: Callable[..., Any], url: str, pg_schema: str
) -> None:
    """The batch's write trims each ring on its snapshot, taken before it waits for the
    ring's lock: a step another writer commits meanwhile is not in it. The batch finds
    those rings and trims them again once it has landed: no ring keeps more than
    ``trace_max`` steps."""
    import threading
    import time

    store = opened(trace_max=1)
    exes = [Execution(id=f"t{i}") for i in range(3)]
    for k in range(4):
        assert store.commit_many([Commit(exe, trace={"k": k}) for exe in exes]) == [None] * 3
    s = f'"{pg_schema}"'
    with psycopg.connect(url) as other, psycopg.connect(url, autocommit=True) as watch:
        # An append to t1's ring, as append_trace writes it, holding the ring's lock.
        [(n,)] = other.execute(
            f"UPDATE {s}.trace_index SET next_index = next_index + 1"
            " WHERE execution_id = 't1' RETURNING next_index"
        ).fetchall()
        other.execute(f"INSERT INTO {s}.trace VALUES ('t1', %s, %s)", (n - 1, b't{"k": 9}'))
        other.execute(f"DELETE FROM {s}.trace WHERE execution_id = 't1' AND idx < %s", (n - 1,))
        outcomes: list[Any] = []
        batch = threading.Thread(
            target=lambda: outcomes.extend(
                store.commit_many([Commit(exe, trace={"k": 5}) for exe in exes])
            )
        )
        batch.start()
        deadline = time.monotonic() + 30
        while not watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ).fetchone()[0]:
            assert time.monotonic() < deadline, "the batch never waited for the ring's lock"
            time.sleep(0.01)
        other.commit()
        batch.join(30)
    assert outcomes == [None] * 3
    assert [[step["k"] for step in store.read_trace(exe.id)] for exe in exes] == [[5]] * 3


def test_a_batch_sends_one_notification(opened: Callable[..., Any], url: str) -> None:
    store = opened()
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{store._core.channel}"')
        exes = [Execution(id=f"n{i}") for i in range(50)]
        store.commit_many([typical(exe, 0) for exe in exes])
        store.commit_many([Commit(exe) for exe in exes])  # no work: no notification
        listener.execute("SELECT 1")
        got = list(listener.notifies(timeout=0.5))
    assert len(got) == 1


def test_a_batch_of_another_process_wakes_wait_for_work(
    opened: Callable[..., Any], url: str, pg_schema: str
) -> None:
    store = opened()
    assert store.wait_for_work(0.0) is False
    proc = child(
        """
        import sys
        from harel_store import Commit, Execution
        from harel_store.postgres import PostgresStore
        with PostgresStore(sys.argv[1], schema=sys.argv[2]) as store:
            exes = [Execution(id=f"w{i}") for i in range(20)]
            assert store.commit_many([Commit(e, [("t", {"i": 1})]) for e in exes]) == [None] * 20
        """,
        url,
        pg_schema,
    )
    assert store.wait_for_work(60.0) is True
    finished(proc)
    assert len(store.pending_outbox()) == 20
    assert store.wait_for_work(0.0) is False


RACER = """
import sys
from harel_store import Commit, Execution, StoreConflict
from harel_store.postgres import PostgresStore
url, schema, me, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ids = [f"r{i}" for i in range(6)]
done = 0
with PostgresStore(url, schema=schema) as store:
    for r in range(rounds):
        # overlapping batches: each round takes four of the six, in a rotating order
        mine = [ids[(me + r + j) % 6] for j in range(4)]
        batch = []
        for eid in mine:
            exe = store.load(eid) or Execution(id=eid, context={"n": 0})
            exe.context = {"n": exe.context["n"] + 1}
            batch.append(Commit(exe, [("log", {"by": me, "id": eid})], commit_id=f"{me}-{r}-{eid}"))
        for outcome in store.commit_many(batch):
            assert outcome is None or type(outcome) is StoreConflict, outcome
            done += outcome is None
print(done)
"""


def test_processes_committing_overlapping_batches_lose_no_update(
    opened: Callable[..., Any], url: str, pg_schema: str
) -> None:
    store = opened()
    procs = [child(RACER, url, pg_schema, str(me), "40") for me in range(4)]
    applied = sum(int(finished(proc)) for proc in procs)
    total = sum(store.load(f"r{i}").context["n"] for i in range(6))
    assert total == applied == len(store.pending_outbox())
    assert all(store.load(f"r{i}").version == store.load(f"r{i}").context["n"] for i in range(6))
    assert applied > 40  # the race was real, and most rounds got through


CAS = """
import sys
from harel_store import Commit, Execution, StoreConflict
from harel_store.postgres import PostgresStore
url, schema, me = sys.argv[1], sys.argv[2], sys.argv[3]
with PostgresStore(url, schema=schema) as store:
    exes = [store.load(f"k{i}") or Execution(id=f"k{i}") for i in range(50)]
    sys.stdout.write("ready\\n"); sys.stdout.flush(); sys.stdin.readline()
    outcomes = store.commit_many([Commit(exe, [("t", {"by": me})]) for exe in exes])
    assert all(o is None or type(o) is StoreConflict for o in outcomes), outcomes
    print("".join("w" if o is None else "l" for o in outcomes))
"""


@pytest.mark.parametrize("existing", [True, False], ids=["updates", "first-writes"])
def test_each_cas_of_racing_batches_has_exactly_one_winner(
    opened: Callable[..., Any], url: str, pg_schema: str, existing: bool
) -> None:
    """Three processes commit the same 50 executions in one batch each, at once: each
    execution has one winner, the others get a StoreConflict (executions that exist, or
    first writes racing to create them)."""
    store = opened()
    if existing:
        store.commit_many([Commit(Execution(id=f"k{i}")) for i in range(50)])
    procs = []
    for me in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", CAS, url, pg_schema, str(me)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        procs.append(proc)
    for proc in procs:  # all three go at once
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    rows = [finished(proc).strip() for proc in procs]
    for i in range(50):
        assert sum(row[i] == "w" for row in rows) == 1, rows
    assert len(store.pending_outbox()) == 50
    assert all(store.load(f"k{i}").version == 1 + existing for i in range(50))


def test_the_async_twin_commits_and_acks_in_batches(url: str, pg_schema: str) -> None:
    async def main() -> None:
        async with AsyncPostgresStore(url, schema=pg_schema) as store:
            exes = [Execution(id=f"a{i}") for i in range(5)]
            assert await store.commit_many([typical(exe, 0) for exe in exes]) == [None] * 5
            old = Execution(id="a0")
            await store.save(Execution(id="fenced"), epoch=9)
            fenced = await store.load("fenced")
            outcomes = await store.commit_many(
                [Commit(old), typical(exes[1], 1), Commit(fenced, epoch=3)]
            )
            assert [type(o) for o in outcomes] == [StoreConflict, type(None), StaleWriter]
            assert old.version == 0 and exes[1].version == 2 and fenced.version == 1
            seqs = [e.seq for e in await store.pending_outbox()]
            await store.ack_outbox_many(iter(seqs))
            await store.ack_spawn_many([s.seq for s in await store.pending_spawns()])
            await store.delete_timer_many(await store.due_timers(1e9))
            stats = await store.stats()
            assert (stats["outbox"], stats["spawns"], stats["timers"]) == (0, 0, 0)
            with pytest.raises(TypeError, match=r"seqs\[1\]"):
                await store.ack_outbox_many([1, "2"])

    asyncio.run(main())


def test_concurrent_tasks_share_transactions_each_getting_its_own_outcome(
    url: str, pg_schema: str
) -> None:
    from test_postgres import WireCounter

    parts = psycopg.conninfo.conninfo_to_dict(url)
    counter = WireCounter(parts.get("host") or "127.0.0.1", int(parts.get("port") or 5432))
    proxied = psycopg.conninfo.make_conninfo(
        url, host="127.0.0.1", port=counter.port, sslmode="disable", gssencmode="disable"
    )

    async def main() -> None:
        async with AsyncPostgresStore(proxied, schema=pg_schema) as store:
            await store.save(Execution(id="stale"))
            lone = Execution(id="lone")
            await store.commit(lone, [("t", {})])  # prepares the statement
            before = counter.snapshot()
            await store.commit(lone, [("t", {})])  # a lone caller: one statement
            after = counter.snapshot()
            assert after["Z"] - before["Z"] == 1
            exes = [Execution(id=f"g{i}") for i in range(64)]
            before = counter.snapshot()
            results = await asyncio.gather(
                *(store.commit(exe, [("t", {"i": i})], f"in-{i}") for i, exe in enumerate(exes)),
                store.commit(Execution(id="stale"), [("t", {})]),
                store.commit_many([Commit(Execution(id="m1")), Commit(Execution(id="m2"))]),
                store.ack_outbox_many([10**6]),
                return_exceptions=True,
            )
            after = counter.snapshot()
            transactions = (after["Z"] - after["Z:T"]) - (before["Z"] - before["Z:T"])
            assert results[:64] == [None] * 64
            assert type(results[64]) is StoreConflict
            assert results[65] == [None, None] and results[66] is None
            assert all(exe.version == 1 for exe in exes)
            assert transactions <= 8, f"{transactions} transactions for 67 calls"
            assert len(await store.pending_outbox()) == 66
            assert all([await store.is_processed(f"g{i}", f"in-{i}") for i in range(64)])

    try:
        asyncio.run(main())
    finally:
        counter.close()


def test_a_task_cancelled_in_a_group_lands_whole_or_not_at_all(url: str, pg_schema: str) -> None:
    async def main() -> None:
        async with AsyncPostgresStore(url, schema=pg_schema, pool_size=2) as store:
            for round_ in range(5):
                exes = [Execution(id=f"c{round_}-{i}") for i in range(40)]
                tasks = [
                    asyncio.ensure_future(store.commit(exe, [("t", {"i": i})], f"e{i}"))
                    for i, exe in enumerate(exes)
                ]
                for k in range(round_ + 1):
                    await asyncio.sleep(0)
                for task in tasks[::3]:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for i, (exe, task) in enumerate(zip(exes, tasks)):
                    stored = await store.load(exe.id)
                    marked = await store.is_processed(exe.id, f"e{i}")
                    if not task.cancelled():
                        assert stored is not None and stored.version == 1 == exe.version
                    assert (stored is None) == (not marked), "whole or nothing"
                targets = [e.event["i"] for e in await store.pending_outbox()]
                landed = [i for i in range(40) if await store.load(f"c{round_}-{i}")]
                assert sorted(targets) == landed
                await store.ack_outbox_many(e.seq for e in await store.pending_outbox())

    asyncio.run(main())


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_small_batches_run_generic_plans_not_a_plan_per_call(
    url: str, pg_schema: str, twin: str
) -> None:
    # The planner's costs keep custom plans for arrays of two: planned at every call,
    # the write of a group of 2 cost more than 2 lone commits.
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
        except psycopg.Error:
            pytest.skip("the server does not load pg_stat_statements")
    tracked = psycopg.conninfo.make_conninfo(url, options="-c pg_stat_statements.track_planning=on")

    def batches() -> list[list[Commit]]:
        exes = [Execution(id=f"p{i}") for i in range(2)]
        return [
            [Commit(exe, [("t", {})], None, [], [], {"k": k}) for exe in exes] for k in range(30)
        ]

    if twin == "sync":
        with PostgresStore(tracked, schema=pg_schema, pool_size=1) as store:
            for batch in batches():
                assert store.commit_many(batch) == [None, None]
    else:

        async def main() -> None:
            async with AsyncPostgresStore(tracked, schema=pg_schema, pool_size=1) as store:
                for batch in batches():
                    assert await store.commit_many(batch) == [None, None]

        asyncio.run(main())
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT sum(calls), sum(plans) FROM pg_stat_statements"
            " WHERE query LIKE %s AND query LIKE %s",
            (f'%"{pg_schema}".executions%', "%FOR UPDATE%"),
        ).fetchall()
        rows += conn.execute(
            "SELECT sum(calls), sum(plans) FROM pg_stat_statements"
            " WHERE query LIKE %s AND query LIKE %s",
            (f'%"{pg_schema}".outbox%', "%WITH upd AS%"),
        ).fetchall()
    for done, planned in rows:  # the lock: 31 plans before, 1 after; the write: 6, 1
        assert done == 30, rows
        assert planned <= 8, f"{planned} plans for {done} calls"
