"""What the specification promises, checked on every store kind.

The contract tests take ``cstore``/``make_store`` (``conftest.py``): the memory store
(pure, compiled, pure async), SQLite (file, in memory, file async) and PostgreSQL (sync
and async).
They use ``str`` ids, event ids, child ids and timer paths and JSON-friendly values, as a
durable store requires, and decide what ``load`` returns from ``preserves_identity`` (the
very object saved, or a fresh equal copy with the committed version), and what ``close``
does from ``durable``. The tests at the end stay on the memory stores (``any_store``,
``impl``), each saying why.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import types
from collections.abc import Callable
from typing import Any

import pytest
from _helpers import API_METHODS, EXTRA_METHODS, assert_holds, drive, identify_for, snapshot

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
    def test_load_unknown_is_none(self, cstore: Any) -> None:
        assert cstore.load("nope") is None

    def test_load_returns_the_saved_execution(self, cstore: Any) -> None:
        exe = saved(cstore, context={"n": 1})
        if cstore.preserves_identity:
            assert cstore.load("e1") is exe
            exe.context["n"] = 2
            exe.status = "done"
            loaded = cstore.load("e1")
            assert loaded is exe and loaded.context == {"n": 2} and loaded.status == "done"
            cstore.commit(exe, [(None, "ev")])
            assert cstore.load("e1") is exe
            return
        first = assert_holds(cstore, exe)
        # A change not written is not stored, and a loaded copy is the caller's own.
        exe.context["n"] = 2
        exe.status = "done"
        first.context["n"] = 3
        loaded = cstore.load("e1")
        assert loaded is not first and loaded.version == 1
        assert loaded.context == {"n": 1} and loaded.status == "running"
        cstore.commit(exe, [(None, "ev")])
        loaded = assert_holds(cstore, exe)
        assert loaded.version == 2 and loaded.context == {"n": 2} and loaded.status == "done"

    def test_save_bumps_the_version_in_place(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        cstore.save(exe)
        assert exe.version == 1
        cstore.save(exe)
        cstore.commit(exe, [])
        assert exe.version == 3 and cstore.load("e1").version == 3

    def test_first_write_takes_any_version(self, cstore: Any) -> None:
        exe = Execution(id="e1", version=41)
        cstore.save(exe)
        assert exe.version == 42
        assert_holds(cstore, exe)

    def test_the_held_object_always_wins_only_where_identity_is_kept(self, cstore: Any) -> None:
        """A memory store holds ``exe`` itself, so its stored version is always
        ``exe.version``; a durable store compares with the version it stored."""
        exe = saved(cstore)
        for version in (99, 0, 7):
            exe.version = version
            if cstore.preserves_identity:
                cstore.save(exe)
                assert exe.version == version + 1 and cstore.load("e1") is exe
            else:
                with pytest.raises(StoreConflict) as info:
                    cstore.save(exe)
                assert (info.value.expected, info.value.found) == (version, 1)
                assert exe.version == version and cstore.load("e1").version == 1

    def test_different_object_at_the_same_version_replaces(self, cstore: Any) -> None:
        first = saved(cstore, context={"who": "first"})
        first_version = first.version
        second = Execution(id="e1", version=first.version, context={"who": "second"})
        cstore.save(second)
        assert_holds(cstore, second)
        assert cstore.load("e1").context == {"who": "second"}
        assert second.version == first_version + 1 and first.version == first_version

    @pytest.mark.parametrize("stale", [0, 5], ids=["behind", "ahead"])
    @pytest.mark.parametrize("method", ["save", "commit"])
    def test_different_object_at_another_version_conflicts(
        self, cstore: Any, method: str, stale: int
    ) -> None:
        first = saved(cstore)
        cstore.save(first)  # version 2
        rival = Execution(id="e1", version=stale, status="rival")
        args = (rival, [(None, "ev")]) if method == "commit" else (rival,)
        with pytest.raises(StoreConflict, match="'e1'") as info:
            getattr(cstore, method)(*args)
        err = info.value
        assert isinstance(err, Exception)
        assert (err.execution_id, err.expected, err.found) == ("e1", stale, 2)
        assert_holds(cstore, first)
        assert first.version == 2 and rival.version == stale
        assert cstore.pending_outbox() == []

    def test_ids_are_independent(self, cstore: Any) -> None:
        one = saved(cstore, "e1")
        two = saved(cstore, "e2", version=7)
        assert_holds(cstore, one)
        assert_holds(cstore, two)
        assert (one.version, two.version) == (1, 8)


class TestCommit:
    def test_emits_go_to_the_outbox_in_order_from_seq_1(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        cstore.commit(exe, [(None, "a"), ("e2", {"kind": "b"})])
        cstore.commit(exe, (("e3", "c"),))
        pending = cstore.pending_outbox()
        assert pending == [
            OutboxEntry(1, None, "a"),
            OutboxEntry(2, "e2", {"kind": "b"}),
            OutboxEntry(3, "e3", "c"),
        ]
        assert all(type(entry) is OutboxEntry for entry in pending)

    def test_emits_may_be_any_iterable_of_pairs(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        cstore.commit(exe, iter([["t", "a"]]))
        cstore.commit(exe, ((t, e) for t, e in [("u", "b")]))
        assert cstore.pending_outbox() == [OutboxEntry(1, "t", "a"), OutboxEntry(2, "u", "b")]

    def test_outbox_and_spawn_seqs_are_independent(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        cstore.commit(exe, [(None, "a"), (None, "b")], spawns=[("c1", "r", {})])
        cstore.commit(exe, [], spawns=[("c2", "r", {}), ("c3", "r", {})])
        cstore.commit(exe, [(None, "c")])
        assert [e.seq for e in cstore.pending_outbox()] == [1, 2, 3]
        assert [s.seq for s in cstore.pending_spawns()] == [1, 2, 3]

    def test_seqs_are_not_reused_after_acks(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        cstore.commit(exe, [(None, "a")], spawns=[("c1", "r", {})])
        cstore.ack_outbox(1)
        cstore.ack_spawn(1)
        cstore.commit(exe, [(None, "b")], spawns=[("c2", "r", {})])
        assert cstore.pending_outbox() == [OutboxEntry(2, None, "b")]
        assert [s.seq for s in cstore.pending_spawns()] == [2]

    def test_processed_marks(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        assert not cstore.is_processed("e1", "ev1")
        cstore.commit(exe, [], "ev1")
        cstore.commit(exe, [], None)
        assert cstore.is_processed("e1", "ev1")
        assert not cstore.is_processed("e1", "ev2")
        assert not cstore.is_processed("e2", "ev1")
        cstore.commit(Execution(id="e2"), [], "ev2")
        assert cstore.is_processed("e2", "ev2") and not cstore.is_processed("e1", "ev2")
        assert not cstore.is_processed("e1", "x")

    def test_spawn_entry_fields(self, cstore: Any) -> None:
        parent = Execution(id="p1")
        cstore.commit(parent, [], spawns=[("c1", ("fulfil", "pack"), {"n": 1}), ["c2", "r", {}]])
        pending = cstore.pending_spawns()
        assert pending == [
            SpawnEntry(1, "p1", "c1", ("fulfil", "pack"), {"n": 1}),
            SpawnEntry(2, "p1", "c2", "r", {}),
        ]
        assert all(type(entry) is SpawnEntry for entry in pending)
        assert type(pending[0].root_path) is tuple  # tuples stay tuples, in every store

    @pytest.mark.parametrize("wrap", [dict, types.MappingProxyType], ids=["dict", "mappingproxy"])
    def test_spawn_context_is_copied(
        self, cstore: Any, wrap: Callable[[dict[str, Any]], Any]
    ) -> None:
        parent = Execution(id="p1", context={"n": 1})
        context = wrap(parent.context)
        cstore.commit(parent, [], spawns=[("c1", "r", context)])
        parent.context["n"] = 2
        parent.context["late"] = True
        (entry,) = cstore.pending_spawns()
        assert entry.context == {"n": 1}
        assert type(entry.context) is dict and entry.context is not parent.context

    def test_commit_order_cas_first(self, cstore: Any) -> None:
        exe = saved(cstore)
        cstore.commit(exe, [(None, "kept")], "ev0", [schedule("p", 1)], [("c", "r", {})], {"s": 0})
        identify = identify_for(cstore)
        before = snapshot(cstore, ["e1"], ["ev0", "ev1"], identify)
        stale = Execution(id="e1", version=0)
        with pytest.raises(StoreConflict):
            cstore.commit(
                stale, [(None, "lost")], "ev1", [schedule("q", 2)], [("c2", "r", {})], {"s": 1}
            )
        assert snapshot(cstore, ["e1"], ["ev0", "ev1"], identify) == before
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
    def test_pending_returns_a_copy(self, cstore: Any, fill: Any, pending: str, ack: str) -> None:
        fill(cstore, Execution(id="e1"), ["a", "b"])
        first = getattr(cstore, pending)()
        assert first == getattr(cstore, pending)() and len(first) == 2
        first.clear()
        first.append("junk")
        assert len(getattr(cstore, pending)()) == 2
        assert getattr(cstore, pending)() is not getattr(cstore, pending)()

    def test_empty(self, cstore: Any, fill: Any, pending: str, ack: str) -> None:
        assert getattr(cstore, pending)() == []

    def test_ack_in_any_order(self, cstore: Any, fill: Any, pending: str, ack: str) -> None:
        fill(cstore, Execution(id="e1"), ["a", "b", "c", "d", "e"])
        for seq in (3, 1, 5):
            getattr(cstore, ack)(seq)
        assert [entry.seq for entry in getattr(cstore, pending)()] == [2, 4]
        for seq in (4, 2):
            getattr(cstore, ack)(seq)
        assert getattr(cstore, pending)() == []

    def test_ack_of_an_unknown_seq_is_a_no_op(
        self, cstore: Any, fill: Any, pending: str, ack: str
    ) -> None:
        fill(cstore, Execution(id="e1"), ["a", "b"])
        before = getattr(cstore, pending)()
        for seq in (0, -1, 3, 10**30):
            getattr(cstore, ack)(seq)
            assert getattr(cstore, pending)() == before, seq

    def test_ack_twice_is_a_no_op(self, cstore: Any, fill: Any, pending: str, ack: str) -> None:
        fill(cstore, Execution(id="e1"), ["a", "b", "c"])
        getattr(cstore, ack)(2)
        getattr(cstore, ack)(2)
        assert [entry.seq for entry in getattr(cstore, pending)()] == [1, 3]


class TestTimers:
    def test_due_timers_returns_due_ones_oldest_first(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        cstore.commit(exe, [], timers=[schedule("late", 10.0), schedule("early", 5.0)])
        cstore.commit(Execution(id="e2"), [], timers=[schedule("mid", 7.5)])
        assert cstore.due_timers(4.999) == []
        assert cstore.due_timers(5.0) == [("e1", "early", 5.0)]
        assert cstore.due_timers(9) == [("e1", "early", 5.0), ("e2", "mid", 7.5)]
        everything = [("e1", "early", 5.0), ("e2", "mid", 7.5), ("e1", "late", 10.0)]
        assert cstore.due_timers(10) == everything
        assert cstore.due_timers(math.inf) == everything
        assert cstore.due_timers(-math.inf) == []

    def test_timers_stay_armed_until_deleted(self, cstore: Any) -> None:
        cstore.commit(Execution(id="e1"), [], timers=[schedule("p", 1.0)])
        assert cstore.due_timers(2.0) == [("e1", "p", 1.0)]
        assert cstore.due_timers(2.0) == [("e1", "p", 1.0)]
        cstore.delete_timer("e1", "p", 1.0)
        assert cstore.due_timers(2.0) == []

    def test_fire_at_is_stored_as_a_float(self, cstore: Any) -> None:
        cstore.commit(Execution(id="e1"), [], timers=[schedule("p", 7)])
        ((_, _, fire_at),) = cstore.due_timers(7)
        assert fire_at == 7.0 and type(fire_at) is float

    def test_rearm_replaces(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        cstore.commit(exe, [], timers=[schedule("p", 10.0)])
        cstore.commit(exe, [], timers=[schedule("p", 20.0)])
        assert cstore.due_timers(15.0) == []
        assert cstore.due_timers(math.inf) == [("e1", "p", 20.0)]
        cstore.commit(exe, [], timers=[schedule("p", 3.0), schedule("p", 4.0)])
        assert cstore.due_timers(math.inf) == [("e1", "p", 4.0)]

    def test_timer_key_is_execution_and_path(self, cstore: Any) -> None:
        cstore.commit(Execution(id="e1"), [], timers=[schedule("p", 1.0), schedule("q", 1.0)])
        cstore.commit(Execution(id="e2"), [], timers=[schedule("p", 2.0)])
        assert sorted(cstore.due_timers(math.inf)) == [
            ("e1", "p", 1.0),
            ("e1", "q", 1.0),
            ("e2", "p", 2.0),
        ]

    def test_cancel(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        cstore.commit(exe, [], timers=[schedule("p", 1.0), schedule("q", 2.0)])
        cstore.commit(exe, [], timers=[cancel("p"), cancel("never-armed")])
        assert cstore.due_timers(math.inf) == [("e1", "q", 2.0)]
        cstore.commit(Execution(id="e2"), [], timers=[cancel("q")])
        assert cstore.due_timers(math.inf) == [("e1", "q", 2.0)]
        cstore.commit(exe, [], timers=[schedule("p", 5.0), cancel("p"), cancel("q")])
        assert cstore.due_timers(math.inf) == []
        cstore.commit(exe, [], timers=[cancel("p"), schedule("p", 6.0)])
        assert cstore.due_timers(math.inf) == [("e1", "p", 6.0)]

    @pytest.mark.parametrize("swept", [True, False], ids=["swept", "unswept"])
    def test_ties_go_in_arming_order_and_a_rearm_counts_as_new(
        self, cstore: Any, swept: bool
    ) -> None:
        """``swept``: a sweep ran between the armings and the re-arm."""
        e1, e2 = Execution(id="e1"), Execution(id="e2")
        cstore.commit(e1, [], timers=[schedule("b", 5.0)])
        cstore.commit(e2, [], timers=[schedule("a", 5.0)])
        cstore.commit(e1, [], timers=[schedule("a", 5.0)])
        if swept:
            order = [("e1", "b", 5.0), ("e2", "a", 5.0), ("e1", "a", 5.0)]
            assert cstore.due_timers(5.0) == order
        cstore.commit(e1, [], timers=[schedule("b", 5)])
        assert cstore.due_timers(5.0) == [("e2", "a", 5.0), ("e1", "a", 5.0), ("e1", "b", 5.0)]
        cstore.commit(e2, [], timers=[schedule("a", 4.0), schedule("a", 5.0)])
        assert cstore.due_timers(5.0) == [("e1", "a", 5.0), ("e1", "b", 5.0), ("e2", "a", 5.0)]

    @pytest.mark.parametrize("fire_at", [10.0, 10], ids=["float", "int"])
    def test_delete_timer_with_the_fired_time(self, cstore: Any, fire_at: float) -> None:
        cstore.commit(Execution(id="e1"), [], timers=[schedule("p", 10.0), schedule("q", 10.0)])
        cstore.delete_timer("e1", "p", fire_at)
        assert cstore.due_timers(math.inf) == [("e1", "q", 10.0)]

    def test_a_stale_sweep_does_not_delete_a_rearmed_timer(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        cstore.commit(exe, [], timers=[schedule("p", 10.0)])
        ((eid, path, fired_at),) = cstore.due_timers(10.0)
        cstore.commit(exe, [], timers=[schedule("p", 20.0)])  # re-armed meanwhile
        cstore.delete_timer(eid, path, fired_at)
        assert cstore.due_timers(math.inf) == [("e1", "p", 20.0)]

    def test_delete_timer_that_does_not_match_is_a_no_op(self, cstore: Any) -> None:
        cstore.commit(Execution(id="e1"), [], timers=[schedule("p", 1.0)])
        for args in (("e9", "p", 1.0), ("e1", "zz", 1.0), ("e1", "p", 2.0), ("e1", "p", math.nan)):
            cstore.delete_timer(*args)
            assert cstore.due_timers(math.inf) == [("e1", "p", 1.0)], args

    def test_a_deleted_timer_can_be_armed_again(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        cstore.commit(exe, [], timers=[schedule("p", 1.0)])
        cstore.delete_timer("e1", "p", 1.0)
        cstore.delete_timer("e1", "p", 1.0)
        cstore.commit(exe, [], timers=[schedule("p", 1.0)])
        assert cstore.due_timers(1.0) == [("e1", "p", 1.0)]


# A store bug, reported to the owner of postgres.py: AsyncPostgresStore._record_trace
# does not open the store (its schema is created at the first coroutine call), so as the
# first call on a new database it fails with UndefinedTable "trace_index".
def steps(store: Any, eid: Any = "e1") -> list[int]:
    return [step["index"] for step in store.read_trace(eid)]


class TestTrace:
    def test_steps_get_a_monotonic_index_from_0(self, cstore: Any) -> None:
        for n in range(3):
            cstore.append_trace("e1", {"event": f"ev{n}"})
        assert cstore.read_trace("e1") == [
            {"event": "ev0", "index": 0},
            {"event": "ev1", "index": 1},
            {"event": "ev2", "index": 2},
        ]

    def test_index_is_per_execution(self, cstore: Any) -> None:
        cstore.append_trace("e1", {})
        cstore.append_trace("e2", {})
        cstore.append_trace("e1", {})
        assert (steps(cstore, "e1"), steps(cstore, "e2")) == ([0, 1], [0])

    def test_commit_records_a_step_sharing_the_counter(self, cstore: Any) -> None:
        exe = Execution(id="e1")
        cstore.commit(exe, [], trace={"transition": "go"})
        cstore.commit(exe, [])
        cstore.commit(exe, [], trace=None)
        cstore.append_trace("e1", {"transition": "seam"})
        cstore.commit(exe, [], trace={"transition": "stop"})
        assert cstore.read_trace("e1") == [
            {"transition": "go", "index": 0},
            {"transition": "seam", "index": 1},
            {"transition": "stop", "index": 2},
        ]

    def test_an_explicit_index_is_honoured_and_the_counter_advances(self, cstore: Any) -> None:
        cstore.append_trace("e1", {"index": 42})
        cstore.commit(Execution(id="e1"), [], trace={"index": "custom"})
        cstore.append_trace("e1", {})
        assert steps(cstore) == [42, "custom", 2]

    def test_the_callers_entry_is_copied_not_stamped(self, cstore: Any) -> None:
        entry = {"event": "ev"}
        cstore.append_trace("e1", entry)
        assert entry == {"event": "ev"}
        entry["event"] = "changed"
        assert cstore.read_trace("e1") == [{"event": "ev", "index": 0}]

    def test_the_index_survives_trimming(self, make_store: Callable[..., Any]) -> None:
        store = make_store(trace_max=3)
        for n in range(7):
            store.append_trace("e1", {"n": n})
        assert store.read_trace("e1") == [{"n": n, "index": n} for n in (4, 5, 6)]

    def test_default_ring_is_200(self, cstore: Any) -> None:
        assert cstore.trace_max == DEFAULT_TRACE_MAX == 200
        for _ in range(205):
            cstore.append_trace("e1", {})
        assert steps(cstore) == list(range(5, 205))

    @pytest.mark.parametrize("trace_max", [0, None])
    def test_falsy_trace_max_is_unbounded(
        self, make_store: Callable[..., Any], trace_max: Any
    ) -> None:
        store = make_store(trace_max=trace_max)
        assert store.trace_max == trace_max
        for _ in range(250):
            store.append_trace("e1", {})
        assert steps(store) == list(range(250))

    def test_trace_max_changes_apply_at_the_next_append_per_id(
        self, make_store: Callable[..., Any]
    ) -> None:
        store = make_store(trace_max=None)
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
        self, make_store: Callable[..., Any], value: Any, error: type
    ) -> None:
        with pytest.raises(error, match="trace_max"):
            make_store(trace_max=value)
        store = make_store(trace_max=4)
        with pytest.raises(error, match="trace_max"):
            store.trace_max = value
        assert store.trace_max == 4

    def test_read_trace_returns_a_copy(self, cstore: Any) -> None:
        assert cstore.read_trace("unknown") == []
        cstore.append_trace("e1", {"a": 1})
        got = cstore.read_trace("e1")
        got.clear()
        assert cstore.read_trace("e1") == [{"a": 1, "index": 0}]
        assert cstore.read_trace("e1") is not cstore.read_trace("e1")

    def test_load_is_unaffected_by_trace(self, cstore: Any) -> None:
        cstore.append_trace("ghost", {"a": 1})
        assert cstore.load("ghost") is None
        exe = saved(cstore)
        cstore.append_trace("e1", {"a": 1})
        assert_holds(cstore, exe)
        assert exe.version == 1

    def test_record_trace_is_the_plain_recorder(self, cstore: Any) -> None:
        assert not inspect.iscoroutinefunction(cstore._record_trace)
        assert cstore._record_trace("e1", {"via": "recorder"}) is None
        cstore.append_trace("e1", {})
        assert cstore.read_trace("e1") == [{"via": "recorder", "index": 0}, {"index": 1}]


def test_close(cstore: Any) -> None:
    """A memory store's ``close`` is a no-op; a durable store's is final: any other
    method then raises ``ValueError``, like a closed file. Both may be closed twice."""
    exe = saved(cstore)
    cstore.commit(exe, [(None, "a")], "ev", [schedule("p", 1.0)], [("c", "r", {})], {"s": 1})
    identify = identify_for(cstore)
    before = snapshot(cstore, ["e1", "c"], ["ev"], identify)
    assert cstore.close() is None
    assert cstore.close() is None
    if cstore.durable:
        for call in (
            lambda: cstore.load("e1"),
            lambda: cstore.commit(exe, [(None, "b")]),
            cstore.pending_outbox,
            lambda: cstore.read_trace("e1"),
        ):
            with pytest.raises(ValueError):
                call()
        assert exe.version == 2
        return
    assert snapshot(cstore, ["e1", "c"], ["ev"], identify) == before
    cstore.commit(exe, [(None, "b")])
    assert len(cstore.pending_outbox()) == 2


# --- memory only ----------------------------------------------------------------------
# What follows only the memory stores can pass: ids and values of any hashable type (a
# durable store takes str ids and needs a codec for other classes), identity, and the
# surface of the memory classes themselves.


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
    """memory only: any class and any hashable id (a durable store needs a codec for a
    class of one's own, and str ids)."""
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


def test_processed_marks_of_any_hashable_event_id(any_store: Any) -> None:
    """memory only: event ids of any hashable type, ``None`` included (a durable store
    takes str event ids)."""
    exe = Execution(id="e1")
    any_store.commit(exe, [], "ev1")
    any_store.commit(exe, [], None)
    assert not any_store.is_processed("e1", None)
    any_store.commit(Execution(id="e2"), [], ("tuple", 1))
    assert any_store.is_processed("e2", ("tuple", 1)) and not any_store.is_processed("e1", "x")
    assert not any_store.is_processed("e2", ("tuple", 2))
    assert not any_store.is_processed("e1", ("tuple", 1))


def test_constructor_takes_trace_max_by_keyword_only(impl: Any) -> None:
    """memory only: the signature of the memory classes."""
    for cls in (impl.DictStore, impl.AsyncDictStore):
        assert cls().trace_max == DEFAULT_TRACE_MAX
        assert cls(trace_max=7).trace_max == 7
        with pytest.raises(TypeError):
            cls(7)


class TestAsyncSurface:
    """memory only: the async surface of the memory classes, whose coroutines await
    nothing (a durable async store does I/O)."""

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
