"""``python -m harel_store copy SRC_URL DST_URL``: copy a store into an empty one
(:func:`harel_store.copy_store`), with progress on stderr."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, cast

from .._copy import copy_store
from .._errors import StoreError
from .._open import open_store, private_store, sqlite_file
from ._common import PROG as COMMAND_LINE
from ._common import (
    SIGNALS,
    Command,
    Failed,
    Interrupted,
    StoreURL,
    UsageError,
    deferred,
    execute,
    poll,
    unfit_source,
)

PROG = f"{COMMAND_LINE} copy"
PROGRESS_INTERVAL = 1.0  # seconds before the command line shows progress, and between lines


class _Display:
    """Progress on stderr: nothing for a copy that takes less than
    :data:`PROGRESS_INTERVAL`, then a line about that often, and a last one."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.start = self.last = time.monotonic()
        self.shown = False
        self.done = 0
        self.total: int | None = None

    def __call__(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total
        now = time.monotonic()
        if now - self.last >= PROGRESS_INTERVAL:
            self.last = now
            self.show(now)

    def finish(self) -> None:
        """The last line, when any was shown before."""
        if self.shown:
            self.show(time.monotonic())

    def show(self, now: float) -> None:
        self.shown = True
        done, total = self.done, self.total
        of = "" if total is None else f"/{total:,}"
        share = f" ({100 * done / total:.0f}%)" if total else ""
        print(
            f"  copied {done:,}{of} records{share}, {now - self.start:.1f} s",
            file=self.stream,
            flush=True,
        )


SUMMARY = "copy everything a store holds into an empty one (SRC_URL DST_URL)"
DESCRIPTION = (
    "Copy everything a store holds (executions, pending outbox and spawn entries, "
    "processed marks, timers, trace rings, commit ids, writer epochs) into an empty "
    "store, in one transaction: from SQLite to PostgreSQL, say, when an engine outgrows "
    "one machine. Leases are not copied. Stop the engine's writers to a memory source "
    "first; a durable source is read in one snapshot. Exits 0 when everything was "
    "copied, 1 when nothing was (saying why), 2 for a usage error, 130 or 143 when "
    "SIGINT or SIGTERM stopped it (nothing written)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "src",
        metavar="SRC_URL",
        help="the store to copy: sqlite:///path.db, postgresql://..., memory: (an empty one)",
    )
    parser.add_argument(
        "dst",
        metavar="DST_URL",
        help="the empty store to copy into: sqlite:///path.db or postgresql://...",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harel_store copy ARGV``: 0 when everything was copied, 1 with a
    message on stderr when nothing was, 2 for a usage error (a bad option or URL, or a
    destination that would vanish with the command), 130/143 when SIGINT/SIGTERM
    stopped it. A SQLite file the command made for the copy is removed when the copy
    fails; a missing or empty SQLite source is refused before anything is opened."""
    command = cast(Command, sys.modules[__name__])
    return execute(command, PROG, sys.argv[1:] if argv is None else argv)


def run(args: argparse.Namespace) -> int:
    src, dst = StoreURL(args.src, "SRC_URL"), StoreURL(args.dst, "DST_URL")
    src.check()
    dst.check()
    if private_store(args.dst):
        raise UsageError(
            f"{dst.shown} would vanish with this command, and the copy with it: copy into "
            "a SQLite file (sqlite:///path.db) or PostgreSQL (postgresql://...)"
        )
    source, target = sqlite_file(args.src), sqlite_file(args.dst)
    if source is not None:
        problem = unfit_source(source)
        if problem is not None:
            raise Failed(f"cannot open {src.shown}: {problem}")
    made = target if target is not None and _make(target) else None
    copied = False
    try:
        counts, elapsed, display = _copy_urls(args, src, dst)
        copied = True
        poll()  # a signal that came as the copy was written, or as the stores closed
        if display is not None:
            display.finish()
        summary = ", ".join(f"{n:,} {what}" for what, n in counts.items())
        print(f"copied {src.shown} to {dst.shown} in {elapsed:.2f} s: {summary}")
    except SIGNALS as exc:
        copied = copied or _holds_something(dst)
        if copied:
            raise Interrupted(exc, f"the copy was written: {dst.shown} holds it") from None
        raise Interrupted(exc, f"nothing was written to {dst.shown}") from None
    finally:
        if made is not None and not copied:
            _remove(made)
    return 0


def _copy_urls(
    args: argparse.Namespace, src: StoreURL, dst: StoreURL
) -> tuple[dict[str, int], float, _Display | None]:
    """Open both stores, copy, close them: what was copied, the seconds it took and the
    progress display; :class:`Failed` saying why, with nothing written."""
    opened: list[Any] = []
    try:
        # trace_max=None: the copy keeps every step the source holds; each store
        # object that opens the copy later trims its rings to its own trace_max.
        opened.append(src.open(trace_max=None))
        opened.append(dst.open(trace_max=None))
        start = time.monotonic()
        display = None if args.quiet else _Display(sys.stderr)

        def progress(done: int, total: int | None) -> None:
            if display is not None:
                display(done, total)
            poll()  # a signal that came while the copy read stops it here, nothing written

        try:
            # A signal waits for the progress call: one in a driver's call could leave a
            # connection or a transaction half done.
            with deferred():
                counts = copy_store(*opened, progress=progress)
        except (StoreError, ValueError, TypeError, OSError) as exc:
            if isinstance(exc, BrokenPipeError):
                raise
            note = "" if "nothing was written" in str(exc) else "; nothing was written"
            raise Failed(f"cannot copy {src.shown} to {dst.shown}: {exc}{note}") from None
        return counts, time.monotonic() - start, display
    finally:
        with deferred():
            for store in reversed(opened):
                store.close()


def _holds_something(url: StoreURL) -> bool:
    """Whether the store at ``url`` holds anything (a copy interrupted as it ended may
    have been written); ``False`` when it cannot be told."""
    try:
        with open_store(url.url) as store:
            return any(store.stats().values())
    except Exception:  # noqa: BLE001 - could not look: it was empty before the copy
        return False


def _make(path: str) -> bool:
    """Create the empty file ``path`` unless something is there: whether it was made."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError:  # there already, or cannot be made: opening the store says why
        return False
    return True


def _remove(path: str) -> None:
    """Remove the database file ``path`` this command made, and SQLite's files beside it."""
    for name in (path, f"{path}-wal", f"{path}-shm"):
        with contextlib.suppress(OSError):
            os.remove(name)
