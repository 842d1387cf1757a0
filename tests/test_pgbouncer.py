"""The PostgreSQL stores, sync and async, through PgBouncer in transaction mode (issue
28): they work with ``prepare=False``, and ``wait_for_work``, whose LISTEN would not
cross the pooler, polls and says so once in the log.

Needs Debian's ``pgbouncer`` (started here, in front of the session's throwaway server).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import _pg
import pytest

from harel_store import Execution
from harel_store.postgres import AsyncPostgresStore, PostgresStore


@pytest.fixture(scope="module")
def bouncer(pg_server: Any) -> Iterator[_pg.Bouncer]:
    reason = None
    if _pg.find_pgbouncer() is None:
        reason = "no pgbouncer (Debian: apt-get install pgbouncer)"
    elif not pg_server.throwaway:
        reason = "PgBouncer is put in front of the throwaway server only"
    if reason is not None:
        if _pg.required() and pg_server.throwaway:
            pytest.fail(f"{_pg.REQUIRE_ENV} is set: {reason}", pytrace=False)
        pytest.skip(reason)
    bouncer = _pg.start_pgbouncer(pg_server)
    yield bouncer
    bouncer.destroy()


def test_the_store_works_through_pgbouncer_in_transaction_mode(
    bouncer: _pg.Bouncer, pg_schema: str
) -> None:
    with PostgresStore(bouncer.url, schema=pg_schema, prepare=False, pool_size=3) as store:
        exe = Execution(id="e1")
        for k in range(1, 21):
            exe.context["k"] = k
            store.commit(exe, [(None, k)], trace={"k": k}, commit_id=f"c{k}")
        again = Execution(id="e1", version=19)  # a replay of the last commit
        again.context["k"] = 20
        store.commit(again, [(None, 20)], trace={"k": 20}, commit_id="c20")
        assert again.version == 20
        loaded = store.load("e1")
        assert loaded is not None and loaded.version == 20 and loaded.context["k"] == 20
        claimed = store.claim_outbox(100)
        assert [entry.event for entry in claimed] == list(range(1, 21))
        store.ack_outbox_many(entry.seq for entry in claimed)
        assert store.pending_outbox() == []
        # Threads share the pool through the bouncer.
        errors: list[BaseException] = []

        def work(name: str) -> None:
            try:
                own = Execution(id=name)
                for _ in range(10):
                    store.commit(own, [])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert all(store.load(f"t{i}").version == 10 for i in range(6))  # type: ignore[union-attr]


def test_wait_for_work_polls_through_pgbouncer_and_says_so_once(
    bouncer: _pg.Bouncer, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="harel_store")
    with (
        PostgresStore(bouncer.url, schema=pg_schema, prepare=False) as waiter,
        PostgresStore(bouncer.url, schema=pg_schema, prepare=False) as writer,
    ):
        assert waiter.wait_for_work(0.2) is False
        woken: list[bool] = []
        thread = threading.Thread(target=lambda: woken.append(waiter.wait_for_work(60.0)))
        thread.start()
        writer.commit(Execution(id="w"), [(None, "go")])
        thread.join()
        assert woken == [True]
        assert waiter.wait_for_work(0.1) is False  # that work was this wake-up's
    said = [r for r in caplog.records if "wait_for_work polls" in r.getMessage()]
    assert len(said) == 1  # three calls and many polls: said once
    assert {r.name for r in said} == {"harel_store.postgres"}


def test_the_async_store_works_through_pgbouncer_and_polls_for_work(
    bouncer: _pg.Bouncer, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The async twin: commits, a replay, group commits of concurrent tasks, claims and
    acks through the bouncer; wait_for_work polls, wakes on a commit, and says so once."""
    caplog.set_level(logging.INFO, logger="harel_store")

    async def main() -> None:
        url = bouncer.url
        async with (
            AsyncPostgresStore(url, schema=pg_schema, prepare=False, pool_size=3) as store,
            AsyncPostgresStore(url, schema=pg_schema, prepare=False) as waiter,
        ):
            exe = Execution(id="a1")
            for k in range(1, 11):
                exe.context["k"] = k
                await store.commit(exe, [(None, k)], trace={"k": k}, commit_id=f"c{k}")
            again = Execution(id="a1", version=9)
            again.context["k"] = 10
            await store.commit(again, [(None, 10)], trace={"k": 10}, commit_id="c10")
            assert again.version == 10
            own = [Execution(id=f"t{i}") for i in range(6)]
            for _ in range(5):  # concurrent tasks: group commits through the bouncer
                await asyncio.gather(*(store.commit(e, [(None, e.id)]) for e in own))
            assert [e.version for e in own] == [5] * 6
            claimed = await store.claim_outbox(100)
            assert len(claimed) == 40
            await store.ack_outbox_many(entry.seq for entry in claimed)
            assert await store.pending_outbox() == []
            assert store.pool_stats()["pool_size"] <= 3
            assert await waiter.wait_for_work(0.2) is True  # the commits above
            assert await waiter.wait_for_work(0.2) is False
            waiting = asyncio.ensure_future(waiter.wait_for_work(60.0))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await store.commit(Execution(id="w"), [(None, "go")])
            assert await asyncio.wait_for(waiting, 30.0) is True
            assert await waiter.wait_for_work(0.1) is False  # that work was this wake-up's

    asyncio.run(main())
    said = [r for r in caplog.records if "wait_for_work polls" in r.getMessage()]
    assert len(said) == 1
    assert {r.name for r in said} == {"harel_store.postgres"}
