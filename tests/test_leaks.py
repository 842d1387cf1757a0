"""No leaks (the issue, point 2).

A long mixed workload (commits with emits, timers, spawns and traces; acks; timer sweeps;
refused commits; ``trace_max`` changes; forget) runs in rounds that each end with an
empty store. After a warm-up, memory must come back to its baseline: ``tracemalloc`` and
``sys.getallocatedblocks`` see the compiled store too, as Cython objects use the Python
allocator. And every object handed to the store (events, contexts, trace values,
executions, ids) must get its reference count back once the store lets go of it,
including when the store refuses a call.

``HAREL_STORE_FUZZ=deep`` runs ten times more rounds.
"""

from __future__ import annotations

import gc
import math
import os
import random
import sys
import tracemalloc
from collections.abc import Callable, Hashable
from typing import Any

import pytest
from _helpers import AsyncAsSync, drive

from harel_store import Execution, StoreConflict, TimerOp

DEEP = os.environ.get("HAREL_STORE_FUZZ", "").strip() == "deep"
EMPTY = {"executions": 0, "outbox": 0, "spawns": 0, "timers": 0, "processed": 0,
         "traces": 0, "trace_steps": 0}  # fmt: skip


def schedule(path: Any, fire_at: float) -> TimerOp:
    return TimerOp("schedule", path, fire_at)


class Payload:
    """Something the caller hands over and the store must hold, then release."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


def ids(n: int) -> list[Hashable]:
    """Ids of mixed types, the same every round."""
    return [f"e{i}" if i % 3 == 0 else i if i % 3 == 1 else ("e", i) for i in range(n)]


def one_round(store: Any, r: int, eids: list[Hashable]) -> int:
    """Fill the store, drain it, forget everything; return the operations made."""
    rng = random.Random(r)
    ops = 0
    now = float(r)
    store.trace_max = (3, 200, None)[r % 3]
    exes = [Execution(id=eid, context={"p": Payload(r)}) for eid in eids]
    for i, exe in enumerate(exes):
        store.commit(
            exe,
            [(eids[i - 1], Payload(i)), (None, Payload(i))],
            ("ev", i),
            [schedule("t", now + i % 7), schedule(("u", i % 2), 1e9 + i)],
            [(("kid", i), "region", {"ctx": Payload(i)})],
            {"step": Payload(i)},
        )
        store.commit(
            exe,
            [(None, Payload(i))],
            f"again-{i}",
            [schedule("t", now + 3.0), TimerOp("cancel", ("u", i % 2))],
            trace={"step": Payload(i), "i": i},
        )
        ops += 2
        if i % 2:
            store.append_trace(exe.id, {"extra": Payload(i)})
            ops += 1
        if i % 5 == 0:  # refused commits: a stale copy, and a bad timer after good items
            stale = Execution(id=exe.id, version=exe.version - 1)
            with pytest.raises(StoreConflict):
                store.commit(stale, [(None, Payload(i))], trace={"x": Payload(i)})
            with pytest.raises(TypeError):
                store.commit(exe, [(None, Payload(i))], None, [schedule("t", 1.0), "bad"],
                             [("k", "r", {"c": Payload(i)})])  # fmt: skip
            ops += 2
    outbox = store.pending_outbox()
    rng.shuffle(outbox)
    for entry in outbox:
        store.ack_outbox(entry.seq)
    for spawn in reversed(store.pending_spawns()):
        store.ack_spawn(spawn.seq)
    store.ack_outbox(1)  # long gone
    ops += len(outbox) + len(exes) + 3
    for eid, path, fire_at in store.due_timers(now + 5.0):
        store.delete_timer(eid, path, fire_at + 1.0)  # a stale sweep: a no-op
        store.delete_timer(eid, path, fire_at)
        ops += 3
    for exe in exes:
        store.forget(exe.id)
        ops += 1
    assert store.pending_outbox() == [] and store.pending_spawns() == []
    assert store.due_timers(math.inf) == []
    assert store.stats() == EMPTY
    return ops + 4


@pytest.fixture(params=["sync", "async"])
def make(request: pytest.FixtureRequest, impl: Any) -> Callable[[], Any]:
    if request.param == "sync":
        return impl.DictStore
    return lambda: AsyncAsSync(impl.AsyncDictStore(), drive)


def settle() -> None:
    for _ in range(3):
        gc.collect()


def traced_growth(
    store: Any, eids: list[Hashable], first: int, rounds: int
) -> tuple[int, int, str]:
    """Blocks and bytes still allocated after ``rounds`` more rounds than after one, as
    ``tracemalloc`` sees them, and where they were allocated."""
    tracemalloc.start()
    try:
        one_round(store, first, eids)
        settle()
        before = tracemalloc.take_snapshot()
        for r in range(first + 1, first + 1 + rounds):
            one_round(store, r, eids)
        settle()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    diff = after.compare_to(before, "lineno")
    blocks = sum(stat.count_diff for stat in diff)
    grown = sum(stat.size_diff for stat in diff)
    return blocks, grown, "\n".join(str(stat) for stat in diff[:5])


def test_a_long_workload_comes_back_to_its_memory_baseline(make: Callable[[], Any]) -> None:
    store = make()
    eids = ids(400)
    rounds = 400 if DEEP else 40
    for r in range(4):  # warm-up: the store's tables and free lists reach their size
        one_round(store, r, eids)
    settle()
    blocks = sys.getallocatedblocks()
    objects = len(gc.get_objects())
    ops = sum(one_round(store, r, eids) for r in range(4, 4 + rounds))
    settle()
    assert ops > (1_000_000 if DEEP else 150_000)
    # A leak of one object per 200 operations would show as ~1000 blocks.
    assert sys.getallocatedblocks() - blocks < 750, f"after {ops} operations"
    assert len(gc.get_objects()) - objects < 100, f"after {ops} operations"
    # The same, traced: tracemalloc is slow, so a few smaller rounds (~6000 operations).
    # A dict of the store may move to a new table meanwhile: a block, not a leak.
    blocks, grown, where = traced_growth(store, eids[:150], 4 + rounds, 4)
    assert blocks < 30 and grown < 128 * 1024, f"{blocks} blocks, {grown} bytes more:\n{where}"


class Tracked:
    """Objects handed to the store, each held here and nowhere else in the test: ``t[name]``
    reaches one, ``t(name, obj)`` registers it and hands it on."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        self.baseline: dict[str, int] = {}

    def __call__(self, name: str, obj: Any) -> Any:
        self.objects[name] = obj
        # Less the caller's own reference, which is gone once the call it makes is over.
        self.baseline[name] = sys.getrefcount(obj) - 1
        return obj

    def __getitem__(self, name: str) -> Any:
        return self.objects[name]

    def held(self, collect: bool = True) -> dict[str, int]:
        """How many more references each object has than when it was handed over."""
        if collect:
            gc.collect()
        now = {
            name: sys.getrefcount(obj) - self.baseline[name] for name, obj in self.objects.items()
        }
        return {name: extra for name, extra in now.items() if extra}


class Eid:
    """An id the store must not keep once it forgot the execution."""

    def __hash__(self) -> int:
        return 12345

    def __eq__(self, other: object) -> bool:
        return other is self


def test_references_are_released_when_the_store_lets_go(make: Callable[[], Any]) -> None:
    store = make()
    t = Tracked()
    t("exe", Execution(id=Eid()))
    t("eid", t["exe"].id)  # counted from here: the execution holds it
    t("context", {"v": Payload(0)})
    t("context value", t["context"]["v"])
    t("trace", {"v": Payload(1)})
    t("trace value", t["trace"]["v"])
    store.commit(
        t["exe"],
        [(t("target", Eid()), t("event", Payload(2))), (None, t("untargeted", Payload(3)))],
        t("processed id", Eid()),
        [schedule("p", 1.0), schedule("q", 2.0)],
        [(t("child id", Eid()), t("root path", Payload(4)), t["context"])],
        t["trace"],
    )
    store.append_trace(t["eid"], {"w": t("appended value", Payload(5))})
    held = t.held()
    # The store copies the context and the trace; it holds what is inside them.
    assert "context" not in held and "trace" not in held
    assert held.keys() == {"eid", "exe", "target", "context value", "trace value", "event",
                           "untargeted", "processed id", "child id", "root path",
                           "appended value"}  # fmt: skip

    store.ack_outbox(2)
    store.ack_outbox(1)
    store.ack_spawn(1)
    assert t.held().keys() == {"eid", "exe", "trace value", "processed id", "appended value"}
    for timer in store.due_timers(math.inf):
        store.delete_timer(*timer)
    del timer
    store.forget(t["eid"])
    assert t.held() == {}
    assert store.stats() == EMPTY


def test_a_trimmed_trace_step_is_released(make: Callable[[], Any]) -> None:
    store = make()
    store.trace_max = 2
    t = Tracked()
    for n in range(5):
        store.append_trace("e", {"v": t(f"step {n}", Payload(n))})
    assert t.held().keys() == {"step 3", "step 4"}
    store.trace_max = 1
    store.append_trace("e", {"v": t("step 5", Payload(5))})
    assert t.held().keys() == {"step 5"}


