"""The command line as a whole (``harel_store.cli``): how a command is found, and what
every command shares: store URLs and their messages, one-line errors and their exit
codes, signals (SIGINT, SIGTERM) on every store, worker processes included, and a
closed output pipe.

The signals are sent to ``python -m harel_store`` running in a subprocess, once its
progress on stderr shows it under way; every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import URL_ENV, module_env, run_cli, worker_pids
from _helpers import cli_command as command

PROG = "python -m harel_store"
PROGRESS = re.compile(r"^  ([\d,]+)/([\d,]+) orders finished")
TRACEBACK = "Traceback"


def one_error(err: str, prog: str = PROG) -> str:
    """The one line of an error on stderr, without its ``PROG: error: ``."""
    assert err.count("\n") == 1 and TRACEBACK not in err, err
    assert err.startswith(f"{prog}: error: "), err
    return err[len(f"{prog}: error: ") :].rstrip("\n")


class Running:
    """``python -m harel_store ARGS`` in a subprocess of its own session (so that a
    signal may go to its whole process group, as Ctrl-C in a terminal does), its stderr
    read line by line as it comes."""

    def __init__(self, *args: str, cwd: Path, **env: str) -> None:
        self.proc = subprocess.Popen(
            command(*args),
            cwd=cwd,
            env=module_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []
        self.out: list[str] = []
        self.readers = [
            threading.Thread(target=self._read_err, daemon=True),
            threading.Thread(target=self._read_out, daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self.out.extend(self.proc.stdout)

    def progress(self, at_least: int = 0, timeout: float = 120) -> tuple[int, int]:
        """Wait for a progress line (the first comes a second into the run) with at least
        ``at_least`` orders finished: ``(finished, total)``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no progress to {at_least} orders in {timeout} s: {self.err}"
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"ended first: {self.finish()}"
            self.err.append(line)
            match = PROGRESS.match(line)
            if match:
                done, total = (int(g.replace(",", "")) for g in match.groups())
                if done >= at_least:
                    return done, total

    def signal(self, signum: int, *, group: bool = False) -> None:
        if group:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        """Its exit code, stdout and what it wrote to stderr since :meth:`progress`."""
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            for reader in self.readers:
                reader.join(timeout=10)
            assert self.proc.stdout is not None and self.proc.stderr is not None
            self.proc.stdout.close()
            self.proc.stderr.close()
        rest: list[str] = []
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                rest.append(line)
        return code, "".join(self.out), "".join(rest)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.finish()


@pytest.fixture
def running() -> Iterator[list[Running]]:
    """Whatever a test started is killed when it ends, passed or failed."""
    started: list[Running] = []
    yield started
    for one in started:
        one.kill()


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def wait_gone(pids: list[int], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(pid) for pid in pids), "worker processes outlived the command"


@pytest.fixture
def pg_url(pg_server: Any) -> Iterator[str]:
    """A PostgreSQL database of its own (the demo's tables live in its public schema)."""
    import psycopg

    name = f"cli_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        try:
            conn.execute(f'CREATE DATABASE "{name}"')
        except psycopg.errors.InsufficientPrivilege as exc:
            pytest.skip(f"the demo runs in a database of its own, and this server says: {exc}")
    try:
        url = re.sub(r"/postgres(\?|$)", rf"/{name}\1", pg_server.url, count=1)
        assert name in url
        yield url
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- the commands -----------------------------------------------------------------------


def test_every_command_is_a_module_with_the_same_four_names() -> None:
    from harel_store import cli

    assert cli.DEFAULT == "demo" and "copy" in cli.COMMANDS
    for name in cli.COMMANDS:
        module = cli.command(name)
        assert module.SUMMARY and module.DESCRIPTION
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        assert callable(module.run)


def test_the_help_lists_the_commands_and_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from harel_store.cli import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {PROG} ")
    assert re.search(r"^  demo  ", out, re.MULTILINE)
    assert re.search(r"^  copy +copy everything a store holds", out, re.MULTILINE)
    assert "130 and 143 stopped by SIGINT (Ctrl-C) and SIGTERM" in out


