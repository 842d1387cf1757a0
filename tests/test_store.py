"""What the specification promises, checked on both implementations, sync and async.

``any_store`` is the sync store or the async one behind a sync facade (each coroutine run
with ``asyncio.run``), so each promise is written once and checked four times.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import types
from collections.abc import Callable
from typing import Any

import pytest
from _helpers import API_METHODS, EXTRA_METHODS, drive, snapshot

from harel_store import (
    DEFAULT_TRACE_MAX,
    Execution,
    OutboxEntry,
    SpawnEntry,
    StoreConflict,
    TimerOp,
)


def schedule(path: Any, fire_at: Any) -> TimerOp:
    return TimerOp("schedule", path, fire_at)


def cancel(path: Any) -> TimerOp:
    return TimerOp("cancel", path)


def saved(store: Any, eid: Any = "e1", **fields: Any) -> Execution:
    exe = Execution(id=eid, **fields)
    store.save(exe)
    return exe


class TestLoadAndSave:
    def test_load_unknown_is_none(self, any_store: Any) -> None:
        assert any_store.load("nope") is None

    def test_load_returns_the_saved_object_itself(self, any_store: Any) -> None:
        exe = saved(any_store, context={"n": 1})
        assert any_store.load("e1") is exe
        exe.context["n"] = 2
        exe.status = "done"
        loaded = any_store.load("e1")
        assert loaded is exe and loaded.context == {"n": 2} and loaded.status == "done"
        any_store.commit(exe, [(None, "ev")])
        assert any_store.load("e1") is exe

    def test_save_bumps_the_version_in_place(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        any_store.save(exe)
        assert exe.version == 1
        any_store.save(exe)
        any_store.commit(exe, [])
        assert exe.version == 3 and any_store.load("e1").version == 3

    def test_first_write_takes_any_version(self, any_store: Any) -> None:
        exe = Execution(id="e1", version=41)
        any_store.save(exe)
        assert exe.version == 42 and any_store.load("e1") is exe

    def test_same_object_always_wins(self, any_store: Any) -> None:
        exe = saved(any_store)
        for version in (99, 0, 7):
            exe.version = version
            any_store.save(exe)
            assert exe.version == version + 1 and any_store.load("e1") is exe

    def test_different_object_at_the_same_version_replaces(self, any_store: Any) -> None:
        first = saved(any_store)
        first_version = first.version
        second = Execution(id="e1", version=first.version)
        any_store.save(second)
        assert any_store.load("e1") is second
        assert second.version == first_version + 1 and first.version == first_version

    @pytest.mark.parametrize("stale", [0, 5], ids=["behind", "ahead"])
    @pytest.mark.parametrize("method", ["save", "commit"])
    def test_different_object_at_another_version_conflicts(
        self, any_store: Any, method: str, stale: int
    ) -> None:
        first = saved(any_store)
        any_store.save(first)  # version 2
        rival = Execution(id="e1", version=stale)
        args = (rival, [(None, "ev")]) if method == "commit" else (rival,)
        with pytest.raises(StoreConflict, match="'e1'") as info:
            getattr(any_store, method)(*args)
        err = info.value
        assert isinstance(err, Exception)
        assert (err.execution_id, err.expected, err.found) == ("e1", stale, 2)
        assert any_store.load("e1") is first and first.version == 2 and rival.version == stale

    def test_ids_are_independent(self, any_store: Any) -> None:
        one = saved(any_store, "e1")
        two = saved(any_store, "e2", version=7)
        assert any_store.load("e1") is one and any_store.load("e2") is two
        assert (one.version, two.version) == (1, 8)


class UserExecution:
    """An engine's own execution class: just ``id`` and ``version``."""

    def __init__(self, id: Any, version: int = 0) -> None:
        self.id = id
        self.version = version


class SlottedExecution:
    __slots__ = ("extra", "id", "version")

    def __init__(self, id: Any, version: int = 0) -> None:
        self.id = id
        self.version = version


