"""``overview``, ``list_executions`` and ``prune`` (PRODUCTION.md sections 8 and 9) on every
store through the conformance fixture, and on the memory stores in detail: their figures
on a clock the test moves, paging in first-commit order while a cleaner forgets what it
lists, the cost on a large store, and marks and commit ids kept with when they were
recorded."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from _helpers import best, commit_three
from conftest import Impl

from harel_store import Commit, DictStore, Execution, TimerOp, copy_store


def test_every_store_sees_what_it_holds_and_prunes(make_store: Any) -> None:
    store = make_store()
    empty = store.overview()
    assert empty["executions"] == 0 and empty["outbox_oldest_age"] is None
    commit_three(store)
    time.sleep(0.05)
    store.claim_outbox(2, lease=60.0)
    figures = store.overview(now=1005.0)
    assert (figures["executions"], figures["outbox"], figures["spawns"]) == (3, 6, 3)
    assert (figures["timers"], figures["processed"], figures["commit_ids"]) == (3, 3, 3)
    assert 0.04 <= figures["outbox_oldest_age"] < 60 and 0.04 <= figures["spawns_oldest_age"] < 60
    assert figures["outbox_leased"] == 2 and figures["expired_leases"] == 0
    assert figures["timers_due"] == 1 and figures["next_timer_at"] == 1010.0
    assert store.list_executions() == ["x0", "x1", "x2"]
    assert store.list_executions(after="x0", limit=1) == ["x1"]
    assert store.list_executions(after="x2") == []
    assert store.prune(3600) == {"processed": 0, "commit_ids": 0}
    time.sleep(0.3)
    store.commit(store.load("x0"), (), processed_event_id="late", commit_id="late")
    assert store.prune(0.2) == {"processed": 3, "commit_ids": 3}
    assert store.overview()["processed"] == store.overview()["commit_ids"] == 1
    assert store.is_processed("x0", "late") and not store.is_processed("x0", "m0")


@pytest.fixture
def clock() -> list[float]:
    return [1000.0]


@pytest.fixture
def ticking(impl: Impl, clock: list[float]) -> Any:
    return impl.DictStore(clock=lambda: clock[0])


def test_figures_on_the_store_clock(ticking: Any, clock: list[float]) -> None:
    store = ticking
    commit_three(store)
    clock[0] = 1000.5
    store.claim_outbox(2, lease=5.0)
    store.claim_spawns(1, lease=100.0)
    store.claim_due_timers(1000.0, 5, lease=5.0)
    figures = store.overview()
    assert figures["outbox_oldest_age"] == figures["spawns_oldest_age"] == 0.5
    leased = (figures["outbox_leased"], figures["spawns_leased"], figures["timers_leased"])
    assert leased == (2, 1, 1)
    assert figures["expired_leases"] == 0
    assert (figures["timers_due"], figures["next_timer_at"]) == (1, 1010.0)
    assert store.overview(now=1015.0)["timers_due"] == 2
    assert store.overview(now=math.inf)["next_timer_at"] is None
    clock[0] = 1010.0  # the outbox and timer leases ran out, the spawn's did not
    figures = store.overview()
    assert figures["expired_leases"] == 3 and figures["outbox_leased"] == 0
    assert figures["spawns_leased"] == 1 and figures["outbox_oldest_age"] == 10.0
    store.claim_outbox(1, lease=5.0)  # one ran-out lease taken over: live again
    assert store.overview()["expired_leases"] == 2
    # Acked in the middle and at the head: the age is the oldest pending entry's.
    clock[0] = 1020.0
    store.commit(store.load("x0"), [(None, "new")])
    seqs = [e.seq for e in store.pending_outbox()]
    store.ack_outbox_many(seqs[1:-1])
    assert store.overview()["outbox_oldest_age"] == 20.0
    store.ack_outbox(seqs[0])
    assert store.overview()["outbox_oldest_age"] == 0.0
    store.ack_outbox(seqs[-1])
    assert store.overview()["outbox_oldest_age"] is None
    with pytest.raises(ValueError, match="now"):
        store.overview(now=math.nan)


def test_the_oldest_age_keeps_up_with_many_commits_and_acks(
    impl: Impl, ticking: Any, clock: list[float]
) -> None:
    """Stamps stay as few as the pending entries, and each entry's age is its commit's."""
    store = ticking
    exe = Execution(id="x")
    for i in range(2000):
        clock[0] = 1000.0 + i
        store.commit(exe, [(None, i)])
        if i % 3:
            store.ack_outbox(store.pending_outbox()[-1].seq)  # a relay keeping up with most
    clock[0] = 5000.0
    pending = store.pending_outbox()
    assert store.overview()["outbox_oldest_age"] == 4000.0
    for entry in pending[:-1]:
        store.ack_outbox(entry.seq)
    assert store.overview()["outbox_oldest_age"] == 5000.0 - (1000.0 + pending[-1].event)
    if impl.name == "pure":  # the compiled store's tables are not reachable from Python
        assert len(store._outbox.stamps) <= 2 + 64


def test_prune_on_the_store_clock(ticking: Any, clock: list[float]) -> None:
    store = ticking
    exe = Execution(id="x")
    for i in range(10):
        clock[0] = 1000.0 + i
        store.commit(exe, (), processed_event_id=f"e{i}", commit_id=f"c{i}")
    clock[0] = 1020.0
    assert store.prune(15.5) == {"processed": 5, "commit_ids": 5}  # 1000..1004
    assert store.stats()["processed"] == 5 and store.overview()["commit_ids"] == 5
    assert not store.is_processed("x", "e4") and store.is_processed("x", "e5")
    # A pruned commit id no longer recognises its replay: it applies as a new commit.
    version = exe.version
    store.commit(exe, (), processed_event_id="again", commit_id="c0")
    assert exe.version == version + 1
    # A kept one still does.
    store.commit(Execution(id="x", version=version), (), processed_event_id="e9", commit_id="c9")
    assert exe.version == version + 1
    assert store.prune(0) == {"processed": 5, "commit_ids": 5}
    assert store.prune(0) == {"processed": 0, "commit_ids": 0}
    for bad in (-1, math.nan, math.inf):
        with pytest.raises(ValueError, match="older_than"):
            store.prune(bad)
    with pytest.raises(TypeError, match="older_than"):
        store.prune("7d")


def test_forget_and_restore_keep_the_counts(impl: Impl, clock: list[float]) -> None:
    store = impl.DictStore(clock=lambda: clock[0])
    store.commit_many([
        Commit(Execution(id=f"x{i}"), [(None, i)], f"e{i}", commit_id=f"c{i}") for i in range(4)
    ])  # fmt: skip
    store.forget("x1")
    assert store.overview()["commit_ids"] == 3 and store.overview()["processed"] == 3
    clock[0] = 2000.0
    copy = impl.DictStore(clock=lambda: clock[0])
    copy_store(store, copy)
    figures = copy.overview()
    assert (figures["processed"], figures["commit_ids"], figures["outbox"]) == (3, 3, 4)
    assert figures["outbox_oldest_age"] == 0.0  # what is restored counts as made then
    clock[0] = 2100.0
    assert copy.prune(99) == {"processed": 3, "commit_ids": 3}
    assert copy.list_executions() == ["x0", "x2", "x3"]


def test_list_executions_in_first_commit_order(store: Any) -> None:
    ids = [f"id{(i * 7919) % 1000:04d}" for i in range(1000)]  # not in sorted order
    for eid in ids:
        store.save(Execution(id=eid))
    store.append_trace("trace-only", {"event": "x"})  # no execution: not listed
    seen: list[str] = []
    after = None
    while page := store.list_executions(after=after, limit=64):
        seen += page
        after = page[-1]
    assert seen == ids
    with pytest.raises(ValueError, match="after"):
        store.list_executions(after="never")
    with pytest.raises(ValueError, match="limit"):
        store.list_executions(limit=-1)


def test_a_cleaner_may_forget_what_it_lists(store: Any) -> None:
    """Page, forget the page, page on after the last id it forgot: nothing is skipped,
    however often the listing squeezes out its holes."""
    for i in range(5000):
        store.save(Execution(id=f"e{i}"))
    forgotten = 0
    after = None
    while page := store.list_executions(after=after, limit=100):
        for eid in page:
            store.forget(eid)
        forgotten += len(page)
        after = page[-1]
        if forgotten <= 5000:
            store.save(Execution(id=f"new-{forgotten}"))  # made while the cleaner runs
    assert forgotten == 5000 + 50
    assert store.list_executions() == []
    store.save(Execution(id="e0"))  # an id made again comes last
    store.save(Execution(id="z"))
    store.forget("z")
    assert store.list_executions() == ["e0"]


def test_overview_and_paging_are_cheap_on_a_large_store(impl: Impl) -> None:
    """100 times the executions, marks and commit ids, the same queues and leases: an
    overview and a page in the middle cost about the same (generous margins)."""
    timings = []
    for n in (1_000, 100_000):
        store = impl.DictStore()
        for at in range(0, n, 1000):
            store.commit_many([
                Commit(Execution(id=f"e{i:07d}"), (), f"ev{i}", commit_id=f"c{i}")
                for i in range(at, at + 1000)
            ])  # fmt: skip
        for i in range(50):
            store.commit(store.load(f"e{i:07d}"), [(None, i)], timers=[TimerOp("schedule", "t", i)])
        store.claim_outbox(10)
        store.list_executions()  # the listing is built once
        middle = f"e{n // 2:07d}"
        timings.append((
            best(store.overview),
            best(lambda: store.list_executions(after=middle, limit=100)),  # noqa: B023
        ))  # fmt: skip
    (small_view, small_page), (large_view, large_page) = timings
    assert large_view < 10 * small_view + 0.001, timings
    assert large_page < 10 * small_page + 0.001, timings


def test_async_memory_store_twins(impl: Impl) -> None:
    import asyncio

    async def main() -> None:
        store = impl.AsyncDictStore()
        await store.commit(Execution(id="a"), [(None, 1)], processed_event_id="e", commit_id="c")
        figures = await store.overview()
        assert figures["executions"] == figures["processed"] == figures["commit_ids"] == 1
        assert await store.list_executions() == ["a"]
        assert await store.prune(0) == {"processed": 0, "commit_ids": 0}

    asyncio.run(main())


def test_a_clock_that_is_not_a_number_is_named(impl: Impl) -> None:
    store = impl.DictStore(clock=lambda: "soon")
    with pytest.raises(TypeError, match="clock"):
        store.commit(Execution(id="a"), (), processed_event_id="e")
    assert store.load("a") is None
    nan = impl.DictStore(clock=lambda: math.nan)
    with pytest.raises(ValueError, match="clock"):
        nan.commit(Execution(id="a"), [(None, 1)])
    assert nan.stats()["outbox"] == 0
    assert isinstance(DictStore().overview(), dict)
