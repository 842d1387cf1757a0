"""The two environment switches: how they are parsed, which store an import chooses under
them (in a fresh interpreter each time), and the test-session gate of
``HAREL_STORE_REQUIRE_EXTENSIONS``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import harel_store
from harel_store._env import (
    COMPILED_SOURCES,
    NO_EXTENSIONS,
    REQUIRE_EXTENSIONS,
    is_truthy,
    switches,
)

TESTS = Path(__file__).resolve().parent
PACKAGE_ROOT = Path(harel_store.__file__).resolve().parent.parent
BLOCK_EXTENSION = "import sys; sys.modules['harel_store._store_c'] = None  # import fails\n"
PRINT_IMPLEMENTATION = "import harel_store; print(harel_store.IMPLEMENTATION)"


def test_switch_names() -> None:
    assert (NO_EXTENSIONS, REQUIRE_EXTENSIONS) == (
        "HAREL_STORE_NO_EXTENSIONS",
        "HAREL_STORE_REQUIRE_EXTENSIONS",
    )


@pytest.mark.parametrize(
    ("value", "on"),
    [
        (None, False),
        ("", False),
        ("0", False),
        (" 0 ", False),
        ("  ", False),
        ("1", True),
        (" 1\n", True),
        ("yes", True),
        ("true", True),
        ("no", True),  # documented: any non-empty value but "0" turns a switch on
        ("00", True),
    ],
)
def test_is_truthy(value: str | None, on: bool) -> None:
    assert is_truthy(value) is on


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, (False, False)),
        ({NO_EXTENSIONS: "1"}, (True, False)),
        ({REQUIRE_EXTENSIONS: "yes"}, (False, True)),
        ({NO_EXTENSIONS: "0", REQUIRE_EXTENSIONS: "1"}, (False, True)),
        ({NO_EXTENSIONS: "1", REQUIRE_EXTENSIONS: " 0 "}, (True, False)),
        ({NO_EXTENSIONS: "", REQUIRE_EXTENSIONS: ""}, (False, False)),
    ],
)
def test_switches(environ: dict[str, str], expected: tuple[bool, bool]) -> None:
    assert switches(environ) == expected


def test_both_switches_on_is_an_error() -> None:
    with pytest.raises(ValueError, match=f"{NO_EXTENSIONS}.*{REQUIRE_EXTENSIONS}"):
        switches({NO_EXTENSIONS: "1", REQUIRE_EXTENSIONS: "1"})


def test_switches_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NO_EXTENSIONS, raising=False)
    monkeypatch.delenv(REQUIRE_EXTENSIONS, raising=False)
    assert switches() == (False, False)
    monkeypatch.setenv(NO_EXTENSIONS, "1")
    assert switches() == (True, False)
    monkeypatch.setenv(REQUIRE_EXTENSIONS, "1")
    with pytest.raises(ValueError):
        switches()


def environment(switch_values: dict[str, str], *paths: Path) -> dict[str, str]:
    """This process's environment with only the given switches set, and ``paths`` and
    this very ``harel_store`` first on the import path."""
    env = {k: v for k, v in os.environ.items() if k not in (NO_EXTENSIONS, REQUIRE_EXTENSIONS)}
    env.update(switch_values)
    path = [*map(str, paths), str(PACKAGE_ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, path))
    return env


def python(code: str, switch_values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, with only the given switches set."""
    env = environment(switch_values)
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def implementation(switch_values: dict[str, str], *, block_extension: bool = False) -> str:
    code = (BLOCK_EXTENSION if block_extension else "") + PRINT_IMPLEMENTATION
    done = python(code, switch_values)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("value", ["1", "yes", " true "])
def test_no_extensions_chooses_the_pure_store(value: str) -> None:
    assert implementation({NO_EXTENSIONS: value}) == "pure"


@pytest.mark.compiled
@pytest.mark.parametrize("value", [None, "", "0", " 0 "], ids=["unset", "empty", "0", "spaced-0"])
def test_a_normal_import_chooses_the_compiled_store(
    compiled_module: ModuleType, value: str | None
) -> None:
    assert implementation({} if value is None else {NO_EXTENSIONS: value}) == "compiled"


@pytest.mark.compiled
def test_require_extensions_with_the_extension_built(compiled_module: ModuleType) -> None:
    assert implementation({REQUIRE_EXTENSIONS: "1"}) == "compiled"


# Where each module that a build compiles from its own source was loaded from.
PRINT_SOURCES = (
    "import importlib, harel_store._env as env\n"
    "for name in env.COMPILED_SOURCES:\n"
    "    print(importlib.import_module(name).__file__)\n"
)


