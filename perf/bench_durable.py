"""pyperf benchmarks of the durable stores (issue 14): ``SqliteStore`` with
``synchronous=NORMAL`` and ``FULL`` (a file on disk) and ``PostgresStore`` (a local server,
one connection), each beside the floor it cannot beat and the peers users would pick
instead, all measured in the same run.

    python perf/bench_durable.py --fast -o perf/results_durable.json   # ~12 minutes
    python perf/report.py perf/results.json perf/results_durable.json > perf/RESULTS.md

Benchmarks are named ``<target>:<impl>:<case>``:

- ``target``: ``sqlite-normal``, ``sqlite-full``, ``postgres``; ``machine`` for the disk
  and the codec, which belong to no store.
- ``impl``: ``harel`` (this package's store), ``floor`` (the same writes typed by hand as
  the fewest ``sqlite3``/psycopg calls in one transaction, JSON encoding included),
  ``eventsourcing`` and ``langgraph`` (the peers), ``disk`` (write + fdatasync on the disk
  the databases live on), ``json``/``orjson`` (the codec).

Every case checks, before its clock starts, what it measures: the class and module of the
store, SQLite's ``journal_mode`` and ``synchronous`` on the very connection that writes,
PostgreSQL's ``fsync`` and ``synchronous_commit`` on the session that writes, and the same
for every floor and peer connection. A run can never compare NORMAL with FULL.

The PostgreSQL server is the one ``HAREL_STORE_PG_URL`` names, or a throwaway cluster
started by the main process with ``tests/_pg.py`` (PostgreSQL's default fsync settings)
and stopped at the end. The databases the cases share (the commit database, the big ones
for the timer and outbox cases and the scaling sweep) are built once per run by the main
process, outside every clock; each worker process opens them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path
from time import perf_counter
from typing import Any, NamedTuple

import pyperf
from bench_store import (
    EMITS,
    LATER,
    NOW,
    SPAWNS,
    STEP,
    round_shares,
    run_rounds,
    settle,
    typical_work,
)

import harel_store
from harel_store import Execution, TimerOp, _codec
from harel_store.sqlite import JsonCodec, SqliteStore

try:
    from orjson import dumps as orjson_dumps
    from orjson import loads as orjson_loads
except ImportError:  # the codec cases then measure the default codec only
    orjson_dumps = orjson_loads = None

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

TARGETS = ("sqlite-normal", "sqlite-full", "postgres")
SYNCHRONOUS = {"sqlite-normal": "NORMAL", "sqlite-full": "FULL"}
SQLITE_SYNC_CODE = {"NORMAL": 1, "FULL": 2}
PEERS = ("eventsourcing", "langgraph")
CLAIM_LIMIT = 100
SCHEMA_COMMIT = "bench_commit"


@dataclass(frozen=True)
class Sizes:
    executions: int = 1_000  # in the commit database, each with an armed timer
    trace_max: int = 200  # the full ring of exe-0 (and of the 2 writers' executions)
    timers: int = 100_000  # armed timers for due_timers / claim_due_timers
    due: int = 10  # of which due
    outbox: int = 10_000  # outbox entries for claim + ack
    scale: tuple[int, int] = (10_000, 1_000_000)  # rows for the scaling sweep
    demo: int = 200  # orders of the demo workload


FULL = Sizes()
QUICK = replace(
    FULL, executions=50, trace_max=20, timers=2_000, outbox=500, scale=(500, 2_000), demo=10
)


def _k(n: int) -> str:
    """A size in a benchmark name: ``500``, ``10k``, ``1m``."""
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


# --- the environment: where the databases are --------------------------------------------


class Env(NamedTuple):
    data: Path  # the directory of the SQLite files (and of the fsync floor)
    pg_url: str | None


def big_sizes(sizes: Sizes) -> tuple[int, ...]:
    return tuple(sorted({sizes.timers, sizes.outbox, *sizes.scale}))


def sqlite_path(env: Env, name: str) -> str:
    return str(env.data / f"{name}.db")


def big_schema(n: int, kind: str = "big") -> str:
    return f"bench_{kind}_{_k(n).lower()}"


# --- what a case measures: checked before every clock -----------------------------------


def check_sqlite_conn(conn: Any, setting: str, who: str) -> None:
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    if mode.lower() != "wal" or sync != SQLITE_SYNC_CODE[setting]:
        raise RuntimeError(f"{who}: journal_mode={mode} synchronous={sync}, not WAL/{setting}")


def check_pg_conn(conn: Any, who: str) -> None:
    def show(name: str) -> str:
        row = conn.execute(f"SHOW {name}").fetchone()
        return str(next(iter(row.values())) if isinstance(row, dict) else row[0])

    fsync, sync = show("fsync"), show("synchronous_commit")
    if (fsync, sync) != ("on", "on"):
        raise RuntimeError(f"{who}: fsync={fsync} synchronous_commit={sync}, not the defaults")


def expect_store(target: str, store: Any) -> None:
    """Fail unless ``store`` is this package's store for ``target``, with its settings."""
    if target == "postgres":
        from harel_store.postgres import PostgresStore

        if type(store) is not PostgresStore or store._core.pool_size != 1:
            raise RuntimeError(f"{target}: measuring {store!r}")
        conn = store._pool.get()
        try:
            check_pg_conn(conn, target)
        finally:
            store._pool.put(conn)
    else:
        if type(store) is not SqliteStore or type(store).__module__ != "harel_store.sqlite":
            raise RuntimeError(f"{target}: measuring {store!r}")
        check_sqlite_conn(store._conn, SYNCHRONOUS[target], target)


def open_harel(target: str, env: Env, db: str, sizes: Sizes, **options: Any) -> Any:
    """This package's store for ``target`` on the database ``db`` (a SQLite file name
    or a PostgreSQL schema), checked."""
    if target == "postgres":
        from harel_store.postgres import PostgresStore

        assert env.pg_url is not None
        store = PostgresStore(
            env.pg_url, schema=db, pool_size=1, trace_max=sizes.trace_max, **options
        )
    else:
        store = SqliteStore(
            sqlite_path(env, db),
            synchronous=SYNCHRONOUS[target],
            trace_max=sizes.trace_max,
            **options,
        )
    expect_store(target, store)
    return store


def commit_db(target: str) -> str:
    return SCHEMA_COMMIT if target == "postgres" else "commit"


def big_db(target: str, n: int, kind: str = "big") -> str:
    """The database of ``n`` timers and outbox entries: ``big`` for the cases that only
    lease and unlease, ``ack`` for ``claim_ack``, whose acks leave dead rows at the head
    of the outbox (on PostgreSQL, until a vacuum) that would slow the others' claims."""
    return big_schema(n, kind) if target == "postgres" else f"{kind}_{_k(n).lower()}"


