"""``python -m harel_store [demo]``: drive many orders through a small workflow on a
store and report the throughput (see :mod:`harel_store._demo`), or say what is
installed (``--info``).

``--store URL`` picks the store (default: ``$HAREL_STORE_URL``, else ``memory:``). On a
durable store the run is resumable (``--resume``) and its relays may run in worker
processes (``--workers N``).

Exits 0 when the run checked out, 1 when it did not (or the store could not be opened),
2 on a usage error (a bad option or URL, or a store that cannot take the run); 130 or
143 when SIGINT or SIGTERM stopped it, saying how far it got and how to finish. A
``--resume`` of a run that had finished says so and exits 0, or 1 if that run failed
its checks.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
from time import perf_counter
from types import ModuleType
from typing import Any, cast

from .._demo import DemoResult, DemoStore
from .._demo import run as run_local
from .._demo.durable import DEFAULT_ORDERS, SHARDS, Coordinator, default_orders, run_durable
from .._demo.relay import LEASE, Refused
from .._env import NO_EXTENSIONS, REQUIRE_EXTENSIONS
from .._store import IMPLEMENTATION
from .._store_py import DictStore as PureDictStore
from .._version import __version__
from ._common import (
    PROG,
    SIGNALS,
    URL_ENV,
    Command,
    Interrupted,
    Sheltered,
    StoreURL,
    UsageError,
    count,
    deferred,
    execute,
    poll,
    seconds,
    whole_number,
)

SUMMARY = "drive orders through a workflow on a store, check them, report the throughput"
DESCRIPTION = (
    "Drive N orders through an order-handling workflow (emits, timers, AND-state spawns, "
    "joins, redeliveries, timeouts) using only the store's public API, check the "
    "outcome, and report the throughput. On a durable store (SQLite, PostgreSQL) the run "
    "lives in the store: stopped, it is finished by --resume, and --workers N runs its "
    "relays in N processes."
)
PROGRESS_EVERY = 1.0  # seconds between two progress lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    memory, sqlite, postgres = (DEFAULT_ORDERS[kind] for kind in ("memory", "sqlite", "postgresql"))
    parser.add_argument(
        "-n",
        "--executions",
        type=count,
        default=None,
        metavar="N",
        help="orders to drive; each completed one also spawns two region children "
        f"(default: {memory:,} on a memory store, {sqlite:,} on SQLite, {postgres:,} on "
        "PostgreSQL, so that a run takes well under a minute; with --resume, the "
        "recorded number)",
    )
    parser.add_argument(
        "--seed",
        type=whole_number,
        default=None,
        help="random seed (default: 1; with --resume, the recorded seed)",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help=f"the store to run on: memory: (the default, unless ${URL_ENV} names "
        "another), sqlite:///path.db, sqlite:// (SQLite in memory), postgresql://...",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="on a durable store, finish the run it holds (one that was stopped or "
        "killed partway), or start one if it is empty; a run that had finished is "
        "reported in one line (exit 0, or 1 if it failed its checks); without --resume, "
        "a store holding an unfinished run is refused",
    )
    parser.add_argument(
        "--workers",
        type=count,
        metavar="N",
        default=None,
        help="run the relays and sweepers in N worker processes sharing the database "
        "(a SQLite file or PostgreSQL); this process keeps the clock and admits orders",
    )
    parser.add_argument(
        "--lease",
        type=seconds,
        default=LEASE,
        metavar="SECONDS",
        help="how long a relay's claim holds on a durable store; a stopped run's claims "
        "go to the resumed run, or to the other workers, after this (default: %(default)g)",
    )
    parser.add_argument(
        "--no-batch",
        action="store_true",
        help="on a durable store, write each transition with its own commit and each ack "
        "on its own, as an engine that does not batch (default: the relays write what "
        "they claimed with one commit_many per wave and the batch acks)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="on a durable store, keep the orders the run finished, with their children, "
        "marks, commit ids and traces, and the services and the ledger, so that inspect, "
        "show, prune and copy have something to show after it (default: finished orders "
        "are forgotten as the run goes); a store holding a kept run takes no new run",
    )
    parser.add_argument(
        "--shards",
        type=count,
        metavar="K",
        default=None,
        help="on a durable store, split each shared service (inventory, payment) and the "
        "ledger into K executions, order i going to shard i %% K, so that a batch holds K "
        f"of their transitions instead of one (default: {SHARDS} when batched, 1 with "
        "--no-batch; with --resume, the recorded number)",
    )
    parser.add_argument(
        "--pure",
        action="store_true",
        help="use the pure-Python store even if the compiled one loads (memory: only)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--info",
        action="store_true",
        help="print the version, the implementation, the store module's file, the Python "
        "version and the Cython version of the compiled store, then exit",
    )
    parser.add_argument("--version", action="version", version=f"harel-store {__version__}")


def main(argv: list[str] | None = None) -> int:
    """``python -m harel_store demo ARGV``: the exit code."""
    return execute(
        cast(Command, sys.modules[__name__]), PROG, sys.argv[1:] if argv is None else argv
    )


def run(args: argparse.Namespace) -> int:
    store, implementation = _store(args.pure)
    if args.info:
        _info(store, implementation)
        return 0
    url = StoreURL.choose(args.store, "--store", "memory:")
    url.check()
    if url.scheme == "memory":
        for flag, given in (("--keep", args.keep), ("--shards", args.shards is not None)):
            if given:
                raise UsageError(f"{flag} needs a durable store: {url.named} keeps nothing")
        if args.workers is not None:
            raise UsageError(
                "--workers needs a database the worker processes share: a SQLite file "
                "(--store sqlite:///path.db) or PostgreSQL (--store postgresql://...); "
                f"{url.named} is the memory of one process"
            )
        if args.resume:
            raise UsageError(
                f"--resume needs a durable store: {url.named} starts empty in every process"
            )
        return _memory(args, store, implementation)
    if args.pure:
        raise UsageError(f"--pure picks the pure-Python memory store; --store is {url.named}")
    return _durable(args, url)


def _store(pure: bool) -> tuple[type[DemoStore], str]:
    if pure:
        return PureDictStore, "pure"
    from .._store import DictStore

    return DictStore, IMPLEMENTATION


def _module(store: type[Any]) -> ModuleType:
    return sys.modules[store.__module__]


def _public_module(store: type[Any]) -> str:
    """The module a user imports ``store`` from: ``harel_store.sqlite``, not the private
    module of the package that defines it."""
    parts = store.__module__.split(".")
    for at, part in enumerate(parts[1:], 1):
        if part.startswith("_"):
            return ".".join(parts[:at])
    return store.__module__


def _info(store: type[DemoStore], implementation: str) -> None:
    module = _module(store)
    if implementation == "compiled":
        cython = str(getattr(module, "__cython_version__", "unknown"))
    else:
        cython = "not used (pure-Python store)"
    switches = ", ".join(
        f"{name}={os.environ[name]!r}" if name in os.environ else f"{name} unset"
        for name in (NO_EXTENSIONS, REQUIRE_EXTENSIONS)
    )
    python = f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})"
    print(f"harel-store {__version__}")
    print(f"implementation: {implementation}")
    print(f"store module:   {module.__name__}")
    print(f"store file:     {module.__file__}")
    print(f"python:         {python}")
    print(f"cython:         {cython}")
    print(f"environment:    {switches}")


class _Progress:
    """What the run has done so far, for the line a signal prints; on stderr about once
    a second unless ``quiet``."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.start = self.last = perf_counter()
        self.finished = self.before = 0
        self.total: int | None = None

    def begin(self, total: int, finished_before: int = 0) -> None:
        """The run starts: ``finished_before`` of its ``total`` orders finished before
        (a resumed run); rates count the others only."""
        self.start = self.last = perf_counter()
        self.total, self.finished, self.before = total, finished_before, finished_before

    def __call__(self, finished: int, total: int) -> None:
        self.finished, self.total = finished, total
        now = perf_counter()
        if self.quiet or now - self.last < PROGRESS_EVERY:
            return
        self.last = now
        elapsed = now - self.start
        share = f" ({100 * finished / total:.0f}%)" if total else ""
        rate = (finished - self.before) / elapsed if elapsed > 0 else 0.0
        self._say(
            f"  {finished:,}/{total:,} orders finished{share}, {elapsed:.1f} s, "
            f"{rate:,.0f} orders/s"
        )

    def waiting(self, items: int) -> None:
        """The run waits for work that a stopped process claimed."""
        if not self.quiet:
            self._say(
                f"  waiting for the leases on {items:,} items of work to run out (a process "
                f"that stopped had claimed them), {perf_counter() - self.start:.1f} s"
            )

    @staticmethod
    def _say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)


