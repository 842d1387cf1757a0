"""Helpers shared by the tests: drive the async store, snapshot what a store shows, fill
a store with executions, and time a call."""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any

# Every method of the store API, in the order of API.md, then the extras.
API_METHODS = (
    "load",
    "save",
    "commit",
    "is_processed",
    "pending_outbox",
    "ack_outbox",
    "pending_spawns",
    "ack_spawn",
    "due_timers",
    "delete_timer",
    "append_trace",
    "read_trace",
    "close",
)
EXTRA_METHODS = (
    "forget",
    "stats",
    "claim_outbox",
    "claim_spawns",
    "claim_due_timers",
    "commit_many",
    "ack_outbox_many",
    "ack_spawn_many",
    "delete_timer_many",
    "wait_for_work",
    "overview",
    "list_executions",
    "prune",
)


def drive(coro: Any) -> Any:
    """Run a coroutine of the async store to its end without an event loop.

    The store promises that no method awaits internally, so the first ``send`` must
    finish the coroutine; a suspension is a broken promise.
    """
    assert inspect.iscoroutine(coro), f"expected a coroutine, got {coro!r}"
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError(f"{coro.__qualname__} suspended: the async store must not await")


class AsyncAsSync:
    """An async store behind the sync API: each method call returns a coroutine, which
    ``runner`` runs to its end (``asyncio.run`` by default, or :func:`drive`).
    ``trace_max`` and private names pass through untouched (``_record_trace`` is a
    plain method on both stores)."""

    __slots__ = ("_astore", "_runner")

    def __init__(self, astore: Any, runner: Callable[[Any], Any] = asyncio.run) -> None:
        object.__setattr__(self, "_astore", astore)
        object.__setattr__(self, "_runner", runner)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._astore, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            coro = attr(*args, **kwargs)
            assert inspect.iscoroutine(coro), f"{name}() did not return a coroutine"
            return self._runner(coro)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._astore, name, value)


def snapshot(
    store: Any,
    ids: Iterable[Hashable],
    events: Iterable[Hashable] = (),
    identify: Callable[[Any], Any] = id,
    deep: bool = True,
    timers: bool = True,
) -> dict[str, Any]:
    """Everything ``store`` shows through its public API about ``ids`` and ``events``.

    ``load`` is recorded as ``(identify(obj), obj.version)``: by default the object's
    identity, so a replaced object shows even at an equal version. ``due_timers(inf)``
    lists every armed timer; ``timers=False`` leaves it out, for a caller that must not
    sweep (a sweep may reorganise the store's timers). With ``deep`` the result is
    deep-copied, so later writes cannot reach it (spawn contexts and trace steps are the
    store's own dicts).
    """
    ids = list(ids)
    events = list(events)
    loaded = {}
    for eid in ids:
        exe = store.load(eid)
        loaded[eid] = None if exe is None else (identify(exe), exe.version)
    state = {
        "load": loaded,
        "processed": {(e, v): store.is_processed(e, v) for e in ids for v in events},
        "outbox": store.pending_outbox(),
        "spawns": store.pending_spawns(),
        "timers": store.due_timers(math.inf) if timers else None,
        "trace": {eid: store.read_trace(eid) for eid in ids},
        "stats": store.stats(),
        "trace_max": store.trace_max,
    }
    return copy.deepcopy(state) if deep else state


def identify_for(store: Any) -> Callable[[Any], Any]:
    """How :func:`snapshot` should record a loaded execution of ``store``: by identity
    where the store preserves it, else by value (a durable store decodes a fresh object
    each ``load``, so an identity would differ every time)."""
    if store.preserves_identity:
        return id
    return lambda exe: exe


def assert_holds(store: Any, exe: Any) -> Any:
    """``store.load`` shows ``exe`` as last written: ``exe`` itself where the store
    preserves identity, else a fresh object of its type, equal to it, at its version.
    Returns what ``load`` returned."""
    loaded = store.load(exe.id)
    if store.preserves_identity:
        assert loaded is exe
    else:
        assert loaded is not exe and type(loaded) is type(exe)
        assert loaded == exe and loaded.version == exe.version
    return loaded


URL_ENV = "HAREL_STORE_URL"


def module_env(**extra: str) -> dict[str, str]:
    """This environment, with the ``harel_store`` the tests import first on the path,
    and no ``HAREL_STORE_URL`` unless given."""
    import harel_store

    env = dict(os.environ)
    env.pop(URL_ENV, None)
    root = str(Path(harel_store.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def cli_command(*args: str) -> list[str]:
    """``python -m harel_store ARGS`` in this interpreter, warnings as errors."""
    return [sys.executable, "-W", "error", "-m", "harel_store", *args]


def run_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run :func:`cli_command` to its end in ``cwd`` (with ``env`` added), capturing."""
    return subprocess.run(
        cli_command(*args),
        cwd=cwd,
        env=module_env(**env),
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
    )


def worker_pids(parent: int) -> list[int]:
    """The spawned worker processes of ``parent`` (not multiprocessing's helpers)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"spawn_main" in cmdline:
            pids.append(int(stat.parent.name))
    return sorted(pids)


def fill(store: Any, n: int, *, start: int = 0, batch: int = 1000) -> None:
    """Commit ``n`` new executions ``e0000000``... (from ``start``), each with the mark
    ``ev{i}`` and the commit id ``c{i}``, ``batch`` at a time with ``commit_many``."""
    from harel_store import Commit, Execution

    for at in range(start, start + n, batch):
        commits = [
            Commit(Execution(id=f"e{i:07d}"), processed_event_id=f"ev{i}", commit_id=f"c{i}")
            for i in range(at, min(at + batch, start + n))
        ]
        assert store.commit_many(commits) == [None] * len(commits)


async def settled(value: Any) -> Any:
    """``value``, awaited when it is awaitable (a call of an async store)."""
    return await value if inspect.isawaitable(value) else value


def commit_three(store: Any) -> None:
    """Commit three new executions ``x0``..``x2``, each with two emits (one to itself),
    the mark ``m{i}``, the timer ``t`` at ``1000 + 10 i``, a spawn and the commit id
    ``c{i}``: the figures of ``overview`` tests."""
    from harel_store import Execution, TimerOp

    for i in range(3):
        store.commit(
            Execution(id=f"x{i}"),
            [(f"x{i}", {"n": i}), (None, i)],
            processed_event_id=f"m{i}",
            timers=[TimerOp("schedule", "t", 1000.0 + 10 * i)],
            spawns=[(f"child{i}", ("a",), {})],
            commit_id=f"c{i}",
        )


def best(call: Callable[[], Any], runs: int = 5) -> float:
    """The shortest wall-clock time of ``runs`` calls of ``call``, in seconds."""
    fastest = math.inf
    for _ in range(runs):
        start = time.perf_counter()
        call()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest
