"""Moving between stores (DURABLE.md item 5, issue 13 part 5): ``harel_store.copy_store``
and ``python -m harel_store copy`` (``harel_store.cli.copy.main``).

Everything a store holds is written through the public API of the source, copied, and
compared through the public API of the copy: loads and versions, processed marks, pending
entries with their seqs, timers in ``due_timers`` order (ties included), trace rings and
the index of their next step; then the copy is used: a replayed commit id is a no-op, a
changed body a conflict, a stale epoch is fenced off, new seqs come after the copied ones,
leases were left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import harel_store
from harel_store import (
    Execution,
    IdempotencyConflict,
    StaleWriter,
    StoreError,
    TimerOp,
    _copy,
    _open,
    copy_store,
)
from harel_store.cli import copy as copy_cli
from harel_store.sqlite import AsyncSqliteStore, JsonCodec, SqliteStore

IDS = ("a", "b", "c", "gone", "lonely", "absent")
EVENTS = ("ev-1", "ev-2", "ev-3", "ev-c", "ev-gone", "ev-9")
MEMORY = [
    pytest.param("pure", id="pure"),
    pytest.param("compiled", id="compiled", marks=pytest.mark.compiled),
]


# --- what a store holds, and what it shows ------------------------------------------------


class History:
    """What :func:`populate` did that a copy must remember: each commit made with a commit
    id (its arguments and the version it produced), and the last seqs allocated."""

    def __init__(self) -> None:
        self.commits: list[tuple[str, tuple[Any, ...], str, int]] = []
        self.last_outbox = 0
        self.last_spawn = 0


def _commit(store: Any, history: History, exe: Any, *args: Any, commit_id: str | None = None,
            epoch: int | None = None) -> None:  # fmt: skip
    store.commit(exe, *args, commit_id=commit_id, epoch=epoch)
    if commit_id is not None:
        history.commits.append((exe.id, copy.deepcopy(args), commit_id, exe.version))


def populate(store: Any) -> History:
    """A bit of everything, with ``str`` ids (any store can hold it), on a store with
    ``trace_max=3``: epochs, commit ids, marks, timers re-armed and cancelled and deleted
    and tied, rings that wrapped, a ring without an execution, a step with its own index,
    acked entries at both ends (gaps, and counters beyond the last pending seq), a
    forgotten execution whose entries are still owed, leased entries and timers."""
    h = History()
    c = Execution(id="c", definition_id="svc")
    _commit(store, h, c, [], "ev-c", [TimerOp("schedule", "c/tie", 50.0)])  # first of the ties
    a = Execution(id="a", definition_id="order", context={"n": 1, "pair": (1, 2)},
                  active_path=("root", "wait"), history={"root": "wait"})  # fmt: skip
    _commit(
        store, h, a,
        [("c", {"do": "charge", "amount": 2.5}), (None, ("broadcast", 1))], "ev-1",
        [TimerOp("schedule", "a/wait", 100.0), TimerOp("schedule", "a/tie", 50.0)],
        [("a.r1", ("root", "r1"), {"k": 1})], {"step": "enter", "at": 1.5},
        commit_id="a-1", epoch=3,
    )  # fmt: skip
    b = Execution(id="b", parent_id="a", child_id="b")
    store.save(b, epoch=7)
    _commit(store, h, b, [("a", "ping")], "ev-2", [TimerOp("schedule", "b/tie", 50.0)], [],
            {"step": "b1"}, commit_id="b-1", epoch=7)  # fmt: skip
    # a/tie re-armed after b/tie at the same time: the ties come c, b, a.
    _commit(
        store, h, a,
        [("c", "again"), ("b", ["list", "event"])], "ev-3",
        [TimerOp("schedule", "a/tie", 50.0), TimerOp("cancel", "a/wait", None),
         TimerOp("schedule", "a/late", 200.0), TimerOp("schedule", "a/gone", 300.0)],
        [("a.r2", "r2", {"nested": {"x": [1, 2]}}), ("a.r3", "r3", {})], None,
        commit_id="a-2",
    )  # fmt: skip
    store.delete_timer("a", "a/gone", 300.0)
    for i in range(4):  # a's ring wraps: 5 steps, 3 kept
        store.append_trace("a", {"i": i})
    store.append_trace("b", {"index": "own", "x": 1})
    store.append_trace("lonely", {"note": "a ring without an execution"})
    gone = Execution(id="gone")
    _commit(store, h, gone, [("a", "from gone")], "ev-gone", [TimerOp("schedule", "g", 1.0)],
            [("gone.r", "r", {})], {"step": "g"}, commit_id="g-1", epoch=1)  # fmt: skip
    store.forget("gone")  # its outbox and spawn entries are still owed, its commit id gone
    h.commits = [c for c in h.commits if c[0] != "gone"]
    _commit(store, h, c, [("a", "last")], None, [], [("c.r", "r", {})])
    outbox = store.pending_outbox()
    spawns = store.pending_spawns()
    h.last_outbox = outbox[-1].seq
    h.last_spawn = spawns[-1].seq
    store.ack_outbox(outbox[0].seq)  # acked at both ends and in the middle
    store.ack_outbox(outbox[2].seq)
    store.ack_outbox(outbox[-1].seq)
    store.ack_spawn(spawns[-1].seq)
    store.claim_outbox(1, lease=1000.0)  # leases are not copied
    store.claim_spawns(1, lease=1000.0)
    store.claim_due_timers(math.inf, 1, lease=1000.0)
    return h


def view(store: Any) -> dict[str, Any]:
    """Everything ``store`` shows through its public API about the ids of :func:`populate`
    (deep-copied: later writes cannot reach it)."""
    state = {
        "load": {eid: store.load(eid) for eid in IDS},
        "versions": {eid: getattr(store.load(eid), "version", None) for eid in IDS},
        "processed": {(e, v): store.is_processed(e, v) for e in IDS for v in EVENTS},
        "outbox": store.pending_outbox(),
        "spawns": store.pending_spawns(),
        "timers": store.due_timers(math.inf),
        "trace": {eid: store.read_trace(eid) for eid in IDS},
        "stats": store.stats(),
    }
    return copy.deepcopy(state)


def assert_is_a_working_copy(dst: Any, expected: dict[str, Any], history: History) -> None:
    """``dst`` shows ``expected``, and behaves as the store it was copied from would."""
    assert view(dst) == expected
    assert [t[:2] for t in expected["timers"]][:3] == [
        ("c", "c/tie"),
        ("b", "b/tie"),
        ("a", "a/tie"),
    ]
    assert expected["trace"]["a"][-1]["index"] == 4 and len(expected["trace"]["a"]) == 3

    # Leases stayed behind: everything pending is claimable at once.
    assert dst.claim_outbox(100) == expected["outbox"]
    assert dst.claim_spawns(100) == expected["spawns"]
    assert dst.claim_due_timers(math.inf, 100) == expected["timers"]

    # A replayed commit id is recognised: nothing written, the version it produced given.
    for eid, args, commit_id, version in history.commits:
        exe = Execution(id=eid)
        dst.commit(exe, *copy.deepcopy(args), commit_id=commit_id)
        assert exe.version == version, commit_id
        changed = (*args[:4], {"step": "another"})
        with pytest.raises(IdempotencyConflict):
            dst.commit(Execution(id=eid), *changed, commit_id=commit_id)
    assert view(dst) == expected

    # The epochs came along.
    with pytest.raises(StaleWriter) as info:
        dst.save(dst.load("b"), epoch=6)
    assert info.value.current == 7
    with pytest.raises(StaleWriter):
        dst.commit(dst.load("a"), [], epoch=2)

    # New seqs come after every seq the source allocated, acked ones included.
    c = dst.load("c")
    dst.commit(c, [("a", "new")], None, [], [("c.r9", "r", {})], None, commit_id="c-new")
    assert dst.pending_outbox()[-1].seq == history.last_outbox + 1
    assert dst.pending_spawns()[-1].seq == history.last_spawn + 1
    assert c.version == expected["versions"]["c"] + 1

    # The ring goes on from its next index.
    dst.append_trace("a", {"i": "next"})
    assert dst.read_trace("a")[-1] == {"i": "next", "index": 5}


# --- stores -------------------------------------------------------------------------------


def memory(request: pytest.FixtureRequest, name: str, **options: Any) -> Any:
    return request.getfixturevalue(f"{name}_module").DictStore(**options)


@pytest.fixture
def sqlite_at(tmp_path: Path) -> Iterator[Callable[..., SqliteStore]]:
    """Open SQLite stores on files of ``tmp_path`` by name; all closed after the test."""
    made: list[SqliteStore] = []

    def make(name: str, **options: Any) -> SqliteStore:
        store = SqliteStore(tmp_path / name, **options)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


# --- copies between kinds -----------------------------------------------------------------


@pytest.mark.parametrize("src_impl", MEMORY)
def test_memory_to_sqlite(
    request: pytest.FixtureRequest, src_impl: str, sqlite_at: Callable[..., SqliteStore]
) -> None:
    src = memory(request, src_impl, trace_max=3)
    history = populate(src)
    expected = view(src)
    dst = sqlite_at("copy.db")
    counts = copy_store(src, dst)
    assert counts == {
        "executions": 3, "processed": 4, "commit_ids": 3, "traces": 3, "timers": 4,
        "outbox": 4, "spawns": 4,
    }  # fmt: skip
    assert view(src) == expected  # the source is only read
    assert view(dst) == expected
    dst.close()
    # Durable: another store object on the file sees all of it, and works as the source.
    assert_is_a_working_copy(sqlite_at("copy.db", trace_max=3), expected, history)


def test_sqlite_to_sqlite(sqlite_at: Callable[..., SqliteStore]) -> None:
    src = sqlite_at("src.db", trace_max=3)
    history = populate(src)
    expected = view(src)
    copy_store(src, sqlite_at("dst.db"))
    assert view(src) == expected
    assert_is_a_working_copy(sqlite_at("dst.db", trace_max=3), expected, history)


@pytest.mark.parametrize("dst_impl", MEMORY)
@pytest.mark.parametrize("src_impl", MEMORY)
def test_memory_to_memory(request: pytest.FixtureRequest, src_impl: str, dst_impl: str) -> None:
    src = memory(request, src_impl, trace_max=3)
    history = populate(src)
    expected = view(src)
    dst = memory(request, dst_impl, trace_max=3)
    copy_store(src, dst)
    # A copy, not a second view of the same objects.
    assert dst.load("a") == src.load("a") and dst.load("a") is not src.load("a")
    src.load("a").context["n"] = 99
    src.pending_spawns()[0].context["k"] = 99
    src.read_trace("a")[-1]["i"] = 99
    src.commit(src.load("c"), [("a", "after the copy")])
    assert_is_a_working_copy(dst, expected, history)


@pytest.mark.parametrize("dst_impl", MEMORY)
def test_sqlite_to_memory_keeps_the_digests_of_commit_ids(
    request: pytest.FixtureRequest, dst_impl: str, sqlite_at: Callable[..., SqliteStore]
) -> None:
    """The SQLite store keeps a digest of each commit body, never the body: the memory
    copy keeps the digest and compares a replay by digesting it the same way."""
    src = sqlite_at("src.db", trace_max=3)
    history = populate(src)
    expected = view(src)
    dst = memory(request, dst_impl, trace_max=3)
    copy_store(src, dst)
    assert_is_a_working_copy(dst, expected, history)


@pytest.mark.parametrize("impl_name", MEMORY)
def test_commit_ids_survive_memory_sqlite_memory_sqlite(
    request: pytest.FixtureRequest, impl_name: str, sqlite_at: Callable[..., SqliteStore]
) -> None:
    """Bodies become digests and digests stay digests, recognised at every stop."""
    src = memory(request, impl_name, trace_max=3)
    history = populate(src)
    expected = view(src)
    first = sqlite_at("first.db", trace_max=3)
    copy_store(src, first)
    middle = memory(request, impl_name, trace_max=3)
    copy_store(first, middle)
    last = sqlite_at("last.db", trace_max=3)
    copy_store(middle, last)
    assert_is_a_working_copy(last, expected, history)


def test_a_replay_given_in_other_containers_is_recognised_after_the_copy(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore]
) -> None:
    """Commit bodies are compared by value after the copy as before it: lists for
    tuples of the call, a mapping for a dict, keys in another order."""
    src = memory(request, "pure")
    exe = Execution(id="x")
    args: tuple[Any, ...] = ([("t", {"a": 1, "b": 2})], "e", [TimerOp("schedule", "p", 5.0)],
                             [("k", "r", {})], {"s": 1, "t": 2})  # fmt: skip
    src.commit(exe, *args, commit_id="x-1")
    for dst in (sqlite_at("d.db"), memory(request, "pure")):
        copy_store(src, dst)
        again = Execution(id="x")
        emits: Any = [["t", {"b": 2, "a": 1}]]  # lists where the first call had tuples
        spawns: Any = [["k", "r", {}]]
        dst.commit(again, emits, "e", (TimerOp("schedule", "p", 5),), spawns, {"t": 2, "s": 1},
                   commit_id="x-1")  # fmt: skip
        assert again.version == 1
        assert dst.stats()["outbox"] == 1


def test_the_trace_max_of_the_copy_decides_what_each_ring_keeps(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore]
) -> None:
    src = memory(request, "pure", trace_max=None)
    for i in range(6):
        src.append_trace("a", {"i": i})
    for dst in (sqlite_at("two.db", trace_max=2), memory(request, "pure", trace_max=2)):
        copy_store(src, dst)
        assert dst.read_trace("a") == [{"i": 4, "index": 4}, {"i": 5, "index": 5}]
        assert dst.stats()["trace_steps"] == 2
        dst.append_trace("a", {"i": 6})
        assert [s["index"] for s in dst.read_trace("a")] == [5, 6]
    everything = sqlite_at("all.db", trace_max=None)
    copy_store(src, everything)
    assert everything.read_trace("a") == src.read_trace("a")


@pytest.mark.parametrize("impl_name", MEMORY)
def test_seqs_continue_after_acked_entries(
    request: pytest.FixtureRequest, impl_name: str, sqlite_at: Callable[..., SqliteStore]
) -> None:
    src = memory(request, impl_name)
    src.commit(Execution(id="a"), [("b", 1), ("b", 2), ("b", 3)], None, [], [("k", "r", {})])
    for entry in src.pending_outbox():
        src.ack_outbox(entry.seq)
    src.ack_spawn(1)
    for dst in (sqlite_at("d.db"), memory(request, impl_name)):
        copy_store(src, dst)
        assert dst.pending_outbox() == [] and dst.pending_spawns() == []
        dst.commit(dst.load("a"), [("b", 4)], None, [], [("k2", "r", {})])
        assert [e.seq for e in dst.pending_outbox()] == [4]
        assert [e.seq for e in dst.pending_spawns()] == [2]


@pytest.mark.parametrize("dst_kind", ["sqlite", *MEMORY])
def test_seqs_of_an_emptied_store_never_go_back(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore], dst_kind: str
) -> None:
    """An empty store that handed out seqs (acked since) keeps allocating after them: a
    relay's late ack of an old seq must not drop an entry committed after the copy."""
    dst = sqlite_at("d.db") if dst_kind == "sqlite" else memory(request, dst_kind)
    dst.commit(Execution(id="old"), [(None, i) for i in range(5)], None, [],
               [(f"k{i}", "r", {}) for i in range(5)])  # fmt: skip
    for entry in dst.pending_outbox():
        dst.ack_outbox(entry.seq)
    for spawn in dst.pending_spawns():
        dst.ack_spawn(spawn.seq)
    dst.forget("old")
    src = memory(request, "pure")
    src.commit(Execution(id="a"), [(None, "copied")], None, [], [("c", "r", {})])
    copy_store(src, dst)
    dst.commit(Execution(id="b"), [(None, "new")], None, [], [("c2", "r", {})])
    assert [e.seq for e in dst.pending_outbox()] == [1, 6]
    assert [e.seq for e in dst.pending_spawns()] == [1, 6]
    dst.ack_outbox(3)  # late, from before the copy
    dst.ack_spawn(3)
    assert [e.event for e in dst.pending_outbox()] == ["copied", "new"]
    assert [e.child_id for e in dst.pending_spawns()] == ["c", "c2"]