@contextlib.contextmanager
def side_sql(target: str, env: Env, db: str) -> Iterator[Callable[[str, tuple[Any, ...]], None]]:
    """A connection of the harness's own, to reset state between timed operations
    (outside the clock), as a function running one statement in its own transaction;
    closed on leaving the block."""
    if target == "postgres":
        import psycopg

        with psycopg.connect(env.pg_url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{db}"')

            def run(sql: str, params: tuple[Any, ...] = ()) -> None:
                conn.execute(sql.replace("?", "%s"), params)

            yield run
        return
    import sqlite3

    lite = sqlite3.connect(sqlite_path(env, db), isolation_level=None, timeout=30)
    try:

        def run_lite(sql: str, params: tuple[Any, ...] = ()) -> None:
            lite.execute(sql, params)

        yield run_lite
    finally:
        lite.close()


# --- building the shared databases (main process, outside every clock) ---------------------


def build_commit_db(target: str, env: Env, sizes: Sizes) -> None:
    """``sizes.executions`` executions, each with an armed ``root/wait`` timer, and full
    trace rings for ``exe-0`` (the typical commit's) and every execution that a batch or
    a task of the batch cases commits to (the two writers' among them): the store of
    ``bench_store.py``'s typical commit, on disk, whose step goes into a full ring
    whichever execution takes it."""
    store = open_harel(target, env, commit_db(target), sizes)
    with store:
        for i in range(sizes.executions):
            exe = Execution(id=f"exe-{i}", definition_id="order")
            store.commit(exe, (), timers=[TimerOp("schedule", "root/wait", LATER + i)])
        for i in range(min(max(BATCH, TASKS), sizes.executions)):
            for _ in range(sizes.trace_max):
                store.append_trace(f"exe-{i}", STEP)


def build_big_db(target: str, env: Env, n: int, due: int, kind: str = "big") -> None:
    """``n`` armed timers (``due`` of them due at ``NOW``) over executions of 100 paths,
    and ``n`` outbox entries: the rows the store would write, inserted in bulk."""
    db = big_db(target, n, kind)
    open_harel(target, env, db, FULL).close()  # the schema, created by the store
    event = json.dumps({"type": "ping", "n": 1}, separators=(",", ":"))
    if target == "postgres":
        import psycopg

        with psycopg.connect(env.pg_url, autocommit=True) as conn:
            s = f'"{db}"'
            conn.execute(
                f"INSERT INTO {s}.timers (execution_id, path, fire_at)"
                " SELECT 'exe-' || (x / 100), 'root/s' || (x %% 100),"
                " CASE WHEN x < %s THEN %s - 1 - x ELSE %s + x END"
                " FROM generate_series(0, %s - 1) AS x",
                (due, NOW, LATER, n),
            )
            conn.execute(
                f"INSERT INTO {s}.outbox (target_id, event)"
                " SELECT 'exe-' || (x %% 1000), %s FROM generate_series(1, %s) AS x",
                (b"t" + event.encode(), n),
            )
            conn.execute(f"VACUUM ANALYZE {s}.timers")
            conn.execute(f"VACUUM ANALYZE {s}.outbox")
        return
    import sqlite3

    conn = sqlite3.connect(sqlite_path(env, db), isolation_level=None)
    try:
        counter = "WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c WHERE x < ? - 1) "
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            counter + "INSERT INTO timers (execution_id, path, fire_at, seq)"
            " SELECT 'exe-' || (x / 100), 'root/s' || (x % 100),"
            " CASE WHEN x < ? THEN ? - 1 - x ELSE ? + x END, (SELECT n FROM work) + 1 + x FROM c",
            (n, due, NOW, LATER),
        )
        conn.execute("UPDATE work SET n = n + ?", (n,))  # past the timers' seqs (arming order)
        conn.execute(
            counter + "INSERT INTO outbox (target_id, event) SELECT 'exe-' || (x % 1000), ? FROM c",
            (n, event),
        )
        conn.execute("UPDATE work SET n = n + 1")
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()


def build_all(targets: tuple[str, ...], env: Env, sizes: Sizes, log: Callable[[str], None]) -> None:
    built_sqlite = False
    for target in targets:
        if target != "postgres" and built_sqlite:
            continue  # the two SQLite settings share their files (synchronous is per connection)
        start = perf_counter()
        build_commit_db(target, env, sizes)
        for n in big_sizes(sizes):
            build_big_db(target, env, n, sizes.due)
        build_big_db(target, env, sizes.outbox, sizes.due, "ack")
        built_sqlite = built_sqlite or target != "postgres"
        log(f"bench_durable: built the databases of {target} in {perf_counter() - start:.1f} s")


# --- the workload ---------------------------------------------------------------------


class Typical(NamedTuple):
    """One typical commit, encoded as the floor and the peers write it."""

    exe: bytes
    events: list[bytes]
    spawn: tuple[bytes, bytes]
    step: bytes
    size: int


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def exe_fields(exe: Any) -> dict[str, Any]:
    """What the default codec writes of an execution: every field but ``version``."""
    return {name: getattr(exe, name) for name in _codec._FIELDS}


def typical_exe() -> Execution:
    return Execution(id="exe-0", definition_id="order")


def typical_encoded() -> Typical:
    exe = dumps(exe_fields(typical_exe())).encode()
    events = [dumps(event).encode() for _, event in EMITS]
    _, root, context = SPAWNS[0]
    spawn = (dumps(root).encode(), dumps(context).encode())
    step = dumps(STEP).encode()
    size = len(exe) + sum(map(len, events)) + len(spawn[0]) + len(spawn[1]) + len(step)
    return Typical(exe, events, spawn, step, size)


# --- harel cases: each returns the seconds ``loops`` operations took -----------------------


