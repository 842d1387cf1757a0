"""Issue 15: whatever Python code does to a store, the compiled and the pure store never
crash, leak or half-write, and they agree.

1. Crash reproducers run in a child process (``python -X dev``, the implementation
   imported directly), so a segfault fails a test instead of killing pytest: a
   ``TimerOp`` of the wrong length (``tuple.__new__(TimerOp, items)``) in ``commit``, and
   a store whose ``__init__`` never ran (``DictStore.__new__(DictStore)``, a subclass that
   skips ``super().__init__()``), which must work as a fresh store.
2. Copying and pickling are refused with ``TypeError``, the store's and those of the
   compiled module's private classes, and a crafted pickle state cannot reach a store.
3. A record whose item may become tracked by the collector stays tracked, so a cycle made
   through it later (``entry.event["self"] = entry``) is collected.
4. A write from inside a write of the same store (from a caller's ``__hash__``, ``__eq__``,
   mapping method, iterator, property or number) is refused with ``RuntimeError``, and
   the store ends as if it had never been tried.
5. All or nothing in every mutating method: a scan over every call number N at which the
   caller's code (hash, eq, properties, mapping methods, iterators, number conversions)
   raises. Each raise leaves the whole observable state and ``exe.version`` as they were;
   a retry then ends exactly like a store that never saw the failure.
6. A number whose ``__float__``/``__int__`` returns a strict subclass warns alike in both.
7. ``id`` and ``version`` are read and written as attribute access would, even where the
   compiled store reaches an exact ``Execution``'s slots directly: a property, a
   ``__getattribute__`` or ``__setattr__`` put on the class (before a commit or during
   one), or a deleted slot, behaves the same in both stores.
8. What a second hostile pass found: a copy whose commit bodies or counters are not what
   a store makes (the compiled store crashed on a replay, or wrapped its seqs), a
   ``RecursionError`` near the limit (half a commit written), ``due_timers`` read by a
   finalizer inside the store's own call (timers listed and claimed twice), ``save``
   with an epoch (the id hashed more often in one store), and ``harel_store._checks``
   or the deque replaced at run time (a crash of the compiled store).
"""

from __future__ import annotations

import copy
import functools
import gc
import importlib
import inspect
import json
import math
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType, SimpleNamespace
from typing import Any

import pytest
from _helpers import snapshot
from conftest import load_impl

import harel_store
from harel_store import Execution, TimerOp

TESTS = Path(__file__).resolve().parent
PACKAGE_ROOT = Path(harel_store.__file__).resolve().parent.parent
MODULE_SUFFIX = {"pure": "py", "compiled": "c"}


def schedule(path: Any, fire_at: Any) -> TimerOp:
    return TimerOp("schedule", path, fire_at)


def other_impl(impl: Any) -> Any:
    return load_impl("compiled" if impl.name == "pure" else "pure")


# --- 1. crash reproducers, run in a child process ----------------------------------------
#
# The child_* functions below are shipped to the child by source (``inspect.getsource``),
# behind CHILD_PRELUDE: they may use only what the prelude imports. The child runs every
# case it is given in turn and prints one JSON line when a case starts and one when it
# ends; when it dies, the parent knows which case killed it and starts a new child for
# the cases after it.

CHILD_PRELUDE = """\
from __future__ import annotations

import copy
import gc
import importlib
import json
import math
import pickle
import sys

from _helpers import snapshot

from harel_store import Execution, TimerOp
"""


def child_commit_op(mod: Any, bad: Any, position: str) -> dict[str, Any]:
    """Commit ``bad`` among good timer ops, at ``position``; what happened."""
    good = [TimerOp("schedule", "t1", 1.0), TimerOp("cancel", "q")]
    if position == "lone":
        timers: Any = [bad]
        index = 0
    elif position == "first":
        timers, index = [bad, *good], 0
    elif position == "last":
        timers, index = (*good, bad), 2
    elif position == "iter":
        timers, index = iter([*good, bad]), 2
    else:  # "slow": after an op whose path is not a str, which sends every op the slow way
        timers, index = [TimerOp("schedule", ("t", 2), 1.0), bad], 1
    store = mod.DictStore()
    exe = Execution(id="e")
    store.commit(exe, [(None, "x")], "ev", [TimerOp("schedule", "q", 5.0)], [("k", "r", {})], {})
    ids, events = ["e"], ["ev", "ev2"]
    before = snapshot(store, ids, events)
    try:
        store.commit(exe, [(None, "y")], "ev2", timers, [("k2", "r", {})], {"s": 1})
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        outcome = [type(exc).__name__, str(exc)]
    else:
        outcome = ["accepted", ""]
    unchanged = snapshot(store, ids, events) == before
    return {"outcome": outcome, "index": index, "unchanged": unchanged, "version": exe.version}


def child_timerop(mod: Any, length: str, action: str, position: str) -> dict[str, Any]:
    """An exact ``TimerOp`` of ``length`` items, built without ``TimerOp.__new__``."""
    items = ("cancel", "p", None, "extra") if action == "cancel" else ("schedule", "p", 3.0, "x")
    return child_commit_op(mod, tuple.__new__(TimerOp, items[: int(length)]), position)


def child_timerop_subclass(mod: Any, length: str, action: str) -> dict[str, Any]:
    """The same, of a ``TimerOp`` subclass (its fields are tuple getters)."""

    class SubOp(TimerOp):
        __slots__ = ()

    items = ("cancel", "p", None, "extra") if action == "cancel" else ("schedule", "p", 3.0, "x")
    return child_commit_op(mod, tuple.__new__(SubOp, items[: int(length)]), "lone")