def _memory(args: argparse.Namespace, store: type[DemoStore], implementation: str) -> int:
    n: int = args.executions or DEFAULT_ORDERS["memory"]
    seed: int = 1 if args.seed is None else args.seed
    print(f"harel-store {__version__}: {implementation} store ({_module(store).__name__})")
    print(f"driving {n:,} orders through the order workflow (seed {seed})", flush=True)
    progress = _Progress(args.quiet)
    progress.begin(n)
    result: DemoResult | None = None
    try:
        result = run_local(n, store, progress=progress, seed=seed)
        return _report(result, f"{implementation} store")
    except SIGNALS as exc:
        if result is not None:
            raise Interrupted(exc, "the run had finished; its report was cut short") from None
        raise Interrupted(
            exc,
            f"{progress.finished:,} of {n:,} orders had finished; a memory store keeps "
            "nothing of the run: run it again to see it through (-n N runs fewer orders)",
        ) from None


def _durable(args: argparse.Namespace, url: StoreURL) -> int:
    where = url.named
    store = url.open()
    progress = _Progress(args.quiet)
    coord: Coordinator | None = None
    result: DemoResult | None = None
    private = getattr(store, "path", None) == ":memory:"
    sheltered = Sheltered(store)  # a signal waits for the store call it comes in to end
    try:
        try:
            if private:
                if args.workers is not None:
                    raise UsageError(
                        f"--workers needs a database the worker processes share: {where} "
                        "is private to one connection; use sqlite:///path.db or "
                        "postgresql://..."
                    )
                for flag, given in (("--resume", args.resume), ("--keep", args.keep)):
                    if given:
                        raise UsageError(
                            f"{flag} needs a database that outlives the process: {where}"
                        )
            coord = Coordinator(
                sheltered,
                where,
                batch=not args.no_batch,
                keep=args.keep or None,
                shards=args.shards,
            )
            try:
                coord.open(args.executions, args.seed, args.resume, default_n=default_orders(store))
            except Refused as exc:
                raise UsageError(str(exc)) from None
            if coord.phase == "done":
                return _finished(coord.conclude_finished(), coord, where)
            kind = type(store).__name__
            print(f"harel-store {__version__}: {kind} ({_public_module(type(store))}) at {where}")
            if coord.note:
                print(coord.note)
            n, seed = coord.n, coord.seed
            if coord.resumed:
                print(
                    f"resuming the run of {n:,} orders (seed {seed}) at tick {coord.tick}: "
                    f"{coord.finished_before:,} orders finished before; its claims are "
                    "taken over as their leases run out",
                    flush=True,
                )
            else:
                print(f"driving {n:,} orders through the order workflow (seed {seed})", flush=True)
            progress.begin(n, coord.finished_before)
            if args.workers is not None:
                from .._demo.workers import run_workers

                print(f"relays and sweepers in {args.workers} worker processes", flush=True)
                result = run_workers(
                    url.url,
                    coord,
                    args.workers,
                    lease=args.lease,
                    progress=progress,
                    waiting=progress.waiting,
                    batch=not args.no_batch,
                )
            else:
                result = run_durable(
                    sheltered,
                    where=where,
                    coordinator=coord,
                    batch=not args.no_batch,
                    lease=args.lease,
                    progress=progress,
                    waiting=progress.waiting,
                )
        finally:
            with deferred():
                store.close()
        poll()
        result["batched"] = not args.no_batch
        return _report(result, kind)
    except SIGNALS as exc:
        if result is not None:
            raise Interrupted(exc, "the run had finished; its report was cut short") from None
        raise Interrupted(exc, _stopped(args, url, coord, progress, private)) from None


