"""``python -m harel_store --store URL``: the demonstration on durable stores, resumed
after ``kill -9``, and with its relays in worker processes.

The runs are small (a few hundred orders): SQLite commits about 5,000 times a second
here, PostgreSQL (fsync per commit) a few hundred.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from _helpers import URL_ENV, module_env, worker_pids
from _helpers import cli_command as demo_command
from _helpers import run_cli as run_demo


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "OK: every order completed or timed out as planned" in proc.stdout


def stats_of(path: Path) -> dict[str, int]:
    from harel_store.sqlite import SqliteStore

    with SqliteStore(path) as store:
        return store.stats()


def finished_orders(store: Any) -> int | None:
    """The orders the run in ``store`` has retired, summed over its ledger's shards;
    ``None`` while it has no ledger."""
    from harel_store._demo.relay import ledger_ids

    driver = store.load("demo/driver")
    if driver is None:
        return None
    ledgers = [store.load(i) for i in ledger_ids(driver.context.get("shards", 1))]
    if any(ledger is None for ledger in ledgers):
        return None
    return sum(ledger.context["finished"] for ledger in ledgers)


def assert_finished(path: Path) -> None:
    """A finished run leaves its driver only, recording it, in phase ``done``."""
    from harel_store.sqlite import SqliteStore

    with SqliteStore(path) as store:
        stats = store.stats()
        driver = store.load("demo/driver")
    assert driver is not None and driver.context["phase"] == "done"
    assert driver.context["problems"] == []
    assert {k: v for k, v in stats.items() if k != "trace_steps"} == {
        "executions": 1,
        "outbox": 0,
        "spawns": 0,
        "timers": 0,
        "processed": 0,
        "traces": 1,
    }


# -- one process --------------------------------------------------------------------------


def test_demo_on_a_sqlite_file(tmp_path: Path) -> None:
    proc = run_demo("--store", "sqlite:///orders.db", "-n", "200", "--quiet", cwd=tmp_path)
    assert_ok(proc)
    assert proc.stderr == ""
    first = proc.stdout.splitlines()[0]
    assert "SqliteStore (harel_store.sqlite) at sqlite:///orders.db" in first
    assert "orders:      200 (" in proc.stdout
    assert "commits/s (SqliteStore)" in proc.stdout
    assert "transitions/s" in proc.stdout and "(batched: one commit_many" in proc.stdout
    # A finished run leaves only its driver, and the database is ready for the next run.
    assert_finished(tmp_path / "orders.db")
    assert_ok(run_demo("--store", "sqlite:///orders.db", "-n", "20", "--quiet", cwd=tmp_path))
    assert_finished(tmp_path / "orders.db")


def test_no_batch_runs_one_commit_per_transition(tmp_path: Path) -> None:
    """``--no-batch`` keeps the run of one commit per transition: same checks, same
    outcome, and the report says which it was."""
    proc = run_demo(
        "--store", "sqlite:///orders.db", "-n", "200", "--quiet", "--no-batch", cwd=tmp_path
    )
    assert_ok(proc)
    assert "not batched (--no-batch): one commit per transition" in proc.stdout
    assert_finished(tmp_path / "orders.db")


def test_store_url_from_the_environment(tmp_path: Path) -> None:
    import harel_store

    proc = run_demo("-n", "60", "--quiet", cwd=tmp_path, **{URL_ENV: "sqlite:///env.db"})
    assert_ok(proc)
    assert "SqliteStore" in proc.stdout.splitlines()[0]
    assert (tmp_path / "env.db").is_file()
    # --store wins over the environment.
    proc = run_demo("--store", "memory:", "-n", "60", "--quiet", cwd=tmp_path, **{URL_ENV: "x:"})
    assert_ok(proc)
    assert f" {harel_store.IMPLEMENTATION} store " in proc.stdout.splitlines()[0]


def test_kill_9_then_resume(tmp_path: Path) -> None:
    """Killed partway, the run is refused without --resume, and finished with it: every
    order ends as its fate planned and every event is handled once (the services'
    counts and the ledger's tallies are exact)."""
    from harel_store.sqlite import SqliteStore

    path = tmp_path / "orders.db"
    args = ("--store", "sqlite:///orders.db", "--quiet", "--lease", "1")
    first = subprocess.Popen(
        demo_command(*args, "-n", "600"),
        cwd=tmp_path,
        env=module_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        finished = 0
        deadline = time.monotonic() + 60
        while finished < 20 and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
            if path.exists():
                with SqliteStore(path) as store:
                    finished = finished_orders(store) or 0
        assert first.poll() is None, "the run ended before it could be killed"
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.kill()
        first.communicate()
    assert first.returncode == -signal.SIGKILL
    with SqliteStore(path) as store:
        driver = store.load("demo/driver")
        left = store.stats()
    assert driver is not None and driver.context["phase"] == "running"
    assert 20 <= driver.context["admitted"] and left["executions"] > 4

    refused = run_demo(*args, cwd=tmp_path)
    assert refused.returncode == 2
    assert "holds an unfinished run of the demonstration" in refused.stderr
    assert "add --resume" in refused.stderr
    assert run_demo(*args, "--resume", "-n", "5", cwd=tmp_path).returncode == 2

    resumed = run_demo(*args, "--resume", cwd=tmp_path)
    assert_ok(resumed)
    assert "resuming the run of 600 orders (seed 1)" in resumed.stdout
    assert "orders:      600 (" in resumed.stdout
    assert "run 2 of the demonstration in this store (resumed" in resumed.stdout
    assert_finished(path)


def test_resume_of_an_empty_store_starts_a_run(tmp_path: Path) -> None:
    proc = run_demo("--store", "sqlite:///new.db", "--resume", "-n", "50", "--quiet", cwd=tmp_path)
    assert_ok(proc)
    assert "nothing to resume in sqlite:///new.db: starting a new run" in proc.stdout


def test_a_store_holding_something_else_is_refused(tmp_path: Path) -> None:
    from harel_store import Execution
    from harel_store.sqlite import SqliteStore

    with SqliteStore(tmp_path / "other.db") as store:
        store.save(Execution(id="mine"))
    for extra in ((), ("--resume",)):
        proc = run_demo("--store", "sqlite:///other.db", *extra, cwd=tmp_path)
        assert proc.returncode == 2
        assert "is not empty (1 executions) and holds no run of the demonstration" in proc.stderr
    assert stats_of(tmp_path / "other.db")["executions"] == 1


# -- worker processes -----------------------------------------------------------------------


WORKER_LINE = re.compile(
    r"^worker (\d) \(pid \d+\): ([\d,]+) commits in [\d.]+ s, [\d,]+ commits/s", re.MULTILINE
)


def assert_workers(proc: subprocess.CompletedProcess[str], n: int) -> None:
    assert_ok(proc)
    lines = WORKER_LINE.findall(proc.stdout)
    assert [int(k) for k, _ in lines] == list(range(1, n + 1)), proc.stdout
    assert sum(int(c.replace(",", "")) for _, c in lines) > 0
    assert f"relays and sweepers in {n} worker processes" in proc.stdout


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "no-batch"])
def test_workers_on_sqlite(batch: bool, tmp_path: Path) -> None:
    proc = run_demo(
        "--store",
        "sqlite:///orders.db",
        "--workers",
        "2",
        "-n",
        "200",
        "--quiet",
        *(() if batch else ("--no-batch",)),
        cwd=tmp_path,
    )
    assert_workers(proc, 2)
    assert "orders:      200 (" in proc.stdout
    rate = re.search(
        r"^throughput: ([\d,]+) transitions/s, ([\d,]+) executions/s", proc.stdout, re.MULTILINE
    )
    assert rate is not None and int(rate[1].replace(",", "")) > 0, proc.stdout
    assert ("(batched:" in proc.stdout) is batch
    assert_finished(tmp_path / "orders.db")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_killed_worker_leaves_its_claims_to_the_others(tmp_path: Path) -> None:
    from harel_store.sqlite import SqliteStore

    path = tmp_path / "orders.db"
    proc = subprocess.Popen(
        demo_command(
            "--store",
            "sqlite:///orders.db",
            "--workers",
            "2",
            "--lease",
            "1",
            "-n",
            "400",
            "--quiet",
        ),
        cwd=tmp_path,
        env=module_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        pids: list[int] = []
        finished = 0
        while (finished < 10 or len(pids) < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
            assert proc.poll() is None, proc.communicate()
            pids = worker_pids(proc.pid)
            if path.exists():
                with SqliteStore(path) as store:
                    finished = finished_orders(store) or 0
        assert len(pids) == 2
        os.kill(pids[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"{out}\n{err}"
    assert "OK: every order completed or timed out as planned" in out
    assert f"worker 1 (pid {pids[0]}): was lost (killed?) before it reported" in out
    assert re.search(rf"^worker 2 \(pid {pids[1]}\): [\d,]+ commits", out, re.MULTILINE)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_kill_9_of_the_coordinator_then_resume_with_workers(tmp_path: Path) -> None:
    """The workers of a killed coordinator stop by themselves; the run is resumed with
    workers again and passes its checks."""
    from harel_store.sqlite import SqliteStore

    path = tmp_path / "orders.db"
    args = ("--store", "sqlite:///orders.db", "--workers", "2", "--lease", "1", "--quiet")
    proc = subprocess.Popen(
        demo_command(*args, "-n", "600"),
        cwd=tmp_path,
        env=module_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        finished = 0
        while finished < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
            assert proc.poll() is None, proc.communicate()
            if path.exists():
                with SqliteStore(path) as store:
                    finished = finished_orders(store) or 0
        pids = worker_pids(proc.pid)
        assert len(pids) == 2
        os.kill(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids), "workers outlived their coordinator"
    assert err == ""

    resumed = run_demo(*args, "--resume", cwd=tmp_path)
    assert_workers(resumed, 2)
    assert "resuming the run of 600 orders (seed 1)" in resumed.stdout
    assert_finished(path)


@pytest.mark.parametrize(
    "args",
    [
        ("--workers", "2"),
        ("--workers", "2", "--store", "memory:"),
        ("--workers", "2", "--store", "sqlite://"),
        ("--resume",),
        ("--resume", "--store", "sqlite://"),
        ("--pure", "--store", "sqlite:///x.db"),
        ("--store", "mysql://x"),
    ],
    ids=[
        "workers",
        "workers-memory",
        "workers-sqlite-memory",
        "resume",
        "resume-sqlite-memory",
        "pure",
        "scheme",
    ],
)
def test_what_a_store_cannot_do_is_refused(args: tuple[str, ...], tmp_path: Path) -> None:
    proc = run_demo(*args, "-n", "10", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.startswith("python -m harel_store: error: ")
    if "--workers" in args:
        assert "--workers needs a database the worker processes share" in proc.stderr
    assert proc.stdout == ""
    assert not (tmp_path / "x.db").exists()


def test_workers_on_postgres(pg_server: Any, tmp_path: Path) -> None:
    """The same run with two workers on PostgreSQL, in a database of its own."""
    import psycopg

    name = f"demo_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        try:
            conn.execute(f'CREATE DATABASE "{name}"')
        except psycopg.errors.InsufficientPrivilege as exc:
            pytest.skip(f"the demo runs in a database of its own, and this server says: {exc}")
    try:
        url = re.sub(r"/postgres(\?|$)", rf"/{name}\1", pg_server.url, count=1)
        assert name in url
        proc = run_demo("--store", url, "--workers", "2", "-n", "60", "--quiet", cwd=tmp_path)
        assert_workers(proc, 2)
        assert "PostgresStore (harel_store.postgres)" in proc.stdout.splitlines()[0]
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- in process -----------------------------------------------------------------------------


def test_local_run_relies_on_no_identity(tmp_path: Path) -> None:
    """``run``, the host of the memory stores and of the benchmarks, holds no execution
    between two store calls: it runs as well on a store whose load decodes a copy."""
    from harel_store._demo import run
    from harel_store.sqlite import SqliteStore

    def factory() -> Any:
        return SqliteStore(tmp_path / "local.db")

    result = run(150, factory)
    assert result["problems"] == []
    assert result["completed"] + result["timed_out"] == 150


def test_durable_host_on_a_memory_store(impl: Any) -> None:
    """The claiming relays, the driver and the ledger work on memory stores too."""
    from harel_store._demo import run
    from harel_store._demo.durable import SHARDS, run_durable

    result = run_durable(impl.DictStore(), where="memory:", n=400, seed=3)
    assert result["problems"] == []
    local = run(400, impl.DictStore, seed=3)
    for key in ("completed", "timed_out", "notifications"):
        assert result[key] == local[key]
    # The same orders and children; each service in SHARDS executions instead of one.
    assert result["shards"] == SHARDS
    assert result["executions"] - 2 * (SHARDS - 1) == local["executions"]
    assert result["redeliveries_skipped"] > 0 and result["duplicate_spawns_skipped"] > 0
    assert not result["resumed"] and result["runs"] == 1


class WatchedForgets:
    """A store that notes what is pending each time an order or a child is forgotten."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.seen: list[tuple[int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def forget(self, execution_id: Any) -> None:
        if execution_id.startswith("order-"):
            stats = self._store.stats()
            self.seen.append((stats["outbox"], stats["spawns"]))
        self._store.forget(execution_id)


def test_orders_are_forgotten_only_when_no_relay_can_deliver_to_them(impl: Any) -> None:
    """A delivery that loaded an order just before it was forgotten would store it again
    (a commit succeeds where no row exists): orders are forgotten only at quiescent
    points, with no outbox or spawn entry left."""
    from harel_store._demo.durable import run_durable

    store = WatchedForgets(impl.DictStore())
    result = run_durable(store, where="memory:", n=300)
    assert result["problems"] == []
    assert len(store.seen) == 3 * result["completed"] + 3 * result["timed_out"]
    assert set(store.seen) == {(0, 0)}


def test_forgets_on_other_connections_are_made_at_quiescent_points_too(tmp_path: Path) -> None:
    """The coordinator's parallel forgets (``forget_with``: several connections, one
    thread each) forget every retired order and child, each while nothing is pending,
    and none through the coordinator's own store."""
    from harel_store._demo.durable import Coordinator, run_durable
    from harel_store.sqlite import SqliteStore

    path = tmp_path / "f.db"
    with SqliteStore(path) as store, SqliteStore(path) as a, SqliteStore(path) as b:
        own, helpers = WatchedForgets(store), [WatchedForgets(a), WatchedForgets(b)]
        coord = Coordinator(own, "f.db")
        coord.forget_with(helpers)
        coord.open(200, 1, False)
        result = run_durable(own, where="f.db", coordinator=coord)
    assert result["problems"] == []
    assert own.seen == []
    seen = [s for helper in helpers for s in helper.seen]
    assert len(seen) == 3 * result["completed"] + 3 * result["timed_out"]
    assert all(helper.seen for helper in helpers)
    assert set(seen) == {(0, 0)}


class Crash(BaseException):
    """The process dies here."""


class CrashingStore:
    """A store that dies at its ``at``-th commit, before or after the commit lands."""

    def __init__(self, store: Any, at: int, landed: bool) -> None:
        self._store = store
        self._left = at
        self._landed = landed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def commit(self, *args: Any, **kwargs: Any) -> None:
        self._left -= 1
        if self._left == 0 and not self._landed:
            raise Crash
        self._store.commit(*args, **kwargs)
        if self._left == 0:
            raise Crash

    def commit_many(self, commits: Any) -> Any:
        """A batch is one transaction: the crash at a commit inside it comes before the
        whole batch lands, or after all of it landed."""
        commits = list(commits)
        hit = 0 < self._left <= len(commits)
        self._left -= len(commits)
        if hit and not self._landed:
            raise Crash
        outcomes = self._store.commit_many(commits)
        if hit:
            raise Crash
        return outcomes


@pytest.mark.parametrize(
    ("at", "landed", "batch"),
    [
        (40, True, True),
        (900, False, True),
        (1700, True, True),
        (-1, True, True),
        (900, False, False),
        (1700, True, False),
    ],
    ids=["admitting", "mid-run", "late", "checked", "mid-run-no-batch", "late-no-batch"],
)
def test_resume_after_a_crash_at_any_commit(
    at: int, landed: bool, batch: bool, tmp_path: Path
) -> None:
    """Killed at a commit (before it lands, or after it landed and before the caller
    heard of it; in a batch, before or after the whole batch), the run is finished by a
    resumed one from what the store holds, batched or not. At the last commit (-1), the
    one that records the run checked, the resumed run only reports that and clears what
    is left of the run but its driver; a run without --resume then starts a new one."""
    from harel_store import DictStore
    from harel_store._demo.durable import Refused, run_durable
    from harel_store.sqlite import SqliteStore

    n = 120
    last = run_durable(DictStore(), where="memory:", n=n, batch=batch)["commits"]
    assert at < last
    path = tmp_path / "crash.db"
    with SqliteStore(path) as store, pytest.raises(Crash):
        run_durable(
            CrashingStore(store, at if at > 0 else last, landed),
            where="crash.db",
            n=n,
            lease=0.05,
            batch=batch,
        )
    with SqliteStore(path) as store:
        if at != -1:
            with pytest.raises(Refused, match="add --resume"):
                run_durable(store, where="crash.db")
        result = run_durable(store, where="crash.db", resume=True, lease=0.05)
        assert result["problems"] == []
        assert result["resumed"]
        if at == -1:  # finished: reported as it was recorded, not run again
            assert "completed" not in result and result["runs"] == 1
        else:
            assert result["completed"] + result["timed_out"] == n
            assert result["runs"] == 2
    assert_finished(path)
    if at == -1:
        with SqliteStore(path) as store:
            again = run_durable(store, where="crash.db", n=30)
        assert again["problems"] == [] and not again["resumed"] and again["orders"] == 30


@pytest.mark.parametrize("lease", ["inf", "1e309", "nan", "0", "-1"])
def test_a_lease_that_is_not_a_finite_positive_number_is_a_usage_error(
    lease: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import harel_store.cli.demo as cli

    store = f"sqlite:///{tmp_path}/x.db"
    assert cli.main(["--store", store, "-n", "5", "--quiet", "--lease", lease]) == 2
    err = capsys.readouterr().err
    assert f"argument --lease: must be a finite number more than 0, got {lease}" in err
    assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # the store was not touched


# -- resuming: a finished run, leases, rates ----------------------------------------------


def test_resume_of_a_finished_run_says_so(tmp_path: Path) -> None:
    """One line, exit 0, and the store as it was; without --resume, a new run starts."""
    assert_ok(run_demo("--store", "sqlite:///orders.db", "-n", "40", "--quiet", cwd=tmp_path))
    before = stats_of(tmp_path / "orders.db")
    for extra in ((), ("--workers", "2")):
        proc = run_demo("--store", "sqlite:///orders.db", "--resume", *extra, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""
        assert proc.stdout == (
            "the run in sqlite:///orders.db had finished: 40 orders (seed 1; 36 completed, "
            "4 timed out), and passed its checks; nothing to resume (without --resume, a "
            "new run starts)\n"
        )
        assert stats_of(tmp_path / "orders.db") == before
    again = run_demo("--store", "sqlite:///orders.db", "-n", "30", "--quiet", cwd=tmp_path)
    assert_ok(again)
    assert "driving 30 orders" in again.stdout and "run 1 of" in again.stdout


def test_resume_of_a_run_that_failed_its_checks_exits_1(tmp_path: Path) -> None:
    from harel_store.sqlite import SqliteStore

    assert_ok(run_demo("--store", "sqlite:///orders.db", "-n", "20", "--quiet", cwd=tmp_path))
    with SqliteStore(tmp_path / "orders.db") as store:
        driver = store.load("demo/driver")
        assert driver is not None
        driver.context["problems"] = ["orders completed: got 17, expected 18"]
        store.commit(driver, [], None, [], [], {"event": "broken"})
    proc = run_demo("--store", "sqlite:///orders.db", "--resume", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(
        "the run in sqlite:///orders.db had finished: 20 orders (seed 1; "
    )
    assert "and 1 of its checks failed (orders completed: got 17, expected 18)" in proc.stderr


def abandoned_run(path: Path, n: int, lease: float) -> int:
    """A run whose process died holding claims on what the first tick put in the outbox
    (its wake-up and the ``place`` event of each order): how many it claimed."""
    from harel_store._demo.durable import Coordinator
    from harel_store.sqlite import SqliteStore

    with SqliteStore(path) as store:
        coord = Coordinator(store, str(path))
        coord.open(n, 1, False)
        coord.advance()
        return len(store.claim_outbox(1000, lease=lease))


@pytest.mark.parametrize("workers", [(), ("--workers", "1")], ids=["one-process", "workers"])
def test_progress_says_when_the_run_waits_for_leases(
    workers: tuple[str, ...], tmp_path: Path
) -> None:
    claimed = abandoned_run(tmp_path / "orders.db", 30, lease=6.0)
    assert claimed == 31
    proc = run_demo("--store", "sqlite:///orders.db", "--resume", *workers, cwd=tmp_path)
    assert_ok(proc)
    waits = [line for line in proc.stderr.splitlines() if "waiting for the leases" in line]
    assert len(waits) == 1, proc.stderr
    assert re.match(
        r"^  waiting for the leases on \d+ items of work to run out \(a process that "
        r"stopped had claimed them\), [\d.]+ s$",
        waits[0],
    )


def test_waiting_is_reported_once_per_stall(tmp_path: Path) -> None:
    from harel_store._demo.durable import run_durable
    from harel_store.sqlite import SqliteStore

    path = tmp_path / "orders.db"
    abandoned_run(path, 30, lease=0.5)
    calls: list[int] = []
    with SqliteStore(path) as store:
        result = run_durable(store, where="x", resume=True, lease=0.5, waiting=calls.append)
    assert result["problems"] == []
    assert calls == [31]  # what the dead process claimed; nothing else is pending then


def test_rates_after_a_resume_count_this_runs_work_only(tmp_path: Path) -> None:
    """Killed late, the run is resumed with most orders finished: its orders/s counts
    the orders it finished, not those finished before."""
    from harel_store import DictStore
    from harel_store._demo.durable import run_durable
    from harel_store.sqlite import SqliteStore

    n = 120
    path = tmp_path / "late.db"
    at = run_durable(DictStore(), where="memory:", n=n)["commits"] - 200
    with SqliteStore(path) as store, pytest.raises(Crash):
        run_durable(CrashingStore(store, at, True), where="late.db", n=n, lease=0.05)
    with SqliteStore(path) as store:
        before = finished_orders(store)
        assert before is not None
        assert 0 < before < n
        result = run_durable(store, where="late.db", resume=True, lease=0.05)
    assert result["problems"] == [] and result["resumed"]
    assert result["finished_before"] == before
    assert result["orders_per_s"] == pytest.approx((n - before) / result["elapsed"])
    # The executions made by this run: far fewer than the run's in all.
    assert result["executions_per_s"] * result["elapsed"] < result["executions"] / 2


def test_the_report_of_a_resumed_run_says_what_it_did(tmp_path: Path) -> None:
    from harel_store import DictStore
    from harel_store._demo.durable import run_durable
    from harel_store.sqlite import SqliteStore

    n = 120
    at = run_durable(DictStore(), where="memory:", n=n)["commits"] - 200
    with SqliteStore(tmp_path / "late.db") as store, pytest.raises(Crash):
        run_durable(CrashingStore(store, at, True), where="late.db", n=n, lease=0.05)
    with SqliteStore(tmp_path / "late.db") as store:
        before = finished_orders(store)
        assert before is not None
    proc = run_demo("--store", "sqlite:///late.db", "--resume", "--lease", "0.05", cwd=tmp_path)
    assert_ok(proc)
    assert f"{before} orders finished before" in proc.stdout
    assert f"; {n - before} finished in this run, {before} before it)" in proc.stdout
    line = re.search(r"^elapsed ([\d.]+) s: ([\d,]+) orders/s", proc.stdout, re.MULTILINE)
    assert line is not None, proc.stdout
    elapsed, rate = float(line.group(1)), int(line.group(2).replace(",", ""))
    assert rate == pytest.approx((n - before) / elapsed, rel=0.05, abs=1)  # 3 decimals of s
