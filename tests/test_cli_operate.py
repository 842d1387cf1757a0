"""``inspect``, ``show``, ``prune`` and ``inspect --serve`` on a SQLite file, their
figures compared with the store's own, and their one-line errors."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from harel_store.cli import main
from harel_store.sqlite import SqliteStore

DATA = Path(__file__).parent / "data"


def made(tmp_path: Path) -> str:
    path = tmp_path / "s.db"
    shutil.copy(DATA / "schema_v1.sqlite", path)
    return f"sqlite:///{path}"


def test_inspect_prints_the_overview(tmp_path: Path, capsys: object) -> None:
    url = made(tmp_path)
    assert main(["inspect", url, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    with SqliteStore(url[len("sqlite:///") :]) as store:
        own = store.overview()
        stats = store.stats()
    assert figures.keys() == own.keys()
    for key in ("executions", "outbox", "spawns", "timers", "processed", "commit_ids"):
        assert figures[key] == own[key]
    assert figures["outbox"] == stats["outbox"] == 9
    assert main(["inspect", url]) == 0
    lines = capsys.readouterr().out.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == len(own) and lines[0].split() == ["executions", "5"]


def test_show_one_execution(tmp_path: Path, capsys: object) -> None:
    url = made(tmp_path)
    assert main(["show", url, "e1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    assert shown["version"] == 2 and shown["processed"] == 2 and shown["commit_ids"] == 2
    assert shown["execution"]["context"] == {"n": 1}
    assert [t["path"] for t in shown["timers"]] == ["t"]
    assert main(["show", url, "e1"]) == 0
    assert "version     2" in capsys.readouterr().out  # type: ignore[attr-defined]


def test_prune_command(tmp_path: Path, capsys: object) -> None:
    url = made(tmp_path)
    assert main(["prune", url, "--older-than", "7d"]) == 0
    assert "0 processed marks and 0 commit ids" in capsys.readouterr().out  # type: ignore[attr-defined]
    time.sleep(0.05)
    assert main(["prune", url, "--older-than", "0s"]) == 0
    assert "10 processed marks and 10 commit ids" in capsys.readouterr().out  # type: ignore[attr-defined]


def test_errors_are_one_line(tmp_path: Path, capsys: object) -> None:
    url = made(tmp_path)
    for argv in (
        ["show", url, "nobody"],
        ["inspect", f"sqlite:///{tmp_path / 'missing.db'}"],
        ["inspect", "postgresql://u:s3cret@[bad"],
        ["prune", url, "--older-than", "7 weeks"],
        ["inspect", str(tmp_path / "s.db")],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err  # type: ignore[attr-defined]
        assert err.count("\n") == 1 and "s3cret" not in err, (argv, err)
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_metrics_until_a_signal(tmp_path: Path, signum: int) -> None:
    """The served figures are the store's own; SIGTERM (SIGINT) ends the server with
    143 (130), as a shell reports a process that signal ended, its store closed (SQLite
    removes the write-ahead log when its last connection closes)."""
    url = made(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "harel_store", "inspect", url, "--serve", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", line)
        assert found, line
        with urllib.request.urlopen(found.group(1), timeout=10) as got:
            text = got.read().decode()
        with SqliteStore(tmp_path / "s.db") as store:
            own = store.overview()
        assert f"harel_store_executions {float(own['executions'])}" in text
        assert f"harel_store_outbox {float(own['outbox'])}" in text and own["outbox"] == 9
        assert "harel_store_outbox_oldest_age" in text
        assert (tmp_path / "s.db-wal").exists()  # the server's store is open
        proc.send_signal(signum)
        assert proc.wait(30) == 128 + signum
        rest = proc.stderr.read()
        assert rest.count("\n") == 1 and "stopped serving" in rest, rest
        assert not (tmp_path / "s.db-wal").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_collector_in_a_host_registry(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from harel_store.metrics import StoreCollector

    with SqliteStore(tmp_path / "m.db") as store:
        registry = CollectorRegistry()
        registry.register(StoreCollector(store))
        text = generate_latest(registry).decode()
        assert "harel_store_executions 0.0" in text
        assert "harel_store_outbox_oldest_age" not in text  # nothing pending: left out
