"""Exactly once across kills: charts with parallel regions, deep history, delayed events
and events for another chart, driven by worker processes that are killed with SIGKILL at
random points and started again, end exactly as an uninterrupted run does.

The worker is this file run as a script: ``python test_statemachine_kill.py URL
PROGRESS``. It runs one fixed plan from its start every time (start the executions, send
events with their event ids, and after each step deliver what is due at the plan's clock
until nothing is left, including what a killed worker still holds a lease on). A worker
started again repeats what landed before its kill: the starts find their executions, the
sends their processed marks, the timers their commits. Nothing is applied twice, so the
stores end equal, execution by execution, to a memory store that ran the plan once.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import pytest

pytest.importorskip("statemachine", reason="python-statemachine is the extra 'statemachine'")

from statemachine import HistoryState, State, StateChart

from harel_store import DictStore, open_store
from harel_store.statemachine import Machines, send_to

LEASE = 0.4  # what a killed worker claimed comes back this soon
JOBS = [f"job-{n}" for n in range(8)]


class Job(StateChart):
    """Two parallel lanes that count events modulo 3, paused and resumed through a deep
    history. While paused, a nudge every 1.5 s (a delayed event, cancelled on resume)
    tells the ledger; reaching ``l2`` tells it 0.7 s later (a delayed ``send_to``),
    reaching ``r2`` at once."""

    class active(State.Compound):
        class lanes(State.Parallel):
            class left(State.Compound):
                l0 = State(initial=True)
                l1 = State()
                l2 = State()
                step_left = l0.to(l1) | l1.to(l2) | l2.to(l0)

            class right(State.Compound):
                r0 = State(initial=True)
                r1 = State()
                r2 = State()
                step_right = r0.to(r1) | r1.to(r2) | r2.to(r0)

        h = HistoryState(type="deep")

    paused = State()
    pause = active.to(paused)
    resume = paused.to(active.h)
    nudge = paused.to.itself()

    def after_transition(self, tag: str | None = None) -> None:
        if tag is not None:
            self.model.seen[tag] = self.model.seen.get(tag, 0) + 1

    def on_enter_paused(self) -> None:
        self.send("nudge", delay=1500, send_id="nudge")

    def on_exit_paused(self) -> None:
        self.cancel_event("nudge")

    def on_nudge(self) -> None:
        self.model.nudges += 1
        send_to(self, "ledger", "tally", job=self.model.name, what="nudge")

    def on_enter_l2(self) -> None:
        self.model.l2 += 1
        send_to(self, "ledger", "tally", delay=700, job=self.model.name, what="l2")

    def on_enter_r2(self) -> None:
        self.model.r2 += 1
        send_to(self, "ledger", "tally", job=self.model.name, what="r2")


class Ledger(StateChart):
    open = State(initial=True)
    tally = open.to.itself(internal=True)

    def on_tally(self, job: str, what: str) -> None:
        key = f"{job}:{what}"
        self.model.counts[key] = self.model.counts.get(key, 0) + 1


def make_plan(seed: int = 30, events: int = 200) -> list[tuple[str, str]]:
    """``(execution id, event)`` steps; ``"start"`` starts one. Only events the job can
    take where it stands, so that every tagged event is one transition."""
    rng = random.Random(seed)
    plan = [("ledger", "start"), *((job, "start") for job in JOBS)]
    paused = dict.fromkeys(JOBS, False)
    for _ in range(events):
        job = rng.choice(JOBS)
        if paused[job]:
            event = rng.choice(["resume", "resume", "stay"])
        else:
            event = rng.choice(["step_left", "step_right", "step_left", "step_right", "pause"])
        if event != "stay":
            paused[job] = event == "pause" or (paused[job] and event != "resume")
            plan.append((job, event))
    return plan


PLAN = make_plan()
END = float(len(PLAN) + 3)  # the clock of the last delivery


def drain(machines: Machines, store: Any, now: float) -> None:
    """Deliver all that is due at ``now``, waiting out the leases of killed workers."""
    while True:
        machines.pump(now=now)
        if not store.due_timers(now) and not store.pending_outbox():
            return
        time.sleep(0.05)


def run_plan(store: Any, progress: TextIO | None = None) -> None:
    clock = [0.0]
    machines = Machines(store, Job, Ledger, clock=lambda: clock[0], lease=LEASE)
    for k, (exe_id, event) in enumerate(PLAN):
        clock[0] = float(k)
        if progress is not None:
            progress.write(f"{k}\n")
            progress.flush()
        if exe_id == "ledger":
            machines.start(exe_id, chart=Ledger, counts={})
        elif event == "start":
            machines.start(exe_id, name=exe_id, seen={}, nudges=0, l2=0, r2=0)
        else:
            tag = f"{exe_id}/{k}"
            machines.send(exe_id, event, event_id=tag, tag=tag)
        drain(machines, store, clock[0])
    drain(machines, store, END)


def outcome(store: Any) -> dict[str, Any]:
    """Everything the plan leaves, by execution: the execution, its trace and timers."""
    timers = store.due_timers(1e18)
    result = {}
    for exe_id in ["ledger", *JOBS]:
        exe = store.load(exe_id)
        trace = store.read_trace(exe_id)
        if exe_id == "ledger":  # tallies from different jobs arrive in any order
            trace = sorted((step["event"], step["via"]) for step in trace)
        result[exe_id] = (exe, trace, sorted(t for t in timers if t[0] == exe_id))
    return result


def check_exactly_once(result: dict[str, Any]) -> None:
    """Every tagged event counted once, every delayed event fired and told once."""
    counts = result["ledger"][0].context["model"]["counts"]
    tags = 0
    for job in JOBS:
        model = result[job][0].context["model"]
        assert set(model["seen"].values()) <= {1}, model["seen"]
        tags += len(model["seen"])
        assert counts.get(f"{job}:nudge", 0) == model["nudges"]
        assert counts.get(f"{job}:l2", 0) == model["l2"]
        assert counts.get(f"{job}:r2", 0) == model["r2"]
    assert tags == len(PLAN) - 1 - len(JOBS)


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    store = DictStore()
    run_plan(store)
    result = outcome(store)
    check_exactly_once(result)
    nudges = sum(result[job][0].context["model"]["nudges"] for job in JOBS)
    l2 = sum(result[job][0].context["model"]["l2"] for job in JOBS)
    assert nudges >= 3 and l2 >= 3, "the plan exercises the delayed events"
    return result


def _worker(url: str, progress: Path) -> subprocess.Popen[bytes]:
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, __file__, url, str(progress)], env=env, stderr=subprocess.PIPE
    )


def _last_step(progress: Path) -> int:
    lines = progress.read_text().split()
    return int(lines[-1]) if lines else -1


def run_killed(url: str, progress: Path, workers: int, kills: int, seed: int) -> list[int]:
    """Run ``workers`` worker processes on ``url`` at once. ``kills`` times, a worker is
    killed with SIGKILL a random 0 to 10 ms after it reached a random step of the plan
    beyond the furthest it had reached, and started again; then they run to the end.
    Returns the plan step each kill landed in."""
    rng = random.Random(seed)
    reached = [-1] * workers
    running: dict[int, tuple[subprocess.Popen[bytes], int | None, Path]] = {}
    killed_at: list[int] = []
    finished: set[int] = set()
    try:
        while len(finished) < workers:
            for slot in range(workers):
                if slot not in finished and slot not in running:
                    more = len(killed_at) < kills
                    target = reached[slot] + rng.randint(1, 6) if more else None
                    path = progress.with_suffix(f".{slot}.{len(killed_at)}")
                    path.touch()
                    running[slot] = (_worker(url, path), target, path)
            time.sleep(0.005)
            for slot, (proc, target, path) in list(running.items()):
                if proc.poll() is not None:
                    _, err = proc.communicate()
                    assert proc.returncode == 0, err.decode()
                    del running[slot]
                    finished.add(slot)
                elif target is not None and _last_step(path) >= target:
                    time.sleep(rng.uniform(0.0, 0.01))
                    proc.send_signal(signal.SIGKILL)
                    proc.communicate()
                    del running[slot]
                    step = _last_step(path)
                    reached[slot] = max(reached[slot], step)
                    killed_at.append(step)
    finally:
        for proc, _, _ in running.values():
            proc.kill()
            proc.communicate()
    return killed_at


@pytest.mark.durable
def test_sqlite_killed_at_many_points_ends_as_an_uninterrupted_run(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    db = tmp_path / "charts.db"
    killed_at = run_killed(f"sqlite:///{db}", tmp_path / "progress", 1, kills=30, seed=1)
    assert len(set(killed_at)) >= 15, killed_at  # killed at many points of the plan
    with open_store(f"sqlite:///{db}") as store:
        result = outcome(store)
        assert store.pending_outbox() == []
    check_exactly_once(result)
    assert result == reference


@pytest.mark.durable
def test_postgres_two_workers_killed_at_random_end_as_an_uninterrupted_run(
    reference: dict[str, Any], pg_server: Any, tmp_path: Path
) -> None:
    import uuid

    import psycopg

    name = f"charts_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = re.sub(r"/postgres(\?|$)", rf"/{name}\1", pg_server.url, count=1)
    assert name in url
    try:
        killed_at = run_killed(url, tmp_path / "progress", 2, kills=10, seed=2)
        assert len(set(killed_at)) >= 7, killed_at
        with open_store(url) as store:
            result = outcome(store)
            assert store.pending_outbox() == []
        check_exactly_once(result)
        assert result == reference
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    with open_store(sys.argv[1]) as worker_store, open(sys.argv[2], "a") as out:
        run_plan(worker_store, out)
