"""``python -m harel_store``: the demonstration runs and checks itself, on both stores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

NO_EXTENSIONS = "HAREL_STORE_NO_EXTENSIONS"
REQUIRE_EXTENSIONS = "HAREL_STORE_REQUIRE_EXTENSIONS"


def run_module(*args: str, pure_env: bool = False, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``python -m harel_store ARGS`` on the ``harel_store`` the tests import."""
    import harel_store

    env = dict(os.environ)
    root = str(Path(harel_store.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if pure_env:
        env[NO_EXTENSIONS] = "1"
        env.pop(REQUIRE_EXTENSIONS, None)  # both set is an error by design
    return subprocess.run(
        [sys.executable, "-W", "error", "-m", "harel_store", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
    )


def info_fields(stdout: str) -> dict[str, str]:
    fields = {}
    for line in stdout.splitlines()[1:]:
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return fields


# -- the command line -------------------------------------------------------------------


def test_demo_default_store(tmp_path: Path) -> None:
    import harel_store

    proc = run_module("-n", "300", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"harel-store {harel_store.__version__}: ")
    assert f" {harel_store.IMPLEMENTATION} store " in first
    assert "executions/s" in proc.stdout and "commits/s" in proc.stdout
    assert "OK: every order completed or timed out as planned" in proc.stdout


def test_demo_pure_flag(tmp_path: Path) -> None:
    proc = run_module("-n", "300", "--quiet", "--pure", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ": pure store (harel_store._store_py)" in proc.stdout.splitlines()[0]
    assert "OK:" in proc.stdout


def test_demo_under_no_extensions(tmp_path: Path) -> None:
    proc = run_module("-n", "300", "--quiet", pure_env=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ": pure store (harel_store._store_py)" in proc.stdout.splitlines()[0]


def test_info(tmp_path: Path) -> None:
    import harel_store

    proc = run_module("--info", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"harel-store {harel_store.__version__}"
    fields = info_fields(proc.stdout)
    assert fields["implementation"] == harel_store.IMPLEMENTATION
    assert Path(fields["store file"]).is_file()
    assert fields["python"].startswith(".".join(map(str, sys.version_info[:3])))
    if harel_store.IMPLEMENTATION == "compiled":
        assert fields["store module"] == "harel_store._store_c"
        assert fields["cython"]  # the version it was built with, or "unknown"
    else:
        assert fields["store module"] == "harel_store._store_py"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_info_pure(how: str, tmp_path: Path) -> None:
    if how == "flag":
        proc = run_module("--info", "--pure", cwd=tmp_path)
    else:
        proc = run_module("--info", pure_env=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    fields = info_fields(proc.stdout)
    assert fields["implementation"] == "pure"
    assert fields["store module"] == "harel_store._store_py"
    assert fields["store file"].endswith("_store_py.py")
    assert fields["cython"].startswith("not used")


def test_version(tmp_path: Path) -> None:
    import harel_store

    proc = run_module("--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"harel-store {harel_store.__version__}\n"


def test_bad_count_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_module("-n", "0", cwd=tmp_path)
    assert proc.returncode == 2
    assert "at least 1" in proc.stderr


# -- in process -------------------------------------------------------------------------


def test_run(impl: Any) -> None:
    from harel_store._demo import run

    result = run(400, impl.DictStore)
    assert result["problems"] == []
    assert result["orders"] == 400
    assert result["completed"] + result["timed_out"] == 400
    assert 0 < result["timed_out"] < result["completed"]  # both paths taken
    assert result["executions"] == 2 + 400 + 2 * result["completed"]
    assert result["redeliveries_skipped"] > 0
    assert result["duplicate_spawns_skipped"] > 0
    assert result["commits"] > 10 * 400
    assert result["executions_per_s"] > 0 and result["commits_per_s"] > 0
    assert set(result["stats_after_forget"].values()) == {0}


def test_run_is_deterministic(impl: Any) -> None:
    from harel_store._demo import run

    timing = ("elapsed", "orders_per_s", "executions_per_s", "commits_per_s")

    def counts(seed: int) -> dict[str, Any]:
        result = run(300, impl.DictStore, seed=seed)
        return {k: v for k, v in result.items() if k not in timing}

    assert counts(7) == counts(7)
    assert counts(7) != counts(8)


def test_run_reports_progress(impl: Any) -> None:
    from harel_store._demo import run

    calls: list[tuple[int, int]] = []
    run(600, impl.DictStore, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (600, 600)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_run_of_nothing(impl: Any) -> None:
    from harel_store._demo import run

    result = run(0, impl.DictStore)
    assert result["problems"] == []
    assert result["executions"] == 2


def test_run_catches_a_store_that_forgets_what_it_processed(pure_impl: Any) -> None:
    """The self-check is real: a store whose dedupe is broken fails the run."""
    from harel_store._demo import run

    class NoDedupe(pure_impl.DictStore):  # type: ignore[misc]
        def is_processed(self, execution_id: object, event_id: object) -> bool:
            return False

    result = run(300, NoDedupe)
    assert any(p.startswith("redeliveries skipped") for p in result["problems"])


def test_main_exits_nonzero_when_a_check_fails(
    pure_impl: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import harel_store.cli.demo as cli

    class LosesTimers(pure_impl.DictStore):  # type: ignore[misc]
        def due_timers(self, now: float) -> list[Any]:
            return []

    monkeypatch.setattr(cli, "PureDictStore", LosesTimers)
    assert cli.main(["-n", "100", "--quiet", "--pure"]) == 1
    assert "FAILED" in capsys.readouterr().err


def test_main_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    import harel_store.cli.demo as cli

    assert cli.main(["-n", "100", "--quiet"]) == 0
    assert "OK:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "store", ["postgresql://me@db/app?password=s3cret", "postgresq://me:s3cret@db/app"]
)
def test_refusals_show_no_password(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    import harel_store.cli.demo as cli

    assert cli.main(["--pure", "--store", store, "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert "***" in err and "s3cret" not in err


def test_copy_after_the_quiet_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import harel_store
    from harel_store.cli import main

    src, dst = f"sqlite:///{tmp_path}/src.db", f"sqlite:///{tmp_path}/dst.db"
    harel_store.open_store(src).close()
    assert main(["--quiet", "copy", src, dst]) == 0
    assert capsys.readouterr().out.startswith(f"copied {src} to {dst} in ")
    assert main(["-n", "5", "copy", src, dst]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m harel_store: error: copy takes its own options, after it")
    assert err.count("\n") == 1