class _Key:
    """An id hashed by identity, as any hashable id may be in a memory store."""

    __slots__ = ()


@pytest.mark.parametrize("impl_name", MEMORY)
def test_an_id_hashed_by_identity_keeps_its_records_in_a_memory_copy(
    request: pytest.FixtureRequest, impl_name: str
) -> None:
    key = _Key()
    src = memory(request, impl_name)
    src.commit(Execution(id=key, context={"n": [1]}), [(None, "ev")], "ev-1",
               [TimerOp("schedule", "p", 1.0)], [], {"a": 1})  # fmt: skip
    dst = memory(request, impl_name)
    copy_store(src, dst)
    exe = dst.load(key)
    assert exe.id is key and exe is not src.load(key)
    assert exe.context == {"n": [1]} and exe.context["n"] is not src.load(key).context["n"]
    assert dst.is_processed(key, "ev-1")
    assert dst.read_trace(key) == [{"a": 1, "index": 0}]
    assert dst.due_timers(2.0) == [(key, "p", 1.0)]
    dst.forget(key)
    assert dst.stats() == {"executions": 0, "outbox": 1, "spawns": 0, "timers": 0,
                           "processed": 0, "traces": 0, "trace_steps": 0}  # fmt: skip


def test_an_async_memory_store_is_copied_through_its_sync_store(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore]
) -> None:
    src = harel_store.AsyncDictStore(trace_max=3)
    history = populate(src._store)
    expected = view(src._store)
    dst = harel_store.AsyncDictStore(trace_max=3)
    copy_store(src, dst)
    assert_is_a_working_copy(dst._store, expected, history)


