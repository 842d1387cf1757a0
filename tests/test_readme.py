"""The README runs as written: every ```python block, under the default and the pure
implementation, and every shell command, either here or in CI."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import harel_store

README = Path(__file__).resolve().parent.parent / "README.md"
PYPROJECT = README.parent / "pyproject.toml"
# The first screen of the README, which must say what the package is for on every store.
FIRST_SCREEN_LINES = 25
STORES = ("memory", "compiled", "pure Python", "SQLite", "PostgreSQL")

# The set-up commands of a fresh machine, which CI runs exactly as written.
SETUP_COMMANDS = (
    "pip install . && python -m harel_store",
    "pip install -e '.[test]' && pytest",
)
# Every other README command that CI runs; the `python -m harel_store` ones run here.
CI_COMMANDS = (
    *SETUP_COMMANDS,
    "HAREL_STORE_NO_EXTENSIONS=1 pip install .",
    "HAREL_STORE_REQUIRE_EXTENSIONS=1 pip install .",
    "bash tools/build_dists.sh && bash tools/check_dists.sh",
    "pip install --no-index --find-links dist harel-store",
    "pip install --no-index dist/harel_store-*-py3-none-any.whl",
    "PYTHON=python perf/smoke.sh",
    "pip install -e '.[docs]' && python -m sphinx -W --keep-going -b html docs docs/_build/html",
)
NO_EXTENSIONS = "HAREL_STORE_NO_EXTENSIONS"
REQUIRE_EXTENSIONS = "HAREL_STORE_REQUIRE_EXTENSIONS"


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block, indented ones (in lists) included."""
    blocks: list[tuple[str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = lines[i].lstrip(" ")
        if not opening.startswith("```"):
            i += 1
            continue
        indent = len(lines[i]) - len(opening)
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        blocks.append((opening[3:].strip(), "\n".join(body) + "\n"))
        i += 1
    return blocks


def readme_blocks(language: str) -> list[str]:
    return [body for lang, body in fenced_blocks(README.read_text("utf-8")) if lang == language]


def shell_commands() -> list[str]:
    return [
        line.strip()
        for body in readme_blocks("sh")
        for line in body.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def subprocess_env(pure: bool) -> dict[str, str]:
    """This environment, with the ``harel_store`` the tests import first on the path."""
    import harel_store

    env = dict(os.environ)
    root = str(Path(harel_store.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if pure:
        env[NO_EXTENSIONS] = "1"
        env.pop(REQUIRE_EXTENSIONS, None)  # both set is an error by design
    return env


PYTHON_BLOCKS = readme_blocks("python")


def test_readme_has_python_examples() -> None:
    assert len(PYTHON_BLOCKS) >= 3


def first_paragraph(text: str) -> str:
    """The README's first paragraph of prose, after the title, on one line."""
    paragraphs = [p for p in text.split("\n\n") if p.strip() and not p.startswith("#")]
    return " ".join(paragraphs[0].split())


def project_description() -> str:
    """``description`` of ``[project]`` in pyproject.toml (no tomllib before 3.11)."""
    text = PYPROJECT.read_text("utf-8")
    project = text[text.index("\n[project]\n") :]
    found = re.search(r'^description = "([^"]*)"$', project, re.MULTILINE)
    assert found, "pyproject.toml: no description in [project]"
    return found.group(1)


def test_the_package_description_is_the_readme_first_sentence() -> None:
    description = project_description()
    assert first_paragraph(README.read_text("utf-8")) == description.rstrip(".") + "."


def test_the_first_screen_says_what_it_is_for_on_every_store() -> None:
    first_screen = "\n".join(README.read_text("utf-8").splitlines()[:FIRST_SCREEN_LINES])
    missing = [store for store in STORES if store not in first_screen]
    assert not missing, f"the README's first {FIRST_SCREEN_LINES} lines never name {missing}"


@pytest.mark.parametrize("mode", ["default", "pure"])
@pytest.mark.parametrize(
    "code", PYTHON_BLOCKS, ids=[f"block{i}" for i in range(1, len(PYTHON_BLOCKS) + 1)]
)
def test_python_block_runs(code: str, mode: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=tmp_path,
        env=subprocess_env(pure=mode == "pure"),
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def sqlite_in(url: str, directory: Path) -> str:
    """A relative ``sqlite:///`` URL of the README, made absolute in ``directory``."""
    assert url.startswith("sqlite:///") and not url.startswith("sqlite:////"), url
    return f"sqlite:///{directory / url[len('sqlite:///') :]}"


@pytest.mark.parametrize("command", SETUP_COMMANDS)
def test_setup_command_is_in_readme_exactly(command: str) -> None:
    assert command in shell_commands()


@pytest.mark.parametrize("command", shell_commands())
def test_every_command_is_run_by_ci_or_here(command: str, tmp_path: Path) -> None:
    if command in CI_COMMANDS:
        return
    words = shlex.split(command)
    n_assignments = 0
    while n_assignments < len(words) and "=" in words[n_assignments]:
        n_assignments += 1
    assignments, argv = words[:n_assignments], words[n_assignments:]
    assert argv[:3] == ["python", "-m", "harel_store"], (
        f"README command {command!r} is run neither by this test nor by CI: "
        "run it here, or add it to CI and to CI_COMMANDS"
    )
    copying = argv[3:4] == ["copy"]
    if copying or argv[3:4] in (["inspect"], ["show"], ["prune"]):
        # the source a reader has by then: a store with something in it
        with harel_store.open_store(sqlite_in(argv[4], tmp_path)) as source:
            source.commit(harel_store.Execution(id="order-1"), [("shipping", {"n": 1})])
    env = subprocess_env(pure=False)
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        env[name] = value
        if name == NO_EXTENSIONS:
            env.pop(REQUIRE_EXTENSIONS, None)
    proc = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    if copying:
        with harel_store.open_store(sqlite_in(argv[5], tmp_path)) as copied:
            assert copied.load("order-1") is not None
            assert [e.event for e in copied.pending_outbox()] == [{"n": 1}]
    if f"{NO_EXTENSIONS}=1" in assignments and "--info" in argv:
        assert "implementation: pure" in proc.stdout
