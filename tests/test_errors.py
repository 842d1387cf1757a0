"""What a caller sees when the database fails (issue 32): only the store's own errors.

No exception of a driver (psycopg, sqlite3) escapes any public method of a durable store,
``copy_store`` or the command line: each public method of each durable store is driven
into a database failure (PostgreSQL: a read-only session, dropped tables, a terminated
backend; SQLite: a read-only file, dropped tables) and what it raises must be a
``StoreError``. On PostgreSQL each error says whether to retry (the connection was
lost, the server is read-only or shutting down, a serialization failure or deadlock) or
to fix the setup (privileges, a missing table, a unique violation); a connection that
saw the server turn read-only is never used again. Copies that fail midway write
nothing and fail with a ``StoreError``. No message, ``repr`` or traceback shows a
password, in any form a URL or conninfo can hold it. Ids longer than a durable key are
a ``ValueError`` before anything is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import AsyncAsSync
from _keyed import KEYED_CALLS

import harel_store
from harel_store import (
    Commit,
    DictStore,
    Execution,
    StoreConflict,
    StoreError,
    TimerOp,
    copy_store,
)
from harel_store._checks import KEY_BYTES_MAX
from harel_store._open import redact
from harel_store.sqlite import AsyncSqliteStore, SqliteStore

TESTS = str(Path(__file__).resolve().parent)
ROOT = str(Path(harel_store.__file__).resolve().parent.parent)


# --- every public method, into a database failure ---------------------------------------


def fill(store: Any) -> None:
    """One of everything, through the sync API."""
    store.commit(
        Execution(id="e1"), [("t", 1)], "v1", [TimerOp("schedule", "p", 1.0)],
        [("c", "r", {})], {"k": 1},
    )  # fmt: skip


def filled_memory() -> DictStore:
    store = DictStore()
    fill(store)
    return store


def commit_new(store: Any) -> None:
    store.commit(
        Execution(id="new"), [("t", 2)], "v2", [TimerOp("schedule", "q", 2.0)],
        [("c2", "r", {})], {"k": 2}, commit_id="c1",
    )  # fmt: skip


# Each public method of a durable store, called on a store that holds what fill() wrote
# (`store`), and copy_store both ways (into `empty`, a store with nothing in it).
CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "load": lambda s, e: s.load("e1"),
    "save": lambda s, e: s.save(Execution(id="new")),
    "commit": lambda s, e: commit_new(s),
    "commit_many": lambda s, e: s.commit_many([Commit(Execution(id="new"), [("t", 2)])]),
    "is_processed": lambda s, e: s.is_processed("e1", "v1"),
    "pending_outbox": lambda s, e: s.pending_outbox(),
    "ack_outbox": lambda s, e: s.ack_outbox(1),
    "ack_outbox_many": lambda s, e: s.ack_outbox_many([1, 2]),
    "claim_outbox": lambda s, e: s.claim_outbox(),
    "pending_spawns": lambda s, e: s.pending_spawns(),
    "ack_spawn": lambda s, e: s.ack_spawn(1),
    "ack_spawn_many": lambda s, e: s.ack_spawn_many([1, 2]),
    "claim_spawns": lambda s, e: s.claim_spawns(),
    "due_timers": lambda s, e: s.due_timers(5.0),
    "claim_due_timers": lambda s, e: s.claim_due_timers(5.0),
    "delete_timer": lambda s, e: s.delete_timer("e1", "p", 1.0),
    "delete_timer_many": lambda s, e: s.delete_timer_many([("e1", "p", 1.0)]),
    "append_trace": lambda s, e: s.append_trace("e1", {"k": 3}),
    "read_trace": lambda s, e: s.read_trace("e1"),
    "forget": lambda s, e: s.forget("e1"),
    "stats": lambda s, e: s.stats(),
    "wait_for_work": lambda s, e: s.wait_for_work(0.05),
    "overview": lambda s, e: s.overview(),
    "list_executions": lambda s, e: s.list_executions(),
    "prune": lambda s, e: s.prune(60.0),
    "copy_store from": lambda s, e: copy_store(s, DictStore()),
    "copy_store into": lambda s, e: copy_store(filled_memory(), e),
}
COPIES = ("copy_store from", "copy_store into")
WRITES = (
    "save", "commit", "commit_many", "ack_outbox", "ack_outbox_many", "claim_outbox",
    "ack_spawn", "ack_spawn_many", "claim_spawns", "claim_due_timers", "delete_timer",
    "delete_timer_many", "append_trace", "forget", "prune", "copy_store into",
)  # fmt: skip
NOT_DATABASE = {"close", "pool_stats"}  # the public methods that use no database


def calls_for(store: Any) -> dict[str, Callable[[Any, Any], Any]]:
    """:data:`CALLS`, without the copies for an async store (copy_store takes sync ones)."""
    if hasattr(store, "_dump"):
        return CALLS
    return {name: call for name, call in CALLS.items() if name not in COPIES}


def outcome(call: Callable[[], Any]) -> str:
    """``"ok"``, ``"StoreError: ..."`` for the store's errors, else ``"LEAK ..."``."""
    try:
        call()
    except StoreError as exc:
        return f"StoreError: {exc}"
    except BaseException as exc:  # noqa: BLE001 - that is what is looked for
        return f"LEAK {type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    return "ok"