def test_a_copy_reports_its_progress(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(_copy, "PROGRESS_EVERY", 3)
    src = memory(request, "pure", trace_max=3)
    populate(src)
    for dst in (sqlite_at("d.db"), memory(request, "pure")):
        calls: list[tuple[int, int | None]] = []
        counts = copy_store(src, dst, progress=lambda *call, calls=calls: calls.append(call))
        total = sum(counts.values()) + 1  # and the seq counters
        assert calls[0] == (0, total) and calls[-1] == (total, total)
        assert [done for done, _ in calls] == sorted(done for done, _ in calls)
        assert len(calls) >= total // 3


# --- refusals: nothing written ------------------------------------------------------------


def _fill_a_little(store: Any, what: str) -> None:
    if what == "execution":
        store.save(Execution(id="there"))
    elif what == "trace":
        store.append_trace("there", {"x": 1})
    elif what == "outbox":  # an entry owed by a forgotten execution
        store.commit(Execution(id="there"), [(None, "owed")])
        store.forget("there")
    else:
        raise AssertionError(what)


@pytest.mark.parametrize("what", ["execution", "trace", "outbox"])
@pytest.mark.parametrize("dst_kind", ["sqlite", *MEMORY])
def test_a_store_that_is_not_empty_is_refused_with_nothing_written(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore], dst_kind: str,
    what: str,
) -> None:  # fmt: skip
    src = memory(request, "pure", trace_max=3)
    populate(src)
    before_src = view(src)
    dst = sqlite_at("d.db") if dst_kind == "sqlite" else memory(request, dst_kind)
    _fill_a_little(dst, what)
    before = view(dst)
    with pytest.raises(StoreError, match="not empty.*nothing was written"):
        copy_store(src, dst)
    assert view(dst) == before
    assert view(src) == before_src