def _stopped(
    args: argparse.Namespace,
    url: StoreURL,
    coord: Coordinator | None,
    progress: _Progress,
    private: bool,
) -> str:
    """What a run stopped by a signal did, and how to finish it."""
    if private:
        return (
            f"{url.named} keeps nothing once the process ends: run it again to see the run through"
        )
    if url.from_env:
        command = f"{PROG} --resume"
        env = f" (with {URL_ENV} as now)"
    else:
        command = f"{PROG} --store {shlex.quote(url.shown)} --resume"
        env = ""
    if args.workers is not None:
        command += f" --workers {args.workers}"
    if coord is None or progress.total is None:
        return f"the run in {url.named} was starting; {command}{env} starts or finishes it"
    return (
        f"{progress.finished:,} of {progress.total:,} orders finished, and the run is kept "
        f"in {url.named}; {command}{env} finishes it"
    )


def _finished(result: DemoResult, coord: Coordinator, where: str) -> int:
    """A --resume of a run that had finished: one line, exit 0 (1 if it failed its checks)."""
    context = coord.driver.context
    done = ", ".join(
        f"{context[key]:,} {what}"
        for key, what in (("completed", "completed"), ("timed_out", "timed out"))
        if key in context
    )
    what = f"{coord.n:,} orders (seed {coord.seed}" + (f"; {done})" if done else ")")
    problems = result["problems"]
    if problems:
        print(
            f"the run in {where} had finished: {what}, and {len(problems)} of its checks "
            f"failed ({problems[0]}); nothing to resume (without --resume, a new run starts)",
            file=sys.stderr,
        )
        return 1
    after = (
        "it is kept (--keep): a new run needs an empty database"
        if coord.keep
        else "without --resume, a new run starts"
    )
    print(
        f"the run in {where} had finished: {what}, and passed its checks; nothing to "
        f"resume ({after})"
    )
    return 0