def drive(store: Any, empty: Any) -> dict[str, str]:
    return {
        name: outcome(lambda c=call: c(store, empty)) for name, call in calls_for(store).items()
    }


def check(outcomes: dict[str, str], failing: tuple[str, ...]) -> None:
    """Nothing leaked, and at least the calls ``failing`` failed (the failure is real)."""
    leaked = {name: what for name, what in outcomes.items() if what.startswith("LEAK")}
    assert leaked == {}, leaked
    expected = [name for name in failing if name in outcomes]
    passed = [name for name in expected if not outcomes[name].startswith("StoreError")]
    assert passed == [], f"these calls did not meet the failure: {passed}"


@pytest.mark.parametrize(
    "cls", ["SqliteStore", "AsyncSqliteStore", "PostgresStore", "AsyncPostgresStore"]
)
def test_the_calls_cover_every_public_method(cls: str) -> None:
    if cls.startswith(("Postgres", "AsyncPostgres")):
        module: Any = pytest.importorskip("harel_store.postgres")
    else:
        module = harel_store.sqlite
    store_class = getattr(module, cls)
    public = {
        name
        for name in dir(store_class)
        if not name.startswith("_") and callable(getattr(store_class, name))
    }
    missing = public - NOT_DATABASE - set(CALLS)
    assert missing == set(), f"add {sorted(missing)} to CALLS in tests/test_errors.py"


# --- SQLite: dropped tables, a read-only file -----------------------------------------------


def sqlite_files(tmp_path: Path) -> tuple[Path, Path]:
    path, empty = tmp_path / "store.db", tmp_path / "empty.db"
    with SqliteStore(path) as store:
        fill(store)
    SqliteStore(empty).close()
    return path, empty


def open_sqlite(kind: str, path: Path) -> Any:
    if kind == "sync":
        return SqliteStore(path)
    return AsyncAsSync(AsyncSqliteStore(path))


def drop_sqlite_tables(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        names = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        for name in names:
            conn.execute(f'DROP TABLE "{name}"')
        conn.commit()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_no_sqlite_error_escapes_when_the_tables_are_dropped(kind: str, tmp_path: Path) -> None:
    path, empty_path = sqlite_files(tmp_path)
    store, empty = open_sqlite(kind, path), open_sqlite(kind, empty_path)
    try:
        store.stats()
        empty.stats()
        drop_sqlite_tables(path)
        drop_sqlite_tables(empty_path)
        outcomes = drive(store, empty)
    finally:
        store.close()
        empty.close()
    check(outcomes, tuple(name for name in CALLS if name != "wait_for_work"))


def child_outcomes(kind: str, path: str, empty_path: str) -> dict[str, str]:
    """:func:`drive` on the SQLite stores of ``path`` and ``empty_path`` (run by a child
    process that cannot write them)."""
    store, empty = open_sqlite(kind, Path(path)), open_sqlite(kind, Path(empty_path))
    try:
        return drive(store, empty)
    finally:
        store.close()
        empty.close()


CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import test_errors
print(json.dumps(test_errors.child_outcomes(*sys.argv[2:])))
"""


def without_root(command: list[str]) -> list[str]:
    """``command``, run without root's power to write any file (or a skip)."""
    if getattr(os, "geteuid", lambda: -1)() != 0:
        return command
    command = ["setpriv", "--bounding-set=-all", *command]
    if (
        shutil.which("setpriv") is None
        or subprocess.run([*command[:2], "true"], check=False).returncode
    ):
        pytest.skip("running as root, and setpriv cannot drop the capabilities")
    return command


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_no_sqlite_error_escapes_from_a_read_only_file(kind: str, tmp_path: Path) -> None:
    path, empty_path = sqlite_files(tmp_path)
    for file in (path, empty_path):
        file.chmod(0o444)
    command = without_root([sys.executable, "-c", CHILD, TESTS, kind, str(path), str(empty_path)])
    try:
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=300, cwd=ROOT
        )
    finally:
        for file in (path, empty_path):
            file.chmod(0o644)
    assert done.returncode == 0, done.stderr
    outcomes = json.loads(done.stdout)
    check(outcomes, WRITES)
    assert "readonly" in outcomes["commit"]


# --- PostgreSQL: a read-only session, dropped tables, a terminated backend -------------------


@pytest.fixture
def pg(pg_server: Any) -> Any:
    return pytest.importorskip("psycopg")