def test_the_demo_by_its_name(capsys: pytest.CaptureFixture[str]) -> None:
    from harel_store.cli import main

    assert main(["demo", "-n", "50", "--quiet"]) == 0
    assert "OK: every order completed" in capsys.readouterr().out
    assert main(["--quiet", "demo", "-n", "50"]) == 0
    assert "OK: every order completed" in capsys.readouterr().out


def test_an_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from harel_store.cli import main

    assert main(["inspec", "sqlite:///x.db"]) == 2
    message = one_error(capsys.readouterr().err)
    assert message.startswith("'inspec' is not a command; the commands are demo, copy")


# -- errors: one line, exit 2 for usage ---------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "abc"], "argument -n/--executions: must be a whole number of at least 1, got 'abc'"),
        (["-n", "0"], "argument -n/--executions: must be a whole number of at least 1, got '0'"),
        (["--workers", "two"], "argument --workers: must be a whole number of at least 1, got 'two'"),
        (["--seed", "x"], "argument --seed: must be a whole number, got 'x'"),
        (["--lease", "soon"], "argument --lease: must be a finite number more than 0, got soon"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)  # fmt: skip
def test_a_bad_option_is_one_line_that_names_no_internals(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from harel_store.cli import main

    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert one_error(captured.err) == f"{message} (see {PROG} --help)"
    assert "_positive" not in captured.err and "invalid" not in captured.err


def test_a_bad_option_in_a_subprocess(tmp_path: Path) -> None:
    proc = run_cli("-n", "many", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "must be a whole number of at least 1, got 'many'" in one_error(proc.stderr)


@pytest.mark.parametrize("path", ["orders.db", "data/orders.db", "/tmp/x.db", "~/x.db"])
def test_a_bare_path_gets_its_sqlite_url(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harel_store.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(URL_ENV, raising=False)
    full = os.path.expanduser(path)
    assert main(["--store", path, "-n", "5"]) == 2
    assert one_error(capsys.readouterr().err) == (
        f"--store {path} is a path, not a store URL: for the SQLite file {full}, "
        f"use --store sqlite:///{full}"
    )
    assert main(["copy", path, "sqlite:///dst.db"]) == 2
    assert one_error(capsys.readouterr().err, f"{PROG} copy").startswith(
        f"SRC_URL {path} is a path, not a store URL: for the SQLite file {full}, "
        f"use sqlite:///{full}"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "conninfo",
    ["host=db password=s3cret", "dbname=app password='s3 cret'", " user = me password=s3cret"],
)
def test_a_key_value_conninfo_is_refused_without_repeating_it(
    conninfo: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harel_store.cli import main

    monkeypatch.delenv(URL_ENV, raising=False)
    expected = (
        "is a libpq key=value conninfo, not a store URL: give the server as "
        "postgresql://user@host:port/dbname"
    )
    assert main(["--store", conninfo, "-n", "5"]) == 2
    assert one_error(capsys.readouterr().err) == f"--store {expected}"
    assert main(["copy", conninfo, "sqlite:///never.db"]) == 2
    assert one_error(capsys.readouterr().err, f"{PROG} copy") == f"SRC_URL {expected}"
    monkeypatch.setenv(URL_ENV, conninfo)
    assert main(["-n", "5"]) == 2
    err = capsys.readouterr().err
    assert one_error(err) == f"{URL_ENV} (from the environment) {expected}"
    assert "s3" not in err


def test_a_url_from_the_environment_is_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harel_store.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(URL_ENV, "orders.db")
    assert main(["-n", "5"]) == 2
    assert one_error(capsys.readouterr().err) == (
        f"{URL_ENV}=orders.db (from the environment) is a path, not a store URL: for the "
        f"SQLite file orders.db, use {URL_ENV}=sqlite:///orders.db"
    )
    monkeypatch.setenv(URL_ENV, "sqlite:/orders.db")
    assert main(["-n", "5"]) == 2
    assert one_error(capsys.readouterr().err).startswith(
        f"cannot open sqlite:/orders.db (from {URL_ENV}): a SQLite URL is"
    )
    monkeypatch.setenv(URL_ENV, "sqlite:///nowhere/orders.db")
    assert main(["-n", "5"]) == 2
    message = one_error(capsys.readouterr().err)
    assert message.startswith(f"cannot open sqlite:///nowhere/orders.db (from {URL_ENV}): ")
    assert "the directory nowhere" in message
    monkeypatch.setenv(URL_ENV, "sqlite://")
    assert main(["-n", "5", "--resume"]) == 2
    assert one_error(capsys.readouterr().err) == (
        f"--resume needs a database that outlives the process: sqlite:// (from {URL_ENV})"
    )
    # Named in what a run prints, too; --store wins over the environment.
    monkeypatch.setenv(URL_ENV, "sqlite:///env.db")
    assert main(["-n", "20", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(f" at sqlite:///env.db (from {URL_ENV})")
    assert main(["-n", "20", "--quiet", "--store", "sqlite:///flag.db"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(" at sqlite:///flag.db")


def test_a_missing_directory_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harel_store.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(URL_ENV, raising=False)
    missing = tmp_path / "no" / "such"
    assert main(["--store", f"sqlite:///{missing}/x.db", "-n", "5"]) == 2
    assert one_error(capsys.readouterr().err) == (
        f"cannot open sqlite:///{missing}/x.db: the directory {missing} does not exist "
        "(make it first, or name a file in another one)"
    )
    assert main(["--store", "sqlite:///sub/x.db", "-n", "5"]) == 2
    assert f"the directory sub ({tmp_path}/sub) does not exist" in capsys.readouterr().err
    src = f"sqlite:///{tmp_path}/src.db"
    main(["--store", src, "-n", "5", "--quiet"])
    capsys.readouterr()
    assert main(["copy", src, f"sqlite:///{missing}/copy.db"]) == 2
    assert f"the directory {missing} does not exist" in one_error(
        capsys.readouterr().err, f"{PROG} copy"
    )
    assert not missing.parent.exists()


def test_a_store_that_cannot_be_opened_is_a_failed_operation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harel_store.cli import main

    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE mine (x)")
    conn.close()
    assert main(["--store", f"sqlite:///{foreign}", "-n", "5"]) == 1
    message = one_error(capsys.readouterr().err)
    assert message.startswith(f"cannot open sqlite:///{foreign}: ")
    assert "is not a harel_store database" in message


# -- signals ----------------------------------------------------------------------------


SIGNALLED = [
    pytest.param(signal.SIGINT, 130, id="SIGINT"),
    pytest.param(signal.SIGTERM, 143, id="SIGTERM"),
]


@pytest.mark.parametrize(("signum", "code"), SIGNALLED)
def test_a_signal_stops_a_memory_run_in_one_line(
    signum: int, code: int, tmp_path: Path, running: list[Running]
) -> None:
    demo = Running("-n", "500000", cwd=tmp_path)
    running.append(demo)
    demo.progress(1)
    demo.signal(signum)
    returned, out, err = demo.finish()
    assert returned == code
    name = signal.Signals(signum).name
    assert TRACEBACK not in err and err.count("\n") == 1, err
    done = re.match(
        rf"{PROG}: interrupted by {name}: ([\d,]+) of 500,000 orders had finished; a memory "
        r"store keeps nothing of the run: run it again to see it through",
        err,
    )
    assert done is not None, err
    assert "driving 500,000 orders" in out and "OK:" not in out


@pytest.mark.parametrize(
    ("signum", "code", "size"),
    [
        pytest.param(signal.SIGINT, 130, None, id="SIGINT-default-size"),
        pytest.param(signal.SIGTERM, 143, "1000", id="SIGTERM"),
    ],
)
def test_a_signal_stops_a_sqlite_run_which_resume_finishes(
    signum: int, code: int, size: str | None, tmp_path: Path, running: list[Running]
) -> None:
    """Stopped on a SQLite file, the run says how far it got and how to finish it; the
    command it names finishes it. The default size on SQLite is 2,000 orders."""
    n = 2000 if size is None else int(size)
    demo = Running(
        "--store", "sqlite:///orders.db", "--lease", "1", *(("-n", size) if size else ()),
        cwd=tmp_path,
    )  # fmt: skip
    running.append(demo)
    _, total = demo.progress()
    assert total == n
    demo.signal(signum)
    returned, out, err = demo.finish()
    assert returned == code
    assert f"driving {n:,} orders through the order workflow" in out
    assert TRACEBACK not in err and err.count("\n") == 1, err
    name = signal.Signals(signum).name
    said = re.match(
        rf"{PROG}: interrupted by {name}: ([\d,]+) of {n:,} orders finished, and the run is "
        rf"kept in sqlite:///orders.db; ({PROG} --store sqlite:///orders.db --resume) "
        "finishes it\n",
        err,
    )
    assert said is not None, err
    assert int(said.group(1).replace(",", "")) < n
    if size is None:  # the default size: resuming its 2,000 orders says no more than 600
        from harel_store.sqlite import SqliteStore

        with SqliteStore(tmp_path / "orders.db") as store:
            driver = store.load("demo/driver")
        assert driver is not None and driver.context["phase"] == "running"
        return
    resumed = run_cli(*said.group(2).split()[3:], "--quiet", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming the run of {n:,} orders (seed 1)" in resumed.stdout
    assert "OK: every order completed or timed out as planned" in resumed.stdout


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize(
    ("signum", "group", "code"),
    [
        pytest.param(signal.SIGINT, True, 130, id="SIGINT-to-the-group"),
        pytest.param(signal.SIGTERM, False, 143, id="SIGTERM-to-the-coordinator"),
    ],
)
def test_a_signal_stops_the_worker_processes_too(
    signum: int, group: bool, code: int, tmp_path: Path, running: list[Running]
) -> None:
    """Ctrl-C reaches every process of the terminal's group; SIGTERM may reach only the
    coordinator: either way the workers stop, nothing prints a traceback, and the run
    is finished by --resume --workers."""
    args = ("--store", "sqlite:///orders.db", "--lease", "1", "--workers", "2", "-n", "1000")
    demo = Running(*args, cwd=tmp_path)
    running.append(demo)
    demo.progress()
    pids = worker_pids(demo.proc.pid)
    assert len(pids) == 2
    demo.signal(signum, group=group)
    returned, _, err = demo.finish()
    assert returned == code
    assert TRACEBACK not in err and err.count("\n") == 1, err
    assert f"{PROG} --store sqlite:///orders.db --resume --workers 2 finishes it" in err
    wait_gone(pids)
    resumed = run_cli(*args, "--resume", "--quiet", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "OK: every order completed or timed out as planned" in resumed.stdout


@pytest.mark.parametrize(
    ("signum", "workers", "code"),
    [
        pytest.param(signal.SIGINT, None, 130, id="SIGINT"),
        pytest.param(signal.SIGTERM, "2", 143, id="SIGTERM-workers"),
    ],
)
def test_a_signal_stops_a_postgres_run(
    signum: int,
    workers: str | None,
    code: int,
    pg_url: str,
    tmp_path: Path,
    running: list[Running],
) -> None:
    """On PostgreSQL too."""
    extra = ("-n", "200") + (() if workers is None else ("--workers", workers))
    demo = Running("--store", pg_url, "--lease", "1", *extra, cwd=tmp_path)
    running.append(demo)
    demo.progress()
    demo.signal(signum, group=signum == signal.SIGINT)
    returned, _, err = demo.finish()
    assert returned == code
    assert TRACEBACK not in err and err.count("\n") == 1, err
    assert "--resume" in err and "of 200 orders finished, and the run is kept in" in err
    resumed = run_cli(
        "--store", pg_url, "--lease", "1", *extra[2:], "--resume", "--quiet", cwd=tmp_path
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "OK: every order completed or timed out as planned" in resumed.stdout


@pytest.mark.parametrize(("signum", "code"), SIGNALLED)
def test_a_signal_stops_a_copy_with_nothing_written(
    signum: int,
    code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The signal is real (sent to this process while the copy reads its source); it
    stops the copy as the progress call returns, not inside a driver's call."""
    import harel_store
    from harel_store import _copy
    from harel_store.cli import copy as copy_cli
    from harel_store.cli import main

    src, dst = f"sqlite:///{tmp_path}/src.db", f"sqlite:///{tmp_path}/dst.db"
    with harel_store.open_store(src) as store:
        for i in range(30):
            store.commit(harel_store.Execution(id=f"e{i}"), [("t", i)], f"ev{i}")
    monkeypatch.setattr(_copy, "PROGRESS_EVERY", 10)
    monkeypatch.setattr(copy_cli, "PROGRESS_INTERVAL", 0.0)
    calls = []

    def signalled(self: Any, done: int, total: int | None) -> None:
        calls.append(done)
        if done >= 20:
            os.kill(os.getpid(), signum)  # kept until this call returns, then raised

    monkeypatch.setattr(copy_cli._Display, "__call__", signalled)
    before = signal.getsignal(signum)
    assert main(["copy", src, dst]) == code
    assert signal.getsignal(signum) is before  # the command's handlers are gone
    name = signal.Signals(signum).name
    assert capsys.readouterr().err == (
        f"{PROG} copy: interrupted by {name}: nothing was written to {dst}\n"
    )
    assert calls[-1] == 20
    assert not (tmp_path / "dst.db").exists()  # made for the copy, and removed


def test_a_signal_waits_for_the_store_call_it_comes_in() -> None:
    """Raised inside a driver's call, a signal could leave a connection or a transaction
    half done: it is raised when the call returns."""
    from harel_store.cli._common import Sheltered, Terminated, signals_handled

    class Store:
        done = False

        def commit(self) -> int:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the signal has come: it waits
            self.done = True
            return 1

    store = Store()
    before = signal.getsignal(signal.SIGTERM)
    with signals_handled(), pytest.raises(Terminated):
        Sheltered(store).commit()
    assert store.done
    assert signal.getsignal(signal.SIGTERM) is before


# -- a closed pipe ----------------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory:", "sqlite:///orders.db"])
def test_a_closed_pipe_ends_quietly(store: str, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        command("--store", store, "-n", "400" if store != "memory:" else "5000"),
        cwd=tmp_path,
        env=module_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # as `| head -1` does
        err = proc.stderr.read()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
    assert first.startswith("harel-store ")
    assert code == 141
    assert TRACEBACK not in err and "Exception ignored" not in err and "Error" not in err, err


def test_a_closed_pipe_in_a_shell(tmp_path: Path) -> None:
    """The command as a reader types it."""
    proc = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} -m harel_store -n 5000 | head -1"],
        cwd=tmp_path,
        env=module_env(),
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 141
    assert proc.stdout.startswith("harel-store ") and proc.stdout.count("\n") == 1
    assert TRACEBACK not in proc.stderr and "Exception ignored" not in proc.stderr


# -- the demo's default size ---------------------------------------------------------------


def test_the_default_size_suits_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harel_store import DictStore
    from harel_store._demo.durable import DEFAULT_ORDERS, Coordinator, default_orders
    from harel_store.cli import main
    from harel_store.sqlite import SqliteStore

    assert DEFAULT_ORDERS == {"memory": 20_000, "sqlite": 2_000, "postgresql": 500}
    assert default_orders(DictStore()) == 20_000
    with SqliteStore(tmp_path / "x.db") as store:
        assert default_orders(store) == 2_000
        coord = Coordinator(store, "x.db")
        coord.open(None, None, False)
        assert coord.n == 2_000
    assert main(["--help"]) == 0
    helped = " ".join(capsys.readouterr().out.split())
    assert "(default: 20,000 on a memory store, 2,000 on SQLite, 500 on PostgreSQL" in helped


def test_the_default_size_on_postgres(pg_server: Any, pg_schema: str) -> None:
    from harel_store._demo.durable import Coordinator, default_orders
    from harel_store.postgres import PostgresStore

    with PostgresStore(pg_server.url, schema=pg_schema) as store:
        assert default_orders(store) == 500
        coord = Coordinator(store, "pg")
        coord.open(None, None, False)
        assert coord.n == 500


def test_the_memory_default(tmp_path: Path) -> None:
    proc = run_cli("--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "driving 20,000 orders through the order workflow" in proc.stdout
