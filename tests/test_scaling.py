"""API.md points 2 and 3: FIFOs and timers that scale.

No absolute timings: each check compares the CPU time of a small and a large case in one
process against a generous bound, well apart from what a cost proportional to the size
would show; or it compares memory with ``tracemalloc``.
"""

from __future__ import annotations

import math
import random
import time
import timeit
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from harel_store import Execution, TimerOp

# CPU time of this process: other processes on a busy machine do not count in it.
clock = time.process_time


def time_calls(func: Callable[[Any], Any], args: list[Any]) -> float:
    start = clock()
    for arg in args:
        func(arg)
    return clock() - start


def growth(cost: Callable[[int], float], small: int, large: int, bound: float) -> float:
    """``cost(large) / cost(small)`` after a warm-up, tried up to three times until it is
    under ``bound``: a busy machine can spoil one measurement, not every one."""
    cost(small)
    for _ in range(3):
        ratio = cost(large) / cost(small)
        if ratio < bound:
            break
    return ratio


def best_time(func: Callable[[], Any], repeat: int = 5, number: int = 1) -> float:
    return min(timeit.repeat(func, repeat=repeat, number=number, timer=clock))


Fill = Callable[[Any, Any, int], None]
FIFOS: dict[str, tuple[Fill, str, str]] = {
    "outbox": (
        lambda store, exe, n: store.commit(exe, [(None, i) for i in range(n)]),
        "pending_outbox",
        "ack_outbox",
    ),
    "spawns": (
        lambda store, exe, n: store.commit(exe, [], spawns=[(i, "r", {}) for i in range(n)]),
        "pending_spawns",
        "ack_spawn",
    ),
}


def pairs_swapped(seqs: list[int]) -> list[int]:
    """2, 1, 4, 3, ...: a relay that is almost in order, each ack just after its
    neighbour's. Every first ack of a pair lands in the middle of the FIFO."""
    return [seq for i in range(0, len(seqs), 2) for seq in reversed(seqs[i : i + 2])]


@pytest.mark.parametrize("order", ["reverse", "random", "pairs"])
@pytest.mark.parametrize("fifo", FIFOS)
def test_acks_in_any_order_are_not_quadratic(impl: Any, fifo: str, order: str) -> None:
    """Acking n entries, timed against ``set.discard`` of the same seqs in the same order:
    a reference as linear as acks should be, with the same memory access pattern, so
    cache effects cancel out. From 1k to 32k entries the ratio stays flat if acks are
    O(1) amortized; quadratic acks would make it grow about 32 times."""
    fill, pending, ack = FIFOS[fifo]

    def cost(n: int) -> float:
        seqs = list(range(1, n + 1))
        if order == "reverse":
            seqs.reverse()
        elif order == "pairs":
            seqs = pairs_swapped(seqs)
        else:
            random.Random(n).shuffle(seqs)
        acks, reference = [], []
        for _ in range(3):
            store = impl.DictStore()
            fill(store, Execution(id="e1"), n)
            acks.append(time_calls(getattr(store, ack), seqs))
            assert getattr(store, pending)() == []
            reference.append(time_calls(set(seqs).discard, seqs))
        return min(acks) / min(reference)

    ratio = growth(cost, 1_000, 32_000, bound=8)
    assert ratio < 8, f"per ack, 32x the entries cost {ratio:.1f}x as much"


@pytest.mark.parametrize("fifo", FIFOS)
def test_stale_acks_between_the_ends_are_not_quadratic(impl: Any, fifo: str) -> None:
    """The newest entry is acked, more are committed, and from then on every ack of the
    oldest entry is followed by a repeated ack of that first acked seq, which now lies
    between the two ends: a no-op that must not cost in proportion to what is pending."""
    fill, pending, ack = FIFOS[fifo]

    def cost(n: int) -> float:
        times, reference = [], []
        for _ in range(3):
            store = impl.DictStore()
            exe = Execution(id="e1")
            fill(store, exe, n)
            ack_one = getattr(store, ack)
            ack_one(n)
            fill(store, exe, 1)
            seqs = [seq for head in range(1, n) for seq in (head, n)]
            times.append(time_calls(ack_one, seqs))
            assert [e.seq for e in getattr(store, pending)()] == [n + 1]
            reference.append(time_calls(set(seqs).discard, seqs))
        return min(times) / min(reference)

    ratio = growth(cost, 1_000, 32_000, bound=8)
    assert ratio < 8, f"per ack, 32x the entries cost {ratio:.1f}x as much"


def schedule(path: Any, fire_at: float) -> TimerOp:
    return TimerOp("schedule", path, fire_at)


def rearm(store: Any, exe: Any, i: int) -> None:
    store.commit(exe, [], timers=[schedule("p", float(i))])


def rearm_between_sweeps(store: Any, exe: Any, i: int) -> None:
    store.commit(exe, [], timers=[schedule("p", float(i))])
    assert store.due_timers(-1.0) == []


def schedule_then_cancel(store: Any, exe: Any, i: int) -> None:
    store.commit(exe, [], timers=[schedule(i, float(i))])
    store.due_timers(-1.0)
    store.commit(exe, [], timers=[TimerOp("cancel", i)])


