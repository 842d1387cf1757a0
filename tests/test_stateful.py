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
        if math.isnan(now):
            raise ValueError("now must be a number, got nan")  # as every store refuses it
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
        if math.isnan(now):  # refused by every store, as by claim_due_timers
            for name, store in zip(self.names, self.stores):
                with pytest.raises(ValueError, match="now"):
                    store.due_timers(now)
                    raise AssertionError(f"{name}: due_timers(nan) was not refused")
            return
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


# --- The protocol of DURABLE.md (issue 11): commit ids, writer epochs, claims ----------


def _protocol_errors() -> tuple[type[Exception], type[Exception]]:
    import harel_store

    return harel_store.IdempotencyConflict, harel_store.StaleWriter


class FakeClock:
    """The stores' lease clock, moved only by the machine. Claims happen at whole
    seconds and leases end at half seconds, so no claim falls on the end of a lease."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _check_epoch(epoch: Any) -> None:
    if epoch is None:
        return
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise TypeError(f"epoch must be an int, got {type(epoch).__name__}")
    if epoch < 0:
        raise ValueError(f"epoch must be at least 0, got {epoch}")


def _check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, got {type(limit).__name__}")
    if limit < 0:
        raise ValueError(f"limit must be at least 0, got {limit}")
    return limit


def _check_seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    if math.isnan(value):
        raise ValueError(f"{what} must be a number, got nan")
    return float(value)


class ProtocolModel(Model):
    """The model with what DURABLE.md adds for every store, read as plainly: a dict of
    commit ids with the body each was handed and the version it produced, a dict of
    epochs, and per FIFO entry or armed timer the clock time its lease ends. A timer's
    lease belongs to one arming: a re-arm is a fresh timer."""

    preserves_identity = True
    durable = False

    def __init__(
        self, *, trace_max: int | None = 200, clock: Callable[[], float] | None = None
    ) -> None:
        super().__init__(trace_max=trace_max)
        assert clock is not None, "the model needs the machine's clock"
        self.clock = clock
        self.commit_ids: dict[tuple[Any, str], tuple[Any, int]] = {}
        self.epochs: dict[Any, int] = {}
        self.outbox_leases: dict[int, float] = {}
        self.spawn_leases: dict[int, float] = {}
        self.timer_leases: dict[tuple[Any, Any], tuple[int, float]] = {}  # key -> (arming, end)

    def close(self) -> None:
        pass

    def save(self, exe: Any, *, epoch: int | None = None) -> None:
        _check_epoch(epoch)
        self._fence(exe.id, epoch)
        super().save(exe)
        self._claim_epoch(exe.id, epoch)

    def commit(  # type: ignore[override]
        self,
        exe: Any,
        emits: Iterable[tuple[Any, Any]],
        processed_event_id: Any = None,
        timers: Iterable[TimerOp] = (),
        spawns: Iterable[tuple[Any, Any, Mapping[Any, Any]]] = (),
        trace: Mapping[str, Any] | None = None,
        *,
        commit_id: str | None = None,
        epoch: int | None = None,
    ) -> None:
        if commit_id is not None and not isinstance(commit_id, str):
            raise TypeError(f"commit_id must be a str, got {type(commit_id).__name__}")
        _check_epoch(epoch)
        emits, timers, spawns = list(emits), list(timers), list(spawns)
        body = (
            tuple((target, event) for target, event in emits),
            processed_event_id,
            tuple(timers),
            tuple((child, root, dict(context)) for child, root, context in spawns),
            None if trace is None else dict(trace),
        )
        if commit_id is not None and (exe.id, commit_id) in self.commit_ids:
            first, version = self.commit_ids[(exe.id, commit_id)]
            if first != body:
                raise _protocol_errors()[0](exe.id, commit_id)
            if self.by_id.get(exe.id) is not exe:
                exe.version = version
            return
        self._fence(exe.id, epoch)
        super().commit(exe, emits, processed_event_id, timers, spawns, trace)
        self._claim_epoch(exe.id, epoch)
        if commit_id is not None:
            self.commit_ids[(exe.id, commit_id)] = (body, exe.version)

    def _fence(self, execution_id: Any, epoch: int | None) -> None:
        held = self.epochs.get(execution_id)
        if epoch is not None and held is not None and held > epoch:
            raise _protocol_errors()[1](execution_id, epoch, held)

    def _claim_epoch(self, execution_id: Any, epoch: int | None) -> None:
        if epoch is not None:
            self.epochs[execution_id] = max(epoch, self.epochs.get(execution_id, epoch))

    def _claim(self, items: list[Any], leases: dict[int, float], limit: Any, lease: Any) -> Any:
        limit = _check_limit(limit)
        lease = _check_seconds(lease, "lease")
        if lease < 0 or math.isinf(lease):
            raise ValueError(f"lease must be finite and at least 0, got {lease}")
        now, claimed = self.clock(), []
        for item in items:
            if len(claimed) >= limit:
                break
            if leases.get(item.seq, -math.inf) <= now:
                leases[item.seq] = now + lease
                claimed.append(item)
        return claimed

    def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        return self._claim(self.outbox, self.outbox_leases, limit, lease)  # type: ignore[no-any-return]

    def claim_spawns(self, limit: int = 100, *, lease: float = 30.0) -> list[SpawnEntry]:
        return self._claim(self.spawns, self.spawn_leases, limit, lease)  # type: ignore[no-any-return]

    def claim_due_timers(
        self, now: float, limit: int = 100, *, lease: float = 30.0
    ) -> list[tuple[Any, Any, float]]:
        now = _check_seconds(now, "now")
        limit = _check_limit(limit)
        lease = _check_seconds(lease, "lease")
        if lease < 0 or math.isinf(lease):
            raise ValueError(f"lease must be finite and at least 0, got {lease}")
        clock, claimed = self.clock(), []
        for at, arming, key in sorted((at, n, key) for key, (at, n) in self.timers.items()):
            if at > now or len(claimed) >= limit:
                break
            held = self.timer_leases.get(key)
            if held is None or held[0] != arming or held[1] <= clock:
                self.timer_leases[key] = (arming, clock + lease)
                claimed.append((*key, at))
        return claimed

    def ack_outbox(self, seq: int) -> None:
        super().ack_outbox(seq)
        self.outbox_leases.pop(seq, None)

    def ack_spawn(self, seq: int) -> None:
        super().ack_spawn(seq)
        self.spawn_leases.pop(seq, None)

    def forget(self, execution_id: Any) -> None:
        """Drop the execution, its marks, timers, trace (with its index), commit ids and
        epoch; pending outbox and spawn entries stay, owed to a relay."""
        self.by_id.pop(execution_id, None)
        self.processed = {(e, v) for e, v in self.processed if e != execution_id}
        self.timers = {key: at for key, at in self.timers.items() if key[0] != execution_id}
        self.trace.pop(execution_id, None)
        self.trace_idx.pop(execution_id, None)
        self.commit_ids = {k: v for k, v in self.commit_ids.items() if k[0] != execution_id}
        self.epochs.pop(execution_id, None)


COMMIT_IDS = ("k1", "k2", "k3")
EPOCHS = st.none() | st.integers(0, 3)
LEASES = st.sampled_from([0.5, 1.5, 2.5, 30.5])
LIMITS = st.integers(0, 4) | st.just(100)
# Each is refused by every store, whatever the call around it, with nothing written or
# leased: (method, keyword arguments).
BAD_PROTOCOL_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("commit", (), {"commit_id": 1}),
    ("commit", (), {"commit_id": b"k1"}),
    ("commit", (), {"commit_id": ["k1"]}),
    ("commit", (), {"epoch": True}),
    ("commit", (), {"epoch": 1.0}),
    ("commit", (), {"epoch": -1}),
    ("commit", (), {"commit_id": "k1", "epoch": -1}),
    ("save", (), {"epoch": False}),
    ("save", (), {"epoch": -2}),
    ("claim_outbox", (), {"limit": -1}),
    ("claim_outbox", (True,), {}),
    ("claim_outbox", (), {"lease": -1.0}),
    ("claim_spawns", (), {"lease": math.nan}),
    ("claim_spawns", (1.0,), {}),
    ("claim_due_timers", (math.nan,), {}),
    ("claim_due_timers", ("1",), {}),
    ("claim_due_timers", (5.0,), {"lease": "1"}),
    ("claim_due_timers", (5.0, -3), {}),
]


class ProtocolMachine(StoreMachine):
    """``StoreMachine`` with the protocol: commits under commit ids and epochs, replays
    of earlier commits with equal and with changed bodies, saves under epochs, claims of
    all three kinds on a fake clock the machine advances, and ``forget``."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.sent: list[tuple[Any, str, dict[str, Any]]] = []  # (id, commit id, body)

    @initialize(target=StoreMachine.handles, trace_max=TRACE_MAXES)
    def create_stores(self, trace_max: int | None) -> Any:
        self.stores = [
            factory(trace_max=trace_max, clock=self.clock) for factory in self.factories.values()
        ]
        return multiple(*(self.new_execution(eid, 0) for eid in IDS))

    def outcome(self, i: int, func: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        idempotency, stale = _protocol_errors()
        try:
            return super().outcome(i, func, args)
        except idempotency as err:
            return ("idempotency", err.execution_id, err.commit_id)  # type: ignore[attr-defined]
        except stale as err:
            return ("stale", err.execution_id, err.epoch, err.current)  # type: ignore[attr-defined]

    def apply_kw(self, method: str, args: Args, **kwargs: Any) -> Any:
        """``apply`` with the same keyword arguments for every store."""
        results = [
            self.outcome(i, partial(getattr(store, method), **kwargs), args(i))
            for i, store in enumerate(self.stores)
        ]
        for name, result in zip(self.names[1:], results[1:]):
            assert result == results[0], (
                f"{method}({kwargs}): {name} gave {result!r}, the model {results[0]!r}"
            )
        return results[0]

    def commit_body(self, h: int, body: dict[str, Any], **kwargs: Any) -> Any:
        """Commit ``body`` (fresh containers for each store) on handle ``h``."""
        return self.apply_kw(
            "commit",
            lambda i: (
                self.objects[h][i],
                list(body["emits"]),
                body["processed"],
                list(body["timers"]),
                [(c, r, dict(ctx)) for c, r, ctx in body["spawns"]],
                None if body["trace"] is None else dict(body["trace"]),
            ),
            **kwargs,
        )

    @rule(
        h=StoreMachine.handles,
        commit_id=st.none() | st.sampled_from(COMMIT_IDS),
        epoch=EPOCHS,
        emits=emit_lists,
        processed=st.none() | st.sampled_from(EVENTS),
        timers=st.lists(timer_ops, max_size=3),
        spawns=spawn_lists,
        trace=st.none() | trace_entries,
    )
    def commit_with_id(
        self,
        h: int,
        commit_id: str | None,
        epoch: int | None,
        emits: list[tuple[Any, str]],
        processed: Any,
        timers: list[TimerOp],
        spawns: list[tuple[str, Any, dict[str, int]]],
        trace: dict[str, Any] | None,
    ) -> None:
        body = {
            "emits": emits,
            "processed": processed,
            "timers": timers,
            "spawns": spawns,
            "trace": trace,
        }
        self.commit_body(h, body, commit_id=commit_id, epoch=epoch)
        if commit_id is not None:
            eid = self.objects[h][0].id
            self.sent.append((eid, commit_id, body))

    @rule(
        data=st.data(),
        epoch=EPOCHS,
        change=st.sampled_from([None, None, "emits", "processed", "timers", "spawns", "trace"]),
    )
    def replay(self, data: st.DataObject, epoch: int | None, change: str | None) -> None:
        """An earlier commit again, from any object of its execution, at any epoch: with
        its body, or with one part of it changed."""
        if not self.sent:
            return
        eid, commit_id, body = data.draw(st.sampled_from(self.sent), label="commit")
        handles = [h for h, objs in enumerate(self.objects) if objs[0].id == eid]
        h = data.draw(st.sampled_from(handles), label="handle")
        if change == "emits":
            body = {**body, "emits": [*body["emits"], (None, "changed")]}
        elif change == "processed":
            body = {**body, "processed": "changed" if body["processed"] is None else None}
        elif change == "timers":
            body = {**body, "timers": [*body["timers"], TimerOp("cancel", "changed")]}
        elif change == "spawns":
            body = {**body, "spawns": [*body["spawns"], ("c9", "r", {})]}
        elif change == "trace":
            body = {**body, "trace": None if body["trace"] else {"n": 0}}
        self.commit_body(h, body, commit_id=commit_id, epoch=epoch)

    @rule(h=StoreMachine.handles, epoch=EPOCHS)
    def save_with_epoch(self, h: int, epoch: int | None) -> None:
        self.apply_kw("save", self.with_exe(h), epoch=epoch)

    @rule(fifo=st.sampled_from(["claim_outbox", "claim_spawns"]), limit=LIMITS, lease=LEASES)
    def claim(self, fifo: str, limit: int, lease: float) -> None:
        self.apply_kw(fifo, same(limit), lease=lease)

    @rule(now=TIMES | st.sampled_from([-math.inf, math.inf]), limit=LIMITS, lease=LEASES)
    def claim_due_timers(self, now: float, limit: int, lease: float) -> None:
        self.apply_kw("claim_due_timers", same(now, limit), lease=lease)

    @rule(seconds=st.integers(1, 3))
    def advance_clock(self, seconds: int) -> None:
        self.clock.now += seconds

    @rule(eid=st.sampled_from(IDS))
    def forget(self, eid: Any) -> None:
        self.apply("forget", same(eid))

    @rule(h=StoreMachine.handles, bad=st.sampled_from(BAD_PROTOCOL_CALLS))
    def refused_protocol_call(
        self, h: int, bad: tuple[str, tuple[Any, ...], dict[str, Any]]
    ) -> None:
        """Every store refuses with the same error; the invariant and the claims that
        follow show that nothing was written or leased."""
        method, args, kwargs = bad
        refusals = set()
        for i, store in enumerate(self.stores[1:], start=1):
            exe = self.objects[h][i]
            lead = {"commit": (exe, [(None, "ok")], "v2"), "save": (exe,)}.get(method, ())
            with pytest.raises((TypeError, ValueError)) as info:
                getattr(store, method)(*lead, *args, **kwargs)
            refusals.add(info.type)
        assert len(refusals) == 1, f"the stores refused with different errors: {refusals}"


def test_protocol_stores_behave_like_the_model(impl: Any, pure_impl: Any) -> None:
    """The pure store, the store of ``impl`` and its async twin against the protocol
    model, with commit ids, epochs, claims on a shared fake clock, and forget."""
    factories: dict[str, Callable[..., Any]] = {"model": ProtocolModel, "pure": pure_impl.DictStore}
    factories[impl.name] = impl.DictStore
    factories[f"{impl.name}-async"] = lambda **kw: AsyncAsSync(impl.AsyncDictStore(**kw), drive)

    class Machine(ProtocolMachine):
        pass

    Machine.factories = factories
    # Four stores and a model per step, with the base machine's rules as well: at the deep
    # profile's 2,000 examples this machine alone would take most of CI's budget.
    current = settings()
    run_state_machine_as_test(
        Machine, settings=settings(current, max_examples=min(current.max_examples, 300))
    )
