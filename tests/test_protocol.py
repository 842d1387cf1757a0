"""The protocol every store keeps beyond the specification (DURABLE.md, "What every store
promises"; issue 11): the store's errors, idempotent commits, writer epochs, claims for
many relays, bad arguments, capabilities and the one line ``open_store``.

Written once against ``make_store``/``cstore`` (``conftest.py``), so the same tests run on
every store kind: the memory stores now, the durable ones when their kinds are added. A
test decides what to expect from the capability attributes ``preserves_identity`` and
``durable``, never from the kind's name, and uses ``str`` ids, event ids and paths, as a
durable store requires. ``cstore`` may be an async store behind a sync facade, so only
the store's methods and attributes are used.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import decimal
import math
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import conftest
import pytest

import harel_store
from harel_store import Execution, OutboxEntry, SpawnEntry, StoreConflict, TimerOp
from harel_store._codec import JsonCodec

IDS = ("e1", "e2")
EVENTS = ("v1", "v2")
# A lease that runs out during the test, and a wait well past it. Only items claimed with
# SHORT are expected back after WAIT, and a SHORT claim is the last one before the wait;
# "still leased" checks use LONG leases, so a slow machine cannot make them flaky.
SHORT = 0.05
WAIT = 0.15
LONG = 30.0

MakeStore = Callable[..., Any]


# --- helpers ---------------------------------------------------------------------------


def body(n: int = 0) -> dict[str, Any]:
    """The keyword arguments of a commit that writes something of every kind."""
    return {
        "emits": [("t1", {"n": n}), (None, "ping")],
        "processed_event_id": "v1",
        "timers": [TimerOp("schedule", "p", 5.0 + n), TimerOp("cancel", "q")],
        "spawns": [("c1", "r", {"x": n})],
        "trace": {"step": n},
    }


def version_of(store: Any, eid: str) -> int | None:
    exe = store.load(eid)
    return None if exe is None else exe.version  # type: ignore[no-any-return]


def view(store: Any, ids: tuple[str, ...] = IDS) -> dict[str, Any]:
    """Everything the store shows about ``ids`` through the protocol, as plain values
    (deep-copied: a memory store hands out its own spawn contexts and trace steps)."""
    return copy.deepcopy(
        {
            "versions": {eid: version_of(store, eid) for eid in ids},
            "processed": {(e, v): store.is_processed(e, v) for e in ids for v in EVENTS},
            "outbox": store.pending_outbox(),
            "spawns": store.pending_spawns(),
            "timers": store.due_timers(math.inf),
            "trace": {eid: store.read_trace(eid) for eid in ids},
        }
    )


def current(store: Any, eid: str = "e1") -> Any:
    """The execution to write next: the stored one (a fresh copy in a durable store), or
    a new object."""
    exe = store.load(eid)
    return Execution(id=eid) if exe is None else exe


def fill(store: Any, fifo: str, n: int, eid: str = "e1") -> None:
    """Commit ``n`` entries to the outbox or to the spawns."""
    exe = current(store, eid)
    if fifo == "outbox":
        store.commit(exe, [("t", f"{eid}-ev{i}") for i in range(n)])
    else:
        store.commit(exe, [], spawns=[(f"{eid}-c{i}", "r", {"i": i}) for i in range(n)])


def arm(store: Any, eid: str, *ops: TimerOp) -> None:
    store.commit(current(store, eid), [], timers=list(ops))


def schedule(path: str, fire_at: float) -> TimerOp:
    return TimerOp("schedule", path, fire_at)


FIFOS = {
    "outbox": ("claim_outbox", "pending_outbox", "ack_outbox", OutboxEntry),
    "spawns": ("claim_spawns", "pending_spawns", "ack_spawn", SpawnEntry),
}
fifos = pytest.mark.parametrize("fifo", list(FIFOS))


class Fifo:
    """The claim, pending and ack methods of one FIFO of a store."""

    def __init__(self, store: Any, fifo: str) -> None:
        claim, pending, ack, self.record = FIFOS[fifo]
        self.claim = getattr(store, claim)
        self.pending = getattr(store, pending)
        self.ack = getattr(store, ack)


def seqs(entries: list[Any]) -> list[int]:
    return [entry.seq for entry in entries]


# --- errors ----------------------------------------------------------------------------


def test_store_errors_share_one_base() -> None:
    base = harel_store.StoreError
    assert issubclass(base, Exception)
    for cls in (StoreConflict, harel_store.IdempotencyConflict, harel_store.StaleWriter):
        assert issubclass(cls, base), cls
    # Each failure asks for a different response: none is a kind of another.
    assert not issubclass(harel_store.IdempotencyConflict, StoreConflict)
    assert not issubclass(harel_store.StaleWriter, StoreConflict)
    assert not issubclass(harel_store.StaleWriter, harel_store.IdempotencyConflict)


def test_store_conflict_is_unchanged() -> None:
    err = StoreConflict("exe-7", expected=3, found=5)
    assert (err.execution_id, err.expected, err.found) == ("exe-7", 3, 5)
    assert err.args == ("exe-7", 3, 5)
    assert StoreConflict("exe-7", 3, 5).args == err.args
    assert all(part in str(err) for part in ("exe-7", "3", "5"))
    with pytest.raises(harel_store.StoreError):
        raise err


@pytest.mark.parametrize(
    ("make", "attrs"),
    [
        (
            lambda: StoreConflict("exe-7", 3, 5),
            {"execution_id": "exe-7", "expected": 3, "found": 5},
        ),
        (
            lambda: harel_store.IdempotencyConflict("exe-7", "commit-42"),
            {"execution_id": "exe-7", "commit_id": "commit-42"},
        ),
        (
            lambda: harel_store.IdempotencyConflict(execution_id="exe-7", commit_id="commit-42"),
            {"execution_id": "exe-7", "commit_id": "commit-42"},
        ),
        (
            lambda: harel_store.StaleWriter("exe-7", 3, 5),
            {"execution_id": "exe-7", "epoch": 3, "current": 5},
        ),
        (
            lambda: harel_store.StaleWriter(execution_id="exe-7", epoch=3, current=5),
            {"execution_id": "exe-7", "epoch": 3, "current": 5},
        ),
    ],
    ids=["conflict", "idempotency", "idempotency-kw", "stale", "stale-kw"],
)
def test_errors_name_their_fields_and_survive_pickle(make: Any, attrs: dict[str, Any]) -> None:
    err = make()
    assert isinstance(err, harel_store.StoreError)
    for name, value in attrs.items():
        assert getattr(err, name) == value, name
        assert str(value) in str(err), f"the message {str(err)!r} does not name {name}"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert {name: getattr(back, name) for name in attrs} == attrs
    assert str(back) == str(err)
    assert back.args == err.args


# --- idempotent commits ----------------------------------------------------------------


def test_a_replay_with_an_equal_body_writes_nothing(cstore: Any) -> None:
    exe = Execution(id="e1")
    cstore.commit(exe, **body(), commit_id="k1")
    assert exe.version == 1
    cstore.commit(exe, [("t1", "later")], commit_id="k2")
    cstore.commit(exe, [("t1", "later still")])
    assert exe.version == 3
    before = view(cstore)

    # A retry by a writer that never saw the first reply: a new object at version 0.
    retry = Execution(id="e1")
    assert cstore.commit(retry, **body(), commit_id="k1") is None
    assert retry.version == 1, "a replay reports the version its commit produced"
    assert view(cstore) == before

    # Any other object, whatever its version, learns the version of that commit.
    other = Execution(id="e1", version=7)
    cstore.commit(other, **body(), commit_id="k1")
    assert other.version == 1
    assert view(cstore) == before

    held = cstore.load("e1")
    cstore.commit(held, **body(), commit_id="k1")
    if cstore.preserves_identity and held is cstore.load("e1"):
        # The very object the store holds: its version is the store's, and stays.
        assert held is exe and held.version == 3
    else:
        assert held.version == 1
    assert view(cstore) == before
    if cstore.preserves_identity:
        assert cstore.load("e1") is exe, "a replay must not replace the stored object"


def test_a_replay_after_the_entries_were_handled_writes_nothing(cstore: Any) -> None:
    """The relay acked the emits and spawns, the sweeper deleted the timer: a late retry
    must not bring any of them back."""
    exe = Execution(id="e1")
    cstore.commit(exe, **body(), commit_id="k1")
    for entry in cstore.pending_outbox():
        cstore.ack_outbox(entry.seq)
    for spawn in cstore.pending_spawns():
        cstore.ack_spawn(spawn.seq)
    for eid, path, fire_at in cstore.due_timers(math.inf):
        cstore.delete_timer(eid, path, fire_at)
    before = view(cstore)
    cstore.commit(Execution(id="e1"), **body(), commit_id="k1")
    assert view(cstore) == before
    assert cstore.pending_outbox() == [] and cstore.pending_spawns() == []
    assert cstore.due_timers(math.inf) == []


def test_a_replay_compares_contents_not_containers(cstore: Any) -> None:
    cstore.commit(Execution(id="e1"), **body(), commit_id="k1")
    before = view(cstore)
    same = body()
    retry = Execution(id="e1")
    cstore.commit(
        retry,
        (pair for pair in same["emits"]),
        same["processed_event_id"],
        tuple(same["timers"]),
        iter(same["spawns"]),
        dict(same["trace"]),
        commit_id="k1",
    )
    assert retry.version == 1
    assert view(cstore) == before


def test_the_stored_body_is_a_copy(cstore: Any) -> None:
    """Changing what was handed to the first commit does not change what a replay is
    compared with."""
    first = body()
    cstore.commit(Execution(id="e1"), **first, commit_id="k1")
    first["emits"][0][1]["n"] = 99  # a memory store's outbox shows this: the very event
    first["spawns"][0][2]["x"] = 99
    first["trace"]["step"] = 99
    before = view(cstore)
    cstore.commit(Execution(id="e1"), **body(), commit_id="k1")
    assert view(cstore) == before
    with pytest.raises(harel_store.IdempotencyConflict):
        cstore.commit(Execution(id="e1"), **first, commit_id="k1")


def test_a_relay_changing_what_it_was_handed_does_not_turn_a_retry_into_a_conflict(
    cstore: Any,
) -> None:
    """A memory store hands relays the very event objects a commit was given: a relay that
    marks a delivered event or spawn context must not change what a retry is compared
    with, so the same retry is recognised on every store."""
    listed = {**body(), "emits": [("t1", {"n": 0}), ("t2", [1, 2])]}
    cstore.commit(Execution(id="e1"), **listed, commit_id="k1")
    before = view(cstore)
    for entry in cstore.claim_outbox():
        if isinstance(entry.event, dict):
            entry.event["delivered"] = True
        elif isinstance(entry.event, list):
            entry.event.append(3)
    for intent in cstore.claim_spawns():
        intent.context["started"] = True
    for step in cstore.read_trace("e1"):
        step["seen"] = True
    retry = Execution(id="e1")
    cstore.commit(retry, **{**body(), "emits": [("t1", {"n": 0}), ("t2", [1, 2])]}, commit_id="k1")
    assert retry.version == 1
    if not cstore.preserves_identity:
        assert view(cstore) == before


CHANGES = {
    "emits": {"emits": [("t1", {"n": 1}), (None, "ping")]},
    "fewer-emits": {"emits": [("t1", {"n": 0})]},
    "emit-target": {"emits": [("t2", {"n": 0}), (None, "ping")]},
    "processed": {"processed_event_id": "v2"},
    "no-processed": {"processed_event_id": None},
    "timers": {"timers": [TimerOp("schedule", "p", 6.0), TimerOp("cancel", "q")]},
    "timer-action": {"timers": [TimerOp("schedule", "p", 5.0), TimerOp("schedule", "q", 1.0)]},
    "no-timers": {"timers": []},
    "spawns": {"spawns": [("c1", "r", {"x": 1})]},
    "spawn-child": {"spawns": [("c2", "r", {"x": 0})]},
    "no-spawns": {"spawns": []},
    "trace": {"trace": {"step": 1}},
    "no-trace": {"trace": None},
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=list(CHANGES))
def test_a_changed_body_is_an_idempotency_conflict(cstore: Any, change: dict[str, Any]) -> None:
    exe = Execution(id="e1")
    cstore.commit(exe, **body(), commit_id="k1")
    before = view(cstore)
    changed = {**body(), **change}
    # At the stored version, at a stale one, and (memory) the stored object itself.
    writers = [Execution(id="e1", version=1), Execution(id="e1", version=0), cstore.load("e1")]
    for writer in writers:
        version = writer.version
        with pytest.raises(harel_store.IdempotencyConflict) as info:
            cstore.commit(writer, **changed, commit_id="k1")
        assert (info.value.execution_id, info.value.commit_id) == ("e1", "k1")
        assert "k1" in str(info.value)
        assert writer.version == version
        assert view(cstore) == before
    # The refused body was not recorded either: the first one still replays.
    cstore.commit(Execution(id="e1"), **body(), commit_id="k1")
    assert view(cstore) == before


def test_the_id_check_comes_before_the_epoch_check_and_the_cas(cstore: Any) -> None:
    exe = Execution(id="e1")
    cstore.commit(exe, **body(), commit_id="k1", epoch=1)
    writer = current(cstore)
    cstore.commit(writer, [("t1", "taken over")], epoch=2)
    before = view(cstore)

    # The first try landed; its retry comes at a stale version and a stale epoch.
    retry = Execution(id="e1", version=0)
    cstore.commit(retry, **body(), commit_id="k1", epoch=1)
    assert retry.version == 1
    assert view(cstore) == before

    # A changed body is an IdempotencyConflict, not a StaleWriter or a StoreConflict.
    with pytest.raises(harel_store.IdempotencyConflict):
        cstore.commit(Execution(id="e1"), **body(1), commit_id="k1", epoch=1)
    assert view(cstore) == before

    # A new id at the stale epoch is fenced off as usual.
    with pytest.raises(harel_store.StaleWriter):
        cstore.commit(current(cstore), **body(1), commit_id="k9", epoch=1)
    assert view(cstore) == before


def test_commit_ids_are_per_execution(cstore: Any) -> None:
    one, two = Execution(id="e1"), Execution(id="e2")
    cstore.commit(one, **body(0), commit_id="k1")
    cstore.commit(two, **body(1), commit_id="k1")
    assert (one.version, two.version) == (1, 1)
    assert version_of(cstore, "e2") == 1
    assert [(s.parent_id, s.context) for s in cstore.pending_spawns()] == [
        ("e1", {"x": 0}),
        ("e2", {"x": 1}),
    ]
    assert [step["step"] for step in cstore.read_trace("e2")] == [1]
    assert len(cstore.pending_outbox()) == 4
    # Each id replays within its own execution.
    before = view(cstore)
    cstore.commit(Execution(id="e1"), **body(0), commit_id="k1")
    cstore.commit(Execution(id="e2"), **body(1), commit_id="k1")
    assert view(cstore) == before


def test_commit_ids_live_until_forget(cstore: Any) -> None:
    exe = Execution(id="e1")
    cstore.commit(exe, **body(0), commit_id="k1")
    for k in range(5):
        cstore.commit(exe, [("t1", k)], commit_id=f"other-{k}")
    cstore.commit(Execution(id="e1"), **body(0), commit_id="k1")
    assert version_of(cstore, "e1") == 6, "an old id is still recognised"

    cstore.forget("e1")
    assert cstore.load("e1") is None
    again = Execution(id="e1")
    cstore.commit(again, **body(1), commit_id="k1")  # a new body: the id was dropped
    assert again.version == 1 and version_of(cstore, "e1") == 1
    assert [step["step"] for step in cstore.read_trace("e1")] == [1]
    # From now on, k1 is that new commit.
    before = view(cstore)
    cstore.commit(Execution(id="e1"), **body(1), commit_id="k1")
    assert view(cstore) == before
    with pytest.raises(harel_store.IdempotencyConflict):
        cstore.commit(Execution(id="e1", version=1), **body(0), commit_id="k1")
    assert view(cstore) == before


def test_without_a_commit_id_nothing_is_recorded(cstore: Any) -> None:
    exe = Execution(id="e1")
    cstore.commit(exe, **body())
    cstore.commit(exe, **body(), commit_id=None)
    assert exe.version == 2 and version_of(cstore, "e1") == 2
    assert len(cstore.pending_outbox()) == 4 and len(cstore.pending_spawns()) == 2
    assert [step["step"] for step in cstore.read_trace("e1")] == [0, 0]
    # An id used after commits without one is a new commit.
    cstore.commit(exe, **body(), commit_id="k1")
    assert exe.version == 3 and len(cstore.pending_outbox()) == 6


def test_a_refused_commit_records_neither_its_id_nor_its_epoch(cstore: Any) -> None:
    exe = Execution(id="e1")
    cstore.commit(exe, **body(0), epoch=3)
    # Refused by the CAS: k2 and epoch 7 are not recorded.
    with pytest.raises(StoreConflict):
        cstore.commit(Execution(id="e1", version=0), **body(1), commit_id="k2", epoch=7)
    cstore.commit(current(cstore), [], epoch=3)
    # Refused as stale: k3 is not recorded.
    with pytest.raises(harel_store.StaleWriter):
        cstore.commit(current(cstore), **body(2), commit_id="k3", epoch=2)
    # Refused by an IdempotencyConflict: epoch 9 is not recorded.
    cstore.commit(current(cstore), **body(4), commit_id="k4")
    with pytest.raises(harel_store.IdempotencyConflict):
        cstore.commit(current(cstore), **body(5), commit_id="k4", epoch=9)
    cstore.commit(current(cstore), [], epoch=3)
    # So k2 and k3 apply with other bodies now.
    before = version_of(cstore, "e1")
    cstore.commit(current(cstore), **body(1), commit_id="k2", epoch=3)
    cstore.commit(current(cstore), **body(3), commit_id="k3", epoch=3)
    assert version_of(cstore, "e1") == before + 2


# --- a version the execution refuses -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FrozenRun:
    """An engine's execution that is a frozen dataclass: its version cannot be set."""

    id: str
    version: int = 0


