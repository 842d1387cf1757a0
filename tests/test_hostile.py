"""Hostile input (the issue, point 3): what a buggy or hostile caller hands the stores.

Each call either works as specified or raises a clear ``TypeError``/``ValueError`` or the
caller's own exception; when it raises, the store shows exactly what it showed before
(the ``snapshot`` helper, plus the trace index and seqs the next write gets). Callers that
call back into the store from ``__hash__``/``__eq__``/iterators/properties must leave it
consistent: the outer and every inner call each all or nothing, the result the same as
running the calls that succeeded one after another in some order. The most dangerous
cases also run in a subprocess, so a crash fails a test instead of killing pytest.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from _helpers import snapshot

from harel_store import Execution, StoreConflict, TimerOp


def schedule(path: Any, fire_at: Any) -> TimerOp:
    return TimerOp("schedule", path, fire_at)


def cancel(path: Any) -> TimerOp:
    return TimerOp("cancel", path)


class Refused(Exception):
    """The caller's own error."""


class Abort(BaseException):
    """A caller's error that is not an ``Exception``, like ``KeyboardInterrupt``."""


class HashRaises:
    """Hashing it raises; it equals only itself."""

    def __init__(self, exc: type[BaseException] = Refused) -> None:
        self.exc = exc

    def __hash__(self) -> int:
        raise self.exc("HashRaises.__hash__")

    def __eq__(self, other: object) -> bool:
        return other is self

    def __deepcopy__(self, memo: dict) -> HashRaises:
        return self

    def __repr__(self) -> str:
        return f"HashRaises({self.exc.__name__})"


class EqRaises:
    """Hashes like ``like``; comparing it with anything but itself raises."""

    def __init__(self, like: Hashable = "k", exc: type[BaseException] = Refused) -> None:
        self.like = like
        self.exc = exc

    def __hash__(self) -> int:
        return hash(self.like)

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        raise self.exc("EqRaises.__eq__")

    def __deepcopy__(self, memo: dict) -> EqRaises:
        return self

    def __repr__(self) -> str:
        return f"EqRaises({self.like!r})"


