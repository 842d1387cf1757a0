"""The protocols are true under ``mypy --strict``: an engine's relay, sweeper and batch
writer typed against them accept every store class and what ``open_store`` returns, and
misuses are refused (tests/typing/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _helpers import AsyncAsSync
from mypy import api

from harel_store import AsyncExecutionStore, ExecutionStore

TYPING = Path(__file__).resolve().parent / "typing"


def mypy(path: Path, cache: Path) -> tuple[str, set[int]]:
    """The report, and the lines of ``path`` it flags (the package's own errors are the
    lint step's: here only what the file does with the protocols counts)."""
    args = ["--strict", "--no-incremental", "--cache-dir", str(cache)]
    out, err, _ = api.run([*args, "--python-version", "3.10", str(path)])
    report = out + err
    flagged = set()
    for line in report.splitlines():
        where, _, message = line.partition(": error:")
        if message and Path(where.split(":")[0]).name == path.name:
            flagged.add(int(where.split(":")[1]))
    return report, flagged


def test_an_engine_typed_against_the_protocols_takes_every_store(tmp_path: Path) -> None:
    report, flagged = mypy(TYPING / "engine.py", tmp_path)
    assert "Success" in report or " error" in report, report  # mypy ran to its summary
    assert flagged == set(), report


def test_misuses_are_refused(tmp_path: Path) -> None:
    source = (TYPING / "misuse.py").read_text("utf-8").splitlines()
    expected = {n for n, line in enumerate(source, 1) if line.rstrip().endswith("# refused")}
    report, flagged = mypy(TYPING / "misuse.py", tmp_path)
    assert flagged == expected, report


def test_every_store_is_an_instance_of_its_protocol(make_store: Any) -> None:
    store = make_store()
    if isinstance(store, AsyncAsSync):
        assert isinstance(store._astore, AsyncExecutionStore)
        assert not isinstance(store._astore, ExecutionStore)
    else:
        assert isinstance(store, ExecutionStore)
        assert not isinstance(store, AsyncExecutionStore)
