"""Fail if the importable compiled store was built with line tracing or profiling hooks.

    python tools/check_no_tracing.py [--under DIR]

A release build never sets ``HAREL_STORE_CYTHON_TRACE``: the hooks halve the speed. This
runs a few store calls, of the memory store and of a SQLite store, under ``sys.settrace``
and, where the interpreter has it (3.12+), ``sys.monitoring``, which is what Cython's
tracing reports to on 3.13; a traced build shows events in ``_store_c.pyx`` or in the
sources of ``harel_store._env.COMPILED_SOURCES`` (so does one of them loaded as Python), a
release build none. ``--under DIR`` also checks that every compiled module was imported
from below DIR (an installed wheel, not a checkout).
Standard library and harel_store only.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

PYX = "_store_c.pyx"


def sources() -> tuple[str, ...]:
    from harel_store._env import COMPILED_SOURCES

    return tuple(name.replace(".", "/") + ".py" for name in COMPILED_SOURCES)


def watched(filename: str) -> bool:
    return filename.replace("\\", "/").endswith((PYX, *sources()))


def exercise(store_type: Any) -> None:
    from harel_store import Commit, Execution, TimerOp
    from harel_store.sqlite import SqliteStore

    with SqliteStore(":memory:", trace_max=2) as durable:
        exe = Execution(id="d1", context={"path": ("a", "b")})
        durable.commit(exe, [("d2", {"n": 0})], "ev0", trace={"step": 0})
        durable.commit_many([Commit(exe, [("d2", {"n": 1})], "ev1", trace={"step": 1})])
        durable.read_trace("d1")
    store = store_type(trace_max=2)
    exe = Execution(id="e1", definition_id="probe")
    store.save(exe)
    for n in range(4):
        store.commit(
            store.load("e1"),
            [("e2", n)],
            processed_event_id=f"ev{n}",
            timers=[TimerOp("schedule", "a/b", float(n))],
            spawns=[(f"c{n}", "root", {})],
            trace={"step": n},
        )
    for entry in store.pending_outbox():
        store.ack_outbox(entry.seq)
    for entry in store.pending_spawns():
        store.ack_spawn(entry.seq)
    for execution_id, path, fire_at in store.due_timers(10.0):
        store.delete_timer(execution_id, path, fire_at)
    store.read_trace("e1")
    store.is_processed("e1", "ev0")


def settrace_events(store_type: Any) -> list[str]:
    events: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if watched(frame.f_code.co_filename):
            events.append(event)
        return tracer

    sys.settrace(tracer)
    try:
        exercise(store_type)
    finally:
        sys.settrace(None)
    return events


def monitoring_events(store_type: Any) -> list[str]:
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None:
        return []
    tool = next((t for t in range(6) if monitoring.get_tool(t) is None), None)
    if tool is None:
        return []
    events: list[str] = []
    wanted = {
        "PY_START": monitoring.events.PY_START,
        "LINE": monitoring.events.LINE,
        "PY_RETURN": monitoring.events.PY_RETURN,
    }

    def recorder(name: str) -> Any:
        def callback(code: Any, *args: Any) -> None:
            if watched(code.co_filename):
                events.append(name)

        return callback

    monitoring.use_tool_id(tool, "harel-store no-tracing check")
    try:
        mask = 0
        for name, event in wanted.items():
            monitoring.register_callback(tool, event, recorder(name))
            mask |= event
        monitoring.set_events(tool, mask)
        exercise(store_type)
    finally:
        monitoring.set_events(tool, 0)
        for event in wanted.values():
            monitoring.register_callback(tool, event, None)
        monitoring.free_tool_id(tool)
    return events


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--under", type=Path, help="the compiled module must load from below DIR")
    args = parser.parse_args()
    module = importlib.import_module("harel_store._store_c")
    where = Path(module.__file__ or "?").resolve()
    if args.under is not None:
        from harel_store._env import COMPILED_SOURCES

        for name in ("harel_store._store_c", *COMPILED_SOURCES):
            path = Path(importlib.import_module(name).__file__ or "?").resolve()
            if args.under.resolve() not in path.parents:
                print(f"FAIL: {name} loaded from {path}, not from below {args.under}")
                return 1
    found = settrace_events(module.DictStore) + monitoring_events(module.DictStore)
    if found:
        kinds = ", ".join(sorted(set(found)))
        print(
            f"FAIL: {where.name} or a module of COMPILED_SOURCES was built with line tracing,"
            f" or runs as Python ({len(found)} {kinds} events)"
        )
        return 1
    print(f"no line tracing: {where.name}, Cython {getattr(module, '__cython_version__', '?')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