def test_an_execution_replaced_by_another_object_is_released(make: Callable[[], Any]) -> None:
    store = make()
    t = Tracked()
    store.save(t("old", Execution(id="e")))
    store.save(Execution(id="e", version=t["old"].version))
    assert t.held() == {}


def refused_calls(store: Any, t: Tracked) -> list[tuple[type[BaseException], Callable[[], Any]]]:
    """Calls the store must refuse, each handing it fresh tracked objects."""
    stored = store.load("e")

    def exe() -> Any:
        return t("stale exe", Execution(id="e", version=stored.version + 5))

    def emits() -> list[tuple[Any, Any]]:
        return [(t("target", Eid()), t("event", Payload(0)))]

    def spawns() -> list[tuple[Any, Any, Any]]:
        return [(t("child", Eid()), t("root", Payload(1)), {"c": t("ctx value", Payload(2))})]

    def trace() -> dict[str, Any]:
        return {"v": t("trace value", Payload(3))}

    def broken(items: list[Any]) -> Any:
        yield from items
        raise KeyError("broken")

    return [
        (StoreConflict, lambda: store.commit(exe(), emits(), t("pid", Eid()), [schedule("p", 1.0)],
                                             spawns(), trace())),
        (TypeError, lambda: store.commit(stored, emits(), None, [schedule("p", 1.0), "bad"],
                                         spawns(), trace())),
        (ValueError, lambda: store.commit(stored, emits(), None, [schedule("p", math.nan)],
                                          spawns(), trace())),
        (TypeError, lambda: store.commit(stored, emits(), None, (), [*spawns(), ("x",)], trace())),
        (TypeError, lambda: store.commit(stored, [*emits(), "bad"], None, (), spawns(), trace())),
        (TypeError, lambda: store.commit(stored, emits(), None, (), spawns(), [("k", 1)])),
        (KeyError, lambda: store.commit(stored, broken(emits()), None, (), spawns(), trace())),
        (KeyError, lambda: store.commit(stored, emits(), None, broken([schedule("p", 1.0)]))),
        (KeyError, lambda: store.commit(stored, emits(), None, (), broken(spawns()), trace())),
        (TypeError, lambda: store.commit(stored, emits(), [t("unhashable", Payload(4))])),
        (TypeError, lambda: store.append_trace("e", [("v", t("pair value", Payload(5)))])),
        (TypeError, lambda: store.ack_outbox(t("float seq", 1.5))),
        # built at run time: a folded constant may be immortal (3.12+), its count never drops
        (TypeError, lambda: store.due_timers(t("str now", "".join(["x"] * 40)))),
        (TypeError, lambda: setattr(store, "trace_max", t("float max", 2.5))),
    ]  # fmt: skip


def test_refused_calls_leak_nothing(make: Callable[[], Any]) -> None:
    store = make()
    store.commit(Execution(id="e"), [(None, "kept")], "m", [schedule("p", 1.0)],
                 [("k", "r", {})], {"s": 0})  # fmt: skip
    stats = store.stats()

    def refuse_all(t: Tracked) -> None:
        for error, call in refused_calls(store, t):
            try:
                call()
            except error:
                pass  # no `as`: nothing here keeps the traceback alive
            else:
                raise AssertionError(f"not refused: {error.__name__}")

    for _ in range(3):  # warm-up: error formatting and caches
        refuse_all(Tracked())
    settle()
    blocks = sys.getallocatedblocks()
    for _ in range(500):
        t = Tracked()
        refuse_all(t)
        assert t.held(collect=False) == {}, "a refused call kept a reference"
    del t
    settle()
    assert sys.getallocatedblocks() - blocks < 200
    assert store.stats() == stats


def test_timer_paths_are_not_held_without_bound(make: Callable[[], Any]) -> None:
    """A disarmed timer may keep its path until the store tidies its timers, but the
    references must not pile up with churn."""
    store = make()
    path = Payload(0)
    base = sys.getrefcount(path)
    for n in range(5_000):
        exe = store.load(n % 50) or Execution(id=n % 50)
        store.commit(exe, [], None, [schedule(path, float(n % 17))])
        if n % 3 == 0:
            store.delete_timer(exe.id, path, float(n % 17))
        if n % 7 == 0:
            store.forget(exe.id)
    for n in range(50):
        store.forget(n)
    assert store.stats()["timers"] == 0
    assert sys.getrefcount(path) - base < 200
