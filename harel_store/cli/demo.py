"""``python -m harel_store``: drive many orders through a small workflow on a store and
report the throughput (see :mod:`harel_store._demo`), or say what is installed (``--info``).

``--store URL`` picks the store (default: ``$HAREL_STORE_URL``, else ``memory:``). On a
durable store the run is resumable (``--resume``) and its relays may run in worker
processes (``--workers N``). ``python -m harel_store copy SRC_URL DST_URL`` copies a
store (:mod:`harel_store._copy`).

Exits 0 when the run checked out, 1 when it did not, 2 on a usage error (a bad option,
or a store that cannot take the run).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
from collections.abc import Sequence
from time import perf_counter
from types import ModuleType
from typing import Any

from .._demo import DemoResult, DemoStore, run
from .._demo.durable import DEFAULT_ORDERS, LEASE, Coordinator, Refused, run_durable
from .._env import NO_EXTENSIONS, REQUIRE_EXTENSIONS
from .._errors import StoreError
from .._open import open_store, redact
from .._store import IMPLEMENTATION
from .._store_py import DictStore as PureDictStore
from .._version import __version__

PROG = "python -m harel_store"
URL_ENV = "HAREL_STORE_URL"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number more than 0, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Drive N orders through an order-handling workflow (emits, timers, AND-state "
            "spawns, joins, redeliveries, timeouts) using only the store's public API, "
            "check the outcome, and report the throughput. "
            "(python -m harel_store copy SRC_URL DST_URL copies a store: see its --help.)"
        ),
    )
    parser.add_argument(
        "-n",
        "--executions",
        type=_positive,
        default=None,
        metavar="N",
        help="orders to drive; each completed one also spawns two region children "
        f"(default: {DEFAULT_ORDERS}; with --resume, the recorded number)",
    )
    parser.add_argument(
        "--seed",
        type=int,
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
        help="on a durable store, finish the run it holds (one that was killed partway), "
        "or start one if it is empty; without it, a store holding a run is refused",
    )
    parser.add_argument(
        "--workers",
        type=_positive,
        metavar="N",
        default=None,
        help="run the relays and sweepers in N worker processes sharing the database "
        "(a SQLite file or PostgreSQL); this process keeps the clock and admits orders",
    )
    parser.add_argument(
        "--lease",
        type=_seconds,
        default=LEASE,
        metavar="SECONDS",
        help="how long a relay's claim holds on a durable store; a killed run's claims "
        "go to the resumed run, or to the other workers, after this (default: %(default)g)",
    )
    parser.add_argument(
        "--pure",
        action="store_true",
        help="use the pure-Python store even if the compiled one loads (memory: only)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--info",
        action="store_true",
        help="print the version, the implementation, the store module's file, the Python "
        "version and the Cython version of the compiled store, then exit",
    )
    parser.add_argument("--version", action="version", version=f"harel-store {__version__}")
    return parser


def _store(pure: bool) -> tuple[type[DemoStore], str]:
    if pure:
        return PureDictStore, "pure"
    from .._store import DictStore

    return DictStore, IMPLEMENTATION


def _module(store: type[Any]) -> ModuleType:
    return sys.modules[store.__module__]


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
    """Prints to stderr about once a second."""

    def __init__(self) -> None:
        self.start = self.last = perf_counter()

    def __call__(self, finished: int, total: int) -> None:
        now = perf_counter()
        if now - self.last >= 1.0:
            self.last = now
            print(
                f"  {finished:,}/{total:,} orders finished ({100 * finished / total:.0f}%), "
                f"{now - self.start:.1f} s",
                file=sys.stderr,
                flush=True,
            )


def _usage_error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "copy" in argv:
        at = argv.index("copy")
        if all(arg == "--quiet" for arg in argv[:at]):  # the one option both commands take
            from .copy import main as copy

            return copy(argv[:at] + argv[at + 1 :])
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest[:1] == ["copy"]:
        parser.error(
            "copy takes its own options, after it: python -m harel_store copy [--quiet] "
            "SRC_URL DST_URL"
        )
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    store, implementation = _store(args.pure)
    if args.info:
        _info(store, implementation)
        return 0
    url: str = args.store or os.environ.get(URL_ENV) or "memory:"
    progress = None if args.quiet else _Progress()
    if url.partition(":")[0].lower() == "memory":
        if args.workers is not None:
            return _usage_error(
                "--workers needs a database the worker processes share: a SQLite file "
                "(--store sqlite:///path.db) or PostgreSQL (--store postgresql://...); "
                f"{redact(url)} is the memory of one process"
            )
        if args.resume:
            return _usage_error(
                f"--resume needs a durable store: {redact(url)} starts empty in every process"
            )
        try:
            open_store(url).close()  # the URL's own checks
        except ValueError as exc:
            return _usage_error(str(exc))
        return _memory(args, store, implementation, progress)
    if args.pure:
        return _usage_error(f"--pure picks the pure-Python memory store; --store is {redact(url)}")
    return _durable(args, url, progress)


def _memory(
    args: argparse.Namespace, store: type[DemoStore], implementation: str, progress: Any
) -> int:
    n: int = args.executions or DEFAULT_ORDERS
    seed: int = 1 if args.seed is None else args.seed
    print(f"harel-store {__version__}: {implementation} store ({_module(store).__name__})")
    print(f"driving {n:,} orders through the order workflow (seed {seed})", flush=True)
    result = run(n, store, progress=progress, seed=seed)
    return _report(result, f"{implementation} store")


def _durable(args: argparse.Namespace, url: str, progress: Any) -> int:
    where = redact(url)
    try:
        store = open_store(url)
    except (ValueError, ImportError, StoreError) as exc:
        return _usage_error(str(exc))
    with store:
        if getattr(store, "path", None) == ":memory:":
            if args.workers is not None:
                return _usage_error(
                    f"--workers needs a database the worker processes share: {where} is "
                    "private to one connection; use sqlite:///path.db or postgresql://..."
                )
            if args.resume:
                return _usage_error(f"--resume needs a database that outlives the process: {where}")
        coord = Coordinator(store, where)
        try:
            coord.open(args.executions, args.seed, args.resume)
        except Refused as exc:
            return _usage_error(str(exc))
        kind = type(store).__name__
        print(f"harel-store {__version__}: {kind} ({type(store).__module__}) at {where}")
        if coord.note:
            print(coord.note)
        n, seed = coord.n, coord.seed
        if coord.resumed:
            print(
                f"resuming the run of {n:,} orders (seed {seed}) at tick {coord.tick}: "
                f"{coord.finished():,} orders finished before; its claims are taken "
                "over as their leases run out",
                flush=True,
            )
        else:
            print(f"driving {n:,} orders through the order workflow (seed {seed})", flush=True)
        cleared = coord.phase == "done"
        if cleared:
            print("the run had finished and been checked; clearing what is left of it")
        if args.workers is not None:
            from .._demo.workers import run_workers

            print(f"relays and sweepers in {args.workers} worker processes", flush=True)
            result = run_workers(url, coord, args.workers, lease=args.lease, progress=progress)
        else:
            result = run_durable(
                store, where=where, coordinator=coord, lease=args.lease, progress=progress
            )
    if cleared:
        return _verdict(result)
    return _report(result, kind)


def _report(result: DemoResult, what: str) -> int:
    print(
        f"orders:      {result['orders']:,} ({result['completed']:,} completed, "
        f"{result['timed_out']:,} timed out)"
    )
    print(f"executions:  {result['executions']:,} (orders, their region children, 2 services)")
    print(
        f"commits:     {result['commits']:,}; events delivered {result['events_delivered']:,}, "
        f"redeliveries skipped {result['redeliveries_skipped']:,}, duplicate spawns skipped "
        f"{result['duplicate_spawns_skipped']:,}, timers fired {result['timers_fired']:,}"
    )
    if "resumed" in result:
        note = " (resumed: the counts above are this run's)" if result["resumed"] else ""
        print(
            f"run {result['runs']} of the demonstration in this store{note}; CAS conflicts "
            f"retried {result['conflicts']:,}"
        )
    print(f"peak live executions: {result['peak_live_executions']:,} (finished ones are forgotten)")
    print(f"store stats at the end: {result['stats']}")
    forgot = (
        "the services, the ledger and the driver" if "resumed" in result else "the two services"
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
    print(
        f"elapsed {result['elapsed']:.3f} s: {result['executions_per_s']:,.0f} executions/s, "
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