@pytest.fixture
def schemas(pg_server: Any, pg_schema: str) -> Iterator[tuple[str, str]]:
    """The test's schema and a second one, for an empty store."""
    import _pg

    second = _pg.fresh_schema()
    yield pg_schema, second
    _pg.drop_schema(pg_server.url, second)


def sql(url: str, statement: str, params: Any = None) -> list[Any]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def conninfo(url: str, **settings: Any) -> str:
    import psycopg

    return psycopg.conninfo.make_conninfo(url, **settings)  # type: ignore[no-any-return]


READ_ONLY = {"options": "-c default_transaction_read_only=on"}


def open_pg(kind: str, url: str, schema: str, **options: Any) -> Any:
    from harel_store.postgres import AsyncPostgresStore, PostgresStore

    if kind == "sync":
        return PostgresStore(url, schema=schema, **options)
    return AsyncAsSync(AsyncPostgresStore(url, schema=schema, **options))


@contextlib.contextmanager
def pg_pair(kind: str, url: str, schemas: tuple[str, str], **settings: Any) -> Iterator[Any]:
    """A store holding what fill() wrote and an empty one, of ``kind``, on a conninfo
    with ``settings``; both opened (an async store opens at its first call)."""
    full, bare = schemas
    with open_pg("sync", url, full) as store:
        fill(store)
    open_pg("sync", url, bare).close()
    target = conninfo(url, **settings)
    store, empty = open_pg(kind, target, full), open_pg(kind, target, bare)
    try:
        store.stats()
        empty.stats()
        yield store, empty
    finally:
        store.close()
        empty.close()


KINDS = ["sync", "async"]


@pytest.mark.parametrize("kind", KINDS)
def test_no_psycopg_error_escapes_a_read_only_session(
    pg: Any, kind: str, pg_server: Any, schemas: tuple[str, str]
) -> None:
    with pg_pair(kind, pg_server.url, schemas, **READ_ONLY) as (store, empty):
        outcomes = drive(store, empty)
    check(outcomes, WRITES)
    assert "read-only" in outcomes["commit"] and "Retry" in outcomes["commit"]
    with open_pg("sync", pg_server.url, schemas[0]) as store:  # nothing was written
        assert store.load("new") is None
        assert [e.event for e in store.pending_outbox()] == [1]
        assert store.stats()["timers"] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_no_psycopg_error_escapes_when_the_tables_are_dropped(
    pg: Any, kind: str, pg_server: Any, schemas: tuple[str, str]
) -> None:
    with pg_pair(kind, pg_server.url, schemas) as (store, empty):
        for schema in schemas:
            tables = sql(
                pg_server.url, "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
            )
            names = ", ".join(f'"{schema}"."{name}"' for (name,) in tables)
            sql(pg_server.url, f"DROP TABLE {names} CASCADE")
        outcomes = drive(store, empty)
    check(outcomes, tuple(CALLS))
    assert "Fix the setup" in outcomes["load"] and "42P01" in outcomes["load"]


def backends(url: str, app: str, waiting: bool = False) -> list[int]:
    lock = " AND wait_event_type = 'Lock'" if waiting else ""
    rows = sql(url, f"SELECT pid FROM pg_stat_activity WHERE application_name = %s{lock}", (app,))
    return [pid for (pid,) in rows]


def terminated_mid_call(
    url: str, app: str, schemas: tuple[str, str], call: Callable[[], Any]
) -> str:
    """Run ``call`` in a thread while every table of ``schemas`` is locked; once it waits
    for the lock (or has run half a second), terminate every backend of ``app``, then
    release the lock; what the call did."""
    import psycopg

    result: list[str] = []
    with psycopg.connect(url) as lock:
        tables = lock.execute(
            "SELECT format('%%I.%%I', schemaname, tablename) FROM pg_tables"
            " WHERE schemaname = ANY (%s)",
            (list(schemas),),
        ).fetchall()
        lock.execute(f"LOCK TABLE {', '.join(t for (t,) in tables)} IN ACCESS EXCLUSIVE MODE")
        thread = threading.Thread(target=lambda: result.append(outcome(call)))
        thread.start()
        start = time.monotonic()
        while thread.is_alive() and time.monotonic() - start < 10:
            if backends(url, app, waiting=True) or time.monotonic() - start > 0.5:
                break
            time.sleep(0.02)
        for pid in backends(url, app):
            sql(url, "SELECT pg_terminate_backend(%s)", (pid,))
        lock.rollback()
    thread.join(120)
    assert not thread.is_alive()
    return result[0]