class PickyRun:
    """An execution whose ``version`` setter refuses any new version (it accepts the one
    it has, so a store that only checks that much is caught)."""

    def __init__(self, id: str, version: int = 0) -> None:
        self.id = id
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        if value != self._version:
            raise ValueError(f"picky: version {value} refused")


class RunCodec(JsonCodec):
    """The codec a durable store needs for these two (and ``Execution``)."""

    kinds: ClassVar[dict[str, type]] = {"FrozenRun": FrozenRun, "PickyRun": PickyRun}

    def encode_execution(self, exe: Any) -> str:
        if type(exe) is Execution:
            return super().encode_execution(exe)
        return self.encode_value({"kind": type(exe).__name__, "id": exe.id})

    def decode_execution(self, data: str | bytes) -> Any:
        fields = self.decode_value(data)
        if fields.get("kind") not in self.kinds:
            return super().decode_execution(data)
        return self.kinds[fields["kind"]](fields["id"])


REFUSING = [
    pytest.param(FrozenRun, TypeError, "not writable", id="frozen"),
    pytest.param(PickyRun, ValueError, "picky", id="picky-setter"),
]


@pytest.mark.parametrize("method", ["save", "commit"])
@pytest.mark.parametrize(("make", "error", "match"), REFUSING)
def test_a_version_the_execution_refuses_writes_nothing(
    make_store: MakeStore, make: Any, error: type[Exception], match: str, method: str
) -> None:
    """The store cannot give the execution its new version: the call raises that error,
    and nothing of it is written (a durable store checks before it writes)."""
    store = make_store()
    if store.durable:
        store = make_store(codec=RunCodec())
    store.commit(Execution(id="e1"), **body(0))
    ids = ("e1", "r1")
    before = (view(store, ids), store.stats())
    run = make("r1")
    with pytest.raises(error, match=match):
        if method == "save":
            store.save(run, epoch=5)
        else:
            store.commit(run, **body(1), commit_id="k1", epoch=5)
    assert run.version == 0
    assert (view(store, ids), store.stats()) == before
    # Neither its commit id nor its epoch was recorded.
    store.commit(Execution(id="r1"), **body(2), commit_id="k1", epoch=1)
    assert version_of(store, "r1") == 1