def _report(result: DemoResult, what: str) -> int:
    before = result.get("finished_before", 0)
    earlier = (
        f"; {result['notifications'] - before:,} finished in this run, {before:,} before it"
        if result.get("resumed")
        else ""
    )
    print(
        f"orders:      {result['orders']:,} ({result['completed']:,} completed, "
        f"{result['timed_out']:,} timed out{earlier})"
    )
    shards = result.get("shards", 1)
    services = "2 services" if shards == 1 else f"2 services in {shards} shards each"
    print(f"executions:  {result['executions']:,} (orders, their region children, {services})")
    print(
        f"commits:     {result['commits']:,}; events delivered {result['events_delivered']:,}, "
        f"redeliveries skipped {result['redeliveries_skipped']:,}, duplicate spawns skipped "
        f"{result['duplicate_spawns_skipped']:,}, timers fired {result['timers_fired']:,}"
    )
    if "resumed" in result:
        note = (
            " (resumed: its commits, events, timers and rates are this run's)"
            if result["resumed"]
            else ""
        )
        print(
            f"run {result['runs']} of the demonstration in this store{note}; CAS conflicts "
            f"retried {result['conflicts']:,}"
        )
    kept = result.get("kept", False)
    how = "kept (--keep)" if kept else "finished ones are forgotten"
    print(f"peak live executions: {result['peak_live_executions']:,} ({how})")
    print(f"store stats at the end: {result['stats']}")
    if kept:
        print(
            "kept (--keep): every order with its children, marks, commit ids and trace, "
            "the services, the ledger and the driver"
        )
    else:
        forgot = (
            "the services and the ledger (the driver stays: it records the finished run)"
            if "resumed" in result
            else "the two services"
        )
        print(f"after forgetting {forgot}: {result['stats_after_forget']}")
    for worker in result.get("workers", []):
        if not worker["worker"]:  # the relay of this process
            continue
        if worker["lost"] or worker["error"]:
            how = "failed" if worker["error"] else "was lost (killed?)"
            print(
                f"worker {worker['worker']} (pid {worker['pid']}): {how} before it reported; "
                "its claims went to the others as their leases ran out"
            )
            continue
        print(
            f"worker {worker['worker']} (pid {worker['pid']}): {worker['commits']:,} commits "
            f"in {worker['elapsed']:.3f} s, {worker['commits_per_s']:,.0f} commits/s; "
            f"{worker['events_delivered']:,} events delivered, {worker['timers_fired']:,} "
            f"timers fired, {worker['children_created']:,} children created, "
            f"{worker['orders_retired']:,} orders retired, {worker['conflicts']:,} conflicts"
        )
    if "batched" in result:
        how = (
            "batched: one commit_many per wave of a relay's round, batch acks"
            if result["batched"]
            else "not batched (--no-batch): one commit per transition, one ack per item"
        )
        print(
            f"throughput: {result['commits_per_s']:,.0f} transitions/s, "
            f"{result['executions_per_s']:,.0f} executions/s ({how})"
        )
    print(
        f"elapsed {result['elapsed']:.3f} s: {result['orders_per_s']:,.0f} orders/s, "
        f"{result['executions_per_s']:,.0f} executions/s, "
        f"{result['commits_per_s']:,.0f} commits/s ({what})"
    )
    return _verdict(result)


def _verdict(result: DemoResult) -> int:
    if result["problems"]:
        print(f"FAILED: {len(result['problems'])} check(s) did not hold:", file=sys.stderr)
        for problem in result["problems"][:20]:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print("OK: every order completed or timed out as planned; all counts agree")
    return 0
