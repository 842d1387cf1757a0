"""Batches under crashes, races and cancellation, on a SQLite file and on PostgreSQL.

- A process commits a stream of batches (batch ``k`` writes executions ``b{k}-{i}``, each
  with an outbox entry, a processed mark, a timer and a trace step) and is killed with
  SIGKILL at random moments: every batch is then there whole or not at all, and every
  batch whose ``commit_many`` returned is there.
- Racing processes commit overlapping batches of the same executions (each increments a
  counter of the executions it read, and retries the conflicted ones): no update is lost,
  the final counter of each execution is the sum of the increments the processes saw
  applied.
- Group commit: many tasks commit through one async store at once, some cancelled at
  random moments: a cancelled task's commit landed whole or not at all, and the others
  landed with their own outcomes.

The worker processes are this file run as a script (see the end).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _helpers import module_env

from harel_store import Commit, Execution, StoreConflict, TimerOp

pytestmark = pytest.mark.durable

SIZE = 12  # commits per batch of the stream
STREAM_END = 400  # a worker that is never killed stops there
COUNTERS = [f"n{i}" for i in range(8)]


def stream_batch(k: int) -> list[Commit]:
    return [
        Commit(
            Execution(id=f"b{k}-{i}", context={"k": k, "i": i}),
            [(f"b{k}-{i}", f"ev-{k}-{i}")],
            "ev",
            [TimerOp("schedule", "t", float(k))],
            trace={"k": k},
            commit_id=f"c{k}-{i}",
        )
        for i in range(SIZE)
    ]


def open_sync(where: str) -> Any:
    """``sqlite:PATH`` or ``postgres:SCHEMA@URL``: the sync store there."""
    kind, _, rest = where.partition(":")
    if kind == "sqlite":
        from harel_store.sqlite import SqliteStore

        return SqliteStore(rest)
    from harel_store.postgres import PostgresStore

    schema, _, url = rest.partition("@")
    return PostgresStore(url, schema=schema)


def open_async(where: str) -> Any:
    kind, _, rest = where.partition(":")
    if kind == "sqlite":
        from harel_store.sqlite import AsyncSqliteStore

        return AsyncSqliteStore(rest)
    from harel_store.postgres import AsyncPostgresStore

    schema, _, url = rest.partition("@")
    return AsyncPostgresStore(url, schema=schema)


def spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        env=module_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def reported(progress: Path) -> int:
    """The last batch the stream worker saw ``commit_many`` return for, or -1."""
    lines = progress.read_text().split()
    return int(lines[-1]) if lines else -1


# --- SIGKILL in a stream of batches ----------------------------------------------------


def run_killed_stream(where: str, tmp_path: Path, kills: int, seed: int) -> int:
    """Kill the stream worker ``kills`` times, a random 0 to 15 ms after it reported a
    random batch a few beyond the last, and check after each kill that the batches past
    the last reported are whole or absent (the next worker resumes after the last
    reported batch, replaying by their commit ids the commits of a batch that landed).
    Returns the last batch reported, and how many kills left an unreported batch."""
    rng = random.Random(seed)
    progress = tmp_path / "progress"
    progress.touch()
    unreported = 0
    for _ in range(kills):
        start = reported(progress) + 1
        target = start + rng.randint(0, 4)
        proc = spawn("stream", where, str(progress), str(start))
        try:
            while reported(progress) < target and proc.poll() is None:
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.015))
            assert proc.poll() is None, proc.communicate()[1].decode()
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.communicate()
        with open_sync(where) as store:
            last = reported(progress)
            unreported += check_whole_batches(store, last, range(last - 1, last + 3))
    return unreported


def check_whole_batches(store: Any, last_reported: int, batches: range) -> int:
    """Each of ``batches`` up to ``last_reported`` is there whole, any later one whole
    or not at all. Returns how many of the later ones are there."""
    outbox = {e.event for e in store.pending_outbox()}
    timers = set(store.due_timers(math.inf))
    later = 0
    for k in batches:
        if k < 0:
            continue
        there = []
        for i in range(SIZE):
            eid = f"b{k}-{i}"
            exe = store.load(eid)
            parts = (
                exe is not None and exe.version == 1 and exe.context == {"k": k, "i": i},
                f"ev-{k}-{i}" in outbox,
                store.is_processed(eid, "ev"),
                (eid, "t", float(k)) in timers,
                [s["k"] for s in store.read_trace(eid)] == [k],
            )
            assert len(set(parts)) == 1, (k, i, parts)  # a commit is whole
            there.append(parts[0])
        assert len(set(there)) == 1, (k, there)  # a batch is whole
        if k <= last_reported:
            assert there[0], f"batch {k} was reported committed but is missing"
        else:
            later += there[0]
    return later


def test_sqlite_a_killed_stream_of_batches_leaves_whole_batches(tmp_path: Path) -> None:
    where = f"sqlite:{tmp_path / 'stream.db'}"
    run_killed_stream(where, tmp_path, kills=15, seed=1)
    last = reported(tmp_path / "progress")
    assert last >= 15, last  # batches landed between the kills
    with open_sync(where) as store:
        check_whole_batches(store, last, range(last + 3))


def test_postgres_a_killed_stream_of_batches_leaves_whole_batches(
    pg_server: Any, pg_schema: str, tmp_path: Path
) -> None:
    where = f"postgres:{pg_schema}@{pg_server.url}"
    run_killed_stream(where, tmp_path, kills=4, seed=2)
    last = reported(tmp_path / "progress")
    assert last >= 4, last
    with open_sync(where) as store:
        check_whole_batches(store, last, range(last + 3))


# --- racing processes on overlapping batches -------------------------------------------


def run_race(where: str, tmp_path: Path, racers: int, rounds: int) -> None:
    with open_sync(where) as store:
        store.commit_many([Commit(Execution(id=eid, context={"n": 0}), []) for eid in COUNTERS])
    go = tmp_path / "go"
    procs = [spawn("race", where, str(r), str(rounds), str(go)) for r in range(racers)]
    # The racers start together once all are ready: else the first could end before
    # the last has imported the package.
    while not all(go.with_suffix(f".{r}").exists() for r in range(racers)):
        assert all(proc.poll() is None for proc in procs), "a racer ended before the start"
        time.sleep(0.01)
    go.touch()
    applied = dict.fromkeys(COUNTERS, 0)
    conflicts = 0
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err.decode()
        report = json.loads(out)
        conflicts += report["conflicts"]
        for eid, n in report["applied"].items():
            applied[eid] += n
    with open_sync(where) as store:
        final = {eid: store.load(eid) for eid in COUNTERS}
        outbox = [e.target_id for e in store.pending_outbox()]
    assert {eid: exe.context["n"] for eid, exe in final.items()} == applied
    assert {eid: exe.version - 1 for eid, exe in final.items()} == applied
    assert {eid: outbox.count(eid) for eid in COUNTERS} == applied
    assert sum(applied.values()) >= racers * rounds
    assert conflicts > 0, "the racers never collided: the test saw no race"


def test_sqlite_racing_processes_lose_no_update(tmp_path: Path) -> None:
    run_race(f"sqlite:{tmp_path / 'race.db'}", tmp_path, racers=3, rounds=40)


def test_postgres_racing_processes_lose_no_update(
    pg_server: Any, pg_schema: str, tmp_path: Path
) -> None:
    run_race(f"postgres:{pg_schema}@{pg_server.url}", tmp_path, racers=3, rounds=40)


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


async def cancelled_batches(where: str, seed: int) -> None:
    """30 tasks each commit a batch of three (the middle one stale) and ack one outbox
    entry of their own, through one async store at once; 10 are cancelled at random
    moments. A cancelled batch landed whole or not at all; the others got
    ``[None, StoreConflict, None]`` and landed; every ack of a task that was not cancelled
    took its entry, and took no other."""
    rng = random.Random(seed)
    p = f"m{seed}-"
    async with open_async(where) as store:
        for t in range(30):  # the stale ones, and an entry each task acks
            await store.commit(Execution(id=f"{p}old-{t}"), [(f"{p}old-{t}", f"{p}ack-{t}")])
        seqs = {e.event: e.seq for e in await store.pending_outbox()}

        def batch(t: int) -> list[Commit]:
            return [
                Commit(Execution(id=f"{p}t{t}-a"), [(None, f"{p}ev-{t}-a")], "ev"),
                Commit(Execution(id=f"{p}old-{t}"), [(None, f"{p}ev-{t}-old")], "ev"),
                Commit(Execution(id=f"{p}t{t}-b"), [(None, f"{p}ev-{t}-b")], "ev"),
            ]

        async def one(t: int) -> list[Any]:
            outcomes = await store.commit_many(batch(t))
            await store.ack_outbox_many([seqs[f"{p}ack-{t}"]])
            return list(outcomes)

        tasks = {t: asyncio.ensure_future(one(t)) for t in range(30)}
        victims = set(rng.sample(sorted(tasks), 10))
        loop = asyncio.get_running_loop()
        for t in victims:
            delay = rng.choice([0.0, rng.uniform(0.0, 0.002), rng.uniform(0.0, 0.02)])
            loop.call_later(delay, tasks[t].cancel)
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        outbox = {e.event for e in await store.pending_outbox()}
        for t, task in tasks.items():
            a, old, b = [await store.load(f"{p}{x}") for x in (f"t{t}-a", f"old-{t}", f"t{t}-b")]
            assert old.version == 1 and f"{p}ev-{t}-old" not in outbox, (t, old)
            landed = (
                a is not None,
                b is not None,
                f"{p}ev-{t}-a" in outbox,
                f"{p}ev-{t}-b" in outbox,
            )
            if task.cancelled():
                assert t in victims
                assert len(set(landed)) == 1, (t, landed)  # the batch whole or not at all
            else:
                outcomes = task.result()
                assert outcomes[0] is None and outcomes[2] is None, (t, outcomes)
                assert type(outcomes[1]) is StoreConflict, (t, outcomes)
                assert landed == (True,) * 4, (t, landed)
                assert f"{p}ack-{t}" not in outbox, t


def test_sqlite_group_commit_under_cancellation(tmp_path: Path) -> None:
    for seed in range(3):
        asyncio.run(cancelled_commits(f"sqlite:{tmp_path / 'group.db'}", seed))


def test_postgres_group_commit_under_cancellation(pg_server: Any, pg_schema: str) -> None:
    for seed in range(3):
        asyncio.run(cancelled_commits(f"postgres:{pg_schema}@{pg_server.url}", seed))


def test_sqlite_batches_and_acks_in_group_commit_under_cancellation(tmp_path: Path) -> None:
    for seed in range(2):
        asyncio.run(cancelled_batches(f"sqlite:{tmp_path / 'group.db'}", seed))


def test_postgres_batches_and_acks_in_group_commit_under_cancellation(
    pg_server: Any, pg_schema: str
) -> None:
    for seed in range(2):
        asyncio.run(cancelled_batches(f"postgres:{pg_schema}@{pg_server.url}", seed))


# --- the worker processes ----------------------------------------------------------------


def stream_worker(where: str, progress: str, start: int) -> None:
    with open_sync(where) as store, open(progress, "a") as out:
        for k in range(start, STREAM_END):
            outcomes = store.commit_many(stream_batch(k))
            assert outcomes == [None] * SIZE, outcomes
            out.write(f"{k}\n")
            out.flush()


def race_worker(where: str, racer: int, rounds: int, go: Path) -> None:
    rng = random.Random(racer)
    applied = dict.fromkeys(COUNTERS, 0)
    conflicts = 0
    with open_sync(where) as store:
        store.load(COUNTERS[0])  # connected
        go.with_suffix(f".{racer}").touch()
        while not go.exists():
            time.sleep(0.001)
        for r in range(rounds):
            todo = rng.sample(COUNTERS, 5)
            while todo:
                batch = []
                for eid in todo:
                    exe = store.load(eid)
                    exe.context["n"] += 1
                    batch.append(Commit(exe, [(eid, f"{racer}-{r}")]))
                outcomes = store.commit_many(batch)
                for commit, outcome in zip(batch, outcomes):
                    if outcome is None:
                        applied[commit.exe.id] += 1
                    else:
                        assert type(outcome) is StoreConflict, outcome
                        conflicts += 1
                todo = [c.exe.id for c, o in zip(batch, outcomes) if o is not None]
    print(json.dumps({"applied": applied, "conflicts": conflicts}))


if __name__ == "__main__":
    if sys.argv[1] == "stream":
        stream_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        race_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
