"""API.md point 1: a commit that raises leaves the store and ``exe.version`` as they were.

Each bad input comes after good items of every kind in the same commit, on a store that
already holds executions, pending outbox and spawn entries (some acked), processed marks,
timers and traces, so any partial write shows in the snapshot, or in the seq and trace
counters the next good commit gets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
from _helpers import snapshot

from harel_store import Execution, StoreConflict, TimerOp

IDS = ["e1", "e2", "new", "c-good", "c-bad", "k1"]
EVENTS = ["ev0", "ev-old", "ev-new"]


def schedule(path: Any, fire_at: Any) -> TimerOp:
    return TimerOp("schedule", path, fire_at)


class Collider:
    """Hashes like every other ``Collider``; comparing two with different ``n`` raises."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        return 1

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Collider) and other.n != self.n:
            raise RuntimeError("Collider.__eq__ broke")
        return isinstance(other, Collider)

    def __repr__(self) -> str:
        return f"Collider({self.n})"


class BrokenMapping(Mapping):  # type: ignore[type-arg]
    def __getitem__(self, key: Any) -> Any:
        raise RuntimeError("broken mapping")

    def __iter__(self) -> Iterator[Any]:
        return iter(["key"])

    def __len__(self) -> int:
        return 1


def breaking(items: Iterable[Any]) -> Iterator[Any]:
    yield from items
    raise RuntimeError("broken iterator")


def fill(store: Any) -> None:
    e1, e2 = Execution(id="e1"), Execution(id="e2")
    store.save(e1)
    store.commit(
        e1,
        [(None, "a"), ("e2", "b"), ("e2", "c")],
        "ev0",
        [schedule("p", 1.0), schedule("q", 50.0), schedule(Collider(0), 60.0)],
        [("k1", "r", {"n": 1}), ("k2", "r", {})],
        {"step": 0},
    )
    store.commit(e1, [], Collider(0))
    store.commit(e2, [("e1", "d")], "ev-old", [schedule("p", 2.0)], [("k3", "r", {})], {"s": 1})
    store.ack_outbox(2)
    store.ack_spawn(1)
    store.append_trace("e1", {"extra": True})
    store.append_trace("c-good", {"orphan": True})


GOOD_EMITS = [("e2", "new-1"), (None, "new-2")]
GOOD_TIMERS = [schedule("p", 99.0), TimerOp("cancel", "q"), schedule("fresh", 3.0)]
GOOD_SPAWNS = [("c-good", "r", {"n": 2})]
GOOD = {
    "emits": GOOD_EMITS,
    "processed_event_id": "ev-new",
    "timers": GOOD_TIMERS,
    "spawns": GOOD_SPAWNS,
    "trace": {"step": "new"},
}


class Case(NamedTuple):
    id: str
    make: Callable[[], Any]  # the arguments that replace GOOD's, or the execution
    error: type[BaseException]
    match: str


def emit(bad: Any) -> Callable[[], dict[str, Any]]:
    return lambda: {"emits": [*GOOD_EMITS, bad]}


def timer(bad: Any) -> Callable[[], dict[str, Any]]:
    return lambda: {"timers": [*GOOD_TIMERS, bad]}


def spawn(bad: Any) -> Callable[[], dict[str, Any]]:
    return lambda: {"spawns": [*GOOD_SPAWNS, bad]}


def arg(name: str, bad: Any) -> Callable[[], dict[str, Any]]:
    return lambda: {name: bad() if callable(bad) else bad}


def op(*fields: Any) -> TimerOp:
    return TimerOp._make(fields)  # any action, unchecked


# Where the bad item sits, after the good ones: the message must name it.
E, T, S = r"emits\[2\]", r"timers\[3\]", r"spawns\[1\]"
AT = rf"{T}\.fire_at"
BROKEN = "broken iterator"