@pytest.mark.parametrize("dst_kind", ["sqlite", *MEMORY])
def test_a_store_emptied_by_acks_and_forget_is_empty(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore], dst_kind: str
) -> None:
    src = memory(request, "pure", trace_max=3)
    populate(src)
    dst = sqlite_at("d.db") if dst_kind == "sqlite" else memory(request, dst_kind)
    dst.commit(Execution(id="was"), [(None, 1)], "e", [TimerOp("schedule", "p", 1.0)],
               [("k", "r", {})], {"s": 1}, commit_id="w", epoch=4)  # fmt: skip
    dst.forget("was")
    dst.ack_outbox(dst.pending_outbox()[0].seq)
    dst.ack_spawn(dst.pending_spawns()[0].seq)
    copy_store(src, dst)
    assert view(dst) == view(src)


NON_STR = {
    "execution id": lambda s: s.commit(Execution(id=7), []),
    "processed event id": lambda s: s.commit(Execution(id="x"), [], ("event", 1)),
    "timer path": lambda s: s.commit(Execution(id="x"), [], None, [TimerOp("schedule", 3, 1.0)]),
    "outbox target_id": lambda s: s.commit(Execution(id="x"), [(8, "event")]),
    "spawn child_id": lambda s: s.commit(Execution(id="x"), [], None, [], [(9, "r", {})]),
    "a ring's execution id": lambda s: s.append_trace(("tuple", "id"), {"x": 1}),
}


