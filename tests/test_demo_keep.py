"""``python -m harel_store --keep``: a durable run that keeps what it finished, checked
from the store's own figures, and the shards of its shared executions."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from _helpers import run_cli as run_demo

SERVICES_PER_SHARD = 3  # an inventory, a payment service and a ledger


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "OK: every order completed or timed out as planned" in proc.stdout


def planned(n: int, seed: int = 1) -> tuple[int, int]:
    """How many orders of a run complete, and how many region children they make."""
    from harel_store._demo.workflow import fates, plan

    lost = plan(fates(n, seed)).lost
    return n - lost, 2 * (n - lost)


def test_keep_leaves_every_order_with_its_marks_commit_ids_and_trace(tmp_path: Path) -> None:
    from harel_store._demo.durable import SHARDS
    from harel_store.sqlite import SqliteStore

    n = 150
    proc = run_demo("--store", "sqlite:///orders.db", "-n", str(n), "--keep", "-q", cwd=tmp_path)
    assert_ok(proc)
    assert "kept (--keep): every order with its children" in proc.stdout
    _, children = planned(n)
    with SqliteStore(tmp_path / "orders.db") as store:
        overview = store.overview()
        order = store.load("order-1")
        trace = store.read_trace("order-1")
        driver = store.load("demo/driver")
        shipping = store.load("order-1/shipping")
    assert overview["executions"] == n + children + SERVICES_PER_SHARD * SHARDS + 1
    assert overview["outbox"] == overview["spawns"] == overview["timers"] == 0
    # Every handled event left its mark, and every commit its id.
    assert overview["processed"] > 5 * n and overview["commit_ids"] > overview["processed"]
    assert order is not None and order.status == "completed"
    assert [step["event"] for step in trace][-1] == "region_done"
    assert shipping is not None and shipping.parent_id == "order-1"
    assert driver is not None and driver.context["keep"] and driver.context["phase"] == "done"


def test_a_kept_run_is_left_alone(tmp_path: Path) -> None:
    """A new run is refused on a kept run (it is there to be looked at); a resume says
    it finished, and forgets nothing of it."""
    args = ("--store", "sqlite:///orders.db", "-q")
    assert_ok(run_demo(*args, "-n", "40", "--keep", cwd=tmp_path))
    from harel_store.sqlite import SqliteStore

    def stats() -> dict[str, int]:
        with SqliteStore(tmp_path / "orders.db") as store:
            return store.stats()

    before = stats()
    refused = run_demo(*args, "-n", "10", cwd=tmp_path)
    assert refused.returncode == 2
    assert "holds a finished run of the demonstration kept with --keep" in refused.stderr
    resumed = run_demo(*args, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "it is kept (--keep): a new run needs an empty database" in resumed.stdout
    assert stats() == before


@pytest.mark.parametrize("extra", [(), ("--no-batch",)], ids=["batched", "no-batch"])
def test_keep_with_workers(extra: tuple[str, ...], tmp_path: Path) -> None:
    from harel_store.sqlite import SqliteStore

    n = 120
    proc = run_demo(
        "--store", "sqlite:///o.db", "-n", str(n), "--keep", "--workers", "2", "-q", *extra,
        cwd=tmp_path,
    )  # fmt: skip
    assert_ok(proc)
    with SqliteStore(tmp_path / "o.db") as store:
        shards = store.load("demo/driver").context["shards"]
        assert shards == (1 if extra else 16)
        ids = ["inventory", "payment"] if shards == 1 else ["inventory/0", "payment/15"]
        assert all(store.load(i) is not None for i in ids)
        assert store.stats()["executions"] == n + planned(n)[1] + 3 * shards + 1


def test_shards_are_what_the_run_says(tmp_path: Path) -> None:
    from harel_store.sqlite import SqliteStore

    proc = run_demo("--store", "sqlite:///s.db", "-n", "60", "--shards", "3", "--keep", "-q",
                    cwd=tmp_path)  # fmt: skip
    assert_ok(proc)
    assert "2 services in 3 shards each" in proc.stdout
    with SqliteStore(tmp_path / "s.db") as store:
        assert store.load("inventory/2") is not None and store.load("inventory/3") is None
        assert store.load("demo/ledger/2") is not None
        # order i went to shard i % 3
        assert store.load("inventory/1").context["reservations"] == 20


class Crash(BaseException):
    """The process dies here."""


class CrashingStore:
    """A store that dies after its ``at``-th write (commit or batch) landed."""

    def __init__(self, store: Any, at: int) -> None:
        self._store = store
        self._left = at

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _landed(self) -> None:
        self._left -= 1
        if self._left == 0:
            raise Crash

    def commit(self, *args: Any, **kwargs: Any) -> None:
        self._store.commit(*args, **kwargs)
        self._landed()

    def commit_many(self, commits: Any) -> Any:
        outcomes = self._store.commit_many(commits)
        self._landed()
        return outcomes

    def forget(self, execution_id: Any) -> None:
        raise AssertionError(f"a kept run forgot {execution_id!r}")


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "no-batch"])
def test_a_kept_run_killed_and_resumed_keeps_everything(batch: bool, tmp_path: Path) -> None:
    """The resumed run of a kept run keeps too (the driver records it), forgets nothing,
    and checks every order at the version its planned events make."""
    from harel_store._demo.durable import Refused, run_durable
    from harel_store.sqlite import SqliteStore

    n = 100
    path = tmp_path / "crash.db"
    with SqliteStore(path) as store, pytest.raises(Crash):
        run_durable(CrashingStore(store, 40), where="x", n=n, keep=True, lease=0.05, batch=batch)
    with SqliteStore(path) as store:
        with pytest.raises(Refused, match="--shards 5 disagrees"):
            run_durable(store, where="x", resume=True, shards=5)
        result = run_durable(CrashingStore(store, -1), where="x", resume=True, lease=0.05)
        assert result["problems"] == [] and result["kept"] and result["resumed"]
        assert store.stats()["executions"] == n + planned(n)[1] + 3 * result["shards"] + 1


def test_the_checks_of_a_kept_run_can_fail(tmp_path: Path) -> None:
    """An order that made more commits than its events plan is found by the end-of-run
    checks of a kept run."""
    from harel_store import DictStore
    from harel_store._demo.durable import run_durable

    class Twice:
        def __init__(self, store: Any) -> None:
            self._store = store

        def __getattr__(self, name: str) -> Any:
            return getattr(self._store, name)

        def commit(self, exe: Any, emits: Any, processed_event_id: Any = None, *a: Any,
                   **kw: Any) -> None:  # fmt: skip
            self._store.commit(exe, emits, processed_event_id, *a, **kw)
            if exe.id == "order-7" and processed_event_id is not None:
                self._store.commit(exe, [], f"{processed_event_id}#again")

    result = run_durable(Twice(DictStore()), where="memory:", n=30, keep=True, batch=False)
    # Each of its 5 events committed twice: 5 versions more than planned.
    assert "order-7: at version 11, planned 6" in result["problems"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--keep",), "--keep needs a durable store: memory: keeps nothing"),
        (("--shards", "2"), "--shards needs a durable store"),
        (("--store", "sqlite://", "--keep"), "--keep needs a database that outlives"),
    ],
)
def test_keep_and_shards_need_a_durable_store(
    args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    proc = run_demo("-n", "5", *args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_keep_on_a_resume_of_a_run_that_forgot_is_refused(tmp_path: Path) -> None:
    from harel_store._demo.durable import run_durable
    from harel_store.sqlite import SqliteStore

    with SqliteStore(tmp_path / "f.db") as store, pytest.raises(Crash):
        run_durable(_Dies(store, 30), where="x", n=60, lease=0.05)
    proc = run_demo("--store", "sqlite:///f.db", "--resume", "--keep", "-q", cwd=tmp_path)
    assert proc.returncode == 2
    assert "was started without --keep" in proc.stderr


class _Dies(CrashingStore):
    def forget(self, execution_id: Any) -> None:
        self._store.forget(execution_id)