# --- writer epochs ---------------------------------------------------------------------


@pytest.mark.parametrize("method", ["commit", "save"])
def test_a_lower_epoch_is_fenced_off_before_any_write(cstore: Any, method: str) -> None:
    exe = Execution(id="e1")
    cstore.commit(exe, **body(0), epoch=5)
    before = view(cstore)
    writer = current(cstore)
    version = writer.version
    with pytest.raises(harel_store.StaleWriter) as info:
        if method == "commit":
            cstore.commit(writer, **body(1), commit_id="k1", epoch=4)
        else:
            cstore.save(writer, epoch=4)
    err = info.value
    assert (err.execution_id, err.epoch, err.current) == ("e1", 4, 5)
    assert all(part in str(err) for part in ("e1", "4", "5"))
    assert writer.version == version
    assert view(cstore) == before


def test_higher_epochs_claim_equal_ones_continue_none_checks_nothing(cstore: Any) -> None:
    exe = Execution(id="e1")
    cstore.save(exe, epoch=0)  # the first write claims at 0
    cstore.commit(current(cstore), [("t", "a")], epoch=0)  # equal: continues
    cstore.commit(current(cstore), [("t", "b")], epoch=2)  # higher: claims
    with pytest.raises(harel_store.StaleWriter) as info:
        cstore.save(current(cstore), epoch=1)
    assert (info.value.epoch, info.value.current) == (1, 2)
    cstore.save(current(cstore), epoch=2)
    # None checks nothing and changes nothing.
    cstore.commit(current(cstore), [("t", "c")])
    cstore.commit(current(cstore), [("t", "d")], epoch=None)
    cstore.save(current(cstore))
    cstore.save(current(cstore), epoch=None)
    with pytest.raises(harel_store.StaleWriter) as info:
        cstore.commit(current(cstore), [("t", "e")], epoch=0)
    assert (info.value.epoch, info.value.current) == (0, 2)
    # A save claims as a commit does.
    cstore.save(current(cstore), epoch=10)
    with pytest.raises(harel_store.StaleWriter) as info:
        cstore.commit(current(cstore), [("t", "f")], epoch=9)
    assert (info.value.epoch, info.value.current) == (9, 10)
    assert version_of(cstore, "e1") == 9
    assert [entry.event for entry in cstore.pending_outbox()] == ["a", "b", "c", "d"]