@pytest.mark.parametrize("what", NON_STR)
@pytest.mark.parametrize("src_impl", MEMORY)
def test_ids_that_are_not_str_cannot_go_into_a_durable_store(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore], src_impl: str,
    what: str,
) -> None:  # fmt: skip
    src = memory(request, src_impl, trace_max=3)
    populate(src)
    NON_STR[what](src)
    dst = sqlite_at("d.db")
    with pytest.raises(TypeError, match="must be a str in a durable store.*nothing was written"):
        copy_store(src, dst)
    assert set(dst.stats().values()) == {0}
    assert dst.pending_outbox() == [] and dst.due_timers(math.inf) == []
    # Nothing was written: the same database takes a copy of a store it can hold.
    ok = memory(request, src_impl, trace_max=3)
    history = populate(ok)
    copy_store(ok, dst)
    assert_is_a_working_copy(dst, view(ok), history)


def test_a_value_the_codec_refuses_is_a_type_error_with_nothing_written(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore]
) -> None:
    src = memory(request, "pure")
    src.commit(Execution(id="a"), [("b", "fine")])
    src.commit(Execution(id="z", context={"s": {1, 2}}), [])
    dst = sqlite_at("d.db")
    with pytest.raises(TypeError, match="cannot encode the execution 'z'"):
        copy_store(src, dst)
    assert set(dst.stats().values()) == {0}


@pytest.mark.parametrize("dst_kind", ["sqlite", *MEMORY])
def test_an_error_on_the_way_writes_nothing(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore], dst_kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    src = memory(request, "pure", trace_max=3)
    populate(src)
    dst = sqlite_at("d.db") if dst_kind == "sqlite" else memory(request, dst_kind)

    monkeypatch.setattr(_copy, "PROGRESS_EVERY", 5)

    class Stop(BaseException):
        pass

    def progress(done: int, total: int | None) -> None:
        if done:
            raise Stop  # as KeyboardInterrupt would, midway

    with pytest.raises(Stop):
        copy_store(src, dst, progress=progress)
    assert set(dst.stats().values()) == {0}
    copy_store(src, dst)  # and it is still empty
    assert view(dst) == view(src)


