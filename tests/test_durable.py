"""Durable stores under several processes and crashes (issue 12, point 4): a writer killed
with SIGKILL mid-stream, processes racing commits and first writes on one execution,
relays in two processes claiming from one outbox, wake-ups across processes, and a fresh
file opened by several processes at once. Every child is a fresh ``python`` running the
store from this checkout; a child that meets any error (a "database is locked" included)
exits non-zero and the test shows its stderr.

Durable-only: the memory stores live in one process. Each test runs on a SQLite file.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import harel_store
from harel_store import Execution, StoreConflict, TimerOp
from harel_store.sqlite import SqliteStore

pytestmark = pytest.mark.skipif(
    not hasattr(signal, "SIGKILL"), reason="needs POSIX processes and SIGKILL"
)

ROOT = str(Path(harel_store.__file__).resolve().parent.parent)

# What every child runs first: the store, and a start line all children wait for.
PRELUDE = """
import os, sys, time
from harel_store import Execution, StoreConflict, TimerOp
from harel_store.sqlite import SqliteStore

path = sys.argv[1]
go = path + ".go"
def wait_for_go():
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
def say(*words):
    print(*words, flush=True)
"""


def child(code: str, *args: Any) -> subprocess.Popen[str]:
    paths = [ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.Popen(
        [sys.executable, "-c", PRELUDE + code, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120.0) -> list[str]:
    """The lines the child printed; it must have exited cleanly."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{err}"
    assert "locked" not in err and "busy" not in err, err
    return out.split()


def start(path: Path, *procs: subprocess.Popen[str]) -> None:
    """Let the children go at once, when all of them are ready."""
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == "ready\n", f"a child did not get ready: {line!r} {proc.communicate()[1]}"
    Path(f"{path}.go").touch()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    db = tmp_path / "shared.db"
    SqliteStore(db).close()  # the schema exists before the children race
    return db


# --- a writer killed with SIGKILL ---------------------------------------------------------

WRITER = """
store = SqliteStore(path, synchronous=sys.argv[2], trace_max=50)
exe = store.load("x") or Execution(id="x")
k = exe.version
while True:
    k += 1
    exe.context["k"] = k
    store.commit(
        exe,
        [("y", f"ev-{k}"), (None, f"all-{k}")],
        f"in-{k}",
        [TimerOp("schedule", f"t{k % 3}", float(k)), TimerOp("cancel", f"gone-{k}")],
        [(f"child-{k}", ("r", k), {"k": k})],
        {"k": k},
        commit_id=f"c{k}",
        epoch=k // 10,
    )
    say(k)
"""


def committed_body(k: int) -> dict[str, Any]:
    return {
        "emits": [("y", f"ev-{k}"), (None, f"all-{k}")],
        "processed_event_id": f"in-{k}",
        "timers": [TimerOp("schedule", f"t{k % 3}", float(k)), TimerOp("cancel", f"gone-{k}")],
        "spawns": [(f"child-{k}", ("r", k), {"k": k})],
        "trace": {"k": k},
    }