def test_epochs_are_per_execution(cstore: Any) -> None:
    cstore.commit(Execution(id="e1"), [], epoch=5)
    cstore.commit(Execution(id="e2"), [], epoch=1)
    cstore.save(current(cstore, "e2"), epoch=1)
    with pytest.raises(harel_store.StaleWriter) as info:
        cstore.save(current(cstore, "e2"), epoch=0)
    assert (info.value.execution_id, info.value.current) == ("e2", 1)


def test_forget_drops_the_epoch(cstore: Any) -> None:
    cstore.commit(Execution(id="e1"), [], epoch=5)
    cstore.forget("e1")
    again = Execution(id="e1")
    cstore.commit(again, [], epoch=1)
    assert again.version == 1
    with pytest.raises(harel_store.StaleWriter) as info:
        cstore.commit(current(cstore), [], epoch=0)
    assert info.value.current == 1


# --- claims ----------------------------------------------------------------------------


@fifos
def test_claims_come_oldest_first_within_the_limit(cstore: Any, fifo: str) -> None:
    f = Fifo(cstore, fifo)
    fill(cstore, fifo, 2, "e1")
    fill(cstore, fifo, 2, "e2")
    fill(cstore, fifo, 1, "e1")
    pending = f.pending()
    assert seqs(pending) == sorted(seqs(pending)) and len(pending) == 5
    assert f.claim(0) == []
    first = f.claim(2)
    assert first == pending[:2]
    assert all(type(entry) is f.record for entry in first)
    assert f.claim(limit=2, lease=LONG) == pending[2:4]
    assert f.claim() == pending[4:]
    assert f.claim() == []
    assert f.pending() == pending, "pending lists leased entries too"