@pytest.mark.parametrize("kind", KINDS)
def test_no_psycopg_error_escapes_a_terminated_backend(
    pg: Any, kind: str, pg_server: Any, schemas: tuple[str, str]
) -> None:
    app = f"harel-errors-{uuid.uuid4().hex[:8]}"
    with pg_pair(kind, pg_server.url, schemas, application_name=app) as (store, empty):
        calls = dict(calls_for(store))
        calls["wait_for_work"] = lambda s, e: s.wait_for_work(1.0)
        outcomes = {
            name: terminated_mid_call(pg_server.url, app, schemas, lambda c=call: c(store, empty))
            for name, call in calls.items()
        }
    # A read is retried once on a new connection (and passes); a write that may have
    # been applied is not: its outcome is unknown.
    check(outcomes, ("commit", "save", "append_trace", "copy_store from", "copy_store into"))
    assert "whether it was applied is unknown" in outcomes["commit"]
    assert outcomes["load"] == "ok"


# --- PostgreSQL: what each error means -----------------------------------------------------------


def test_a_read_only_session_says_retry_and_writes_nothing(
    pg: Any, pg_server: Any, pg_schema: str
) -> None:
    from harel_store.postgres import PostgresStore

    with PostgresStore(pg_server.url, schema=pg_schema) as store:
        fill(store)
    exe = Execution(id="e1", version=1)
    with PostgresStore(conninfo(pg_server.url, **READ_ONLY), schema=pg_schema) as store:
        with pytest.raises(StoreError) as info:
            store.commit(exe, [("t", 2)], "v2")
        assert type(info.value.__cause__) is pg.errors.ReadOnlySqlTransaction
        message = str(info.value)
        assert "refused commit(); nothing of it was applied" in message
        assert "[SQLSTATE 25006]" in message and "Retry: the session is read-only" in message
        assert exe.version == 1
        with pytest.raises(StoreError, match="25006"):
            store.ack_outbox(1)
        assert store.load("e1").version == 1  # reads go on
        assert [e.seq for e in store.pending_outbox()] == [1]


@pytest.mark.parametrize("kind", KINDS)
def test_a_connection_that_turned_read_only_is_never_used_again(
    pg: Any, kind: str, pg_server: Any, pg_schema: str
) -> None:
    """As after a failover: a pooled connection whose server turned read-only. A call
    that may run twice passes on a new connection; a commit raises (retry), and the next
    one passes; the read-only connection is closed."""
    from harel_store.postgres import AsyncPostgresStore, PostgresStore

    if kind == "async":  # one event loop: the store's pool belongs to the loop it runs on
        asyncio.run(_read_only_async(AsyncPostgresStore(pg_server.url, schema=pg_schema)))
        return
    store = PostgresStore(pg_server.url, schema=pg_schema)

    def turn_read_only() -> Any:
        conn = store._pool._pool._pool[0]  # psycopg-pool's idle deque: its first goes next
        conn.execute("SET default_transaction_read_only = on")
        return conn

    try:
        fill(store)
        first = turn_read_only()
        store.ack_outbox(1)  # refused on it, retried on another
        assert first.closed
        assert store.pending_outbox() == []
        second = turn_read_only()
        exe = Execution(id="e2")
        with pytest.raises(StoreError, match="Retry: the session is read-only"):
            store.commit(exe, [("t", 2)])
        assert second.closed and exe.version == 0
        assert all(conn not in (first, second) for conn in store._pool._pool._pool)
        store.commit(exe, [("t", 2)])
        assert exe.version == 1
    finally:
        store.close()


async def _read_only_async(store: Any) -> None:
    async def turn_read_only() -> Any:
        conn = store._pool._pool._pool[0]
        await conn.execute("SET default_transaction_read_only = on")
        return conn

    try:
        await store.commit(
            Execution(id="e1"), [("t", 1)], "v1", [TimerOp("schedule", "p", 1.0)],
            [("c", "r", {})], {"k": 1},
        )  # fmt: skip
        first = await turn_read_only()
        await store.ack_outbox(1)  # refused on it, retried on another
        assert first.closed
        assert await store.pending_outbox() == []
        second = await turn_read_only()
        exe = Execution(id="e2")
        with pytest.raises(StoreError, match="Retry: the session is read-only"):
            await store.commit(exe, [("t", 2)])
        assert second.closed and exe.version == 0
        assert all(conn not in (first, second) for conn in store._pool._pool._pool)
        await store.commit(exe, [("t", 2)])
        assert exe.version == 1
    finally:
        await store.close()


@pytest.fixture
def restricted(pg_server: Any, pg_schema: str) -> Iterator[Callable[..., str]]:
    """Make a role that can log in with only the grants given; its conninfo."""
    made: list[str] = []

    def make(*grants: str) -> str:
        role = f"harel_ro_{uuid.uuid4().hex[:10]}"
        made.append(role)
        sql(pg_server.url, f'CREATE ROLE "{role}" LOGIN')
        for grant in grants:
            sql(pg_server.url, grant.format(s=f'"{pg_schema}"', r=f'"{role}"'))
        return conninfo(pg_server.url, user=role)

    yield make
    for role in made:
        sql(pg_server.url, f'DROP OWNED BY "{role}"')
        sql(pg_server.url, f'DROP ROLE "{role}"')


