"""pyperf benchmarks of harel_store: the compiled store, the pure store, and the
specification typed in (``spec_port.py``), measured in the same run.

    python perf/bench_store.py -o perf/results.json          # everything, ~tens of minutes
    python perf/bench_store.py --rounds 1 -o x.json          # in one pass (default: 4 rounds)
    python perf/bench_store.py --impl compiled,pure -o x.json
    python perf/bench_store.py --bench '*commit*' -o x.json  # a subset (fnmatch, repeatable)
    python perf/report.py perf/results.json > perf/RESULTS.md

Benchmarks are named ``<impl>:<case>``, e.g. ``compiled:commit_typical``. Every case
checks, before it times anything, that the store it is about to measure is an instance
of the requested implementation, and the compiled one must come from a compiled
extension module: a run can never compare Python with Python. The cases of the store
protocol (``commit_typical_id_epoch``, ``commit_replayed``, ``claim_ack_<n>``) run for the
compiled and pure stores only: the spec port has no commit ids, epochs or claims.

Each time function builds its store outside the timed region and times a manual loop
of ``loops`` operations; pyperf divides by ``loops * inner_loops``. The cases that change
the store start every value from a fresh store; the typical commits (and their replays),
which leave entries behind, take a fresh store every ``COMMIT_CHUNK`` commits (see
``time_commit_typical``);
the read-only cases (``load_hit``, ``due_timers``) reuse their store for the whole worker.

A run is taken in ``--rounds`` rounds (default 4): the whole suite again and again, each
time with its share of the worker processes, all appended to one JSON file. On a shared
virtual machine the speed of the machine drifts over minutes; in rounds, every
implementation of a case samples the same stretches of the run, so the ratios between
them are not the ratio of two moments.

The garbage collector stays on while the clock runs, but every setup ends with
:func:`settle`: the collections in a timed region then work for what the timed operations
allocate, not for the store and the inputs built a moment before it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import inspect
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from importlib.machinery import EXTENSION_SUFFIXES
from time import perf_counter
from types import ModuleType
from typing import Any, NamedTuple

import pyperf
import spec_port

import harel_store
import harel_store._store_py
from harel_store import AsyncDictStore, Commit, Execution, TimerOp
from harel_store._demo import run as run_demo

IMPLS = ("compiled", "pure", "spec")
# The implementations with the protocol of issue 11 (commit ids, epochs, claims): the
# spec port has none of it, so its cases are not registered for it.
PROTOCOL_IMPLS = ("compiled", "pure")
IMPL_ALIASES = {"all": IMPLS, "both": ("compiled", "pure")}
IMPL_MODULES = {
    "compiled": "harel_store._store_c",
    "pure": "harel_store._store_py",
    "spec": spec_port.__name__,
}

DRAIN_ORDERS = ("fifo", "reverse", "shuffled")
COMMIT_CHUNK = 1_000  # typical commits per fresh store
CLAIM_LIMIT = 100  # entries per claim_outbox in the claim + ack cases (its default)
NOW = 1_700_000_000.0  # "now" for the timer cases, in epoch seconds
LATER = NOW + 3600.0  # a fire_at that is never due


# --- sizes ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    executions: int = 1_000  # executions (each with one armed timer) in the commit store
    trace_max: int = 200  # steps in the full trace ring
    drains: tuple[int, ...] = (10_000, 100_000)  # outbox entries per drain
    claims: tuple[int, ...] = (10_000, 100_000)  # outbox entries per claim + ack drain
    spec_drains: tuple[int, ...] = (10_000, 20_000)  # the spec's drain is quadratic
    timers: int = 100_000  # armed timers for due_timers
    due: int = 10  # of which due
    demo: int = 2_000  # orders driven through the demo workload


FULL = Sizes()
QUICK = replace(
    FULL,
    drains=(1_000, 4_000),
    spec_drains=(1_000, 2_000),
    claims=(1_000, 4_000),
    timers=5_000,
    demo=50,
)


def _k(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


# --- the implementations ----------------------------------------------------------


class Impl(NamedTuple):
    name: str
    module: ModuleType
    store_type: type[Any]
    async_type: type[Any]


def load_impl(name: str) -> Impl:
    """Import an implementation and prove it is the one the name promises."""
    module_name = IMPL_MODULES[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(
            f"bench_store: cannot import the {name} store ({module_name}): {exc}\n"
            "Build it first (pip install -e . or python setup.py build_ext --inplace), "
            "or choose others with --impl pure,spec"
        ) from exc
    if name == "spec":
        store_type, async_type = spec_port.SpecDictStore, spec_port.SpecAsyncDictStore
    else:
        store_type = module.DictStore
        namespace = {"_sync_type": store_type}
        async_type = type(f"Async{name.title()}DictStore", (AsyncDictStore,), namespace)
    if name == "compiled":
        path = getattr(module, "__file__", None) or ""
        if not path.endswith(tuple(EXTENSION_SUFFIXES)):
            raise SystemExit(f"bench_store: {module_name} is not a compiled extension: {path!r}")
        if inspect.isfunction(store_type.commit):
            raise SystemExit(f"bench_store: {module_name}.DictStore.commit is a Python function")
    return Impl(name, module, store_type, async_type)


def expect(impl: Impl, store: Any) -> None:
    """Fail unless ``store``, or the sync store an ``AsyncDictStore`` wraps, is ``impl``'s."""
    sync = store._store if isinstance(store, AsyncDictStore) else store
    kind = type(sync)
    if not isinstance(sync, impl.store_type) or kind.__module__ != impl.module.__name__:
        raise RuntimeError(f"{impl.name}: measuring a {kind.__module__}.{kind.__qualname__}")