@fifos
def test_the_default_limit_is_100(cstore: Any, fifo: str) -> None:
    f = Fifo(cstore, fifo)
    fill(cstore, fifo, 150)
    pending = f.pending()
    assert f.claim() == pending[:100]
    assert f.claim() == pending[100:]


@fifos
def test_a_lease_that_ran_out_is_claimable_again_oldest_first(cstore: Any, fifo: str) -> None:
    f = Fifo(cstore, fifo)
    fill(cstore, fifo, 3)
    p = f.pending()
    assert f.claim(1, lease=LONG) == p[:1]
    assert f.claim(1, lease=SHORT) == p[1:2]
    time.sleep(WAIT)
    fill(cstore, fifo, 1)
    # The expired entry comes back in its seq place; the one leased for LONG does not.
    assert f.claim(lease=LONG) == [p[1], p[2], f.pending()[3]]
    assert f.claim() == []


@fifos
def test_an_ack_ends_the_lease(cstore: Any, fifo: str) -> None:
    f = Fifo(cstore, fifo)
    fill(cstore, fifo, 3)
    p = f.pending()
    assert f.claim(2, lease=SHORT) == p[:2]
    f.ack(p[0].seq)
    time.sleep(WAIT)
    assert f.claim(lease=LONG) == p[1:]
    f.ack(p[2].seq)  # an ack of an entry under a live lease
    assert f.pending() == [p[1]]
    assert f.claim() == []
    fill(cstore, fifo, 1)  # a new entry is claimable at once
    assert f.claim() == f.pending()[1:]


def test_claim_due_timers_oldest_first_within_the_limit(cstore: Any) -> None:
    arm(cstore, "e1", schedule("a", 3.0), schedule("b", 1.0), schedule("late", 9.0))
    arm(cstore, "e2", schedule("a", 1.0), schedule("b", 2))
    assert cstore.claim_due_timers(0.5) == []
    assert cstore.claim_due_timers(5.0, 0) == []
    due = [("e1", "b", 1.0), ("e2", "a", 1.0), ("e2", "b", 2.0), ("e1", "a", 3.0)]
    first = cstore.claim_due_timers(5.0, 3)
    assert first == due[:3]
    assert all(type(at) is float for _, _, at in first)
    assert cstore.claim_due_timers(5.0, limit=3, lease=LONG) == due[3:]
    assert cstore.claim_due_timers(5.0) == []
    # A timer not due at a claim was not leased by it.
    assert cstore.claim_due_timers(now=100.0) == [("e1", "late", 9.0)]
    assert cstore.claim_due_timers(100.0) == []
    assert cstore.due_timers(100.0) == [*due[:3], due[3], ("e1", "late", 9.0)], (
        "due_timers lists leased timers too"
    )


def test_the_default_timer_limit_is_100(cstore: Any) -> None:
    arm(cstore, "e1", *(schedule(f"p{i:03}", float(i)) for i in range(150)))
    due = cstore.due_timers(1000.0)
    assert cstore.claim_due_timers(1000.0) == due[:100]
    assert cstore.claim_due_timers(1000.0) == due[100:]


def test_a_timer_lease_that_ran_out_is_claimable_again(cstore: Any) -> None:
    arm(cstore, "e1", schedule("p", 1.0), schedule("q", 2.0), schedule("r", 3.0))
    assert cstore.claim_due_timers(5.0, 1, lease=LONG) == [("e1", "p", 1.0)]
    assert cstore.claim_due_timers(5.0, 1, lease=SHORT) == [("e1", "q", 2.0)]
    time.sleep(WAIT)
    assert cstore.claim_due_timers(5.0) == [("e1", "q", 2.0), ("e1", "r", 3.0)]
    assert cstore.claim_due_timers(5.0) == []


def test_delete_timer_ends_the_lease(cstore: Any) -> None:
    arm(cstore, "e1", schedule("p", 1.0), schedule("q", 2.0))
    assert cstore.claim_due_timers(5.0, lease=SHORT) == [("e1", "p", 1.0), ("e1", "q", 2.0)]
    cstore.delete_timer("e1", "p", 1.0)
    cstore.delete_timer("e1", "q", 7.0)  # not the armed time: a no-op, the lease stays
    time.sleep(WAIT)
    assert cstore.claim_due_timers(5.0, lease=LONG) == [("e1", "q", 2.0)]
    cstore.delete_timer("e1", "q", 8.0)
    assert cstore.claim_due_timers(5.0) == []
    cstore.delete_timer("e1", "q", 2.0)
    assert cstore.due_timers(math.inf) == []
    arm(cstore, "e1", schedule("q", 2.0))  # armed again after the delete: a new timer
    assert cstore.claim_due_timers(5.0) == [("e1", "q", 2.0)]


@pytest.mark.parametrize(
    "fire_at",
    [True, False, "1.0", None, decimal.Decimal(1), 1j, [1.0]],
    ids=["True", "False", "str", "None", "Decimal", "complex", "list"],
)
def test_delete_timer_refuses_a_fire_at_that_is_not_a_real_number(
    cstore: Any, fire_at: Any
) -> None:
    """One rule in every store (issue 32, item 9): ``True`` is no 1.0, nor ``False`` 0.0,
    and a str or ``None`` is refused, not ignored."""
    arm(cstore, "e1", schedule("p", 1.0), schedule("q", 0.0))
    with pytest.raises(TypeError, match="^fire_at must be a real number of seconds, got "):
        cstore.delete_timer("e1", "p", fire_at)
    with pytest.raises(TypeError, match="^fire_at must be a real number of seconds, got "):
        cstore.delete_timer("e1", "q", fire_at)
    assert cstore.due_timers(math.inf) == [("e1", "q", 0.0), ("e1", "p", 1.0)]


