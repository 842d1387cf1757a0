"""Fixtures that run every store test against both implementations.

``impl`` is parametrized over the pure store (``harel_store._store_py``) and the compiled
one (``harel_store._store_c``, marked ``compiled``); this file is the only place that
imports either module. When the compiled module cannot be imported its tests are skipped,
unless ``HAREL_STORE_REQUIRE_EXTENSIONS`` is set: then they fail, and so does the whole
run unless ``harel_store.IMPLEMENTATION == "compiled"``. ``--no-c-extensions`` deselects
the compiled tests.

``harel_store`` is imported lazily: under a switch that forbids the import, that must show
as a failed run with a clear message, not as a broken conftest.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

# A checkout that is not installed (e.g. after `setup.py build_ext --inplace`) is tested
# in place; an installed package wins otherwise.
if importlib.util.find_spec("harel_store") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _helpers import AsyncAsSync

FUZZ_ENV = "HAREL_STORE_FUZZ"
# No deadline: timing noise must not fail a run. No explain phase: it traces every line
# of every replay, which turns a failure into minutes of waiting.
_COMMON: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow],
    "phases": [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    "report_multiple_bugs": False,
}
settings.register_profile("harel-default", max_examples=100, stateful_step_count=50, **_COMMON)
settings.register_profile("harel-deep", max_examples=2000, stateful_step_count=200, **_COMMON)
_PROFILES = {"": "harel-default", "default": "harel-default", "deep": "harel-deep"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-c-extensions",
        action="store_true",
        default=False,
        help="deselect the tests of the compiled store (harel_store._store_c)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "durable: a test of a durable store (SQLite, PostgreSQL); see DURABLE_MODULES"
    )
    config.addinivalue_line(
        "markers", "compiled: runs against the compiled store, harel_store._store_c"
    )
    fuzz = os.environ.get(FUZZ_ENV, "").strip()
    if fuzz not in _PROFILES:
        raise pytest.UsageError(f"{FUZZ_ENV}={fuzz!r}: expected 'deep' or 'default' or unset")
    settings.load_profile(_PROFILES[fuzz])


def pytest_sessionstart(session: pytest.Session) -> None:
    """Fail the run when a switch forbids the import, or when the compiled store was
    required but this process does not use it."""
    try:
        import harel_store
        from harel_store._env import REQUIRE_EXTENSIONS, switches
    except (ImportError, ValueError) as exc:
        pytest.exit(f"cannot import harel_store: {exc}", returncode=pytest.ExitCode.TESTS_FAILED)
    _, require = switches()
    if require and session.config.getoption("--no-c-extensions"):
        raise pytest.UsageError(f"--no-c-extensions contradicts {REQUIRE_EXTENSIONS}")
    if require and harel_store.IMPLEMENTATION != "compiled":
        pytest.exit(
            f"{REQUIRE_EXTENSIONS} is set but harel_store.IMPLEMENTATION is "
            f"{harel_store.IMPLEMENTATION!r}, not 'compiled'",
            returncode=pytest.ExitCode.TESTS_FAILED,
        )


# Tests of the durable stores: the modules about them, and the contract tests on a durable
# kind. `-m "not durable"` runs the rest (the release checks do, for every wheel: the
# durable stores are pure Python, tested once by the main run).
DURABLE_MODULES = {
    "test_sqlite", "test_durable", "test_postgres", "test_demo_durable", "test_copy", "test_errors",
}  # fmt: skip
DURABLE_KINDS = ("sqlite-", "postgres")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        kind = getattr(getattr(item, "callspec", None), "params", {}).get("make_store", "")
        if item.module.__name__ in DURABLE_MODULES or str(kind).startswith(DURABLE_KINDS):
            item.add_marker(pytest.mark.durable)
    if not config.getoption("--no-c-extensions"):
        return
    kept = [item for item in items if item.get_closest_marker("compiled") is None]
    deselected = [item for item in items if item.get_closest_marker("compiled") is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@dataclass(frozen=True)
class Impl:
    """One store implementation: its sync class and an async twin wrapping it."""

    name: str
    DictStore: type[Any]
    AsyncDictStore: type[Any]


_MODULES = {"pure": "harel_store._store_py", "compiled": "harel_store._store_c"}
_IMPLS: dict[str, Impl] = {}


def store_module(name: str) -> ModuleType:
    """The module of implementation ``name``; a missing compiled module skips the test,
    or fails it under ``HAREL_STORE_REQUIRE_EXTENSIONS``."""
    from harel_store._env import REQUIRE_EXTENSIONS, switches

    if name == "pure":
        return importlib.import_module(_MODULES["pure"])
    try:
        return importlib.import_module(_MODULES["compiled"])
    except ImportError as exc:
        if switches()[1]:
            pytest.fail(f"{REQUIRE_EXTENSIONS} is set: {exc}", pytrace=False)
        pytest.skip(
            f"the compiled store is not built ({exc}); "
            "build it with `python setup.py build_ext --inplace` or `pip install .`"
        )


def load_impl(name: str) -> Impl:
    if name not in _IMPLS:
        import harel_store

        sync_type = store_module(name).DictStore

        class AsyncStore(harel_store.AsyncDictStore):
            __slots__ = ()
            _sync_type = sync_type

        AsyncStore.__qualname__ = AsyncStore.__name__ = f"AsyncDictStore[{name}]"
        _IMPLS[name] = Impl(name, sync_type, AsyncStore)
    return _IMPLS[name]


IMPL_PARAMS = [
    pytest.param("pure", id="pure"),
    pytest.param("compiled", id="compiled", marks=pytest.mark.compiled),
]


@pytest.fixture(params=IMPL_PARAMS)
def impl(request: pytest.FixtureRequest) -> Impl:
    return load_impl(request.param)


@pytest.fixture
def pure_impl() -> Impl:
    return load_impl("pure")


@pytest.fixture
def pure_module() -> ModuleType:
    return store_module("pure")


@pytest.fixture
def compiled_module() -> ModuleType:
    return store_module("compiled")


@pytest.fixture
def store(impl: Impl) -> Any:
    return impl.DictStore()


@pytest.fixture
def astore(impl: Impl) -> Any:
    return impl.AsyncDictStore()


@pytest.fixture(params=["sync", "async"])
def make_any_store(request: pytest.FixtureRequest, impl: Impl) -> Callable[..., Any]:
    """Build a store of ``impl`` with the sync API: the sync store itself, or the async
    store behind :class:`AsyncAsSync`, which runs each coroutine with ``asyncio.run``."""
    if request.param == "sync":
        return impl.DictStore
    return lambda **kwargs: AsyncAsSync(impl.AsyncDictStore(**kwargs))


@pytest.fixture
def any_store(make_any_store: Callable[..., Any]) -> Any:
    return make_any_store()


# The conformance suite: one fixture that makes stores of every kind. A contract test
# takes `make_store` (or `cstore`) and decides what to expect from the capability
# attributes `preserves_identity` and `durable`, never from the kind's name. Each kind is
# a function (request, tmp_path) -> factory; a factory called twice in one test gives
# two store objects on the same database (for a memory kind: two independent stores).
def _memory_kind(name: str, asynchronous: bool) -> Callable[..., Any]:
    def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
        impl = load_impl(name)
        if not asynchronous:
            return impl.DictStore
        return lambda **kwargs: AsyncAsSync(impl.AsyncDictStore(**kwargs))

    return kind


STORE_KINDS: dict[str, Callable[..., Any]] = {
    "memory-pure": _memory_kind("pure", False),
    "memory-compiled": _memory_kind("compiled", False),
    "memory-pure-async": _memory_kind("pure", True),
    "memory-compiled-async": _memory_kind("compiled", True),
}
_KIND_MARKS: dict[str, list[Any]] = {
    "memory-compiled": [pytest.mark.compiled],
    "memory-compiled-async": [pytest.mark.compiled],
}


# The SQLite kinds. "sqlite-file": every call of the factory opens another store object
# on one database file of the test. "sqlite-memory": ":memory:" is the private database of
# one connection, so a second call with the same options returns the same store object
# (the only one that can see that database); other options open another database.
def _sqlite_file_kind(asynchronous: bool) -> Callable[..., Any]:
    def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
        from harel_store.sqlite import AsyncSqliteStore, SqliteStore

        path = tmp_path / "store.db"
        if not asynchronous:
            return lambda **kwargs: SqliteStore(path, **kwargs)
        return lambda **kwargs: AsyncAsSync(AsyncSqliteStore(path, **kwargs))

    return kind


def _sqlite_memory_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    from harel_store.sqlite import SqliteStore

    opened: dict[str, Any] = {}

    def make(**kwargs: Any) -> Any:
        key = repr(sorted(kwargs.items()))
        store = opened.get(key)
        if store is None or store._conn is None:  # none yet, or closed: a new database
            store = opened[key] = SqliteStore(":memory:", **kwargs)
        return store

    return make


STORE_KINDS.update(
    {
        "sqlite-file": _sqlite_file_kind(False),
        "sqlite-memory": _sqlite_memory_kind,
        "sqlite-file-async": _sqlite_file_kind(True),
    }
)


# The PostgreSQL kinds, on the server of `pg_server` (tests/_pg.py: the one named by
# HAREL_STORE_PG_URL, or a throwaway cluster; without either the tests are skipped, or
# fail under HAREL_STORE_REQUIRE_POSTGRES). Each test gets a schema of its own, dropped
# after it: every call of the factory opens another store object on that schema.
# "postgres-async" runs the async store on one event loop per test.
@pytest.fixture(scope="session")
def pg_server() -> Any:
    """The PostgreSQL server of this session (a `_pg.Server`)."""
    import _pg

    try:
        server = _pg.acquire()
    except Exception as exc:  # noqa: BLE001 - any reason there is no server is shown
        reason = f"no PostgreSQL server for the tests: {exc}"
        if _pg.required():
            pytest.fail(f"{_pg.REQUIRE_ENV} is set: {reason}", pytrace=False)
        pytest.skip(reason)
    yield server
    server.destroy()


@pytest.fixture
def pg_schema(pg_server: Any) -> Any:
    """A fresh schema name on `pg_server`, dropped after the test."""
    import _pg

    name = _pg.fresh_schema()
    yield name
    _pg.drop_schema(pg_server.url, name)


def _postgres_kind(asynchronous: bool) -> Callable[..., Any]:
    def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
        import asyncio

        server = request.getfixturevalue("pg_server")
        schema = request.getfixturevalue("pg_schema")
        from harel_store.postgres import AsyncPostgresStore, PostgresStore

        if not asynchronous:
            return lambda **kwargs: PostgresStore(server.url, schema=schema, **kwargs)
        loop = asyncio.new_event_loop()
        request.addfinalizer(loop.close)  # after make_store closed the stores
        return lambda **kwargs: AsyncAsSync(
            AsyncPostgresStore(server.url, schema=schema, **kwargs),
            runner=loop.run_until_complete,
        )

    return kind


STORE_KINDS.update({"postgres": _postgres_kind(False), "postgres-async": _postgres_kind(True)})


STORE_KIND_PARAMS = [
    pytest.param(name, id=name, marks=_KIND_MARKS.get(name, [])) for name in STORE_KINDS
]


@pytest.fixture(params=STORE_KIND_PARAMS)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A factory of stores of one kind; every store it made is closed after the test."""
    factory = STORE_KINDS[request.param](request, tmp_path)
    made: list[Any] = []

    def make(**options: Any) -> Any:
        store = factory(**options)
        made.append(store)
        return store

    yield make
    for store in reversed(made):
        store.close()


@pytest.fixture
def cstore(make_store: Callable[..., Any]) -> Any:
    """One store of the kind under test."""
    return make_store()