@pytest.mark.parametrize("kind", KINDS)
def test_a_role_without_write_privileges_says_fix_the_setup(
    pg: Any, kind: str, pg_server: Any, pg_schema: str, restricted: Callable[..., str]
) -> None:
    with open_pg("sync", pg_server.url, pg_schema) as store:
        fill(store)
    reader = restricted(
        "GRANT USAGE ON SCHEMA {s} TO {r}",
        "GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {r}",
        "GRANT SELECT ON ALL SEQUENCES IN SCHEMA {s} TO {r}",
    )
    store = open_pg(kind, reader, pg_schema)
    try:
        assert store.load("e1").version == 1
        exe = Execution(id="e2")
        with pytest.raises(StoreError) as info:
            store.commit(exe, [("t", 2)])
        assert type(info.value.__cause__) is pg.errors.InsufficientPrivilege
        assert "[SQLSTATE 42501]" in str(info.value)
        assert "Fix the setup, a retry will fail too: the role lacks a privilege" in str(info.value)
        assert exe.version == 0
        with pytest.raises(StoreError, match="42501"):
            store.ack_outbox(1)
    finally:
        store.close()
    nobody = restricted()  # not even USAGE on the schema: opening says so
    with pytest.raises(StoreError, match="cannot open .*42501.*Fix the setup") as info:
        store = open_pg(kind, nobody, pg_schema)
        try:
            store.load("e1")
        finally:
            store.close()
    assert isinstance(info.value.__cause__, pg.errors.InsufficientPrivilege)


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_table_says_fix_the_setup(
    pg: Any, kind: str, pg_server: Any, pg_schema: str
) -> None:
    store = open_pg(kind, pg_server.url, pg_schema)
    try:
        fill(store)
        sql(pg_server.url, f'DROP TABLE "{pg_schema}".outbox')
        with pytest.raises(StoreError) as info:
            store.pending_outbox()
        assert type(info.value.__cause__) is pg.errors.UndefinedTable
        assert "[SQLSTATE 42P01]" in str(info.value)
        assert "Fix the setup, a retry will fail too: a table of the store is missing" in str(
            info.value
        )
    finally:
        store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_unique_violation_says_fix_the_setup(
    pg: Any, kind: str, pg_server: Any, pg_schema: str
) -> None:
    """Rows the store never writes twice, written twice after a hand-made change: a
    trace index set back, an outbox sequence restarted."""
    store = open_pg(kind, pg_server.url, pg_schema)
    try:
        fill(store)
        sql(pg_server.url, f'UPDATE "{pg_schema}".trace_index SET next_index = 0')
        with pytest.raises(StoreError) as info:
            store.append_trace("e1", {"k": 2})
        assert type(info.value.__cause__) is pg.errors.UniqueViolation
        assert "[SQLSTATE 23505]" in str(info.value) and "Fix the setup" in str(info.value)
        sql(pg_server.url, f'ALTER SEQUENCE "{pg_schema}".outbox_seq RESTART WITH 1')
        exe = store.load("e1")
        with pytest.raises(StoreError) as info:
            store.commit(exe, [("t", 2)])
        assert not isinstance(info.value, StoreConflict)  # not a commit id's race
        assert "[SQLSTATE 23505]" in str(info.value) and "Fix the setup" in str(info.value)
        assert exe.version == 1
        assert [e.event for e in store.pending_outbox()] == [1]
    finally:
        store.close()


# --- copying with PostgreSQL ---------------------------------------------------------------------


def everything_of(store: Any) -> dict[str, Any]:
    return {
        "stats": store.stats(),
        "outbox": store.pending_outbox(),
        "load": store.load("e1"),
    }


def test_a_copy_from_postgres_whose_backend_is_terminated_writes_nothing(
    pg: Any, pg_server: Any, pg_schema: str, tmp_path: Path
) -> None:
    app = f"harel-copy-{uuid.uuid4().hex[:8]}"
    with open_pg("sync", pg_server.url, pg_schema) as store:
        fill(store)

    def terminate(done: int, total: int | None) -> None:
        for pid in backends(pg_server.url, app):
            sql(pg_server.url, "SELECT pg_terminate_backend(%s)", (pid,))

    with open_pg("sync", conninfo(pg_server.url, application_name=app), pg_schema) as src:
        with SqliteStore(tmp_path / "dst.db") as dst:
            with pytest.raises(StoreError, match="the connection to PostgreSQL .* failed during"):
                copy_store(src, dst, progress=terminate)
            assert dst.stats() == dict.fromkeys(dst.stats(), 0)
        assert src.load("e1").version == 1  # the store goes on, on a new connection