def check_commits(store: SqliteStore, v: int) -> None:
    """Commits 1..v are all there, whole; nothing of commit v + 1 is."""
    exe = store.load("x")
    assert exe.version == v and exe.context == {"k": v}
    outbox = store.pending_outbox()
    assert [e.event for e in outbox] == [f"{w}-{k}" for k in range(1, v + 1) for w in ("ev", "all")]
    assert [e.seq for e in outbox] == list(range(1, 2 * v + 1))
    spawns = store.pending_spawns()
    assert [(s.seq, s.child_id, s.root_path, s.context) for s in spawns] == [
        (k, f"child-{k}", ("r", k), {"k": k}) for k in range(1, v + 1)
    ]
    assert all(store.is_processed("x", f"in-{k}") for k in range(1, v + 1))
    assert not store.is_processed("x", f"in-{v + 1}")
    latest = {f"t{k % 3}": float(k) for k in range(1, v + 1)}
    assert sorted(store.due_timers(math.inf)) == sorted(("x", p, at) for p, at in latest.items())
    trace = store.read_trace("x")
    assert trace == [{"k": k, "index": k - 1} for k in range(max(1, v - 49), v + 1)]
    stats = store.stats()
    assert (stats["executions"], stats["outbox"], stats["spawns"], stats["processed"]) == (
        1,
        2 * v,
        v,
        v,
    )
    # The last commit id is recognised; the next one was never recorded.
    retry = Execution(id="x")
    store.commit(retry, **committed_body(v), commit_id=f"c{v}", epoch=v // 10)
    assert retry.version == v and store.load("x").version == v


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
def test_a_writer_killed_mid_stream_loses_no_returned_commit(path: Path, synchronous: str) -> None:
    """The child prints each commit number after ``commit`` returned; it is killed with
    SIGKILL at a moment of its busiest writing, three times over, each time resuming
    from what the database holds."""
    printed = 0
    for round_, kill_after in enumerate((40, 75, 110)):
        proc = child(WRITER, path, synchronous)
        assert proc.stdout is not None
        seen = printed
        while seen < kill_after:
            line = proc.stdout.readline()
            assert line, f"the writer died: {proc.communicate()[1]}"
            seen = int(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        # What the child printed before it died: read through the buffer readline used.
        rest, err = proc.stdout.read(), proc.stderr.read() if proc.stderr else ""
        proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL, err
        printed = max([seen, *map(int, rest.split())])
        with SqliteStore(path, trace_max=50) as store:
            v = store.load("x").version
            # Every commit that returned is there; at most the one in flight is more.
            assert printed <= v <= printed + 1, (round_, printed, v)
            check_commits(store, v)
            printed = v


# --- racing writers ---------------------------------------------------------------------

INCREMENTER = """
store = SqliteStore(path)
me, rounds = sys.argv[2], int(sys.argv[3])
conflicts = 0
wait_for_go()
for i in range(rounds):
    while True:
        exe = store.load("counter")
        exe.context["n"] += 1
        exe.context["by"].append(me)
        time.sleep(0.001)  # the engine at work: the others commit meanwhile
        try:
            store.commit(exe, [("audit", f"{me}-{i}")], f"{me}-{i}")
            break
        except StoreConflict:
            conflicts += 1
say(conflicts)
"""


def test_racing_processes_lose_no_update(path: Path) -> None:
    with SqliteStore(path) as store:
        store.save(Execution(id="counter", context={"n": 0, "by": []}))
    procs = [child(INCREMENTER, path, f"p{i}", 40) for i in range(4)]
    start(path, *procs)
    conflicts = [int(finish(p)[0]) for p in procs]
    with SqliteStore(path) as store:
        exe = store.load("counter")
        assert exe.context["n"] == 160 and exe.version == 161
        assert Counter(exe.context["by"]) == {f"p{i}": 40 for i in range(4)}
        outbox = store.pending_outbox()
        expected = {f"p{p}-{i}" for p in range(4) for i in range(40)}
        assert sorted(e.event for e in outbox) == sorted(expected), "lost or doubled emits"
        assert [e.seq for e in outbox] == list(range(1, 161)), "a refused commit took a seq"
        assert all(store.is_processed("counter", ev) for ev in expected)
        assert store.stats()["processed"] == 160
    assert sum(conflicts) > 0, "the processes never raced"


FIRST_WRITER = """
store = SqliteStore(path)
me, n = sys.argv[2], int(sys.argv[3])
wait_for_go()
for j in range(n):
    exe = Execution(id=f"x{j}", context={"by": me})
    try:
        store.commit(exe, [("t", f"{me}-{j}")], trace={"by": me}, spawns=[(f"k{j}", "r", {})])
    except StoreConflict as exc:
        assert (exc.expected, exc.found) == (0, 1), exc
    else:
        say(j)
"""


def test_concurrent_first_writes_have_one_winner(path: Path) -> None:
    procs = [child(FIRST_WRITER, path, f"p{i}", 60) for i in range(4)]
    start(path, *procs)
    won = {f"p{i}": [int(j) for j in finish(p)] for i, p in enumerate(procs)}
    winners: dict[int, str] = {}
    for who, ids in won.items():
        for j in ids:
            assert j not in winners, f"x{j} was first-written by {winners[j]} and {who}"
            winners[j] = who
    assert sorted(winners) == list(range(60))
    with SqliteStore(path) as store:
        for j, who in winners.items():
            exe = store.load(f"x{j}")
            assert exe.version == 1 and exe.context == {"by": who}
            assert store.read_trace(f"x{j}") == [{"by": who, "index": 0}]
        events = sorted(e.event for e in store.pending_outbox())
        assert events == sorted(f"{who}-{j}" for j, who in winners.items())
        assert len(store.pending_spawns()) == 60


def test_threads_with_their_own_store_objects_lose_no_update(path: Path) -> None:
    with SqliteStore(path) as store:
        store.save(Execution(id="counter", context={"n": 0}))
    errors: list[BaseException] = []

    def work(me: int) -> None:
        try:
            with SqliteStore(path) as store:
                for i in range(30):
                    while True:
                        exe = store.load("counter")
                        exe.context["n"] += 1
                        try:
                            store.commit(exe, [("t", f"{me}-{i}")])
                            break
                        except StoreConflict:
                            pass
        except BaseException as exc:  # noqa: BLE001 - shown by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    with SqliteStore(path) as store:
        assert store.load("counter").context == {"n": 120}
        assert len({e.event for e in store.pending_outbox()}) == 120


def test_threads_sharing_one_store_object_take_turns(path: Path) -> None:
    """One store object used by several threads at once: each call holds the object's
    lock, so no thread's statements land inside another's transaction."""
    with SqliteStore(path) as shared:
        shared.save(Execution(id="counter", context={"n": 0}))
        errors: list[BaseException] = []

        def work(me: int) -> None:
            try:
                for i in range(30):
                    while True:
                        exe = shared.load("counter")
                        exe.context["n"] += 1
                        try:
                            shared.commit(exe, [("t", f"{me}-{i}")], trace={"by": me})
                            break
                        except StoreConflict:
                            pass
                    shared.claim_outbox(1, lease=0.0)
                    shared.stats()
            except BaseException as exc:  # noqa: BLE001 - shown by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert shared.load("counter").context == {"n": 120}
        assert len({e.event for e in shared.pending_outbox()}) == 120


# --- relays in two processes --------------------------------------------------------------

RELAY = """
store = SqliteStore(path)
wait_for_go()
claimed = []
while True:
    batch = store.claim_outbox(7, lease=60.0)
    spawns = store.claim_spawns(5, lease=60.0)
    timers = store.claim_due_timers(1000.0, 3, lease=60.0)
    if not (batch or spawns or timers):
        break
    claimed += [f"o{e.seq}" for e in batch] + [f"s{e.seq}" for e in spawns]
    claimed += [f"t{path_}" for _, path_, _ in timers]
    time.sleep(0.002)  # delivering: the other relay claims meanwhile
say(*claimed)
"""


def test_two_processes_never_share_a_live_lease(path: Path) -> None:
    with SqliteStore(path) as store:
        exe = Execution(id="e1")
        for k in range(20):
            store.commit(
                exe,
                [("t", f"ev-{k}-{i}") for i in range(20)],
                spawns=[(f"c{k}-{i}", "r", {}) for i in range(10)],
                timers=[TimerOp("schedule", f"p{k}-{i}", float(k)) for i in range(5)],
            )
    procs = [child(RELAY, path) for _ in range(2)]
    start(path, *procs)
    first, second = (finish(p) for p in procs)
    assert not set(first) & set(second), "an item was leased to both relays"
    assert len(first) == len(set(first)) and len(second) == len(set(second))
    assert len(first) + len(second) == 400 + 200 + 100
    assert first and second, "both relays should have claimed something"
    with SqliteStore(path) as store:
        assert store.claim_outbox() == [] and store.claim_spawns() == []
        assert len(store.pending_outbox()) == 400, "claims do not ack"


# --- wake-ups across processes ------------------------------------------------------------

LATE_WRITER = """
store = SqliteStore(path)
wait_for_go()
time.sleep(0.3)
store.commit(Execution(id="e1"), [("t", "wake up")])
say("committed")
"""


def test_wait_for_work_wakes_on_another_processs_commit(path: Path) -> None:
    with SqliteStore(path) as store:
        assert store.wait_for_work(0.05) is False
        proc = child(LATE_WRITER, path)
        start(path, proc)
        began = time.monotonic()
        assert store.wait_for_work(60) is True
        waited = time.monotonic() - began
        assert finish(proc) == ["committed"]
        assert waited < 30
        assert [e.event for e in store.claim_outbox()] == ["wake up"]
        assert store.wait_for_work(0.05) is False


# --- opening a fresh file together ----------------------------------------------------------

OPENER = """
wait_for_go()
store = SqliteStore(path)
store.commit(Execution(id=sys.argv[2]), [("t", sys.argv[2])])
say("ok")
"""


def test_processes_opening_a_fresh_file_together(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.db"
    procs = [child(OPENER, fresh, f"e{i}") for i in range(4)]
    start(fresh, *procs)
    for proc in procs:
        assert finish(proc) == ["ok"]
    with SqliteStore(fresh) as store:
        assert store.stats()["executions"] == 4
        assert sorted(e.event for e in store.pending_outbox()) == ["e0", "e1", "e2", "e3"]


def test_a_conflict_leaves_nothing_of_the_loser(path: Path) -> None:
    """The loser of a race at one version: none of its emits, marks, timers, spawns or
    trace are visible, in a second store object on the same file."""
    one, two = SqliteStore(path), SqliteStore(path)
    try:
        one.commit(Execution(id="e1"), [])
        a, b = one.load("e1"), two.load("e1")
        one.commit(
            a, [("t", "a")], "va", [TimerOp("schedule", "pa", 1.0)], [("ca", "r", {})], {"a": 1}
        )
        with pytest.raises(StoreConflict) as info:
            two.commit(
                b, [("t", "b")], "vb", [TimerOp("schedule", "pb", 1.0)], [("cb", "r", {})], {"b": 1}
            )
        assert (info.value.expected, info.value.found) == (1, 2)
        assert b.version == 1
        for store in (one, two):
            assert [e.event for e in store.pending_outbox()] == ["a"]
            assert [s.child_id for s in store.pending_spawns()] == ["ca"]
            assert store.due_timers(math.inf) == [("e1", "pa", 1.0)]
            assert store.read_trace("e1") == [{"a": 1, "index": 0}]
            assert store.is_processed("e1", "va") and not store.is_processed("e1", "vb")
    finally:
        one.close()
        two.close()