def child_uninit(mod: Any, maker: str, method: str) -> list[str]:
    """Run ``method`` (and what shows its effect) on a store made by ``maker``: "fresh"
    (``DictStore()``), "new" (``DictStore.__new__(DictStore)``) or "subclass" (whose
    ``__init__`` skips ``super().__init__()``). Each result as its repr."""
    cls = mod.DictStore

    class Skipper(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass  # no super().__init__()

    store = cls() if maker == "fresh" else cls.__new__(cls) if maker == "new" else Skipper()

    def full(s: Any) -> None:
        s.commit(
            Execution(id="e"),
            [(None, "x"), ("f", "y")],
            "ev",
            [TimerOp("schedule", "p", 1.0), TimerOp("schedule", "q", 2.0)],
            [("k", "r", {"n": 1}), ("k2", "r", {})],
            {"s": 1},
        )

    views = [
        lambda s: s.stats(),
        lambda s: s.pending_outbox(),
        lambda s: s.pending_spawns(),
        lambda s: s.due_timers(math.inf),
        lambda s: s.read_trace("e"),
        lambda s: s.is_processed("e", "ev"),
        lambda s: s.load("e"),
        lambda s: s.trace_max,
    ]
    steps = {
        "trace_max": [lambda s: s.trace_max],
        "stats": [lambda s: s.stats()],
        "load": [lambda s: s.load("e")],
        "is_processed": [lambda s: s.is_processed("e", "ev")],
        "read_trace": [lambda s: s.read_trace("e")],
        "pending_outbox": [lambda s: s.pending_outbox()],
        "pending_spawns": [lambda s: s.pending_spawns()],
        "due_timers": [lambda s: s.due_timers(math.inf)],
        "ack_outbox": [lambda s: s.ack_outbox(1), *views],
        "ack_spawn": [lambda s: s.ack_spawn(1), *views],
        "delete_timer": [lambda s: s.delete_timer("e", "p", 1.0), *views],
        "forget": [lambda s: s.forget("e"), *views],
        "append_trace": [
            lambda s: [s.append_trace("e", {"n": n}) for n in range(205)],
            lambda s: len(s.read_trace("e")),
            lambda s: s.read_trace("e")[0],
            *views,
        ],
        "set_trace_max": [
            lambda s: setattr(s, "trace_max", 2),
            lambda s: [s.append_trace("e", {"n": n}) for n in range(3)],
            *views,
        ],
        "save": [lambda s: s.save(Execution(id="e")), *views],
        "commit": [
            full,
            *views,
            lambda s: s.ack_outbox(2),
            lambda s: s.ack_spawn(1),
            lambda s: s.delete_timer("e", "q", 2.0),
            lambda s: s.forget("e"),
            *views,
        ],
        "claim_outbox": [
            full,
            lambda s: s.claim_outbox(),
            lambda s: s.claim_outbox(),
            lambda s: s.ack_outbox(1),
            *views,
        ],
        "claim_spawns": [
            full,
            lambda s: s.claim_spawns(),
            lambda s: s.claim_spawns(),
            lambda s: s.ack_spawn(1),
            *views,
        ],
        "claim_due_timers": [
            full,
            lambda s: s.claim_due_timers(math.inf),
            lambda s: s.claim_due_timers(math.inf),
            lambda s: s.delete_timer("e", "p", 1.0),
            *views,
        ],
        "close": [lambda s: s.close(), lambda s: s.stats()],
    }
    out = []
    for step in steps[method]:
        try:
            out.append(repr(step(store)))
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            out.append(f"{type(exc).__name__}: {exc}")
    return out


def child_pickle(mod: Any, how: str) -> dict[str, Any]:
    """Copy or pickle a filled store (cancelled, deleted and swept timers, a full trace
    ring, acked entries); if that is accepted, use both stores as a caller would."""
    store = mod.DictStore(trace_max=2)
    exe = Execution(id="e")
    store.commit(
        exe,
        [(None, "x"), (None, "y")],
        "ev",
        [TimerOp("schedule", "a", 1.0), TimerOp("schedule", "b", 2.0), schedule_c()],
        [("k", "r", {}), ("k2", "r", {})],
        {"s": 0},
    )
    store.due_timers(0.5)
    store.commit(exe, [], None, [TimerOp("cancel", "a")], trace={"s": 1})
    store.delete_timer("e", "b", 2.0)
    store.append_trace("e", {"s": 2})
    store.ack_outbox(1)
    if how == "crafted":
        return child_crafted(mod, store)
    try:
        if how == "copy":
            clone = copy.copy(store)
        elif how == "deepcopy":
            clone = copy.deepcopy(store)
        else:
            clone = pickle.loads(pickle.dumps(store, int(how)))
    except TypeError as exc:
        return {"refused": True, "message": str(exc)}
    used = {}
    for name, s in (("clone", clone), ("store", store)):
        results = []
        for step in (
            lambda s: s.due_timers(math.inf),
            lambda s: [s.append_trace("e", {"n": n}) for n in range(5)],
            lambda s: s.read_trace("e"),
            lambda s: s.commit(s.load("e"), [(None, "z")], None, [TimerOp("cancel", "c")]),
            lambda s: s.due_timers(math.inf),
            lambda s: [s.ack_outbox(e.seq) for e in s.pending_outbox()],
            lambda s: s.stats(),
        ):
            try:
                results.append(repr(step(s)))
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                results.append(f"{type(exc).__name__}: {exc}")
        used[name] = results
    return {"refused": False, "used": used}


def child_resize(mod: Any, what: str, how: str) -> dict[str, Any]:
    """A finalizer run by a collection that the commit's own allocations set off grows
    or shrinks the list of emits or spawns the commit is reading."""
    store = mod.DictStore()
    items: list[Any]
    if what == "emits":
        items = [(None, {"n": i}) for i in range(4)]
    else:
        items = [(f"c{i}", "r", {"n": i}) for i in range(4)]
    ran: list[bool] = []
    held = len(items)

    class Resizer:
        def __del__(self) -> None:
            ran.append(store.load("e") is None)  # before the commit's first write
            if how == "grow":
                items.extend(items[:1] * 50)
            else:
                del items[1:]

    exe, no_emits = Execution(id="e"), []
    gc.collect()
    resizer = Resizer()
    resizer.cycle = resizer  # type: ignore[attr-defined]  # garbage only a collection frees
    del resizer
    threshold = gc.get_threshold()
    gc.set_threshold(1)
    # From here the first allocation of a tracked object sets off a collection, at once
    # up to CPython 3.11; from 3.12 at the next bytecode boundary, after the compiled
    # commit has returned.
    try:
        if what == "emits":
            store.commit(exe, items)
        else:
            store.commit(exe, no_emits, spawns=items)
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    if ran and ran[0]:
        held = len(items)
    pending = store.pending_outbox() if what == "emits" else store.pending_spawns()
    return {"during": ran[:1], "seqs": [entry[0] for entry in pending], "held": held}


def schedule_c() -> TimerOp:
    return TimerOp("schedule", "c", 3.0)


def child_crafted(mod: Any, store: Any) -> dict[str, Any]:
    """Rebuild ``store`` by hand from its reduction (Cython's ``__pyx_unpickle_*`` form:
    ``(function, (class, checksum, state))``), with a trace ring whose write position
    is far out of bounds, and append to it."""
    try:
        reduced = store.__reduce_ex__(2)
    except TypeError:
        return {"refused": True}
    ring_cls = getattr(mod, "_Ring", None)
    try:
        fn, (cls, checksum, *rest) = reduced[:2]
        state = reduced[2] if len(reduced) > 2 else rest[0]
        try:
            ring = ring_cls.__new__(ring_cls)  # type: ignore[union-attr]
        except TypeError:
            ring = ring_cls.__new__(ring_cls, 2)  # type: ignore[union-attr]
        reduced_ring = ring.__reduce_ex__(2)
        ring_fn, (ring_type, ring_checksum, *_) = reduced_ring[:2]
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        return {"refused": False, "note": f"reduced to {reduced!r}, not crafted: {exc!r}"}
    evil = ring_fn(ring_type, ring_checksum, (10**8, 2, 0, [{}, {}]))
    state = tuple(
        {key: evil for key in part}
        if isinstance(part, dict) and any(isinstance(v, ring_cls) for v in part.values())
        else part
        for part in state
    )
    clone = fn(cls, checksum, state)
    clone.append_trace("e", {"s": "out of bounds"})
    return {"refused": False, "note": "a crafted ring was accepted and written to"}


def child_main() -> None:
    kind = sys.argv[1]
    mod = importlib.import_module(f"harel_store._store_{kind}")
    groups = {
        "timerop": child_timerop,
        "timerop_sub": child_timerop_subclass,
        "uninit": child_uninit,
        "pickle": child_pickle,
        "resize": child_resize,
    }
    for case in sys.argv[2:]:
        print(json.dumps({"start": case}), flush=True)
        group, *args = case.split(":")
        try:
            result = groups[group](mod, *args)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result = {"uncaught": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({"case": case, "result": result}, default=repr), flush=True)


CHILD_CODE = (
    child_commit_op,
    child_timerop,
    child_timerop_subclass,
    child_uninit,
    child_pickle,
    child_resize,
    schedule_c,
    child_crafted,
    child_main,
)


@functools.cache
def child_source() -> str:
    parts = [CHILD_PRELUDE]
    parts += [textwrap.dedent(inspect.getsource(code)) for code in CHILD_CODE]
    return "\n\n".join([*parts, "child_main()\n"])


TIMEROP_POSITIONS = ("lone", "first", "last", "iter", "slow")
TIMEROP_CASES = [
    f"timerop:{n}:{action}:{position}"
    for n in (0, 1, 2, 4)
    for action in (("none",) if n == 0 else ("schedule", "cancel"))
    for position in TIMEROP_POSITIONS
]
TIMEROP_SUB_CASES = [
    f"timerop_sub:{n}:{action}"
    for n in (0, 1, 2, 4)
    for action in (("none",) if n == 0 else ("schedule", "cancel"))
]
UNINIT_METHODS = (
    "trace_max",
    "stats",
    "load",
    "is_processed",
    "read_trace",
    "pending_outbox",
    "pending_spawns",
    "due_timers",
    "ack_outbox",
    "ack_spawn",
    "delete_timer",
    "forget",
    "append_trace",
    "set_trace_max",
    "save",
    "commit",
    "claim_outbox",
    "claim_spawns",
    "claim_due_timers",
    "close",
)
UNINIT_MAKERS = ("new", "subclass")
UNINIT_CASES = [
    f"uninit:{m}:{method}" for m in ("fresh", *UNINIT_MAKERS) for method in UNINIT_METHODS
]
PICKLE_HOWS = ("copy", "deepcopy", *(str(p) for p in range(pickle.HIGHEST_PROTOCOL + 1)), "crafted")
PICKLE_CASES = [f"pickle:{how}" for how in PICKLE_HOWS]
RESIZE_CASES = [
    f"resize:{what}:{how}" for what in ("emits", "spawns") for how in ("grow", "shrink")
]
CHILD_CASES = (*TIMEROP_CASES, *TIMEROP_SUB_CASES, *UNINIT_CASES, *PICKLE_CASES, *RESIZE_CASES)


@functools.cache
def child_results(kind: str) -> dict[str, Any]:
    """Every child case of implementation ``kind`` ("py" or "c"): one child process, and
    one more after each case that killed its child."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(PACKAGE_ROOT)])}
    results: dict[str, Any] = {}
    todo = list(CHILD_CASES)
    while todo:
        command = [sys.executable, "-X", "dev", "-c", child_source(), kind, *todo]
        try:
            proc = subprocess.run(
                command, cwd=TESTS, env=env, capture_output=True, text=True, timeout=120,
                check=False,
            )  # fmt: skip
            stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            stdout, stderr, code = _text(exc.stdout), _text(exc.stderr), "timeout"
        started = None
        ran = []
        for line in stdout.splitlines():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "start" in message:
                started = message["start"]
            elif "case" in message:
                results[message["case"]] = message["result"]
                ran.append(message["case"])
                started = None
        crash = {"crash": code, "stderr": stderr[-3000:]}
        if started is not None:  # died in a case: go on after it
            results[started] = crash
            todo = todo[todo.index(started) + 1 :]
            continue
        if code != 0:  # died at exit, or before the first case
            for case in ran[-1:] or todo:
                results[case] = crash
        for case in todo:
            results.setdefault(case, crash)
        break
    return results


def _text(data: Any) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else str(data)


def child_result(impl: Any, case: str) -> Any:
    result = child_results(MODULE_SUFFIX[impl.name])[case]
    if isinstance(result, dict):
        assert "crash" not in result, (
            f"the child process died in {case}: exit {result['crash']} "
            f"(negative: killed by a signal)\n{result['stderr']}"
        )
        assert "uncaught" not in result, f"{case}: {result['uncaught']}"
    return result


@pytest.mark.parametrize("case", TIMEROP_CASES, ids=[c.replace(":", "-") for c in TIMEROP_CASES])
def test_a_timer_op_of_the_wrong_length_is_refused(impl: Any, case: str) -> None:
    """An exact ``TimerOp`` of 0, 1, 2 or 4 items: a TypeError that names it, nothing
    written, whether it comes alone, first, last, from an iterator or after a slow op."""
    result = child_result(impl, case)
    n = case.split(":")[1]
    expected = (
        f"timers[{result['index']}] must be a TimerOp (action, path, fire_at), "
        f"got a TimerOp of {n} items"
    )
    assert result["outcome"] == ["TypeError", expected]
    assert result["unchanged"], "the refused commit wrote something"
    assert result["version"] == 1, "the refused commit bumped exe.version"


@pytest.mark.parametrize(
    "case", TIMEROP_SUB_CASES, ids=[c.replace(":", "-") for c in TIMEROP_SUB_CASES]
)
def test_a_timer_op_subclass_of_the_wrong_length_is_refused_alike(
    impl: Any, pure_impl: Any, case: str
) -> None:
    result = child_result(impl, case)
    assert result["outcome"][0] == "TypeError", result["outcome"]
    assert result["outcome"][1].startswith("timers[0]"), result["outcome"]
    assert result["unchanged"] and result["version"] == 1
    assert result["outcome"] == child_result(pure_impl, case)["outcome"]


@pytest.mark.parametrize("method", UNINIT_METHODS)
@pytest.mark.parametrize("maker", UNINIT_MAKERS)
def test_a_store_whose_init_never_ran_works_like_a_fresh_one(
    impl: Any, maker: str, method: str
) -> None:
    """``DictStore.__new__(DictStore)`` and a subclass that skips ``super().__init__()``:
    the tables exist from ``__new__``/``__cinit__``, with the default ``trace_max``."""
    fresh = child_result(impl, f"uninit:fresh:{method}")
    missing = [r for r in fresh if r.startswith("AttributeError")]
    assert not missing, f"a fresh store: {missing}"
    assert child_result(impl, f"uninit:{maker}:{method}") == fresh


@pytest.mark.parametrize("how", PICKLE_HOWS)
def test_copying_or_pickling_a_store_is_refused_in_a_child(impl: Any, how: str) -> None:
    """``copy``, ``deepcopy``, a pickle round trip of each protocol, and a store rebuilt by
    hand from its reduction with a crafted ring: refused with TypeError, never a crash."""
    result = child_result(impl, f"pickle:{how}")
    assert result["refused"], result


# --- 2. copying and pickling are refused --------------------------------------------------

COPIERS: dict[str, Callable[[Any], Any]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    **{
        f"pickle-{p}": functools.partial(pickle.dumps, protocol=p)
        for p in range(pickle.HIGHEST_PROTOCOL + 1)
    },
    **{f"reduce_ex-{p}": (lambda obj, p=p: obj.__reduce_ex__(p)) for p in (0, 2, 4)},
}


@pytest.mark.parametrize("filled", [False, True], ids=["empty", "filled"])
@pytest.mark.parametrize("how", COPIERS)
def test_copying_or_pickling_a_store_is_refused(impl: Any, how: str, filled: bool) -> None:
    store = impl.DictStore()
    if filled:
        fill(store, Scenario("commit", "later", frozenset(), ""))
    before = view(store, frozenset())
    with pytest.raises(TypeError):
        COPIERS[how](store)
    assert view(store, frozenset()) == before
    store.commit(store.load("a") or Execution(id="a", definition_id="a"), [(None, "after")])


@pytest.mark.parametrize("how", COPIERS)
def test_copying_an_async_store_makes_no_independent_copy(impl: Any, how: str) -> None:
    """The async face holds a sync store: copying it is refused, or (a shallow copy)
    gives another face of the very same store, never a store that shares its tables."""
    astore = harel_store.AsyncDictStore()
    astore._store = impl.DictStore()
    try:
        clone = COPIERS[how](astore)
    except TypeError:
        return
    assert how == "copy", f"{how} of an async store was accepted: {clone!r}"
    assert clone._store is astore._store


def private_instances(mod: ModuleType) -> dict[str, Any]:
    """An instance of each private class of ``mod``: made without its ``__init__`` if
    it can be, else with an argument or two."""
    out = {}
    for name, cls in sorted(vars(mod).items()):
        if isinstance(cls, type) and cls.__module__ == mod.__name__ and name.startswith("_"):
            for args in ((), (2,), (2, 2)):
                try:
                    out[name] = cls.__new__(cls, *args)
                except TypeError:
                    continue
                break
    return out


@pytest.mark.compiled
@pytest.mark.parametrize("how", COPIERS)
def test_the_compiled_private_classes_refuse_copying_and_pickling(
    compiled_module: ModuleType, how: str
) -> None:
    accepted = []
    for name, obj in private_instances(compiled_module).items():
        try:
            COPIERS[how](obj)
        except TypeError:
            continue
        accepted.append(name)
    assert not accepted, f"{how} accepted by {accepted}"


@pytest.mark.compiled
def test_the_compiled_module_takes_no_pickled_state(compiled_module: ModuleType) -> None:
    """Cython's automatic pickling adds ``__pyx_unpickle_*`` functions, which a crafted
    pickle can call, and a ``__setstate_cython__`` that takes any state (a ring's write
    position included): neither may exist, or take a state."""
    unpicklers = [name for name in vars(compiled_module) if name.startswith("__pyx_unpickle")]
    assert not unpicklers, f"pickle.loads can call {unpicklers}"
    taken = []
    for name, obj in private_instances(compiled_module).items():
        for method in ("__setstate__", "__setstate_cython__"):
            if hasattr(obj, method):
                try:
                    getattr(obj, method)((10**8, 2, 0, [{}, {}]))
                except (TypeError, ValueError):
                    continue
                taken.append(f"{name}.{method}")
    assert not taken, f"a crafted state was taken by {taken}"


# --- 3. no leak through untracked records -------------------------------------------------


@pytest.mark.parametrize("case", RESIZE_CASES, ids=[c.replace(":", "-") for c in RESIZE_CASES])
def test_a_list_resized_by_a_finalizer_mid_commit(impl: Any, pure_impl: Any, case: str) -> None:
    """The compiled commit stages the records of exact lists in tuples of the size it
    counted first; a finalizer that runs inside the commit and resizes the list must
    neither crash it nor lose or invent an entry: the commit stores what the list holds
    once the finalizer has run, as the pure store does. From CPython 3.12 a collection
    waits for a bytecode boundary, so in the compiled store it runs after the commit,
    which then stores the list as it was."""
    result = child_result(impl, case)
    assert result["during"], "the finalizer never ran"
    assert result["seqs"] == list(range(1, result["held"] + 1)), result
    if impl.name == "pure" or sys.version_info < (3, 12):
        assert result["during"] == [True], "the finalizer ran after the commit: nothing tested"
        assert result == child_result(pure_impl, case)


class Box:
    """A weakref-able object: whether it was freed shows whether a cycle was collected."""


TRACKABLE: dict[str, Callable[[], Any]] = {
    "dict": lambda: {"kind": "ship"},
    "empty-dict": dict,
    "list": lambda: ["ship"],
    "set": lambda: {"ship"},
    "object": Box,
    "tuple-of-dict": lambda: ({"kind": "ship"},),
}


@pytest.mark.parametrize("path", ["fast", "slow"])
@pytest.mark.parametrize("item", TRACKABLE)
def test_an_outbox_entry_that_may_hold_a_cycle_is_tracked(impl: Any, item: str, path: str) -> None:
    store = impl.DictStore()
    event = TRACKABLE[item]()
    emits: Any = [(None, event)] if path == "fast" else iter([(None, event)])
    store.commit(Execution(id="e"), emits)
    (entry,) = store.pending_outbox()
    assert entry.event is event
    assert gc.is_tracked(entry), f"an outbox entry holding a {item} is not tracked"


@pytest.mark.parametrize("root_path", ["str", "list"])
@pytest.mark.parametrize("path", ["fast", "slow"])
def test_a_spawn_entry_is_tracked(impl: Any, path: str, root_path: str) -> None:
    """Its context is a dict of its own (untracked while it holds only atoms)."""
    store = impl.DictStore()
    context: Any = {"a": 1} if path == "fast" else MappingProxyType({"a": 1})
    root: Any = "r" if root_path == "str" else ["r"]
    store.commit(Execution(id="e"), [], spawns=[("c", root, context)])
    (entry,) = store.pending_spawns()
    assert gc.is_tracked(entry), "a spawn entry is not tracked"


def test_a_claimed_record_is_tracked(impl: Any) -> None:
    store = impl.DictStore(clock=fixed_clock)
    store.commit(Execution(id="e"), [(None, {"kind": "ship"})], spawns=[("c", "r", {"a": 1})])
    claimed = [*store.claim_outbox(), *store.claim_spawns()]
    assert len(claimed) == 2
    untracked = [record for record in claimed if not gc.is_tracked(record)]
    assert not untracked, f"claimed records not tracked: {untracked}"


@pytest.mark.parametrize("drop", ["ack", "store"])
def test_a_cycle_through_a_record_is_collected(impl: Any, drop: str) -> None:
    """The README's ``{"kind": "ship"}`` event and a spawn context: a relay stores a
    back-reference in them, and drops the entries (acked, or the whole store)."""
    store = impl.DictStore()
    store.commit(Execution(id="e"), [(None, {"kind": "ship"})], spawns=[("c", "r", {"a": 1})])
    (entry,), (intent,) = store.pending_outbox(), store.pending_spawns()
    witnesses = {"outbox": Box(), "spawn": Box()}
    entry.event["self"], entry.event["witness"] = entry, witnesses["outbox"]
    intent.context["self"], intent.context["witness"] = intent, witnesses["spawn"]
    refs = {name: weakref.ref(box) for name, box in witnesses.items()}
    if drop == "ack":
        store.ack_outbox(entry.seq)
        store.ack_spawn(intent.seq)
    else:
        del store
    del entry, intent, witnesses
    gc.collect()
    gc.collect()
    leaked = [name for name, ref in refs.items() if ref() is not None]
    assert not leaked, f"cycles never collected: {leaked}"


# --- caller code: the objects a hostile caller hands the store -----------------------------


class Refused(Exception):
    """The caller's own error."""


class Abort(BaseException):
    """A caller's error that is not an ``Exception``, like ``KeyboardInterrupt``."""


class Calls:
    """Every call of caller code below goes through :func:`tick`; while a hook is set,
    each call is counted and handed to the hook (which may raise, or call the store)."""

    hook: Callable[[str], None] | None = None
    count = 0


CALLS = Calls()


def tick(site: str) -> None:
    hook = CALLS.hook
    if hook is not None:
        CALLS.count += 1
        hook(site)


@contextmanager
def armed(hook: Callable[[str], None]) -> Iterator[None]:
    CALLS.hook, CALLS.count = hook, 0
    try:
        yield
    finally:
        CALLS.hook = None


class Key:
    """A key equal to the keys of the same ``like``, hashing like ``hash_as`` (default:
    ``like``); its ``__hash__`` and ``__eq__`` are caller code."""

    __slots__ = ("hash_as", "like")

    def __init__(self, like: str, hash_as: str | None = None) -> None:
        self.like = like
        self.hash_as = like if hash_as is None else hash_as

    def __hash__(self) -> int:
        tick(f"hash {self!r}")
        return hash(self.hash_as)

    def __eq__(self, other: object) -> bool:
        tick(f"eq {self!r}")
        if isinstance(other, Key):
            return self.like == other.like
        return NotImplemented

    def __repr__(self) -> str:
        if self.hash_as == self.like:
            return f"Key({self.like!r})"
        return f"Key({self.like!r}, hash_as={self.hash_as!r})"


class Int(int):
    """An int whose conversions, comparisons and hash are caller code."""

    def __int__(self) -> int:
        tick("Int.__int__")
        return int.__int__(self)

    def __index__(self) -> int:
        tick("Int.__index__")
        return int.__index__(self)

    def __hash__(self) -> int:
        tick("Int.__hash__")
        return int.__hash__(self)

    def __eq__(self, other: object) -> bool:
        tick("Int.__eq__")
        return int.__eq__(self, other)  # type: ignore[no-any-return]

    def __ne__(self, other: object) -> bool:
        tick("Int.__ne__")
        return int.__ne__(self, other)  # type: ignore[no-any-return]

    def __lt__(self, other: Any) -> bool:
        tick("Int.__lt__")
        return int.__lt__(self, other)

    def __le__(self, other: Any) -> bool:
        tick("Int.__le__")
        return int.__le__(self, other)

    def __gt__(self, other: Any) -> bool:
        tick("Int.__gt__")
        return int.__gt__(self, other)

    def __ge__(self, other: Any) -> bool:
        tick("Int.__ge__")
        return int.__ge__(self, other)


class Float(float):
    """A float whose conversion, comparisons and hash are caller code."""

    def __float__(self) -> float:
        tick("Float.__float__")
        return float.__float__(self)

    def __hash__(self) -> int:
        tick("Float.__hash__")
        return float.__hash__(self)

    def __eq__(self, other: object) -> bool:
        tick("Float.__eq__")
        return float.__eq__(self, other)  # type: ignore[no-any-return]

    def __ne__(self, other: object) -> bool:
        tick("Float.__ne__")
        return float.__ne__(self, other)  # type: ignore[no-any-return]

    def __lt__(self, other: Any) -> bool:
        tick("Float.__lt__")
        return float.__lt__(self, other)

    def __le__(self, other: Any) -> bool:
        tick("Float.__le__")
        return float.__le__(self, other)

    def __gt__(self, other: Any) -> bool:
        tick("Float.__gt__")
        return float.__gt__(self, other)

    def __ge__(self, other: Any) -> bool:
        tick("Float.__ge__")
        return float.__ge__(self, other)


class Str(str):
    """A str whose comparisons and hash are caller code."""

    def __hash__(self) -> int:
        tick("Str.__hash__")
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        tick("Str.__eq__")
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        tick("Str.__ne__")
        return str.__ne__(self, other)


class Counted(Mapping):  # type: ignore[type-arg]
    """A mapping whose methods are caller code."""

    def __init__(self, data: dict[Any, Any]) -> None:
        self.data = data

    def keys(self) -> Any:
        tick("Mapping.keys")
        return self.data.keys()

    def __getitem__(self, key: Any) -> Any:
        tick("Mapping.__getitem__")
        return self.data[key]

    def __iter__(self) -> Iterator[Any]:
        tick("Mapping.__iter__")
        return iter(self.data)

    def __len__(self) -> int:
        tick("Mapping.__len__")
        return len(self.data)


def ticking(items: Iterable[Any]) -> Iterator[Any]:
    for item in items:
        tick("iterator")
        yield item


class Exe:
    """An execution whose ``id`` (role ``id_prop``) and ``version`` (role ``version``,
    getter and setter) are properties running caller code."""

    def __init__(self, eid: Any, label: str, version: int, roles: frozenset[str]) -> None:
        self._id = eid
        self._version = version
        self._roles = roles
        self.definition_id = label

    @property
    def id(self) -> Any:
        if "id_prop" in self._roles:
            tick("Exe.id")
        return self._id

    @property
    def version(self) -> Any:
        if "version" in self._roles:
            tick("Exe.version get")
        return self._version

    @version.setter
    def version(self, value: Any) -> None:
        if "version" in self._roles:
            tick("Exe.version set")
        self._version = value


def label(exe: Any) -> Any:
    return exe.definition_id


# --- the world every scenario starts from ---------------------------------------------------
#
# A role names a kind of caller object; a scenario's roles say which are hostile (a Key,
# Int, Float, Str, Counted mapping, ticking iterator, property or clock) instead of a
# plain value. The store holds the same hostile kinds the call then hands it (as equal
# twins, so lookups compare), and keys that merely collide with them.


def keymaker(roles: frozenset[str]) -> Callable[..., Any]:
    def k(role: str, like: str, hash_as: str | None = None) -> Any:
        return Key(like, hash_as) if role in roles else like

    return k


@dataclass(frozen=True)
class Scenario:
    method: str
    variant: str  # the base variant, then flags: "later+leased"
    roles: frozenset[str]
    name: str  # of the roles
    exc: type[BaseException] = Refused

    @property
    def id(self) -> str:
        abort = "-abort" if self.exc is Abort else ""
        parts = [self.method, *self.variant.split("+"), self.name]
        return "-".join(part for part in parts if part) + abort

    @property
    def base(self) -> str:
        return self.variant.split("+")[0]

    @property
    def flags(self) -> frozenset[str]:
        """ "leased": claimed items; "recut": a changed trace_max; "ids", "replay",
        "changed", "stale", "epoch": commit ids and writer epochs."""
        return frozenset(self.variant.split("+")[1:])

    @property
    def protocol(self) -> bool:
        """x was last committed with a commit id and an epoch."""
        return bool(self.flags & {"ids", "replay", "changed", "stale", "epoch"})

    @property
    def clock(self) -> bool:
        """Claims are made: the store gets a fixed clock, and follow-ups claim too."""
        return self.method.startswith("claim_") or "leased" in self.flags


@dataclass
class World:
    x: Exe  # the stored execution later writes go to


def fill(store: Any, sc: Scenario) -> World:
    """Executions "a" and x (pending outbox and spawn entries, some acked, one in the
    middle; marks; timers swept into the heap and one armed since; traces), y with one
    timer and nothing else, and n, which has only a trace; then what the flags ask."""
    roles = sc.roles
    k = keymaker(roles)
    a = Execution(id="a", definition_id="a")
    store.commit(a, [("b", "a0"), (None, "a1")], "ev-a", [schedule("p", 1.0), schedule("q", 5.0)],
                 [("ka", "r", {"n": 1}), ("kb", "r", {})], {"s": "a0"})  # fmt: skip
    x = Exe(k("id", "x"), "x", 0, roles)
    store.commit(x, [(k("target", "tx"), "x0"), (None, "x1")], k("event", "ev-x"),
                 [schedule(k("path", "px"), 4.0), schedule("q", 6.0)],
                 [(k("child", "kx"), "r", {"n": 2})], {"s": "x0"})  # fmt: skip
    store.append_trace(k("id", "n"), {"s": "n0"})
    store.commit(Exe(k("id", "y"), "y", 0, roles), [], None, [schedule(k("path", "only"), 4.5)])
    store.ack_outbox(1)
    store.ack_spawn(2)  # the middle one
    store.due_timers(2.0)  # every timer so far into the heap
    store.commit(x, [(None, "x2")], None, [schedule(k("path", "pz"), 9.0)], trace={"s": "x1"})
    with missing_api():
        if sc.protocol:  # the very body a replay hands again
            store.commit(x, *commit_args(sc), commit_id="c-r", epoch=2)
        if "leased" in sc.flags:  # p, px and only; outbox 2 and 3; spawn 1
            store.claim_due_timers(math.inf, 3, lease=10.0)
            store.claim_outbox(2, lease=10.0)
            store.claim_spawns(1, lease=10.0)
    if "recut" in sc.flags:
        store.trace_max = 1
    return World(x)


def ids(roles: frozenset[str]) -> list[Any]:
    k = keymaker(roles)
    return ["a", "b", k("id", "x"), k("id", "y"), k("id", "n"), k("id", "new", "x"), "inner",
            "inner-s"]  # fmt: skip


def events(roles: frozenset[str]) -> list[Any]:
    k = keymaker(roles)
    return ["ev-a", k("event", "ev-x"), k("event", "ev-y", "ev-x"), "ev-in", "ev-f"]


def view(store: Any, roles: frozenset[str]) -> dict[str, Any]:
    """The whole observable state (no caller code is armed while it is taken)."""
    assert CALLS.hook is None
    return snapshot(store, ids(roles), events(roles), identify=label)


def trace_entry(roles: frozenset[str]) -> Any:
    entry: dict[Any, Any] = {"s": "t"}
    if "index" in roles:
        entry = {Key("idx", "index"): 1, "s": "t"}  # hashes like the "index" the store adds
    return Counted(entry) if "mapping" in roles else entry


def commit_args(sc: Scenario, changed: bool = False) -> tuple[Any, ...]:
    """Emits, processed event id, timers, spawns and trace of the commit under test."""
    roles = sc.roles
    k = keymaker(roles)
    fire = Float(3.0) if "fire_at" in roles else 3.0
    if "action" in roles:
        act, nop = Str("schedule"), Str("cancel")
    else:
        act, nop = "schedule", "cancel"
    emits: Any = [(k("target", "tx"), "e0"), ("b", "e1"), (None, "e2" if not changed else "e3")]
    timers: Any = [
        TimerOp._make((act, k("path", "px"), fire)),  # in the heap: re-armed
        TimerOp._make((act, k("path", "pz"), 10.0)),  # armed since the sweep: re-armed in place
        TimerOp._make((nop, "q", None)),
        TimerOp._make((act, "new", 0.5)),
        TimerOp._make((act, k("path", "py", "px"), 8.0)),  # collides with px
    ]
    context = Counted({"n": 3}) if "mapping" in roles else {"n": 3}
    spawns: Any = [(k("child", "kx"), "r", context), ("ky", "r", {})]
    if "iter" in roles:
        emits, timers, spawns = ticking(emits), ticking(timers), ticking(spawns)
    return emits, k("event", "ev-y", "ev-x"), timers, spawns, trace_entry(roles)


def make_call(store: Any, w: World, sc: Scenario, exe: Any = None) -> tuple[Callable[[], Any], Any]:
    """The call under test, its arguments built now (no caller code armed), and the
    execution it writes, if any. A retry hands the same execution again."""
    roles = sc.roles
    k = keymaker(roles)
    m, v = sc.method, sc.base

    def number(value: Any, role: str = "number") -> Any:
        if role not in roles:
            return value
        return Int(value) if type(value) is int else Float(value)

    if m in ("save", "commit"):
        stored = w.x._version
        if exe is None:
            if v == "first":
                exe = Exe(k("id", "n"), "n-new", number(0, "vint"), roles)
            elif v == "fresh":  # a new id, colliding with x
                exe = Exe(k("id", "new", "x"), "new", number(0, "vint"), roles)
            elif v == "later":  # another object at the stored version (a replay's: older)
                at = stored - 1 if sc.flags & {"replay", "changed"} else stored
                exe = Exe(k("id", "x"), "x-new", number(at, "vint"), roles)
            else:
                exe = w.x
                exe._version = number(stored, "vint")
        kwargs: dict[str, Any] = {}
        if sc.flags & {"ids", "epoch"}:
            kwargs = {"commit_id": "c-n", "epoch": number(3, "epoch")}
        elif sc.flags & {"replay", "changed"}:
            kwargs = {"commit_id": "c-r", "epoch": number(2, "epoch")}
        elif "stale" in sc.flags:
            kwargs = {"epoch": number(1, "epoch")}
        if m == "save":
            kwargs.pop("commit_id", None)
            return (lambda: store.save(exe, **kwargs)), exe
        args = commit_args(sc, "changed" in sc.flags)
        return (lambda: store.commit(exe, *args, **kwargs)), exe
    if m == "forget":
        eid = k("id", v)
        return (lambda: store.forget(eid)), None
    if m == "delete_timer":
        eid, path, at = {"heap": ("x", "px", 4.0), "armed": ("x", "pz", 9.0),
                         "only": ("y", "only", 4.5)}[v]  # fmt: skip
        target = (k("id", eid), k("path", path), Float(at) if "fire_at" in roles else at)
        return (lambda: store.delete_timer(*target)), None
    if m == "append_trace":
        eid = {"x": k("id", "x"), "n": k("id", "n"), "new": k("id", "new", "x")}[v]
        entry = trace_entry(roles)
        return (lambda: store.append_trace(eid, entry)), None
    if m in ("ack_outbox", "ack_spawn"):
        seq = {"head": 2 if m == "ack_outbox" else 1, "middle": 3, "tail": 3}[v]
        arg = Int(seq) if "seq" in roles else seq
        return (lambda: getattr(store, m)(arg)), None
    if m == "claim_due_timers":
        now, limit, lease = number(5.0), number(2), number(10.0)
        return (lambda: store.claim_due_timers(now, limit, lease=lease)), None
    if m in ("claim_outbox", "claim_spawns"):
        limit, lease = number(2), number(10.0)
        return (lambda: getattr(store, m)(limit, lease=lease)), None
    assert m == "trace_max"
    size = number(3)
    return (lambda: setattr(store, "trace_max", size)), None


EXE_ROLES = ("id", "id_prop", "version", "vint", "epoch")
COMMIT_ROLES = (*EXE_ROLES, "event", "path", "target", "child", "index", "fire_at", "action")
COMMIT_ROLES += ("mapping", "iter", "clock")
COMMIT_VARIANTS = ("first", "fresh", "later", "same", "later+leased", "later+recut")
COMMIT_VARIANTS += ("later+ids", "later+replay", "same+replay", "later+changed", "later+stale")
METHODS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # method: (variants, roles); a variant "base+flag" starts from what the flag says
    "save": (("first", "fresh", "later", "same", "later+epoch", "later+stale"), EXE_ROLES),
    "commit": (COMMIT_VARIANTS, COMMIT_ROLES),
    "forget": (("x", "n", "y", "x+leased", "x+ids"), ("id", "clock")),
    "delete_timer": (
        ("heap", "armed", "only", "heap+leased", "only+leased"),
        ("id", "path", "fire_at", "clock"),
    ),
    "append_trace": (("x", "n", "new", "x+recut"), ("id", "index", "mapping")),
    "ack_outbox": (("head", "middle", "middle+leased"), ("seq", "clock")),
    "ack_spawn": (("head", "tail", "head+leased"), ("seq", "clock")),
    "claim_outbox": (("", "+leased"), ("number", "clock")),
    "claim_spawns": (("", "+leased"), ("number", "clock")),
    "claim_due_timers": (("", "+leased"), ("number", "clock")),
    "trace_max": (("",), ("number",)),
}


