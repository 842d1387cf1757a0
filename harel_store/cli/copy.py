"""``python -m harel_store copy SRC_URL DST_URL``: copy a store into an empty one
(:func:`harel_store.copy_store`), with progress on stderr."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._copy import copy_store
from .._errors import StoreError

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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harel_store copy",
        description=(
            "Copy everything a store holds (executions, pending outbox and spawn entries, "
            "processed marks, timers, trace rings, commit ids, writer epochs) into an "
            "empty store, in one transaction: from SQLite to PostgreSQL, say, when an "
            "engine outgrows one machine. Leases are not copied. Stop the engine's "
            "writers to a memory source first; a durable source is read in one snapshot."
        ),
    )
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harel_store copy SRC_URL DST_URL``: 0 when everything was copied,
    1 with a message on stderr when nothing was, 2 for a usage error (a bad option or
    URL, or a destination that would vanish with the command). A SQLite file the command
    made for the copy is removed when the copy fails; a missing or empty SQLite source is
    refused before anything is opened."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has shown
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    from .._open import private_store, redact, sqlite_file

    src_url, dst_url = redact(args.src), redact(args.dst)

    def fail(message: str, code: int = 1) -> int:
        print(f"{parser.prog}: error: {message}", file=sys.stderr, flush=True)
        return code

    try:
        private_store(args.src)
    except ValueError as exc:
        return fail(f"cannot open {src_url}: {exc}", 2)
    try:
        throwaway = private_store(args.dst)
    except ValueError as exc:
        return fail(f"cannot open {dst_url}: {exc}", 2)
    if throwaway:
        return fail(
            f"{dst_url} would vanish with this command, and the copy with it: copy into "
            "a SQLite file (sqlite:///path.db) or PostgreSQL (postgresql://...)",
            2,
        )
    source, target = sqlite_file(args.src), sqlite_file(args.dst)
    if source is not None:
        problem = _unfit_source(source)
        if problem is not None:
            return fail(f"cannot open {src_url}: {problem}")
    made = target if target is not None and _make(target) else None
    code = 1
    try:
        code = _copy_urls(args, src_url, dst_url, fail)
    finally:
        if made is not None and code != 0:
            _remove(made)
    return code


def _copy_urls(
    args: argparse.Namespace, src_url: str, dst_url: str, fail: Callable[[str], int]
) -> int:
    """Open both stores, copy, close them: :func:`main`'s exit code."""
    from .._open import open_store

    opened: list[Any] = []
    try:
        try:
            # trace_max=None: the copy keeps every step the source holds; each store
            # object that opens the copy later trims its rings to its own trace_max.
            for url in (args.src, args.dst):
                opened.append(open_store(url, trace_max=None))
        except (StoreError, ValueError, TypeError, ImportError, OSError) as exc:
            which = src_url if not opened else dst_url
            return fail(f"cannot open {which}: {exc}")
        src, dst = opened
        start = time.monotonic()
        display = None if args.quiet else _Display(sys.stderr)
        try:
            counts = copy_store(src, dst, progress=display)
        except KeyboardInterrupt:
            fail(f"interrupted: nothing was written to {dst_url}")
            return 130
        except (StoreError, ValueError, TypeError, OSError) as exc:
            note = "" if "nothing was written" in str(exc) else "; nothing was written"
            return fail(f"cannot copy {src_url} to {dst_url}: {exc}{note}")
        if display is not None:
            display.finish()
        elapsed = time.monotonic() - start
        summary = ", ".join(f"{n:,} {what}" for what, n in counts.items())
        print(f"copied {src_url} to {dst_url} in {elapsed:.2f} s: {summary}")
        return 0
    finally:
        for store in reversed(opened):
            store.close()


def _unfit_source(path: str) -> str | None:
    """Why the SQLite file ``path`` cannot be copied from, found without writing to it:
    opening a missing or empty file as a store would make a harel_store database of
    it. ``None`` when it may be opened (a store refuses a file of another kind itself,
    before writing)."""
    import pathlib
    import sqlite3

    if not os.path.exists(path):
        return f"no such database file: {path}"
    # mode=rw: never creates the file; and, unlike mode=ro, removes the -wal and -shm
    # files it opens when it closes.
    uri = f"{pathlib.Path(path).absolute().as_uri()}?mode=rw"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            (tables,) = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error:
        return None
    return None if tables else f"{path} is empty: it holds no harel_store database"


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
