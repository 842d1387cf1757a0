"""Group commit under cancellation, on a SQLite file and on PostgreSQL: many tasks commit
through one async store at once, some cancelled at random moments; a cancelled task's
commit landed whole or not at all, and the others landed with their own outcomes (one
task's conflict fails no other).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from harel_store import Commit, Execution, StoreConflict

pytestmark = pytest.mark.durable


def open_async(where: str) -> Any:
    kind, _, rest = where.partition(":")
    if kind == "sqlite":
        from harel_store.sqlite import AsyncSqliteStore

        return AsyncSqliteStore(rest)
    from harel_store.postgres import AsyncPostgresStore

    schema, _, url = rest.partition("@")
    return AsyncPostgresStore(url, schema=schema)


# --- group commit under cancellation ---------------------------------------------------


async def cancelled_commits(where: str, seed: int) -> None:
    """60 tasks commit at once through one async store, three of them stale (a
    ``StoreConflict`` each); 20 of the others are cancelled at random moments."""
    rng = random.Random(seed)
    p = f"s{seed}-"
    async with open_async(where) as store:
        stale = {9, 19, 29}
        for i in stale:
            await store.commit(Execution(id=f"{p}old-{i}"), [])  # at version 1
        commits = {
            i: Commit(
                Execution(id=f"{p}old-{i}" if i in stale else f"{p}g{i}", context={"i": i}),
                [(f"{p}g{i}", f"{p}ev-{i}")],
                f"ev-{i}",
                trace={"i": i},
            )
            for i in range(60)
        }

        async def one(commit: Commit) -> None:
            await store.commit(*commit[:6])

        tasks = {i: asyncio.ensure_future(one(c)) for i, c in commits.items()}
        victims = set(rng.sample(sorted(set(tasks) - stale), 20))
        loop = asyncio.get_running_loop()
        for i in victims:  # before they start, while they wait, while their write flies
            delay = rng.choice([0.0, rng.uniform(0.0, 0.002), rng.uniform(0.0, 0.02)])
            loop.call_later(delay, tasks[i].cancel)
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        outbox = {e.event for e in await store.pending_outbox()}
        for i, commit in commits.items():
            eid = commit.exe.id
            exe = await store.load(eid)
            parts = (
                f"{p}ev-{i}" in outbox,
                await store.is_processed(eid, f"ev-{i}"),
                [step["i"] for step in await store.read_trace(eid)] == [i],
                exe is not None and exe.context == {"i": i},
            )
            task = tasks[i]
            if i in stale:
                assert type(task.exception()) is StoreConflict, (i, task)
                assert parts == (False,) * 4 and exe.version == 1, (i, parts, exe)
            elif task.cancelled():
                assert i in victims
                assert len(set(parts)) == 1, (i, parts)  # whole or not at all
            else:
                assert task.exception() is None, (i, task)
                assert parts == (True,) * 4 and exe.version == 1, (i, parts, exe)


def test_sqlite_group_commit_under_cancellation(tmp_path: Path) -> None:
    for seed in range(3):
        asyncio.run(cancelled_commits(f"sqlite:{tmp_path / 'group.db'}", seed))


def test_postgres_group_commit_under_cancellation(pg_server: Any, pg_schema: str) -> None:
    for seed in range(3):
        asyncio.run(cancelled_commits(f"postgres:{pg_schema}@{pg_server.url}", seed))