def scenarios() -> list[Scenario]:
    out = []
    for method, (variants, all_roles) in METHODS.items():
        for variant in variants:
            probe = Scenario(method, variant, frozenset(), "")
            roles = [
                role
                for role in all_roles
                if (role != "clock" or probe.clock) and (role != "epoch" or probe.protocol)
            ]
            for role in roles:
                out.append(Scenario(method, variant, frozenset([role]), role))
            everything = frozenset(roles)
            if len(roles) > 1:
                out.append(Scenario(method, variant, everything, "all"))
            out.append(Scenario(method, variant, everything, "all", Abort))
    return out


SCENARIOS = scenarios()
PLAIN_SCENARIOS = [sc for sc in SCENARIOS if sc.exc is Refused]


def fixed_clock() -> float:
    return 1000.0


def hostile_clock() -> float:
    tick("clock()")
    return 1000.0


def new_store(impl: Any, sc: Scenario | None = None, clock: bool = False) -> Any:
    """A store; with a fixed clock when claims are made (leases then compare alike),
    which is caller code in role "clock"."""
    if not (clock or (sc is not None and sc.clock)):
        return impl.DictStore()
    hostile = sc is not None and "clock" in sc.roles
    with missing_api():
        return impl.DictStore(clock=hostile_clock if hostile else fixed_clock)


