"""What every command of ``python -m harel_store`` shares: how a command is run, how a
store URL is read and opened, how errors and signals end it.

A command is a module of :mod:`harel_store.cli` with

- ``SUMMARY``: one line, for the list of commands;
- ``DESCRIPTION``: the text of its ``--help``;
- ``add_arguments(parser)``: its options, on a parser made by :func:`execute`;
- ``run(args) -> int``: its exit code.

:func:`execute` runs one. Every command ends the same ways:

- ``0`` when it did its work;
- ``1`` when its operation failed (:class:`Failed`; a store that cannot be opened);
- ``2`` for a usage error (:class:`UsageError`; a bad option, a bad URL, a URL whose
  directory is missing, a store that cannot take the command);
- ``130`` on SIGINT (Ctrl-C) and ``143`` on SIGTERM: one line says what was done and
  how to finish (a command that has something to say catches :data:`SIGNALS` and raises
  :class:`Interrupted`); a second signal while it finishes up ends the process at once.
  A signal never lands inside a store's call: :class:`Sheltered` stores, and code
  under :func:`deferred`, take it when the call returns (:func:`poll`);
- ``141`` when its output is a pipe that was closed (``| head -1``), without a word.

Errors are one line on stderr, ``PROG: error: message``, with no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import re
import shutil
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn, Protocol, TypeVar

from .._open import open_store, private_store, redact, sqlite_file

PROG = "python -m harel_store"
URL_ENV = "HAREL_STORE_URL"
_KEYWORDS = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*=")  # a libpq conninfo: host=db ...

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PIPE = 128 + 13  # SIGPIPE's number, as a shell reports a process it ended
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM


class Command(Protocol):
    """A module of :mod:`harel_store.cli` that is a command."""

    SUMMARY: str
    DESCRIPTION: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...
    def run(self, args: argparse.Namespace) -> int: ...


# -- how a command ends ----------------------------------------------------------------


class CommandError(Exception):
    """Ends a command with one line on stderr and the exit code ``code``."""

    code = EXIT_FAILED


class Failed(CommandError):
    """The operation failed: exit 1."""


class UsageError(CommandError):
    """The command line asks for something that cannot be done: exit 2."""

    code = EXIT_USAGE


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as ``KeyboardInterrupt`` is for SIGINT."""


SIGNALS = (KeyboardInterrupt, Terminated)


class Interrupted(Exception):
    """A command stopped by a signal (``signalled``, one of :data:`SIGNALS`) says what it
    did and how to finish: ``PROG: interrupted by SIGINT: message``."""

    def __init__(self, signalled: BaseException, message: str) -> None:
        super().__init__(message)
        self.signalled = signalled


def signal_name(signalled: BaseException) -> str:
    return "SIGTERM" if isinstance(signalled, Terminated) else "SIGINT"


def signal_exit(signalled: BaseException) -> int:
    return EXIT_SIGTERM if isinstance(signalled, Terminated) else EXIT_SIGINT


def one_line(text: str) -> str:
    """``text`` on one line (a driver's message may span several)."""
    return re.sub(r"\s*\n\s*", " ", text.strip())


class Parser(argparse.ArgumentParser):
    """A parser whose errors are a :class:`UsageError`: one line, with where to look."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


class _Signals:
    """What the handler knows: how deep in :func:`deferred` code the main thread is, and
    the signal that came meanwhile."""

    deferred = 0
    pending: int | None = None


def _signalled(signum: int) -> BaseException:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # The first signal stops the command, which cleans up and says what it did; a second
    # one, while it does (or while a deferred call goes on), ends the process as the
    # signal does by default.
    for number in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(number) is _on_signal:
                signal.signal(number, signal.SIG_DFL)
    if _Signals.deferred:
        _Signals.pending = signum
        return
    raise _signalled(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A signal that comes while this lasts is kept for :func:`poll`, not raised inside
    the code it would cut in two (a database driver's call, a transaction)."""
    _Signals.deferred += 1
    try:
        yield
    finally:
        _Signals.deferred -= 1