@pytest.mark.parametrize("dst_kind", ["sqlite", *MEMORY])
def test_an_error_from_the_last_progress_call_writes_nothing(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore], dst_kind: str
) -> None:
    src = memory(request, "pure", trace_max=3)
    populate(src)
    dst = sqlite_at("d.db") if dst_kind == "sqlite" else memory(request, dst_kind)

    class Stop(BaseException):
        pass

    def progress(done: int, total: int | None) -> None:
        if done == total:
            raise Stop

    with pytest.raises(Stop):
        copy_store(src, dst, progress=progress)
    assert set(dst.stats().values()) == {0}
    copy_store(src, dst)
    assert view(dst) == view(src)


def test_commit_ids_cannot_move_between_codecs_that_digest_differently(
    sqlite_at: Callable[..., SqliteStore],
) -> None:
    class Sorted(JsonCodec):
        """Another canonical encoding: its digests differ from the default's."""

        __slots__ = ()

        def canonical_value(self, value: Any) -> str:
            return "v2:" + super().canonical_value(value)

    class Plain(JsonCodec):
        """The default's canonical encoding, inherited."""

        __slots__ = ()

    src = sqlite_at("src.db")
    src.commit(Execution(id="a"), [("b", 1)], commit_id="a-1")
    other = sqlite_at("other.db", codec=Sorted())
    with pytest.raises(StoreError, match="another codec's canonical encoding"):
        copy_store(src, other)
    assert set(other.stats().values()) == {0}
    same = sqlite_at("same.db", codec=Plain())
    copy_store(src, same)
    again = Execution(id="a")
    same.commit(again, [("b", 1)], commit_id="a-1")
    assert again.version == 1 and same.stats()["outbox"] == 1


def test_bad_arguments(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore]
) -> None:
    store = memory(request, "pure")
    with pytest.raises(ValueError, match="into itself"):
        copy_store(store, store)
    with pytest.raises(TypeError, match="object cannot be copied into: it has no _restore"):
        copy_store(store, object())
    with pytest.raises(TypeError, match="cannot be copied from: it has no _dump"):
        copy_store(object(), store)
    with pytest.raises(TypeError, match="progress must be a function"):
        copy_store(store, memory(request, "pure"), progress=3)  # type: ignore[arg-type]
    asynchronous = AsyncSqliteStore(sqlite_at("async.db").path)
    try:
        with pytest.raises(TypeError, match="AsyncSqliteStore cannot be copied from.*open_store"):
            copy_store(asynchronous, store)
    finally:
        asyncio.run(asynchronous.close())
    closed = sqlite_at("closed.db")
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        copy_store(closed, memory(request, "pure"))
    with pytest.raises(ValueError, match="closed"):
        copy_store(store, closed)


@pytest.mark.parametrize("dst_kind", ["sqlite", *MEMORY])
def test_unknown_or_inconsistent_records_are_refused(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore], dst_kind: str
) -> None:
    """``_restore`` is the interface every store implements: it checks what it takes."""
    dst = sqlite_at("d.db") if dst_kind == "sqlite" else memory(request, dst_kind)
    exe = Execution(id="a", version=1)
    cases: list[tuple[list[tuple[Any, ...]], type[Exception]]] = [
        ([("nonsense", 1)], ValueError),
        ([("execution", exe, None), ("execution", exe, None)], ValueError),
        ([("mark", "a", "e"), ("mark", "a", "e")], ValueError),
        ([("trace", "a", 1, [{"index": 0}, {"index": 1}])], ValueError),
        ([("commit", "a", "c", 1, "not a body")], TypeError),
        ([("execution", exe, -1)], ValueError),
    ]
    for records, error in cases:
        with pytest.raises(error):
            dst._restore(iter(records))
        assert set(dst.stats().values()) == {0}, records


class ReprRaises:
    """An id whose ``repr`` raises (hashed by identity)."""

    def __repr__(self) -> str:
        raise RuntimeError("ReprRaises.__repr__")