@pytest.mark.parametrize(
    ("fire_at", "armed"),
    [(1, 1.0), (Fraction(1), 1.0), (Fraction(1, 3), 1 / 3), (2**80, float(2**80))],
    ids=["int", "Fraction", "Fraction-third", "big-int"],
)
def test_delete_timer_takes_any_real_number_as_the_float_timers_are_armed_at(
    cstore: Any, fire_at: Any, armed: float
) -> None:
    arm(cstore, "e1", schedule("p", armed), schedule("q", 2.5))
    cstore.delete_timer("e1", "p", fire_at)
    assert cstore.due_timers(math.inf) == [("e1", "q", 2.5)]


@pytest.mark.parametrize("fire_at", [1.0, 2.0, 0.5], ids=["same-time", "later", "earlier"])
def test_rearming_gives_a_fresh_unleased_timer(cstore: Any, fire_at: float) -> None:
    arm(cstore, "e1", schedule("p", 1.0), schedule("q", 1.5))
    assert cstore.claim_due_timers(5.0, lease=LONG) == [("e1", "p", 1.0), ("e1", "q", 1.5)]
    arm(cstore, "e1", schedule("p", fire_at))
    assert cstore.claim_due_timers(5.0) == [("e1", "p", fire_at)]
    assert cstore.claim_due_timers(5.0) == []
    # Cancelled while leased, then armed again: fresh too.
    arm(cstore, "e1", TimerOp("cancel", "q"))
    assert cstore.claim_due_timers(5.0) == []
    assert cstore.due_timers(5.0) == [("e1", "p", fire_at)]
    arm(cstore, "e1", schedule("q", 1.5))
    assert cstore.claim_due_timers(5.0) == [("e1", "q", 1.5)]


def test_two_store_objects_never_share_a_live_lease(make_store: MakeStore) -> None:
    first = make_store()
    # Two store objects on one database; a memory store is its own only database.
    second = make_store() if first.durable else first
    fill(first, "outbox", 6)
    fill(first, "spawns", 6)
    arm(first, "e1", *(schedule(f"p{i}", float(i)) for i in range(6)))
    for claim, key in (
        ("claim_outbox", seqs),
        ("claim_spawns", seqs),
        ("claim_due_timers", lambda timers: [path for _, path, _ in timers]),
    ):
        args = (10.0,) if claim == "claim_due_timers" else ()
        a = key(getattr(first, claim)(*args, 2, lease=LONG))
        b = key(getattr(second, claim)(*args, 3, lease=LONG))
        c = key(getattr(first, claim)(*args, lease=LONG))
        assert len(a) == 2 and len(b) == 3 and len(c) == 1, claim
        assert len(set(a) | set(b) | set(c)) == 6, f"{claim}: an item was claimed twice"
        assert a + b + c == sorted(a + b + c), f"{claim}: not oldest first"
        assert getattr(second, claim)(*args) == [] and getattr(first, claim)(*args) == []


# --- bad arguments ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1, b"k1", ["k1"], ("k", 1), 1.5], ids=repr)
def test_a_bad_commit_id_is_refused_with_nothing_written(cstore: Any, bad: Any) -> None:
    exe = Execution(id="e1")
    cstore.commit(exe, **body(0), commit_id="k1")
    before = view(cstore)
    for writer in (current(cstore), Execution(id="e2")):
        version = writer.version
        with pytest.raises(TypeError):
            cstore.commit(writer, **body(1), commit_id=bad)
        assert writer.version == version
        assert view(cstore) == before


EPOCHS = [(True, TypeError), (False, TypeError), (1.0, TypeError), ("1", TypeError)]
EPOCHS += [(-1, ValueError)]


@pytest.mark.parametrize("method", ["commit", "save"])
@pytest.mark.parametrize(("bad", "error"), EPOCHS, ids=repr)
def test_a_bad_epoch_is_refused_with_nothing_written(
    cstore: Any, method: str, bad: Any, error: type[Exception]
) -> None:
    cstore.commit(Execution(id="e1"), **body(0))
    before = view(cstore)
    for writer in (current(cstore), Execution(id="e2")):
        version = writer.version
        with pytest.raises(error):
            if method == "commit":
                cstore.commit(writer, **body(1), commit_id="k1", epoch=bad)
            else:
                cstore.save(writer, epoch=bad)
        assert writer.version == version
        assert view(cstore) == before
    # No epoch was recorded, and neither was the commit id.
    cstore.commit(current(cstore), **body(2), commit_id="k1", epoch=0)
    cstore.commit(Execution(id="e2"), [], epoch=0)


CLAIMS = {
    "claim_outbox": (),
    "claim_spawns": (),
    "claim_due_timers": (10.0,),
}
BAD_CLAIM_ARGS = {
    "limit=-1": ({"limit": -1}, ValueError),
    "limit=True": ({"limit": True}, TypeError),
    "limit=2.0": ({"limit": 2.0}, TypeError),
    "limit='2'": ({"limit": "2"}, TypeError),
    "lease=-1": ({"lease": -1.0}, ValueError),
    "lease=-tiny": ({"lease": -1e-9}, ValueError),
    "lease=nan": ({"lease": math.nan}, ValueError),
    "lease='1'": ({"lease": "1"}, TypeError),
    "lease=None": ({"lease": None}, TypeError),
    "lease=True": ({"lease": True}, TypeError),
}


BAD_NOWS = [(math.nan, ValueError), ("5", TypeError), (None, TypeError), (True, TypeError)]


