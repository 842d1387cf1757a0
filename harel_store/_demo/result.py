"""What a run reports, and the end-of-run checks every host makes from the store."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypedDict

from .._protocols import ExecutionStore
from .workflow import Plan


class DemoStore(ExecutionStore, Protocol):
    """A synchronous store with the extras the demonstration uses."""

    @property
    def trace_max(self) -> int | None: ...
    def forget(self, execution_id: Any) -> None: ...
    def stats(self) -> dict[str, int]: ...


class WorkerReport(TypedDict):
    """What one relay process did (``python -m harel_store --workers N``)."""

    worker: int
    pid: int
    commits: int
    events_delivered: int
    timers_fired: int
    children_created: int
    orders_retired: int
    conflicts: int
    elapsed: float
    commits_per_s: float
    error: str  # the traceback of an exception that ended the worker, or ""
    lost: bool  # the process ended without a report (killed): its claims went to others


class DemoResult(TypedDict, total=False):
    """What a run reports. ``executions`` counts every execution created: orders, their
    region children and the two shared services. The keys after ``problems`` are those
    of a run on a durable store only."""

    orders: int
    completed: int
    timed_out: int
    executions: int
    commits: int
    events_delivered: int
    redeliveries_skipped: int
    duplicate_spawns_skipped: int
    timers_fired: int
    notifications: int
    ticks: int
    peak_live_executions: int
    elapsed: float
    orders_per_s: float  # orders finished per second, by this run (not those before a resume)
    executions_per_s: float
    commits_per_s: float
    stats: dict[str, int]
    stats_after_forget: dict[str, int]
    problems: list[str]
    # durable stores
    seed: int
    resumed: bool
    finished_before: int  # orders finished by the runs before this one (a resumed run)
    runs: int
    conflicts: int
    batched: bool  # a durable run's relays wrote with commit_many and the batch acks
    workers: list[WorkerReport]
    kept: bool  # the finished orders stayed in the store (--keep)
    shards: int  # shards of each service and of the ledger


def store_checks(
    expect: Callable[[str, object, object], None],
    n: int,
    planned: Plan,
    services: Sequence[Any],
    *,
    completed: int,
    timed_out: int,
    children: int,
    missed_pickups: int,
    notifications: int,
) -> None:
    """The checks of the outcome that hold for any run that finished, however it was
    driven: every order ended as its fate planned, and the services, which every order
    goes through, counted each event they handled once."""
    served = n - planned.lost
    expect("orders completed", completed, served)
    expect("orders timed out", timed_out, planned.lost)
    expect("order notifications", notifications, n)
    expect("region children joined", children, 2 * served)
    expect("missed pickups", missed_pickups, planned.misses)
    inventory, payment = services
    if inventory is None or payment is None:
        expect("services in the store", [s is not None for s in services], [True, True])
        return
    expect("reservations", inventory.context["reservations"], n)
    expect("releases", inventory.context["releases"], planned.lost)
    expect("charges lost", payment.context["lost"], planned.lost)
    expect("charges settled", payment.context["settled"], served + planned.flaky)
    expect("charges pending", payment.context["pending"], [])