@pytest.mark.parametrize("dst_kind", ["sqlite", *MEMORY])
def test_a_record_naming_an_id_whose_repr_raises_is_refused_with_its_own_error(
    request: pytest.FixtureRequest, sqlite_at: Callable[..., SqliteStore], dst_kind: str
) -> None:
    """Issue 32, item 10: the refusal names the id by its type; the repr's error stays
    out of it, and nothing is written."""
    dst = sqlite_at("d.db") if dst_kind == "sqlite" else memory(request, dst_kind)
    key = ReprRaises()
    named = r"<ReprRaises instance at 0x[0-9a-f]+>"
    exe = Execution(id=key)
    cases: list[tuple[list[tuple[Any, ...]], type[Exception], str]]
    if dst_kind == "sqlite":  # a durable store holds str ids only
        cases = [
            ([("execution", exe, None)], TypeError, f"execution id must be a str .* {named}:"),
            ([("mark", "a", key)], TypeError, f"processed event id must be a str .* {named}:"),
        ]
    else:
        cases = [
            (
                [("execution", exe, None), ("execution", Execution(id=key), None)],
                ValueError,
                f"^two executions with the id {named} to restore$",
            ),
            (
                [("mark", key, key), ("mark", key, key)],
                ValueError,
                f"^two processed marks {named} of {named} to restore$",
            ),
            (
                [("timer", key, "p", 1.0), ("timer", key, "p", 2.0)],
                ValueError,
                f"^two timers 'p' of {named} to restore$",
            ),
            (
                [("trace", key, 0, [{"index": 0}])],
                ValueError,
                f"^the trace of {named} holds 1 steps, more than its next index 0$",
            ),
        ]
    for records, error, says in cases:
        with pytest.raises(error, match=says):
            dst._restore(iter(records))
        assert set(dst.stats().values()) == {0}, records


def test_the_sqlite_dump_is_a_snapshot(sqlite_at: Callable[..., SqliteStore]) -> None:
    """Other store objects go on writing while a copy reads the database."""
    src = sqlite_at("src.db")
    src.commit(Execution(id="a"), [("b", 1)])
    writer = sqlite_at("src.db")
    records = src._dump()
    assert next(records) == ("total", 3)
    writer.commit(Execution(id="late"), [("b", 2)])
    rest = list(records)
    assert [r[0] for r in rest] == ["execution", "outbox", "seqs"]
    assert rest[-1] == ("seqs", 1, 0)
    assert src.load("late") is not None  # the snapshot ended with the iterator


# --- the command line ---------------------------------------------------------------------


