"""``commit_many`` and the batch acks on every store kind (PRODUCTION.md section 7).

Each commit of a batch has the outcome ``commit`` would give it alone: applied (``None``),
a replay of its ``commit_id`` (``None``, nothing written), or the ``StoreConflict``,
``StaleWriter`` or ``IdempotencyConflict`` instance in its slot, with nothing of it written
and the others applied. Bad input anywhere in a batch (and two commits of one execution)
raises before anything of the batch is written. ``ack_outbox_many``, ``ack_spawn_many`` and
``delete_timer_many`` give each item its single form's meaning, and refuse bad input whole.
The tests take ``make_store`` (``conftest.py``) and compare what the store shows through
its public API before and after, so they hold on every kind.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harel_store import (
    Commit,
    DictStore,
    Execution,
    IdempotencyConflict,
    OutboxEntry,
    SpawnEntry,
    StaleWriter,
    StoreConflict,
    TimerOp,
)

MakeStore = Callable[..., Any]


def schedule(path: str, fire_at: float) -> TimerOp:
    return TimerOp("schedule", path, fire_at)


def view(store: Any, ids: list[str], events: tuple[str, ...] = ("ev",)) -> dict[str, Any]:
    """What the store shows about ``ids`` through the public API, as plain values."""
    loaded = {}
    for eid in ids:
        exe = store.load(eid)
        loaded[eid] = None if exe is None else (exe.version, copy.deepcopy(exe.context))
    return copy.deepcopy(
        {
            "load": loaded,
            "processed": {(e, v): store.is_processed(e, v) for e in ids for v in events},
            "outbox": store.pending_outbox(),
            "spawns": store.pending_spawns(),
            "timers": store.due_timers(math.inf),
            "trace": {eid: store.read_trace(eid) for eid in ids},
        }
    )


def full(eid: str, n: int = 0, **extra: Any) -> Commit:
    """A commit of a fresh ``eid`` writing one of everything."""
    return Commit(
        Execution(id=eid, context={"n": n}),
        [(eid, f"{eid}-a"), (None, f"{eid}-b")],
        "ev",
        [schedule("p", 10.0 + n)],
        [(f"{eid}-kid", "region", {"from": eid})],
        {"step": eid},
        **extra,
    )


def base(store: Any) -> list[Execution]:
    """Three executions at version 1, the second under epoch 5, the third with a commit
    id ``k-c``."""
    a, b, c = Execution(id="a"), Execution(id="b"), Execution(id="c")
    store.commit(a, [("a", "a0")])
    store.commit(b, [("b", "b0")], epoch=5)
    store.commit(c, [("c", "c0")], "ev", commit_id="k-c")
    return [a, b, c]


IDS = ["a", "b", "c", "x", "y", "z"]


# --- applied batches -------------------------------------------------------------------


def test_a_batch_of_many_executions_is_applied_in_order(make_store: MakeStore) -> None:
    store = make_store()
    ids = [f"e{i:02d}" for i in range(40)]
    commits = [full(eid, i) for i, eid in enumerate(ids)]
    assert store.commit_many(commits) == [None] * len(ids)
    assert [c.exe.version for c in commits] == [1] * len(ids)
    outbox = store.pending_outbox()
    assert [(e.target_id, e.event) for e in outbox] == [
        pair for eid in ids for pair in ((eid, f"{eid}-a"), (None, f"{eid}-b"))
    ]
    assert all(type(e) is OutboxEntry for e in outbox)
    assert [e.seq for e in outbox] == sorted({e.seq for e in outbox})
    spawns = store.pending_spawns()
    assert [(s.parent_id, s.child_id, s.root_path, s.context) for s in spawns] == [
        (eid, f"{eid}-kid", "region", {"from": eid}) for eid in ids
    ]
    assert all(type(s) is SpawnEntry for s in spawns)
    assert [s.seq for s in spawns] == sorted({s.seq for s in spawns})
    assert sorted(store.due_timers(math.inf)) == sorted(
        (eid, "p", 10.0 + i) for i, eid in enumerate(ids)
    )
    for i, eid in enumerate(ids):
        exe = store.load(eid)
        assert exe.version == 1 and exe.context == {"n": i}
        assert store.is_processed(eid, "ev")
        assert [step["step"] for step in store.read_trace(eid)] == [eid]


def test_a_batch_writes_what_the_same_commits_write_one_by_one(make_store: MakeStore) -> None:
    one, many = DictStore(), make_store()  # the reference: the same commits, one by one
    for store in (one, many):
        base(store)
    ops = [schedule("p", 3.0), TimerOp("cancel", "q"), schedule("q", 4.0)]

    def batch() -> list[Commit]:
        a, b = (Execution(id="a", version=1), Execution(id="b", version=1))
        return [
            Commit(a, [("b", "hi")], "ev", ops, [("k", "r", {"v": 1})], {"s": 1}),
            Commit(b, (), None, (), (), None, None, 5),
            full("x", 3, commit_id="k-x", epoch=2),
        ]

    for commit in batch():
        one.commit(*commit[:6], commit_id=commit.commit_id, epoch=commit.epoch)
    assert many.commit_many(batch()) == [None, None, None]
    assert view(many, IDS) == view(one, IDS)


def test_commit_then_commit_many_then_commit_keep_seqs_increasing(make_store: MakeStore) -> None:
    store = make_store()
    exe = Execution(id="a")
    store.commit(exe, [("t", 0)], spawns=[("k0", "r", {})])
    assert store.commit_many([Commit(exe, [("t", 1), ("t", 2)], spawns=[("k1", "r", {})])]) == [
        None
    ]
    assert store.commit_many([Commit(Execution(id="b"), [("t", 3)])]) == [None]
    store.commit(exe, [("t", 4)], spawns=[("k2", "r", {})])
    outbox, spawns = store.pending_outbox(), store.pending_spawns()
    assert [e.event for e in outbox] == [0, 1, 2, 3, 4]
    assert [e.seq for e in outbox] == sorted({e.seq for e in outbox})
    assert [s.child_id for s in spawns] == ["k0", "k1", "k2"]
    assert [s.seq for s in spawns] == sorted({s.seq for s in spawns})
    assert exe.version == 3


def test_the_empty_batch(make_store: MakeStore) -> None:
    store = make_store()
    base(store)
    before = view(store, IDS)
    assert store.commit_many([]) == []
    assert store.commit_many(iter(())) == []
    assert view(store, IDS) == before


def test_a_generator_of_commits_is_taken(make_store: MakeStore) -> None:
    store = make_store()
    assert store.commit_many(full(f"g{i}", i) for i in range(3)) == [None] * 3
    assert [store.load(f"g{i}").version for i in range(3)] == [1, 1, 1]


# --- mixed outcomes --------------------------------------------------------------------


def test_a_refused_commit_writes_nothing_and_does_not_stop_the_others(
    make_store: MakeStore,
) -> None:
    store = make_store()
    base(store)
    stale = Execution(id="a", version=0, context={"stale": True})  # "a" is at version 1
    fenced = Execution(id="b", version=1, context={"fenced": True})  # "b" is at epoch 5
    x, y = full("x", 1), full("y", 2)
    before = view(store, IDS)
    outcomes = store.commit_many(
        [
            x,
            Commit(
                stale, [("a", "lost")], "ev-a", [schedule("s", 1.0)], [("ka", "r", {})], {"lost": 1}
            ),
            Commit(fenced, [("b", "lost")], "ev-b", epoch=3),
            y,
        ]
    )
    assert outcomes[0] is None and outcomes[3] is None
    conflict, stale_writer = outcomes[1], outcomes[2]
    assert type(conflict) is StoreConflict
    assert (conflict.execution_id, conflict.expected, conflict.found) == ("a", 0, 1)
    assert type(stale_writer) is StaleWriter
    assert (stale_writer.execution_id, stale_writer.epoch, stale_writer.current) == ("b", 3, 5)
    assert stale.version == 0 and fenced.version == 1
    assert x.exe.version == 1 and y.exe.version == 1
    after = view(store, IDS, ("ev", "ev-a", "ev-b"))
    # What the refused two would have written is nowhere.
    assert all(e.event != "lost" for e in after["outbox"])
    assert all(s.child_id != "ka" for s in after["spawns"])
    assert all(t[0] != "a" for t in after["timers"])
    assert after["load"]["a"] == before["load"]["a"]
    assert after["load"]["b"] == before["load"]["b"]
    assert after["trace"]["a"] == before["trace"]["a"]
    assert not after["processed"][("a", "ev-a")] and not after["processed"][("b", "ev-b")]
    # The applied two wrote all of theirs, after what was there.
    assert after["outbox"][: len(before["outbox"])] == before["outbox"]
    assert [e.event for e in after["outbox"][len(before["outbox"]) :]] == [
        "x-a", "x-b", "y-a", "y-b",
    ]  # fmt: skip


def test_each_conflict_kind_in_one_batch_leaves_the_store_as_the_applied_ones_alone(
    make_store: MakeStore,
) -> None:
    mixed, alone = make_store(), DictStore()
    for store in (mixed, alone):
        base(store)
    outcomes = mixed.commit_many(
        [
            Commit(Execution(id="a", version=7), [("a", "lost")]),
            full("x", 1),
            Commit(Execution(id="b", version=1), [("b", "lost")], epoch=4),
            full("y", 2),
            Commit(Execution(id="c"), [("c", "other")], "ev", commit_id="k-c"),
        ]
    )
    assert [type(o) for o in outcomes] == [
        StoreConflict, type(None), StaleWriter, type(None), IdempotencyConflict,
    ]  # fmt: skip
    assert (outcomes[4].execution_id, outcomes[4].commit_id) == ("c", "k-c")
    for commit in (full("x", 1), full("y", 2)):
        alone.commit(*commit[:6])
    assert view(mixed, IDS) == view(alone, IDS)


def test_a_large_batch_with_scattered_conflicts(make_store: MakeStore) -> None:
    store = make_store()
    ids = [f"e{i:03d}" for i in range(150)]
    assert store.commit_many([Commit(Execution(id=eid), [(eid, 0)]) for eid in ids]) == [None] * 150
    seen = store.pending_outbox()
    commits = [
        Commit(Execution(id=eid, version=0 if i % 3 == 1 else 1), [(eid, 1)], f"ev{i}")
        for i, eid in enumerate(ids)
    ]
    outcomes = store.commit_many(commits)
    for i, (commit, outcome) in enumerate(zip(commits, outcomes)):
        if i % 3 == 1:
            assert type(outcome) is StoreConflict, (i, outcome)
            assert (outcome.execution_id, outcome.expected, outcome.found) == (ids[i], 0, 1)
            assert commit.exe.version == 0 and store.load(ids[i]).version == 1
            assert not store.is_processed(ids[i], f"ev{i}")
        else:
            assert outcome is None, (i, outcome)
            assert commit.exe.version == 2 and store.load(ids[i]).version == 2
            assert store.is_processed(ids[i], f"ev{i}")
    outbox = store.pending_outbox()
    assert outbox[: len(seen)] == seen
    assert [e.target_id for e in outbox[len(seen) :]] == [
        eid for i, eid in enumerate(ids) if i % 3 != 1
    ]


def test_all_refused_writes_nothing(make_store: MakeStore) -> None:
    store = make_store()
    base(store)
    before = view(store, IDS)
    outcomes = store.commit_many(
        [
            Commit(Execution(id="a", version=3), [("a", "lost")]),
            Commit(Execution(id="b", version=1), [("b", "lost")], epoch=1),
        ]
    )
    assert [type(o) for o in outcomes] == [StoreConflict, StaleWriter]
    assert view(store, IDS) == before


# --- replays and epochs ----------------------------------------------------------------


def test_a_replay_in_a_batch_writes_nothing_again(make_store: MakeStore) -> None:
    store = make_store()
    first = full("x", 1, commit_id="k1")
    assert store.commit_many([first, full("y", 2)]) == [None, None]
    before = view(store, IDS)
    again = full("x", 1, commit_id="k1")  # a fresh object at version 0, the same body
    outcomes = store.commit_many([again, full("z", 3)])
    assert outcomes == [None, None]
    assert again.exe.version == 1  # the version the first produced
    after = view(store, IDS)
    assert after["outbox"][: len(before["outbox"])] == before["outbox"]
    assert [e.event for e in after["outbox"][len(before["outbox"]) :]] == ["z-a", "z-b"]
    assert [s.child_id for s in after["spawns"]] == ["x-kid", "y-kid", "z-kid"]
    assert after["load"]["x"] == before["load"]["x"]
    assert after["trace"]["x"] == before["trace"]["x"]


def test_a_replay_of_a_single_commit_in_a_batch_and_back(make_store: MakeStore) -> None:
    store = make_store()
    exe = Execution(id="x")
    store.commit(exe, [("x", "e")], "ev", commit_id="k1")
    before = view(store, IDS)
    replay = Commit(Execution(id="x"), [("x", "e")], "ev", commit_id="k1")
    assert store.commit_many([replay]) == [None]
    assert replay.exe.version == 1
    assert view(store, IDS) == before
    batched = Commit(store.load("x"), [("x", "f")], commit_id="k2")
    assert store.commit_many([batched]) == [None]
    after = view(store, IDS)
    store.commit(Execution(id="x", version=1), [("x", "f")], commit_id="k2")  # its replay
    assert view(store, IDS) == after
    with pytest.raises(IdempotencyConflict):
        store.commit(Execution(id="x", version=1), [("x", "g")], commit_id="k2")
    assert view(store, IDS) == after


def test_the_same_id_with_another_body_is_an_idempotency_conflict(make_store: MakeStore) -> None:
    store = make_store()
    assert store.commit_many([full("x", 1, commit_id="k1")]) == [None]
    before = view(store, IDS)
    # Another execution object is the same body: the body is what the commit wrote.
    other = full("x", 1, commit_id="k1")._replace(exe=Execution(id="x", context={"n": 9}))
    assert store.commit_many([other]) == [None]
    assert other.exe.version == 1
    assert view(store, IDS) == before
    changed = Commit(Execution(id="x"), [("x", "other")], "ev", commit_id="k1")
    outcomes = store.commit_many([changed, full("y", 2)])
    assert type(outcomes[0]) is IdempotencyConflict and outcomes[1] is None
    assert (outcomes[0].execution_id, outcomes[0].commit_id) == ("x", "k1")
    assert changed.exe.version == 0
    after = view(store, IDS)
    assert after["load"]["x"] == before["load"]["x"]
    assert [e.event for e in after["outbox"]] == [e.event for e in before["outbox"]] + [
        "y-a", "y-b",
    ]  # fmt: skip


def test_epochs_in_a_batch_claim_continue_and_fence(make_store: MakeStore) -> None:
    store = make_store()
    base(store)  # "b" under epoch 5
    outcomes = store.commit_many(
        [
            Commit(Execution(id="a", version=1), [("a", "claim")], epoch=2),
            Commit(Execution(id="b", version=1), [("b", "same")], epoch=5),
            full("x", 1, epoch=1),
        ]
    )
    assert outcomes == [None, None, None]
    outcomes = store.commit_many(
        [
            Commit(Execution(id="a", version=2), [("a", "old")], epoch=1),
            Commit(Execution(id="b", version=2), [("b", "newer")], epoch=6),
            Commit(Execution(id="x", version=1), [("x", "none")]),
        ]
    )
    assert type(outcomes[0]) is StaleWriter and outcomes[1:] == [None, None]
    assert (outcomes[0].epoch, outcomes[0].current) == (1, 2)
    with pytest.raises(StaleWriter):
        store.commit(Execution(id="b", version=3), [], epoch=5)
    events = [e.event for e in store.pending_outbox()]
    assert "old" not in events and events[-2:] == ["newer", "none"]


# --- refused whole ---------------------------------------------------------------------


def test_two_commits_of_one_execution_are_refused_whole(make_store: MakeStore) -> None:
    store = make_store()
    base(store)
    before = view(store, IDS)
    x1, x2 = full("x", 1), full("x", 2)
    with pytest.raises(ValueError, match=r"commits\[1\] and commits\[3\]"):
        store.commit_many([full("y"), x1, full("z"), x2])
    assert x1.exe.version == 0 and x2.exe.version == 0
    assert view(store, IDS) == before
    stored = store.load("a")
    with pytest.raises(ValueError):
        store.commit_many([Commit(stored, [("a", 1)]), Commit(stored, [("a", 2)])])
    assert view(store, IDS) == before


class Unencodable:
    """A value no codec of the package encodes."""


def bad_commits(durable: bool) -> dict[str, tuple[Callable[[], Commit], type[Exception]]]:
    """Commits every store must refuse, each with the error class it raises."""
    bad: dict[str, tuple[Callable[[], Commit], type[Exception]]] = {
        "not-a-commit": (lambda: (Execution(id="bad"), [("t", 1)]), TypeError),  # type: ignore[dict-item]
        "no-id": (lambda: Commit(object(), []), TypeError),
        "emit-not-a-pair": (lambda: Commit(Execution(id="bad"), [("t",)]), TypeError),
        "emits-not-iterable": (lambda: Commit(Execution(id="bad"), 5), TypeError),
        "timer-action": (
            lambda: Commit(Execution(id="bad"), [], timers=[TimerOp("arm", "p", 1.0)]),
            ValueError,
        ),
        "timer-nan": (
            lambda: Commit(Execution(id="bad"), [], timers=[schedule("p", math.nan)]),
            ValueError,
        ),
        "timer-not-an-op": (lambda: Commit(Execution(id="bad"), [], timers=[5]), TypeError),
        "spawn-context": (
            lambda: Commit(Execution(id="bad"), [], spawns=[("k", "r", 5)]),
            TypeError,
        ),
        "trace-not-a-mapping": (lambda: Commit(Execution(id="bad"), [], trace=[1]), TypeError),
        "unhashable-id": (lambda: Commit(Execution(id=["bad"]), []), TypeError),
        "commit-id-not-str": (lambda: Commit(Execution(id="bad"), [], commit_id=5), TypeError),
        "epoch-not-int": (lambda: Commit(Execution(id="bad"), [], epoch="5"), TypeError),
    }
    if durable:
        bad.update(
            {
                "int-id": (lambda: Commit(Execution(id=5), []), TypeError),
                "unencodable-event": (
                    lambda: Commit(Execution(id="bad"), [("t", Unencodable())]),
                    TypeError,
                ),
                "unencodable-exe": (
                    lambda: Commit(Execution(id="bad", context={"v": Unencodable()}), []),
                    TypeError,
                ),
                "unencodable-trace": (
                    lambda: Commit(Execution(id="bad"), [], trace={"v": Unencodable()}),
                    TypeError,
                ),
                "unencodable-spawn": (
                    lambda: Commit(
                        Execution(id="bad"), [], spawns=[("k", "r", {"v": Unencodable()})]
                    ),
                    TypeError,
                ),
                "int-target": (lambda: Commit(Execution(id="bad"), [(5, "e")]), TypeError),
            }
        )
    return bad


BAD_NAMES = sorted(bad_commits(True))


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_input_anywhere_refuses_the_whole_batch(make_store: MakeStore, name: str) -> None:
    store = make_store()
    bad = bad_commits(store.durable)
    base(store)
    if name not in bad:  # a value only a durable store refuses: a memory store takes it
        make_bad, _ = bad_commits(True)[name]
        assert store.commit_many([make_bad()]) == [None]
        return
    make_bad, error = bad[name]
    before = view(store, IDS, ("ev", "ev2"))

    def good() -> list[Commit]:
        return [
            full("x", 1),
            Commit(Execution(id="a", version=1), [("a", "more")], "ev2", commit_id="k-a"),
            Commit(Execution(id="b", version=1), [("b", "more")], epoch=6),
            full("y", 2, commit_id="k-y"),
        ]

    for at in (0, 2, 4):  # first, in the middle, last
        commits = good()
        with pytest.raises(error):
            store.commit_many([*commits[:at], make_bad(), *commits[at:]])
        assert [c.exe.version for c in commits] == [0, 1, 1, 0], at
        assert view(store, IDS, ("ev", "ev2")) == before, at
    # Nothing of the batches was recorded: neither their commit ids nor their epochs.
    assert store.commit_many(good()) == [None, None, None, None]
    assert store.commit_many([Commit(Execution(id="b", version=2), [], epoch=6)]) == [None]


def test_a_batch_that_is_no_iterable_of_commits_is_refused(make_store: MakeStore) -> None:
    store = make_store()
    base(store)
    before = view(store, IDS)
    for commits in (5, None, Execution(id="a"), full("x"), [full("y"), None]):
        with pytest.raises(TypeError):
            store.commit_many(commits)
        assert view(store, IDS) == before, commits


def test_an_iterator_that_raises_midway_writes_nothing(make_store: MakeStore) -> None:
    store = make_store()
    base(store)
    before = view(store, IDS)
    taken: list[Commit] = []

    def commits() -> Iterator[Commit]:
        for i in range(3):
            taken.append(full(f"g{i}", i))
            yield taken[-1]
        raise LookupError("the caller's own iterator failed")

    with pytest.raises(LookupError, match="own iterator"):
        store.commit_many(commits())
    assert len(taken) == 3 and all(c.exe.version == 0 for c in taken)
    assert view(store, IDS) == before
    assert all(store.load(f"g{i}") is None for i in range(3))


def test_an_emit_iterator_that_raises_refuses_the_batch(make_store: MakeStore) -> None:
    store = make_store()
    base(store)
    before = view(store, IDS)

    def emits() -> Iterator[tuple[str, str]]:
        yield ("t", "one")
        raise LookupError("emits failed")

    x = full("x")
    with pytest.raises(LookupError, match="emits failed"):
        store.commit_many([x, Commit(Execution(id="y"), emits())])
    assert x.exe.version == 0
    assert view(store, IDS) == before


# --- batch acks ------------------------------------------------------------------------


def filled(store: Any) -> tuple[list[int], list[int]]:
    """Six outbox entries and four spawns; their seqs."""
    store.commit_many(
        [
            Commit(Execution(id="a"), [("a", i) for i in range(3)], spawns=[("k0", "r", {})]),
            Commit(
                Execution(id="b"),
                [("b", i) for i in range(3)],
                spawns=[(f"k{i}", "r", {}) for i in range(1, 4)],
            ),
        ]
    )
    return [e.seq for e in store.pending_outbox()], [s.seq for s in store.pending_spawns()]


def test_ack_outbox_many_acks_each_and_skips_unknown_seqs(make_store: MakeStore) -> None:
    store = make_store()
    out, _ = filled(store)
    spawns = store.pending_spawns()
    assert store.ack_outbox_many([out[4], out[0], max(out) + 100, out[0], -1]) is None
    assert [e.seq for e in store.pending_outbox()] == [out[1], out[2], out[3], out[5]]
    assert store.pending_spawns() == spawns
    store.ack_outbox_many(iter([out[1], out[4]]))  # an iterator; one already acked
    assert [e.seq for e in store.pending_outbox()] == [out[2], out[3], out[5]]
    store.ack_outbox_many([])
    assert [e.seq for e in store.pending_outbox()] == [out[2], out[3], out[5]]
    store.ack_outbox_many(out)
    assert store.pending_outbox() == []


def test_ack_spawn_many_acks_each_and_skips_unknown_seqs(make_store: MakeStore) -> None:
    store = make_store()
    _, sp = filled(store)
    outbox = store.pending_outbox()
    store.ack_spawn_many((sp[3], sp[1], max(sp) + 7))
    assert [s.child_id for s in store.pending_spawns()] == ["k0", "k2"]
    assert store.pending_outbox() == outbox
    store.ack_spawn_many(x for x in sp)
    assert store.pending_spawns() == []


@pytest.mark.parametrize("method", ["ack_outbox_many", "ack_spawn_many"])
def test_bad_seqs_are_refused_whole(make_store: MakeStore, method: str) -> None:
    store = make_store()
    filled(store)
    before = view(store, IDS)
    first = [store.pending_outbox()[0].seq, store.pending_spawns()[0].seq]
    for seqs in (5, None, "12", ["1"], [1, 2.0], [1, True], [1, None]):
        if isinstance(seqs, list):
            seqs = [*first, *seqs]
        with pytest.raises(TypeError):
            getattr(store, method)(seqs)
        assert view(store, IDS) == before, seqs


def test_delete_timer_many_deletes_each_as_delete_timer_does(make_store: MakeStore) -> None:
    store = make_store()
    store.commit_many(
        [
            Commit(Execution(id="a"), [], timers=[schedule("p", 1.0), schedule("q", 2.0)]),
            Commit(Execution(id="b"), [], timers=[schedule("p", 3.0), schedule("r", 4)]),
        ]
    )
    due = store.due_timers(math.inf)
    assert sorted(due) == [("a", "p", 1.0), ("a", "q", 2.0), ("b", "p", 3.0), ("b", "r", 4.0)]
    # "a"/"q" re-armed after a sweep read it at 2.0: the stale triple must not delete it.
    store.commit(store.load("a"), [], timers=[schedule("q", 9.0)])
    store.delete_timer_many(
        [("a", "p", 1.0), ("a", "q", 2.0), ("b", "r", 4), ("zz", "p", 1.0), ("b", "p", 3.5)]
    )
    assert sorted(store.due_timers(math.inf)) == [("a", "q", 9.0), ("b", "p", 3.0)]
    store.delete_timer_many(iter([("a", "q", 9.0)]))
    store.delete_timer_many([])
    assert store.due_timers(math.inf) == [("b", "p", 3.0)]


def test_bad_timer_triples_are_refused_whole(make_store: MakeStore) -> None:
    store = make_store()
    store.commit(Execution(id="a"), [], timers=[schedule("p", 1.0), schedule("q", 2.0)])
    before = view(store, IDS)
    for bad in (
        5,
        None,
        [("a", "p")],
        [("a", "p", 1.0, 2)],
        [("a", "p", "soon")],
        [("a", "p", None)],
        [5],
    ):
        if isinstance(bad, list):
            bad = [("a", "p", 1.0), *bad, ("a", "q", 2.0)]
        with pytest.raises(TypeError):
            store.delete_timer_many(bad)
        assert view(store, IDS) == before, bad
