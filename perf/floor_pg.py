"""The single-commit floor on PostgreSQL (issue 27 item 7): ``PostgresStore.commit`` of
:mod:`floor`'s typical commit beside a hand-written implementation of the same writes on
a lean schema, in one run, on one server: the one ``HAREL_STORE_PG_URL`` names, else a
throwaway cluster started as the tests start theirs (``tests/_pg.py``: PostgreSQL's
default fsync settings, checked on both connections). Prints the medians, the ratio
store/floor and the round trips each side takes per commit.

The typical commit: the CAS of the execution (``epoch=1``), one outbox entry, a fresh
processed mark, one timer re-armed, one trace step into a full ring (with its trim), a
``commit_id`` recorded with the SHA-256 of the body, and the wake-up of ``wait_for_work``
(``pg_notify``).

    python perf/floor_pg.py [--loops 1000] [--repeat 7] [--pg-url URL]

The floor is one prepared statement in its own (implicit) transaction, as the store's
commit is: the CAS first, every other write conditional on it. A replay (the commit id's
primary key violated: the statement fails whole, nothing written) and a conflict (no row
updated) would each be told apart by a second look, off the path measured here.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import uuid
from pathlib import Path
from time import perf_counter, process_time
from typing import Any

from floor import EVENT, LATER, STEP, TRACE_MAX, dumps

from harel_store import Execution, TimerOp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

STORE_SCHEMA, FLOOR_SCHEMA = "floor_store", "floor_lean"
CPU: dict[str, list[float]] = {"store": [], "floor": []}  # this process's time per commit

# The leanest schema I could write for the same promises: outbox seqs never reused (an
# identity), one timer per (execution, path) found by fire_at, a ring per execution whose
# step numbers are the commits' versions (so no ring counter), replays recognised by
# (execution, commit_id) and compared by digest; the times outbox entries were committed
# and marks and commit ids recorded (what overview's ages and prune read, PRODUCTION.md
# 8-9), unindexed.
PG_LEAN = (
    (
        "CREATE TABLE {s}.executions (id text PRIMARY KEY, version bigint NOT NULL, epoch bigint,"
        " body bytea NOT NULL)"
    ),
    (
        "CREATE TABLE {s}.outbox (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " target_id text, event bytea NOT NULL, lease_until timestamptz NOT NULL DEFAULT '-infinity',"
        " committed_at timestamptz NOT NULL DEFAULT now())"
    ),
    (
        "CREATE TABLE {s}.processed (execution_id text NOT NULL, event_id text NOT NULL,"
        " recorded_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (execution_id, event_id))"
    ),
    (
        "CREATE TABLE {s}.timers (execution_id text NOT NULL, path text NOT NULL,"
        " fire_at float8 NOT NULL, lease_until timestamptz NOT NULL DEFAULT '-infinity',"
        " PRIMARY KEY (execution_id, path))"
    ),
    "CREATE INDEX ON {s}.timers (fire_at)",
    (
        "CREATE TABLE {s}.trace (execution_id text NOT NULL, n bigint NOT NULL, step bytea NOT NULL,"
        " PRIMARY KEY (execution_id, n))"
    ),
    (
        "CREATE TABLE {s}.commit_ids (execution_id text NOT NULL, commit_id text NOT NULL,"
        " digest bytea NOT NULL, version bigint NOT NULL,"
        " recorded_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (execution_id, commit_id))"
    ),
)

PG_COMMIT = """
WITH upd AS (
    UPDATE {s}.executions SET version = %(new)s, body = %(body)s, epoch = %(epoch)s
    WHERE id = %(id)s AND version = %(old)s AND (epoch IS NULL OR epoch <= %(epoch)s)
    RETURNING 1
), rec AS (
    INSERT INTO {s}.commit_ids (execution_id, commit_id, digest, version)
    SELECT %(id)s, %(cid)s, %(digest)s, %(new)s FROM upd
), emit AS (
    INSERT INTO {s}.outbox (target_id, event) SELECT %(target)s, %(event)s FROM upd
), mark AS (
    INSERT INTO {s}.processed (execution_id, event_id) SELECT %(id)s, %(mark)s FROM upd
    ON CONFLICT DO NOTHING
), arm AS (
    INSERT INTO {s}.timers (execution_id, path, fire_at) SELECT %(id)s, 'root/wait', %(at)s FROM upd
    ON CONFLICT (execution_id, path)
    DO UPDATE SET fire_at = excluded.fire_at, lease_until = '-infinity'
), step AS (
    INSERT INTO {s}.trace (execution_id, n, step) SELECT %(id)s, %(new)s, %(step)s FROM upd
), trim AS (
    DELETE FROM {s}.trace WHERE execution_id = %(id)s AND n <= %(new)s - %(keep)s
        AND EXISTS (SELECT FROM upd)
)
SELECT count(pg_notify(%(channel)s, '')) FROM upd"""


class PgFloor:
    """The same writes by hand: one statement per commit."""

    def __init__(self, url: str, schema: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True, prepare_threshold=0)
        check_pg(self.conn, "floor")
        s = f'"{schema}"'
        self.conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
        self.conn.execute(f"CREATE SCHEMA {s}")
        for sql in PG_LEAN:
            self.conn.execute(sql.format(s=s))
        self.sql = PG_COMMIT.format(s=s)
        self.schema = s

    def commit(
        self, exe: Execution, target: str, event: Any, mark: str, fire_at: float,
        step: Any, commit_id: str, epoch: int,
    ) -> None:  # fmt: skip
        eid, version = exe.id, exe.version
        blob = dumps({"id": eid, "definition_id": exe.definition_id, "context": exe.context})
        digest = hashlib.sha256(
            dumps([[target, event], mark, [["schedule", "root/wait", fire_at]], [], step])
        ).digest()
        params = {
            "id": eid, "old": version, "new": version + 1, "epoch": epoch, "body": blob,
            "cid": commit_id, "digest": digest, "target": target, "event": dumps(event),
            "mark": mark, "at": fire_at, "step": dumps(step), "keep": TRACE_MAX,
            "channel": "floor_lean",
        }  # fmt: skip
        if self.conn.execute(self.sql, params).fetchone()[0] != 1:
            raise RuntimeError("floor: conflict")
        exe.version = version + 1

    def populate(self, exe: Execution) -> None:
        self.conn.execute(
            f"INSERT INTO {self.schema}.executions VALUES (%s, 0, NULL, %s)",
            (exe.id, dumps({"id": exe.id})),
        )
        self.conn.execute(
            f"INSERT INTO {self.schema}.timers (execution_id, path, fire_at) VALUES (%s, %s, %s)",
            (exe.id, "root/wait", LATER),
        )
        for i in range(TRACE_MAX):
            self.commit(exe, "exe-1", EVENT, f"pre-{i}", LATER + i, STEP, f"pre-{i}", 1)


def check_pg(conn: Any, who: str) -> None:
    settings = [
        conn.execute(f"SHOW {name}").fetchone()[0] for name in ("fsync", "synchronous_commit")
    ]
    if settings != ["on", "on"]:
        raise RuntimeError(f"{who}: fsync/synchronous_commit {settings}, not the defaults")


def pg_store_for(url: str) -> tuple[Any, Execution]:
    import psycopg

    from harel_store.postgres import PostgresStore

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{STORE_SCHEMA}" CASCADE')
    store = PostgresStore(url, schema=STORE_SCHEMA, trace_max=TRACE_MAX, pool_size=1)
    conn = store._pool.get()
    try:
        check_pg(conn, "store")
    finally:
        store._pool.put(conn)
    exe = Execution(id="exe-0", definition_id="order")
    store.commit(exe, (), timers=[TimerOp("schedule", "root/wait", LATER)])
    for _ in range(TRACE_MAX):
        store.commit(exe, (), trace=STEP)
    return store, exe


def time_pg_store(store: Any, exe: Execution, loops: int) -> float:
    tag = uuid.uuid4().hex[:8]
    work = [
        (f"e-{tag}-{i}", [TimerOp("schedule", "root/wait", LATER + i)], f"c-{tag}-{i}")
        for i in range(loops)
    ]
    emits = [("exe-1", EVENT)]
    commit = store.commit
    c0, t0 = process_time(), perf_counter()
    for mark, rearm, cid in work:
        commit(exe, emits, mark, rearm, (), STEP, commit_id=cid, epoch=1)
    CPU["store"].append((process_time() - c0) / loops)
    return (perf_counter() - t0) / loops


def time_pg_floor(floor: PgFloor, exe: Execution, loops: int) -> float:
    tag = uuid.uuid4().hex[:8]
    work = [(f"e-{tag}-{i}", LATER + i, f"c-{tag}-{i}") for i in range(loops)]
    commit = floor.commit
    c0, t0 = process_time(), perf_counter()
    for mark, fire_at, cid in work:
        commit(exe, "exe-1", EVENT, mark, fire_at, STEP, cid, 1)
    CPU["floor"].append((process_time() - c0) / loops)
    return (perf_counter() - t0) / loops


def round_trips(conn: Any, run: Any) -> int:
    """The statements ``run`` sends on ``conn``, through ``conn.execute`` or the store's
    own cursor of the connection (each one round trip: none is pipelined)."""
    sent = [0]

    class Counted:
        def __init__(self, execute: Any) -> None:
            self.real = execute

        def execute(self, *args: Any, **kwargs: Any) -> Any:
            sent[0] += 1
            return self.real(*args, **kwargs)

    cursor = getattr(conn, "harel_store_cursor", None)
    conn.execute = Counted(conn.execute).execute
    if cursor is not None:
        conn.harel_store_cursor = Counted(cursor.execute)
    try:
        run()
    finally:
        del conn.execute
        if cursor is not None:
            conn.harel_store_cursor = cursor
    return sent[0]


def server_times(url: str, before: dict[str, tuple[float, int]] | None) -> Any:
    """Per schema, the total execution time (ms) and calls of the statements that write
    its executions (each side's commit), from ``pg_stat_statements`` (``None`` without
    it); given ``before``, the mean time per call since then."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            rows = conn.execute(
                "SELECT query, total_exec_time, calls FROM pg_stat_statements"
                " WHERE query LIKE '%UPDATE %executions%SET version%'"
            ).fetchall()
        except psycopg.Error:
            return None
    now = {s: (0.0, 0) for s in (STORE_SCHEMA, FLOOR_SCHEMA)}
    for query, total, calls in rows:
        for s, (t, n) in list(now.items()):
            if f'"{s}".executions' in query or f"{s}.executions" in query:
                now[s] = (t + total, n + calls)
    if before is None:
        return now
    return {s: (now[s][0] - before[s][0]) / max(1, now[s][1] - before[s][1]) for s in now}


