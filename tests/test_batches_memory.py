"""commit_many, the batch acks and wait_for_work on the memory stores, both
implementations: checked whole before the first write, each commit as commit applies it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from _helpers import drive

from harel_store import (
    Commit,
    Execution,
    IdempotencyConflict,
    StaleWriter,
    StoreConflict,
    TimerOp,
)


def state(store: Any) -> list[Any]:
    return list(store._dump())


def order(n: int) -> Commit:
    exe = Execution(id=f"o{n}")
    return Commit(
        exe,
        [("billing", {"n": n}), (None, "note")],
        f"evt-{n}",
        [TimerOp("schedule", "pay", float(n))],
        [(f"o{n}/child", "region", {"k": n})],
        {"step": n},
    )


class TestCommitMany:
    def test_a_batch_is_applied_as_its_commits_one_by_one(self, impl: Any) -> None:
        batched, single = impl.DictStore(), impl.DictStore()
        outcomes = batched.commit_many([order(n) for n in range(5)])
        assert outcomes == [None] * 5
        for n in range(5):
            c = order(n)
            single.commit(c.exe, c.emits, c.processed_event_id, c.timers, c.spawns, c.trace)
        assert state(batched) == state(single)
        assert [e.seq for e in batched.pending_outbox()] == list(range(1, 11))
        assert batched.load("o3").version == 1

    def test_refusals_are_outcomes_and_stop_nothing(self, impl: Any) -> None:
        store = impl.DictStore()
        a, b, c, d = (Execution(id=name) for name in "abcd")
        store.commit(a, [])
        store.commit(b, [], epoch=5)
        store.commit(d, [], commit_id="d1")
        stale = Execution(id="a")  # version 0, the store holds 1
        before = len(store.pending_outbox())
        outcomes = store.commit_many(
            [
                Commit(stale, [("x", "lost")]),
                Commit(Execution(id="b", version=1), [("x", "old epoch")], epoch=4),
                Commit(d, [("x", "other body")], commit_id="d1"),
                Commit(c, [("x", "kept")]),
            ]
        )
        assert isinstance(outcomes[0], StoreConflict)
        assert isinstance(outcomes[1], StaleWriter)
        assert isinstance(outcomes[2], IdempotencyConflict)
        assert outcomes[3] is None
        assert stale.version == 0 and c.version == 1
        assert [e.event for e in store.pending_outbox()][before:] == ["kept"]

    def test_a_replay_inside_a_batch_writes_nothing(self, impl: Any) -> None:
        store = impl.DictStore()
        a = Execution(id="a")
        store.commit(a, [("x", 1)], commit_id="c1")
        copy = Execution(id="a")
        assert store.commit_many([Commit(copy, [("x", 1)], commit_id="c1")]) == [None]
        assert len(store.pending_outbox()) == 1
        assert copy.version == 1  # set to the version that commit produced

    def test_two_commits_of_one_execution_refuse_the_batch(self, impl: Any) -> None:
        store = impl.DictStore()
        before = state(store)
        with pytest.raises(ValueError, match=r"commits\[0\] and commits\[2\].*'a'"):
            store.commit_many([Commit(Execution(id="a")), order(1), Commit(Execution(id="a"))])
        assert state(store) == before

    @pytest.mark.parametrize("position", [0, 2, 4])
    @pytest.mark.parametrize(
        ("bad", "error"),
        [
            ("not a commit", TypeError),
            (Commit(Execution(id="x"), [1]), TypeError),
            (Commit(Execution(id="x"), timers=[("arm", "p", 1.0)]), (TypeError, ValueError)),
            (Commit(Execution(id="x"), spawns=[("c", "r")]), (TypeError, ValueError)),
            (Commit(Execution(id="x"), trace=7), TypeError),
            (Commit(Execution(id="x"), commit_id=7), TypeError),
            (Commit(Execution(id="x"), epoch="new"), TypeError),
            (Commit(object()), TypeError),
            (Commit(Execution(id=["unhashable"])), TypeError),
            (Commit(Execution(id="x", version="1")), TypeError),
            (Commit(Execution(id="x"), processed_event_id=["unhashable"]), TypeError),
        ],
    )
    def test_bad_input_anywhere_writes_nothing(
        self, impl: Any, position: int, bad: Any, error: Any
    ) -> None:
        store = impl.DictStore()
        store.commit_many([order(n) for n in range(3)])
        before = state(store)
        batch: list[Any] = [order(n) for n in range(10, 14)]
        batch.insert(position, bad)
        versions = [getattr(getattr(c, "exe", None), "version", None) for c in batch]
        with pytest.raises(error):
            store.commit_many(batch)
        assert state(store) == before
        assert [getattr(getattr(c, "exe", None), "version", None) for c in batch] == versions

    def test_an_iterator_is_read_once_and_a_raising_one_writes_nothing(self, impl: Any) -> None:
        store = impl.DictStore()
        assert store.commit_many(order(n) for n in range(3)) == [None] * 3

        def broken() -> Any:
            yield order(7)
            raise RuntimeError("mid-stream")

        before = state(store)
        with pytest.raises(RuntimeError, match="mid-stream"):
            store.commit_many(broken())
        assert state(store) == before
        with pytest.raises(TypeError, match="commits must be an iterable"):
            store.commit_many(7)

    def test_the_empty_batch(self, impl: Any) -> None:
        assert impl.DictStore().commit_many([]) == []

    def test_unusual_types_take_the_checked_path(self, impl: Any) -> None:
        class Exe:
            def __init__(self, id: Any) -> None:
                self.id, self.version = id, 0

        store = impl.DictStore()
        emits = iter([(("tuple", "target"), "e")])
        out = store.commit_many([Commit(Exe(("key", 1)), emits, ("mark", 2), spawns=())])
        assert out == [None]
        assert store.pending_outbox()[0].target_id == ("tuple", "target")
        assert store.is_processed(("key", 1), ("mark", 2))

    def test_async_twin(self, impl: Any) -> None:
        astore = impl.AsyncDictStore()
        assert drive(astore.commit_many([order(1)])) == [None]
        drive(astore.ack_outbox_many([1, 2]))
        drive(astore.ack_spawn_many([1]))
        drive(astore.delete_timer_many([("o1", "pay", 1.0)]))
        assert drive(astore.stats())["outbox"] == 0
        assert drive(astore.due_timers(10.0)) == []


class TestBatchAcks:
    def test_each_item_as_its_single_form(self, impl: Any) -> None:
        store = impl.DictStore()
        store.commit_many([order(n) for n in range(3)])
        store.ack_outbox_many([1, 4, 999])
        assert [e.seq for e in store.pending_outbox()] == [2, 3, 5, 6]
        store.ack_spawn_many(iter([2]))
        assert [s.seq for s in store.pending_spawns()] == [1, 3]
        store.commit(store.load("o1"), [], timers=[TimerOp("schedule", "pay", 50.0)])
        store.delete_timer_many([("o1", "pay", 1.0), ("o2", "pay", 2.0), ("nobody", "p", 1.0)])
        assert store.due_timers(100.0) == [("o0", "pay", 0.0), ("o1", "pay", 50.0)]

    @pytest.mark.parametrize(
        ("method", "bad"),
        [
            ("ack_outbox_many", [1, "2"]),
            ("ack_outbox_many", [1, True]),
            ("ack_spawn_many", [1, 2.0]),
            ("ack_outbox_many", 3),
            ("delete_timer_many", [("o0", "pay", 0.0), ("o1", "pay")]),
            ("delete_timer_many", [("o0", "pay", 0.0), ("o1", "pay", "soon")]),
            ("delete_timer_many", [("o0", "pay", 0.0), (["o1"], "pay", 1.0)]),
        ],
    )
    def test_bad_input_acks_nothing(self, impl: Any, method: str, bad: Any) -> None:
        store = impl.DictStore()
        store.commit_many([order(n) for n in range(3)])
        before = state(store)
        with pytest.raises(TypeError):
            getattr(store, method)(bad)
        assert state(store) == before


class TestWaitForWork:
    def test_work_committed_by_another_thread_wakes_it(self, impl: Any) -> None:
        store = impl.DictStore()
        assert store.wait_for_work(0.0) is False
        store.commit(Execution(id="quiet"), [])  # no outbox, spawn or timer: no work
        assert store.wait_for_work(0.0) is False
        exe = Execution(id="a")
        timer = threading.Timer(0.05, lambda: store.commit(exe, [("x", 1)]))
        timer.start()
        try:
            assert store.wait_for_work(30.0) is True
        finally:
            timer.join()
        assert store.wait_for_work(0.0) is False  # seen
        store.commit(exe, [], timers=[TimerOp("schedule", "p", 1.0)])
        assert store.wait_for_work(0.0) is True

    def test_the_async_twin_lets_the_loop_run(self, impl: Any) -> None:
        async def main() -> bool:
            astore = impl.AsyncDictStore()

            async def later() -> None:
                await asyncio.sleep(0.05)
                await astore.commit(Execution(id="a"), [], spawns=[("c", "r", {})])

            task = asyncio.ensure_future(later())
            woke: bool = await astore.wait_for_work(30.0)
            await task
            return woke and not await astore.wait_for_work(0.01)

        assert asyncio.run(main())

    def test_timeout_is_checked(self, impl: Any) -> None:
        with pytest.raises((TypeError, ValueError)):
            impl.DictStore().wait_for_work("soon")