@contextmanager
def missing_api() -> Iterator[None]:
    """A store without the protocol of issue 11 (``clock=``, ``commit_id=``, ``epoch=``,
    claims) fails the test in one line."""
    try:
        yield
    except (TypeError, AttributeError) as exc:
        if "unexpected keyword" not in str(exc) and "has no attribute 'claim" not in str(exc):
            raise
        pytest.fail(f"the store lacks the protocol: {exc}", pytrace=False)


def run_call(call: Callable[[], Any]) -> tuple[tuple[str, str], BaseException | None]:
    try:
        result = call()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - compared with the reference
        return (type(exc).__name__, str(exc)), exc
    return ("ok", repr(result)), None


def follow_up(store: Any, sc: Scenario) -> dict[str, Any]:
    """Use the store after the call: the next seqs and trace indexes, claims, and
    deleting every armed timer show what the snapshot alone cannot."""
    out: dict[str, Any] = {}
    exe = store.load("a") or Execution(id="a", definition_id="a")
    store.commit(exe, [(None, "f0")], "ev-f", [schedule("f", 0.25)], [("kf", "r", {})], {"s": "f"})
    for eid in ids(sc.roles):
        store.append_trace(eid, {"f": 1})
    out["view"] = view(store, sc.roles)
    if sc.clock:
        out["claims"] = repr(
            (store.claim_outbox(100, lease=10.0), store.claim_spawns(100, lease=10.0),
             store.claim_due_timers(math.inf, 100, lease=10.0))
        )  # fmt: skip
    for timer in store.due_timers(math.inf):
        store.delete_timer(*timer)
    out["left"] = (store.due_timers(math.inf), store.stats())
    return out