def poll() -> None:
    """Raise the signal :func:`deferred` kept, if one came."""
    signum = _Signals.pending
    if signum is not None:
        _Signals.pending = None
        raise _signalled(signum)


class Sheltered:
    """``store``, each of whose calls a signal waits for: SIGINT or SIGTERM during a
    call is raised when it returns, between two calls, where the command's own code
    handles it (closing the store, saying what was done)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            with deferred():
                result = value(*args, **kwargs)
            poll()
            return result

        setattr(self, name, call)  # found here from now on
        return call


@contextlib.contextmanager
def signals_handled() -> Iterator[None]:
    """SIGINT and SIGTERM raise :data:`SIGNALS` in the main thread while this lasts
    (signals ignored when the process started, as under ``nohup``, stay ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    _Signals.deferred, _Signals.pending = 0, None
    for number in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(number)
        if handler is not signal.SIG_IGN:
            previous[number] = handler
            signal.signal(number, _on_signal)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, signal.SIG_DFL if old is None else old)


def _silence_output() -> None:
    """Point stdout and stderr at the null device, so that nothing written later (nor
    the flush at exit) meets the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
                os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)


def _say(prog: str, what: str, message: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"{prog}: {what}: {one_line(message)}", file=sys.stderr, flush=True)


def refuse(prog: str, message: str) -> int:
    """Say a usage error found before any command runs: exit 2."""
    _say(prog, "error", message)
    return EXIT_USAGE


def _paragraphs(text: str) -> str:
    width = min(88, shutil.get_terminal_size().columns - 2)
    return "\n\n".join(textwrap.fill(" ".join(p.split()), width) for p in text.split("\n\n"))


def execute(command: Command, prog: str, argv: Sequence[str], *, epilog: str | None = None) -> int:
    """Parse ``argv`` for ``command`` and run it: its exit code, as the module says.
    ``epilog`` ends its ``--help`` as it is written."""
    try:
        with signals_handled():
            code = _execute(command, prog, argv, epilog)
            sys.stdout.flush()  # here, not at exit, where a closed pipe cannot be caught
            return code
    except BrokenPipeError:
        _silence_output()
        return EXIT_PIPE
    except SIGNALS as exc:  # after the command said what it did
        return signal_exit(exc)


def _execute(command: Command, prog: str, argv: Sequence[str], epilog: str | None) -> int:
    try:
        parser = Parser(
            prog=prog,
            description=_paragraphs(command.DESCRIPTION),
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(parser)
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        return command.run(args)
    except CommandError as exc:
        _say(prog, "error", str(exc))
        return exc.code
    except Interrupted as exc:
        _say(prog, f"interrupted by {signal_name(exc.signalled)}", str(exc))
        return signal_exit(exc.signalled)
    except SIGNALS as exc:
        _say(prog, f"interrupted by {signal_name(exc)}", "nothing was done")
        return signal_exit(exc)


# -- arguments -------------------------------------------------------------------------


def _typed(name: str) -> Callable[[Callable[[str], T]], Callable[[str], T]]:
    """Name an argparse type function as its messages should show it."""

    def name_it(function: Callable[[str], T]) -> Callable[[str], T]:
        function.__name__ = name
        return function

    return name_it


@_typed("whole number")
def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


@_typed("count")
def count(text: str) -> int:
    """A whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