ITEM_CASES = [
    Case("emit-3-tuple", emit(("e2", "ev", "extra")), TypeError, E),
    Case("emit-str-of-2", emit("ab"), TypeError, E),
    Case("emit-int", emit(7), TypeError, E),
    Case("emit-none", emit(None), TypeError, E),
    Case("emit-unhashable-target", emit((["e2"], "ev")), TypeError, rf"{E} target_id"),
    Case("emits-not-iterable", arg("emits", 5), TypeError, "emits"),
    Case("emits-iterator-raises", arg("emits", lambda: breaking(GOOD_EMITS)), RuntimeError, BROKEN),
    Case("processed-unhashable", arg("processed_event_id", {}), TypeError, "processed_event_id"),
    Case("timer-plain-tuple", timer(("schedule", "t1", 1.0)), TypeError, T),
    Case("timer-str", timer("schedule"), TypeError, T),
    Case("timer-no-fire_at", timer(SimpleNamespace(action="schedule", path="t1")), TypeError, T),
    Case("timer-action-arm", timer(op("arm", "t1", 1.0)), ValueError, rf"{T}\.action"),
    Case("timer-action-case", timer(op("Schedule", "t1", 1.0)), ValueError, rf"{T}\.action"),
    Case("timer-action-none", timer(op(None, "t1", 1.0)), ValueError, rf"{T}\.action"),
    Case("fire_at-none", timer(op("schedule", "t1", None)), TypeError, AT),
    Case("fire_at-nan", timer(op("schedule", "t1", math.nan)), ValueError, AT),
    Case("fire_at-inf", timer(op("schedule", "t1", math.inf)), ValueError, AT),
    Case("fire_at--inf", timer(op("schedule", "t1", -math.inf)), ValueError, AT),
    Case("fire_at-overflow", timer(op("schedule", "t1", 10**400)), ValueError, AT),
    Case("fire_at-str", timer(op("schedule", "t1", "5")), TypeError, AT),
    Case("fire_at-bool", timer(op("schedule", "t1", True)), TypeError, AT),
    Case("schedule-unhashable-path", timer(op("schedule", ["t1"], 1.0)), TypeError, rf"{T}\.path"),
    Case("cancel-unhashable-path", timer(op("cancel", {"t1": 1}, None)), TypeError, rf"{T}\.path"),
    Case("timers-not-iterable", arg("timers", 3.5), TypeError, "timers"),
    Case(
        "timers-iterator-raises", arg("timers", lambda: breaking(GOOD_TIMERS)), RuntimeError, BROKEN
    ),
    Case("spawn-pair", spawn(("c-bad", "r")), TypeError, S),
    Case("spawn-4-tuple", spawn(("c-bad", "r", {}, "x")), TypeError, S),
    Case("spawn-str-of-3", spawn("abc"), TypeError, S),
    Case("spawn-int", spawn(3), TypeError, S),
    Case("spawn-context-list", spawn(("c-bad", "r", [("a", 1)])), TypeError, rf"{S} context"),
    Case("spawn-context-none", spawn(("c-bad", "r", None)), TypeError, rf"{S} context"),
    Case("spawn-context-raises", spawn(("c-bad", "r", BrokenMapping())), RuntimeError, "mapping"),
    Case("spawn-unhashable-child", spawn(({"c": 1}, "r", {})), TypeError, rf"{S} child_id"),
    Case("spawns-not-iterable", arg("spawns", 1), TypeError, "spawns"),
    Case(
        "spawns-iterator-raises", arg("spawns", lambda: breaking(GOOD_SPAWNS)), RuntimeError, BROKEN
    ),
    Case("trace-list", arg("trace", [("step", 1)]), TypeError, "trace"),
    Case("trace-str", arg("trace", "step"), TypeError, "trace"),
    Case("trace-raises", arg("trace", BrokenMapping()), RuntimeError, "broken mapping"),
]


class ReadOnlyVersion:
    def __init__(self) -> None:
        self.id = "new"

    @property
    def version(self) -> int:
        return 0


class PickyVersion:
    """A version setter that refuses the write: the store's first write fails."""

    def __init__(self) -> None:
        self.id = "new"
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        raise RuntimeError("picky version setter")


def execution(**fields: Any) -> Callable[[], Any]:
    return lambda: Execution(**{"id": "new", **fields})