def test_the_command_line_copies_one_sqlite_file_into_another(
    sqlite_at: Callable[..., SqliteStore], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = sqlite_at("src.db", trace_max=3)
    history = populate(src)
    expected = view(src)
    src.close()
    src_url, dst_url = f"sqlite:///{tmp_path}/src.db", f"sqlite:///{tmp_path}/dst.db"
    assert copy_cli.main([src_url, dst_url]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"copied {src_url} to {dst_url} in ")
    assert "3 executions" in out and "4 spawns" in out
    assert err == ""  # a small copy shows no progress
    assert_is_a_working_copy(sqlite_at("dst.db", trace_max=3), expected, history)

    # Again: the copy is not empty now.
    assert copy_cli.main([src_url, dst_url]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "error: cannot copy" in err and "not empty" in err and "nothing was written" in err


def test_the_command_line_shows_progress_on_stderr(
    sqlite_at: Callable[..., SqliteStore], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    src = sqlite_at("src.db")
    for i in range(30):
        src.commit(Execution(id=f"e{i}"), [("t", i)], f"ev{i}")
    src.close()
    monkeypatch.setattr(_copy, "PROGRESS_EVERY", 10)
    monkeypatch.setattr(copy_cli, "PROGRESS_INTERVAL", 0.0)
    urls = [f"sqlite:///{tmp_path}/src.db", f"sqlite:///{tmp_path}/dst.db"]
    assert copy_cli.main(urls) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("  copied 0/91 records (0%)")
    assert err[-1].startswith("  copied 91/91 records (100%)")
    assert copy_cli.main(["--quiet", urls[0], f"sqlite:///{tmp_path}/quiet.db"]) == 0
    assert capsys.readouterr().err == ""


def test_the_command_line_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = f"sqlite:///{tmp_path}/good.db"
    # A mistyped source would be made as an empty database, and nothing copied from it.
    assert copy_cli.main([good, f"sqlite:///{tmp_path}/dst.db"]) == 1
    assert "no such database file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    harel_store.open_store(good).close()
    # A URL open_store refuses by itself is a usage error.
    assert copy_cli.main(["nosuch://x", good]) == 2
    assert "cannot open nosuch://x: unknown store URL" in capsys.readouterr().err
    assert copy_cli.main([good, "sqlite://x/y.db"]) == 2
    assert "cannot open sqlite://x/y.db: a SQLite URL is" in capsys.readouterr().err
    assert copy_cli.main(["memory:x", good]) == 2
    assert "a memory store takes no path" in capsys.readouterr().err
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE mine (x)")
    conn.close()
    assert copy_cli.main([good, f"sqlite:///{foreign}"]) == 1
    assert "is not a harel_store database" in capsys.readouterr().err
    assert copy_cli.main([good]) == 2  # usage: argparse says what is missing
    assert "DST_URL" in capsys.readouterr().err
    assert copy_cli.main(["--help"]) == 0
    assert "empty store" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://me:secret@db:5432/app", "postgresql://me:***@db:5432/app"),
        ("postgresql://me@db/app?password=secret&sslmode=require",
         "postgresql://me@db/app?password=***&sslmode=require"),
        ("postgres://db/app?sslmode=require&%70assword=secret",
         "postgres://db/app?sslmode=require&%70assword=***"),
        ("postgresql://db/app?sslpassword=secret", "postgresql://db/app?sslpassword=***"),
        ("postgresql://me:se?cr#et@db/app", "postgresql://me:***@db/app"),  # as libpq reads it
        ("postgresql://me:se@cret@db/app", "postgresql://me:***@db/app"),
        ("postgresql://me@db?password=se@cret", "postgresql://me@db?password=***"),
        ("postgresql://me:a@h1,h2:5433/app?password=b", "postgresql://me:***@h1,h2:5433/app?password=***"),
        ("postgresql://db/app?passfile=/home/me/.pgpass", "postgresql://db/app?passfile=/home/me/.pgpass"),
        ("sqlite:////tmp/a@b:c.db", "sqlite:////tmp/a@b:c.db"),
        ("sqlite://", "sqlite://"),
        ("memory:", "memory:"),
    ],
)  # fmt: skip
def test_passwords_are_not_shown(url: str, shown: str) -> None:
    assert _open.redact(url) == shown


def test_the_command_line_shows_no_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for src in ("postgresq://me@db/app?password=s3cret", "sqlite:///a.db?password=s3cret"):
        assert copy_cli.main([src, f"sqlite:///{tmp_path}/dst.db"]) == 2
        err = capsys.readouterr().err
        assert "password=***" in err and "s3cret" not in err


@pytest.mark.parametrize("dst", ["memory:", "memory://", "sqlite://", "sqlite:///"])
def test_the_command_line_refuses_a_destination_that_vanishes_with_it(
    dst: str, sqlite_at: Callable[..., SqliteStore], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    sqlite_at("src.db").commit(Execution(id="a"), [(None, 1)])
    assert copy_cli.main([f"sqlite:///{tmp_path}/src.db", dst]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"error: {dst} would vanish with this command" in err


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir()}


@pytest.mark.parametrize("how", ["empty file", "no tables"])
def test_the_command_line_never_writes_to_its_source(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src.db"
    if how == "empty file":
        src.touch()
    else:
        with contextlib.closing(sqlite3.connect(src)) as conn:
            conn.execute("PRAGMA user_version = 7")
    before = _files(tmp_path)
    assert copy_cli.main([f"sqlite:///{src}", f"sqlite:///{tmp_path}/dst.db"]) == 1
    assert f"{src} is empty: it holds no harel_store database" in capsys.readouterr().err
    assert _files(tmp_path) == before  # the source as it was, and no destination made


def test_a_failed_command_line_copy_removes_only_the_file_it_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = f"sqlite:///{tmp_path}/src.db"
    with harel_store.open_store(src) as store:
        store.commit(Execution(id="a"), [(None, 1)])
    foreign = tmp_path / "foreign.db"
    with contextlib.closing(sqlite3.connect(foreign)) as conn:
        conn.execute("CREATE TABLE mine (x)")
    before = _files(tmp_path)
    # The source cannot be opened: the destination made for it goes.
    assert copy_cli.main([f"sqlite:///{foreign}", f"sqlite:///{tmp_path}/new.db"]) == 1
    assert "is not a harel_store database" in capsys.readouterr().err
    assert _files(tmp_path) == before

    # Interrupted midway: the same.
    def interrupt(*progress: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(copy_cli._Display, "__call__", interrupt)
    assert copy_cli.main([src, f"sqlite:///{tmp_path}/new.db"]) == 130
    assert "copy: interrupted by SIGINT: nothing was written to " in capsys.readouterr().err
    assert _files(tmp_path) == before

    # An empty database that was there before stays.
    kept = tmp_path / "kept.db"
    harel_store.open_store(f"sqlite:///{kept}").close()
    assert copy_cli.main([src, f"sqlite:///{kept}"]) == 130
    assert kept.exists()
    monkeypatch.undo()
    assert copy_cli.main([src, f"sqlite:///{kept}"]) == 0
