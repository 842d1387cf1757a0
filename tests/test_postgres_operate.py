"""``overview``, ``list_executions`` and ``prune`` on PostgreSQL (sync and async), and a
schema of the previous version migrated with everything kept (PRODUCTION.md sections 8
and 9). Each test works in a schema of its own on the session's ``pg_server``."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _helpers import commit_three, fill, settled

from harel_store import Execution, TimerOp

psycopg = pytest.importorskip("psycopg")
postgres = pytest.importorskip("harel_store.postgres")
from harel_store.postgres import _core

PostgresStore = postgres.PostgresStore
AsyncPostgresStore = postgres.AsyncPostgresStore


@pytest.fixture
def url(pg_server: Any) -> str:
    return pg_server.url  # type: ignore[no-any-return]


@pytest.fixture
def opened(url: str, pg_schema: str) -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def open_(**options: Any) -> Any:
        options.setdefault("schema", pg_schema)
        store = PostgresStore(url, **options)
        made.append(store)
        return store

    yield open_
    for store in made:
        store.close()


def sql(url: str, query: str) -> list[Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query)
        return cur.fetchall() if cur.description else []


def test_overview_figures(opened: Callable[..., Any]) -> None:
    store = opened()
    empty = store.overview()
    assert empty["executions"] == 0 and empty["outbox_oldest_age"] is None
    assert empty["next_timer_at"] is None and empty["expired_leases"] == 0
    commit_three(store)
    time.sleep(0.05)
    store.claim_outbox(2, lease=100.0)
    store.claim_spawns(1, lease=0.0)  # runs out at once
    store.claim_due_timers(1000.0, 5, lease=100.0)
    figures = store.overview(now=1005.0)
    assert (figures["executions"], figures["outbox"], figures["spawns"]) == (3, 6, 3)
    assert (figures["timers"], figures["processed"], figures["commit_ids"]) == (3, 3, 3)
    assert 0.04 <= figures["outbox_oldest_age"] < 60
    assert 0.04 <= figures["spawns_oldest_age"] < 60
    assert (figures["outbox_leased"], figures["spawns_leased"], figures["timers_leased"]) == (
        2, 0, 1,
    )  # fmt: skip
    assert figures["expired_leases"] == 1
    assert figures["timers_due"] == 1 and figures["next_timer_at"] == 1010.0
    assert store.overview(now=math.inf)["timers_due"] == 3


def test_list_and_prune(opened: Callable[..., Any]) -> None:
    store = opened()
    fill(store, 30)
    time.sleep(0.3)
    fill(store, 20, start=30)
    seen: list[str] = []
    after = None
    while page := store.list_executions(after=after, limit=7):
        seen += page
        after = page[-1]
    assert seen == [f"e{i:07d}" for i in range(50)]
    with pytest.raises(TypeError, match="after"):
        store.list_executions(after=1)
    assert store.prune(3600) == {"processed": 0, "commit_ids": 0}
    assert store.prune(0.2) == {"processed": 30, "commit_ids": 30}
    assert not store.is_processed("e0000000", "ev0") and store.is_processed("e0000031", "ev31")
    with pytest.raises(ValueError, match="older_than"):
        store.prune(-1)


def test_prune_in_bounded_batches(opened: Callable[..., Any]) -> None:
    from harel_store.postgres import _operate

    store = opened()
    fill(store, 1200)
    assert _operate.prune(store._run, 0, batch=500) == {"processed": 1200, "commit_ids": 1200}


def test_async_twin(url: str, pg_schema: str) -> None:
    async def main() -> None:
        async with AsyncPostgresStore(url, schema=pg_schema) as store:
            await store.commit(Execution(id="a"), [(None, 1)], processed_event_id="m")
            figures = await store.overview()
            assert figures["executions"] == 1 and figures["outbox"] == 1
            assert await store.list_executions() == ["a"]
            assert await store.prune(0) == {"processed": 1, "commit_ids": 0}

    asyncio.run(main())


def test_previous_schema_version_is_migrated(
    url: str, pg_schema: str, opened: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_core, "MIGRATIONS", _core.MIGRATIONS[:1])
    with opened() as store:
        for i in range(5):
            store.commit(
                Execution(id=f"e{i}"), [(None, i)], processed_event_id=f"m{i}",
                spawns=[(f"c{i}", ("r",), {})], commit_id=f"k{i}",
            )  # fmt: skip
    assert sql(url, f'SELECT version FROM "{pg_schema}".harel_store_schema') == [(1,)]
    monkeypatch.undo()
    started = sql(url, "SELECT extract(epoch FROM now())::float8")[0][0]
    with opened() as store:
        figures = store.overview()
        assert figures["executions"] == 5 and figures["outbox"] == 5 and figures["spawns"] == 5
        assert figures["processed"] == 5 and figures["commit_ids"] == 5
        assert 0 <= figures["outbox_oldest_age"] < 60
        assert store.is_processed("e3", "m3")
        store.commit(store.load("e0"), [(None, "new")], processed_event_id="later")
        assert [e.event for e in store.pending_outbox()] == [0, 1, 2, 3, 4, "new"]
        assert store.prune(3600) == {"processed": 0, "commit_ids": 0}
    assert sql(url, f'SELECT version FROM "{pg_schema}".harel_store_schema') == [
        (postgres.SCHEMA_VERSION,)
    ]
    (low,) = sql(
        url, f'SELECT min(extract(epoch FROM recorded_at))::float8 FROM "{pg_schema}".processed'
    )[0]
    assert low >= started - 1


def indexes(url: str, schema: str) -> set[str]:
    rows = sql(url, f"SELECT indexname FROM pg_indexes WHERE schemaname = '{schema}'")
    return {name for (name,) in rows}


def test_a_schema_of_version_2_loses_the_recorded_at_indexes(
    url: str, pg_schema: str, opened: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 3: every commit wrote an entry in the recorded_at indexes of marks and commit
    ids; they are dropped, everything kept, and prune finds old rows without them."""
    monkeypatch.setattr(_core, "MIGRATIONS", _core.MIGRATIONS[:2])
    with opened() as store:
        fill(store, 40)
    gone = {"processed_by_recorded_at", "commit_ids_by_recorded_at"}
    assert gone <= indexes(url, pg_schema)
    monkeypatch.undo()
    time.sleep(0.3)
    with opened() as store:
        assert not gone & indexes(url, pg_schema)
        assert sql(url, f'SELECT version FROM "{pg_schema}".harel_store_schema') == [(3,)]
        assert store.overview()["processed"] == 40 and store.is_processed("e0000007", "ev7")
        fill(store, 10, start=40)
        assert store.prune(0.2) == {"processed": 40, "commit_ids": 40}
        assert store.overview()["processed"] == 10
    with opened() as store:  # reopened at this version: nothing missing
        assert store.is_processed("e0000045", "ev45")