def filled(store: Any) -> None:
    fill(store, "outbox", 3)
    fill(store, "spawns", 3)
    arm(store, "e1", schedule("p", 1.0), schedule("q", 2.0))


@pytest.mark.parametrize("claim", list(CLAIMS))
@pytest.mark.parametrize("bad", list(BAD_CLAIM_ARGS))
def test_bad_claim_arguments_are_refused_with_nothing_leased(
    cstore: Any, claim: str, bad: str
) -> None:
    filled(cstore)
    before = view(cstore)
    kwargs, error = BAD_CLAIM_ARGS[bad]
    with pytest.raises(error):
        getattr(cstore, claim)(*CLAIMS[claim], **kwargs)
    assert view(cstore) == before
    assert len(getattr(cstore, claim)(*CLAIMS[claim])) in (2, 3), "the refused claim leased"


@pytest.mark.parametrize(("now", "error"), BAD_NOWS, ids=repr)
def test_a_bad_now_is_refused_with_nothing_leased(
    cstore: Any, now: Any, error: type[Exception]
) -> None:
    filled(cstore)
    before = view(cstore)
    with pytest.raises(error):
        cstore.claim_due_timers(now)
    assert view(cstore) == before
    assert cstore.claim_due_timers(10.0) == [("e1", "p", 1.0), ("e1", "q", 2.0)]


@pytest.mark.parametrize(("now", "error"), BAD_NOWS, ids=repr)
def test_a_bad_now_is_refused_by_due_timers_as_by_the_claim(
    cstore: Any, now: Any, error: type[Exception]
) -> None:
    filled(cstore)
    with pytest.raises(error, match="now"):
        cstore.due_timers(now)
    assert cstore.due_timers(10.0) == [("e1", "p", 1.0), ("e1", "q", 2.0)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "5", None])
@pytest.mark.parametrize("claim", list(CLAIMS))
@pytest.mark.parametrize(
    # PostgreSQL times its leases on the database's clock: it takes no clock.
    "make_store",
    [kind for kind in conftest.STORE_KIND_PARAMS if not kind.id.startswith("postgres")],
    indirect=True,
)
def test_a_clock_without_a_finite_time_is_refused_with_nothing_leased(
    make_store: Callable[..., Any], claim: str, bad: Any
) -> None:
    """A lease timed from a NaN would never run out (one from an infinity, never or at
    once): the store refuses the reading, and the items stay claimable."""
    readings: list[Any] = []
    store = make_store(clock=lambda: readings.pop() if readings else 100.0)
    filled(store)
    readings.append(bad)  # the next reading, the claim's (a memory commit reads it too)
    before = view(store)
    with pytest.raises(ValueError if isinstance(bad, float) else TypeError, match="clock"):
        getattr(store, claim)(*CLAIMS[claim])
    assert view(store) == before
    assert len(getattr(store, claim)(*CLAIMS[claim])) in (2, 3), "the refused claim leased"


def test_fire_at_is_any_real_number_kept_as_a_float(cstore: Any) -> None:
    exe = Execution(id="e1")
    cstore.commit(exe, [], timers=[schedule("p", Fraction(3, 2)), schedule("q", 2)])
    assert cstore.due_timers(2) == [("e1", "p", 1.5), ("e1", "q", 2.0)]
    assert all(type(at) is float for _, _, at in cstore.due_timers(2))
    before = view(cstore)
    for bad, error, says in [
        (10**400, ValueError, "an int beyond a float's range"),
        (decimal.Decimal(1), TypeError, "real number"),
        (True, TypeError, "real number"),
        (math.inf, ValueError, "finite"),
    ]:
        with pytest.raises(error, match=says):
            cstore.commit(exe, [], timers=[schedule("p", bad)])
        assert exe.version == 1 and view(cstore) == before


class ReprRaises:
    """A value whose ``repr`` raises: a message that names it must still be raised."""

    def __repr__(self) -> str:
        raise RuntimeError("ReprRaises.__repr__")


class FloatReprRaises(float):
    """A real number whose ``repr`` raises."""

    def __repr__(self) -> str:
        raise RuntimeError("FloatReprRaises.__repr__")


NAMED_BY_TYPE = r"<(Float)?ReprRaises instance at 0x[0-9a-f]+>"


def test_a_refusal_names_a_value_whose_repr_raises_by_its_type(cstore: Any) -> None:
    """Issue 32, item 10: the refusal is raised, not the error of the value's repr."""
    filled(cstore)
    before = view(cstore)
    refusals: list[tuple[Callable[[], Any], str]] = [
        (
            lambda: cstore.commit(current(cstore), [], timers=[TimerOp(ReprRaises(), "p", 1.0)]),
            r"timers\[0\]\.action must be 'schedule' or 'cancel', got ",
        ),
        (
            lambda: cstore.claim_outbox(lease=FloatReprRaises(-1.0)),
            "lease must be a finite number of seconds, at least 0, got ",
        ),
    ]
    if hasattr(cstore, "wait_for_work"):  # the durable stores'
        refusals.append(
            (
                lambda: cstore.wait_for_work(FloatReprRaises(-1.0)),
                "timeout must be a number of seconds, at least 0, got ",
            )
        )
    for call, says in refusals:
        with pytest.raises(ValueError, match=f"^{says}{NAMED_BY_TYPE}$"):
            call()
        assert view(cstore) == before


# --- capabilities and the one line ----------------------------------------------------


def test_memory_store_classes_declare_their_capabilities(impl: Any) -> None:
    for cls in (impl.DictStore, impl.AsyncDictStore, harel_store.DictStore):
        assert cls.preserves_identity is True, cls
        assert cls.durable is False, cls
    assert harel_store.AsyncDictStore.preserves_identity is True
    assert harel_store.AsyncDictStore.durable is False