@dataclass
class Reference:
    before: dict[str, Any]  # a filled store's view
    outcome: tuple[str, str]  # of the well-behaved call
    after: dict[str, Any]  # the view after it
    followed: dict[str, Any]  # follow_up after it


@functools.cache
def reference(impl: Any, sc: Scenario) -> Reference:
    """The same call, well behaved (no caller code armed), on a store that never saw a
    failure."""
    store = new_store(impl, sc)
    w = fill(store, sc)
    before = view(store, sc.roles)
    call, _ = make_call(store, w, sc)
    outcome, _ = run_call(call)
    after = view(store, sc.roles)
    return Reference(before, outcome, after, follow_up(store, sc))


def differences(store: Any, outcome: tuple[str, str], ref: Reference, sc: Scenario) -> list[str]:
    """How ``store``, after a call that gave ``outcome``, differs from the reference."""
    problems = []
    if outcome != ref.outcome:
        problems.append(f"returned {outcome}, the reference {ref.outcome}")
    after = view(store, sc.roles)
    changed = [key for key in after if after[key] != ref.after[key]]
    if changed:
        problems.append(f"differs from the reference in {changed}")
    followed = follow_up(store, sc)
    later = [key for key in followed if followed[key] != ref.followed[key]]
    if later and not changed:
        problems.append(f"later use differs from the reference in {later}")
    return problems


