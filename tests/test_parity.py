"""The compiled module mirrors the pure one: same public names, same store surface, same
signatures. Behaviour is compared by every other test, run on both."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _helpers import API_METHODS, EXTRA_METHODS

pytestmark = pytest.mark.compiled

METHODS = (*API_METHODS, *EXTRA_METHODS, "_record_trace")


def public_names(module: ModuleType) -> set[str]:
    """Names a user of ``module`` could rely on: not underscored, not a module, and not
    an import from outside the package (``deque``, ``typing.Any``, ``annotations``)."""
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, ModuleType):
            continue
        origin = getattr(value, "__module__", None)
        if origin is None or origin.startswith("harel_store"):
            names.add(name)
    return names


def store_surface(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_same_public_names(pure_module: ModuleType, compiled_module: ModuleType) -> None:
    expected = {
        "DictStore",
        "DEFAULT_TRACE_MAX",
        "OutboxEntry",
        "SpawnEntry",
        "StoreConflict",
        "IdempotencyConflict",
        "StaleWriter",
        "TimerOp",
    }
    assert public_names(pure_module) == expected
    assert public_names(compiled_module) == public_names(pure_module)


def test_shared_records_and_errors(pure_module: ModuleType, compiled_module: ModuleType) -> None:
    """Both use the very same classes, so ``except`` and ``isinstance`` do not care which
    store is active."""
    for name in public_names(pure_module) - {"DictStore"}:
        assert getattr(compiled_module, name) is getattr(pure_module, name), name


def test_same_store_surface(pure_module: ModuleType, compiled_module: ModuleType) -> None:
    assert store_surface(pure_module.DictStore) == set(API_METHODS + EXTRA_METHODS) | {
        "trace_max",
        "preserves_identity",
        "durable",
    }
    assert store_surface(compiled_module.DictStore) == store_surface(pure_module.DictStore)
    assert callable(compiled_module.DictStore._record_trace)


@pytest.mark.parametrize("method", METHODS)
def test_same_signature(pure_module: ModuleType, compiled_module: ModuleType, method: str) -> None:
    """Names, kinds and defaults of the parameters (``self`` aside: the compiled store
    makes it positional-only); annotations live in the pure module only."""

    def shape(store: Any) -> list[tuple[str, Any, Any]]:
        signature = inspect.signature(getattr(store, method))
        return [(p.name, p.kind, p.default) for p in signature.parameters.values()]

    assert shape(compiled_module.DictStore()) == shape(pure_module.DictStore())


def test_trace_max_is_a_settable_attribute(
    pure_module: ModuleType, compiled_module: ModuleType
) -> None:
    for module in (pure_module, compiled_module):
        descriptor = inspect.getattr_static(module.DictStore, "trace_max")
        assert inspect.isdatadescriptor(descriptor), module.__name__


# The compiled module's own helpers, which the pure one does without: C-level record
# construction and untracking, the typed record classes, the heap walk, its version, and
# the direct access to an exact Execution's id and version slots.
COMPILED_ONLY = {
    "_OutboxEntry", "_SpawnEntry", "_TimerOp", "_Commit", "_new3", "_new5", "_untracked", "_collect_due",
    "__cython_version__", "_Execution", "_MemberType", "_ID_DESCR", "_VERSION_DESCR",
    "_exe_tag", "_slot_offset", "_ID_AT", "_VERSION_AT", "_slots_checked", "_own_slots",
    "_slot_at", "_exe_attr",
    "_own",  # checks what _checks returns, which the compiled module reads unchecked
}  # fmt: skip
PURE_ONLY = {
    "_new",  # tuple.__new__, which the compiled module replaces with _new3/_new5
    "_headroom",  # the recursion probe of a write phase that calls functions
    "_INF",  # with _NEG_INF, a finiteness check that makes no float (C compares doubles)
    "_NEG_INF",
    "_finite",  # a caller's clock checked as it is read (the compiled _now checks it)
}
PYX = Path(__file__).resolve().parents[1] / "harel_store" / "_store_c.pyx"
PYX_NAME = re.compile(
    r"^(?:cdef\s+(?:inline\s+)?(?:class\s+)?(?:[\w\[\]]+\s+)?|def\s+|class\s+)?(\w+)\s*[(:=]",
    re.MULTILINE,
)


def top_level_names(source: str) -> list[str]:
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name):
                names.append(target.id)
    return names


def test_the_pyx_mirrors_the_pure_module_name_for_name(pure_module: ModuleType) -> None:
    """Module-level names of ``_store_c.pyx`` and ``_store_py.py``: the same, in the same
    order, but for the helpers listed above."""
    if not PYX.is_file():
        pytest.skip(f"no source beside the tests ({PYX}): a run against an installed wheel")
    pyx = [n for n in PYX_NAME.findall(PYX.read_text()) if n not in COMPILED_ONLY]
    pure_source = Path(pure_module.__file__ or "").read_text()
    pure = [n for n in top_level_names(pure_source) if n not in PURE_ONLY]
    assert pyx == pure
