"""The single-commit floor on SQLite (issue 27 item 7): ``SqliteStore.commit`` of a typical
commit beside a hand-written implementation of the same writes on a lean schema, in one
run, on tmp files, with ``synchronous`` NORMAL and FULL. Prints the medians and the ratio
store/floor, and the statements each side runs per commit.

The typical commit: the CAS of the execution (``epoch=1``), one outbox entry, a fresh
processed mark, one timer re-armed, one trace step into a full ring (with its trim), a
``commit_id`` recorded with the SHA-256 of the body, and the wake-up of ``wait_for_work``.

The floor keeps the promises the store keeps for that commit: the execution's fields all
written (by ``json.dumps``, with no checks and no tuple tags), the time outbox entries
were committed and marks and commit ids recorded (the overview and ``prune``, PRODUCTION.md
sections 8 and 9), and due timers tied on ``fire_at`` in arming order (a ``seq`` from the
work counter, as the store does). Each side is timed ``--repeat`` times, interleaved; the
median and the best of those runs are printed (on a busy machine, the best is the steadier),
and the median CPU time of each side (this process's user and system time: what a busy
machine disturbs least; FULL's waits for the disk are not in it).

    python perf/floor.py [--loops 2000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import statistics
import tempfile
import uuid
from pathlib import Path
from time import perf_counter, process_time
from typing import Any

from harel_store import Execution, TimerOp
from harel_store.sqlite import SqliteStore

TRACE_MAX = 200
LATER = 4_000_000_000.0
EVENT = {"type": "shipped", "order": 7}
STEP = {"event": "ship", "transition": "packing->shipped", "actions": ["notify"]}

# The leanest schema I could write for the same promises: seqs never reused (AUTOINCREMENT
# on the outbox), one timer per (execution, path) found by fire_at then arming order, a
# ring per execution, replays recognised by (execution, commit_id) and compared by digest,
# and when entries, marks and ids were written.
STAMP = "REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)"
LEAN = (
    (
        "CREATE TABLE executions (id TEXT PRIMARY KEY, version INTEGER NOT NULL, epoch INTEGER,"
        " body BLOB NOT NULL) WITHOUT ROWID"
    ),
    (
        "CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, target_id TEXT,"
        f" event BLOB NOT NULL, lease_until REAL NOT NULL DEFAULT 0, committed_at {STAMP})"
    ),
    (
        "CREATE TABLE processed (execution_id TEXT NOT NULL, event_id TEXT NOT NULL,"
        f" recorded_at {STAMP}, PRIMARY KEY (execution_id, event_id)) WITHOUT ROWID"
    ),
    (
        "CREATE TABLE timers (execution_id TEXT NOT NULL, path TEXT NOT NULL, fire_at REAL NOT NULL,"
        " seq INTEGER NOT NULL, lease_until REAL NOT NULL DEFAULT 0,"
        " PRIMARY KEY (execution_id, path)) WITHOUT ROWID"
    ),
    "CREATE INDEX timers_by_fire_at ON timers (fire_at, seq)",
    (
        "CREATE TABLE trace (execution_id TEXT NOT NULL, n INTEGER NOT NULL, step BLOB NOT NULL,"
        " PRIMARY KEY (execution_id, n)) WITHOUT ROWID"
    ),
    (
        "CREATE TABLE commit_ids (execution_id TEXT NOT NULL, commit_id TEXT NOT NULL,"
        f" digest BLOB NOT NULL, version INTEGER NOT NULL, recorded_at {STAMP},"
        " PRIMARY KEY (execution_id, commit_id)) WITHOUT ROWID"
    ),
    "CREATE TABLE work (id INTEGER PRIMARY KEY CHECK (id = 1), n INTEGER NOT NULL)",
    "INSERT INTO work VALUES (1, 0)",
)


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


class Floor:
    """The same writes by hand: 8 statements and BEGIN/COMMIT per commit."""

    FIELDS = (
        "id", "definition_id", "status", "outcome", "active_path", "history", "context",
        "parent_id", "child_id", "children",
    )  # fmt: skip

    def __init__(self, path: str, synchronous: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        for sql in LEAN:
            self.conn.execute(sql)

    def commit(
        self, exe: Execution, target: str, event: Any, mark: str, fire_at: float,
        step: Any, commit_id: str, epoch: int,
    ) -> None:  # fmt: skip
        eid, version = exe.id, exe.version
        blob = dumps({name: getattr(exe, name) for name in self.FIELDS})
        ev, st = dumps(event), dumps(step)
        digest = hashlib.sha256(
            dumps([[target, event], mark, [["schedule", "root/wait", fire_at]], [], step])
        ).digest()
        new = version + 1
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            # The commit id first: a replay is found by the insert that records it.
            if not c.execute(
                "INSERT INTO commit_ids (execution_id, commit_id, digest, version)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (eid, commit_id, digest, new),
            ).rowcount:
                raise RuntimeError("floor: replay")
            if (
                c.execute(
                    "UPDATE executions SET version = ?, body = ?, epoch = ? WHERE id = ?"
                    " AND version = ? AND (epoch IS NULL OR epoch <= ?)",
                    (new, blob, epoch, eid, version, epoch),
                ).rowcount
                != 1
            ):
                raise RuntimeError("floor: conflict")
            c.execute("INSERT INTO outbox (target_id, event) VALUES (?, ?)", (target, ev))
            c.execute(
                "INSERT OR IGNORE INTO processed (execution_id, event_id) VALUES (?, ?)",
                (eid, mark),
            )
            c.execute("UPDATE work SET n = n + 1")  # the wake-up, and the timer's seq
            c.execute(
                "INSERT INTO timers (execution_id, path, fire_at, seq)"
                " VALUES (?, ?, ?, (SELECT n FROM work)) ON CONFLICT DO UPDATE"
                " SET fire_at = excluded.fire_at, seq = excluded.seq, lease_until = 0",
                (eid, "root/wait", fire_at),
            )
            # The ring: the step's number is the commit's new version, the trim one range.
            c.execute("INSERT INTO trace VALUES (?, ?, ?)", (eid, new, st))
            c.execute("DELETE FROM trace WHERE execution_id = ? AND n <= ?", (eid, new - TRACE_MAX))
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        exe.version = new

    def populate(self, exe: Execution) -> None:
        self.conn.execute(
            "INSERT INTO executions VALUES (?, 0, NULL, ?)", (exe.id, dumps({"id": exe.id}))
        )
        self.conn.execute("INSERT INTO timers (execution_id, path, fire_at, seq) VALUES (?, ?, ?, 0)",
                          (exe.id, "root/wait", LATER))  # fmt: skip
        for i in range(TRACE_MAX):
            self.commit(exe, "exe-1", EVENT, f"pre-{i}", LATER + i, STEP, f"pre-{i}", 1)


def store_for(path: str, synchronous: str) -> tuple[SqliteStore, Execution]:
    store = SqliteStore(path, trace_max=TRACE_MAX, synchronous=synchronous)
    exe = Execution(id="exe-0", definition_id="order")
    store.commit(exe, (), timers=[TimerOp("schedule", "root/wait", LATER)])
    for i in range(TRACE_MAX):
        store.commit(exe, (), trace=STEP)
    return store, exe


def time_store(store: SqliteStore, exe: Execution, loops: int) -> tuple[float, float]:
    tag = uuid.uuid4().hex[:8]
    work = [
        (f"e-{tag}-{i}", [TimerOp("schedule", "root/wait", LATER + i)], f"c-{tag}-{i}")
        for i in range(loops)
    ]
    emits = [("exe-1", EVENT)]
    commit = store.commit
    t0, c0 = perf_counter(), process_time()
    for mark, rearm, cid in work:
        commit(exe, emits, mark, rearm, (), STEP, commit_id=cid, epoch=1)
    return (perf_counter() - t0) / loops, (process_time() - c0) / loops


def time_floor(floor: Floor, exe: Execution, loops: int) -> tuple[float, float]:
    tag = uuid.uuid4().hex[:8]
    work = [(f"e-{tag}-{i}", LATER + i, f"c-{tag}-{i}") for i in range(loops)]
    commit = floor.commit
    t0, c0 = perf_counter(), process_time()
    for mark, fire_at, cid in work:
        commit(exe, "exe-1", EVENT, mark, fire_at, STEP, cid, 1)
    return (perf_counter() - t0) / loops, (process_time() - c0) / loops


def statements(conn: sqlite3.Connection, run: Any) -> list[str]:
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        run()
    finally:
        conn.set_trace_callback(None)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--show", action="store_true", help="print the statements of one commit")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for sync in ("NORMAL", "FULL"):
            store, exe = store_for(str(Path(tmp, f"store-{sync}.db")), sync)
            floor = Floor(str(Path(tmp, f"floor-{sync}.db")), sync)
            fexe = Execution(id="exe-0", definition_id="order")
            floor.populate(fexe)
            time_store(store, exe, 200)  # warm both
            time_floor(floor, fexe, 200)
            ours: list[tuple[float, float]] = []
            theirs: list[tuple[float, float]] = []
            for _ in range(args.repeat):  # interleaved: both see the same machine
                ours.append(time_store(store, exe, args.loops))
                theirs.append(time_floor(floor, fexe, args.loops))
            s, f = (statistics.median(t for t, _ in runs) for runs in (ours, theirs))
            bs, bf = (min(t for t, _ in runs) for runs in (ours, theirs))
            cs, cf = (statistics.median(c for _, c in runs) for runs in (ours, theirs))
            n_store = statements(store._conn, lambda s=store, e=exe: time_store(s, e, 1))  # type: ignore[arg-type]
            n_floor = statements(floor.conn, lambda f=floor, e=fexe: time_floor(f, e, 1))
            print(
                f"{sync:6}  store {s * 1e6:7.1f} us ({len(n_store)} statements)"
                f"  floor {f * 1e6:7.1f} us ({len(n_floor)} statements)  store/floor {s / f:.2f}x"
                f"  | best: store {bs * 1e6:7.1f} us  floor {bf * 1e6:7.1f} us  {bs / bf:.2f}x"
                f"  | CPU: store {cs * 1e6:7.1f} us  floor {cf * 1e6:7.1f} us  {cs / cf:.2f}x"
            )
            if args.show:
                print("  store:", *n_store, sep="\n    ")
                print("  floor:", *n_floor, sep="\n    ")
            store.close()
            floor.conn.close()


if __name__ == "__main__":
    main()