EXE_CASES = [
    Case("no-id", lambda: SimpleNamespace(version=0), TypeError, "`id`"),
    Case("no-version", lambda: SimpleNamespace(id="new"), TypeError, "`version`"),
    Case("version-str", execution(version="1"), TypeError, "version"),
    Case("version-float", execution(version=1.0), TypeError, "version"),
    Case("version-bool", execution(version=True), TypeError, "version"),
    Case("version-none", execution(version=None), TypeError, "version"),
    Case("unhashable-id", execution(id=["new"]), TypeError, "hashable"),
    Case("read-only-version", ReadOnlyVersion, TypeError, "writable"),
    Case("version-setter-raises", PickyVersion, RuntimeError, "picky"),
    Case("stale", execution(id="e1", version=0), StoreConflict, "'e1'"),
]


@pytest.fixture
def filled(any_store: Any) -> Any:
    fill(any_store)
    return any_store


def check_untouched(store: Any, before: dict[str, Any], eid: Any) -> None:
    """The store shows ``before``, and the next good commit gets the next seqs and trace
    index: the failed one consumed none."""
    assert snapshot(store, IDS, EVENTS) == before
    exe = store.load(eid) or Execution(id=eid)
    store.commit(exe, [(None, "probe")], spawns=[("probe", "r", {})], trace={"probe": 1})
    assert store.pending_outbox()[-1].seq == before["outbox"][-1].seq + 1
    assert store.pending_spawns()[-1].seq == before["spawns"][-1].seq + 1
    steps = before["trace"][eid]
    assert store.read_trace(eid)[-1]["index"] == (steps[-1]["index"] + 1 if steps else 0)


def refuse(store: Any, case: Case, target: str) -> None:
    """Commit GOOD with ``case``'s bad argument on ``target``: refused, nothing changed."""
    exe = store.load(target) or Execution(id=target)
    version = exe.version
    before = snapshot(store, IDS, EVENTS)
    with pytest.raises(case.error, match=case.match):
        store.commit(exe, **{**GOOD, **case.make()})
    assert exe.version == version
    check_untouched(store, before, target)


@pytest.mark.parametrize("target", ["e1", "new"], ids=["stored-exe", "new-exe"])
@pytest.mark.parametrize("case", ITEM_CASES, ids=[c.id for c in ITEM_CASES])
def test_a_bad_item_changes_nothing(filled: Any, case: Case, target: str) -> None:
    refuse(filled, case, target)


@pytest.mark.parametrize("method", ["save", "commit"])
@pytest.mark.parametrize("case", EXE_CASES, ids=[c.id for c in EXE_CASES])
def test_a_bad_execution_changes_nothing(filled: Any, case: Case, method: str) -> None:
    exe = case.make()
    version = getattr(exe, "version", None)
    before = snapshot(filled, IDS, EVENTS)
    with pytest.raises(case.error, match=case.match):
        if method == "save":
            filled.save(exe)
        else:
            filled.commit(exe, **GOOD)
    assert getattr(exe, "version", None) == version
    check_untouched(filled, before, "e1")


# The caller's code, ``__eq__`` included, runs before anything is written (the pure
# module's docstring). ``fill`` left a Collider(0) mark and timer path on "e1".
EQ_CASES = [
    Case("processed-eq-raises", arg("processed_event_id", Collider(1)), RuntimeError, "Collider"),
    Case("timer-path-eq-raises", timer(schedule(Collider(1), 5.0)), RuntimeError, "Collider"),
]


@pytest.mark.parametrize("case", EQ_CASES, ids=[c.id for c in EQ_CASES])
def test_a_raising_eq_changes_nothing(filled: Any, case: Case) -> None:
    refuse(filled, case, "e1")


def test_the_store_still_works_after_a_refused_commit(filled: Any) -> None:
    exe = filled.load("e1")
    with pytest.raises(TypeError, match=r"emits\[2\]"):
        filled.commit(exe, [*GOOD_EMITS, "bad"])
    filled.commit(exe, **GOOD)
    assert filled.is_processed("e1", "ev-new")
    assert filled.due_timers(3.0) == [("e2", "p", 2.0), ("e1", "fresh", 3.0)]
    assert [e.event for e in filled.pending_outbox()][-2:] == ["new-1", "new-2"]