def vacuum(url: str) -> None:
    """Between repeats, outside the clocks: the dead rows both sides left behind."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for s in (STORE_SCHEMA, FLOOR_SCHEMA):
            for table in ("executions", "outbox", "processed", "timers", "trace", "commit_ids"):
                conn.execute(f'VACUUM "{s}".{table}')


def pg_floor(url: str | None, loops: int, repeat: int) -> None:
    """The PostgreSQL part: the store's typical commit and the floor's, interleaved."""
    server = None
    if not url:
        url = os.environ.get("HAREL_STORE_PG_URL")
    if not url:
        import _pg

        server = _pg.acquire()
        url = server.url
    try:
        store, exe = pg_store_for(url)
        floor = PgFloor(url, FLOOR_SCHEMA)
        fexe = Execution(id="exe-0", definition_id="order")
        floor.populate(fexe)
        time_pg_store(store, exe, 200)  # warm both (and prepare their statements)
        time_pg_floor(floor, fexe, 200)
        ours: list[float] = []
        theirs: list[float] = []
        CPU["store"].clear()
        CPU["floor"].clear()
        tracked = server_times(url, None)
        for _ in range(repeat):  # interleaved: both see the same machine
            vacuum(url)
            ours.append(time_pg_store(store, exe, loops))
            theirs.append(time_pg_floor(floor, fexe, loops))
        s, f = statistics.median(ours), statistics.median(theirs)
        conn = store._pool.get()  # the pool's one connection, which the commit takes
        store._pool.put(conn)
        n_store = round_trips(conn, lambda: time_pg_store(store, exe, 1))
        n_floor = round_trips(floor.conn, lambda: time_pg_floor(floor, fexe, 1))
        print(
            f"postgres  store {s * 1e6:7.1f} us ({n_store} round trip{'s' * (n_store != 1)})"
            f"  floor {f * 1e6:7.1f} us ({n_floor} round trip{'s' * (n_floor != 1)})"
            f"  store/floor {s / f:.2f}x"
        )
        print(
            "  store/floor of each repeat:", " ".join(f"{a / b:.2f}" for a, b in zip(ours, theirs))
        )
        cpu = {side: statistics.median(times[:repeat]) * 1e6 for side, times in CPU.items()}
        print(
            f"  client CPU per commit (median): store {cpu['store']:.1f} us,"
            f" floor {cpu['floor']:.1f} us"
        )
        if tracked is not None:
            times = server_times(url, tracked)
            print(
                "  on the server (pg_stat_statements, mean execution of the commit statement):"
                f" store {times[STORE_SCHEMA] * 1e3:.1f} us, floor {times[FLOOR_SCHEMA] * 1e3:.1f} us"
            )
        store.close()
        floor.conn.close()
    finally:
        if server is not None:
            server.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--pg-url", help="a server to use (default: HAREL_STORE_PG_URL, else a throwaway cluster)"
    )
    args = parser.parse_args()
    pg_floor(args.pg_url, args.loops, args.repeat)


if __name__ == "__main__":
    main()