@_typed("seconds")
def seconds(text: str) -> float:
    """A finite number of seconds more than 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number more than 0, got {text}")
    return value


# -- store URLs ------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreURL:
    """A store URL and where the command line got it: ``given`` is the option or
    argument that named it (``--store``, ``SRC_URL``), or ``None`` when it came from
    the environment (:data:`URL_ENV`) or is the default."""

    url: str
    given: str | None
    from_env: bool = False

    @classmethod
    def choose(cls, given: str | None, option: str, default: str) -> StoreURL:
        """``given`` (the value of ``option``), else ``$HAREL_STORE_URL``, else ``default``."""
        if given is not None:
            return cls(given, option)
        env = os.environ.get(URL_ENV)
        if env:
            return cls(env, None, from_env=True)
        return cls(default, None)

    @property
    def shown(self) -> str:
        """The URL as messages show it: passwords hidden."""
        return redact(self.url)

    @property
    def named(self) -> str:
        """The URL as messages show it, with where it came from when that was not the
        command line: ``sqlite:///x.db (from HAREL_STORE_URL)``."""
        if self.from_env:
            return f"{self.shown} (from {URL_ENV})"
        return self.shown

    @property
    def scheme(self) -> str:
        return self.url.partition(":")[0].lower()

    def _source(self) -> str:
        if self.from_env:
            return f"{URL_ENV}={self.shown} (from the environment)"
        return self.shown if self.given is None else f"{self.given} {self.shown}"

    def _setting(self, url: str) -> str:
        if self.from_env:
            return f"{URL_ENV}={url}"
        if self.given is not None and self.given.startswith("-"):
            return f"{self.given} {url}"
        return url

    def check(self) -> None:
        """Raise :class:`UsageError` for a URL that no store could be opened at, saying
        why: not a URL (a bare path gets the ``sqlite:///`` URL of that file; a libpq
        key=value conninfo is not repeated), a form ``open_store`` refuses, or a SQLite
        file in a directory that does not exist. Opens nothing."""
        url = self.url
        if ":" not in url and _KEYWORDS.match(url):
            # Not repeated: the password it may hold would be shown.
            where = f"{URL_ENV} (from the environment)" if self.from_env else self.given
            raise UsageError(
                f"{where or 'the store'} is a libpq key=value conninfo, not a store URL: "
                "give the server as postgresql://user@host:port/dbname"
            )
        if ":" not in url:
            bare = redact(os.path.expanduser(url))
            raise UsageError(
                f"{self._source()} is a path, not a store URL: for the SQLite file {bare}, "
                f"use {self._setting('sqlite:///' + bare)}"
            )
        try:
            private_store(url)
            path = sqlite_file(url)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"cannot open {self.named}: {exc}") from None
        if path is not None:
            directory = os.path.dirname(path)
            if directory and not os.path.isdir(directory):
                where = "" if os.path.isabs(directory) else f" ({os.path.abspath(directory)})"
                raise UsageError(
                    f"cannot open {self.named}: the directory {directory}{where} does not "
                    "exist (make it first, or name a file in another one)"
                )

    def open(self, **options: Any) -> Any:
        """The store at this URL (after :meth:`check`); :class:`Failed` when it cannot be
        opened, saying why. A signal waits for the opening to end (then the store is
        closed again, and the signal raised)."""
        self.check()
        try:
            with deferred():
                store = open_store(self.url, **options)
            if _Signals.pending is not None:
                with deferred():
                    store.close()
                poll()
            return store
        except (ValueError, TypeError) as exc:
            raise UsageError(f"cannot open {self.named}: {exc}") from None
        except ImportError as exc:
            raise Failed(f"cannot open {self.named}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a store's or a driver's, said in one line
            raise Failed(f"cannot open {self.named}: {exc}") from None


def unfit_source(path: str) -> str | None:
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


@contextlib.contextmanager
def existing_store(given: str, doing: str = "read") -> Iterator[tuple[StoreURL, Any]]:
    """The URL argument ``given`` and the store there, opened for a command that reads or
    tends it (``inspect``, ``show``, ``prune``), closed when the block ends. A SQLite file
    that does not exist or holds nothing is a :class:`UsageError` (opening it would make a
    database of it); an error of the store or its driver in the block is a
    :class:`Failed`: ``cannot DOING URL: why``."""
    url = StoreURL(given, "URL")
    url.check()
    path = sqlite_file(url.url)
    if path is not None:
        problem = unfit_source(path)
        if problem is not None:
            raise UsageError(f"cannot open {url.shown}: {problem}")
    store = url.open()
    try:
        yield url, store
    except CommandError:
        raise
    except Exception as exc:  # noqa: BLE001 - a store's or a driver's, said in one line
        raise Failed(f"cannot {doing} {url.named}: {exc}") from None
    finally:
        store.close()