class Pairs(Mapping):  # type: ignore[type-arg]
    """A mapping over ``(key, value)`` pairs, found by identity: it can hold keys that no
    dict could (a raising hash, colliding keys)."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs

    def __getitem__(self, key: Any) -> Any:
        for k, v in self.pairs:
            if k is key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        return iter([k for k, _ in self.pairs])

    def __len__(self) -> int:
        return len(self.pairs)


# --- the store hostile calls are made against ----------------------------------------

IDS = ["a", "b", "c"]  # no "k": EqRaises objects hash like "k"
EVENTS = ["ev-a", "ev-b", "ev-new"]


def base(store: Any) -> None:
    a, b = Execution(id="a"), Execution(id="b")
    store.commit(
        a,
        [("b", "a0"), (None, "a1")],
        "ev-a",
        [schedule("p", 1.0), schedule("q", 5.0)],
        [("k", "r", {"n": 1}), ("k2", "r", {})],
        {"s": "a0"},
    )
    store.commit(b, [("a", "b0")], "ev-b", [schedule("p", 2.0)], [("k3", "r", {})], {"s": "b0"})
    store.ack_outbox(1)
    store.ack_spawn(2)
    store.append_trace("c", {"s": "c0"})


def view(store: Any) -> dict[str, Any]:
    return snapshot(store, IDS, EVENTS)


def assert_untouched(store: Any, before: dict[str, Any]) -> None:
    """The store shows ``before``, and the next writes get the next seqs and trace index:
    a failed call consumed none of them."""
    assert view(store) == before
    store.commit(store.load("a"), [(None, "probe")], spawns=[("probe", "r", {})])
    store.append_trace("a", {"probe": True})
    assert store.pending_outbox()[-1].seq == before["outbox"][-1].seq + 1
    assert store.pending_spawns()[-1].seq == before["spawns"][-1].seq + 1
    assert store.read_trace("a")[-1]["index"] == before["trace"]["a"][-1]["index"] + 1


def observed(store: Any, ids: list[Hashable], events: list[Hashable]) -> dict[str, int]:
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


class Case(NamedTuple):
    id: str
    call: Callable[[Any, Any], Any]  # (store, the hostile object)
    may_work: Callable[[Any, Any, Any], bool] | None = None  # (store, bad, result) -> ok


def a(store: Any) -> Any:
    return store.load("a")


# --- raising __hash__ ----------------------------------------------------------------

HASH_CASES = [
    Case("commit-id", lambda s, bad: s.commit(Execution(id=bad), [(None, "x")], "ev-new")),
    Case("save-id", lambda s, bad: s.save(Execution(id=bad))),
    Case("emit-target", lambda s, bad: s.commit(a(s), [("b", "x"), (bad, "y")])),
    Case("processed-id", lambda s, bad: s.commit(a(s), [(None, "x")], bad)),
    Case("schedule-path", lambda s, bad: s.commit(
        a(s), [(None, "x")], None, [schedule("p", 9.0), schedule(bad, 1.0)])),
    Case("cancel-path", lambda s, bad: s.commit(
        a(s), [(None, "x")], None, [cancel("q"), cancel(bad)])),
    Case("spawn-child", lambda s, bad: s.commit(
        a(s), [(None, "x")], spawns=[("k", "r", {}), (bad, "r", {})])),
    Case("spawn-context-key", lambda s, bad: s.commit(
        a(s), [(None, "x")], spawns=[("k", "r", Pairs([("ok", 1), (bad, 2)]))])),
    Case("commit-trace-key", lambda s, bad: s.commit(
        a(s), [(None, "x")], trace=Pairs([("ok", 1), (bad, 2)]))),
    Case("append-trace-key", lambda s, bad: s.append_trace("a", Pairs([("ok", 1), (bad, 2)]))),
    Case("append-trace-id", lambda s, bad: s.append_trace(bad, {"s": 1})),
    Case("record-trace-id", lambda s, bad: s._record_trace(bad, {"s": 1})),
    Case("delete-timer-id", lambda s, bad: s.delete_timer(bad, "p", 1.0)),
    Case("delete-timer-path", lambda s, bad: s.delete_timer("a", bad, 1.0)),
    Case("delete-timer-path-of-unknown-id", lambda s, bad: s.delete_timer("zz", bad, 1.0),
         may_work=lambda s, bad, r: r is None),
    Case("forget", lambda s, bad: s.forget(bad)),
    Case("load", lambda s, bad: s.load(bad)),
    Case("is-processed-id", lambda s, bad: s.is_processed(bad, "ev-a")),
    Case("is-processed-event", lambda s, bad: s.is_processed("a", bad)),
    Case("is-processed-event-of-unknown-id", lambda s, bad: s.is_processed("zz", bad),
         may_work=lambda s, bad, r: r is False),
    Case("read-trace", lambda s, bad: s.read_trace(bad)),
    # Never hashed: an event and a root path are the caller's business.
    Case("event", lambda s, bad: s.commit(a(s), [("b", bad)]),
         may_work=lambda s, bad, r: s.pending_outbox()[-1].event is bad),
    Case("root-path", lambda s, bad: s.commit(a(s), [], spawns=[("k", bad, {})]),
         may_work=lambda s, bad, r: s.pending_spawns()[-1].root_path is bad),
]  # fmt: skip


def check_hostile_call(store: Any, case: Case, bad: Any, exc: type[BaseException]) -> None:
    before = view(store)
    allowed = (exc, TypeError, ValueError) if issubclass(exc, Exception) else exc
    try:
        result = case.call(store, bad)
    except allowed:
        assert_untouched(store, before)
    else:
        assert case.may_work is not None, f"{case.id}: accepted a hostile argument"
        assert case.may_work(store, bad, result), f"{case.id}: wrong result {result!r}"


@pytest.mark.parametrize("exc", [Refused, Abort])
@pytest.mark.parametrize("case", HASH_CASES, ids=[c.id for c in HASH_CASES])
def test_a_raising_hash(impl: Any, case: Case, exc: type[BaseException]) -> None:
    store = impl.DictStore()
    base(store)
    check_hostile_call(store, case, HashRaises(exc), exc)


# --- raising __eq__, met through hash collisions ---------------------------------------


class EqCase(NamedTuple):
    id: str
    plant: Callable[[Any, Any], Any]  # (store, e0): put a colliding object in the store
    call: Callable[[Any, Any, Any], Any]  # (store, e0, e1): e1 collides with e0


EQ_CASES = [
    EqCase("commit-id-vs-a-saved-id",
           lambda s, e0: s.save(Execution(id=e0)),
           lambda s, e0, e1: s.commit(Execution(id=e1), [(None, "x")], "ev-new")),
    # The colliding id is only in the trace table: the commit meets it at its last step.
    EqCase("commit-id-vs-a-trace-only-id",
           lambda s, e0: s.append_trace(e0, {"s": 0}),
           lambda s, e0, e1: s.commit(Execution(id=e1), [(None, "x")], "ev-new", trace={"s": 1})),
    EqCase("append-trace-id-vs-a-trace-id",
           lambda s, e0: s.append_trace(e0, {"s": 0}),
           lambda s, e0, e1: s.append_trace(e1, {"s": 1})),
    # (Two colliding ids, one saved and one with a trace only, cannot both be held: one
    # table holds everything of an id, and the second insert meets the first.)
    EqCase("forget-vs-a-saved-id",
           lambda s, e0: s.commit(Execution(id=e0), [], "m", [schedule("t", 1.0)], trace={}),
           lambda s, e0, e1: s.forget(e1)),
    EqCase("processed-id",
           lambda s, e0: s.commit(a(s), [], e0),
           lambda s, e0, e1: s.commit(a(s), [(None, "x")], e1)),
    EqCase("schedule-path",
           lambda s, e0: s.commit(a(s), [], None, [schedule(e0, 3.0)]),
           lambda s, e0, e1: s.commit(a(s), [(None, "x")], None, [schedule(e1, 4.0)])),
    EqCase("cancel-path",
           lambda s, e0: s.commit(a(s), [], None, [schedule(e0, 3.0)]),
           lambda s, e0, e1: s.commit(a(s), [(None, "x")], None, [cancel(e1)])),
    # A trace key that collides with the "index" the store stamps into each step.
    EqCase("commit-trace-key-vs-index",
           lambda s, e0: None,
           lambda s, e0, e1: s.commit(a(s), [(None, "x")], trace={EqRaises("index"): 1})),
    EqCase("append-trace-key-vs-index",
           lambda s, e0: None,
           lambda s, e0, e1: s.append_trace("a", {EqRaises("index"): 1})),
    EqCase("spawn-context-keys",
           lambda s, e0: None,
           lambda s, e0, e1: s.commit(a(s), [(None, "x")], spawns=[("k", "r", Pairs([(e0, 1), (e1, 2)]))])),
    EqCase("trace-keys",
           lambda s, e0: None,
           lambda s, e0, e1: s.commit(a(s), [(None, "x")], trace=Pairs([(e0, 1), (e1, 2)]))),
    EqCase("delete-timer-id",
           lambda s, e0: s.commit(Execution(id=e0), [], None, [schedule("t", 1.0)]),
           lambda s, e0, e1: s.delete_timer(e1, "t", 1.0)),
    EqCase("delete-timer-path",
           lambda s, e0: s.commit(a(s), [], None, [schedule(e0, 3.0)]),
           lambda s, e0, e1: s.delete_timer("a", e1, 3.0)),
    EqCase("load", lambda s, e0: s.save(Execution(id=e0)), lambda s, e0, e1: s.load(e1)),
    EqCase("is-processed", lambda s, e0: s.commit(a(s), [], e0),
           lambda s, e0, e1: s.is_processed("a", e1)),
    EqCase("read-trace", lambda s, e0: s.append_trace(e0, {}), lambda s, e0, e1: s.read_trace(e1)),
]  # fmt: skip


@pytest.mark.parametrize("case", EQ_CASES, ids=[c.id for c in EQ_CASES])
def test_a_raising_eq(impl: Any, case: EqCase) -> None:
    store = impl.DictStore()
    base(store)
    e0, e1 = EqRaises("k"), EqRaises("k")
    case.plant(store, e0)
    before = view(store)
    with pytest.raises(Refused):
        case.call(store, e0, e1)
    assert_untouched(store, before)


STR_EQ_CASES = [
    EqCase("processed-id",
           lambda s, e0: s.commit(a(s), [], e0),
           lambda s, e0, k: s.commit(a(s), [(None, "x")], k)),
    EqCase("schedule-path",
           lambda s, e0: s.commit(a(s), [], None, [schedule(e0, 3.0)]),
           lambda s, e0, k: s.commit(a(s), [(None, "x")], None, [schedule(k, 4.0)])),
    EqCase("cancel-path",
           lambda s, e0: s.commit(a(s), [], None, [schedule(e0, 3.0)]),
           lambda s, e0, k: s.commit(a(s), [(None, "x")], None, [cancel(k)])),
    EqCase("trace-id",
           lambda s, e0: s.append_trace(e0, {}),
           lambda s, e0, k: s.commit(Execution(id=k), [(None, "x")], trace={"s": 1})),
]  # fmt: skip


@pytest.mark.parametrize("case", STR_EQ_CASES, ids=[c.id for c in STR_EQ_CASES])
def test_a_stored_key_that_raises_against_a_plain_str(impl: Any, case: EqCase) -> None:
    """The caller's keys are all exact strs, which compare without running any code; the
    key stored earlier is not, and its ``__eq__`` runs in the lookups of the write."""
    store = impl.DictStore()
    base(store)
    e0 = EqRaises("k")
    case.plant(store, e0)
    before = view(store)
    with pytest.raises(Refused):
        case.call(store, e0, "k")
    if case.id != "trace-id":  # there, e0 is in the table load reads, and load meets it
        assert store.load("k") is None
    assert_untouched(store, before)


# --- ids of mixed types ---------------------------------------------------------------

MIXED_IDS: list[Hashable] = [
    "1", 1, (1,), frozenset({1}), ("a", (1, 2)), 2**70, -1, frozenset(), (), 0.5, b"1",
]  # fmt: skip


def test_ids_of_mixed_types_share_one_store(impl: Any) -> None:
    store = impl.DictStore()
    exes = {}
    for n, eid in enumerate(MIXED_IDS):
        exes[eid] = exe = Execution(id=eid)
        other = MIXED_IDS[n - 1]
        store.commit(
            exe,
            [(other, ("to", n)), (None, ("all", n))],
            other,  # a processed id of yet another type
            [schedule("p", 5.0), schedule(other, 5.0), schedule(eid, 1.0)],  # equal fire_at
            [(other, eid, {"n": n})],
            {"n": n, other: eid},
        )
    for n, eid in enumerate(MIXED_IDS):
        assert store.load(eid) is exes[eid]
        assert store.is_processed(eid, MIXED_IDS[n - 1])
        assert not store.is_processed(eid, eid) or eid == MIXED_IDS[n - 1]
        assert store.read_trace(eid) == [{"n": n, MIXED_IDS[n - 1]: eid, "index": 0}]
    # Ties go in arming order: ids of different types are never compared.
    due = store.due_timers(math.inf)
    assert due[: len(MIXED_IDS)] == [(eid, eid, 1.0) for eid in MIXED_IDS]
    assert due[len(MIXED_IDS) :] == [
        t
        for n, eid in enumerate(MIXED_IDS)
        for t in ((eid, "p", 5.0), (eid, MIXED_IDS[n - 1], 5.0))
    ]
    assert [e.target_id for e in store.pending_outbox()[::2]] == [
        MIXED_IDS[n - 1] for n in range(len(MIXED_IDS))
    ]
    # Equal numbers are one key, as in any dict.
    assert store.load(1.0) is store.load(True) is exes[1]
    assert store.load(0.5) is exes[0.5]
    stats = store.stats()
    for n, eid in enumerate(MIXED_IDS):
        store.forget(eid)
        assert store.load(eid) is None and store.read_trace(eid) == []
        assert all(t[0] != eid for t in store.due_timers(math.inf))
    assert store.stats() == {**stats, "executions": 0, "timers": 0, "processed": 0,
                             "traces": 0, "trace_steps": 0}  # fmt: skip
    assert len(store.pending_outbox()) == 2 * len(MIXED_IDS)


# --- numbers: fire_at, now, versions, seqs -------------------------------------------


class IntSub(int):
    def __eq__(self, other: object) -> bool:
        raise Refused("IntSub.__eq__")

    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__  # type: ignore[assignment]
    __hash__ = int.__hash__


class FloatSub(float):
    """A float whose comparisons and hash raise."""

    def __eq__(self, other: object) -> bool:
        raise Refused("FloatSub.__eq__")

    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__  # type: ignore[assignment]

    def __hash__(self) -> int:
        raise Refused("FloatSub.__hash__")


class PlainFloatSub(float):
    pass


@pytest.mark.parametrize(
    ("fire_at", "stored"),
    [
        (5, 5.0),
        (-3, -3.0),
        (0, 0.0),
        (2**80, float(2**80)),
        (IntSub(5), 5.0),
        (FloatSub(5.5), 5.5),
        (PlainFloatSub(-0.25), -0.25),
        (1e308, 1e308),
    ],
    ids=[
        "int",
        "negative-int",
        "zero",
        "2**80",
        "int-subclass",
        "raising-float-subclass",
        "float-subclass",
        "huge-float",
    ],
)
def test_fire_at_numbers_are_stored_as_plain_floats(impl: Any, fire_at: Any, stored: float) -> None:
    store = impl.DictStore()
    exe = Execution(id="e")
    store.commit(
        exe, [], None, [schedule("early", -1e9), schedule("t", fire_at), schedule("late", 1.5e308)]
    )
    due = store.due_timers(math.inf)
    assert due == [("e", "early", -1e9), ("e", "t", stored), ("e", "late", 1.5e308)]
    entry = next(t for t in due if t[1] == "t")
    assert entry[2] == stored and type(entry[2]) is float
    assert store.due_timers(stored) == [t for t in due if t[2] <= stored]
    store.delete_timer("e", "t", stored)
    assert all(t[1] != "t" for t in store.due_timers(math.inf))


@pytest.mark.parametrize("fire_at", [True, False, "5", None, Decimal(5), 5j, [5.0]])
def test_fire_at_that_is_not_a_real_number_is_refused(impl: Any, fire_at: Any) -> None:
    store = impl.DictStore()
    base(store)
    before = view(store)
    with pytest.raises(TypeError, match=r"timers\[1\]\.fire_at"):
        store.commit(a(store), [(None, "x")], None, [schedule("z", 1.0), schedule("p", fire_at)])
    assert_untouched(store, before)


@pytest.mark.parametrize(
    ("now", "due"),
    [
        (2, 2), (IntSub(2), 2), (FloatSub(2.5), 2), (PlainFloatSub(1.0), 1), (2**1000, 3),
        (-(2**1000), 0), (math.inf, 3), (-math.inf, 0),
    ],
    ids=["int", "int-subclass", "raising-float-subclass", "float-subclass", "2**1000",
         "-2**1000", "inf", "-inf"],
)  # fmt: skip
def test_due_timers_takes_any_real_now(impl: Any, now: Any, due: int) -> None:
    store = impl.DictStore()
    base(store)
    assert store.due_timers(now) == store.due_timers(math.inf)[:due]


@pytest.mark.parametrize("now", [True, "1", None, Decimal(1), [1.0]])
def test_due_timers_refuses_a_now_that_is_not_a_real_number(impl: Any, now: Any) -> None:
    store = impl.DictStore()
    base(store)
    before = view(store)
    with pytest.raises(TypeError):
        store.due_timers(now)
    assert_untouched(store, before)


@pytest.mark.parametrize("fire_at", [1, 1.0, PlainFloatSub(1.0)])
def test_delete_timer_with_an_equal_number(impl: Any, fire_at: Any) -> None:
    store = impl.DictStore()
    base(store)
    store.delete_timer("a", "p", fire_at)
    assert store.due_timers(math.inf) == [("b", "p", 2.0), ("a", "q", 5.0)]


def test_delete_timer_with_a_raising_float(impl: Any) -> None:
    """Either the caller's error, the store untouched, or the timer deleted by value."""
    store = impl.DictStore()
    base(store)
    before = view(store)
    try:
        store.delete_timer("a", "p", FloatSub(1.0))
    except Refused:
        assert_untouched(store, before)
    else:
        assert store.due_timers(math.inf) == [("b", "p", 2.0), ("a", "q", 5.0)]