def test_a_copy_into_postgres_whose_backend_is_terminated_writes_nothing(
    pg: Any, pg_server: Any, pg_schema: str
) -> None:
    app = f"harel-copy-{uuid.uuid4().hex[:8]}"

    def terminate(done: int, total: int | None) -> None:
        for pid in backends(pg_server.url, app):
            sql(pg_server.url, "SELECT pg_terminate_backend(%s)", (pid,))

    target = conninfo(pg_server.url, application_name=app)
    with (
        open_pg("sync", target, pg_schema) as dst,
        pytest.raises(StoreError, match="failed during copy_store.*nothing was written"),
    ):
        copy_store(filled_memory(), dst, progress=terminate)
    with open_pg("sync", pg_server.url, pg_schema) as dst:
        assert dst.stats() == dict.fromkeys(dst.stats(), 0)


def test_a_copy_into_a_read_only_postgres_writes_nothing(
    pg: Any, pg_server: Any, pg_schema: str
) -> None:
    open_pg("sync", pg_server.url, pg_schema).close()
    with open_pg("sync", conninfo(pg_server.url, **READ_ONLY), pg_schema) as dst:
        with pytest.raises(StoreError, match="25006.*Retry: the session is read-only") as info:
            copy_store(filled_memory(), dst)
        assert "nothing was written" in str(info.value)
        assert isinstance(info.value.__cause__, pg.errors.ReadOnlySqlTransaction)
    with open_pg("sync", pg_server.url, pg_schema) as dst:
        assert dst.stats() == dict.fromkeys(dst.stats(), 0)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harel_store", *args],
        check=False, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


def test_the_copy_command_fails_in_one_line_on_a_read_only_destination(
    pg: Any, pg_server: Any, tmp_path: Path
) -> None:
    src = f"sqlite:///{tmp_path}/src.db"
    with harel_store.open_store(src) as store:
        fill(store)
    # The command copies into the default schema: made here when it is not there, and
    # refused (before any emptiness check: it locks the tables first) on a read-only
    # session.
    made = not sql(pg_server.url, "SELECT FROM pg_namespace WHERE nspname = 'harel_store'")
    harel_store.open_store(pg_server.url).close()
    url = f"{pg_server.url}&options=-c%20default_transaction_read_only%3Don"
    try:
        done = run_cli("copy", "--quiet", src, url)
    finally:
        if made:
            sql(pg_server.url, "DROP SCHEMA harel_store CASCADE")
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("python -m harel_store copy: error: cannot copy ")
    assert "25006" in lines[0] and "nothing was written" in lines[0]


# --- passwords --------------------------------------------------------------------------------

SECRET = "PW7x"  # every password below holds it; no text may


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://me:secret@db:5432/app", "postgresql://me:***@db:5432/app"),
        ("postgresql://me@db/app?password=secret&sslmode=require",
         "postgresql://me@db/app?password=***&sslmode=require"),
        ("postgres://db/app?%70assword=secret", "postgres://db/app?%70assword=***"),
        ("postgresql://db/app?sslpassword=secret", "postgresql://db/app?sslpassword=***"),
        ("postgresql://me:se%zzcret@db/app", "postgresql://me:***@db/app"),
        ("postgresql://me:secret@[db/app", "postgresql://me:***@[db/app"),
        ("postgresql://me:se/cret@db/app", "postgresql://me:***@db/app"),
        ("postgresql://db:5432/app?user=me@corp", "postgresql://db:5432/app?user=me@corp"),
        ("host=db password=secret dbname=app", "host=db password=*** dbname=app"),
        ("host=db password = 'se cret' dbname=app", "host=db password = *** dbname=app"),
        ("host=db password='it\\'s' dbname=app", "host=db password=*** dbname=app"),
        ("host=db password=se cret dbname=app", "host=db password=*** dbname=app"),
        ("host=db password='unterminated dbname=app", "host=db password=***"),
        ("host=db sslpassword=secret", "host=db sslpassword=***"),
        ("host=db password secret", "host=db password ***"),
        ("in URI: \"postgresql://me:secret@[db\"", "in URI: \"postgresql://me:***@[db\""),
        ("a message with password=secret in it", "a message with password=*** in it"),
        ("sqlite:////tmp/a:b@c.db", "sqlite:////tmp/a:b@c.db"),
        ("memory:", "memory:"),
    ],
)  # fmt: skip
def test_redact_hides_the_password_of_every_form(text: str, shown: str) -> None:
    assert redact(text) == shown


