"""The package's layers: no import circle inside ``harel_store``, and no module imports a
layer above its own.

Read with ``ast`` from the source files (the installed package's, or the checkout's), so
every import counts: at module level, inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import harel_store

ROOT = Path(harel_store.__file__).resolve().parent
PACKAGE = "harel_store"

# Bottom to top; a module may import its own layer's modules and those below.
LAYERS: list[tuple[str, ...]] = [
    ("_env", "_version", "_errors", "_redact", "_records", "_digest", "_codec"),
    ("_checks", "_protocols"),
    ("_transfer", "_group", "_operate", "_listing"),
    ("_store_py", "_store_c", "_store", "_aio", "sqlite", "postgres"),
    ("_open", "_copy"),
    ("__init__",),
    ("_demo", "cli", "__main__", "statemachine", "metrics"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def sources() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*")):
        if path.suffix in (".py", ".pyx") and "__pycache__" not in path.parts:
            found[module_name(path)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The ``harel_store`` modules that ``name`` imports (a package counts as its
    ``__init__``)."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".pyx":  # cimports and typed declarations are not Python: keep imports
        text = "\n".join(
            line
            for line in text.splitlines()
            if line.startswith(("from ", "import ")) and " cimport " not in line
        )
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                stem = ".".join(base[: len(base) - node.level + 1])
                module = f"{stem}.{node.module}" if node.module else stem
            else:
                module = node.module or ""
            # `from . import sqlite` imports the submodule; `from . import X` a name of it.
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            # A module of ours that is not here is the compiled store of a pure install:
            # no edge. Anything else outside the package is not ours.
            if target in known and target != name:
                found.add(target)
    return found


def extensions() -> set[str]:
    """Compiled modules, which an installed wheel holds without their ``.pyx``."""
    found = set()
    for path in ROOT.rglob("*"):
        if path.suffix in (".so", ".pyd"):
            stem = path.name.split(".", 1)[0]
            found.add(module_name(path.with_name(stem + ".py")))
    return found


def graph() -> dict[str, set[str]]:
    files = sources()
    known = set(files) | extensions()
    return {name: imports(name, path, known) for name, path in files.items()}


def layer(name: str) -> int:
    top = name.split(".")[1] if name != PACKAGE else "__init__"
    for index, members in enumerate(LAYERS):
        if top in members:
            return index
    raise AssertionError(f"{name} is in no layer of LAYERS: place it")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_walk_sees_the_imports() -> None:
    edges = graph()
    assert f"{PACKAGE}._checks" in edges[f"{PACKAGE}._store_py"]
    assert f"{PACKAGE}._store" in edges[PACKAGE]
    assert len(edges) >= 20


def test_no_import_circle() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_only_point_down() -> None:
    upward = [
        f"{name} -> {target}"
        for name, targets in graph().items()
        for target in targets
        if layer(target) > layer(name)
    ]
    assert upward == []


def test_the_release_check_lists_every_module() -> None:
    """tools/inspect_dists.py's PACKAGE_FILES is what a wheel must hold: a module added to
    the package and not to it fails the release step, so it fails here first."""
    tools = Path(__file__).resolve().parent.parent / "tools" / "inspect_dists.py"
    if not tools.is_file():
        pytest.skip("the suite runs apart from the sources: no tools/ beside tests/")
    tree = ast.parse(tools.read_text())
    listed = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "PACKAGE_FILES" for t in node.targets)
    )
    present = {
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*")
        if (path.suffix == ".py" or path.name == "py.typed") and "__pycache__" not in path.parts
    }
    assert present == listed