def test_prune_walks_the_keys_a_window_at_a_time(
    url: str, pg_schema: str, opened: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old and young rows interleaved in key order, windows smaller than the table and
    not dividing it: every old row deleted, no young one, each window at most a batch."""
    from harel_store.postgres import _operate

    store = opened()
    fill(store, 90)
    s = f'"{pg_schema}"'
    for table in ("processed", "commit_ids"):  # every third execution's young, the rest old
        sql(url, f"UPDATE {s}.{table} SET recorded_at = now() - interval '1 hour'")
        sql(
            url,
            f"UPDATE {s}.{table} SET recorded_at = now()"
            " WHERE substr(execution_id, 2)::int % 3 = 0",
        )
    steps: list[int] = []
    real = _core._Core.prune_step

    def counted(self: Any, *args: Any) -> Any:
        n, after = yield from real(self, *args)
        steps.append(n)
        return n, after

    monkeypatch.setattr(_core._Core, "prune_step", counted)
    assert _operate.prune(store._run, 60, batch=7) == {"processed": 60, "commit_ids": 60}
    assert len(steps) == 2 * 13 and max(steps) <= 7  # 90 keys in windows of 7
    young = sql(url, f"SELECT execution_id FROM {s}.processed ORDER BY 1")
    assert [eid for (eid,) in young] == [f"e{i:07d}" for i in range(0, 90, 3)]
    assert store.prune(60) == {"processed": 0, "commit_ids": 0}


@pytest.fixture
def db_url(url: str) -> Iterator[str]:
    """The URL of a database of the test's own: the commands use the default schema."""
    import uuid

    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"ops_{uuid.uuid4().hex[:8]}"
    sql(url, f"CREATE DATABASE {name}")
    parts = conninfo_to_dict(make_conninfo(url, dbname=name))
    try:
        yield f"postgresql://{parts.get('user', '')}@{parts['host']}:{parts['port']}/{name}"
    finally:
        sql(url, f"DROP DATABASE {name} WITH (FORCE)")


def test_commands_on_postgres(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """inspect, show and prune on a database of their own (the default schema)."""
    import json

    from harel_store.cli import main

    with PostgresStore(db_url) as store:
        fill(store, 12)
        store.commit(store.load("e0000001"), [("e0000001", "hi")], processed_event_id="x")
        expected = store.overview()
    assert main(["inspect", db_url, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    for key in ("executions", "outbox", "processed", "commit_ids", "expired_leases"):
        assert figures[key] == expected[key]
    assert main(["show", db_url, "e0000001", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["version"] == 2 and [e["event"] for e in shown["outbox"]] == ["hi"]
    assert main(["show", db_url, "nobody"]) == 2
    assert main(["prune", db_url, "--older-than", "0s"]) == 0
    assert "13 processed marks and 12 commit ids" in capsys.readouterr().out


def test_show_on_postgres_has_the_epoch_and_the_counts(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``show`` prints what SQLite's prints: the writer epoch, the marks and commit ids of
    the execution, the leases and ages of its entries; the counts of every execution add
    up to the store's own."""
    import json

    from harel_store.cli import main

    with PostgresStore(db_url) as store:
        exe = Execution(id="a")
        for i in range(4):
            store.commit(
                exe, [("a", i)], processed_event_id=f"m{i}", epoch=7,
                commit_id=f"k{i}" if i % 2 else None,
                timers=[TimerOp("schedule", "t", 100.0 + i)],
                spawns=[("kid", ("r",), {})] if i == 0 else [],
            )  # fmt: skip
        store.commit(Execution(id="b"), [], processed_event_id="n0", commit_id="j0")
        store.claim_outbox(1, lease=60.0)
        store.claim_due_timers(1000.0, 1, lease=60.0)
        own = store.overview()
        version = store.load("a").version  # type: ignore[union-attr]
    counts = {"processed": 0, "commit_ids": 0}
    for eid in ("a", "b"):
        assert main(["show", db_url, eid, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        for key in counts:
            counts[key] += shown[key]
    assert counts == {"processed": own["processed"], "commit_ids": own["commit_ids"]}
    assert main(["show", db_url, "a", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["version"], shown["epoch"], shown["processed"], shown["commit_ids"]) == (
        version, 7, 4, 2,
    )  # fmt: skip
    assert [e["event"] for e in shown["outbox"]] == [0, 1, 2, 3]
    leases = [e["leased_until"] for e in shown["outbox"]]
    assert leases[0] > time.time() + 30 and leases[1:] == [None] * 3
    assert all(0 <= e["age"] < 60 for e in shown["outbox"])
    assert [(s["parent_id"], s["child_id"]) for s in shown["spawns"]] == [("a", "kid")]
    assert [(t["path"], t["fire_at"]) for t in shown["timers"]] == [("t", 103.0)]
    assert shown["timers"][0]["leased_until"] > time.time() + 30
    assert main(["show", db_url, "a"]) == 0
    text = capsys.readouterr().out
    assert "epoch       7" in text and "processed   4" in text and "commit_ids  2" in text


def test_a_migration_is_logged(
    opened: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_core, "MIGRATIONS", _core.MIGRATIONS[:1])
    opened().close()
    monkeypatch.undo()
    with caplog.at_level("INFO", logger="harel_store"):
        opened().commit(Execution(id="a"), [])
    assert [r.getMessage() for r in caplog.records if "migrated" in r.getMessage()]
    assert all(r.name.startswith("harel_store") for r in caplog.records)


async def _take_over(store: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Entries leased for no time, then claimed again: what was logged meanwhile."""
    await settled(
        store.commit(
            Execution(id="a"), [(None, i) for i in range(3)], processed_event_id="m",
            spawns=[("c", ("r",), {})], timers=[TimerOp("schedule", "t", 50.0)],
        )
    )  # fmt: skip
    with caplog.at_level("DEBUG", logger="harel_store"):
        first = await settled(store.claim_outbox(2, lease=0.0))  # runs out at once
        assert len(await settled(store.claim_spawns(5, lease=0.0))) == 1
        assert len(await settled(store.claim_due_timers(100.0, 5, lease=0.0))) == 1
        assert caplog.records == []  # fresh entries: nothing taken over
        assert len(await settled(store.claim_outbox(5, lease=60.0))) == 3
        assert len(await settled(store.claim_spawns(5, lease=60.0))) == 1
        assert len(await settled(store.claim_due_timers(100.0, 5, lease=60.0))) == 1
        assert await settled(store.claim_outbox(5)) == []
    said = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert [(name, level) for name, level, _ in said] == [("harel_store.postgres", "WARNING")] * 3
    assert "took over 2 outbox entries" in said[0][2]
    assert said[0][2].endswith(f": {first[0].seq}, {first[1].seq}"), said[0][2]
    assert "took over 1 spawn intents" in said[1][2]
    assert "took over 1 timers" in said[2][2] and said[2][2].endswith("('a', 't')")


def test_a_lease_taken_over_is_logged(
    opened: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    asyncio.run(_take_over(opened(), caplog))


def test_a_lease_taken_over_is_logged_async(
    url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with AsyncPostgresStore(url, schema=pg_schema) as store:
            await _take_over(store, caplog)

    asyncio.run(main())


def test_nothing_logged_on_the_hot_path(
    opened: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Commits, claims of fresh entries, acks and batches say nothing, even at DEBUG."""
    store = opened()
    store.commit(Execution(id="w"), [])
    with caplog.at_level("DEBUG", logger="harel_store"):
        for i in range(20):
            exe = store.load("w")
            store.commit(exe, [(None, i)], processed_event_id=f"m{i}", commit_id=f"k{i}")
        fill(store, 20)
        store.ack_outbox_many([e.seq for e in store.claim_outbox(100)])
        assert store.claim_outbox(100) == []
    assert caplog.records == []