# --- workload ---------------------------------------------------------------------


class UserExecution:
    """An engine's own execution class: a plain class with ``id`` and ``version``."""

    def __init__(self, id: str) -> None:
        self.id = id
        self.version = 0


EMITS = [("exe-1", {"type": "shipped", "order": 7}), (None, {"type": "audit"})]
SPAWNS = [("exe-0/pay", "root/fulfil/pay", {"order": 7, "amount": 12.5, "currency": "EUR"})]
STEP = {
    "event": "ship",
    "transition": "packing->shipped",
    "actions": ("notify",),
    "context_out": {"state": "shipped"},
}


def populate(sizes: Sizes) -> Iterator[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """The commit store, as ``(method, args, kwargs)`` calls so the sync and async
    stores are built by the same steps: ``sizes.executions`` executions, each with an
    armed ``root/wait`` timer, and a full trace ring for ``exe-0``."""
    for i in range(sizes.executions):
        exe = Execution(id=f"exe-{i}", definition_id="order")
        timer = TimerOp("schedule", "root/wait", LATER + i)
        yield "commit", (exe, ()), {"timers": [timer]}
    for _ in range(sizes.trace_max):
        yield "append_trace", ("exe-0", STEP), {}


def commit_store(impl: Impl, sizes: Sizes) -> Any:
    store = impl.store_type(trace_max=sizes.trace_max)
    expect(impl, store)
    for method, args, kwargs in populate(sizes):
        getattr(store, method)(*args, **kwargs)
    return store


def settle() -> None:
    """Collect, outside the clock, what a setup just allocated. An engine's store and its
    armed timers are old objects, long since moved to the oldest generation; a store built
    for a measurement is young, and without this the first collections of the timed region
    would traverse it (and the setup's garbage) for all implementations alike, measuring
    the harness rather than the operation."""
    gc.collect()


_read_only: dict[tuple[str, str], Any] = {}


def read_only_store(key: tuple[str, str], build: Callable[[], Any]) -> Any:
    """A store the timed code never changes, built once per process (pyperf runs one
    benchmark per worker, all of them with --in-process)."""
    if key not in _read_only:
        _read_only[key] = build()
    return _read_only[key]


# --- cases: each returns the seconds ``loops`` iterations took ------------------------


def time_load_hit(loops: int, impl: Impl, sizes: Sizes) -> float:
    store = read_only_store((impl.name, "load"), lambda: commit_store(impl, sizes))
    expect(impl, store)
    load = store.load
    key = f"exe-{sizes.executions // 2}"
    if load(key) is None:
        raise RuntimeError("load_hit misses")
    settle()
    t0 = perf_counter()
    for _ in range(loops):  # x10, inner_loops=10
        load(key)
        load(key)
        load(key)
        load(key)
        load(key)
        load(key)
        load(key)
        load(key)
        load(key)
        load(key)
    return perf_counter() - t0


def time_save_same(loops: int, impl: Impl, sizes: Sizes, cls: type[Any]) -> float:
    store = commit_store(impl, sizes)
    exe = cls("user-exe")
    store.save(exe)
    save = store.save
    settle()
    t0 = perf_counter()
    for _ in range(loops):  # x10, inner_loops=10
        save(exe)
        save(exe)
        save(exe)
        save(exe)
        save(exe)
        save(exe)
        save(exe)
        save(exe)
        save(exe)
        save(exe)
    elapsed = perf_counter() - t0
    if store.load(exe.id) is not exe or exe.version != 1 + 10 * loops:
        raise RuntimeError("save_same did not save")
    return elapsed


def time_commit_minimal(loops: int, impl: Impl, sizes: Sizes) -> float:
    store = commit_store(impl, sizes)
    exe = store.load("exe-0")
    commit = store.commit
    no_emits = ()
    settle()
    t0 = perf_counter()
    for _ in range(loops):
        commit(exe, no_emits)
    return perf_counter() - t0


def chunks(loops: int) -> Iterator[int]:
    """``loops`` split into runs of at most ``COMMIT_CHUNK``."""
    for start in range(0, loops, COMMIT_CHUNK):
        yield min(COMMIT_CHUNK, loops - start)


def typical_work(loops: int) -> list[tuple[str, list[TimerOp]]]:
    """Per commit, built before the clock starts: a fresh event id to mark processed,
    and a re-arm of ``exe-0``'s ``root/wait`` timer (armed by ``populate``) at a new
    ``fire_at``, as an engine re-entering a state would send."""
    return [(f"evt-{i}", [TimerOp("schedule", "root/wait", LATER + 0.5 + i)]) for i in range(loops)]


def time_commit_typical(loops: int, impl: Impl, sizes: Sizes) -> float:
    """2 emits, a fresh processed id, a re-armed timer, a spawn, a step into a full ring.

    Each commit leaves 2 outbox entries, a spawn and a processed mark behind. Left to
    grow for a whole value (``loops`` can reach 10^5), they would make the time per
    commit depend on ``loops`` (fresh memory, longer GC passes); an engine's relays
    drain between events instead. So every ``COMMIT_CHUNK`` commits start again from a
    freshly built store: a chunk leaves at most that many behind."""
    elapsed = 0.0
    for chunk in chunks(loops):
        store = commit_store(impl, sizes)
        exe = store.load("exe-0")
        commit = store.commit
        work = typical_work(chunk)
        settle()
        t0 = perf_counter()
        for event_id, rearm in work:
            commit(exe, EMITS, processed_event_id=event_id, timers=rearm, spawns=SPAWNS, trace=STEP)
        elapsed += perf_counter() - t0
        if (
            not store.is_processed("exe-0", work[-1][0])
            or len(store.read_trace("exe-0")) != sizes.trace_max
        ):
            raise RuntimeError("commit_typical did not commit")
    return elapsed


BATCH = 100  # commits per commit_many in commit_typical_batch


def batch_work(loops: int, store: Any, size: int) -> list[list[Commit]]:
    """``loops`` typical commits, one for each of ``exe-0`` to ``exe-<size - 1>`` in
    turn (two commits of one execution cannot share a batch), in batches of ``size``."""
    exes = [store.load(f"exe-{i}") for i in range(size)]
    work = [
        Commit(exes[i % size], EMITS, event_id, rearm, SPAWNS, STEP)
        for i, (event_id, rearm) in enumerate(typical_work(loops))
    ]
    return [work[k : k + size] for k in range(0, loops, size)]


def time_commit_typical_batch(loops: int, impl: Impl, sizes: Sizes, batched: bool) -> float:
    """``commit_typical``'s commit made on 100 executions in turn, with one
    ``commit_many`` per 100 (``batched``) or one ``commit`` each: time per commit."""
    elapsed = 0.0
    for chunk in chunks(loops):
        store = commit_store(impl, sizes)
        batches = batch_work(chunk, store, min(BATCH, sizes.executions))
        commit, commit_many = store.commit, store.commit_many
        settle()
        t0 = perf_counter()
        if batched:
            for batch in batches:
                commit_many(batch)
        else:
            for batch in batches:
                for exe, emits, event_id, rearm, spawns, step, _, _ in batch:
                    commit(
                        exe, emits, processed_event_id=event_id, timers=rearm, spawns=spawns,
                        trace=step,
                    )  # fmt: skip
        elapsed += perf_counter() - t0
        last = batches[-1][-1]
        if not store.is_processed(last.exe.id, last.processed_event_id):
            raise RuntimeError("commit_typical_batch did not commit")
    return elapsed


def time_commit_typical_id_epoch(loops: int, impl: Impl, sizes: Sizes) -> float:
    """``time_commit_typical`` with the protocol's two keywords: a fresh ``commit_id``
    per commit (built before the clock) and a constant ``epoch=1``, as a relay holding
    its claim on the execution sends them. Each commit also records its id and body."""
    elapsed = 0.0
    for chunk in chunks(loops):
        store = commit_store(impl, sizes)
        exe = store.load("exe-0")
        commit = store.commit
        work = [(e, r, f"commit-{i}") for i, (e, r) in enumerate(typical_work(chunk))]
        settle()
        t0 = perf_counter()
        for event_id, rearm, commit_id in work:
            commit(
                exe,
                EMITS,
                processed_event_id=event_id,
                timers=rearm,
                spawns=SPAWNS,
                trace=STEP,
                commit_id=commit_id,
                epoch=1,
            )
        elapsed += perf_counter() - t0
        if (
            not store.is_processed("exe-0", work[-1][0])
            or len(store.read_trace("exe-0")) != sizes.trace_max
        ):
            raise RuntimeError("commit_typical_id_epoch did not commit")
    return elapsed


def time_commit_replayed(loops: int, impl: Impl, sizes: Sizes) -> float:
    """A replay of a typical commit: the setup commits ``chunk`` typical commits of
    ``exe-0``, each with its own ``commit_id`` and ``epoch=1``; the clock then times each
    of them sent again, with the same id, body and epoch, as a writer retrying a commit
    whose first try landed. ``exe`` is the object ``load`` returns, the one the store
    holds, so its version is the store's and stays; a replay writes nothing. Chunked like
    ``time_commit_typical``, so the store a replay checks against is the same size."""
    elapsed = 0.0
    for chunk in chunks(loops):
        store = commit_store(impl, sizes)
        exe = store.load("exe-0")
        commit = store.commit
        work = [(e, r, f"commit-{i}") for i, (e, r) in enumerate(typical_work(chunk))]
        for event_id, rearm, commit_id in work:
            commit(
                exe,
                EMITS,
                processed_event_id=event_id,
                timers=rearm,
                spawns=SPAWNS,
                trace=STEP,
                commit_id=commit_id,
                epoch=1,
            )
        version = exe.version
        pending = len(store.pending_outbox())
        settle()
        t0 = perf_counter()
        for event_id, rearm, commit_id in work:
            commit(
                exe,
                EMITS,
                processed_event_id=event_id,
                timers=rearm,
                spawns=SPAWNS,
                trace=STEP,
                commit_id=commit_id,
                epoch=1,
            )
        elapsed += perf_counter() - t0
        if (
            exe.version != version
            or store.load("exe-0") is not exe
            or len(store.pending_outbox()) != pending
        ):
            raise RuntimeError("commit_replayed wrote something")
    return elapsed


def time_async_commit_typical(loops: int, impl: Impl, sizes: Sizes) -> float:
    """``time_commit_typical`` through the async store, awaited in a loop."""

    async def run() -> float:
        elapsed = 0.0
        for chunk in chunks(loops):
            store = impl.async_type(trace_max=sizes.trace_max)
            expect(impl, store)
            for method, args, kwargs in populate(sizes):
                await getattr(store, method)(*args, **kwargs)
            exe = await store.load("exe-0")
            commit = store.commit
            work = typical_work(chunk)
            settle()
            t0 = perf_counter()
            for event_id, rearm in work:
                await commit(
                    exe, EMITS, processed_event_id=event_id, timers=rearm, spawns=SPAWNS, trace=STEP
                )
            elapsed += perf_counter() - t0
            if not await store.is_processed("exe-0", work[-1][0]):
                raise RuntimeError("async_commit_typical did not commit")
        return elapsed

    return asyncio.run(run())


def time_trace_append_full(loops: int, impl: Impl, sizes: Sizes) -> float:
    store = commit_store(impl, sizes)
    append = store.append_trace
    settle()
    t0 = perf_counter()
    for _ in range(loops):
        append("exe-0", STEP)
    elapsed = perf_counter() - t0
    if len(store.read_trace("exe-0")) != sizes.trace_max:
        raise RuntimeError("trace_append_full: the ring is not full")
    return elapsed


def time_drain(loops: int, impl: Impl, entries: int, order: str) -> float:
    """``pending_outbox`` then ``ack_outbox`` per entry: oldest first (``fifo``), newest
    first (``reverse``), or in a fixed random order (``shuffled``, shuffled before the
    clock starts); inner_loops=entries, so pyperf reports the time per entry."""
    emits = [(f"exe-{i % 1000}", i) for i in range(entries)]
    exe = Execution(id="producer")
    total = 0.0
    for _ in range(loops):
        store = impl.store_type()
        expect(impl, store)
        store.commit(exe, emits)
        ack = store.ack_outbox
        settle()
        t0 = perf_counter()
        pending = store.pending_outbox()
        if order == "shuffled":
            total += perf_counter() - t0
            random.Random(entries).shuffle(pending)
            t0 = perf_counter()
        for entry in reversed(pending) if order == "reverse" else pending:
            ack(entry.seq)
        total += perf_counter() - t0
        if len(pending) != entries or store.pending_outbox():
            raise RuntimeError("drain did not drain")
        # Free this drain's entries here, not when the next drain's `pending = ...` drops
        # the last reference to them, inside its clock.
        del pending, ack, store
    return total


def time_claim_ack(loops: int, impl: Impl, entries: int) -> float:
    """A relay's drain through claims: the outbox filled with ``entries`` entries as
    ``time_drain`` fills it, then ``claim_outbox(limit=100)`` and ``ack_outbox`` of each
    entry it returns, until a claim returns nothing; inner_loops=entries, so pyperf
    reports the time per entry. The leases (30 s) never run out within the clock."""
    emits = [(f"exe-{i % 1000}", i) for i in range(entries)]
    exe = Execution(id="producer")
    total = 0.0
    for _ in range(loops):
        store = impl.store_type()
        expect(impl, store)
        store.commit(exe, emits)
        claim = store.claim_outbox
        ack = store.ack_outbox
        limit = CLAIM_LIMIT
        claimed = 0
        settle()
        t0 = perf_counter()
        while True:
            batch = claim(limit)
            if not batch:
                break
            for entry in batch:
                ack(entry.seq)
            claimed += len(batch)
        total += perf_counter() - t0
        if claimed != entries or store.pending_outbox():
            raise RuntimeError("claim_ack did not drain")
        del batch, claim, ack, store
    return total


def due_timers_store(impl: Impl, sizes: Sizes) -> Any:
    """``sizes.timers`` armed timers over executions of 100 paths each, in shuffled
    order; ``sizes.due`` of them due at ``NOW``."""
    fire_at = [NOW - 1.0 - i for i in range(sizes.due)]
    fire_at += [LATER + i for i in range(sizes.timers - sizes.due)]
    random.Random(20240601).shuffle(fire_at)
    store = impl.store_type()
    expect(impl, store)
    for start in range(0, sizes.timers, 100):
        chunk = fire_at[start : start + 100]
        ops = [TimerOp("schedule", f"root/s{i}", fa) for i, fa in enumerate(chunk)]
        store.commit(Execution(id=f"exe-{start // 100}"), (), timers=ops)
    if len(store.due_timers(NOW)) != sizes.due:
        raise RuntimeError("due_timers: wrong number of due timers")
    return store


def time_due_timers(loops: int, impl: Impl, sizes: Sizes) -> float:
    store = read_only_store((impl.name, "due_timers"), lambda: due_timers_store(impl, sizes))
    expect(impl, store)
    due_timers = store.due_timers
    now = NOW
    settle()
    t0 = perf_counter()
    for _ in range(loops):
        due_timers(now)
    return perf_counter() - t0


def time_demo(loops: int, impl: Impl, sizes: Sizes, executions: int) -> float:
    """The workload of ``python -m harel_store`` (``harel_store._demo.run``) at
    ``sizes.demo`` orders. The time is the run's own ``elapsed``, which covers the
    workflow and not the checks it makes afterwards; inner_loops is the number of
    executions a run creates (orders, their region children, the two services), so
    pyperf reports the time per execution: executions per second is 1 / that."""
    store_type = spec_port.SpecDemoStore if impl.name == "spec" else impl.store_type

    def factory() -> Any:
        store = store_type()
        expect(impl, store)
        return store

    total = 0.0
    for _ in range(loops):
        result = run_demo(sizes.demo, factory)
        if result["problems"] or result["executions"] != executions:
            raise RuntimeError(f"demo: {result['executions']} executions, {result['problems']}")
        total += result["elapsed"]
    return total


def demo_executions(sizes: Sizes) -> int:
    """How many executions a demo run creates: it is seeded, so every run creates as
    many, whatever the store."""
    return run_demo(sizes.demo, harel_store._store_py.DictStore)["executions"]


# --- the suite --------------------------------------------------------------------


class Case(NamedTuple):
    name: str
    func: Callable[..., float]
    args: tuple[Any, ...]
    inner_loops: int = 1
    per: str = "call"  # what one reported time covers


def cases(impl: Impl, sizes: Sizes, executions: int) -> list[Case]:
    drains = sizes.spec_drains if impl.name == "spec" else sizes.drains
    suite = [
        Case("load_hit", time_load_hit, (impl, sizes), 10),
        Case("save_same_execution", time_save_same, (impl, sizes, Execution), 10),
        Case("save_same_user_object", time_save_same, (impl, sizes, UserExecution), 10),
        Case("commit_minimal", time_commit_minimal, (impl, sizes)),
        Case("commit_typical", time_commit_typical, (impl, sizes)),
    ]
    if impl.name in PROTOCOL_IMPLS:
        suite += [
            Case("commit_typical_id_epoch", time_commit_typical_id_epoch, (impl, sizes)),
            Case("commit_replayed", time_commit_replayed, (impl, sizes)),
            Case("commit_typical_batch", time_commit_typical_batch, (impl, sizes, True)),
            Case("commit_typical_singles", time_commit_typical_batch, (impl, sizes, False)),
        ]
    suite.append(Case("trace_append_full", time_trace_append_full, (impl, sizes)))
    for order in DRAIN_ORDERS:
        for n in drains:
            args = (impl, n, order)
            suite.append(Case(f"drain_{order}_{_k(n)}", time_drain, args, n, "entry"))
    if impl.name in PROTOCOL_IMPLS:
        for n in sizes.claims:
            suite.append(Case(f"claim_ack_{_k(n)}", time_claim_ack, (impl, n), n, "entry"))
    suite += [
        Case(f"due_timers_{_k(sizes.timers)}", time_due_timers, (impl, sizes)),
        Case("async_commit_typical", time_async_commit_typical, (impl, sizes)),
        Case(demo_name(sizes), time_demo, (impl, sizes, executions), executions, "execution"),
    ]
    return suite


def demo_name(sizes: Sizes) -> str:
    return f"demo_orders_{_k(sizes.demo)}"


def parse_impls(text: str) -> tuple[str, ...]:
    names: list[str] = []
    for word in text.split(","):
        word = word.strip()
        for name in IMPL_ALIASES.get(word, (word,)):
            if name not in IMPLS:
                raise argparse.ArgumentTypeError(
                    f"unknown implementation {name!r}: choose from {', '.join(IMPLS)}, all, both"
                )
            if name not in names:
                names.append(name)
    return tuple(names)


def add_cmdline_args(cmd: list[str], args: argparse.Namespace) -> None:
    """Hand our own options to the worker processes pyperf spawns."""
    cmd.extend(("--impl", ",".join(args.impl)))
    if args.quick:
        cmd.append("--quick")
    for pattern in args.bench or ():
        cmd.extend(("--bench", pattern))
    if args.demo_executions is not None:
        cmd.extend(("--demo-executions", str(args.demo_executions)))


def round_shares(processes: int, rounds: int) -> list[int]:
    """``processes`` worker processes split over at most ``rounds`` rounds, none empty."""
    rounds = max(1, min(rounds, processes))
    share, extra = divmod(processes, rounds)
    return [share + (i < extra) for i in range(rounds)]


def run_rounds(
    script: str,
    args: argparse.Namespace,
    argv: list[str],
    per_round: Callable[[int], list[str]] = lambda number: [],
    replaced: tuple[str, ...] = (),
) -> int:
    """Run ``script`` once per round of ``round_shares(args.processes, args.rounds)``,
    each with its share of the worker processes, into one JSON file: ``-o`` for the
    first round (so an existing file is still refused), ``--append`` for the others;
    without either, into a temporary file that pyperf shows at the end.

    Each round is given ``argv`` less the options it gets anew: its processes, the
    values per process pyperf resolved (``--fast`` and ``--rigorous`` would resolve them
    again, from the default processes), the output, the options named in ``replaced``,
    which ``per_round(i)`` gives again for round ``i`` (from 0)."""
    strip = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--fast", "--rigorous"):
        strip.add_argument(flag, action="store_true")
    for option in ("--rounds", "--append", *replaced):
        strip.add_argument(option)
    strip.add_argument("-o", "--output")
    strip.add_argument("-p", "--processes")
    strip.add_argument("-n", "--values")
    _, rest = strip.parse_known_args(argv)
    shares = round_shares(args.processes, args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        target = args.output or args.append or os.path.join(tmp, "rounds.json")
        for number, share in enumerate(shares):
            cmd = [sys.executable, os.path.abspath(script), *rest, "--rounds", "1"]
            cmd += ["--processes", str(share), "--values", str(args.values), *per_round(number)]
            cmd += ["-o" if number == 0 and args.output else "--append", target]
            print(
                f"--- round {number + 1} of {len(shares)}: {share} processes a benchmark",
                flush=True,
            )
            code = subprocess.call(cmd)
            if code:
                return code
        if not (args.output or args.append):
            return subprocess.call([sys.executable, "-m", "pyperf", "show", target])
    return 0


@contextmanager
def few_processes(runner: pyperf.Runner, processes: int) -> Iterator[None]:
    """Run the benchmarks registered inside with at most ``processes`` workers of one
    value each. The manager reads ``runner.args`` when a benchmark starts, so this only
    changes how many values are taken, not how each is measured."""
    args = runner.args
    saved = args.processes, args.values
    args.processes, args.values = min(args.processes, processes), 1
    try:
        yield
    finally:
        args.processes, args.values = saved


def main() -> None:
    runner = pyperf.Runner(add_cmdline_args=add_cmdline_args)
    parser = runner.argparser
    parser.add_argument(
        "--impl",
        type=parse_impls,
        default=IMPLS,
        help="comma-separated implementations to measure: compiled, pure, spec; "
        "'both' is compiled,pure; 'all' (the default) adds the spec port",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke mode: shrink the drains and timer counts so the suite runs in seconds "
        "(the figures then say nothing; combine with --processes 1 --values 1 --loops 1)",
    )
    parser.add_argument(
        "--bench",
        action="append",
        metavar="PATTERN",
        help="only the benchmarks whose name matches this fnmatch pattern; repeatable",
    )
    parser.add_argument(
        "--spec-drain-processes",
        type=int,
        default=4,
        metavar="N",
        help="workers (one value each) for the spec's quadratic drains, whose single "
        "value takes seconds (default: 4)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        metavar="N",
        help="split the worker processes of every benchmark over N passes of the whole "
        "suite, appended to one JSON file, so that all implementations sample the same "
        "stretches of the run (default: 4; never more rounds than processes)",
    )
    parser.add_argument("--demo-executions", type=int, help=argparse.SUPPRESS)
    args = runner.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    if args.spec_drain_processes < 1:
        parser.error(f"--spec-drain-processes must be at least 1, not {args.spec_drain_processes}")
    rounds = len(round_shares(args.processes, args.rounds))
    if not args.worker and rounds > 1:
        # The spec's drains take one process a round at least.
        spec = round_shares(args.spec_drain_processes, rounds)
        spec += [1] * (rounds - len(spec))

        def drains(number: int) -> list[str]:
            return ["--spec-drain-processes", str(spec[number])]

        sys.exit(run_rounds(__file__, args, sys.argv[1:], drains, ("--spec-drain-processes",)))
    sizes = QUICK if args.quick else FULL
    runner.metadata["harel_sizes"] = "quick" if args.quick else "full"
    runner.metadata["harel_version"] = harel_store.__version__

    def selected(name: str) -> bool:
        return not args.bench or any(fnmatchcase(name, p) for p in args.bench)

    impls = [load_impl(name) for name in args.impl]
    if args.demo_executions is None:  # the main process counts; workers are told
        demo = any(selected(f"{impl.name}:{demo_name(sizes)}") for impl in impls)
        args.demo_executions = demo_executions(sizes) if demo else 1
    # Case by case, so the implementations of one case run close together in time; the
    # drains of one order stay together although the spec port's sizes differ.
    groups: dict[str, list[tuple[Impl, Case]]] = {}
    for impl in impls:
        for case in cases(impl, sizes, args.demo_executions):
            sized = case.func is time_drain or case.func is time_claim_ack
            family = case.name.rpartition("_")[0] if sized else case.name
            groups.setdefault(family, []).append((impl, case))
    for group in groups.values():
        for impl, case in group:
            name = f"{impl.name}:{case.name}"
            if not selected(name):
                continue
            metadata = {"harel_impl": impl.name, "harel_case": case.name, "harel_per": case.per}
            slow = impl.name == "spec" and case.func is time_drain
            with few_processes(runner, args.spec_drain_processes) if slow else nullcontext():
                runner.bench_time_func(
                    name, case.func, *case.args, inner_loops=case.inner_loops, metadata=metadata
                )


if __name__ == "__main__":
    main()