@pytest.mark.parametrize("cls", [UserExecution, SlottedExecution])
@pytest.mark.parametrize("eid", ["e1", 7, ("order", 7), frozenset({1})], ids=repr)
def test_any_object_with_id_and_version_works(any_store: Any, cls: type, eid: Any) -> None:
    exe = cls(eid)
    any_store.commit(exe, [(eid, "ev")], "seen", [schedule("p", 5)], [("c", "r", {})], {"s": 1})
    assert any_store.load(eid) is exe and exe.version == 1
    assert any_store.is_processed(eid, "seen")
    assert any_store.pending_outbox() == [OutboxEntry(1, eid, "ev")]
    assert any_store.pending_spawns() == [SpawnEntry(1, eid, "c", "r", {})]
    assert any_store.due_timers(5) == [(eid, "p", 5.0)]
    assert any_store.read_trace(eid) == [{"s": 1, "index": 0}]
    rival = cls(eid, version=0)
    with pytest.raises(StoreConflict):
        any_store.save(rival)
    any_store.save(cls(eid, version=1))
    assert any_store.load(eid) is not exe


class TestCommit:
    def test_emits_go_to_the_outbox_in_order_from_seq_1(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        any_store.commit(exe, [(None, "a"), ("e2", {"kind": "b"})])
        any_store.commit(exe, (("e3", "c"),))
        pending = any_store.pending_outbox()
        assert pending == [
            OutboxEntry(1, None, "a"),
            OutboxEntry(2, "e2", {"kind": "b"}),
            OutboxEntry(3, "e3", "c"),
        ]
        assert all(type(entry) is OutboxEntry for entry in pending)

    def test_emits_may_be_any_iterable_of_pairs(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        any_store.commit(exe, iter([["t", "a"]]))
        any_store.commit(exe, ((t, e) for t, e in [("u", "b")]))
        assert any_store.pending_outbox() == [OutboxEntry(1, "t", "a"), OutboxEntry(2, "u", "b")]

    def test_outbox_and_spawn_seqs_are_independent(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        any_store.commit(exe, [(None, "a"), (None, "b")], spawns=[("c1", "r", {})])
        any_store.commit(exe, [], spawns=[("c2", "r", {}), ("c3", "r", {})])
        any_store.commit(exe, [(None, "c")])
        assert [e.seq for e in any_store.pending_outbox()] == [1, 2, 3]
        assert [s.seq for s in any_store.pending_spawns()] == [1, 2, 3]

    def test_seqs_are_not_reused_after_acks(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        any_store.commit(exe, [(None, "a")], spawns=[("c1", "r", {})])
        any_store.ack_outbox(1)
        any_store.ack_spawn(1)
        any_store.commit(exe, [(None, "b")], spawns=[("c2", "r", {})])
        assert any_store.pending_outbox() == [OutboxEntry(2, None, "b")]
        assert [s.seq for s in any_store.pending_spawns()] == [2]

    def test_processed_marks(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        assert not any_store.is_processed("e1", "ev1")
        any_store.commit(exe, [], "ev1")
        any_store.commit(exe, [], None)
        assert any_store.is_processed("e1", "ev1")
        assert not any_store.is_processed("e1", "ev2")
        assert not any_store.is_processed("e2", "ev1")
        assert not any_store.is_processed("e1", None)
        any_store.commit(Execution(id="e2"), [], ("tuple", 1))
        assert any_store.is_processed("e2", ("tuple", 1)) and not any_store.is_processed("e1", "x")

    def test_spawn_entry_fields(self, any_store: Any) -> None:
        parent = Execution(id="p1")
        any_store.commit(parent, [], spawns=[("c1", ("fulfil", "pack"), {"n": 1}), ["c2", "r", {}]])
        pending = any_store.pending_spawns()
        assert pending == [
            SpawnEntry(1, "p1", "c1", ("fulfil", "pack"), {"n": 1}),
            SpawnEntry(2, "p1", "c2", "r", {}),
        ]
        assert all(type(entry) is SpawnEntry for entry in pending)

    @pytest.mark.parametrize("wrap", [dict, types.MappingProxyType], ids=["dict", "mappingproxy"])
    def test_spawn_context_is_copied(
        self, any_store: Any, wrap: Callable[[dict[str, Any]], Any]
    ) -> None:
        parent = Execution(id="p1", context={"n": 1})
        context = wrap(parent.context)
        any_store.commit(parent, [], spawns=[("c1", "r", context)])
        parent.context["n"] = 2
        parent.context["late"] = True
        (entry,) = any_store.pending_spawns()
        assert entry.context == {"n": 1}
        assert type(entry.context) is dict and entry.context is not parent.context

    def test_commit_order_cas_first(self, any_store: Any) -> None:
        exe = saved(any_store)
        any_store.commit(
            exe, [(None, "kept")], "ev0", [schedule("p", 1)], [("c", "r", {})], {"s": 0}
        )
        before = snapshot(any_store, ["e1"], ["ev0", "ev1"])
        stale = Execution(id="e1", version=0)
        with pytest.raises(StoreConflict):
            any_store.commit(
                stale, [(None, "lost")], "ev1", [schedule("q", 2)], [("c2", "r", {})], {"s": 1}
            )
        assert snapshot(any_store, ["e1"], ["ev0", "ev1"]) == before
        assert stale.version == 0


FIFOS = [
    pytest.param(
        lambda store, exe, items: store.commit(exe, [(None, i) for i in items]),
        "pending_outbox",
        "ack_outbox",
        id="outbox",
    ),
    pytest.param(
        lambda store, exe, items: store.commit(exe, [], spawns=[(i, "r", {}) for i in items]),
        "pending_spawns",
        "ack_spawn",
        id="spawns",
    ),
]


@pytest.mark.parametrize(("fill", "pending", "ack"), FIFOS)
class TestFifos:
    def test_pending_returns_a_copy(
        self, any_store: Any, fill: Any, pending: str, ack: str
    ) -> None:
        fill(any_store, Execution(id="e1"), ["a", "b"])
        first = getattr(any_store, pending)()
        assert first == getattr(any_store, pending)() and len(first) == 2
        first.clear()
        first.append("junk")
        assert len(getattr(any_store, pending)()) == 2
        assert getattr(any_store, pending)() is not getattr(any_store, pending)()

    def test_empty(self, any_store: Any, fill: Any, pending: str, ack: str) -> None:
        assert getattr(any_store, pending)() == []

    def test_ack_in_any_order(self, any_store: Any, fill: Any, pending: str, ack: str) -> None:
        fill(any_store, Execution(id="e1"), ["a", "b", "c", "d", "e"])
        for seq in (3, 1, 5):
            getattr(any_store, ack)(seq)
        assert [entry.seq for entry in getattr(any_store, pending)()] == [2, 4]
        for seq in (4, 2):
            getattr(any_store, ack)(seq)
        assert getattr(any_store, pending)() == []

    @pytest.mark.parametrize("seq", [0, -1, 3, 10**30])
    def test_ack_of_an_unknown_seq_is_a_no_op(
        self, any_store: Any, fill: Any, pending: str, ack: str, seq: int
    ) -> None:
        fill(any_store, Execution(id="e1"), ["a", "b"])
        before = getattr(any_store, pending)()
        getattr(any_store, ack)(seq)
        assert getattr(any_store, pending)() == before

    def test_ack_twice_is_a_no_op(self, any_store: Any, fill: Any, pending: str, ack: str) -> None:
        fill(any_store, Execution(id="e1"), ["a", "b", "c"])
        getattr(any_store, ack)(2)
        getattr(any_store, ack)(2)
        assert [entry.seq for entry in getattr(any_store, pending)()] == [1, 3]


class TestTimers:
    def test_due_timers_returns_due_ones_oldest_first(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        any_store.commit(exe, [], timers=[schedule("late", 10.0), schedule("early", 5.0)])
        any_store.commit(Execution(id="e2"), [], timers=[schedule("mid", 7.5)])
        assert any_store.due_timers(4.999) == []
        assert any_store.due_timers(5.0) == [("e1", "early", 5.0)]
        assert any_store.due_timers(9) == [("e1", "early", 5.0), ("e2", "mid", 7.5)]
        everything = [("e1", "early", 5.0), ("e2", "mid", 7.5), ("e1", "late", 10.0)]
        assert any_store.due_timers(10) == everything
        assert any_store.due_timers(math.inf) == everything
        assert any_store.due_timers(-math.inf) == []

    def test_timers_stay_armed_until_deleted(self, any_store: Any) -> None:
        any_store.commit(Execution(id="e1"), [], timers=[schedule("p", 1.0)])
        assert any_store.due_timers(2.0) == [("e1", "p", 1.0)]
        assert any_store.due_timers(2.0) == [("e1", "p", 1.0)]
        any_store.delete_timer("e1", "p", 1.0)
        assert any_store.due_timers(2.0) == []

    def test_fire_at_is_stored_as_a_float(self, any_store: Any) -> None:
        any_store.commit(Execution(id="e1"), [], timers=[schedule("p", 7)])
        ((_, _, fire_at),) = any_store.due_timers(7)
        assert fire_at == 7.0 and type(fire_at) is float

    def test_rearm_replaces(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        any_store.commit(exe, [], timers=[schedule("p", 10.0)])
        any_store.commit(exe, [], timers=[schedule("p", 20.0)])
        assert any_store.due_timers(15.0) == []
        assert any_store.due_timers(math.inf) == [("e1", "p", 20.0)]
        any_store.commit(exe, [], timers=[schedule("p", 3.0), schedule("p", 4.0)])
        assert any_store.due_timers(math.inf) == [("e1", "p", 4.0)]

    def test_timer_key_is_execution_and_path(self, any_store: Any) -> None:
        any_store.commit(Execution(id="e1"), [], timers=[schedule("p", 1.0), schedule("q", 1.0)])
        any_store.commit(Execution(id="e2"), [], timers=[schedule("p", 2.0)])
        assert sorted(any_store.due_timers(math.inf)) == [
            ("e1", "p", 1.0),
            ("e1", "q", 1.0),
            ("e2", "p", 2.0),
        ]

    def test_cancel(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        any_store.commit(exe, [], timers=[schedule("p", 1.0), schedule("q", 2.0)])
        any_store.commit(exe, [], timers=[cancel("p"), cancel("never-armed")])
        assert any_store.due_timers(math.inf) == [("e1", "q", 2.0)]
        any_store.commit(Execution(id="e2"), [], timers=[cancel("q")])
        assert any_store.due_timers(math.inf) == [("e1", "q", 2.0)]
        any_store.commit(exe, [], timers=[schedule("p", 5.0), cancel("p"), cancel("q")])
        assert any_store.due_timers(math.inf) == []
        any_store.commit(exe, [], timers=[cancel("p"), schedule("p", 6.0)])
        assert any_store.due_timers(math.inf) == [("e1", "p", 6.0)]

    @pytest.mark.parametrize("swept", [True, False], ids=["swept", "unswept"])
    def test_ties_go_in_arming_order_and_a_rearm_counts_as_new(
        self, any_store: Any, swept: bool
    ) -> None:
        """``swept``: a sweep ran between the armings and the re-arm."""
        e1, e2 = Execution(id="e1"), Execution(id="e2")
        any_store.commit(e1, [], timers=[schedule("b", 5.0)])
        any_store.commit(e2, [], timers=[schedule("a", 5.0)])
        any_store.commit(e1, [], timers=[schedule("a", 5.0)])
        if swept:
            order = [("e1", "b", 5.0), ("e2", "a", 5.0), ("e1", "a", 5.0)]
            assert any_store.due_timers(5.0) == order
        any_store.commit(e1, [], timers=[schedule("b", 5)])
        assert any_store.due_timers(5.0) == [("e2", "a", 5.0), ("e1", "a", 5.0), ("e1", "b", 5.0)]
        any_store.commit(e2, [], timers=[schedule("a", 4.0), schedule("a", 5.0)])
        assert any_store.due_timers(5.0) == [("e1", "a", 5.0), ("e1", "b", 5.0), ("e2", "a", 5.0)]

    @pytest.mark.parametrize("fire_at", [10.0, 10], ids=["float", "int"])
    def test_delete_timer_with_the_fired_time(self, any_store: Any, fire_at: float) -> None:
        any_store.commit(Execution(id="e1"), [], timers=[schedule("p", 10.0), schedule("q", 10.0)])
        any_store.delete_timer("e1", "p", fire_at)
        assert any_store.due_timers(math.inf) == [("e1", "q", 10.0)]

    def test_a_stale_sweep_does_not_delete_a_rearmed_timer(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        any_store.commit(exe, [], timers=[schedule("p", 10.0)])
        ((eid, path, fired_at),) = any_store.due_timers(10.0)
        any_store.commit(exe, [], timers=[schedule("p", 20.0)])  # re-armed meanwhile
        any_store.delete_timer(eid, path, fired_at)
        assert any_store.due_timers(math.inf) == [("e1", "p", 20.0)]

    @pytest.mark.parametrize(
        "args", [("e9", "p", 1.0), ("e1", "zz", 1.0), ("e1", "p", 2.0), ("e1", "p", math.nan)]
    )
    def test_delete_timer_that_does_not_match_is_a_no_op(
        self, any_store: Any, args: tuple[Any, ...]
    ) -> None:
        any_store.commit(Execution(id="e1"), [], timers=[schedule("p", 1.0)])
        any_store.delete_timer(*args)
        assert any_store.due_timers(math.inf) == [("e1", "p", 1.0)]

    def test_a_deleted_timer_can_be_armed_again(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        any_store.commit(exe, [], timers=[schedule("p", 1.0)])
        any_store.delete_timer("e1", "p", 1.0)
        any_store.delete_timer("e1", "p", 1.0)
        any_store.commit(exe, [], timers=[schedule("p", 1.0)])
        assert any_store.due_timers(1.0) == [("e1", "p", 1.0)]


def steps(store: Any, eid: Any = "e1") -> list[int]:
    return [step["index"] for step in store.read_trace(eid)]


class TestTrace:
    def test_steps_get_a_monotonic_index_from_0(self, any_store: Any) -> None:
        for n in range(3):
            any_store.append_trace("e1", {"event": f"ev{n}"})
        assert any_store.read_trace("e1") == [
            {"event": "ev0", "index": 0},
            {"event": "ev1", "index": 1},
            {"event": "ev2", "index": 2},
        ]

    def test_index_is_per_execution(self, any_store: Any) -> None:
        any_store.append_trace("e1", {})
        any_store.append_trace("e2", {})
        any_store.append_trace("e1", {})
        assert (steps(any_store, "e1"), steps(any_store, "e2")) == ([0, 1], [0])

    def test_commit_records_a_step_sharing_the_counter(self, any_store: Any) -> None:
        exe = Execution(id="e1")
        any_store.commit(exe, [], trace={"transition": "go"})
        any_store.commit(exe, [])
        any_store.commit(exe, [], trace=None)
        any_store.append_trace("e1", {"transition": "seam"})
        any_store.commit(exe, [], trace={"transition": "stop"})
        assert any_store.read_trace("e1") == [
            {"transition": "go", "index": 0},
            {"transition": "seam", "index": 1},
            {"transition": "stop", "index": 2},
        ]

    def test_an_explicit_index_is_honoured_and_the_counter_advances(self, any_store: Any) -> None:
        any_store.append_trace("e1", {"index": 42})
        any_store.commit(Execution(id="e1"), [], trace={"index": "custom"})
        any_store.append_trace("e1", {})
        assert steps(any_store) == [42, "custom", 2]

    def test_the_callers_entry_is_copied_not_stamped(self, any_store: Any) -> None:
        entry = {"event": "ev"}
        any_store.append_trace("e1", entry)
        assert entry == {"event": "ev"}
        entry["event"] = "changed"
        assert any_store.read_trace("e1") == [{"event": "ev", "index": 0}]

    def test_the_index_survives_trimming(self, make_any_store: Callable[..., Any]) -> None:
        store = make_any_store(trace_max=3)
        for n in range(7):
            store.append_trace("e1", {"n": n})
        assert store.read_trace("e1") == [{"n": n, "index": n} for n in (4, 5, 6)]

    def test_default_ring_is_200(self, any_store: Any) -> None:
        assert any_store.trace_max == DEFAULT_TRACE_MAX == 200
        for _ in range(205):
            any_store.append_trace("e1", {})
        assert steps(any_store) == list(range(5, 205))

    @pytest.mark.parametrize("trace_max", [0, None])
    def test_falsy_trace_max_is_unbounded(
        self, make_any_store: Callable[..., Any], trace_max: Any
    ) -> None:
        store = make_any_store(trace_max=trace_max)
        assert store.trace_max == trace_max
        for _ in range(250):
            store.append_trace("e1", {})
        assert steps(store) == list(range(250))

    def test_trace_max_changes_apply_at_the_next_append_per_id(
        self, make_any_store: Callable[..., Any]
    ) -> None:
        store = make_any_store(trace_max=None)
        for _ in range(10):
            store.append_trace("e1", {})
            store.append_trace("e2", {})
        store.trace_max = 3
        assert store.trace_max == 3
        assert len(store.read_trace("e1")) == len(store.read_trace("e2")) == 10
        store.append_trace("e1", {})
        assert steps(store, "e1") == [8, 9, 10] and len(store.read_trace("e2")) == 10
        store.commit(Execution(id="e2"), [], trace={})
        assert steps(store, "e2") == [8, 9, 10]
        store.trace_max = 5
        store.append_trace("e1", {})
        assert steps(store, "e1") == [8, 9, 10, 11]
        store.trace_max = 0
        for _ in range(3):
            store.append_trace("e1", {})
        assert steps(store, "e1") == list(range(8, 15))
        store.trace_max = 1
        store.append_trace("e1", {})
        store.append_trace("e1", {})
        assert steps(store, "e1") == [16]

    @pytest.mark.parametrize(
        ("value", "error"), [(-1, ValueError), ("3", TypeError), (2.0, TypeError)]
    )
    def test_invalid_trace_max_is_refused(
        self, make_any_store: Callable[..., Any], value: Any, error: type
    ) -> None:
        with pytest.raises(error, match="trace_max"):
            make_any_store(trace_max=value)
        store = make_any_store(trace_max=4)
        with pytest.raises(error, match="trace_max"):
            store.trace_max = value
        assert store.trace_max == 4

    def test_read_trace_returns_a_copy(self, any_store: Any) -> None:
        assert any_store.read_trace("unknown") == []
        any_store.append_trace("e1", {"a": 1})
        got = any_store.read_trace("e1")
        got.clear()
        assert any_store.read_trace("e1") == [{"a": 1, "index": 0}]
        assert any_store.read_trace("e1") is not any_store.read_trace("e1")

    def test_load_is_unaffected_by_trace(self, any_store: Any) -> None:
        any_store.append_trace("ghost", {"a": 1})
        assert any_store.load("ghost") is None
        exe = saved(any_store)
        any_store.append_trace("e1", {"a": 1})
        assert any_store.load("e1") is exe and exe.version == 1

    def test_record_trace_is_the_plain_recorder(self, any_store: Any) -> None:
        assert not inspect.iscoroutinefunction(any_store._record_trace)
        assert any_store._record_trace("e1", {"via": "recorder"}) is None
        any_store.append_trace("e1", {})
        assert any_store.read_trace("e1") == [{"via": "recorder", "index": 0}, {"index": 1}]


def test_close_is_a_no_op(any_store: Any) -> None:
    exe = saved(any_store)
    any_store.commit(exe, [(None, "a")], "ev", [schedule("p", 1.0)], [("c", "r", {})], {"s": 1})
    before = snapshot(any_store, ["e1", "c"], ["ev"])
    assert any_store.close() is None
    assert any_store.close() is None
    assert snapshot(any_store, ["e1", "c"], ["ev"]) == before
    any_store.commit(exe, [(None, "b")])
    assert len(any_store.pending_outbox()) == 2


def test_constructor_takes_trace_max_by_keyword_only(impl: Any) -> None:
    for cls in (impl.DictStore, impl.AsyncDictStore):
        assert cls().trace_max == DEFAULT_TRACE_MAX
        assert cls(trace_max=7).trace_max == 7
        with pytest.raises(TypeError):
            cls(7)


class TestAsyncSurface:
    @pytest.mark.parametrize("method", API_METHODS + EXTRA_METHODS)
    def test_methods_are_coroutine_functions(self, impl: Any, method: str) -> None:
        assert inspect.iscoroutinefunction(getattr(impl.AsyncDictStore, method))
        assert not inspect.iscoroutinefunction(getattr(impl.DictStore, method))

    def test_record_trace_stays_plain(self, impl: Any) -> None:
        assert not inspect.iscoroutinefunction(impl.AsyncDictStore._record_trace)
        assert not inspect.iscoroutinefunction(impl.DictStore._record_trace)

    def test_no_method_suspends(self, astore: Any) -> None:
        exe = Execution(id="e1")
        drive(astore.save(exe))
        drive(astore.commit(exe, [(None, "a")], "ev", [schedule("p", 1.0)], [("c", "r", {})], {}))
        assert drive(astore.load("e1")) is exe
        assert drive(astore.is_processed("e1", "ev"))
        assert drive(astore.pending_outbox()) == [OutboxEntry(1, None, "a")]
        drive(astore.ack_outbox(1))
        assert [s.seq for s in drive(astore.pending_spawns())] == [1]
        drive(astore.ack_spawn(1))
        assert drive(astore.due_timers(1.0)) == [("e1", "p", 1.0)]
        drive(astore.delete_timer("e1", "p", 1.0))
        drive(astore.append_trace("e1", {}))
        assert [step["index"] for step in drive(astore.read_trace("e1"))] == [0, 1]
        assert drive(astore.stats())["executions"] == 1
        drive(astore.forget("e9"))
        assert drive(astore.close()) is None

    def test_errors_surface_when_awaited(self, astore: Any) -> None:
        async def scenario() -> None:
            exe = Execution(id="e1")
            await astore.save(exe)
            with pytest.raises(StoreConflict):
                await astore.save(Execution(id="e1", version=5))
            with pytest.raises(TypeError, match=r"emits\[0\]"):
                await astore.commit(exe, ["bad"])
            assert exe.version == 1 and await astore.pending_outbox() == []

        asyncio.run(scenario())
