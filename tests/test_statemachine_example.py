"""examples/order_chart.py runs as its docstring says: an order chart kept in SQLite,
resumed after its worker is killed, then moved to another store (a second SQLite file,
or PostgreSQL)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("statemachine", reason="python-statemachine is the extra 'statemachine'")

from harel_store import open_store

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "order_chart.py"
pytestmark = [
    pytest.mark.durable,
    pytest.mark.skipif(not EXAMPLE.exists(), reason="the examples are not here"),
]


def run_example(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    root = str(EXAMPLE.parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLE), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def check_output(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    assert "killed with SIGKILL (exit -9)" in out
    assert out.count("(already handled)") >= 6  # what the worker did before its kill
    assert "an hour later: 1 due" in out
    assert "order-5: ['cancelled']" in out
    assert "warehouse reserved for ['order-1', 'order-2', 'order-3', 'order-4']" in out


def check_moved(url: str) -> None:
    with open_store(url) as store:
        for n in range(1, 5):
            assert store.load(f"order-{n}").active_path == ("shipped",)
            assert store.is_processed(f"order-{n}", f"order-{n}:pay")
        assert store.load("order-5").active_path == ("cancelled",)
        assert store.due_timers(1e18) == [] and store.pending_outbox() == []


def test_the_example_on_sqlite(tmp_path: Path) -> None:
    proc = run_example("--dir", str(tmp_path), cwd=tmp_path)
    check_output(proc)
    check_moved(f"sqlite:///{tmp_path / 'orders-moved.db'}")


def test_the_example_moves_to_postgres(pg_server: Any, tmp_path: Path) -> None:
    import psycopg

    name = f"orders_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = re.sub(r"/postgres(\?|$)", rf"/{name}\1", pg_server.url, count=1)
    assert name in url
    try:
        proc = run_example("--dir", str(tmp_path), "--to", url, cwd=tmp_path)
        check_output(proc)
        assert f"4. moved to postgresql://{url.rpartition('@')[2]}" in proc.stdout
        check_moved(url)
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
