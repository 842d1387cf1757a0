"""Retention: ``forget(execution_id)`` and ``stats()`` on every store kind.

``forget`` drops an execution, its processed marks, its armed timers, its trace ring and
trace index, and leaves pending outbox and spawn entries alone. ``stats`` counts what the
store holds (a durable store counts rows), and must agree with what the public views
show after every kind of operation. The contract tests take ``make_store``
(``conftest.py``) with ``str`` ids and JSON values, and decide what ``load`` returns from
``preserves_identity``. Memory only, each saying why: ids of any hashable type, the async
memory surface, and the costs, checked by comparing a small and a large store in one
process with a generous margin and by counting the calls ``forget`` makes on other
executions' ids.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import timeit
from collections.abc import Callable, Hashable, Iterable
from typing import Any, NamedTuple

import pytest
from _helpers import AsyncAsSync, assert_holds, drive, identify_for, snapshot

from harel_store import Execution, TimerOp

STATS_KEYS = {"executions", "outbox", "spawns", "timers", "processed", "traces", "trace_steps"}


def schedule(path: Any, fire_at: float) -> TimerOp:
    return TimerOp("schedule", path, fire_at)


def cancel(path: Any) -> TimerOp:
    return TimerOp("cancel", path)


MakeStore = Callable[..., Any]


@pytest.fixture(params=["sync", "async"])
def make_memory(request: pytest.FixtureRequest, impl: Any) -> MakeStore:
    """A memory store factory of ``impl`` with the sync API; the async store is run with
    :func:`drive` (fast, and it fails if a method suspends)."""
    if request.param == "sync":
        return impl.DictStore
    return lambda **kw: AsyncAsSync(impl.AsyncDictStore(**kw), drive)


def observed(store: Any, ids: Iterable[Hashable], events: Iterable[Hashable]) -> dict[str, int]:
    """The counts ``stats`` must report, worked out from the public views alone."""
    ids, events = list(ids), list(events)
    traces = [store.read_trace(i) for i in ids]
    return {
        "executions": sum(store.load(i) is not None for i in ids),
        "outbox": len(store.pending_outbox()),
        "spawns": len(store.pending_spawns()),
        "timers": len(store.due_timers(math.inf)),
        "processed": sum(store.is_processed(i, e) for i in ids for e in events),
        "traces": sum(bool(t) for t in traces),
        "trace_steps": sum(len(t) for t in traces),
    }


def check_stats(store: Any, ids: Iterable[Hashable], events: Iterable[Hashable]) -> dict:
    stats = store.stats()
    assert set(stats) == STATS_KEYS
    assert all(type(v) is int for v in stats.values()), stats
    assert stats == observed(store, ids, events)
    return stats


# --- forget ------------------------------------------------------------------------------

IDS = ["x", "y", "kid-x", "kid-y"]
EVENTS = ["ev-x1", "ev-x2", "ev-y"]


def two_executions(store: Any) -> tuple[Any, Any]:
    """``x`` holds a bit of everything; ``y`` talks to ``x``."""
    x, y = Execution(id="x"), Execution(id="y")
    store.commit(
        x,
        [("y", "x->y"), (None, "x->all")],
        "ev-x1",
        [schedule("p", 1.0), schedule("q", 7.0)],
        [("kid-x", "region", {"from": "x"})],
        {"step": "x0"},
    )
    store.commit(x, [("x", "x->x")], "ev-x2", [schedule("r", 3.0)], trace={"step": "x1"})
    store.commit(
        y, [("x", "y->x")], "ev-y", [schedule("p", 2.0)], [("x", "region", {})], {"step": "y0"}
    )
    return x, y


def test_forget_drops_that_execution_and_nothing_else(make_store: MakeStore) -> None:
    store = make_store()
    x, _ = two_executions(store)
    identify = identify_for(store)
    before = snapshot(store, IDS, EVENTS, identify)
    y_before = snapshot(store, ["y"], EVENTS, identify)
    stats = store.stats()

    store.forget("x")

    assert store.load("x") is None
    assert not store.is_processed("x", "ev-x1") and not store.is_processed("x", "ev-x2")
    assert store.read_trace("x") == []
    assert store.due_timers(math.inf) == [("y", "p", 2.0)]
    # Pending outbox and spawn entries are owed to a relay: emitted by x, addressed to x,
    # spawned by x or spawning x, all stay.
    assert store.pending_outbox() == before["outbox"]
    assert store.pending_spawns() == before["spawns"]
    y_after = snapshot(store, ["y"], EVENTS, identify)
    for part in ("load", "processed", "trace"):
        assert y_after[part] == y_before[part], part
    assert store.stats() == {
        **stats,
        "executions": stats["executions"] - 1,
        "processed": stats["processed"] - 2,
        "timers": stats["timers"] - 3,
        "traces": stats["traces"] - 1,
        "trace_steps": stats["trace_steps"] - 2,
    }
    check_stats(store, IDS, EVENTS)
    assert x.version == 2  # the store lets go of the object; it does not touch it


def test_forget_leaves_the_relay_able_to_ack(make_store: MakeStore) -> None:
    store = make_store()
    two_executions(store)
    store.forget("x")
    for entry in store.pending_outbox():
        store.ack_outbox(entry.seq)
    for spawn in store.pending_spawns():
        store.ack_spawn(spawn.seq)
    assert store.pending_outbox() == [] and store.pending_spawns() == []
    assert check_stats(store, IDS, EVENTS) == {
        "executions": 1, "outbox": 0, "spawns": 0, "timers": 1,
        "processed": 1, "traces": 1, "trace_steps": 1,
    }  # fmt: skip


def test_after_forget_the_id_starts_afresh(make_store: MakeStore) -> None:
    store = make_store()
    x, _ = two_executions(store)
    seq = store.pending_outbox()[-1].seq
    spawn_seq = store.pending_spawns()[-1].seq
    store.forget("x")

    # A new trace restarts at index 0, through commit and append_trace alike.
    store.append_trace("x", {"step": "again"})
    assert store.read_trace("x") == [{"step": "again", "index": 0}]
    # A brand-new object under that id is a first write, whatever the old version was.
    fresh = Execution(id="x")
    store.commit(fresh, [("y", "new")], "ev-x1", [schedule("p", 1.0)], [("k", "r", {})], {"s": 1})
    assert_holds(store, fresh)
    assert fresh.version == 1
    assert store.read_trace("x") == [{"step": "again", "index": 0}, {"s": 1, "index": 1}]
    # Seqs are never reused: forget does not rewind the counters.
    assert store.pending_outbox()[-1].seq == seq + 1
    assert store.pending_spawns()[-1].seq == spawn_seq + 1
    # Only the new timer is armed, and the mark is the new one.
    assert [t for t in store.due_timers(math.inf) if t[0] == "x"] == [("x", "p", 1.0)]
    assert store.is_processed("x", "ev-x1") and not store.is_processed("x", "ev-x2")
    # The old object can come back too: nothing is stored, so it is a first write.
    store.forget("x")
    store.save(x)
    assert_holds(store, x)
    assert x.version == 3
    check_stats(store, IDS, EVENTS)


def test_a_forgotten_timer_is_not_resurrected_by_a_stale_sweep(make_store: MakeStore) -> None:
    store = make_store()
    x = Execution(id="x")
    store.commit(x, [], timers=[schedule("p", 1.0)])
    due = store.due_timers(5.0)
    store.forget("x")
    assert store.due_timers(5.0) == []
    store.commit(Execution(id="x"), [], timers=[schedule("p", 4.0)])
    for eid, path, fire_at in due:  # the sweep read the old timer before forget
        store.delete_timer(eid, path, fire_at)
    assert store.due_timers(5.0) == [("x", "p", 4.0)]
    assert store.stats()["timers"] == 1


def test_forget_of_an_unknown_id_is_a_no_op(make_store: MakeStore) -> None:
    store = make_store()
    two_executions(store)
    store.forget("x")
    identify = identify_for(store)
    before = snapshot(store, IDS, EVENTS, identify)
    store.forget("nobody")
    store.forget("x")  # twice: the second is unknown too
    assert snapshot(store, IDS, EVENTS, identify) == before


@pytest.mark.parametrize("unknown", [0, ("x",), frozenset({"x"}), None])
def test_forget_of_an_unknown_id_of_any_type_is_a_no_op(
    make_memory: MakeStore, unknown: Any
) -> None:
    """memory only: ids of any hashable type (a durable store refuses a non-str id)."""
    store = make_memory()
    two_executions(store)
    store.forget("x")
    before = snapshot(store, IDS, EVENTS)
    store.forget(unknown)
    store.forget("x")
    assert snapshot(store, IDS, EVENTS) == before


def test_forget_of_an_id_with_only_a_trace(make_store: MakeStore) -> None:
    store = make_store()
    store.append_trace("ghost", {"a": 1})
    store.append_trace("ghost", {"a": 2})
    assert store.stats()["traces"] == 1 and store.stats()["trace_steps"] == 2
    store.forget("ghost")
    assert store.read_trace("ghost") == []
    assert store.stats() == dict.fromkeys(STATS_KEYS, 0)
    store.append_trace("ghost", {"a": 3})
    assert store.read_trace("ghost") == [{"a": 3, "index": 0}]


def test_forget_of_the_earliest_timers_keeps_the_sweep_right(make_store: MakeStore) -> None:
    """Forgotten timers at the top of the timer order, and enough of them to make the
    store tidy up, must not hide or revive anything."""
    store = make_store()
    rng = random.Random(7)
    times = {}
    # The tidy-up is the memory store's; a durable store deletes rows, and each commit is
    # a transaction: fewer executions show the same there.
    for i in range(60 if store.durable else 300):
        fire_at = float(rng.randrange(1000))
        times[i] = fire_at
        store.commit(
            Execution(id=f"e{i}"),
            [],
            timers=[schedule("t", fire_at), schedule("u", fire_at + 0.5)],
        )
    gone = sorted(times, key=times.__getitem__)[: len(times) * 2 // 3]  # the earliest 2/3
    for i in gone:
        store.forget(f"e{i}")
    kept = [(t, i) for i, t in times.items() if i not in set(gone)]
    # Oldest fire_at first, ties in arming order (execution i armed before i + 1).
    expect = [(f"e{i}", path, fire_at) for fire_at, i, path in sorted(
        [(t, i, "t") for t, i in kept] + [(t + 0.5, i, "u") for t, i in kept])]  # fmt: skip
    assert store.due_timers(math.inf) == expect
    assert store.stats()["timers"] == len(expect)
    cut = expect[len(expect) // 2][2]
    assert store.due_timers(cut) == [e for e in expect if e[2] <= cut]


def test_forget_and_stats_on_the_async_store_are_coroutines(impl: Any) -> None:
    """memory only: the async memory classes (the durable async twins have their own)."""
    assert inspect.iscoroutinefunction(impl.AsyncDictStore.forget)
    assert inspect.iscoroutinefunction(impl.AsyncDictStore.stats)

    async def scenario() -> None:
        astore = impl.AsyncDictStore()
        x = Execution(id="x")
        await astore.commit(x, [(None, "e")], "ev", [schedule("p", 1.0)], trace={"s": 0})
        assert await astore.stats() == {
            "executions": 1, "outbox": 1, "spawns": 0, "timers": 1,
            "processed": 1, "traces": 1, "trace_steps": 1,
        }  # fmt: skip
        assert await astore.forget("x") is None
        assert await astore.load("x") is None
        assert not await astore.is_processed("x", "ev")
        assert await astore.due_timers(math.inf) == []
        assert await astore.read_trace("x") == []
        assert await astore.stats() == {**dict.fromkeys(STATS_KEYS, 0), "outbox": 1}

    asyncio.run(scenario())


# --- stats kept exact --------------------------------------------------------------------


def test_stats_of_an_empty_store(make_store: MakeStore) -> None:
    stats = make_store().stats()
    assert stats == dict.fromkeys(STATS_KEYS, 0)
    assert all(type(v) is int for v in stats.values())


def test_stats_returns_a_fresh_dict(make_store: MakeStore) -> None:
    store = make_store()
    stats = store.stats()
    stats["executions"] = 99
    stats.clear()
    assert store.stats() == dict.fromkeys(STATS_KEYS, 0)


ST_IDS = ["a", "b", "c"]
ST_EVENTS = ["m1", "m2"]

# (what is done, the stats change it must make). Each step starts from the state the
# previous ones left; a/b/c are Execution objects held in the ``exes`` dict.
STEPS: list[tuple[str, Callable[[Any, dict], Any], dict[str, int]]] = [
    ("first commit", lambda s, x: s.commit(x["a"], [("b", 1), (None, 2)], "m1",
        [schedule("p", 1.0), schedule("q", 2.0)], [("k", "r", {})], {"s": 0}),
        {"executions": 1, "outbox": 2, "spawns": 1, "timers": 2, "processed": 1,
         "traces": 1, "trace_steps": 1}),
    ("re-arm at the same time", lambda s, x: s.commit(x["a"], [], timers=[schedule("p", 1.0)]), {}),
    ("re-arm at another time", lambda s, x: s.commit(x["a"], [], timers=[schedule("p", 5.0)]), {}),
    ("re-arm twice in one commit", lambda s, x: s.commit(
        x["a"], [], timers=[schedule("p", 6.0), schedule("p", 1.0), schedule("z", 3.0)]),
        {"timers": 1}),
    ("cancel an armed timer", lambda s, x: s.commit(x["a"], [], timers=[cancel("z")]),
        {"timers": -1}),
    ("cancel an unarmed timer", lambda s, x: s.commit(x["a"], [], timers=[cancel("nope")]), {}),
    ("arm then cancel in one commit", lambda s, x: s.commit(
        x["a"], [], timers=[schedule("w", 9.0), cancel("w")]), {}),
    ("cancel then arm in one commit", lambda s, x: s.commit(
        x["a"], [], timers=[cancel("q"), schedule("q", 2.5)]), {}),
    ("the same mark again", lambda s, x: s.commit(x["a"], [], "m1"), {}),
    ("a second mark", lambda s, x: s.commit(x["a"], [], "m2"), {"processed": 1}),
    ("another execution", lambda s, x: s.commit(x["b"], [("a", 3)], "m1", [schedule("p", 1.0)],
        [("k2", "r", {}), ("k3", "r", {})], {"s": 0}),
        {"executions": 1, "outbox": 1, "spawns": 2, "timers": 1, "processed": 1,
         "traces": 1, "trace_steps": 1}),
    ("save only", lambda s, x: s.save(x["c"]), {"executions": 1}),
    ("delete a timer with its time", lambda s, x: s.delete_timer("b", "p", 1.0), {"timers": -1}),
    ("delete it again", lambda s, x: s.delete_timer("b", "p", 1.0), {}),
    ("a stale delete", lambda s, x: s.delete_timer("a", "p", 5.0), {}),
    ("delete an unknown timer", lambda s, x: s.delete_timer("c", "p", 1.0), {}),
    ("ack an outbox entry", lambda s, x: s.ack_outbox(2), {"outbox": -1}),
    ("ack it again", lambda s, x: s.ack_outbox(2), {}),
    ("ack unknown seqs", lambda s, x: [s.ack_outbox(n) for n in (0, -1, 99, 2**100)], {}),
    ("ack a spawn", lambda s, x: s.ack_spawn(3), {"spawns": -1}),
    ("ack unknown spawns", lambda s, x: [s.ack_spawn(n) for n in (3, 0, -1, 2**70)], {}),
    ("trace steps", lambda s, x: [s.append_trace("a", {"n": n}) for n in range(4)],
        {"trace_steps": 4}),
    ("a trace for c", lambda s, x: s.append_trace("c", {"n": 0}), {"traces": 1, "trace_steps": 1}),
    ("shrink trace_max: nothing until the next append",
        lambda s, x: setattr(s, "trace_max", 2), {}),
    ("the next append cuts that ring only", lambda s, x: s.append_trace("a", {"n": 9}),
        {"trace_steps": -3}),
    ("a full ring overwrites", lambda s, x: s.commit(x["a"], [], trace={"n": 10}), {}),
    ("a commit grows the other ring to 2", lambda s, x: s.commit(x["b"], [], trace={"n": 1}),
        {"trace_steps": 1}),
    ("ring of 1", lambda s, x: setattr(s, "trace_max", 1), {}),
    ("cut to 1", lambda s, x: s.append_trace("b", {"n": 2}), {"trace_steps": -1}),
    ("grow: unbounded", lambda s, x: setattr(s, "trace_max", None), {}),
    ("grow keeps what is held and adds", lambda s, x: s.append_trace("a", {"n": 11}),
        {"trace_steps": 1}),
    ("trace_max 0 is unbounded too", lambda s, x: setattr(s, "trace_max", 0), {}),
    ("appends pile up", lambda s, x: [s.append_trace("b", {"n": n}) for n in range(5)],
        {"trace_steps": 5}),
    ("forget a", lambda s, x: s.forget("a"),
        {"executions": -1, "timers": -2, "processed": -2, "traces": -1, "trace_steps": -3}),
    ("forget c (a saved one with a trace)", lambda s, x: s.forget("c"),
        {"executions": -1, "traces": -1, "trace_steps": -1}),
    ("forget an unknown id", lambda s, x: s.forget("zzz"), {}),
    ("a comes back", lambda s, x: s.commit(Execution(id="a"), [], "m1", [schedule("p", 1.0)],
        trace={"n": 0}),
        {"executions": 1, "timers": 1, "processed": 1, "traces": 1, "trace_steps": 1}),
    ("a failed commit changes nothing", lambda s, x: pytest.raises(
        TypeError, s.commit, x["b"], [(None, 1)], "m2", [schedule("p", "soon")]), {}),
]  # fmt: skip


def test_stats_follow_every_kind_of_operation(make_store: MakeStore) -> None:
    store = make_store()
    exes = {i: Execution(id=i) for i in ST_IDS}
    stats = check_stats(store, ST_IDS, ST_EVENTS)
    for what, step, delta in STEPS:
        step(store, exes)
        expect = {k: v + delta.get(k, 0) for k, v in stats.items()}
        assert store.stats() == expect, what
        stats = check_stats(store, ST_IDS, ST_EVENTS)


class Walk(NamedTuple):
    """The ids, event ids and timer paths a random walk draws from."""

    ids: list[Hashable]
    events: list[Hashable]
    paths: list[Hashable]


# Ids and paths of mixed types, and equal numbers (1 == 1.0) that are one key.
MIXED_WALK = Walk(
    ["a", "b", 1, ("t", 2), frozenset({"f"}), 2**70], ["m", 7, ("m", 2)], ["p", "q", ("r", 1), 3]
)
# The same walk in str, as every store takes it.
STR_WALK = Walk(["a", "b", "c", "d", "e", "f"], ["m", "n", "o"], ["p", "q", "r", "s"])


def random_operation(store: Any, rng: random.Random, walk: Walk) -> None:
    ids, events, paths = walk
    eid = rng.choice(ids)
    kind = rng.random()
    if kind < 0.35:
        exe = store.load(eid)
        if exe is None or rng.random() < 0.1:
            # a new object: a first write, or a replacement at the stored version
            exe = Execution(id=eid, version=exe.version if exe else rng.randrange(3))
        timers = [
            schedule(rng.choice(paths), float(rng.randrange(20)))
            if rng.random() < 0.6
            else cancel(rng.choice(paths))
            for _ in range(rng.randrange(4))
        ]
        store.commit(
            exe,
            [(rng.choice([None, *ids]), rng.random()) for _ in range(rng.randrange(3))],
            rng.choice([None, *events]),
            timers,
            [(rng.choice(ids), "r", {"n": n}) for n in range(rng.randrange(2))],
            {"k": rng.random()} if rng.random() < 0.5 else None,
        )
    elif kind < 0.45:
        pending = store.pending_outbox()
        seq = rng.choice(pending).seq if pending and rng.random() < 0.8 else rng.randrange(-2, 200)
        store.ack_outbox(seq)
    elif kind < 0.52:
        pending = store.pending_spawns()
        seq = rng.choice(pending).seq if pending and rng.random() < 0.8 else rng.randrange(-2, 200)
        store.ack_spawn(seq)
    elif kind < 0.65:
        due = store.due_timers(float(rng.randrange(20)))
        for e, path, fire_at in due:
            store.delete_timer(e, path, fire_at if rng.random() < 0.8 else fire_at + 1)
        if rng.random() < 0.3:
            store.delete_timer(eid, rng.choice(paths), float(rng.randrange(20)))
    elif kind < 0.8:
        store.append_trace(eid, {"k": rng.random()})
    elif kind < 0.88:
        store.trace_max = rng.choice([None, 0, 1, 2, 3, 5, 200])
    else:
        store.forget(eid)


def test_stats_stay_exact_through_a_random_walk(make_store: MakeStore) -> None:
    """Shorter than the walk of any ids below, and checked every other step: the views
    ``observed`` reads are ~40 queries on a durable store (or coroutine runs on an async
    one). The memory stores still take the long walk below, checked at every step."""
    store = make_store()
    rng = random.Random(20240611)
    steps = 400
    for n in range(steps):
        random_operation(store, rng, STR_WALK)
        if n % 2 or n == steps - 1:
            assert store.stats() == observed(store, *STR_WALK[:2]), f"after step {n}"


def test_stats_stay_exact_through_a_random_walk_of_any_ids(make_memory: MakeStore) -> None:
    """memory only: ids, event ids and paths of mixed hashable types (a durable store
    takes str)."""
    store = make_memory()
    rng = random.Random(20240611)
    for n in range(1500):
        random_operation(store, rng, MIXED_WALK)
        assert store.stats() == observed(store, *MIXED_WALK[:2]), f"after step {n}"


# --- costs ----------------------------------------------------------------------------
# Memory only: the costs of the memory store's own structures. A durable store's costs are
# its indexes', measured against database sizes in its own tests.


class CountingId:
    """An id that counts how often the store hashes or compares it."""

    calls = 0

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        CountingId.calls += 1
        return hash(self.n)

    def __eq__(self, other: object) -> bool:
        CountingId.calls += 1
        return isinstance(other, CountingId) and other.n == self.n


def fill_store(store: Any, ids: list[Any]) -> None:
    """Every execution holds a bit of everything: two marks, two timers, two steps."""
    for i, eid in enumerate(ids):
        store.commit(
            Execution(id=eid),
            [(None, i)],
            f"m{i}",
            [schedule("t", float(i)), schedule("u", 1e9)],
            [(i, "r", {})],
            {"s": 0},
        )
        store.commit(store.load(eid), [], f"n{i}", trace={"s": 1})  # fmt: skip


def test_forget_touches_no_other_execution(impl: Any) -> None:
    """memory only: ids of a class of one's own that count their hash and eq calls.
    Counted, not timed: ``forget`` must not hash or compare any other execution's id (a
    scan over the store would)."""
    store = impl.DictStore()
    ids = [CountingId(n) for n in range(2_000)]
    fill_store(store, ids)
    victim = CountingId(1234)  # equal to ids[1234], a different object
    CountingId.calls = 0
    store.forget(victim)
    # Each of the victim's own lookups may hash it and compare it with its stored twin.
    assert CountingId.calls <= 40, f"forget made {CountingId.calls} hash/eq calls"
    assert store.load(ids[1234]) is None
    assert store.stats()["executions"] == 1_999


def forget_cost(impl: Any, size: int, batch: int = 100, repeat: int = 5) -> tuple[float, float]:
    """Seconds per ``forget`` of a small execution, and per ``stats`` call, in a store of
    ``size`` executions (best of ``repeat``)."""
    store = impl.DictStore()
    ids = [f"e{i}" for i in range(size)]
    fill_store(store, ids)
    victims = random.Random(size).sample(ids, batch)
    best = math.inf
    for _ in range(repeat):
        start = timeit.default_timer()
        for eid in victims:
            store.forget(eid)
        best = min(best, timeit.default_timer() - start)
        fill_store(store, victims)
    assert store.stats()["executions"] == size
    stats = min(timeit.repeat(store.stats, number=200, repeat=repeat)) / 200
    return best / batch, stats


def test_forget_and_stats_cost_does_not_grow_with_the_store(impl: Any) -> None:
    """memory only: O(1) ``forget`` and ``stats`` of the memory store (a durable store's
    stats count rows). A 100x bigger store: an O(store) forget or stats would be ~100x
    slower; allow 8x."""
    forget_cost(impl, 200)  # warm-up
    small_forget, small_stats = forget_cost(impl, 200)
    large_forget, large_stats = forget_cost(impl, 20_000)
    assert large_forget < 8 * small_forget, (small_forget, large_forget)
    assert large_stats < 8 * small_stats, (small_stats, large_stats)