def test_capabilities_say_what_load_returns(cstore: Any) -> None:
    assert type(cstore.preserves_identity) is bool and type(cstore.durable) is bool
    exe = Execution(id="e1", definition_id="order", active_path=("a", "b"), context={"n": [1, 2]})
    cstore.commit(exe, [])
    first, second = cstore.load("e1"), cstore.load("e1")
    if cstore.preserves_identity:
        assert first is exe and second is exe
    else:
        assert first is not exe and first is not second
        assert first == exe == second and first.version == exe.version == 1
        assert type(first) is Execution and first.active_path == ("a", "b")
    if cstore.durable:
        assert not cstore.preserves_identity


def test_sync_stores_are_context_managers(impl: Any) -> None:
    store = impl.DictStore()
    with store as entered:
        assert entered is store
        store.commit(Execution(id="e1"), [])
    store.close()
    store.close()
    with pytest.raises(KeyError), impl.DictStore():
        raise KeyError("an error in the block propagates")


def test_async_stores_are_async_context_managers(impl: Any) -> None:
    async def main() -> None:
        store = impl.AsyncDictStore()
        async with store as entered:
            assert entered is store
            await store.commit(Execution(id="e1"), [])
        await store.close()
        await store.close()
        with pytest.raises(KeyError):
            async with impl.AsyncDictStore():
                raise KeyError("an error in the block propagates")

    asyncio.run(main())


def test_close_is_idempotent(make_store: MakeStore) -> None:
    store = make_store()
    store.commit(Execution(id="e1"), [])
    store.close()
    store.close()
    if store.durable:
        with pytest.raises(ValueError):  # like a closed file
            store.load("e1")


def test_open_store_memory() -> None:
    store = harel_store.open_store("memory:")
    assert type(store) is harel_store.DictStore
    assert store.trace_max == harel_store.DEFAULT_TRACE_MAX
    with harel_store.open_store("memory:", trace_max=3) as small:
        assert type(small) is harel_store.DictStore and small.trace_max == 3
        exe = Execution(id="e1")
        small.commit(exe, [], trace={"n": 0})
        assert small.load("e1") is exe


def test_open_async_store_memory() -> None:
    async def main() -> None:
        async with harel_store.open_async_store("memory:", trace_max=None) as store:
            assert type(store) is harel_store.AsyncDictStore
            assert store.trace_max is None
            exe = Execution(id="e1")
            await store.commit(exe, [("t", "ev")], commit_id="k1", epoch=1)
            assert await store.load("e1") is exe
            assert [e.event for e in await store.claim_outbox()] == ["ev"]

    asyncio.run(main())


@pytest.mark.parametrize(
    "url", ["mysql://host/db", "nosuch:", "", "memory", "file:///tmp/x.db", "redis://x"]
)
@pytest.mark.parametrize("opener", ["open_store", "open_async_store"])
def test_unknown_schemes_are_refused_naming_the_known_ones(opener: str, url: str) -> None:
    with pytest.raises(ValueError) as info:
        getattr(harel_store, opener)(url)
    for scheme in ("memory:", "sqlite:", "postgresql:"):
        assert scheme in str(info.value)


@pytest.mark.parametrize("opener", ["open_store", "open_async_store"])
def test_a_sqlite_url_with_a_query_string_is_refused_creating_nothing(
    opener: str, tmp_path: Path
) -> None:
    """SQLAlchemy reads ``?mode=ro`` as an option: as part of the file name it would
    open another, writable database."""
    with pytest.raises(ValueError, match="query string"):
        getattr(harel_store, opener)(f"sqlite:///{tmp_path}/x.db?mode=ro")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("opener", ["open_store", "open_async_store"])
def test_unknown_keywords_are_type_errors(opener: str) -> None:
    with pytest.raises(TypeError):
        getattr(harel_store, opener)("memory:", bogus=1)


@pytest.mark.parametrize("url", [None, b"memory:", 1, Path("memory:")], ids=repr)
@pytest.mark.parametrize("opener", ["open_store", "open_async_store"])
def test_a_url_that_is_not_a_str_is_a_type_error(opener: str, url: Any) -> None:
    with pytest.raises(TypeError):
        getattr(harel_store, opener)(url)


def test_importing_harel_store_does_not_import_psycopg() -> None:
    code = """
import importlib.util, sys
import harel_store
harel_store.open_store("memory:").close()
if importlib.util.find_spec("harel_store.sqlite") is not None:
    import harel_store.sqlite
loaded = sorted(
    name
    for name, module in sys.modules.items()
    if module is not None and name.split(".")[0] in ("psycopg", "psycopg_pool")
)
assert not loaded, loaded
"""
    blocked = "import sys; sys.modules['psycopg'] = sys.modules['psycopg_pool'] = None\n"
    root = str(Path(harel_store.__file__).resolve().parent.parent)
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    for prelude in ("", blocked):  # and without psycopg installed at all
        done = subprocess.run(
            [sys.executable, "-c", prelude + code],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr


# --- the README example ---------------------------------------------------------------


def test_readme_two_relays_share_an_outbox() -> None:
    # README: "Two relays, one outbox"
    import time

    from harel_store import Execution, open_store

    delivered = []

    def relay(store, name, lease=30.0, crash=False):
        """One pass of a relay: claim a batch, deliver each entry, ack it."""
        batch = store.claim_outbox(limit=2, lease=lease)
        for entry in batch:
            if crash:
                return  # dies holding its lease: the entries come back when it runs out
            delivered.append((name, entry.seq))  # send entry.event to entry.target_id
            store.ack_outbox(entry.seq)

    with open_store("memory:") as store:
        order = Execution(id="order-1", definition_id="order")
        store.commit(order, [("billing", {"charge": n}) for n in range(5)], commit_id="start")
        relay(store, "A", lease=0.5, crash=True)  # A claims seqs 1 and 2, then dies
        relay(store, "B")  # B skips them, leased to A: it delivers 3 and 4
        relay(store, "A")  # A, restarted, delivers 5
        relay(store, "B")  # nothing left to claim
        time.sleep(0.6)  # A's first lease runs out
        relay(store, "B")  # B delivers 1 and 2: at least once
        assert delivered == [("B", 3), ("B", 4), ("A", 5), ("B", 1), ("B", 2)]
        assert store.pending_outbox() == []
