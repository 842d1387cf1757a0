"""Random operation sequences, run side by side on a model of the specification, the pure
store and, for the ``compiled`` parameter, the compiled store too, each sync and async.

``Model`` is a plain reading of ``spec/dictstore.md`` and API.md, with none of the
stores' machinery: lists for the FIFOs, a dict for the timers, a sorted scan for
``due_timers``. Where the spec leaves it open it follows the package: ``fire_at`` is
stored as a float, and due timers come in ``(fire_at, arming order)`` order, where a
re-arm counts as a new arming. A small pool of ids, paths and times makes collisions
(re-arms, stale saves, duplicate marks) common.

Profiles (``conftest.py``): ``HAREL_STORE_FUZZ=deep`` runs many more and longer sequences.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, ClassVar

import pytest
from _helpers import AsyncAsSync, drive, snapshot
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from harel_store import Execution, OutboxEntry, SpawnEntry, StoreConflict, TimerOp

IDS: tuple[Any, ...] = ("e1", "e2", ("e", 3))
EVENTS: tuple[Any, ...] = ("v1", "v2", 3)
PATHS: tuple[Any, ...] = ("p", "q", ("r", 1))
TIMES = st.sampled_from([0.0, 1.0, 2.5]) | st.integers(1, 2)
NOWS = TIMES | st.sampled_from([-math.inf, math.inf, math.nan])
CHURN_TIMES = (0.0, 1, 1.0, 2.5, 2)
TRACE_MAXES = st.sampled_from([None, 0, 1, 2, 3, 200])


class Model:
    """The specification, read plainly."""

    def __init__(self, *, trace_max: int | None = 200) -> None:
        self.by_id: dict[Any, Any] = {}
        self.outbox: list[OutboxEntry] = []
        self.processed: set[tuple[Any, Any]] = set()
        self.timers: dict[tuple[Any, Any], tuple[float, int]] = {}  # key -> (fire_at, arming)
        self.armings = 0
        self.spawns: list[SpawnEntry] = []
        self.trace: dict[Any, list[dict[Any, Any]]] = {}
        self.trace_idx: dict[Any, int] = {}
        self.trace_max = trace_max
        self.seq = 0
        self.spawn_seq = 0

    def load(self, execution_id: Any) -> Any:
        return self.by_id.get(execution_id)

    def save(self, exe: Any) -> None:
        prev = self.by_id.get(exe.id)
        if prev is not None and prev is not exe and prev.version != exe.version:
            raise StoreConflict(exe.id, expected=exe.version, found=prev.version)
        exe.version += 1
        self.by_id[exe.id] = exe

    def commit(
        self,
        exe: Any,
        emits: Iterable[tuple[Any, Any]],
        processed_event_id: Any = None,
        timers: Iterable[TimerOp] = (),
        spawns: Iterable[tuple[Any, Any, Mapping[Any, Any]]] = (),
        trace: Mapping[str, Any] | None = None,
    ) -> None:
        self.save(exe)
        for target_id, event in emits:
            self.seq += 1
            self.outbox.append(OutboxEntry(self.seq, target_id, event))
        if processed_event_id is not None:
            self.processed.add((exe.id, processed_event_id))
        for op in timers:
            if op.action == "schedule":
                assert op.fire_at is not None
                self.armings += 1
                self.timers[(exe.id, op.path)] = (float(op.fire_at), self.armings)
            else:
                self.timers.pop((exe.id, op.path), None)
        for child_id, root_path, context in spawns:
            self.spawn_seq += 1
            self.spawns.append(
                SpawnEntry(self.spawn_seq, exe.id, child_id, root_path, dict(context))
            )
        if trace is not None:
            self._record_trace(exe.id, trace)

    def is_processed(self, execution_id: Any, event_id: Any) -> bool:
        return (execution_id, event_id) in self.processed

    def pending_outbox(self) -> list[OutboxEntry]:
        return list(self.outbox)

    def ack_outbox(self, seq: int) -> None:
        self.outbox = [e for e in self.outbox if e.seq != seq]

    def pending_spawns(self) -> list[SpawnEntry]:
        return list(self.spawns)

    def ack_spawn(self, seq: int) -> None:
        self.spawns = [s for s in self.spawns if s.seq != seq]

    def due_timers(self, now: float) -> list[tuple[Any, Any, float]]:
        due = sorted((at, n, key) for key, (at, n) in self.timers.items() if at <= now)
        return [(eid, path, at) for at, _, (eid, path) in due]

    def delete_timer(self, execution_id: Any, path: Any, fire_at: float) -> None:
        armed = self.timers.get((execution_id, path))
        if armed is not None and armed[0] == fire_at:
            del self.timers[(execution_id, path)]

    def _record_trace(self, execution_id: Any, entry: Any) -> None:
        idx = self.trace_idx.get(execution_id, 0)
        self.trace_idx[execution_id] = idx + 1
        steps = self.trace.setdefault(execution_id, [])
        steps.append({**entry, "index": entry.get("index", idx)})
        if self.trace_max and len(steps) > self.trace_max:
            del steps[: len(steps) - self.trace_max]

    def append_trace(self, execution_id: Any, entry: Any) -> None:
        self._record_trace(execution_id, entry)

    def read_trace(self, execution_id: Any) -> list[dict[Any, Any]]:
        return list(self.trace.get(execution_id, []))

    def stats(self) -> dict[str, int]:
        return {
            "executions": len(self.by_id),
            "outbox": len(self.outbox),
            "spawns": len(self.spawns),
            "timers": len(self.timers),
            "processed": len(self.processed),
            "traces": len(self.trace),
            "trace_steps": sum(map(len, self.trace.values())),
        }


def reshaped(items: list[Any], shape: str) -> Iterable[Any]:
    """``items`` as a list, a tuple or a one-shot iterator."""
    if shape == "iter":
        return iter(items)
    return tuple(items) if shape == "tuple" else list(items)


# Three schedules to a cancel, so timers pile up and re-arms are common.
timer_ops = st.tuples(
    st.sampled_from(["schedule", "schedule", "schedule", "cancel"]), st.sampled_from(PATHS), TIMES
).map(lambda t: TimerOp._make((t[0], t[1], t[2] if t[0] == "schedule" else None)))
trace_entries = st.fixed_dictionaries(
    {"n": st.integers(0, 9)}, optional={"index": st.integers(0, 99) | st.just("x")}
)
emit_lists = st.lists(st.tuples(st.sampled_from((None, *IDS)), st.sampled_from("ab")), max_size=3)
spawn_lists = st.lists(
    st.tuples(
        st.sampled_from(("c1", "c2")),
        st.sampled_from(("r", ("r", "s"))),
        st.dictionaries(st.sampled_from("xy"), st.integers(0, 3), max_size=2),
    ),
    max_size=2,
)
# Each is appended to good arguments; every store must refuse the commit whole.
BAD_ARGS = [
    {"emits": [(None, "ok"), ("e1",)]},
    {"emits": [(None, "ok"), "ab"]},
    {"processed_event_id": ["v1"]},
    {"timers": [TimerOp("schedule", "q", 2.0), TimerOp("schedule", "p", math.nan)]},
    {"timers": [TimerOp("cancel", "q"), TimerOp._make(("reset", "p", 1.0))]},
    {"timers": [TimerOp("schedule", "q", 2.0), ("schedule", "p", 1.0)]},
    # One op alone takes its own fast path in the pure store.
    {"timers": [TimerOp("schedule", "p", math.inf)]},
    {"timers": (TimerOp._make(("reset", "p", 1.0)),)},
    {"timers": [TimerOp("schedule", ["p"], 1.0)]},
    {"timers": [("schedule", "p", 1.0)]},
    {"spawns": [("c1", "r", {}), ("c2", "r", [("x", 1)])]},
    {"trace": [("n", 1)]},
]


Args = Callable[[int], tuple[Any, ...]]  # the arguments for store i


def same(*args: Any) -> Args:
    """The same arguments for every store."""
    return lambda i: args


class StoreMachine(RuleBasedStateMachine):
    """Subclassed per test with ``factories``: the model first, then the stores."""

    factories: ClassVar[dict[str, Callable[..., Any]]] = {}
    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        self.names = list(self.factories)
        self.stores: list[Any] = []
        self.objects: list[list[Any]] = []  # per handle, one execution object per store

    @property
    def model(self) -> Model:
        return self.stores[0]  # type: ignore[no-any-return]

    def outcome(self, i: int, func: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        try:
            result = func(*args)
        except StoreConflict as err:
            return ("conflict", err.execution_id, err.expected, err.found)
        return ("ok", self.portable(i, result))

    def portable(self, i: int, value: Any) -> Any:
        """``value`` with execution objects replaced by their handle, comparable across stores."""
        if isinstance(value, Execution):
            return ("handle", self.identify(i, value), value.version)
        return value

    def identify(self, i: int, exe: Any) -> int:
        return next(h for h, objs in enumerate(self.objects) if objs[i] is exe)

    def with_exe(self, h: int, *rest: Any) -> Args:
        """Arguments led by the execution object of handle ``h`` for each store."""
        return lambda i: (self.objects[h][i], *rest)

    def apply(self, method: str, args: Args) -> Any:
        """Call ``method`` on every store with ``args(i)``; all must agree."""
        results = [
            self.outcome(i, getattr(store, method), args(i)) for i, store in enumerate(self.stores)
        ]
        for name, result in zip(self.names[1:], results[1:]):
            assert result == results[0], (
                f"{method}: {name} gave {result!r}, the model {results[0]!r}"
            )
        return results[0]

    @initialize(target=handles, trace_max=TRACE_MAXES)
    def create_stores(self, trace_max: int | None) -> Any:
        """The stores, and a first object for each id."""
        self.stores = [factory(trace_max=trace_max) for factory in self.factories.values()]
        return multiple(*(self.new_execution(eid, 0) for eid in IDS))

    @rule(target=handles, eid=st.sampled_from(IDS), version=st.none() | st.integers(0, 3))
    def new_execution(self, eid: Any, version: int | None) -> int:
        """A new object for ``eid``: at the stored version (``None``), or at another."""
        if version is None:
            stored = self.model.load(eid)
            version = 0 if stored is None else stored.version
        self.objects.append([Execution(id=eid, version=version) for _ in self.stores])
        return len(self.objects) - 1

    @rule(h=handles, version=st.integers(0, 4))
    def set_version(self, h: int, version: int) -> None:
        for exe in self.objects[h]:
            exe.version = version

    @rule(h=handles)
    def save(self, h: int) -> None:
        self.apply("save", self.with_exe(h))

    @rule(
        h=handles,
        emits=emit_lists,
        processed=st.none() | st.sampled_from(EVENTS),
        timers=st.lists(timer_ops, max_size=4),
        spawns=spawn_lists,
        trace=st.none() | trace_entries,
        shape=st.sampled_from(["list", "tuple", "iter"]),
    )
    def commit(
        self,
        h: int,
        emits: list[tuple[Any, str]],
        processed: Any,
        timers: list[TimerOp],
        spawns: list[tuple[str, Any, dict[str, int]]],
        trace: dict[str, Any] | None,
        shape: str,
    ) -> None:
        self.apply(
            "commit",
            lambda i: (
                self.objects[h][i],
                reshaped(emits, shape),
                processed,
                reshaped(timers, shape),
                reshaped(spawns, shape),
                trace,
            ),
        )
        # Every store copied these; a store that kept a reference diverges from the model.
        for _, _, context in spawns:
            context["late"] = True
        if trace is not None:
            trace["late"] = True

    @rule(h=handles, timers=st.lists(timer_ops, min_size=1, max_size=3))
    def arm(self, h: int, timers: list[TimerOp]) -> None:
        """A commit that only schedules and cancels: timers are where the stores differ most
        from the specification's dict."""
        self.apply("commit", self.with_exe(h, [], None, timers))

    @rule(h=handles, bad=st.sampled_from(BAD_ARGS))
    def refused_commit(self, h: int, bad: dict[str, Any]) -> None:
        args = {
            "emits": [(None, "ok")],
            "processed_event_id": "v2",
            "timers": [TimerOp("schedule", "p", 1.0)],
            "spawns": [("c1", "r", {})],
            "trace": {"n": 0},
            **bad,
        }
        refusals = set()
        for i, store in enumerate(self.stores[1:], start=1):
            with pytest.raises((TypeError, ValueError, StoreConflict)) as info:
                store.commit(self.objects[h][i], **args)
            refusals.add(info.type)
        assert len(refusals) == 1, f"the stores refused with different errors: {refusals}"

    @rule(data=st.data(), fifo=st.sampled_from(["outbox", "spawns"]))
    def ack(self, data: st.DataObject, fifo: str) -> None:
        """Ack some pending seqs in any order, with unknown and already-acked ones."""
        if fifo == "outbox":
            seqs, last = [e.seq for e in self.model.outbox], self.model.seq
        else:
            seqs, last = [s.seq for s in self.model.spawns], self.model.spawn_seq
        rng: random.Random = data.draw(st.randoms(use_true_random=False), label="order")
        rng.shuffle(seqs)
        del seqs[data.draw(st.integers(0, len(seqs)), label="count") :]
        seqs += data.draw(st.lists(st.integers(-1, last + 2), max_size=2), label="others")
        method = "ack_outbox" if fifo == "outbox" else "ack_spawn"
        for seq in seqs:
            self.apply(method, same(seq))

    @rule(h=handles, n=st.integers(70, 150))
    def bulk_commit(self, h: int, n: int) -> None:
        """Enough entries that acking them reaches the stores' FIFO compaction."""
        emits = [(None, k) for k in range(n)]
        spawns: list[tuple[str, str, dict[str, Any]]] = [(f"c{k}", "r", {}) for k in range(n)]
        self.apply("commit", self.with_exe(h, emits, None, (), spawns))

    @rule(h=handles, path=st.sampled_from(PATHS), n=st.integers(66, 90), step=st.integers(0, 3))
    def churn_timer(self, h: int, path: Any, n: int, step: int) -> None:
        """Re-arm one timer ``n`` times, cancelling it now and then: enough dead entries
        for the stores to compact their timer structures."""
        for k in range(n):
            at = CHURN_TIMES[(k * step) % len(CHURN_TIMES)]
            op = TimerOp("cancel", path) if k % 7 == 6 else TimerOp("schedule", path, at)
            self.apply("commit", self.with_exe(h, [], None, [op]))

    @rule(now=NOWS)
    def due_timers(self, now: float) -> None:
        self.apply("due_timers", same(now))
        for name, store in zip(self.names, self.stores):
            assert all(type(at) is float for _, _, at in store.due_timers(now)), name

    @rule(data=st.data())
    def delete_timer(self, data: st.DataObject) -> None:
        anything = st.tuples(st.sampled_from(IDS), st.sampled_from(PATHS), TIMES)
        armed = self.model.due_timers(math.inf)
        if armed:
            fired = st.sampled_from(armed)
            later = fired.map(lambda t: (t[0], t[1], t[2] + 1.5))
            anything = fired | later | anything
        eid, path, fire_at = data.draw(anything, label="timer")
        self.apply("delete_timer", same(eid, path, fire_at))

    @rule(
        eid=st.sampled_from(IDS),
        entry=trace_entries,
        method=st.sampled_from(["append_trace", "_record_trace"]),
    )
    def append_trace(self, eid: Any, entry: dict[str, Any], method: str) -> None:
        self.apply(method, same(eid, entry))
        entry["late"] = True

    @rule(value=TRACE_MAXES)
    def set_trace_max(self, value: int | None) -> None:
        for store in self.stores:
            store.trace_max = value

    def compare_snapshots(self, *, timers: bool) -> None:
        snaps = [
            snapshot(store, IDS, EVENTS, partial(self.identify, i), deep=False, timers=timers)
            for i, store in enumerate(self.stores)
        ]
        for name, snap in zip(self.names[1:], snaps[1:]):
            assert snap == snaps[0], f"{name} differs from the model"
        for objs in self.objects:
            assert len({exe.version for exe in objs}) == 1, "execution versions differ"

    @invariant()
    def all_show_the_same(self) -> None:
        """Everything but the timers, after every step: listing them is a sweep, which
        would move every timer armed since the last sweep into the stores' heaps before
        the next re-arm could find it waiting."""
        self.compare_snapshots(timers=False)

    @rule()
    def all_show_the_same_timers(self) -> None:
        self.compare_snapshots(timers=True)

    def teardown(self) -> None:
        if self.stores:
            self.compare_snapshots(timers=True)


def test_stores_behave_like_the_model(impl: Any, pure_impl: Any) -> None:
    factories: dict[str, Callable[..., Any]] = {"model": Model, "pure": pure_impl.DictStore}
    factories[impl.name] = impl.DictStore
    factories[f"{impl.name}-async"] = lambda **kw: AsyncAsSync(impl.AsyncDictStore(**kw), drive)

    class Machine(StoreMachine):
        pass

    Machine.factories = factories
    run_state_machine_as_test(Machine, settings=settings())