def loaded_from(switch_values: dict[str, str]) -> list[str]:
    done = python(PRINT_SOURCES, switch_values)
    assert done.returncode == 0, done.stderr
    files = done.stdout.split()
    assert len(files) == len(COMPILED_SOURCES)
    return files


def test_no_extensions_loads_the_compiled_sources_as_python() -> None:
    files = loaded_from({NO_EXTENSIONS: "1"})
    assert all(f.endswith(".py") for f in files), files
    for name, file in zip(COMPILED_SOURCES, files):
        assert Path(file).resolve() == PACKAGE_ROOT / (name.replace(".", "/") + ".py")


@pytest.mark.compiled
def test_a_normal_import_loads_the_compiled_sources_compiled(compiled_module: ModuleType) -> None:
    from importlib.machinery import EXTENSION_SUFFIXES

    files = loaded_from({REQUIRE_EXTENSIONS: "1"})
    assert all(f.endswith(tuple(EXTENSION_SUFFIXES)) for f in files), files


def test_this_session_loads_the_sources_the_switches_ask_for() -> None:
    import importlib

    files = [importlib.import_module(name).__file__ or "" for name in COMPILED_SOURCES]
    no_ext, require = switches()
    if no_ext:
        assert all(f.endswith(".py") for f in files), files
    if require:
        assert not any(f.endswith(".py") for f in files), files


def test_an_extension_that_cannot_load_falls_back_to_pure() -> None:
    assert implementation({}, block_extension=True) == "pure"


def test_require_extensions_turns_the_fallback_into_an_import_error() -> None:
    done = python(BLOCK_EXTENSION + PRINT_IMPLEMENTATION, {REQUIRE_EXTENSIONS: "1"})
    assert done.returncode != 0 and done.stdout == ""
    assert "ImportError" in done.stderr and REQUIRE_EXTENSIONS in done.stderr


def test_both_switches_make_the_import_fail() -> None:
    done = python(PRINT_IMPLEMENTATION, {NO_EXTENSIONS: "1", REQUIRE_EXTENSIONS: "1"})
    assert done.returncode != 0 and done.stdout == ""
    assert "ValueError" in done.stderr
    assert NO_EXTENSIONS in done.stderr and REQUIRE_EXTENSIONS in done.stderr


def test_this_session_runs_what_the_switches_ask_for() -> None:
    no_ext, require = switches()
    if no_ext:
        assert harel_store.IMPLEMENTATION == "pure"
    if require:
        assert harel_store.IMPLEMENTATION == "compiled"


# The session gate, seen from outside: a pytest run in a subprocess, with a plugin that
# either makes the extension unimportable or imports harel_store while the extension is
# unimportable and REQUIRE is hidden (a silent fallback, as a broken selector would do).
BLOCK_PLUGIN = BLOCK_EXTENSION
FALLBACK_PLUGIN = BLOCK_EXTENSION + (
    "import os\n"
    f"required = os.environ.pop({REQUIRE_EXTENSIONS!r}, None)\n"
    "import harel_store\n"
    "assert harel_store.IMPLEMENTATION == 'pure'\n"
    f"if required is not None: os.environ[{REQUIRE_EXTENSIONS!r}] = required\n"
)


def pytest_run(
    tmp_path: Path, plugin: str, *args: str, switch_values: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run pytest on this suite in a subprocess, with ``plugin`` loaded first."""
    (tmp_path / "harel_test_plugin.py").write_text(plugin)
    env = environment(switch_values or {}, tmp_path)
    command = [sys.executable, "-m", "pytest", "-p", "harel_test_plugin", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, *args],
        check=False,
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


ONE_TEST = f"{TESTS / 'test_records.py'}::test_default_trace_max"


@pytest.mark.parametrize(
    "plugin", [BLOCK_PLUGIN, FALLBACK_PLUGIN], ids=["no-extension", "silent-fallback"]
)
def test_the_session_fails_when_the_extension_is_required_but_not_used(
    tmp_path: Path, plugin: str
) -> None:
    done = pytest_run(tmp_path, plugin, "-q", ONE_TEST, switch_values={REQUIRE_EXTENSIONS: "1"})
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert REQUIRE_EXTENSIONS in done.stdout + done.stderr
    assert "1 passed" not in done.stdout


def test_the_same_session_passes_when_not_required(tmp_path: Path) -> None:
    done = pytest_run(tmp_path, FALLBACK_PLUGIN, "-q", ONE_TEST)
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_no_c_extensions_deselects_the_compiled_tests(tmp_path: Path) -> None:
    node = f"{TESTS / 'test_store.py'}::TestLoadAndSave::test_load_unknown_is_none"
    done = pytest_run(tmp_path, "", "--collect-only", "-q", "--no-c-extensions", node)
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert collected and all("compiled" not in line for line in collected)
    assert any("pure" in line for line in collected)
    assert "deselected" in done.stdout