def time_load(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    store = open_harel(target, env, commit_db(target), sizes)
    with store:
        load = store.load
        key = f"exe-{sizes.executions // 2}"
        if load(key) is None:
            raise RuntimeError("load misses")
        settle()
        t0 = perf_counter()
        for _ in range(loops):
            load(key)
        return perf_counter() - t0


def time_save(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    store = open_harel(target, env, commit_db(target), sizes)
    with store:
        exe = store.load("exe-3")
        save = store.save
        version = exe.version
        settle()
        t0 = perf_counter()
        for _ in range(loops):
            save(exe)
        elapsed = perf_counter() - t0
        if store.load("exe-3").version != version + loops:
            raise RuntimeError("save did not save")
        return elapsed


def time_commit_minimal(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    store = open_harel(target, env, commit_db(target), sizes)
    with store:
        exe = store.load("exe-4")
        commit = store.commit
        settle()
        t0 = perf_counter()
        for _ in range(loops):
            commit(exe, ())
        return perf_counter() - t0


def reset_commit_db(target: str, env: Env) -> None:
    """Outside the clock: drop what earlier typical commits left behind (outbox entries,
    spawns, processed marks), as relays drain between events. On PostgreSQL, also vacuum
    the tables a commit writes: the dead row versions that the cases before left (every
    commit updates the same execution, timer and ring rows) would otherwise slow the next
    case by as much as the autovacuum happened to leave, so that cases of one run, the
    store's and its floor's, would not start from the same database."""
    with side_sql(target, env, commit_db(target)) as run:
        for table in ("outbox", "spawns", "processed", "commit_ids"):
            run(f"DELETE FROM {table}", ())
        if target == "postgres":
            run(
                "VACUUM (ANALYZE) executions, outbox, spawns, processed, commit_ids, timers,"
                " trace, trace_index",
                (),
            )


def time_commit_typical(
    loops: int, target: str, env: Env, sizes: Sizes, with_id: bool = False, codec: Any = None
) -> float:
    """``bench_store.py``'s typical commit of ``exe-0``: 2 emits, a fresh processed id, a
    re-armed timer, a spawn with a 3-key context, a step into a full ring. With ``with_id``
    a fresh ``commit_id`` and ``epoch=1`` on every commit."""
    reset_commit_db(target, env)
    store = open_harel(target, env, commit_db(target), sizes)
    with store:
        exe = store.load("exe-0")
        commit = store.commit
        tag = uuid.uuid4().hex[:8]
        work = [(f"{e}-{tag}", r, f"c-{tag}-{i}") for i, (e, r) in enumerate(typical_work(loops))]
        settle()
        t0 = perf_counter()
        if with_id:
            for event_id, rearm, commit_id in work:
                commit(
                    exe, EMITS, processed_event_id=event_id, timers=rearm, spawns=SPAWNS,
                    trace=STEP, commit_id=commit_id, epoch=1,
                )  # fmt: skip
        else:
            for event_id, rearm, _ in work:
                commit(
                    exe, EMITS, processed_event_id=event_id, timers=rearm, spawns=SPAWNS, trace=STEP
                )
        elapsed = perf_counter() - t0
        if (
            not store.is_processed("exe-0", work[-1][0])
            or len(store.read_trace("exe-0")) != sizes.trace_max
        ):
            raise RuntimeError("commit_typical did not commit")
        return elapsed


BATCH = 100  # commits per commit_many in commit_typical_batch
TASKS = 32  # concurrent tasks in commit_typical_tasks_32


def time_commit_typical_batch(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    """``commit_typical``'s commit, one for each of ``exe-0`` to ``exe-99`` (two commits
    of one execution cannot share a batch; each steps into a full ring, as ``exe-0``'s
    does), written with one ``commit_many`` of ``BATCH`` per loop (inner_loops=``BATCH``:
    every batch is whole): time per commit. The commits are built before the clock
    starts, as ``commit_typical``'s arguments are."""
    reset_commit_db(target, env)
    size = min(BATCH, sizes.executions)
    store = open_harel(target, env, commit_db(target), sizes)
    with store:
        exes = [store.load(f"exe-{i}") for i in range(size)]
        if any(len(store.read_trace(e.id)) != sizes.trace_max for e in exes):
            raise RuntimeError("commit_typical_batch: the rings are not full")
        tag = uuid.uuid4().hex[:8]
        work = [(f"{e}-{tag}", r) for e, r in typical_work(loops * size)]
        batches = [
            [
                harel_store.Commit(exes[j], EMITS, event_id, rearm, SPAWNS, STEP)
                for j, (event_id, rearm) in enumerate(work[k : k + size])
            ]
            for k in range(0, loops * size, size)
        ]
        commit_many = store.commit_many
        settle()
        t0 = perf_counter()
        for batch in batches:
            outcomes = commit_many(batch)
        elapsed = perf_counter() - t0
        last = batches[-1][-1]
        if any(outcomes) or not store.is_processed(last.exe.id, last.processed_event_id):
            raise RuntimeError("commit_typical_batch did not commit")
        return elapsed


def open_async(target: str, env: Env, sizes: Sizes) -> Any:
    """The async twin of :func:`open_harel`'s store on the commit database (its default
    pool on PostgreSQL: the group commit writes through one connection at a time)."""
    if target == "postgres":
        from harel_store.postgres import AsyncPostgresStore

        assert env.pg_url is not None
        return AsyncPostgresStore(env.pg_url, schema=SCHEMA_COMMIT, trace_max=sizes.trace_max)
    from harel_store.sqlite import AsyncSqliteStore

    return AsyncSqliteStore(
        sqlite_path(env, commit_db(target)),
        synchronous=SYNCHRONOUS[target],
        trace_max=sizes.trace_max,
    )


async def _check_async(target: str, store: Any) -> None:
    import asyncio

    module = "harel_store.postgres" if target == "postgres" else "harel_store.sqlite"
    if type(store).__module__ != module or not type(store).__name__.startswith("Async"):
        raise RuntimeError(f"{target}: measuring {store!r}")
    if target == "postgres":
        conn = await store._pool.get()
        try:
            row = await (await conn.execute("SHOW fsync")).fetchone()
            sync = await (await conn.execute("SHOW synchronous_commit")).fetchone()
        finally:
            await store._pool.put(conn)
        if (row[0], sync[0]) != ("on", "on"):
            raise RuntimeError(f"{target} tasks: fsync={row[0]} synchronous_commit={sync[0]}")
    else:  # the sync store under it, on its own thread
        sync_store = store._opening.result()
        await asyncio.get_running_loop().run_in_executor(
            store._pool, check_sqlite_conn, sync_store._conn, SYNCHRONOUS[target], target
        )


def time_commit_typical_tasks(loops: int, target: str, env: Env, sizes: Sizes, tasks: int) -> float:
    """``tasks`` asyncio tasks commit ``commit_typical``'s commit, each to an execution
    of its own (``exe-0``, ``exe-1``, ...), through one async store, whose group commit
    lets the commits of tasks that wait meanwhile share a transaction: the time from the
    start to the last task's end, per commit over all of them."""
    import asyncio

    reset_commit_db(target, env)
    tasks = min(tasks, sizes.executions)

    async def run() -> float:
        store = open_async(target, env, sizes)
        async with store:
            await _check_async(target, store)
            exes = [await store.load(f"exe-{k}") for k in range(tasks)]
            tag = uuid.uuid4().hex[:8]
            work = [(f"{e}-{tag}", r) for e, r in typical_work(loops)]
            shares = [work[k::tasks] for k in range(tasks)]

            async def one(exe: Any, items: list[tuple[str, Any]]) -> None:
                for event_id, rearm in items:
                    await store.commit(
                        exe, EMITS, processed_event_id=event_id, timers=rearm, spawns=SPAWNS,
                        trace=STEP,
                    )  # fmt: skip

            settle()
            t0 = perf_counter()
            await asyncio.gather(*(one(exes[k], shares[k]) for k in range(tasks) if shares[k]))
            elapsed = perf_counter() - t0
            if not await store.is_processed("exe-0", shares[0][-1][0]):
                raise RuntimeError("commit_typical_tasks did not commit")
            return elapsed

    return asyncio.run(run())


class OrjsonCodec(JsonCodec):
    """The default codec's format written and read by orjson: the same tagging walk (so
    the same values are accepted, tuples tagged), orjson in place of the ``json`` module.
    What an orjson extra would ship; here only to measure whether it would be worth it."""

    __slots__ = ()

    def encode_execution(self, exe: Any) -> bytes:
        return orjson_dumps(_codec._tag_dict(exe_fields(exe), 0))

    def decode_execution(self, data: str | bytes) -> Execution:
        fields = self.decode_value(data)
        return Execution(**{name: fields[name] for name in _codec._FIELDS if name in fields})

    def encode_value(self, value: Any) -> bytes:
        return orjson_dumps(_codec._tag(value))

    def decode_value(self, data: str | bytes) -> Any:
        return _untag_all(orjson_loads(data))

    def canonical_value(self, value: Any) -> bytes:
        return orjson_dumps(_codec._tag(value), option=4)  # orjson.OPT_SORT_KEYS


def _untag_all(value: Any) -> Any:
    if type(value) is dict:
        return _codec._untag({k: _untag_all(v) for k, v in value.items()})
    if type(value) is list:
        return [_untag_all(v) for v in value]
    return value


def time_commit_typical_orjson(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    """``time_commit_typical`` with :class:`OrjsonCodec`: what an orjson extra would change."""
    codec = OrjsonCodec()
    if codec.decode_value(codec.encode_value(SPAWNS[0][1])) != SPAWNS[0][1]:
        raise RuntimeError("OrjsonCodec does not round-trip")
    return time_commit_typical(loops, target, env, sizes, codec=codec)


def time_commit_replayed(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    """Typical commits with ``commit_id`` and ``epoch=1``, committed outside the clock,
    then sent again (same id, same body): the clock times the replays, which write
    nothing."""
    reset_commit_db(target, env)
    store = open_harel(target, env, commit_db(target), sizes)
    with store:
        exe = store.load("exe-0")
        commit = store.commit
        tag = uuid.uuid4().hex[:8]
        work = [(f"{e}-{tag}", r, f"c-{tag}-{i}") for i, (e, r) in enumerate(typical_work(loops))]
        versions = []
        for event_id, rearm, commit_id in work:
            commit(
                exe, EMITS, processed_event_id=event_id, timers=rearm, spawns=SPAWNS,
                trace=STEP, commit_id=commit_id, epoch=1,
            )  # fmt: skip
            versions.append(exe.version)
        last = exe.version
        pending = store.stats()["outbox"]
        settle()
        t0 = perf_counter()
        for event_id, rearm, commit_id in work:
            commit(
                exe, EMITS, processed_event_id=event_id, timers=rearm, spawns=SPAWNS,
                trace=STEP, commit_id=commit_id, epoch=1,
            )  # fmt: skip
        elapsed = perf_counter() - t0
        if (
            exe.version != versions[-1]
            or store.load("exe-0").version != last
            or store.stats()["outbox"] != pending
        ):
            raise RuntimeError("commit_replayed wrote something")
        return elapsed


def time_trace_append_full(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    store = open_harel(target, env, commit_db(target), sizes)
    with store:
        append = store.append_trace
        settle()
        t0 = perf_counter()
        for _ in range(loops):
            append("exe-1", STEP)
        elapsed = perf_counter() - t0
        if len(store.read_trace("exe-1")) != sizes.trace_max:
            raise RuntimeError("trace_append_full: the ring is not full")
        return elapsed


def time_due_timers(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    store = open_harel(target, env, big_db(target, sizes.timers), sizes)
    with store:
        due_timers = store.due_timers
        if len(due_timers(NOW)) != sizes.due:
            raise RuntimeError("due_timers: wrong number of due timers")
        settle()
        t0 = perf_counter()
        for _ in range(loops):
            due_timers(NOW)
        return perf_counter() - t0


def unlease_timers(target: str) -> str:
    zero = "'-infinity'" if target == "postgres" else "0"
    return f"UPDATE timers SET lease_until = {zero} WHERE fire_at <= ?"


def time_claim_due_timers(loops: int, target: str, env: Env, sizes: Sizes, n: int) -> float:
    """``claim_due_timers(now, limit=100)`` over ``n`` armed timers of which 10 are due;
    their leases are ended outside the clock before the next claim."""
    store = open_harel(target, env, big_db(target, n), sizes)
    unlease = unlease_timers(target)
    with store, side_sql(target, env, big_db(target, n)) as run:
        claim = store.claim_due_timers
        run(unlease, (NOW,))
        settle()
        elapsed = 0.0
        for _ in range(loops):
            t0 = perf_counter()
            got = claim(NOW, CLAIM_LIMIT)
            elapsed += perf_counter() - t0
            if len(got) != sizes.due:
                raise RuntimeError(f"claim_due_timers: claimed {len(got)}, not {sizes.due}")
            run(unlease, (NOW,))
        return elapsed


def time_claim_outbox(loops: int, target: str, env: Env, sizes: Sizes, n: int) -> float:
    """``claim_outbox(limit=100)`` over an outbox of ``n`` entries; the leases are ended
    outside the clock before the next claim."""
    store = open_harel(target, env, big_db(target, n), sizes)
    zero = "'-infinity'" if target == "postgres" else "0"
    with store, side_sql(target, env, big_db(target, n)) as run:
        claim = store.claim_outbox
        settle()
        elapsed = 0.0
        for _ in range(loops):
            t0 = perf_counter()
            got = claim(CLAIM_LIMIT)
            elapsed += perf_counter() - t0
            if len(got) != CLAIM_LIMIT:
                raise RuntimeError(f"claim_outbox: claimed {len(got)}")
            run(
                f"UPDATE outbox SET lease_until = {zero} WHERE seq BETWEEN ? AND ?",
                (got[0].seq, got[-1].seq),
            )
        return elapsed


def time_claim_ack(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    """Per entry (inner_loops=100): ``claim_outbox(limit=100)`` then ``ack_outbox`` of each
    entry it returned, over an outbox of ``sizes.outbox`` entries; outside the clock a
    producer's commit puts 100 new entries back, so the outbox stays that size."""
    db = big_db(target, sizes.outbox, "ack")
    store = open_harel(target, env, db, sizes)
    with store:
        if store.stats()["outbox"] != sizes.outbox:
            raise RuntimeError("claim_ack: the outbox is not full")
        producer = Execution(id=f"producer-{uuid.uuid4().hex[:8]}")
        refill = [(f"exe-{i}", {"type": "ping", "n": 1}) for i in range(CLAIM_LIMIT)]
        claim, ack = store.claim_outbox, store.ack_outbox
        settle()
        elapsed = 0.0
        for _ in range(loops):
            t0 = perf_counter()
            batch = claim(CLAIM_LIMIT)
            for entry in batch:
                ack(entry.seq)
            elapsed += perf_counter() - t0
            if len(batch) != CLAIM_LIMIT:
                raise RuntimeError(f"claim_ack: claimed {len(batch)}")
            store.commit(producer, refill)
        return elapsed


def _waker(target: str, env: Env, sizes: Sizes, go: Any, done: Any) -> None:
    """Another process: on each "go", wait 2 to 22 ms (the waiter is then inside its
    wait; a pause drawn at random, seeded, so that the wake-ups fall anywhere between two
    looks of SQLite's polling, not always at the same point), note the time, and commit
    one outbox entry."""
    import random

    pauses = random.Random(14)
    store = open_harel(target, env, commit_db(target), sizes)
    exe = store.load("waker") or Execution(id="waker")
    with store:
        while go.recv():
            time.sleep(pauses.uniform(0.002, 0.022))
            t0 = perf_counter()
            store.commit(exe, [("exe-1", {"type": "wake"})])
            done.send(t0)


def time_wait_for_work(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    """Wake-up latency: another process commits an outbox entry while this one waits in
    ``wait_for_work``; the time from that commit's start (``perf_counter``, one clock for
    every process on Linux) to the wait's return."""
    context = multiprocessing.get_context("fork")
    go_r, go_w = context.Pipe(duplex=False)
    done_r, done_w = context.Pipe(duplex=False)
    proc = context.Process(target=_waker, args=(target, env, sizes, go_r, done_w), daemon=True)
    proc.start()  # forked before this process opens a connection: it shares none
    store = open_harel(target, env, commit_db(target), sizes)
    with store:
        try:
            store.wait_for_work(0.01)  # start listening; forget what came before
            while store.wait_for_work(0.0):
                pass
            total = 0.0
            for _ in range(loops):
                go_w.send(True)
                if not store.wait_for_work(10.0):
                    raise RuntimeError("wait_for_work: no wake-up")
                woke = perf_counter()
                total += woke - done_r.recv()
            return total
        finally:
            go_w.send(False)
            proc.join(10)


def _writer(
    target: str, env: Env, sizes: Sizes, eid: str, n: int, ready: Any, start: Any, out: Any
) -> None:
    store = open_harel(target, env, commit_db(target), sizes)
    with store:
        exe = store.load(eid)
        tag = uuid.uuid4().hex[:8]
        work = [(f"{e}-{tag}", r) for e, r in typical_work(n)]
        ready.send(True)
        start.recv()
        t0 = perf_counter()
        for event_id, rearm in work:
            store.commit(
                exe, EMITS, processed_event_id=event_id, timers=rearm, spawns=SPAWNS, trace=STEP
            )
        out.send((t0, perf_counter()))


def time_commit_typical_writers(
    loops: int, target: str, env: Env, sizes: Sizes, writers: int
) -> float:
    """``writers`` processes, each with its own store, commit typical commits of their own
    execution (``exe-1``, ``exe-2``, ...) at once; the time from the first start to the
    last end, for ``loops`` commits in all: time per commit over all of them."""
    reset_commit_db(target, env)
    context = multiprocessing.get_context("fork")
    share = [loops // writers + (1 if k < loops % writers else 0) for k in range(writers)]
    procs, readies, starts, outs = [], [], [], []
    for k in range(writers):
        ready_r, ready_w = context.Pipe(duplex=False)
        start_r, start_w = context.Pipe(duplex=False)
        out_r, out_w = context.Pipe(duplex=False)
        args = (target, env, sizes, f"exe-{k + 1}", max(share[k], 1), ready_w, start_r, out_w)
        proc = context.Process(target=_writer, args=args, daemon=True)
        proc.start()
        procs.append(proc)
        readies.append(ready_r)
        starts.append(start_w)
        outs.append(out_r)
    for ready in readies:
        ready.recv()
    for start in starts:
        start.send(True)
    spans = [out.recv() for out in outs]
    for proc in procs:
        proc.join(30)
    return max(end for _, end in spans) - min(begin for begin, _ in spans)


def demo_url(target: str, env: Env) -> tuple[str, Callable[[], None]]:
    """A fresh empty database for one demo run, and how to drop it."""
    name = f"demo_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    if target == "postgres":
        from urllib.parse import urlsplit, urlunsplit

        import psycopg

        with psycopg.connect(env.pg_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        parts = urlsplit(env.pg_url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise SystemExit("bench_durable: the demo needs a postgresql:// URL")
        url = urlunsplit(parts._replace(path=f"/{name}"))

        def drop() -> None:
            with psycopg.connect(env.pg_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        return url, drop
    path = env.data / f"{name}.db"

    def remove() -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")

    return f"sqlite:///{path}", remove


def time_demo(
    loops: int, target: str, env: Env, sizes: Sizes, workers: int, batch: bool = True
) -> float:
    """The demo's workload (``python -m harel_store --store URL --workers N``, with
    ``--no-batch`` unless ``batch``) at ``sizes.demo`` orders on a fresh database: its own
    ``elapsed`` (the workflow, not the checks after it), per execution of the workflow:
    the orders, their children and the two services, whose shards (a batched run splits
    each in several executions) count as one (inner_loops is set from a first run's
    count by the main process)."""
    from harel_store._demo.durable import Coordinator
    from harel_store._demo.workers import run_workers

    total = 0.0
    for _ in range(loops):
        url, drop = demo_url(target, env)
        try:
            store = harel_store.open_store(url)
            if target == "postgres":
                check_pg_store(store)
            else:
                check_sqlite_conn(store._conn, "NORMAL", f"{target} demo")
            with store:
                coord = Coordinator(store, url, batch=batch)
                coord.open(sizes.demo, 1, False)
                result = run_workers(url, coord, workers, batch=batch)
            if result["problems"]:
                raise RuntimeError(f"demo: {result['problems'][:3]}")
            executions = result["executions"] - 2 * (result["shards"] - 1)
            total += result["elapsed"] / executions
        finally:
            drop()
    return total


def check_pg_store(store: Any) -> None:
    from harel_store.postgres import PostgresStore

    if type(store) is not PostgresStore:
        raise RuntimeError(f"postgres demo: measuring {store!r}")
    conn = store._pool.get()
    try:
        check_pg_conn(conn, "postgres demo")
    finally:
        store._pool.put(conn)


# --- floors: the same writes by hand --------------------------------------------------------


class Floor:
    """The fewest ``sqlite3``/psycopg calls that do a case's writes in one transaction,
    encoding with ``json`` as they go, on the store's own tables."""

    def __init__(self, target: str, env: Env, sizes: Sizes) -> None:
        self.target = target
        self.keep = sizes.trace_max
        db = commit_db(target)
        if target == "postgres":
            import psycopg

            self.conn = psycopg.connect(env.pg_url, autocommit=True, prepare_threshold=0)
            self.conn.execute(f'SET search_path TO "{db}"')
            check_pg_conn(self.conn, f"{target} floor")
        else:
            import sqlite3

            self.conn = sqlite3.connect(sqlite_path(env, db), isolation_level=None)
            self.conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[target]}")
            check_sqlite_conn(self.conn, SYNCHRONOUS[target], f"{target} floor")

    def close(self) -> None:
        self.conn.close()

    def version(self, eid: str) -> int:
        sql = "SELECT version FROM executions WHERE id = " + (
            "%s" if self.target == "postgres" else "?"
        )
        return int(self.conn.execute(sql, (eid,)).fetchone()[0])

    # SQLite

    def lite_load(self, eid: str) -> Execution:
        row = self.conn.execute(
            "SELECT version, body FROM executions WHERE id = ?", (eid,)
        ).fetchone()
        fields = json.loads(row[1])
        exe = Execution(**fields)
        exe.version = row[0]
        return exe

    def lite_save(self, exe: Execution) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        cur = conn.execute(
            "UPDATE executions SET version = ?, body = ? WHERE id = ? AND version = ?",
            (exe.version + 1, dumps(exe_fields(exe)), exe.id, exe.version),
        )
        if cur.rowcount != 1:
            conn.execute("ROLLBACK")
            raise RuntimeError("floor: conflict")
        conn.execute("COMMIT")
        exe.version += 1

    def lite_commit(self, exe: Execution, event_id: str, rearm: list[TimerOp]) -> None:
        conn = self.conn
        eid = exe.id
        conn.execute("BEGIN IMMEDIATE")
        cur = conn.execute(
            "UPDATE executions SET version = ?, body = ? WHERE id = ? AND version = ?",
            (exe.version + 1, dumps(exe_fields(exe)), eid, exe.version),
        )
        if cur.rowcount != 1:
            conn.execute("ROLLBACK")
            raise RuntimeError("floor: conflict")
        conn.executemany(
            "INSERT INTO outbox (target_id, event) VALUES (?, ?)",
            [(target, dumps(event)) for target, event in EMITS],
        )
        conn.execute(
            "INSERT OR IGNORE INTO processed (execution_id, event_id) VALUES (?, ?)",
            (eid, event_id),
        )
        _, path, fire_at = rearm[0]
        conn.execute("UPDATE work SET n = n + 1")  # the wake-up, and the timer's seq
        conn.execute(
            "INSERT INTO timers (execution_id, path, fire_at, seq)"
            " VALUES (?, ?, ?, (SELECT n FROM work)) ON CONFLICT (execution_id, path)"
            " DO UPDATE SET fire_at = excluded.fire_at, seq = excluded.seq, lease_until = 0",
            (eid, path, fire_at),
        )
        child, root, context = SPAWNS[0]
        conn.execute(
            "INSERT INTO spawns (parent_id, child_id, root_path, context) VALUES (?, ?, ?, ?)",
            (eid, child, dumps(root), dumps(context)),
        )
        conn.execute(
            "INSERT INTO trace (execution_id, idx, step)"
            " SELECT ?, max(idx) + 1, ? FROM trace WHERE execution_id = ?",
            (eid, dumps(STEP), eid),
        )  # the ring is full: one step in after its last, the oldest out
        conn.execute(
            "DELETE FROM trace WHERE execution_id = ?"
            " AND idx = (SELECT min(idx) FROM trace WHERE execution_id = ?)",
            (eid, eid),
        )
        conn.execute("COMMIT")
        exe.version += 1

    # PostgreSQL: one statement per operation, so one round trip and one transaction.

    def pg_load(self, eid: str) -> Execution:
        row = self.conn.execute(
            "SELECT version, body FROM executions WHERE id = %s", (eid,)
        ).fetchone()
        fields = json.loads(bytes(row[1])[1:])
        exe = Execution(**fields)
        exe.version = row[0]
        return exe

    _PG_CAS = "UPDATE executions SET version = %s, body = %s WHERE id = %s AND version = %s"

    def pg_save(self, exe: Execution) -> None:
        body = b"t" + dumps(exe_fields(exe)).encode()
        if (
            self.conn.execute(self._PG_CAS, (exe.version + 1, body, exe.id, exe.version)).rowcount
            != 1
        ):
            raise RuntimeError("floor: conflict")
        exe.version += 1

    # The typical commit as one statement (the fewest calls: one round trip, one
    # transaction): every write but the CAS happens only if the CAS updated its row.
    _PG_COMMIT = """
WITH u AS (
    UPDATE executions SET version = %(new)s, body = %(body)s WHERE id = %(id)s AND version = %(old)s
    RETURNING 1
), e AS (
    INSERT INTO outbox (target_id, event)
    SELECT t, e FROM unnest(%(targets)s::text[], %(events)s::bytea[]) AS x (t, e)
    WHERE EXISTS (SELECT FROM u)
), m AS (
    INSERT INTO processed (execution_id, event_id) SELECT %(id)s, %(pev)s
    WHERE EXISTS (SELECT FROM u) ON CONFLICT DO NOTHING
), t AS (
    INSERT INTO timers (execution_id, path, fire_at) SELECT %(id)s, %(path)s, %(at)s
    WHERE EXISTS (SELECT FROM u)
    ON CONFLICT (execution_id, path) DO UPDATE
    SET fire_at = excluded.fire_at, seq = excluded.seq, lease_until = '-infinity'
), s AS (
    INSERT INTO spawns (parent_id, child_id, root_path, context)
    SELECT %(id)s, %(child)s, %(root)s, %(context)s WHERE EXISTS (SELECT FROM u)
), r AS (
    UPDATE trace_index SET next_index = next_index + 1
    WHERE execution_id = %(id)s AND EXISTS (SELECT FROM u) RETURNING next_index
), st AS (
    INSERT INTO trace (execution_id, idx, step) SELECT %(id)s, next_index - 1, %(step)s FROM r
), tr AS (
    DELETE FROM trace USING r WHERE trace.execution_id = %(id)s AND idx < r.next_index - %(keep)s
), w AS (
    SELECT pg_notify(%(channel)s, '') WHERE EXISTS (SELECT FROM u)
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM w)"""

    def pg_commit(self, exe: Execution, event_id: str, rearm: list[TimerOp]) -> None:
        _, path, fire_at = rearm[0]
        child, root, context = SPAWNS[0]
        params = {
            "id": exe.id,
            "old": exe.version,
            "new": exe.version + 1,
            "body": b"t" + dumps(exe_fields(exe)).encode(),
            "targets": [target for target, _ in EMITS],
            "events": [b"t" + dumps(event).encode() for _, event in EMITS],
            "pev": event_id,
            "path": path,
            "at": fire_at,
            "child": child,
            "root": b"t" + dumps(root).encode(),
            "context": b"t" + dumps(context).encode(),
            "step": b"t" + dumps(STEP).encode(),
            "keep": self.keep,
            "channel": f"harel_store.{SCHEMA_COMMIT}",
        }
        if self.conn.execute(self._PG_COMMIT, params).fetchone()[0] != 1:
            raise RuntimeError("floor: conflict")  # nothing was written
        exe.version += 1


def time_floor_load(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    floor = Floor(target, env, sizes)
    try:
        load = floor.pg_load if target == "postgres" else floor.lite_load
        key = f"exe-{sizes.executions // 2}"
        if load(key).id != key:
            raise RuntimeError("floor load misses")
        settle()
        t0 = perf_counter()
        for _ in range(loops):
            load(key)
        return perf_counter() - t0
    finally:
        floor.close()


def time_floor_save(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    floor = Floor(target, env, sizes)
    try:
        load = floor.pg_load if target == "postgres" else floor.lite_load
        save = floor.pg_save if target == "postgres" else floor.lite_save
        exe = load("exe-3")
        settle()
        t0 = perf_counter()
        for _ in range(loops):
            save(exe)
        elapsed = perf_counter() - t0
        if floor.version("exe-3") != exe.version:
            raise RuntimeError("floor save did not save")
        return elapsed
    finally:
        floor.close()


def time_floor_commit_typical(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    reset_commit_db(target, env)
    floor = Floor(target, env, sizes)
    try:
        load = floor.pg_load if target == "postgres" else floor.lite_load
        commit = floor.pg_commit if target == "postgres" else floor.lite_commit
        exe = load("exe-0")
        tag = uuid.uuid4().hex[:8]
        work = [(f"{e}-{tag}", r) for e, r in typical_work(loops)]
        settle()
        t0 = perf_counter()
        for event_id, rearm in work:
            commit(exe, event_id, rearm)
        elapsed = perf_counter() - t0
        if floor.version("exe-0") != exe.version:
            raise RuntimeError("floor commit did not commit")
        return elapsed
    finally:
        floor.close()


def time_fsync(loops: int, env: Env) -> float:
    """The disk's floor: a 4 KiB write and ``fdatasync`` per loop, appended to a file in
    the directory of the SQLite databases (the PostgreSQL data directory of a cluster the
    run starts is on the file system of the temporary directory too). Measured once at
    the start (``machine:disk:fsync``) and again just before the commits of
    ``sqlite-full`` and ``postgres`` (``<target>:disk:fsync``): a shared disk's speed
    drifts, and a commit rate is compared with the fsync rate of its own moment."""
    sync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
    fd, path = tempfile.mkstemp(dir=env.data, prefix="fsync-")
    block = b"x" * 4096
    try:
        settle()
        t0 = perf_counter()
        for _ in range(loops):
            os.write(fd, block)
            sync(fd)
        return perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)


# --- peers ----------------------------------------------------------------------------------


def time_eventsourcing(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    """eventsourcing's process recorder: ``insert_events`` of one aggregate with 6 new
    stored events (the rows a typical commit inserts or rewrites: the execution, 2 emits,
    the timer, the spawn, the trace step; each event's state the same JSON bytes) and a
    tracking record (the processed mark), in one transaction."""
    from eventsourcing.persistence import StoredEvent, Tracking

    enc = typical_encoded()
    states = [
        enc.exe,
        *enc.events,
        dumps([["schedule", "root/wait", LATER]]).encode(),
        enc.spawn[0] + enc.spawn[1],
        enc.step,
    ]
    if target == "postgres":
        import psycopg
        from eventsourcing.postgres import PostgresDatastore, PostgresProcessRecorder
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(env.pg_url)
        with psycopg.connect(env.pg_url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA IF NOT EXISTS bench_es")
        datastore = PostgresDatastore(
            parts.get("dbname", "postgres"), parts["host"], parts["port"], parts["user"], parts.get("password", ""),
            schema="bench_es", pool_size=1, max_overflow=0,
        )  # fmt: skip
        recorder = PostgresProcessRecorder(datastore)
        recorder.create_table()
        with datastore.get_connection() as conn:
            check_pg_conn(conn, "postgres eventsourcing")
    else:
        from eventsourcing.sqlite import (
            SQLiteConnectionPool,
            SQLiteDatastore,
            SQLiteProcessRecorder,
        )

        setting = SYNCHRONOUS[target]

        class Pool(SQLiteConnectionPool):
            def _create_connection(self) -> Any:
                conn = super()._create_connection()
                conn._sqlite_conn.execute(f"PRAGMA synchronous = {setting}")
                return conn

        datastore = SQLiteDatastore(sqlite_path(env, f"es-{target}"), pool_size=1, max_overflow=0)
        datastore.pool = Pool(db_name=datastore.pool.db_name, pool_size=1, max_overflow=0)
        recorder = SQLiteProcessRecorder(datastore)
        recorder.create_table()
        for is_writer in (True, False):
            conn = datastore.pool.get_connection(is_writer=is_writer)
            try:
                check_sqlite_conn(conn._sqlite_conn, setting, f"{target} eventsourcing")
            finally:
                datastore.pool.put_connection(conn)
    try:
        aggregate = uuid.uuid4()
        app = f"app-{uuid.uuid4().hex[:8]}"
        batches = [
            [
                StoredEvent(aggregate, i * 6 + k + 1, "harel.bench:Event", state)
                for k, state in enumerate(states)
            ]
            for i in range(loops)
        ]
        insert = recorder.insert_events
        settle()
        t0 = perf_counter()
        for i, events in enumerate(batches):
            insert(events, tracking=Tracking(app, i + 1))
        elapsed = perf_counter() - t0
        if recorder.max_tracking_id(app) != loops:
            raise RuntimeError("eventsourcing did not record")
        return elapsed
    finally:
        datastore.close()


def checkpoint_values() -> dict[str, Any]:
    """The channel values of a checkpoint the size of a typical commit: the execution's
    fields, the emits, the timer, the spawn, the trace step, the processed id."""
    return {
        "execution": exe_fields(typical_exe()),
        "emits": [[target, event] for target, event in EMITS],
        "timers": [["schedule", "root/wait", LATER]],
        "spawns": [[c, r, x] for c, r, x in SPAWNS],
        "trace": dict(STEP),
        "processed": "evt-0",
    }


def time_langgraph(loops: int, target: str, env: Env, sizes: Sizes) -> float:
    """LangGraph's checkpoint saver: ``put`` of a checkpoint whose channels hold what a
    typical commit writes, every channel at a new version (so the Postgres saver writes
    every blob), each checkpoint the child of the previous one in one thread."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    if target == "postgres":
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        conn = psycopg.connect(
            env.pg_url, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        saver: Any = PostgresSaver(conn)
        saver.setup()
        row = conn.execute(
            "SELECT current_setting('fsync') AS f, current_setting('synchronous_commit') AS s"
        ).fetchone()
        if (row["f"], row["s"]) != ("on", "on"):
            raise RuntimeError(f"postgres langgraph: {row}")
    else:
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(sqlite_path(env, f"lg-{target}"), check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[target]}")
        check_sqlite_conn(conn, SYNCHRONOUS[target], f"{target} langgraph")
    try:
        values = checkpoint_values()
        thread = f"thread-{uuid.uuid4().hex[:8]}"
        config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        work = []
        for i in range(loops):
            cp = empty_checkpoint()
            cp["id"] = str(uuid6(clock_seq=i))
            cp["channel_values"] = values
            versions = {k: i + 1 for k in values}
            cp["channel_versions"] = versions
            work.append((cp, {"source": "loop", "step": i}, versions))
        put = saver.put
        settle()
        t0 = perf_counter()
        for cp, metadata, versions in work:
            config = put(config, cp, metadata, versions)
        elapsed = perf_counter() - t0
        if saver.get_tuple(config) is None:
            raise RuntimeError("langgraph did not put")
        return elapsed
    finally:
        conn.close()


# --- the codec ------------------------------------------------------------------------------


def time_codec(loops: int, which: str, decode: bool = True) -> float:
    """Encode + decode of what a typical commit encodes (the execution, 2 events, the
    spawn's root path and context, the trace step) and of the execution a load decodes:
    ``json`` is the store's default codec (``harel_store._codec.JSON``), ``orjson``
    :class:`OrjsonCodec`, the same format through orjson."""
    exe = typical_exe()
    values = [event for _, event in EMITS] + [SPAWNS[0][1], SPAWNS[0][2], STEP]
    codec = _codec.JSON if which == "json" else OrjsonCodec()
    enc_exe, dec_exe = codec.encode_execution, codec.decode_execution
    enc, dec = codec.encode_value, codec.decode_value
    if dec_exe(enc_exe(exe)).id != exe.id:
        raise RuntimeError("codec does not round-trip")
    settle()
    t0 = perf_counter()
    if not decode:  # what a commit does: it encodes, and decodes nothing
        for _ in range(loops):
            enc_exe(exe)
            for value in values:
                enc(value)
        return perf_counter() - t0
    for _ in range(loops):
        dec_exe(enc_exe(exe))
        for value in values:
            dec(enc(value))
    return perf_counter() - t0


# --- the suite --------------------------------------------------------------------------------


class Case(NamedTuple):
    name: str  # target:impl:case
    func: Callable[..., float]
    args: tuple[Any, ...]
    inner_loops: int = 1
    per: str = "call"
    heavy: bool = False  # one value per process, few processes, no warmup


def cases(targets: tuple[str, ...], env: Env, sizes: Sizes, peers: bool) -> list[Case]:
    suite: list[Case] = [
        Case("machine:disk:fsync", time_fsync, (env,), per="write + fdatasync"),
        Case("machine:json:codec_typical", time_codec, ("json",), per="encode + decode"),
        Case("machine:json:codec_encode", time_codec, ("json", False), per="encode"),
    ]
    with contextlib.suppress(ImportError):
        import orjson  # noqa: F401

        suite.append(
            Case("machine:orjson:codec_typical", time_codec, ("orjson",), per="encode + decode")
        )
        suite.append(
            Case("machine:orjson:codec_encode", time_codec, ("orjson", False), per="encode")
        )
    big_t, big_o = _k(sizes.timers), _k(sizes.outbox)
    for target in targets:
        a = (target, env, sizes)
        h = f"{target}:harel:"
        suite += [
            Case(h + "load", time_load, a),
            Case(f"{target}:floor:load", time_floor_load, a),
            Case(h + "save", time_save, a),
            Case(f"{target}:floor:save", time_floor_save, a),
            *(
                [Case(f"{target}:disk:fsync", time_fsync, (env,), per="write + fdatasync")]
                if target != "sqlite-normal"
                else []
            ),
            Case(h + "commit_minimal", time_commit_minimal, a),
            Case(h + "commit_typical", time_commit_typical, a),
            Case(f"{target}:floor:commit_typical", time_floor_commit_typical, a),
            Case(
                h + "commit_typical_batch",
                time_commit_typical_batch,
                a,
                min(BATCH, sizes.executions),
                per=f"commit, in batches of {min(BATCH, sizes.executions)}",
            ),
            Case(h + "commit_typical_tasks_1", time_commit_typical_tasks, (*a, 1), per="commit"),
            Case(
                h + f"commit_typical_tasks_{TASKS}",
                time_commit_typical_tasks,
                (*a, TASKS),
                per=f"commit, {TASKS} tasks",
            ),
        ]
        if orjson_dumps is not None:
            suite.append(Case(f"{target}:orjson:commit_typical", time_commit_typical_orjson, a))
        if peers:
            suite += [
                Case(f"{target}:eventsourcing:commit_typical", time_eventsourcing, a),
                Case(f"{target}:langgraph:commit_typical", time_langgraph, a),
            ]
        suite += [
            Case(h + "commit_typical_id_epoch", time_commit_typical, (*a, True)),
            Case(h + "commit_replayed", time_commit_replayed, a),
            Case(h + "trace_append_full", time_trace_append_full, a),
            Case(h + f"due_timers_{big_t}", time_due_timers, a),
            Case(h + f"claim_due_timers_{big_t}", time_claim_due_timers, (*a, sizes.timers)),
            Case(h + f"claim_ack_{big_o}", time_claim_ack, a, CLAIM_LIMIT, "entry"),
            Case(h + "wait_for_work", time_wait_for_work, a, per="wake-up"),
        ]
        if target == "postgres":
            suite.append(
                Case(
                    h + "commit_typical_2_writers",
                    time_commit_typical_writers,
                    (*a, 2),
                    per="commit, 2 processes",
                )
            )
        if target != "sqlite-full":  # the demo opens its store by URL: SQLite's default, NORMAL
            for n in sizes.scale:
                suite.append(
                    Case(
                        h + f"scale_sweep_{_k(n)}",
                        time_claim_due_timers,
                        (*a, n),
                        per="claim of 10 due",
                    )
                )
                suite.append(
                    Case(h + f"scale_claim_{_k(n)}", time_claim_outbox, (*a, n), per="claim of 100")
                )
            for workers in (1, 2):
                name = h + f"demo_{workers}_worker{'s' if workers > 1 else ''}"
                suite.append(Case(name, time_demo, (*a, workers), per="execution", heavy=True))
            suite.append(
                Case(
                    h + "demo_2_workers_no_batch",
                    time_demo,
                    (*a, 2, False),
                    per="execution",
                    heavy=True,
                )
            )
    return suite


def add_cmdline_args(cmd: list[str], args: argparse.Namespace) -> None:
    cmd.extend(("--store", ",".join(args.store), "--data", args.data))
    if args.pg_url:
        cmd.extend(("--pg-url", args.pg_url))
    if args.quick:
        cmd.append("--quick")
    if args.no_peers:
        cmd.append("--no-peers")
    for pattern in args.bench or ():
        cmd.extend(("--bench", pattern))


def parse_stores(text: str) -> tuple[str, ...]:
    names = []
    for word in text.split(","):
        word = word.strip()
        for name in (
            TARGETS
            if word == "all"
            else ("sqlite-normal", "sqlite-full")
            if word == "sqlite"
            else (word,)
        ):
            if name not in TARGETS:
                raise argparse.ArgumentTypeError(
                    f"unknown store {name!r}: choose from {', '.join(TARGETS)}, sqlite, all"
                )
            if name not in names:
                names.append(name)
    return tuple(names)


@contextlib.contextmanager
def heavy(runner: pyperf.Runner) -> Iterator[None]:
    """One value of one loop in each of at most 2 processes, no warmup: for the cases
    whose single operation takes seconds (the demo)."""
    args = runner.args
    saved = args.processes, args.values, args.warmups, args.loops
    args.processes, args.values, args.warmups, args.loops = min(args.processes, 2), 1, 0, 1
    try:
        yield
    finally:
        args.processes, args.values, args.warmups, args.loops = saved


def main() -> None:
    runner = pyperf.Runner(add_cmdline_args=add_cmdline_args, processes=4, values=3, warmups=1)
    parser = runner.argparser
    parser.add_argument("--store", type=parse_stores, default=TARGETS,
                        help="comma-separated: sqlite-normal, sqlite-full, postgres; 'sqlite' is both "
                        "SQLite settings, 'all' (the default) everything")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="toy sizes for the smoke test")
    parser.add_argument("--no-peers", action="store_true", help="skip eventsourcing and LangGraph")
    parser.add_argument("--bench", action="append", metavar="PATTERN",
                        help="only the benchmarks whose name matches this fnmatch pattern; repeatable")  # fmt: skip
    parser.add_argument("--pg-url", help="a PostgreSQL server to use (default: HAREL_STORE_PG_URL, "
                        "else a throwaway cluster started for the run)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, metavar="N",
                        help="split the worker processes of every case over N passes of the whole "
                        "suite, appended to one JSON file, so that a store, its floor and its peers "
                        "sample the same stretches of the run (default: 3; never more rounds than "
                        "processes); the databases are built once, before the first")  # fmt: skip
    parser.add_argument("--data", default="", help=argparse.SUPPRESS)
    args = runner.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    sizes = QUICK if args.quick else FULL
    server = None
    cleanup = None
    if not args.worker:
        if not args.data:
            args.data = tempfile.mkdtemp(prefix="harel-bench-durable-")
            os.chmod(args.data, 0o755)
            cleanup = args.data
        if "postgres" in args.store and not args.pg_url:
            args.pg_url = os.environ.get("HAREL_STORE_PG_URL")
            if not args.pg_url:
                import _pg

                server = _pg.acquire()
                args.pg_url = server.url
    env = Env(Path(args.data), args.pg_url)
    runner.metadata["harel_suite"] = "durable"
    runner.metadata["harel_sizes"] = "quick" if args.quick else "full"
    runner.metadata["harel_version"] = harel_store.__version__
    import sqlite3

    runner.metadata["harel_sqlite_version"] = sqlite3.sqlite_version
    if not args.no_peers:
        from importlib.metadata import version

        for peer in (
            "eventsourcing",
            "langgraph-checkpoint-sqlite",
            "langgraph-checkpoint-postgres",
        ):
            runner.metadata[f"harel_peer_{peer}"] = version(peer)
    typical = typical_encoded()
    runner.metadata["harel_typical_bytes"] = typical.size
    try:
        if cleanup:  # the process that made the data directory builds the databases in it
            build_all(args.store, env, sizes, lambda line: print(line, flush=True))
        if not args.worker and len(round_shares(args.processes, args.rounds)) > 1:
            given = ["--data", args.data, *(["--pg-url", args.pg_url] if args.pg_url else [])]
            sys.exit(
                run_rounds(__file__, args, sys.argv[1:], lambda _: given, ("--data", "--pg-url"))
            )
        if env.pg_url and "postgres" in args.store:
            import psycopg

            with psycopg.connect(env.pg_url) as conn:
                runner.metadata["harel_pg_version"] = conn.execute(
                    "SHOW server_version"
                ).fetchone()[0]
        for case in cases(args.store, env, sizes, not args.no_peers):
            if args.bench and not any(fnmatchcase(case.name, p) for p in args.bench):
                continue
            target, impl, name = case.name.split(":")
            metadata = {
                "harel_target": target,
                "harel_impl": impl,
                "harel_case": name,
                "harel_per": case.per,
            }
            with heavy(runner) if case.heavy else contextlib.nullcontext():
                runner.bench_time_func(
                    case.name,
                    case.func,
                    *case.args,
                    inner_loops=case.inner_loops,
                    metadata=metadata,
                )
    finally:
        if server is not None:
            server.destroy()
        if cleanup:
            shutil.rmtree(cleanup, ignore_errors=True)


if __name__ == "__main__":
    gc.enable()
    main()