@pytest.mark.parametrize(
    ("message", "conninfo", "shown"),
    [
        ('invalid percent-encoded token: "PW%zzPW"', "postgresql://me:PW%zzPW@db/app",
         'invalid percent-encoded token: "***"'),
        ('missing "=" after "PWx" in connection info string', "host=db password=PW PWx",
         'missing "=" after "***" in connection info string'),
        ('invalid integer value "PW" for connection option "port"', "postgresql://me:PW/PW@db",
         'invalid integer value "***" for connection option "port"'),
        ('in URI: "postgresql://me:PWPW@[db"', "postgresql://me:PWPW@[db",
         'in URI: "postgresql://me:***@[db"'),
        ("the role me with PWPWPW", "host=db password='PWPWPW'", "the role me with ***"),
        ("the role me with PW%41PW", "postgresql://me:PWAPW@db/app", "the role me with ***"),
        ("the role me with PWAPW", "postgresql://me:PW%41PW@db/app", "the role me with ***"),
        ("the role me with PW", "postgresql://me:PW@db/app", "the role me with PW"),  # short
    ],
)  # fmt: skip
def test_redact_hides_the_passwords_of_a_conninfo_in_a_message(
    message: str, conninfo: str, shown: str
) -> None:
    assert redact(message, conninfo) == shown


FORMS = {
    "userinfo, a bad %-escape": f"postgresql://me:{SECRET}%zz{SECRET}@127.0.0.1:1/db",
    "userinfo, an unclosed [": f"postgresql://me:{SECRET}{SECRET}@[127.0.0.1/db",
    "userinfo": f"postgresql://me:{SECRET}{SECRET}@127.0.0.1:1/db",
    "userinfo, %-encoded": f"postgresql://me:{SECRET}%41{SECRET}@127.0.0.1:1/db",
    "userinfo, a '/' in it": f"postgresql://me:{SECRET}/{SECRET}@127.0.0.1:1/db",
    "query password": f"postgresql://me@127.0.0.1:1/db?password={SECRET}{SECRET}",
    "query password, a bad %-escape": f"postgresql://me@127.0.0.1:1/db?password={SECRET}%zz",
    "query sslpassword": f"postgresql://me@127.0.0.1:1/db?sslpassword={SECRET}{SECRET}",
    "key=value": f"host=127.0.0.1 port=1 password={SECRET}{SECRET}",
    "key=value, quoted": f"host=127.0.0.1 port=1 password='{SECRET} {SECRET}'",
    "key=value, unterminated": f"host=127.0.0.1 port=1 password='{SECRET} {SECRET}",
    "key=value, a space in it": f"host=127.0.0.1 port=1 password={SECRET} {SECRET}x",
}


async def load_once(cls: Any, conninfo: str) -> Any:
    store = cls(conninfo, timeout=2.0)
    try:
        return await store.load("e1")
    finally:
        await store.close()


def shows_no_secret(exc: BaseException) -> None:
    for text in (str(exc), repr(exc), "".join(traceback.format_exception(exc))):
        assert SECRET not in text, text


@pytest.mark.parametrize("conninfo", FORMS.values(), ids=list(FORMS))
def test_no_error_shows_a_password(pg: Any, conninfo: str) -> None:
    from harel_store.postgres import AsyncPostgresStore, PostgresStore

    errors: list[BaseException] = []
    for attempt in (
        lambda: harel_store.open_store(conninfo, timeout=2.0),
        lambda: PostgresStore(conninfo, timeout=2.0),
        lambda: asyncio.run(load_once(AsyncPostgresStore, conninfo)),
    ):
        with pytest.raises((StoreError, ValueError)) as info:
            attempt()
        errors.append(info.value)
    for exc in errors:
        shows_no_secret(exc)


# The command line's own check of SRC_URL (harel_store/cli/_common.py, StoreURL.check)
# takes a key=value conninfo, which has no ':', for a SQLite path and repeats it whole
# in its hint; the command line is not this module's to change.


@pytest.mark.parametrize(
    "conninfo",
    [pytest.param(form, id=name) for name, form in FORMS.items()],
)
def test_the_copy_command_shows_no_password(pg: Any, conninfo: str, tmp_path: Path) -> None:
    done = run_cli("copy", conninfo, f"sqlite:///{tmp_path}/never.db")
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert SECRET not in done.stdout + done.stderr, done.stderr


def test_a_bad_conninfo_is_a_value_error_before_any_connection(pg: Any) -> None:
    from harel_store.postgres import AsyncPostgresStore

    with pytest.raises(ValueError) as info:
        AsyncPostgresStore(f"postgresql://me:{SECRET}%zz@db/app")  # no I/O in the constructor
    assert str(info.value) == (
        "libpq cannot read the conninfo 'postgresql://me:***@db/app': invalid "
        'percent-encoded token: "***"'
    )
    assert info.value.__cause__ is None and info.value.__context__ is None


# --- PostgreSQL: ids longer than a key ---------------------------------------------------------

LONG = "k" * (KEY_BYTES_MAX + 1)
LONGEST = "k" * KEY_BYTES_MAX


def too_long(named: str, size: int = KEY_BYTES_MAX + 1) -> str:
    return (
        f"{named} is {size:,} bytes in UTF-8; a durable store holds ids of at most "
        f"{KEY_BYTES_MAX:,} bytes"
    )