class Trap:
    """Raise ``exc`` at the ``n``-th call of caller code, and only there."""

    def __init__(self, n: int, exc: type[BaseException]) -> None:
        self.n = n
        self.exc = exc
        self.site: str | None = None
        self.error: BaseException | None = None

    def __call__(self, site: str) -> None:
        if CALLS.count == self.n:
            self.site = site
            self.error = self.exc(f"caller code #{self.n}: {site}")
            raise self.error


MAX_CALLS = 300


def report(problems: list[str], context: str) -> None:
    """Fail with the first problems, without a traceback: the list says it all (and
    formatting hundreds of tracebacks would take longer than the scans)."""
    if problems:
        more = f"\n... and {len(problems) - 15} more" if len(problems) > 15 else ""
        shown = "\n".join(problems[:15])
        pytest.fail(f"{context}; {len(problems)} problems:\n{shown}{more}", pytrace=False)


@dataclass
class Scan:
    calls: int  # of caller code in the call that succeeded
    errors: frozenset[str]  # the exception types the failing calls raised
    problems: list[str]


@functools.cache
def scan(impl: Any, sc: Scenario) -> Scan:
    """Fail the call at every call number N of caller code, until it runs whole."""
    ref = reference(impl, sc)
    problems: list[str] = []
    errors: set[str] = set()
    for n in range(1, MAX_CALLS + 1):
        store = new_store(impl, sc)
        w = fill(store, sc)
        call, exe = make_call(store, w, sc)
        version = None if exe is None else exe.version
        trap = Trap(n, sc.exc)
        with armed(trap):
            outcome, raised = run_call(call)
        if trap.error is None:  # N is past the last call of caller code: the call ran whole
            problems += [
                f"the call that ran whole {p}" for p in differences(store, outcome, ref, sc)
            ]
            return Scan(n - 1, frozenset(errors), problems)
        if raised is None:
            problems.append(f"N={n}: the caller's error at {trap.site} was swallowed")
            continue
        where = f"N={n} ({trap.site})"
        errors.add(type(raised).__name__)
        if raised is not trap.error:
            problems.append(f"{where}: raised {outcome[0]}: {outcome[1]}, not the caller's error")
        after = view(store, sc.roles)
        changed = [key for key in after if after[key] != ref.before[key]]
        if changed:
            problems.append(f"{where}: the failed call changed {changed}")
        if exe is not None and exe.version != version:
            problems.append(
                f"{where}: the failed call left exe.version {exe.version} (was {version})"
            )
        retry, _ = make_call(store, w, sc, exe)
        outcome, _ = run_call(retry)
        problems += [f"{where}, then a retry: {p}" for p in differences(store, outcome, ref, sc)]
    problems.append(f"the call still failed at N={MAX_CALLS}")
    return Scan(MAX_CALLS, frozenset(errors), problems)


@pytest.mark.parametrize("sc", SCENARIOS, ids=[sc.id for sc in SCENARIOS])
def test_a_call_that_fails_in_caller_code_changes_nothing(
    impl: Any, pure_impl: Any, sc: Scenario
) -> None:
    """For each N, the N-th call of caller code raises: the store and ``exe.version``
    stay as they were, and a retry ends as if the failure never happened. The
    compiled store raises the same exceptions as the pure one and ends the same."""
    result = scan(impl, sc)
    problems = list(result.problems)
    if impl is not pure_impl:
        pure = scan(pure_impl, sc)
        if result.errors != pure.errors:
            problems.append(f"raised {sorted(result.errors)}, the pure store {sorted(pure.errors)}")
        mine, theirs = reference(impl, sc), reference(pure_impl, sc)
        if (mine.outcome, mine.after, mine.followed) != (
            theirs.outcome, theirs.after, theirs.followed
        ):  # fmt: skip
            problems.append("the well-behaved call ends otherwise than in the pure store")
    report(problems, f"{result.calls} calls of caller code")


# --- 4. a write from inside a write is refused ---------------------------------------------

INNER_WRITES: dict[str, dict[str, Callable[[Any], Any]]] = {
    "writes": {
        "commit": lambda s: s.commit(Execution(id="inner", definition_id="inner"),
                                     [(None, "in")], "ev-in", [schedule("ti", 1.5)],
                                     [("kin", "r", {})], {"in": 1}),
        "save": lambda s: s.save(Execution(id="inner-s", definition_id="inner-s")),
        "append_trace": lambda s: s.append_trace("a", {"in": 1}),
        "delete_timer": lambda s: s.delete_timer("a", "p", 1.0),
        "ack_outbox": lambda s: s.ack_outbox(2),
        "ack_spawn": lambda s: s.ack_spawn(1),
        "forget": lambda s: s.forget("a"),
        "trace_max": lambda s: setattr(s, "trace_max", 1),
    },
    "claims": {
        "claim_outbox": lambda s: s.claim_outbox(),
        "claim_spawns": lambda s: s.claim_spawns(),
        "claim_due_timers": lambda s: s.claim_due_timers(math.inf),
    },
    # Reads are allowed (README, Concurrency), due_timers included, though its sweep
    # reorganises the timers a write may be working on.
    "reads": {
        "load": lambda s: s.load("a"),
        "is_processed": lambda s: s.is_processed("a", "ev-a"),
        "pending_outbox": lambda s: s.pending_outbox(),
        "pending_spawns": lambda s: s.pending_spawns(),
        "due_timers": lambda s: s.due_timers(math.inf),
        "read_trace": lambda s: s.read_trace("a"),
        "stats": lambda s: s.stats(),
    },
}  # fmt: skip
EXPECTED_INNER = {"writes": "refused", "claims": "refused", "reads": "accepted"}


def reentering(store: Any, writes: dict[str, Callable[[Any], Any]], attempts: list[Any]) -> Any:
    """A hook that tries every write of ``writes`` each time caller code runs."""

    def hook(site: str) -> None:
        CALLS.hook = None  # the inner writes run no armed caller code
        try:
            for name, write in writes.items():
                try:
                    write(store)
                except RuntimeError:
                    attempts.append((site, name, "refused"))
                except Exception as exc:  # noqa: BLE001 - reported
                    attempts.append((site, name, type(exc).__name__))
                else:
                    attempts.append((site, name, "accepted"))
        finally:
            CALLS.hook = hook

    return hook


@pytest.mark.parametrize("inner", INNER_WRITES)
@pytest.mark.parametrize("sc", PLAIN_SCENARIOS, ids=[sc.id for sc in PLAIN_SCENARIOS])
def test_a_write_from_inside_a_write_is_refused(impl: Any, sc: Scenario, inner: str) -> None:
    """Each time the call runs caller code, that code tries every write of ``inner`` on
    the same store: each must raise RuntimeError (reads must work), and the store ends
    as if none had been tried."""
    ref = reference(impl, sc)
    store = new_store(impl, sc, inner == "claims")
    w = fill(store, sc)
    call, _ = make_call(store, w, sc)
    attempts: list[Any] = []
    with armed(reentering(store, INNER_WRITES[inner], attempts)):
        outcome, _ = run_call(call)
    # No attempts: the call ran none of this caller code (a role it never reads), so
    # there was nothing to write from; the store must still end as the reference.
    problems = [f"inner {name} from {site}: {what}" for site, name, what in attempts
                if what != EXPECTED_INNER[inner]]  # fmt: skip
    problems += differences(store, outcome, ref, sc)
    report(list(dict.fromkeys(problems)), f"{len(attempts)} inner calls tried")


