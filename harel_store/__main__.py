"""``python -m harel_store``: drive many orders through a small workflow on the store and
report the throughput (see :mod:`harel_store._demo`), or say what is installed (``--info``).

Exits 0 when the run checked out, 1 when it did not.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence
from time import perf_counter
from types import ModuleType

from . import IMPLEMENTATION, __version__
from ._demo import DemoStore, run
from ._env import NO_EXTENSIONS, REQUIRE_EXTENSIONS
from ._store_py import DictStore as PureDictStore

DEFAULT_ORDERS = 20_000


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harel_store",
        description=(
            "Drive N orders through an order-handling workflow (emits, timers, AND-state "
            "spawns, joins, redeliveries, timeouts) using only the store's public API, "
            "check the outcome, and report the throughput."
        ),
    )
    parser.add_argument(
        "-n",
        "--executions",
        type=_positive,
        default=DEFAULT_ORDERS,
        metavar="N",
        help="orders to drive; each completed one also spawns two region children "
        "(default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default: %(default)s)")
    parser.add_argument(
        "--pure",
        action="store_true",
        help="use the pure-Python store even if the compiled one loads",
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
    from . import DictStore

    return DictStore, IMPLEMENTATION


def _module(store: type[DemoStore]) -> ModuleType:
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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    store, implementation = _store(args.pure)
    if args.info:
        _info(store, implementation)
        return 0

    n: int = args.executions
    print(f"harel-store {__version__}: {implementation} store ({_module(store).__name__})")
    print(f"driving {n:,} orders through the order workflow (seed {args.seed})", flush=True)
    result = run(n, store, progress=None if args.quiet else _Progress(), seed=args.seed)

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
    print(f"peak live executions: {result['peak_live_executions']:,} (finished ones are forgotten)")
    print(f"store stats at the end: {result['stats']}")
    print(f"after forgetting the two services: {result['stats_after_forget']}")
    print(
        f"elapsed {result['elapsed']:.3f} s: {result['executions_per_s']:,.0f} executions/s, "
        f"{result['commits_per_s']:,.0f} commits/s ({implementation} store)"
    )
    if result["problems"]:
        print(f"FAILED: {len(result['problems'])} check(s) did not hold:", file=sys.stderr)
        for problem in result["problems"][:20]:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print("OK: every order completed or timed out as planned; all counts agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