def everything(store: Any) -> dict[str, Any]:
    ids = ("e1", "e2")
    return {
        "load": {i: store.load(i) for i in ids},
        "outbox": store.pending_outbox(),
        "spawns": store.pending_spawns(),
        "timers": store.due_timers(float("inf")),
        "trace": {i: store.read_trace(i) for i in ids},
        "processed": {i: store.is_processed(i, "v1") for i in ids},
        "stats": store.stats(),
    }


@pytest.mark.parametrize(
    ("call", "named"),
    KEYED_CALLS,
)
def test_a_postgres_id_longer_than_a_key_is_a_value_error_naming_it_and_nothing_is_written(
    pg: Any, pg_server: Any, pg_schema: str, call: Any, named: str
) -> None:
    with open_pg("sync", pg_server.url, pg_schema) as store:
        store.commit(Execution(id="e1"), [("t", "first")], "v1", [TimerOp("schedule", "p", 1.0)])
        before = everything(store)
        with pytest.raises(ValueError) as info:
            call(store, LONG)
        assert str(info.value) == too_long(named)
        assert everything(store) == before
        call(store, LONGEST)  # a key of the longest length is taken


def test_postgres_ids_of_the_longest_length_are_kept_and_found(
    pg: Any, pg_server: Any, pg_schema: str
) -> None:
    ids = {part: part[0] * KEY_BYTES_MAX for part in ("exe", "target", "mark", "path", "child")}
    for kind in KINDS:
        store = open_pg(kind, pg_server.url, pg_schema)
        try:
            exe = Execution(id=ids["exe"] if kind == "sync" else "a" + ids["exe"][1:])
            eid = exe.id
            store.save(exe)
            store.commit(
                exe, [(ids["target"], "ev")], ids["mark"], [TimerOp("schedule", ids["path"], 1.0)],
                [(ids["child"], "r", {})], {"step": 1}, commit_id="c" * KEY_BYTES_MAX,
            )  # fmt: skip
            assert store.load(eid).version == 2
            assert store.is_processed(eid, ids["mark"])
            assert ids["target"] in [e.target_id for e in store.pending_outbox()]
            assert ids["child"] in [e.child_id for e in store.pending_spawns()]
            assert (eid, ids["path"], 1.0) in store.due_timers(1.0)
            store.append_trace(eid, {"step": 2})
            assert [s["step"] for s in store.read_trace(eid)] == [1, 2]
            store.delete_timer(eid, ids["path"], 1.0)
            store.forget(eid)
            assert store.load(eid) is None
            with pytest.raises(ValueError, match="execution id is 1,001 bytes"):
                store.commit(Execution(id=LONG), [])
        finally:
            store.close()


@pytest.mark.parametrize("char", ["é", "€", "😀"], ids=["2-bytes", "3-bytes", "4-bytes"])
def test_a_postgres_id_is_measured_in_bytes_of_utf8(
    pg: Any, pg_server: Any, pg_schema: str, char: str
) -> None:
    size = len(char.encode("utf-8"))
    fits = char * (KEY_BYTES_MAX // size)
    over = fits + char  # far fewer than 1,000 characters
    with open_pg("sync", pg_server.url, pg_schema) as store:
        store.commit(Execution(id=fits), [], "v1")
        assert store.is_processed(fits, "v1")
        with pytest.raises(ValueError) as info:
            store.commit(Execution(id=over), [])
        assert str(info.value) == too_long("execution id", len(over) * size)
        assert len(over) < KEY_BYTES_MAX
        assert store.stats()["executions"] == 1


@pytest.mark.parametrize(
    ("fill_with", "named"),
    [
        (lambda s: s.commit(Execution(id=LONG), []), "the id of an execution to copy"),
        (lambda s: s.commit(Execution(id="e2"), [], LONG), "the event id of a processed mark to copy"),
        (lambda s: s.commit(Execution(id="e2"), [], commit_id=LONG), "a commit id to copy"),
        (
            lambda s: s.commit(Execution(id="e2"), [], timers=[TimerOp("schedule", LONG, 1.0)]),
            "the path of a timer to copy",
        ),
        (lambda s: s.commit(Execution(id="e2"), [(LONG, "ev")]), "the target_id of an outbox entry to copy"),
        (
            lambda s: s.commit(Execution(id="e2"), [], spawns=[(LONG, "r", {})]),
            "the child_id of a spawn intent to copy",
        ),
    ],
)  # fmt: skip
def test_a_copy_of_an_id_longer_than_a_key_into_postgres_writes_nothing(
    pg: Any, pg_server: Any, pg_schema: str, fill_with: Any, named: str
) -> None:
    src = filled_memory()
    fill_with(src)
    with open_pg("sync", pg_server.url, pg_schema) as store:
        with pytest.raises(ValueError) as info:
            copy_store(src, store)
        assert str(info.value) == too_long(named)
        assert store.stats() == dict.fromkeys(store.stats(), 0)