def schedule_then_sweep(store: Any, exe: Any, i: int) -> None:
    store.commit(exe, [], timers=[schedule(i, float(i))])
    for eid, path, fire_at in store.due_timers(float(i)):
        store.delete_timer(eid, path, fire_at)


def memory_growth(action: Callable[[], Any]) -> tuple[int, int]:
    """``(peak, kept)``: bytes allocated at the peak of ``action`` and still held after."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        action()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base, current - base


TRACED = 20_000  # the last churns of a run are traced: tracemalloc slows them 20-fold


@pytest.mark.parametrize(
    ("churn", "n", "left"),
    [
        (rearm, 100_000, 1),
        (rearm_between_sweeps, 100_000, 1),
        (schedule_then_cancel, TRACED, 0),
        (schedule_then_sweep, TRACED, 0),
    ],
    ids=["rearm-100k", "rearm-between-sweeps-100k", "schedule-cancel", "schedule-sweep-delete"],
)
def test_timer_churn_keeps_memory_bounded(impl: Any, churn: Any, n: int, left: int) -> None:
    """Memory held while churning stays a small fraction of what as many live timers
    take, however many churns came before."""
    live = impl.DictStore()
    live_cost, _ = memory_growth(
        lambda: live.commit(
            Execution(id="e1"), [], timers=[schedule(i, 1.0) for i in range(TRACED)]
        )
    )
    store, exe = impl.DictStore(), Execution(id="e1")

    def run(first: int, stop: int) -> None:
        for i in range(first, stop):
            churn(store, exe, i)

    run(0, n - TRACED + 1)
    peak, kept = memory_growth(lambda: run(n - TRACED + 1, n))
    assert peak < live_cost / 20, (
        f"churn peaked at {peak} B; {TRACED} live timers take {live_cost} B"
    )
    assert kept < live_cost / 50
    assert len(store.due_timers(math.inf)) == left == store.stats()["timers"]
    if left:
        assert store.due_timers(math.inf) == [("e1", "p", float(n - 1))]


def test_due_timers_cost_follows_the_due_ones(impl: Any) -> None:
    def time_due(armed: int) -> float:
        store = impl.DictStore()
        exe = Execution(id="e1")
        store.commit(exe, [], timers=[schedule(("far", i), 1e9 + i) for i in range(armed)])
        store.commit(exe, [], timers=[schedule(("due", i), float(9 - i)) for i in range(10)])
        assert store.due_timers(100.0) == [("e1", ("due", 9 - k), float(k)) for k in range(10)]
        return best_time(lambda: store.due_timers(100.0), repeat=5, number=200)

    ratio = growth(time_due, 1_000, 100_000, bound=10)
    assert ratio < 10, f"100x the armed timers took {ratio:.0f}x the time"


class FakeClock:
    """A lease clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


Claim = Callable[[Any, int, float], list[Any]]
CLAIMS: dict[str, tuple[Fill, Claim, Callable[[Any], int]]] = {
    "outbox": (
        FIFOS["outbox"][0],
        lambda store, limit, lease: store.claim_outbox(limit, lease=lease),
        lambda entry: entry.seq - 1,
    ),
    "spawns": (
        FIFOS["spawns"][0],
        lambda store, limit, lease: store.claim_spawns(limit, lease=lease),
        lambda entry: entry.seq - 1,
    ),
    "timers": (
        lambda store, exe, n: store.commit(
            exe, [], timers=[schedule(i, float(i)) for i in range(n)]
        ),
        lambda store, limit, lease: store.claim_due_timers(1e12, limit, lease=lease),
        lambda timer: int(timer[2]),
    ),
}


@pytest.mark.parametrize("leases", ["live", "expired"])
@pytest.mark.parametrize("kind", CLAIMS)
def test_claim_cost_follows_what_it_returns(impl: Any, kind: str, leases: str) -> None:
    """Claims of 10 items each, from 10,000 and from 100,000 pending items (timers: all
    due) whose oldest half is leased. With the leases ``live`` a claim must not walk past
    the leased items; with them ``expired`` it returns them, and must not walk past the
    rest. Either way 10x the pending items may not cost 10x per claim."""
    fill, claim, position = CLAIMS[kind]
    rounds, per_claim, repeat = 100, 10, 3

    def cost(n: int) -> float:
        clock = FakeClock()
        store = impl.DictStore(clock=clock)
        fill(store, Execution(id="e1"), n)
        half = n // 2
        assert [position(item) for item in claim(store, half, 10.0)] == list(range(half))
        if leases == "expired":
            clock.now = 100.0

        def claims() -> None:
            for _ in range(rounds):
                claim(store, per_claim, 1e6)

        elapsed = best_time(claims, repeat=repeat)
        taken = rounds * per_claim * repeat
        first = taken if leases == "expired" else half + taken
        assert [position(item) for item in claim(store, 2, 1e6)] == [first, first + 1]
        return elapsed

    ratio = growth(cost, 10_000, 100_000, bound=4)
    assert ratio < 4, f"claims from 10x the pending {kind} took {ratio:.1f}x the time"