# --- 6. warnings alike ---------------------------------------------------------------------


class PlainFloat(float):
    """A float subclass with nothing of its own."""


class PlainInt(int):
    """An int subclass with nothing of its own."""


class FloatToSub(float):
    """``float()`` of it is a float subclass: Python warns (DeprecationWarning)."""

    def __float__(self) -> float:
        return PlainFloat(float.__float__(self))


class IntToFloatSub(int):
    def __float__(self) -> float:
        return PlainFloat(int.__int__(self))


class IntToSub(int):
    """``int()`` (and ``__index__``) of it is an int subclass: Python warns."""

    def __int__(self) -> int:
        return PlainInt(int.__int__(self))

    def __index__(self) -> int:
        return PlainInt(int.__int__(self))


def made(fire_at: Any) -> TimerOp:
    return TimerOp._make(("schedule", "p", fire_at))


def custom(fire_at: Any) -> Any:
    return SimpleNamespace(action="schedule", path="p", fire_at=fire_at)


def timed(op: Any) -> Callable[[Any], Any]:
    """Commit ``op`` as the one timer op of a new execution."""
    return lambda s: s.commit(Execution(id="w"), [], timers=[op])


WARN_CASES: dict[str, Callable[[Any], Any]] = {
    "fire_at-made-float": timed(made(FloatToSub(3.0))),
    "fire_at-made-int": timed(made(IntToFloatSub(3))),
    "fire_at-made-among": lambda s: s.commit(
        Execution(id="w"), [], timers=[schedule("z", 1.0), made(FloatToSub(3.0))]
    ),
    "fire_at-custom-float": timed(custom(FloatToSub(3.0))),
    "fire_at-custom-int": timed(custom(IntToFloatSub(3))),
    "now-float": lambda s: s.due_timers(FloatToSub(3.0)),
    "now-int": lambda s: s.due_timers(IntToFloatSub(3)),
    "version": lambda s: s.commit(Execution(id="w", version=IntToSub(3)), [(None, "v")]),
    "seq": lambda s: s.ack_outbox(IntToSub(1)),
    "trace_max": lambda s: setattr(s, "trace_max", IntToSub(3)),
    "claim-now-float": lambda s: s.claim_due_timers(FloatToSub(3.0)),
    "claim-now-int": lambda s: s.claim_due_timers(IntToFloatSub(3)),
    "claim-lease": lambda s: s.claim_outbox(lease=FloatToSub(5.0)),
    "claim-limit": lambda s: s.claim_outbox(IntToSub(1)),
}