@pytest.mark.parametrize(
    "version", [2**80, -5, 0, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, IntSub(7)]
)
def test_huge_and_negative_versions(impl: Any, version: int) -> None:
    store = impl.DictStore()
    value = int.__int__(version)
    exe = Execution(id="v", version=version)
    store.commit(exe, [(None, "x")], trace={"s": 0})
    assert exe.version == value + 1 and type(exe.version) is int
    store.save(exe)
    assert exe.version == value + 2
    twin = Execution(id="v", version=value + 2)  # a different object at the stored version
    store.save(twin)
    assert store.load("v") is twin and twin.version == value + 3
    stale = Execution(id="v", version=value)
    with pytest.raises(StoreConflict) as info:
        store.commit(stale, [(None, "lost")])
    assert (info.value.expected, info.value.found) == (value, value + 3)
    assert stale.version == value and len(store.pending_outbox()) == 1


@pytest.mark.parametrize("ack", ["ack_outbox", "ack_spawn"])
@pytest.mark.parametrize("seq", [2**100, -1, 0, 2**63, -(2**63) - 1, 99])
def test_acking_a_seq_that_was_never_given_is_a_no_op(impl: Any, ack: str, seq: int) -> None:
    store = impl.DictStore()
    base(store)
    before = view(store)
    getattr(store, ack)(seq)
    assert_untouched(store, before)


