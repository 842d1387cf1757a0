"""The API reference in ``docs/`` has an entry for every public name, and every option
of the command line; the README's links lead to files and sections that exist.

An entry is an autodoc directive naming the object by its public path
(``.. autoclass:: harel_store.sqlite.SqliteStore``), so a name added to ``__all__``
without one fails here, before the docs build (CI, with warnings as errors) would show
the gap only by leaving it out.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PUBLIC_MODULES = (
    "harel_store",
    "harel_store.sqlite",
    "harel_store.postgres",
    "harel_store.statemachine",
    "harel_store.metrics",
)
# Named by the reference whatever their module's __all__ says.
PUBLIC_CLASSES = (
    "harel_store.sqlite.SqliteStore",
    "harel_store.sqlite.AsyncSqliteStore",
    "harel_store.sqlite.JsonCodec",
    "harel_store.sqlite.Codec",
    "harel_store.postgres.PostgresStore",
    "harel_store.postgres.AsyncPostgresStore",
)
ENTRY = re.compile(
    r"^\s*\.\. auto(?:class|exception|function|data|attribute|method|module)::\s+([\w.]+)",
    re.MULTILINE,
)
OPTION = re.compile(r"^\s*\.\. option::\s+(.+)$", re.MULTILINE)
PROGRAM = re.compile(r"^\s*\.\. program::\s+(.+)$", re.MULTILINE)
COMMANDS = {  # the command lines of docs/cli.rst, and their arguments
    "python -m harel_store": (),
    "python -m harel_store copy": ("copy",),
    "python -m harel_store inspect": ("inspect",),
    "python -m harel_store show": ("show",),
    "python -m harel_store prune": ("prune",),
}

# The release checks (tools/check_dists.sh, cibuildwheel) run the suite against an
# installed wheel from a copy of tests/ alone; there is no docs/ to check there. In a
# checkout (harel_store/ beside tests/) a missing docs/ fails.
pytestmark = pytest.mark.skipif(
    not DOCS.is_dir() and not (ROOT / "harel_store").is_dir(),
    reason="the suite runs apart from the sources: no docs/ beside tests/",
)


def public_names() -> Iterator[str]:
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            yield f"{module_name}.{name}"
    yield from PUBLIC_CLASSES


def reference() -> dict[str, str]:
    """The reference's sources, by file name."""
    assert DOCS.is_dir(), f"no {DOCS}: the API reference's sources are missing"
    return {page.name: page.read_text("utf-8") for page in sorted(DOCS.glob("*.rst"))}


def documented() -> set[str]:
    return {name for text in reference().values() for name in ENTRY.findall(text)}


@pytest.mark.parametrize("name", sorted(set(public_names())))
def test_every_public_name_has_an_entry_in_the_reference(name: str) -> None:
    assert name in documented(), (
        f"{name} is public but has no autodoc entry in docs/*.rst: add one "
        "(.. autoclass::, .. autofunction:: or .. autodata:: with its public path)"
    )


def test_every_page_is_in_the_table_of_contents() -> None:
    pages = reference()
    index = pages.pop("index.rst")
    for page in pages:
        assert re.search(rf"^\s+{re.escape(page[: -len('.rst')])}$", index, re.MULTILINE), (
            f"docs/{page} is not in the toctree of docs/index.rst"
        )


def help_options(args: tuple[str, ...]) -> set[str]:
    """The long options ``--help`` of ``python -m harel_store *args`` lists."""
    proc = subprocess.run(
        [sys.executable, "-m", "harel_store", *args, "--help"],
        capture_output=True,
        check=True,
        text=True,
        timeout=60,
    )
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", proc.stdout)) - {"--help"}


@pytest.mark.parametrize("program", sorted(COMMANDS))
def test_every_command_line_option_is_documented(program: str) -> None:
    cli = reference()["cli.rst"]
    sections = PROGRAM.split(cli)  # [before, program, its text, program, its text, ...]
    texts = dict(zip(sections[1::2], sections[2::2], strict=True))
    assert program in texts, f"docs/cli.rst has no '.. program:: {program}'"
    documented_options = {
        word for line in OPTION.findall(texts[program]) for word in re.findall(r"--[\w-]+", line)
    }
    missing = help_options(COMMANDS[program]) - documented_options
    assert not missing, f"docs/cli.rst documents no '.. option::' {sorted(missing)} of {program}"


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_the_readme_links_lead_somewhere() -> None:
    text = README.read_text("utf-8")
    text_outside_code = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", text_outside_code, re.MULTILINE)}
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text_outside_code):
        if target.startswith(("http://", "https://")):
            continue
        if target.startswith("#"):
            if target[1:] not in anchors:
                broken.append(target)
        elif not (ROOT / target.partition("#")[0]).exists():
            broken.append(target)
    assert not broken, f"README links to nothing: {broken}"
    assert "(docs/specification.md)" in text, "the README does not link the specification"