def warned(impl: Any, case: str, action: str) -> tuple[Any, ...]:
    """What ``case`` does on a small store under the warnings filter ``action``: its
    outcome, the warning categories it raised, and the store afterwards."""
    store = new_store(impl, clock=case.startswith("claim"))
    store.commit(Execution(id="b"), [(None, "x"), (None, "y")], None, [schedule("t", 1.0)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        outcome, _ = run_call(lambda: WARN_CASES[case](store))
    due = store.due_timers(math.inf)
    exe = store.load("w")
    state = (
        due,
        [type(t[2]).__name__ for t in due],
        store.pending_outbox(),
        store.stats(),
        store.trace_max,
        None if exe is None else (exe.version, type(exe.version).__name__),
    )
    return outcome[0], sorted({w.category.__name__ for w in caught}), state


@pytest.mark.parametrize("action", ["always", "error"])
@pytest.mark.parametrize("case", WARN_CASES)
def test_numbers_that_convert_to_a_subclass_warn_alike(impl: Any, case: str, action: str) -> None:
    """``float()``/``int()`` of these warn (DeprecationWarning) where Python converts
    them: both stores warn, or neither, and end alike (under "error" too, the project's
    filter)."""
    if case.startswith("claim") and not hasattr(impl.DictStore, "claim_outbox"):
        pytest.fail(f"the {impl.name} store has no claims")
    assert warned(impl, case, action) == warned(other_impl(impl), case, action)


# --- 7. id and version read as attribute access reads them -----------------------------


def logging_property(name: str, log: list[tuple[str, str]]) -> property:
    """A property over the slot's own storage that logs every get and set."""
    slot = Execution.__dict__[name]

    def get(self: Any) -> Any:
        log.append(("get", name))
        return slot.__get__(self, Execution)

    def put(self: Any, value: Any) -> None:
        log.append(("set", name))
        slot.__set__(self, value)

    return property(get, put)


@contextmanager
def on_execution(name: str, value: Any) -> Iterator[None]:
    """``Execution.<name> = value`` for the block; the class as it was afterwards."""
    had = name in Execution.__dict__
    old = Execution.__dict__.get(name)
    setattr(Execution, name, value)
    try:
        yield
    finally:
        if had:
            setattr(Execution, name, old)
        else:
            delattr(Execution, name)


class HashHook:
    """An execution id (equal to and hashing like ``"h"``) that runs ``hook`` at its
    ``n``-th hash: caller code in the middle of a commit."""

    def __init__(self, n: int, hook: Callable[[], None]) -> None:
        self.n, self.hook, self.calls = n, hook, 0

    def __hash__(self) -> int:
        self.calls += 1
        if self.calls == self.n:
            self.hook()
        return hash("h")

    def __eq__(self, other: object) -> bool:
        return other == "h"

    def __repr__(self) -> str:
        return "HashHook()"


def attribute_run(impl: Any, change: str, name: str) -> tuple[Any, ...]:
    """Commits around a change to how ``Execution`` reaches ``name``; what was logged
    and the store's state at each step."""
    store = impl.DictStore()
    exe = Execution(id="e")
    store.commit(exe, [], "p0")  # the compiled store has checked the class by now
    log: list[tuple[str, str]] = []
    outcomes = []
    if change == "property":
        with on_execution(name, logging_property(name, log)):
            outcomes.append(run_call(lambda: store.commit(exe, [("t", "a")], "p1"))[0])
    elif change == "getattribute":

        def getattribute(self: Any, attr: str) -> Any:
            log.append(("get", attr))
            return object.__getattribute__(self, attr)

        with on_execution("__getattribute__", getattribute):
            outcomes.append(run_call(lambda: store.commit(exe, [("t", "a")], "p1"))[0])
    elif change == "setattr":

        def setattr_(self: Any, attr: str, value: Any) -> None:
            log.append(("set", attr))
            object.__setattr__(self, attr, value)

        with on_execution("__setattr__", setattr_):
            outcomes.append(run_call(lambda: store.commit(exe, [("t", "a")], "p1"))[0])
    elif change == "deleted":
        keep = getattr(exe, name)
        delattr(exe, name)
        outcomes.append(run_call(lambda: store.commit(exe, [("t", "a")], "p1"))[0])
        setattr(exe, name, keep)
    elif change == "mid-commit":
        # The id's first hash (the commit's lookup of the slot) puts the property on the
        # class; the version is read and written after it.
        prop = logging_property("version", log)
        old = Execution.__dict__["version"]
        hooked = Execution(id=HashHook(1, lambda: setattr(Execution, "version", prop)))
        try:
            outcomes.append(run_call(lambda: store.commit(hooked, [("t", "b")], "q1"))[0])
        finally:
            Execution.version = old
        outcomes.append((hooked.version, hooked.id.calls >= 1))
    # The class is whole again: the next commits take whatever path they took before.
    outcomes.append(run_call(lambda: store.commit(exe, [("t", "c")], "p2"))[0])
    outcomes.append(run_call(lambda: store.commit(Execution(id="f"), [], "r"))[0])
    return (
        log,
        outcomes,
        exe.version,
        snapshot(store, ["e", "f"], ["p0", "p1", "p2", "q1", "r"], identify=lambda obj: obj is exe),
    )


ATTRIBUTE_CHANGES = [
    ("property", "id"),
    ("property", "version"),
    ("getattribute", "-"),
    ("setattr", "-"),
    ("deleted", "id"),
    ("deleted", "version"),
    ("mid-commit", "version"),
]


@pytest.mark.parametrize(
    ("change", "name"), ATTRIBUTE_CHANGES, ids=["-".join(c) for c in ATTRIBUTE_CHANGES]
)
def test_id_and_version_are_reached_as_attribute_access_reaches_them(
    impl: Any, change: str, name: str
) -> None:
    """Both stores call what the class says, fail alike on a deleted slot, and agree."""
    run = attribute_run(impl, change, name)
    assert run == attribute_run(other_impl(impl), change, name)
    log, outcomes = run[0], run[1]
    if change in ("property", "mid-commit"):
        assert ("get", name) in log, log
        assert name == "id" or ("set", "version") in log, log
    if change == "getattribute":
        assert {("get", "id"), ("get", "version")} <= set(log), log
    if change == "setattr":
        assert ("set", "version") in log, log
    if change == "deleted":
        assert outcomes[0][0] == "TypeError", outcomes
    else:
        assert outcomes[0][0] == "ok", outcomes
    assert all(o[0] == "ok" for o in outcomes[-2:]), outcomes


# --- 8. what a second hostile pass found -------------------------------------------------------


def run_child(impl: Any, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a child ``python -X dev``, with ``M`` the implementation's module."""
    prelude = f"import harel_store._store_{MODULE_SUFFIX[impl.name]} as M\n"
    return subprocess.run(
        [sys.executable, "-X", "dev", "-X", "faulthandler", "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=TESTS,
    )


LYING_BODIES = {
    "a tuple subclass whose len lies": "Liar((1,))",
    "a tuple whose deepcopy is an int": "(Junk(), None, (), (), None)",
    "a list of four": "[(), None, (), ()]",
    "a digest of one item": "tuple.__new__(Digest, (1,))",
    "an emit that is no pair": "(((1, 2, 3),), None, (), (), None)",
}


@pytest.mark.parametrize("body", list(LYING_BODIES))
def test_a_copy_that_brings_a_malformed_commit_body_is_refused(impl: Any, body: str) -> None:
    """``copy_store`` takes any source with a ``_dump()``: a commit body that is not one
    (the compiled store read a kept body unchecked, and a replay crashed) is refused,
    the destination left empty, and the commit id stays free."""
    done = run_child(
        impl,
        f"""
        from harel_store import Execution, copy_store
        from harel_store._digest import Digest

        class Liar(tuple):
            def __len__(self):
                return 5

        class Junk:
            def __deepcopy__(self, memo):
                return 12345

        class Source:
            def _dump(self):
                yield ("total", 1)
                yield ("commit", "e", "c1", 1, {LYING_BODIES[body]})

        store = M.DictStore()
        try:
            copy_store(Source(), store)
        except (TypeError, ValueError) as exc:
            print("refused", type(exc).__name__)
        assert store.stats() == M.DictStore().stats(), store.stats()
        exe = Execution(id="e")
        store.commit(exe, [], "ev", commit_id="c1")
        store.commit(Execution(id="e"), [], "ev", commit_id="c1")  # a replay, recognised
        print("version", exe.version, store.load("e").version)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["refused", "TypeError", "version", "1", "1"], done.stdout


@pytest.mark.parametrize("what", ["seqs", "next_index", "outbox seq"])
def test_a_copy_with_counters_past_2_62_is_refused_and_below_them_counts_on(
    impl: Any, what: str
) -> None:
    """The compiled store counts in 64 bits: a copy brought in 2**63 - 1 and the next
    commit wrapped to a negative seq. Counters up to 2**62 are taken, and count on."""
    from harel_store import copy_store

    def source(n: int) -> Any:
        records: list[Any] = [("total", 1)]
        if what == "seqs":
            records.append(("seqs", n, n))
        elif what == "next_index":
            records.append(("trace", "e", n, []))
        else:
            records.append(("outbox", (n, None, "x")))
        return SimpleNamespace(_dump=lambda: iter(records))

    with pytest.raises(ValueError, match="2\\*\\*62"):
        copy_store(source(2**62 + 1), impl.DictStore())
    store = impl.DictStore()
    copy_store(source(2**62), store)
    exe = Execution(id="e")
    store.commit(exe, [(None, "y")], spawns=[("k", "r", {})], trace={"s": 1})
    if what in ("seqs", "outbox seq"):
        assert store.pending_outbox()[-1].seq == 2**62 + 1
    if what == "seqs":
        assert store.pending_spawns()[-1].seq == 2**62 + 1
    if what == "next_index":
        assert store.read_trace("e")[-1]["index"] == 2**62


@pytest.mark.parametrize("replay", [False, True], ids=["plain", "commit_id"])
def test_a_recursion_error_at_any_depth_never_half_writes_a_commit(impl: Any, replay: bool) -> None:
    """A commit made near the recursion limit may fail with ``RecursionError`` wherever a
    call is made: before its first write, so never half of it (the pure store's write
    phase called helpers a frame deeper; the compiled one a Python function)."""
    kwargs: dict[str, Any] = {"commit_id": "c1", "epoch": 1} if replay else {}
    timers = [TimerOp("schedule", "p", 5.0), TimerOp("cancel", "q", 9.0)]

    def commit(store: Any, exe: Any) -> None:
        store.commit(
            exe, [(None, {"n": 1})], "ev", timers, [("k", "r", {"a": 1})], {"s": 1}, **kwargs
        )

    def seen(store: Any) -> Any:  # the state, but which object is stored
        return {k: v for k, v in snapshot(store, ["e"], ["ev"]).items() if k != "load"}

    reference = impl.DictStore()
    commit(reference, Execution(id="e"))
    whole = seen(reference)

    def at_depth(n: int, call: Callable[[], None]) -> None:
        if n:
            at_depth(n - 1, call)
        else:
            call()

    depth = 0
    frame = sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back  # type: ignore[assignment]
    limit = sys.getrecursionlimit()
    outcomes = set()
    sys.setrecursionlimit(depth + 60)
    try:
        for n in range(60):
            store = impl.DictStore()
            empty = seen(store)
            exe = Execution(id="e")
            try:
                at_depth(n, lambda: commit(store, exe))  # noqa: B023 - called at once
            except RecursionError:
                outcomes.add("refused")
                assert exe.version == 0 and seen(store) == empty, n
                assert store.load("e") is None, n
            else:
                outcomes.add("landed")
                assert exe.version == 1 and seen(store) == whole, n
                assert store.load("e") is exe, n
    finally:
        sys.setrecursionlimit(limit)
    assert outcomes == {"refused", "landed"}, "the scan did not cross the limit"


@pytest.mark.parametrize("during", ["due_timers", "commit"])
def test_due_timers_read_by_a_finalizer_changes_no_timer(impl: Any, during: str) -> None:
    """A finalizer (here of a garbage cycle, collected inside the store's own call) may
    read ``due_timers``; the read must leave the timers as they are (it reorganised
    them: every timer was listed, and claimed, twice)."""
    store = impl.DictStore(clock=lambda: 0.0)
    exe = Execution(id="e")
    store.commit(exe, [], timers=[TimerOp("schedule", f"p{i}", float(i)) for i in range(5)])
    seen: list[Any] = []

    class Watcher:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            seen.append(store.due_timers(math.inf))

    thresholds = gc.get_threshold()
    enabled = gc.isenabled()
    try:
        for k in range(5):
            gc.collect()
            gc.disable()
            watcher = Watcher()
            gc.collect(0)  # the watcher moves on to generation 1 ...
            del watcher  # ... and is garbage there, for the next collection of it
            gc.set_threshold(1, 1, 1000)
            gc.enable()
            if during == "due_timers":
                store.due_timers(0.5)
            else:
                store.commit(exe, [(None, k)], timers=[TimerOp("schedule", f"q{k}", 0.5)])
            gc.set_threshold(*thresholds)
    finally:
        gc.set_threshold(*thresholds)
        if not enabled:
            gc.disable()
        gc.collect()
    assert seen, "no finalizer ran inside the store's call"
    armed = store.stats()["timers"]
    assert len(store.due_timers(math.inf)) == armed
    claimed = store.claim_due_timers(math.inf, 1000, lease=60.0)
    assert len(claimed) == armed == len(set(claimed))
    assert store.claim_due_timers(math.inf, 1000, lease=60.0) == []


def test_save_with_an_epoch_runs_the_ids_code_alike(impl: Any, pure_impl: Any) -> None:
    """``save(exe, epoch=...)`` hashes the id as often in both stores (it goes through
    commit's checks in both), so a hash that fails at call N fails both alike."""

    class Key:
        calls = 0
        fail_at = -1

        def __hash__(self) -> int:
            Key.calls += 1
            if Key.calls == Key.fail_at:
                raise ValueError(f"hash call {Key.calls}")
            return 7

    def run(mod: Any, fail_at: int, existing: bool) -> Any:
        store, key = mod.DictStore(), Key()
        exe = Execution(id=key)
        if existing:
            store.save(exe, epoch=1)
        Key.calls, Key.fail_at = 0, fail_at
        try:
            store.save(exe, epoch=2)
            outcome = "ok"
        except ValueError as exc:
            outcome = str(exc)
        Key.fail_at = -1
        return outcome, Key.calls, exe.version, store.load(key) is exe

    for fail_at in range(1, 6):
        for existing in (False, True):
            assert run(impl, fail_at, existing) == run(pure_impl, fail_at, existing)


@pytest.mark.parametrize("helper", ["timer_ops", "outbox_entries", "spawn_entries", "deque"])
def test_a_helper_replaced_at_run_time_cannot_crash_the_compiled_store(
    compiled_module: ModuleType, helper: str
) -> None:
    """The compiled store reads what ``harel_store._checks`` returns, and calls the C
    function of its deques, unchecked for speed: a helper replaced by a program (a
    monkeypatch) is a RuntimeError, not a crash."""
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-X", "faulthandler", "-c", textwrap.dedent(f"""
        import harel_store._checks as checks, harel_store._store_c as C
        from harel_store import Execution, TimerOp
        helper = {helper!r}
        if helper == "deque":
            other = []
            class FakeDeque(list):
                def __init__(self, *args):
                    super().__init__(*args)
                    self.append = other.append
            C.deque = FakeDeque
        else:
            setattr(checks, helper, lambda *args: [(1,)])
        try:
            store = C.DictStore()
            store.commit(Execution(id="e"), iter([(None, 1)]), None,
                         iter([TimerOp("schedule", "p", 1)]), iter([("k", "r", {{}})]))
        except RuntimeError as exc:
            print("refused:", exc)
        """)],
        capture_output=True, text=True, timeout=120, check=False, cwd=TESTS,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:"), done.stdout