@pytest.mark.parametrize("ack", ["ack_outbox", "ack_spawn"])
@pytest.mark.parametrize("seq", [True, 2.0, "2", None, Decimal(2), (2,)])
def test_acking_with_a_seq_that_is_not_an_int_is_refused(impl: Any, ack: str, seq: Any) -> None:
    store = impl.DictStore()
    base(store)
    before = view(store)
    with pytest.raises(TypeError):
        getattr(store, ack)(seq)
    assert_untouched(store, before)


@pytest.mark.parametrize("ack", ["ack_outbox", "ack_spawn"])
def test_acking_with_an_int_subclass(impl: Any, ack: str) -> None:
    store = impl.DictStore()
    base(store)
    getattr(store, ack)(IntSub(3))
    if ack == "ack_outbox":
        assert [e.seq for e in store.pending_outbox()] == [2]
    else:
        assert [e.seq for e in store.pending_spawns()] == [1]


def test_an_explicit_huge_trace_index_is_honoured(impl: Any) -> None:
    store = impl.DictStore()
    store.append_trace("e", {"index": 2**100})
    store.append_trace("e", {"index": -1})
    store.append_trace("e", {})
    assert [s["index"] for s in store.read_trace("e")] == [2**100, -1, 2]


# --- mappings whose methods raise ------------------------------------------------------

MAPPING_METHODS = ["keys", "__getitem__", "__iter__", "__len__", "get", "items", "__contains__",
                   "values", "copy"]  # fmt: skip
DATA = {"a": 1, "b": [2]}


def raising_mapping(base_cls: type, method: str, exc: type[BaseException]) -> Any:
    def boom(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise exc(f"{base_cls.__name__}.{method}")

    if base_cls is dict:
        return type("HostileDict", (dict,), {method: boom})(DATA)

    class HostileMapping(Mapping):  # type: ignore[type-arg]
        def __getitem__(self, key: Any) -> Any:
            return DATA[key]

        def __iter__(self) -> Iterator[Any]:
            return iter(DATA)

        def __len__(self) -> int:
            return len(DATA)

    setattr(HostileMapping, method, boom)
    return HostileMapping()


MAPPING_POSITIONS: dict[str, Callable[[Any, Any], Any]] = {
    "spawn-context": lambda s, m: s.commit(a(s), [(None, "x")], spawns=[("kid", "r", m)]),
    "commit-trace": lambda s, m: s.commit(a(s), [(None, "x")], trace=m),
    "append-trace": lambda s, m: s.append_trace("a", m),
}


def stored_copy(store: Any, position: str) -> Any:
    if position == "spawn-context":
        return store.pending_spawns()[-1].context
    step = dict(store.read_trace("a")[-1])
    del step["index"]
    return step


@pytest.mark.parametrize("exc", [Refused, Abort])
@pytest.mark.parametrize("base_cls", [dict, Mapping], ids=["dict-subclass", "Mapping"])
@pytest.mark.parametrize("method", MAPPING_METHODS)
@pytest.mark.parametrize("position", list(MAPPING_POSITIONS))
def test_a_mapping_whose_methods_raise(
    impl: Any, position: str, method: str, base_cls: type, exc: type[BaseException]
) -> None:
    store = impl.DictStore()
    base(store)
    mapping = raising_mapping(base_cls, method, exc)
    before = view(store)
    allowed = (exc, TypeError) if issubclass(exc, Exception) else exc
    refs = sys.getrefcount(mapping)
    try:
        MAPPING_POSITIONS[position](store, mapping)
    except allowed:
        assert_untouched(store, before)
    else:
        copy = stored_copy(store, position)
        assert type(copy) is dict and copy == DATA
        assert copy["b"] is DATA["b"]  # a shallow copy, as the spec's dict(...)
    assert sys.getrefcount(mapping) == refs, "the store kept a reference to the mapping"


# --- iterators that raise midway, and values that lie ---------------------------------


def raising_midway(items: list[Any], exc: type[BaseException]) -> Iterator[Any]:
    yield from items
    raise exc("the iterator broke")


ITERATOR_POSITIONS: dict[str, Callable[[Any, Any], Any]] = {
    "emits": lambda s, it: s.commit(a(s), it, "ev-new"),
    "timers": lambda s, it: s.commit(a(s), [(None, "x")], "ev-new", it),
    "spawns": lambda s, it: s.commit(a(s), [(None, "x")], "ev-new", spawns=it),
}
ITEMS = {
    "emits": [("b", "x"), (None, "y")],
    "timers": [schedule("p", 7.0), cancel("q"), schedule("new", 1.0)],
    "spawns": [("kid", "r", {"n": 1}), ("kid2", "r", {})],
}


@pytest.mark.parametrize("exc", [Refused, Abort, StopIteration])
@pytest.mark.parametrize("position", list(ITERATOR_POSITIONS))
def test_an_iterator_that_raises_midway(impl: Any, position: str, exc: type) -> None:
    store = impl.DictStore()
    base(store)
    before = view(store)
    # A generator turns a StopIteration raised inside it into RuntimeError (PEP 479).
    expected = RuntimeError if exc is StopIteration else exc
    with pytest.raises(expected):
        ITERATOR_POSITIONS[position](store, raising_midway(ITEMS[position], exc))
    assert_untouched(store, before)


def test_actions_built_at_run_time_act_like_the_literals(impl: Any) -> None:
    """Equal strs that are not the interned literals (read from JSON, joined) take the
    slow path of the timer check, and do what the literals do."""
    schedule_, cancel_ = json.loads('["schedule", "cancel"]')
    assert schedule_ == "schedule" and schedule_ is not sys.intern("schedule")
    store = impl.DictStore()
    exe = Execution(id="e")
    joined = "sched-ule".replace("-", "")  # built at run time, not interned
    store.commit(exe, [], None, [TimerOp(schedule_, "p", 1.0), TimerOp(joined, "q", 2.0)])
    assert store.due_timers(5.0) == [("e", "p", 1.0), ("e", "q", 2.0)]
    store.commit(exe, [], None, [TimerOp(cancel_, "p"), TimerOp(schedule_, "q", 3.0)])
    assert store.due_timers(5.0) == [("e", "q", 3.0)]
    assert store.stats()["timers"] == 1


class NeverEqual(str):
    """A str that says it equals nothing, itself included (``!=`` stays str's)."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


class FlipFlop(str):
    """Equal to ``"schedule"`` the first time it is asked, to ``"cancel"`` after."""

    def __init__(self, value: str) -> None:
        self.asked = 0

    def __eq__(self, other: object) -> bool:
        self.asked += 1
        return other == ("schedule" if self.asked == 1 else "cancel")

    __hash__ = str.__hash__


@pytest.mark.parametrize("armed", [False, True], ids=["empty-heap", "armed-heap"])
@pytest.mark.parametrize("fire_at", [None, "soon", 5, 2.0], ids=repr)
@pytest.mark.parametrize("action", [NeverEqual("cancel"), NeverEqual("schedule"), FlipFlop("x")],
                         ids=["never-equal-cancel", "never-equal-schedule", "flip-flop"])  # fmt: skip
def test_a_timer_action_that_lies_about_equality(
    impl: Any, action: str, fire_at: Any, armed: bool
) -> None:
    """The action is decided once: a refused op leaves the store untouched, an accepted
    one leaves only plain float fire_at values behind and a sweep that works."""
    store = impl.DictStore()
    exe = Execution(id="e")
    store.save(exe)
    if armed:
        store.commit(exe, [], None, [schedule("u", 3.0), schedule("v", 4.0)])
    before = snapshot(store, ["e"], [])
    if isinstance(action, FlipFlop):
        action.asked = 0
    try:
        store.commit(exe, [(None, "x")], None, [TimerOp(action, "t", fire_at)])  # type: ignore[arg-type]
    except (TypeError, ValueError):
        assert snapshot(store, ["e"], []) == before
        return
    due = store.due_timers(math.inf)
    assert all(type(t[2]) is float for t in due), due
    assert store.stats()["timers"] == len(due)
    assert [t for t in due if t[1] != "t"] == before["timers"]
    for t in due:
        store.delete_timer(*t)
    assert store.due_timers(math.inf) == [] and store.stats()["timers"] == 0


# --- trace_max ----------------------------------------------------------------------------

BAD_TRACE_MAX = [-1, -(2**70), 2**70, 1.5, 2.0, "3", b"3", True, False, Decimal(3), [3], math.nan]


@pytest.mark.parametrize("value", BAD_TRACE_MAX, ids=repr)
def test_an_invalid_trace_max_is_refused_and_changes_nothing(impl: Any, value: Any) -> None:
    store = impl.DictStore(trace_max=3)
    base(store)
    for n in range(5):
        store.append_trace("b", {"n": n})
    before = view(store)
    with pytest.raises((TypeError, ValueError)):
        store.trace_max = value
    assert store.trace_max == 3
    assert_untouched(store, before)
    store.append_trace("c", {"n": 1})
    store.append_trace("c", {"n": 2})
    store.append_trace("c", {"n": 3})
    assert [s["index"] for s in store.read_trace("c")] == [1, 2, 3]  # still a ring of 3


@pytest.mark.parametrize("value", BAD_TRACE_MAX, ids=repr)
def test_an_invalid_trace_max_is_refused_by_the_constructors(impl: Any, value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        impl.DictStore(trace_max=value)
    with pytest.raises((TypeError, ValueError)):
        impl.AsyncDictStore(trace_max=value)
    astore = impl.AsyncDictStore(trace_max=4)
    with pytest.raises((TypeError, ValueError)):
        astore.trace_max = value
    assert astore.trace_max == 4


class PlainIntSub(int):
    pass


@pytest.mark.parametrize("value", [PlainIntSub(2), sys.maxsize], ids=["int-subclass", "maxsize"])
def test_unusual_valid_trace_max(impl: Any, value: int) -> None:
    store = impl.DictStore()
    store.trace_max = value
    assert store.trace_max == value
    for n in range(4):
        store.append_trace("e", {"n": n})
    kept = min(4, int.__int__(value))
    assert [s["n"] for s in store.read_trace("e")] == list(range(4))[-kept:]
    assert store.stats()["trace_steps"] == kept


# --- re-entrant callers ----------------------------------------------------------------


class Hook:
    """What fires when a hooked object is hashed, compared, iterated, read or written.

    Only the armed ``site`` fires, and never while a callback already runs. ``propagate``
    says whether an error of the callback escapes into the store's call."""

    def __init__(self) -> None:
        self.site: str | None = None
        self.callback: Callable[[], None] | None = None
        self.active = False
        self.propagate = True
        self.fired = 0

    def fire(self, site: str) -> None:
        if site != self.site or self.active or self.callback is None or self.fired >= 25:
            return
        self.active = True
        self.fired += 1
        try:
            self.callback()
        except Exception:
            if self.propagate:
                raise
        finally:
            self.active = False


HOOK = Hook()


class HookKey:
    """Equal to every ``HookKey`` of the same name; hashing fires ``<role>-hash``,
    comparing fires ``<role>-eq``."""

    def __init__(self, name: str, role: str) -> None:
        self.name = name
        self.role = role

    def __hash__(self) -> int:
        HOOK.fire(self.role + "-hash")
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        HOOK.fire(self.role + "-eq")
        return isinstance(other, HookKey) and other.name == self.name

    def __deepcopy__(self, memo: dict) -> HookKey:
        return self

    def __repr__(self) -> str:
        return f"HookKey({self.name!r})"


class HookedExe:
    """An engine's own execution: reading or writing ``version`` fires ``version``."""

    def __init__(self, eid: Any, label: str) -> None:
        self.id = eid
        self.label = label
        self._version = 0

    @property
    def version(self) -> int:
        HOOK.fire("version")
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        HOOK.fire("version")
        self._version = value


class HookedMapping(Mapping):  # type: ignore[type-arg]
    def __init__(self, data: dict) -> None:
        self.data = data

    def __getitem__(self, key: Any) -> Any:
        HOOK.fire("trace-mapping")
        return self.data[key]

    def __iter__(self) -> Iterator[Any]:
        HOOK.fire("trace-mapping")
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


def hooked_emits() -> Iterator[tuple[Any, Any]]:
    yield ("a", "outer-0")
    HOOK.fire("emits-iter")
    yield (None, "outer-1")


def xid() -> HookKey:
    return HookKey("x", "id")


def xpath() -> HookKey:
    return HookKey("px", "path")


def xevent() -> HookKey:
    return HookKey("ev-x", "pid")


@dataclass
class World:
    """The objects of one run: ``x`` is stored under ``key`` (a HookKey), with its mark
    ``pid`` and its timer ``path`` at 4.0."""

    x: HookedExe
    key: HookKey
    pid: HookKey
    path: HookKey
    b: Execution
    inner: list[int] = field(default_factory=list)  # the inner calls that succeeded


def setup_world(store: Any) -> World:
    exe_a = Execution(id="a", definition_id="a")
    store.commit(exe_a, [("b", "a0")], "ev-a", [schedule("p", 1.0), schedule("q", 5.0)],
                 [("ka", "r", {})], {"s": "a0"})  # fmt: skip
    b = Execution(id="b", definition_id="b")
    store.commit(b, [], "ev-b", [schedule("p", 2.0)], trace={"s": "b0"})
    # Forgetting "big" kills 70 timers at once: the store tidies its timer heap.
    store.commit(Execution(id="big", definition_id="big"), [],
                 timers=[schedule(n, 100.0 + n) for n in range(70)])  # fmt: skip
    w = World(HookedExe(xid(), "x"), xid(), xevent(), xpath(), b)
    w.x.id = w.key
    store.commit(w.x, [("a", "x0")], w.pid, [schedule(w.path, 4.0), schedule("q", 6.0)],
                 [("kx", "r", {})], {"s": "x0"})  # fmt: skip
    return w


# What the outer call is; the trigger picks which of its arguments carries the hook.
# "-eq" triggers hand over an equal twin of the stored object, so lookups compare.
def twin_or_same(w: World, trigger: str, role: str) -> HookKey:
    stored = {"id": w.key, "pid": w.pid, "path": w.path}[role]
    if trigger == f"{role}-eq":
        return HookKey(stored.name, role)
    return stored


def outer_commit(store: Any, w: World, trigger: str) -> None:
    w.x.id = twin_or_same(w, trigger, "id")
    emits = hooked_emits() if trigger == "emits-iter" else [("a", "outer-0"), (None, "outer-1")]
    trace = HookedMapping({"s": "outer"}) if trigger == "trace-mapping" else {"s": "outer"}
    store.commit(
        w.x,
        emits,
        twin_or_same(w, trigger, "pid"),
        [schedule(twin_or_same(w, trigger, "path"), 3.0), cancel("q"), schedule("new", 0.5)],
        [("ko", "r", {"n": 1})],
        trace,
    )


def outer_forget(store: Any, w: World, trigger: str) -> None:
    store.forget(twin_or_same(w, trigger, "id"))


def outer_delete_timer(store: Any, w: World, trigger: str) -> None:
    store.delete_timer(twin_or_same(w, trigger, "id"), twin_or_same(w, trigger, "path"), 4.0)


def outer_append_trace(store: Any, w: World, trigger: str) -> None:
    trace = HookedMapping({"s": "outer"}) if trigger == "trace-mapping" else {"s": "outer"}
    store.append_trace(twin_or_same(w, trigger, "id"), trace)


OUTERS: dict[str, tuple[Callable[[Any, World, str], None], list[str]]] = {
    "commit": (outer_commit, ["id-hash", "id-eq", "pid-hash", "pid-eq", "path-hash", "path-eq",
                              "emits-iter", "trace-mapping", "version"]),
    "forget": (outer_forget, ["id-hash", "id-eq"]),
    "delete_timer": (outer_delete_timer, ["id-hash", "id-eq", "path-hash", "path-eq"]),
    "append_trace": (outer_append_trace, ["id-hash", "id-eq", "trace-mapping"]),
}  # fmt: skip


def inner_intruder(store: Any, w: World, n: int) -> None:
    """Another writer commits a different object under x's id, at the stored version."""
    stored = store.load(xid())
    version = 0 if stored is None else stored.version
    intruder = Execution(id=xid(), definition_id=f"intruder-{n}", version=version)
    store.commit(intruder, [(None, f"intruder-{n}")], f"ev-in-{n}", trace={"intruder": n})


# What the callback does, the n-th time it fires. Each is one call or a few, and each
# must behave as if it ran before or after the whole outer call.
INNERS: dict[str, Callable[[Any, World, int], Any]] = {
    "commit-other": lambda s, w, n: s.commit(w.b, [(None, f"in-{n}")], f"ev-in-{n}",
                                             [schedule("p", 10.0 + n)], [(f"kin-{n}", "r", {})],
                                             {"in": n}),
    "commit-intruder": inner_intruder,
    "ack": lambda s, w, n: (s.ack_outbox(n + 1), s.ack_spawn(n + 1)),
    "forget-x": lambda s, w, n: s.forget(xid()),
    "trace-x": lambda s, w, n: s.append_trace(xid(), {"in": n}),
    "delete-x-timer": lambda s, w, n: s.delete_timer(xid(), xpath(), 4.0),
    "forget-big": lambda s, w, n: s.forget("big"),
    "trace-max": lambda s, w, n: setattr(s, "trace_max", 1 + n % 2),
}  # fmt: skip

R_IDS: list[Any] = ["a", "b", "big", "kx", "ko"]
R_EVENTS: list[Any] = ["ev-a", "ev-b"] + [f"ev-in-{n}" for n in range(26)]


def label(exe: Any) -> Any:
    return getattr(exe, "label", None) or exe.definition_id


def world_view(store: Any, w: World) -> dict[str, Any]:
    ids = [*R_IDS, xid()]
    return {
        **snapshot(store, ids, [*R_EVENTS, xevent()], identify=label),
        "x.version": w.x._version,
        "trace_max": store.trace_max,
    }


def run_hooked(
    impl: Any, outer: str, trigger: str, inner: str, propagate: bool
) -> tuple[Any, World, bool]:
    store = impl.DictStore()
    w = setup_world(store)
    n = 0

    def callback() -> None:
        nonlocal n
        n += 1
        INNERS[inner](store, w, n - 1)
        w.inner.append(n - 1)

    HOOK.site, HOOK.callback, HOOK.propagate, HOOK.fired = trigger, callback, propagate, 0
    try:
        OUTERS[outer][0](store, w, trigger)
        outer_ok = True
    except Exception:  # noqa: BLE001 - whatever it raised, it must have written nothing
        outer_ok = False
    finally:
        HOOK.site, HOOK.callback = None, None
    return store, w, outer_ok


def serial_views(impl: Any, outer: str, trigger: str, inner: str, calls: list[int],
                 outer_ok: bool) -> list[dict[str, Any]]:  # fmt: skip
    """The views of every serial order of the calls that succeeded: the inner ones in
    their order, the outer one (if it succeeded) anywhere among them."""
    positions = range(len(calls) + 1) if outer_ok else [None]
    views = []
    for at in positions:
        store = impl.DictStore()
        w = setup_world(store)
        try:
            for i, n in enumerate([*calls, None]):
                if i == at:
                    OUTERS[outer][0](store, w, trigger)
                if n is not None:
                    INNERS[inner](store, w, n)
        except Exception:  # noqa: BLE001, S112 - a call that fails here cannot have run here
            continue
        views.append(world_view(store, w))
    return views


def consistency_problems(store: Any, w: World, outer: str, outer_ok: bool) -> list[str]:
    """What must hold however the calls interleaved."""
    problems = []
    views = observed(store, [*R_IDS, xid()], [*R_EVENTS, xevent()])
    if store.stats() != views:
        problems.append(f"stats {store.stats()} != views {views}")
    for pending in (store.pending_outbox(), store.pending_spawns()):
        seqs = [e.seq for e in pending]
        if seqs != sorted(set(seqs)):
            problems.append(f"seqs not unique and increasing: {seqs}")
    if not outer_ok and outer in ("commit", "append_trace"):
        left = [e for e in store.pending_outbox() if str(e.event).startswith("outer")]
        left += [e for e in store.pending_spawns() if e.child_id == "ko"]
        left += [t for t in store.due_timers(math.inf) if t[1] == "new"]
        left += [s for s in store.read_trace(xid()) if s.get("s") == "outer"]
        if left or (outer == "commit" and w.x._version != 1):
            problems.append(f"the outer call raised but left {left}, x.version {w.x._version}")
    due = store.due_timers(math.inf)
    if [t[2] for t in due] != sorted(t[2] for t in due):
        problems.append(f"due_timers out of order: {due}")
    for t in due:
        store.delete_timer(*t)
    if store.due_timers(math.inf) or store.stats()["timers"]:
        problems.append(
            f"timers that cannot be deleted: {store.due_timers(math.inf)},"
            f" stats {store.stats()['timers']}"
        )
    return problems


@functools.cache
def reentrancy_problems(
    impl: Any, outer: str, trigger: str, inner: str, propagate: bool
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(consistency problems, atomicity problems) of one hooked run."""
    store, w, outer_ok = run_hooked(impl, outer, trigger, inner, propagate)
    actual = world_view(store, w)
    serial = serial_views(impl, outer, trigger, inner, w.inner, outer_ok)
    atomicity = []
    if actual not in serial:
        atomicity.append(
            f"not the result of any serial order (outer {'succeeded' if outer_ok else 'raised'},"
            f" {len(w.inner)} inner calls succeeded)"
        )
    return tuple(consistency_problems(store, w, outer, outer_ok)), tuple(atomicity)


REENTRANT = pytest.mark.parametrize(
    ("outer", "trigger"),
    [(outer, trigger) for outer, (_, triggers) in OUTERS.items() for trigger in triggers],
)
PROPAGATE = pytest.mark.parametrize(
    "propagate", [True, False], ids=["errors-escape", "errors-swallowed"]
)


def report(impl: Any, outer: str, trigger: str, propagate: bool, which: int) -> str:
    failures = {}
    for inner in INNERS:
        problems = reentrancy_problems(impl, outer, trigger, inner, propagate)[which]
        if problems:
            failures[inner] = problems
    return "\n".join(f"inner {k}: {'; '.join(v)}" for k, v in failures.items())


@PROPAGATE
@REENTRANT
def test_reentrant_calls_leave_the_store_consistent(
    impl: Any, outer: str, trigger: str, propagate: bool
) -> None:
    """``outer`` runs with an argument whose ``trigger`` calls back into the store each
    time it runs (each inner call of ``INNERS`` in turn). Whatever interleaving results,
    stats match the views, seqs are unique and increasing, every armed timer can be
    deleted, and an outer call that raised left nothing behind."""
    problems = report(impl, outer, trigger, propagate, 0)
    assert not problems, problems


@PROPAGATE
@REENTRANT
def test_reentrant_calls_are_each_all_or_nothing(
    impl: Any, outer: str, trigger: str, propagate: bool
) -> None:
    """The same runs: the store ends as if the calls that succeeded had run one after
    another, the outer one whole, at one point among the inner ones."""
    problems = report(impl, outer, trigger, propagate, 1)
    assert not problems, problems


# --- crash safety, in a subprocess -------------------------------------------------------


def crash_probe() -> None:
    """Every dangerous case above, run for effect only, then the store used hard. Run in a
    subprocess under ``-X dev`` (debug allocator hooks): it must exit cleanly."""
    import gc
    import importlib

    from conftest import load_impl

    impl = load_impl("compiled")
    for case in HASH_CASES:
        for exc in (Refused, Abort):
            store = impl.DictStore()
            base(store)
            try:
                case.call(store, HashRaises(exc))
            except (exc, TypeError, ValueError):
                pass
            exercise(store)
    for outer, (_, triggers) in OUTERS.items():
        for trigger in triggers:
            for inner in INNERS:
                for propagate in (True, False):
                    store, _, _ = run_hooked(impl, outer, trigger, inner, propagate)
                    exercise(store)
    for case in EQ_CASES:
        store = impl.DictStore()
        base(store)
        e0 = EqRaises("k")
        case.plant(store, e0)
        try:
            case.call(store, e0, EqRaises("k"))
        except Refused:
            pass
        exercise(store)
    for action in (NeverEqual("cancel"), NeverEqual("schedule")):
        for fire_at in (None, "soon", 5, 2.0, object()):
            store = impl.DictStore()
            store.commit(Execution(id="e"), [], None, [schedule("u", 3.0)])
            try:
                store.commit(store.load("e"), [], None, [TimerOp(action, "t", fire_at)])  # type: ignore[arg-type]
            except (TypeError, ValueError):
                pass
            exercise(store)
    importlib.invalidate_caches()
    gc.collect()
    print("probe ok")


def exercise(store: Any) -> None:
    """Use every read and write path; errors are fine, crashes are not."""
    for call in (
        lambda: store.stats(),
        lambda: store.due_timers(math.inf),
        lambda: store.due_timers(4.5),
        lambda: [store.delete_timer(*t) for t in store.due_timers(math.inf)],
        lambda: [store.ack_outbox(e.seq) for e in store.pending_outbox()[::-1]],
        lambda: [store.ack_spawn(e.seq) for e in store.pending_spawns()],
        lambda: store.commit(
            Execution(id="after"), [(None, 1)], "m", [schedule("t", 1.0)], [("k", "r", {})], {}
        ),
        lambda: [store.read_trace(i) for i in ("a", "b", "after")],
        lambda: setattr(store, "trace_max", 1),
        lambda: store.append_trace("after", {"s": 2}),
        lambda: [store.forget(i) for i in ("a", "b", "big", "after", xid())],
        lambda: store.due_timers(math.inf),
    ):
        try:
            call()
        except Exception:  # noqa: BLE001, S110 - errors are fine here, crashes are not
            pass


@pytest.mark.compiled
def test_the_dangerous_cases_do_not_crash_the_compiled_store(compiled_module: Any) -> None:
    """The pure store cannot crash the interpreter; the compiled one must not either."""
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])}
    proc = subprocess.run(
        [sys.executable, "-X", "dev", "-X", "faulthandler", "-c",
         "import test_hostile; test_hostile.crash_probe()"],
        cwd=tests, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"exit {proc.returncode} (negative: killed by a signal)\n{output}"
    assert proc.stdout.strip().endswith("probe ok")
