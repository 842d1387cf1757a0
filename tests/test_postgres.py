"""What only the PostgreSQL store has (issue 13): one round trip per commit, counted on the
wire and on the server; schemas that keep stores apart, created under an advisory lock
and versioned; processes that kill, race, claim and wake each other; a server restarted
under a running store; the async twin on any event loop; and the extra it needs.

The contract every store keeps runs on PostgreSQL through the "postgres" and
"postgres-async" kinds of ``conftest.py`` (``tests/test_protocol.py``). The server is the
session's ``pg_server`` (``tests/_pg.py``); each test works in a schema of its own
(``pg_schema``). Children are fresh ``python`` processes running the store from this
checkout; a child that meets any error exits non-zero and the test shows its stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import harel_store
from harel_store import Execution, OutboxEntry, StaleWriter, StoreConflict, StoreError, TimerOp
from harel_store._codec import JsonCodec

psycopg = pytest.importorskip("psycopg")
postgres = pytest.importorskip("harel_store.postgres")
connections = pytest.importorskip("harel_store.postgres._connections")
core = pytest.importorskip("harel_store.postgres._core")
statements = pytest.importorskip("harel_store.postgres._statements")
PostgresStore = postgres.PostgresStore
AsyncPostgresStore = postgres.AsyncPostgresStore

ROOT = str(Path(harel_store.__file__).resolve().parent.parent)


@pytest.fixture
def url(pg_server: Any) -> str:
    return pg_server.url  # type: ignore[no-any-return]


@pytest.fixture
def opened(url: str, pg_schema: str) -> Iterator[Callable[..., Any]]:
    """Open store objects on the test's schema; all are closed after the test."""
    made: list[Any] = []

    def open_(**options: Any) -> Any:
        options.setdefault("schema", pg_schema)
        store = PostgresStore(options.pop("url", url), **options)
        made.append(store)
        return store

    yield open_
    for store in made:
        store.close()


def sql(url: str, statement: str, params: Any = None) -> list[Any]:
    """Run one statement on a connection of its own; its rows (or ``[]``)."""
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


@contextlib.contextmanager
def pool_connection(store: Any) -> Iterator[Any]:
    """A connection of the store's pool (the one its calls ran on)."""
    conn = store._pool.get()
    try:
        yield conn
    finally:
        store._pool.put(conn)


def typical(store: Any, exe: Any, k: int, **extra: Any) -> None:
    """A typical commit: the execution, 2 emits, a mark, a timer, a spawn, a trace step."""
    store.commit(
        exe,
        [("billing", {"k": k}), (None, f"all-{k}")],
        f"in-{k}",
        [TimerOp("schedule", "timeout", 1000.0 + k)],
        [(f"child-{k}", ("root", k), {"k": k})],
        {"k": k},
        **extra,
    )


# --- one round trip per commit ------------------------------------------------------------


class WireCounter:
    """A TCP proxy between the store and the server that counts the protocol messages
    going each way: ``"Z"`` (ReadyForQuery: one per round trip of a client that does not
    pipeline; the one that ends a connection's startup is counted as ``"connections"``), ``"Z:T"`` (a ReadyForQuery inside an open transaction block), ``"E"``
    (Execute), ``"P"`` (Parse), ``"Q"`` (a simple query). Messages are counted before
    they are forwarded, so a call that returned has been counted whole."""

    def __init__(self, host: str, port: int) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def close(self) -> None:
        for sock in self._sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        buffer = b""
        started = not from_client  # the client's first message (startup) has no type byte
        ready = False
        try:
            while data := src.recv(65536):
                buffer += data
                while True:
                    if not started:
                        if len(buffer) < 4:
                            break
                        size = int.from_bytes(buffer[:4], "big")
                        if len(buffer) < size:
                            break
                        buffer, started = buffer[size:], True
                        continue
                    if len(buffer) < 5:
                        break
                    size = int.from_bytes(buffer[1:5], "big") + 1
                    if len(buffer) < size:
                        break
                    kind = chr(buffer[0])
                    with self._lock:
                        if from_client and kind in "EPQS":
                            self.counts[kind] += 1
                        elif not from_client and kind == "Z" and not ready:
                            ready = True  # the end of the startup: a new connection
                            self.counts["connections"] += 1
                        elif not from_client and kind == "Z":
                            self.counts["Z"] += 1
                            if buffer[5:6] != b"I":
                                self.counts["Z:T"] += 1
                    buffer = buffer[size:]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def wire(url: str) -> Iterator[tuple[WireCounter, str]]:
    """A counting proxy, and the URL that reaches the server through it."""
    parts = psycopg.conninfo.conninfo_to_dict(url)
    counter = WireCounter(parts.get("host") or "127.0.0.1", int(parts.get("port") or 5432))
    proxied = psycopg.conninfo.make_conninfo(
        url, host="127.0.0.1", port=counter.port, sslmode="disable", gssencmode="disable"
    )
    yield counter, proxied
    counter.close()


def server_calls(url: str, schema: str) -> int | None:
    """Statements run on the schema's tables, as pg_stat_statements counts them (``None``
    when the server does not load it)."""
    try:
        sql(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        rows = sql(
            url,
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE %s",
            (f'%"{schema}".%',),
        )
    except psycopg.Error:
        return None
    return int(rows[0][0])


def test_a_typical_commit_is_one_round_trip_and_one_statement(
    opened: Callable[..., Any], wire: tuple[WireCounter, str], url: str, pg_schema: str
) -> None:
    counter, proxied = wire
    store = opened(url=proxied)
    exe = Execution(id="e1", context={"n": 0})
    for k in range(3):  # the first commit also prepares the statement
        typical(store, exe, k)
    before, calls = counter.snapshot(), server_calls(url, pg_schema)
    n = 25
    for k in range(3, 3 + n):
        typical(store, exe, k, commit_id=f"c{k}", epoch=1)
    after = counter.snapshot()
    delta = {key: after[key] - before[key] for key in ("Z", "Z:T", "E", "P", "Q", "S")}
    assert delta == {"Z": n, "Z:T": 0, "E": n, "P": 0, "Q": 0, "S": n}, (
        "each commit must be one prepared statement in one round trip, outside any "
        f"transaction block: {delta}"
    )
    if calls is not None:
        assert server_calls(url, pg_schema) == calls + n, "one statement per commit"
    # And what it wrote is all there.
    assert exe.version == 3 + n
    assert len(store.pending_outbox()) == 2 * (3 + n)
    assert store.read_trace("e1")[-1] == {"k": 2 + n, "index": 2 + n}


def test_a_single_row_commit_is_prepared_once_with_or_without_its_options(
    opened: Callable[..., Any], wire: tuple[WireCounter, str]
) -> None:
    """The parts of one row are scalar parameters, and an absent epoch or commit id is
    no NULL (whose type psycopg would not know, preparing the statement again)."""
    counter, proxied = wire
    store = opened(url=proxied)
    exe = Execution(id="e1")

    def one_row(k: int, **extra: Any) -> None:
        store.commit(
            exe, [("billing", {"k": k})], f"in-{k}", [TimerOp("schedule", "t", 1000.0 + k)],
            (), {"k": k}, **extra,
        )  # fmt: skip

    one_row(0)  # prepares
    before = counter.snapshot()
    one_row(1, commit_id="c1", epoch=3)
    one_row(2, epoch=3)
    one_row(3, commit_id="c3")
    one_row(4)
    after = counter.snapshot()
    assert (after["Z"] - before["Z"], after["P"] - before["P"]) == (4, 0)
    one_row(1, commit_id="c1", epoch=3)  # a replay: nothing written again
    assert exe.version == 2
    exe.version = 5
    with pytest.raises(StaleWriter):
        one_row(5, epoch=2)
    assert exe.version == 5
    store.commit(exe, [(None, "to no target")])  # one emit, as an array: no NULL scalar
    assert [(e.target_id, e.event) for e in store.pending_outbox()[-2:]] == [
        ("billing", {"k": 4}),
        (None, "to no target"),
    ]
    assert len(store.pending_outbox()) == 6
    assert store.read_trace("e1")[-1] == {"k": 4, "index": 4}
    assert store.due_timers(2000.0) == [("e1", "t", 1004.0)]
    assert store.is_processed("e1", "in-3")


def test_loads_acks_and_claims_are_one_round_trip_each(
    opened: Callable[..., Any], wire: tuple[WireCounter, str]
) -> None:
    counter, proxied = wire
    store = opened(url=proxied)
    exe = Execution(id="e1")
    for k in range(10):
        typical(store, exe, k)
    calls: dict[str, Callable[[int], Any]] = {
        "load": lambda k: store.load("e1"),
        "ack_outbox": lambda k: store.ack_outbox(k + 1),
        "claim_outbox": lambda k: store.claim_outbox(1),
        "claim_due_timers": lambda k: store.claim_due_timers(1e9, 1, lease=0.0),
        "is_processed": lambda k: store.is_processed("e1", f"in-{k}"),
        "read_trace": lambda k: store.read_trace("e1"),
    }
    for name, call in calls.items():
        call(0)  # prepares
        before = counter.snapshot()
        for k in range(1, 4):
            call(k)
        after = counter.snapshot()
        assert (after["Z"] - before["Z"], after["E"] - before["E"]) == (3, 3), name


def test_prepare_false_prepares_nothing_and_is_still_one_round_trip(
    opened: Callable[..., Any], wire: tuple[WireCounter, str]
) -> None:
    counter, proxied = wire
    store = opened(url=proxied, prepare=False)
    exe = Execution(id="e1")
    typical(store, exe, 0)
    before = counter.snapshot()
    for k in range(1, 6):
        typical(store, exe, k)
        store.load("e1")
    after = counter.snapshot()
    assert after["Z"] - before["Z"] == 10
    assert after["P"] - before["P"] == 10, "an unnamed statement is parsed with each call"
    with pool_connection(store) as conn:
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)


def test_the_commit_statement_is_prepared(opened: Callable[..., Any]) -> None:
    store = opened()
    typical(store, Execution(id="e1"), 0)
    with pool_connection(store) as conn:
        rows = conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    assert any("WITH upd AS" in statement for (statement,) in rows), rows


# --- schemas -------------------------------------------------------------------------------


def test_stores_in_two_schemas_do_not_see_each_other(
    url: str, opened: Callable[..., Any], pg_server: Any
) -> None:
    import _pg

    other_schema = _pg.fresh_schema()
    try:
        one, two = opened(), opened(schema=other_schema)
        assert one.wait_for_work(0) is False and two.wait_for_work(0) is False
        typical(one, Execution(id="e1"), 1)
        assert two.load("e1") is None and two.pending_outbox() == []
        assert two.claim_outbox() == [] and two.claim_due_timers(math.inf) == []
        assert two.stats() == dict.fromkeys(two.stats(), 0)
        assert two.wait_for_work(0.2) is False, "woken by another schema's commit"
        typical(two, Execution(id="e1"), 2)
        assert [e.seq for e in two.pending_outbox()] == [1, 2], "seqs are per schema"
        assert one.load("e1").version == 1 and two.load("e1").version == 1
        assert [e.event for e in one.pending_outbox()] == [{"k": 1}, "all-1"]
        assert one.wait_for_work(0) is True
        assert one.wait_for_work(0) is False
    finally:
        _pg.drop_schema(pg_server.url, other_schema)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("", ValueError),
        ("1abc", ValueError),
        ("a-b", ValueError),
        ('a"b', ValueError),
        ("a b", ValueError),
        ("x" * 64, ValueError),
        ("pg_mine", ValueError),
        ("PG_mine", ValueError),
        (None, TypeError),
        (b"abc", TypeError),
    ],
    ids=repr,
)
def test_a_bad_schema_name_is_refused_before_connecting(bad: Any, error: type) -> None:
    for cls in (PostgresStore, AsyncPostgresStore):
        with pytest.raises(error, match="schema"):
            cls("postgresql://127.0.0.1:1/nowhere", schema=bad)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"pool_size": 0}, ValueError),
        ({"pool_size": 1.5}, TypeError),
        ({"prepare": 1}, TypeError),
        ({"timeout": 0}, ValueError),
        ({"timeout": 1e10}, ValueError),  # beyond what a lock's wait takes
        ({"timeout": "1"}, TypeError),
        ({"trace_max": -1}, ValueError),
        ({"codec": object()}, TypeError),
        ({"codec": JsonCodec}, TypeError),  # the class, not a codec
        ({"bogus": 1}, TypeError),
        ({"max_lifetime": 0}, ValueError),
        ({"max_lifetime": True}, TypeError),
        ({"connect_timeout": float("inf")}, ValueError),
        ({"connect_timeout": "3"}, TypeError),
    ],
    ids=repr,
)
def test_bad_options_are_refused_before_connecting(options: dict[str, Any], error: type) -> None:
    for cls in (PostgresStore, AsyncPostgresStore):
        with pytest.raises(error):
            cls("postgresql://127.0.0.1:1/nowhere", **options)
    with pytest.raises(TypeError, match="conninfo"):
        PostgresStore(b"postgresql://x")


def tables(url: str, schema: str) -> list[Any]:
    return sql(
        url,
        "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = %s ORDER BY 1",
        (schema,),
    )


def test_the_schema_is_created_on_first_open_and_versioned(
    url: str, pg_schema: str, opened: Callable[..., Any]
) -> None:
    assert tables(url, pg_schema) == []
    store = opened()
    typical(store, Execution(id="e1"), 0)
    assert sql(url, f'SELECT version FROM "{pg_schema}".harel_store_schema') == [
        (postgres.SCHEMA_VERSION,)
    ]
    names = {name for name, _ in tables(url, pg_schema)}
    for name in ("executions", "outbox", "spawns", "processed", "timers", "trace", "commit_ids"):
        assert name in names
    shape = tables(url, pg_schema)
    opened().close()  # opening an existing schema changes nothing
    assert tables(url, pg_schema) == shape


def refused_unchanged(url: str, schema: str, match: str) -> None:
    before = tables(url, schema)
    with pytest.raises(StoreError, match=match):
        PostgresStore(url, schema=schema)

    async def main() -> None:
        store = AsyncPostgresStore(url, schema=schema)  # opens at its first call
        with pytest.raises(StoreError, match=match):
            await store.load("e1")
        with pytest.raises(StoreError, match=match):
            async with store:
                pass
        await store.close()

    asyncio.run(main())
    assert tables(url, schema) == before, "a refused schema was changed"


def test_a_foreign_schema_is_refused_unchanged(url: str, pg_schema: str) -> None:
    sql(url, f'CREATE SCHEMA "{pg_schema}"')
    sql(url, f'CREATE TABLE "{pg_schema}".users (id serial PRIMARY KEY, name text)')
    refused_unchanged(url, pg_schema, "not harel_store's.*users")


def test_a_newer_schema_is_refused_unchanged(
    url: str, pg_schema: str, opened: Callable[..., Any]
) -> None:
    opened().close()
    sql(url, f'UPDATE "{pg_schema}".harel_store_schema SET version = version + 1')
    refused_unchanged(url, pg_schema, f"schema version {postgres.SCHEMA_VERSION + 1}, newer")


def test_a_damaged_schema_table_is_refused(
    url: str, pg_schema: str, opened: Callable[..., Any]
) -> None:
    opened().close()
    sql(url, f'INSERT INTO "{pg_schema}".harel_store_schema VALUES (1)')
    refused_unchanged(url, pg_schema, "damaged")


@pytest.mark.parametrize(
    ("damage", "lacks"),
    [
        ("DROP TABLE {s}.trace", "trace, trace_pkey"),
        ("DROP INDEX {s}.timers_by_fire_at", "timers_by_fire_at"),
        ("ALTER TABLE {s}.processed DROP CONSTRAINT processed_pkey", "processed_pkey"),
        ("ALTER TABLE {s}.outbox ALTER seq DROP IDENTITY", "outbox_seq"),
    ],
    ids=["table", "index", "primary-key", "sequence"],
)
def test_a_schema_lacking_what_its_version_has_is_refused_unchanged(
    url: str, pg_schema: str, opened: Callable[..., Any], damage: str, lacks: str
) -> None:
    """A schema at the current version without one of its tables, indexes or sequences
    is refused at open, naming it, as SQLite refuses a damaged file (it opened, then
    failed call by call with UndefinedTable)."""
    opened().close()
    sql(url, damage.format(s=f'"{pg_schema}"'))
    refused_unchanged(url, pg_schema, f"damaged: it lacks {lacks}; nothing was changed")


def test_an_empty_schema_made_by_the_dba_is_used(
    url: str, pg_schema: str, opened: Callable[..., Any]
) -> None:
    sql(url, f'CREATE SCHEMA "{pg_schema}"')
    store = opened()
    store.commit(Execution(id="e1"), [("t", "x")])
    assert store.load("e1").version == 1


def test_an_older_schema_is_migrated(
    url: str, pg_schema: str, opened: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    with opened() as store:
        store.commit(Execution(id="e1"), [("t", "kept")])
    later = [*postgres.MIGRATIONS, ("CREATE TABLE {s}.later_feature (x integer)",)]
    monkeypatch.setattr(core, "MIGRATIONS", later)
    with opened() as store:
        assert store.load("e1").version == 1
        assert [e.event for e in store.pending_outbox()] == ["kept"]
    assert sql(url, f'SELECT version FROM "{pg_schema}".harel_store_schema') == [(len(later),)]
    assert sql(url, f'SELECT count(*) FROM "{pg_schema}".later_feature') == [(0,)]
    monkeypatch.undo()
    with pytest.raises(StoreError, match="newer"):
        PostgresStore(url, schema=pg_schema)


def test_an_unreachable_server_is_a_store_error_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(StoreError, match="cannot open"):
        PostgresStore("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=5")
    assert time.monotonic() - start < 10

    async def main() -> None:
        store = AsyncPostgresStore("postgresql://postgres@127.0.0.1:1/nowhere")
        with pytest.raises(StoreError, match="cannot open"):
            await store.load("e1")
        await store.close()

    asyncio.run(main())


def test_repr_and_errors_never_show_the_password(url: str, opened: Callable[..., Any]) -> None:
    secret = psycopg.conninfo.make_conninfo(url, password="s3cret-pw")
    store = opened(url=secret)
    assert "s3cret-pw" not in repr(store) and "open" in repr(store)
    assert store.schema in repr(store)
    store.close()
    assert "closed" in repr(store)
    with pytest.raises(StoreError) as info:
        PostgresStore(psycopg.conninfo.make_conninfo(secret, port=1, connect_timeout=5), schema="x")
    assert "s3cret-pw" not in str(info.value)


# --- codec and values ------------------------------------------------------------------------


class Blobs(JsonCodec):
    """Bytes, not str: they come back as bytes."""

    def encode_execution(self, exe: Any) -> bytes:  # type: ignore[override]
        return super().encode_execution(exe).encode()

    def decode_execution(self, data: Any) -> Any:
        assert type(data) is bytes
        return super().decode_execution(data)

    def encode_value(self, value: Any) -> bytes:  # type: ignore[override]
        return b"\x00" + super().encode_value(value).encode()

    def decode_value(self, data: Any) -> Any:
        assert type(data) is bytes and data[:1] == b"\x00"
        return super().decode_value(data[1:])


class RawText(JsonCodec):
    """Str with characters PostgreSQL text cannot hold: they come back exactly."""

    def encode_value(self, value: Any) -> str:
        return "\x00\ud800" + super().encode_value(value)

    def decode_value(self, data: Any) -> Any:
        assert type(data) is str and data[:2] == "\x00\ud800"
        return super().decode_value(data[2:])


@pytest.mark.parametrize("codec", [Blobs(), RawText()], ids=["bytes", "raw-text"])
def test_codecs_get_back_what_they_gave(opened: Callable[..., Any], codec: Any) -> None:
    store = opened(codec=codec)
    exe = Execution(id="e1", active_path=("a",), context={"s": "\x00\U0001f600"})
    store.commit(exe, [("t", ("x",))], spawns=[("c", ("r",), {"n": 1})], trace={"n": 1})
    assert store.load("e1") == exe
    assert store.pending_outbox() == [OutboxEntry(1, "t", ("x",))]
    assert store.pending_spawns()[0][3:] == (("r",), {"n": 1})
    assert store.read_trace("e1") == [{"n": 1, "index": 0}]
    store.commit(Execution(id="e2"), [], commit_id="k", trace={"n": 2})
    store.commit(Execution(id="e2"), [], commit_id="k", trace={"n": 2})  # a replay


def test_json_values_round_trip_exactly(opened: Callable[..., Any]) -> None:
    store = opened()
    values = ["a\x00b", "\U0001f600", "\ud800 lone", (1, (2.0, ())), {"__tuple__": [1]}, -0.0]
    values += [math.inf, 2**70, None, [True, {"k": ()}]]
    exe = Execution(id="\U0001f600 e", context={"values": values})
    store.commit(exe, [("t", value) for value in values], trace={"values": values})
    back = store.load("\U0001f600 e")
    assert back == exe and back.context["values"][3] == (1, (2.0, ()))
    assert [e.event for e in store.pending_outbox()] == values
    assert math.copysign(1.0, store.pending_outbox()[5].event) == -1.0
    assert store.read_trace("\U0001f600 e")[0]["values"] == values


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.commit(Execution(id="a\x00b"), []),
        lambda s: s.commit(Execution(id="e1"), [("t\x00", "x")]),
        lambda s: s.commit(Execution(id="e1"), [], "v\x00"),
        lambda s: s.commit(Execution(id="e1"), [], timers=[TimerOp("cancel", "p\x00")]),
        lambda s: s.load("a\x00b"),
    ],
)
def test_a_nul_in_an_id_is_a_value_error(opened: Callable[..., Any], call: Any) -> None:
    store = opened()
    with pytest.raises(ValueError, match="NUL"):
        call(store)
    assert store.stats() == dict.fromkeys(store.stats(), 0)
    store.commit(Execution(id="e1"), [("t", "fine")])
    assert store.load("e1").version == 1


@pytest.mark.parametrize(
    ("kind", "values"),
    [
        ("_Texts", [[], ["a"], ["x", None, "é€𝄞", ""], [None], ["p" * 5000]]),
        ("_Blobs", [[], [b"t{}"], [b"", b"b\x00\xff", None], [bytes(range(256)) * 40]]),
        ("_Floats", [[], [0.0], [1.5, -2.25e300, 5e-324, -0.0, 1e9 + 0.5]]),
        ("_Ints", [[], [0], [1, -1, 2**63 - 1, -(2**63)]]),
    ],
)
def test_the_array_parameters_are_written_as_psycopg_writes_them(
    url: str, kind: str, values: list[list[Any]]
) -> None:
    """The store's array dumpers write the bytes psycopg's own list dumper writes for the
    same type, and the server reads back the same values."""
    from psycopg.adapt import PyFormat, Transformer
    from psycopg.postgres import types
    from psycopg.types.array import ListBinaryDumper

    cls = getattr(statements, kind)
    name = statements._ARRAYS[cls]
    with psycopg.connect(url, autocommit=True) as conn:
        connections._adapt(conn)
        ours = Transformer(conn).get_dumper(cls(), PyFormat.BINARY)
        assert type(ours).__module__ == "harel_store.postgres._connections"
        info = types[name]
        theirs_cls = type("Theirs", (ListBinaryDumper,), {"oid": info.array_oid})
        theirs = theirs_cls(list, conn)
        theirs.sub_dumper = Transformer(conn).get_dumper(
            {"text": "", "bytea": b"", "float8": 0.0, "int8": 0}[name], PyFormat.BINARY
        )
        if name == "int8":
            from psycopg.types.numeric import Int8BinaryDumper

            theirs.sub_dumper = Int8BinaryDumper(int, conn)
        elif name == "float8":
            from psycopg.types.numeric import FloatBinaryDumper

            theirs.sub_dumper = FloatBinaryDumper(float, conn)
        for value in values:
            assert ours.oid == info.array_oid
            assert bytes(ours.dump(cls(value))) == bytes(theirs.dump(value)), value
            back = conn.execute(f"SELECT %s::{name}[]", [cls(value)], binary=True).fetchone()
            assert back is not None
            got = [bytes(v) if isinstance(v, memoryview) else v for v in back[0]]
            assert got == value


def test_statements_without_rows_give_their_row_count(url: str) -> None:
    """``_has_rows`` is psycopg's ``cursor.description is not None``, without building
    column objects: rows for a query (also of no columns), the count for a command."""
    assert connections._TUPLES_OK == psycopg.pq.ExecStatus.TUPLES_OK
    with psycopg.connect(url, autocommit=True) as conn:
        for sql, rows in (
            ("SELECT 1", True),
            ("SELECT 1 WHERE false", True),
            ("SELECT", True),
            ("CREATE TEMP TABLE t (x int)", False),
            ("INSERT INTO t VALUES (1), (2)", False),
            ("INSERT INTO t VALUES (3) RETURNING x", True),
        ):
            cur = conn.execute(sql)
            assert connections._has_rows(cur) is rows is (cur.description is not None), sql


def test_out_of_range_integers_are_refused_before_any_write(opened: Callable[..., Any]) -> None:
    store = opened()
    with pytest.raises(ValueError):
        store.commit(Execution(id="e1", version=2**63 - 1), [])
    with pytest.raises(ValueError):
        store.commit(Execution(id="e1"), [], epoch=2**63)
    store.ack_outbox(2**70)  # no such seq: a no-op
    store.ack_spawn(-(2**70))
    assert store.stats() == dict.fromkeys(store.stats(), 0)
    store.commit(Execution(id="e1", version=2**63 - 2), [], epoch=2**63 - 1)
    assert store.load("e1").version == 2**63 - 1


def test_the_trace_ring_honours_explicit_indexes_and_a_changed_trace_max(
    opened: Callable[..., Any],
) -> None:
    store = opened(trace_max=3)
    for i in range(5):
        store.append_trace("e1", {"i": i})
    store.append_trace("e1", {"i": 5, "index": 100})
    store._record_trace("e1", {"i": 6})
    assert store.read_trace("e1") == [
        {"i": 4, "index": 4},
        {"i": 5, "index": 100},
        {"i": 6, "index": 6},
    ]
    store.trace_max = None
    for i in range(7, 10):
        store.append_trace("e1", {"i": i})
    assert len(store.read_trace("e1")) == 6
    store.trace_max = 2
    assert len(store.read_trace("e1")) == 6, "a change applies at the next append"
    store.append_trace("e1", {"i": 10})
    assert store.read_trace("e1") == [{"i": 9, "index": 9}, {"i": 10, "index": 10}]
    assert store.stats()["trace_steps"] == 2 and store.stats()["traces"] == 1
    store.forget("e1")
    store.append_trace("e1", {"i": 0})
    assert store.read_trace("e1") == [{"i": 0, "index": 0}]


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from plan_nodes(child)


def test_the_commit_reads_the_ring_and_the_commit_ids_through_their_keys(
    opened: Callable[..., Any],
) -> None:
    # The plans the store runs (generic ones: its statements are prepared), on tables
    # whose statistics see few executions: a trim reads the steps it drops, not the
    # whole ring, and the commit id is found by the (execution_id, commit_id) key, not
    # among every commit id of the execution (what ring bounds taken from a join or
    # open below, and "= ANY" of an array, came to).
    store = opened(trace_max=50)
    exes = [Execution(id=f"e{n}") for n in range(2)]
    for k in range(60):
        for exe in exes:
            store.commit(exe, (), trace={"k": k}, commit_id=f"c{k}")
    plans: list[dict[str, Any]] = []
    with pool_connection(store) as conn:
        schema = store._core.sql.schema
        conn.execute(f"ANALYZE {schema}.trace, {schema}.commit_ids")
        try:
            conn.execute("LOAD 'auto_explain'")
        except psycopg.Error as exc:
            pytest.skip(f"no auto_explain on this server: {exc}")
        for setting, value in [
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_level", "notice"),
            ("auto_explain.log_format", "json"),
            ("client_min_messages", "notice"),
            ("plan_cache_mode", "force_generic_plan"),
            # A table this small is read whole whatever the bounds: the plan of a large
            # one, where the index is read, is asked for.
            ("enable_seqscan", "off"),
        ]:
            conn.execute(f"SET {setting} = '{value}'")

        def note(diag: Any) -> None:
            text = diag.message_primary or ""
            if text.startswith("duration:"):
                plans.append(json.loads(text[text.index("{") :])["Plan"])

        conn.add_notice_handler(note)
    try:
        store.commit(exes[0], (), trace={"k": 60}, commit_id="c60")
        store.append_trace("e0", {"k": 61})
        with pool_connection(store) as conn:
            conn.execute(store._core.sql.trim, {"id": "e0", "keep": 50})
    finally:
        with pool_connection(store) as conn:
            conn.execute("RESET ALL")
    assert len(plans) == 3, plans
    for name, plan in zip(["commit", "append_trace", "trim"], plans):
        nodes = list(plan_nodes(plan))
        [delete] = [
            n for n in nodes if n.get("Operation") == "Delete" and n.get("Relation Name") == "trace"
        ]
        scans = [n for n in plan_nodes(delete) if n is not delete]
        assert not [n for n in scans if "Seq Scan" in n["Node Type"]], name
        assert not [n for n in scans if "idx" in n.get("Filter", "") + n.get("Join Filter", "")]
        conds = [n.get("Index Cond", "") for n in scans if n.get("Relation Name") == "trace"]
        assert any("idx >=" in c and "idx <" in c for c in conds), (name, conds)
        if name == "commit":  # the commit id is read before the CAS no more: if it were,
            for found in [  # through its key
                n
                for n in nodes
                if n.get("Relation Name") == "commit_ids" and "Scan" in n["Node Type"]
            ]:
                assert "commit_id" not in found.get("Filter", ""), found
                assert any("commit_id" in n.get("Index Cond", "") for n in plan_nodes(found))
    assert [s["k"] for s in store.read_trace("e0")] == list(range(12, 62))


def test_timer_ops_on_one_path_in_one_commit_apply_in_order(opened: Callable[..., Any]) -> None:
    store = opened()
    exe = Execution(id="e1")

    def schedule(path: str, at: float) -> TimerOp:
        return TimerOp("schedule", path, at)

    store.commit(exe, [], timers=[schedule("a", 1.0), schedule("b", 2.0), TimerOp("cancel", "a")])
    assert store.due_timers(math.inf) == [("e1", "b", 2.0)]
    store.commit(exe, [], timers=[TimerOp("cancel", "b"), schedule("b", 3.0), schedule("c", 3.0)])
    store.commit(exe, [], timers=[schedule("d", 3.0), schedule("c", 5.0), schedule("c", 3.0)])
    # Ties in arming order: b, then d, then c (re-armed last).
    assert store.due_timers(math.inf) == [("e1", "b", 3.0), ("e1", "d", 3.0), ("e1", "c", 3.0)]


def test_seqs_start_at_one_and_a_refused_commit_takes_none(opened: Callable[..., Any]) -> None:
    store = opened()
    exe = Execution(id="e1")
    store.commit(exe, [("t", 1)], spawns=[("c", "r", {})])
    with pytest.raises(StoreConflict):
        store.commit(Execution(id="e1"), [("t", 2)], spawns=[("c", "r", {})])
    store.commit(exe, [("t", 3), ("t", 4)], spawns=[("c", "r", {})])
    assert [e.seq for e in store.pending_outbox()] == [1, 2, 3]
    assert [e.seq for e in store.pending_spawns()] == [1, 2]


def test_reopening_keeps_everything(opened: Callable[..., Any]) -> None:
    with opened(trace_max=3) as store:
        exe = Execution(id="e1", active_path=("a", "b"))
        typical(store, exe, 0, commit_id="k1", epoch=4)
        for i in range(1, 5):
            store.append_trace("e1", {"step": i})
        for entry in store.pending_outbox():
            store.ack_outbox(entry.seq)
        stats = store.stats()
    with opened(trace_max=3) as store:
        assert store.stats() == stats
        loaded = store.load("e1")
        assert loaded == exe and loaded.active_path == ("a", "b")
        store.commit(loaded, [("t", "c")])
        assert [e.seq for e in store.pending_outbox()] == [3]
        store.append_trace("e1", {"step": 5})
        assert [s["index"] for s in store.read_trace("e1")] == [3, 4, 5]
        retry = Execution(id="e1")
        typical(store, retry, 0, commit_id="k1", epoch=4)
        assert retry.version == 1
        with pytest.raises(harel_store.StaleWriter):
            store.save(store.load("e1"), epoch=3)


# --- copying (harel_store.copy_store) -------------------------------------------------------


def fill_for_copy(store: Any) -> None:
    """A bit of everything: epochs, commit ids, marks, re-armed and tied timers, a
    wrapped ring, a ring without an execution, a step with its own index, acked entries
    at both ends, a forgotten execution whose entries are still owed, leases."""
    a = Execution(id="a", context={"pair": (1, 2)}, active_path=("root", "wait"))
    typical(store, a, 1, commit_id="a-1", epoch=3)
    b = Execution(id="b", parent_id="a")
    store.commit(b, [("a", "ping")], "v-b", [TimerOp("schedule", "tie", 50.0)], epoch=7)
    store.commit(a, [("b", ["x"])], None, [TimerOp("schedule", "tie", 50.0)], commit_id="a-2")
    for i in range(4):
        store.append_trace("a", {"i": i})
    store.append_trace("b", {"index": "own"})
    store.append_trace("lonely", {"note": "no execution"})
    gone = Execution(id="gone")
    typical(store, gone, 9, commit_id="g-1")
    store.forget("gone")
    outbox = store.pending_outbox()
    store.ack_outbox(outbox[0].seq)
    store.ack_outbox(outbox[-1].seq)
    store.ack_spawn(store.pending_spawns()[-1].seq)
    store.claim_outbox(1, lease=1000.0)
    store.claim_due_timers(math.inf, 1, lease=1000.0)


def shown(store: Any) -> dict[str, Any]:
    ids = ("a", "b", "gone", "lonely")
    return {
        "load": {eid: store.load(eid) for eid in ids},
        "processed": [store.is_processed(e, v) for e in ids for v in ("in-1", "v-b", "in-9")],
        "outbox": store.pending_outbox(),
        "spawns": store.pending_spawns(),
        "timers": store.due_timers(math.inf),
        "trace": {eid: store.read_trace(eid) for eid in ids},
        "stats": store.stats(),
    }


def test_copy_store_from_sqlite_to_postgres_and_back(
    opened: Callable[..., Any], tmp_path: Path
) -> None:
    from harel_store.sqlite import SqliteStore

    with SqliteStore(tmp_path / "src.db", trace_max=3) as src:
        fill_for_copy(src)
        expected = shown(src)
        dst = opened(trace_max=3)
        assert dst.wait_for_work(0) is False
        counts = harel_store.copy_store(src, dst)
    assert counts["executions"] == 2 and counts["traces"] == 3
    assert shown(dst) == expected
    assert dst.wait_for_work(0) is True, "a restore with pending work wakes relays"
    # Leases stayed behind; commit ids, epochs, seqs and rings go on.
    assert dst.claim_outbox() == expected["outbox"]
    assert dst.claim_due_timers(math.inf) == expected["timers"]
    retry = Execution(id="a")
    typical(dst, retry, 1, commit_id="a-1", epoch=3)
    assert retry.version == 1
    with pytest.raises(harel_store.StaleWriter):
        dst.save(dst.load("b"), epoch=6)
    a = dst.load("a")
    dst.commit(a, [("t", "new")], spawns=[("new", "r", {})])
    assert dst.pending_outbox()[-1].seq == 7 and dst.pending_spawns()[-1].seq == 3
    dst.append_trace("a", {"i": "next"})
    assert dst.read_trace("a")[-1] == {"i": "next", "index": 5}
    # And back: PostgreSQL to SQLite, then the copy holds what the schema does.
    expected = shown(dst)
    with SqliteStore(tmp_path / "back.db", trace_max=3) as back:
        harel_store.copy_store(dst, back)
        assert shown(back) == expected


def test_copy_store_refuses_a_schema_that_is_not_empty(opened: Callable[..., Any]) -> None:
    src, dst = harel_store.DictStore(), opened()
    src.commit(Execution(id="x"), [("t", "copied")])
    dst.commit(Execution(id="held"), [])
    with pytest.raises(StoreError, match="not empty.*1 executions"):
        harel_store.copy_store(src, dst)
    assert dst.stats()["executions"] == 1 and dst.pending_outbox() == []
    dst.forget("held")
    harel_store.copy_store(src, dst)
    assert [e.event for e in dst.pending_outbox()] == ["copied"]


def test_a_failed_restore_writes_nothing(opened: Callable[..., Any]) -> None:
    dst = opened()

    def records() -> Iterator[tuple[Any, ...]]:
        yield ("execution", Execution(id="x", version=1), None)
        yield ("outbox", OutboxEntry(5, "t", "ev"))
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError, match="broke"):
        dst._restore(records())
    assert dst.stats() == dict.fromkeys(dst.stats(), 0)
    with pytest.raises(ValueError, match="twice"):
        dst._restore([("outbox", OutboxEntry(5, "t", "a")), ("outbox", OutboxEntry(5, "t", "b"))])
    with pytest.raises(TypeError, match="must be a str"):
        dst._restore([("mark", 1, "v")])
    assert dst.stats() == dict.fromkeys(dst.stats(), 0)


# --- closed stores -------------------------------------------------------------------------

CALLS: dict[str, tuple[Any, ...]] = {
    "load": ("e1",),
    "save": (Execution(id="e1"),),
    "commit": (Execution(id="e1"), []),
    "is_processed": ("e1", "v1"),
    "pending_outbox": (),
    "ack_outbox": (1,),
    "claim_outbox": (),
    "pending_spawns": (),
    "ack_spawn": (1,),
    "claim_spawns": (),
    "due_timers": (1.0,),
    "claim_due_timers": (1.0,),
    "delete_timer": ("e1", "p", 1.0),
    "append_trace": ("e1", {}),
    "read_trace": ("e1",),
    "forget": ("e1",),
    "stats": (),
    "wait_for_work": (0,),
    "_record_trace": ("e1", {}),
}


def test_a_closed_store_raises_value_error(opened: Callable[..., Any]) -> None:
    store = opened()
    with store as entered:
        assert entered is store
        entered.commit(Execution(id="e1"), [])
        assert entered.wait_for_work(0) is False
    store.close()
    for name, args in CALLS.items():
        with pytest.raises(ValueError, match="closed"):
            getattr(store, name)(*args)
    with pytest.raises(ValueError, match="closed"), store:
        pass
    store.trace_max = 5
    assert PostgresStore.durable is True and PostgresStore.preserves_identity is False


def test_a_closed_async_store_raises_value_error(url: str, pg_schema: str) -> None:
    async def main() -> None:
        async with AsyncPostgresStore(url, schema=pg_schema) as store:
            await store.commit(Execution(id="e1"), [])
        await store.close()
        for name, args in CALLS.items():
            with pytest.raises(ValueError, match="closed"):
                if name == "_record_trace":
                    store._record_trace(*args)
                else:
                    await getattr(store, name)(*args)
        with pytest.raises(ValueError, match="closed"):
            async with store:
                pass

    asyncio.run(main())
    assert AsyncPostgresStore.durable is True and AsyncPostgresStore.preserves_identity is False


def test_stores_refuse_copying_and_pickling(url: str, opened: Callable[..., Any]) -> None:
    import copy
    import pickle

    for store in (opened(), AsyncPostgresStore(url, schema="never_opened")):
        for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot be copied"):
                attempt(store)


def test_open_store_routes_postgres_urls(url: str, pg_schema: str) -> None:
    for scheme in ("postgresql", "postgres"):
        address = scheme + url[url.index(":") :]
        with harel_store.open_store(address, schema=pg_schema, trace_max=5) as store:
            assert type(store) is PostgresStore and store.trace_max == 5
            store.commit(store.load("e1") or Execution(id="e1"), [])
        with pytest.raises(TypeError):
            harel_store.open_store(address, bogus=1)

    async def main() -> None:
        async with harel_store.open_async_store(
            url, schema=pg_schema, pool_size=3, max_lifetime=60.0, connect_timeout=2.0
        ) as astore:
            assert type(astore) is AsyncPostgresStore
            assert (await astore.load("e1")).version == 2
            assert astore.pool_stats()["pool_max"] == 3

    asyncio.run(main())


# --- the async twin ------------------------------------------------------------------------


def test_the_async_store_serves_one_asyncio_run_after_another(url: str, pg_schema: str) -> None:
    store = AsyncPostgresStore(url, schema=pg_schema, trace_max=2)
    exe = Execution(id="e1")
    for k in range(5):
        asyncio.run(store.commit(exe, [("t", k)], f"v{k}", trace={"k": k}))
    assert exe.version == 5
    assert asyncio.run(store.load("e1")) == exe
    assert [e.event for e in asyncio.run(store.claim_outbox())] == [0, 1, 2, 3, 4]
    assert asyncio.run(store.read_trace("e1")) == [{"k": 3, "index": 3}, {"k": 4, "index": 4}]
    store._record_trace("e1", {"k": 5})
    assert asyncio.run(store.wait_for_work(0)) is True
    assert asyncio.run(store.wait_for_work(0)) is False
    asyncio.run(store.close())
    with PostgresStore(url, schema=pg_schema) as sync:
        assert sync.read_trace("e1")[-1] == {"k": 5, "index": 5}


def test_the_async_recorder_opens_the_store_when_it_is_the_first_call(
    url: str, pg_schema: str
) -> None:
    store = AsyncPostgresStore(url, schema=pg_schema)
    store._record_trace("e1", {"via": "recorder"})  # the schema does not exist yet
    assert asyncio.run(store.read_trace("e1")) == [{"via": "recorder", "index": 0}]
    asyncio.run(store.close())


LEFT_OPEN = """
import asyncio, sys
from harel_store import Execution
from harel_store.postgres import AsyncPostgresStore

url, schema = sys.argv[1:3]
store = AsyncPostgresStore(url, schema=schema, pool_size=4)

async def main(k):
    # Calls that wait for a connection grow the pool: the loop ends while
    # psycopg-pool's workers may still be connecting.
    await asyncio.gather(*(store.commit(Execution(id=f"e{k}-{i}"), []) for i in range(3)))
    await asyncio.gather(*(store.load(f"e{k}-{i}") for i in range(6)))

for k in range(8):
    asyncio.run(main(k))
    print(k, flush=True)
"""


def test_an_async_store_left_open_lets_its_event_loop_end(url: str, pg_schema: str) -> None:
    """A store used under one ``asyncio.run`` after another, never closed, the loops
    ending while its pool grows: each ``asyncio.run`` returns (psycopg-pool's worker
    takes a cancellation that comes while it connects for a failed connection and waits
    on, which held ``asyncio.run`` for ever until the store's pool got a keeper that
    closes it as its loop ends)."""
    paths = [ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", LEFT_OPEN, url, pg_schema],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.split() == [str(k) for k in range(8)], done.stderr


def test_the_async_store_keeps_the_event_loop_free(url: str, pg_schema: str) -> None:
    """A commit that waits for another transaction's row lock waits on the server; the
    loop goes on ticking."""
    with PostgresStore(url, schema=pg_schema) as sync:
        sync.commit(Execution(id="e1"), [])
    blocker = psycopg.connect(url)
    blocker.execute(f'SELECT * FROM "{pg_schema}".executions WHERE id = %s FOR UPDATE', ("e1",))

    async def main() -> tuple[int, float]:
        async with AsyncPostgresStore(url, schema=pg_schema) as store:
            exe = await store.load("e1")
            loop = asyncio.get_running_loop()
            release = loop.call_later(0.5, blocker.commit)
            ticks = 0
            commit = asyncio.ensure_future(store.commit(exe, [("t", "x")]))
            start = time.monotonic()
            while not commit.done():
                ticks += 1
                await asyncio.sleep(0.01)
            await commit
            release.cancel()
            assert (await store.load("e1")).version == 2
            return ticks, time.monotonic() - start

    try:
        ticks, waited = asyncio.run(main())
    finally:
        blocker.close()
    assert waited >= 0.4 and ticks >= 10, (ticks, waited)


def test_async_calls_run_concurrently_on_the_pool(url: str, pg_schema: str) -> None:
    async def main() -> None:
        async with AsyncPostgresStore(url, schema=pg_schema, pool_size=3) as store:
            waiting = asyncio.ensure_future(store.wait_for_work(20))
            await asyncio.sleep(0.1)
            assert not waiting.done()
            exes = [Execution(id=f"e{i}") for i in range(12)]
            await asyncio.gather(*(store.commit(exe, [("t", exe.id)]) for exe in exes))
            assert all(exe.version == 1 for exe in exes)
            assert await asyncio.wait_for(waiting, 5) is True
            assert len(await store.pending_outbox()) == 12
            assert store.pool_stats()["pool_size"] <= 3

    asyncio.run(main())


def backends(url: str, app: str) -> int:
    return sql(  # type: ignore[no-any-return]
        url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
    )[0][0]


def test_concurrent_first_calls_of_an_async_store_share_one_opening(
    url: str, pg_schema: str
) -> None:
    """Tasks that call a fresh store at once open it once: the store never holds more
    than ``pool_size`` connections, however many first calls race."""
    app = f"harel-first-{uuid.uuid4().hex[:8]}"
    named = psycopg.conninfo.make_conninfo(url, application_name=app)

    async def main() -> None:
        store = AsyncPostgresStore(named, schema=pg_schema, pool_size=2)
        try:
            first = asyncio.ensure_future(store.load("e0"))
            await asyncio.sleep(0)
            first.cancel()  # a caller cancelled while the store opens: the others go on
            exes = [Execution(id=f"e{i}") for i in range(25)]
            await asyncio.gather(*(store.commit(exe, [("t", exe.id)]) for exe in exes))
            assert await asyncio.gather(*(store.load(f"e{i}") for i in range(25)))
            assert store.pool_stats()["pool_size"] <= 2
            assert backends(url, app) <= 2
        finally:
            await store.close()

    asyncio.run(main())
    deadline = time.monotonic() + 10  # a backend ends a moment after its client leaves
    while backends(url, app) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backends(url, app) == 0


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("call", ["commit", "append_trace", "save"])
def test_the_first_write_after_the_server_ended_an_idle_connection_reconnects(
    url: str, pg_schema: str, kind: str, call: str
) -> None:
    """A restart or ``pg_terminate_backend`` ends the pool's idle connections: the next
    write must go out on a new connection, not fail as a write whose outcome is
    unknown (the calls that only read are retried; writes are not)."""
    app = f"harel-ended-{uuid.uuid4().hex[:8]}"
    named = psycopg.conninfo.make_conninfo(url, application_name=app)

    def write(store: Any, exe: Execution) -> Any:
        if call == "commit":
            return store.commit(exe, [("t", 1)])
        if call == "save":
            return store.save(exe)
        return store.append_trace("x", {"step": 1})

    def end_idle_connections() -> None:
        sql(url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (app,))  # fmt: skip
        deadline = time.monotonic() + 10
        while backends(url, app) and time.monotonic() < deadline:
            time.sleep(0.01)

    if kind == "sync":
        with PostgresStore(named, schema=pg_schema, pool_size=3) as store:
            exe = Execution(id="x")
            store.commit(exe, [])
            end_idle_connections()
            write(store, exe)
            assert store.load("x").version == (2 if call != "append_trace" else 1)
    else:

        async def main() -> None:
            async with AsyncPostgresStore(named, schema=pg_schema, pool_size=3) as store:
                exe = Execution(id="x")
                await store.commit(exe, [])
                await asyncio.gather(*(store.load("x") for _ in range(3)))  # the pool grows
                end_idle_connections()
                for _ in range(3):  # each stale pooled connection is passed over
                    await write(store, exe)
                assert (await store.load("x")).version == (4 if call != "append_trace" else 1)

        asyncio.run(main())


def test_threads_beyond_pool_size_wait_their_turn(url: str, pg_schema: str) -> None:
    """More threads than ``pool_size`` share one sync store: each waiting thread is woken
    when a connection comes back, and the pool never holds more than ``pool_size``."""
    app = f"harel-pool-{uuid.uuid4().hex[:8]}"
    named = f"{url}{'&' if '?' in url else '?'}application_name={app}"
    with PostgresStore(named, schema=pg_schema, pool_size=2, timeout=30.0) as store:
        errors: list[BaseException] = []

        def work(k: int) -> None:
            try:
                exe = Execution(id=f"t{k}")
                for i in range(40):
                    store.commit(exe, [(None, {"i": i})], processed_event_id=f"e{i}")
            except (StoreError, psycopg.Error) as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors
        assert not any(thread.is_alive() for thread in threads)
        assert [store.load(f"t{k}").version for k in range(6)] == [40] * 6
        assert len(store.pending_outbox()) == 240
        assert backends(url, app) <= 2


def test_libpq_status_codes_are_psycopgs() -> None:
    """The pool compares libpq's status codes as ints (psycopg's enums are slow to read)."""
    from psycopg import pq

    assert connections._CONN_OK == pq.ConnStatus.OK
    assert connections._TX_IDLE == pq.TransactionStatus.IDLE


def test_a_cancelled_wait_for_work_leaves_its_wake_up_to_the_next(url: str, pg_schema: str) -> None:
    """A wait cancelled before it returned (asyncio.wait_for's timeout) may have taken a
    wake-up off the connection: the next wait gets it."""
    rng = random.Random(1)

    async def main() -> tuple[int, int]:
        cancelled = lost = 0
        with PostgresStore(url, schema=pg_schema) as writer:
            async with AsyncPostgresStore(url, schema=pg_schema) as relay:
                await relay.wait_for_work(0.05)
                for i in range(60):
                    writer.commit(Execution(id=f"e{i}"), [("relay", i)])
                    try:
                        await asyncio.wait_for(relay.wait_for_work(5.0), rng.uniform(0, 0.003))
                        continue
                    except asyncio.TimeoutError:
                        cancelled += 1
                    if not await relay.wait_for_work(2.0):
                        lost += 1
        return cancelled, lost

    cancelled, lost = asyncio.run(main())
    assert cancelled > 0
    assert lost == 0


def test_close_ends_an_async_wait_for_work(url: str, pg_schema: str) -> None:
    """A task waiting in wait_for_work when its store is closed gets ValueError at once,
    and leaves no connection open."""
    app = f"harel-close-{uuid.uuid4().hex[:8]}"
    named = f"{url}{'&' if '?' in url else '?'}application_name={app}"

    async def main() -> None:
        store = AsyncPostgresStore(named, schema=pg_schema)
        await store.wait_for_work(0)
        waiting = asyncio.ensure_future(store.wait_for_work(30.0))
        await asyncio.sleep(0.2)
        start = time.monotonic()
        await store.close()
        with pytest.raises(ValueError, match="closed"):
            await waiting
        assert time.monotonic() - start < 5.0

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while backends(url, app) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backends(url, app) == 0


def test_concurrent_async_waits_each_keep_their_timeout(url: str, pg_schema: str) -> None:
    """Calls that share a store share its listening connection: one waiting beside
    another still returns after its own timeout."""

    async def main() -> None:
        async with AsyncPostgresStore(url, schema=pg_schema) as store:
            await store.wait_for_work(0)
            long = asyncio.ensure_future(store.wait_for_work(6.0))
            await asyncio.sleep(0.1)
            start = time.monotonic()
            assert await store.wait_for_work(0.2) is False
            assert time.monotonic() - start < 3.0
            assert await long is False

    asyncio.run(main())


def test_threads_waiting_on_one_store_each_keep_their_timeout(url: str, pg_schema: str) -> None:
    """The sync twin: a thread's wait beside another thread's longer one on the same
    store returns after its own timeout."""
    with PostgresStore(url, schema=pg_schema) as store:
        store.wait_for_work(0)
        long = threading.Thread(target=store.wait_for_work, args=(6.0,))
        long.start()
        try:
            time.sleep(0.1)
            start = time.monotonic()
            assert store.wait_for_work(0.2) is False
            assert time.monotonic() - start < 3.0
        finally:
            long.join()


def test_a_wait_for_work_without_end_returns_on_work(url: str, pg_schema: str) -> None:
    """``timeout=inf`` waits for ever, also on the first call, which opens the
    listening connection."""
    with (
        PostgresStore(url, schema=pg_schema) as store,
        PostgresStore(url, schema=pg_schema) as writer,
    ):
        timer = threading.Timer(0.3, writer.commit, (Execution(id="e"), [("t", 1)]))
        timer.start()
        try:
            assert store.wait_for_work(math.inf) is True
        finally:
            timer.join()


def test_close_ends_a_wait_for_work_in_another_thread(url: str, pg_schema: str) -> None:
    """A thread waiting when another closes the store gets ValueError at once, and no
    connection is left open."""
    app = f"harel-close-{uuid.uuid4().hex[:8]}"
    named = f"{url}{'&' if '?' in url else '?'}application_name={app}"
    store = PostgresStore(named, schema=pg_schema)
    store.wait_for_work(0)
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            store.wait_for_work(30.0)
        except ValueError as exc:
            raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    start = time.monotonic()
    store.close()
    waiter.join(20)
    assert not waiter.is_alive()
    assert time.monotonic() - start < 10.0
    assert raised and "closed" in str(raised[0])
    deadline = time.monotonic() + 10
    while backends(url, app) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backends(url, app) == 0


def test_a_thread_waiting_for_a_connection_is_served_in_turn(url: str, pg_schema: str) -> None:
    """One thread calls back to back on the pool's only connection; another thread's call
    gets it when it is next put back, not after the timeout."""
    with PostgresStore(url, schema=pg_schema, pool_size=1, timeout=3.0) as store:
        store.commit(Execution(id="x"), [])
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                store.load("x")

        busy = threading.Thread(target=hammer)
        busy.start()
        try:
            time.sleep(0.2)
            for _ in range(20):
                start = time.monotonic()
                assert store.load("x") is not None
                assert time.monotonic() - start < 2.0
        finally:
            stop.set()
            busy.join()


def test_forget_racing_a_commit_ends_as_one_or_the_other(url: str, pg_schema: str) -> None:
    """A commit and a forget of the same execution, from two store objects at once: the
    outcome is one of the two serial orders, never orphaned marks, timers or trace of a
    forgotten execution, nor a conflict with no row to conflict with."""
    with PostgresStore(url, schema=pg_schema) as a, PostgresStore(url, schema=pg_schema) as b:
        outcomes: Counter[tuple[str, bool, bool]] = Counter()
        for i in range(40):
            exe = Execution(id=f"e{i}")
            a.commit(exe, [])
            gate = threading.Barrier(2)
            result: list[str] = []

            def commit(
                exe: Execution = exe, gate: threading.Barrier = gate, result: list[str] = result
            ) -> None:
                gate.wait()
                try:
                    a.commit(exe, [(None, {"n": n}) for n in range(300)], "evt",
                             [TimerOp("schedule", "p", 1.0)], trace={"s": 1}, commit_id="c1")  # fmt: skip
                    result.append("landed")
                except StoreConflict as exc:
                    result.append(f"conflict {exc.found}")

            def forget(eid: str = exe.id, gate: threading.Barrier = gate) -> None:
                gate.wait()
                b.forget(eid)

            threads = [threading.Thread(target=commit), threading.Thread(target=forget)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            outcomes[(result[0], a.load(exe.id) is not None, a.is_processed(exe.id, "evt"))] += 1
        serial = {("landed", True, True), ("landed", False, False)}
        assert set(outcomes) <= serial, outcomes
        stats = a.stats()
        assert stats["processed"] == stats["timers"] == stats["traces"] == stats["executions"]


def leftovers(url: str, schema: str) -> dict[str, int]:
    """Rows that no execution or ring accounts for: marks, timers and commit ids of an
    execution that has no row (a commit writes them with its row, forget deletes them
    with it), and trace steps at or beyond their ring's next index, or of no ring."""
    s = f'"{schema}"'
    counts = ", ".join(
        f"(SELECT count(*) FROM {s}.{table} AS x WHERE NOT EXISTS"
        f" (SELECT FROM {s}.executions AS e WHERE e.id = x.execution_id))"
        for table in ("processed", "timers", "commit_ids")
    )
    [row] = sql(
        url,
        f"SELECT {counts}, (SELECT count(*) FROM {s}.trace AS t WHERE NOT EXISTS"
        f" (SELECT FROM {s}.trace_index AS ti"
        f"  WHERE ti.execution_id = t.execution_id AND t.idx < ti.next_index))",
    )
    return {k: n for k, n in zip(("marks", "timers", "commit_ids", "steps"), row) if n}


def race(seconds: float, *loops: Callable[[threading.Event], None]) -> None:
    """Run each loop in a thread of its own until ``seconds`` have passed or one of
    them sets the event (on a failure it records)."""
    stop = threading.Event()
    threads = [threading.Thread(target=loop, args=(stop,)) for loop in loops]
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join(60.0)
        assert not thread.is_alive()


def test_forget_racing_append_trace_leaves_the_ring_whole(url: str, pg_schema: str) -> None:
    """One thread appends to "X" in a loop while another forgets it: each forget takes
    the whole ring with it, so no step is left behind to collide with the ring that the
    next appends start again at index 0 (every append_trace of "X" then raised a unique
    violation), nor to show in a later execution's trace."""
    with PostgresStore(url, schema=pg_schema) as a, PostgresStore(url, schema=pg_schema) as b:
        errors: list[BaseException] = []
        forgets = [0]

        def append(stop: threading.Event) -> None:
            n = 0
            while not stop.is_set():
                try:
                    a.append_trace("X", {"n": n})
                except Exception as exc:  # noqa: BLE001 - shown by the assertion
                    errors.append(exc)
                    stop.set()
                n += 1

        def forget(stop: threading.Event) -> None:
            while not stop.is_set() and forgets[0] < 1000:
                b.forget("X")
                forgets[0] += 1

        race(3.0, append, forget)
        assert errors == [] and forgets[0] > 0
        assert leftovers(url, pg_schema) == {}
        before = a.read_trace("X")
        a.append_trace("X", {"last": True})
        steps = a.read_trace("X")
        assert steps[-1] == {"last": True, "index": before[-1]["index"] + 1 if before else 0}
        b.forget("X")
        a.append_trace("X", {"new": True})
        assert a.read_trace("X") == [{"new": True, "index": 0}]


def test_forget_racing_commits_and_appends_of_one_execution(url: str, pg_schema: str) -> None:
    """Two writers committing "X" (first writes and updates, each with emits, a mark, a
    timer, a trace step and a commit id), one appending to its trace, one forgetting it:
    every writer of the execution's rows takes its locks in one order with forget, so no
    call deadlocks or fails (a conflict aside), and nothing is left of a forgotten one."""
    stores = [PostgresStore(url, schema=pg_schema, trace_max=2) for _ in range(4)]
    errors: list[BaseException] = []
    done: Counter[str] = Counter()

    def failed(stop: threading.Event, exc: BaseException) -> None:
        errors.append(exc)
        stop.set()

    def commit(store: Any) -> Callable[[threading.Event], None]:
        def loop(stop: threading.Event) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                exe = store.load("X") or Execution(id="X")
                try:
                    store.commit(exe, [(None, n)], f"ev-{n}", [TimerOp("schedule", "p", 1.0)],
                                 trace={"n": n}, commit_id=f"{id(store)}-{n}")  # fmt: skip
                    done["commit"] += 1
                except StoreConflict:
                    done["conflict"] += 1
                except Exception as exc:  # noqa: BLE001 - shown by the assertion
                    failed(stop, exc)

        return loop

    def append(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                stores[2].append_trace("X", {"appended": True})
                done["append"] += 1
            except Exception as exc:  # noqa: BLE001
                failed(stop, exc)

    def forget(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                stores[3].forget("X")
                done["forget"] += 1
            except Exception as exc:  # noqa: BLE001
                failed(stop, exc)
            time.sleep(random.uniform(0.0, 0.002))

    try:
        race(4.0, commit(stores[0]), commit(stores[1]), append, forget)
        assert errors == [], (errors, done)
        assert done["commit"] and done["append"] and done["forget"], done
        assert leftovers(url, pg_schema) == {}
        assert len(stores[0].read_trace("X")) <= 2
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize("trace_max", [1, 2])
def test_the_ring_never_holds_more_than_trace_max_under_concurrent_appends(
    url: str, pg_schema: str, trace_max: int
) -> None:
    """Three writers append to one ring at once (two by append_trace, one by commits):
    when they have returned, the ring holds exactly the last trace_max steps. (The trim
    ran on the statement's snapshot, blind to the steps of appends that committed while
    it waited for the ring: three writers with trace_max=1 kept up to 3 steps.)"""
    stores = [PostgresStore(url, schema=pg_schema, trace_max=trace_max) for _ in range(3)]
    try:
        deadline = time.monotonic() + 5.0
        rounds = 0
        while rounds < 100 and time.monotonic() < deadline:
            eid = f"e{rounds}"
            gate = threading.Barrier(3)

            def append(store: Any, eid: str = eid, gate: threading.Barrier = gate) -> None:
                gate.wait()
                for i in range(3):
                    store.append_trace(eid, {"i": i})

            def commit(store: Any, eid: str = eid, gate: threading.Barrier = gate) -> None:
                exe = Execution(id=eid)
                gate.wait()
                for i in range(3):
                    store.commit(exe, [], trace={"c": i})

            threads = [
                threading.Thread(target=append, args=(stores[0],)),
                threading.Thread(target=append, args=(stores[1],)),
                threading.Thread(target=commit, args=(stores[2],)),
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            indexes = [step["index"] for step in stores[0].read_trace(eid)]
            assert indexes == list(range(9 - trace_max, 9)), (rounds, indexes)
            rounds += 1
        assert stores[0].stats()["trace_steps"] == trace_max * rounds
    finally:
        for store in stores:
            store.close()


def test_a_failed_statement_run_after_the_outcome_is_sent_back_as_none(
    opened: Callable[..., Any],
) -> None:
    """The trim that follows a raced append runs once the append has committed: its
    failure is sent back to the operation as ``None``, never raised as the operation's
    (which would call a landed commit failed), and the connection serves on."""
    store = opened()

    def op() -> Any:
        failed = yield core._Query("SELECT 1 / 0", tolerant=True)
        rows = yield core._Query("SELECT 7")
        return failed, rows

    with pool_connection(store) as conn:
        ran = op()
        assert connections._run_on(conn, ran, next(ran)) == (None, [(7,)])


def test_a_commit_the_database_refuses_leaves_the_version_as_it_was(
    url: str, pg_schema: str, opened: Callable[..., Any]
) -> None:
    """The version a commit sets before it writes is set back the moment its statement
    fails, sync and async."""
    store = opened()
    exe = Execution(id="e1")
    store.commit(exe, [])

    async def main() -> None:
        async with AsyncPostgresStore(url, schema=pg_schema) as astore:
            await astore.load("e1")  # opened before the table goes
            sql(url, f'DROP TABLE "{pg_schema}".trace')
            with pytest.raises((StoreError, psycopg.Error)):
                await astore.commit(exe, [], trace={"s": 1})
            assert exe.version == 1

    asyncio.run(main())
    with pytest.raises((StoreError, psycopg.Error)):
        store.commit(exe, [], trace={"s": 1})
    assert exe.version == 1


def test_the_async_pool_serves_waiting_calls_in_turn(url: str, pg_schema: str) -> None:
    """More tasks than connections, each calling back to back: a connection put back
    goes to the task that waited longest, so none waits out the timeout."""

    async def main() -> dict[str, int]:
        calls: Counter[str] = Counter()
        async with AsyncPostgresStore(url, schema=pg_schema, pool_size=1, timeout=1.0) as store:
            await store.commit(Execution(id="x"), [])
            end = time.monotonic() + 3.0

            async def hammer() -> None:
                while time.monotonic() < end:
                    try:
                        await store.load("x")
                        calls["ok"] += 1
                    except StoreError:
                        calls["StoreError"] += 1

            await asyncio.gather(*(hammer() for _ in range(4)))
        return dict(calls)

    calls = asyncio.run(main())
    assert calls.get("StoreError", 0) == 0
    assert calls["ok"] > 0


def test_a_task_cancelled_as_it_is_handed_a_connection_is_cancelled(
    url: str, pg_schema: str
) -> None:
    """With one connection, A's call hands it to B, which waits for it, and A cancels
    B at once: B ends cancelled, its commit not made; a load C that waits for the
    connection itself, cancelled as it is handed over, ends cancelled too (psycopg-pool
    waits with asyncio.wait_for, which before Python 3.12 returns the connection and
    swallows the cancellation)."""

    async def main() -> None:
        async with AsyncPostgresStore(url, schema=pg_schema, pool_size=1) as store:
            loading = asyncio.ensure_future(store.load("x"))
            await asyncio.sleep(0)
            b = asyncio.ensure_future(store.commit(Execution(id="b"), [("t", "b")]))
            await asyncio.sleep(0)
            assert not b.done()
            await loading
            b.cancel()
            with pytest.raises(asyncio.CancelledError):
                await b
            assert await store.load("b") is None
            assert await store.pending_outbox() == []
            if sys.version_info < (3, 11):
                return  # no Task.cancelling() to tell a swallowed cancellation by
            for _ in range(5):  # a call that waits for the connection itself
                loading = asyncio.ensure_future(store.load("x"))
                await asyncio.sleep(0)
                c = asyncio.ensure_future(store.load("x"))
                await asyncio.sleep(0)
                await loading
                c.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await c

    asyncio.run(main())


def test_connecting_to_a_server_that_never_answers_gives_up_by_timeout() -> None:
    """A server that takes the connection and says nothing: opening gives up with
    StoreError after the store's timeout (libpq counts at least 2 s), not psycopg's
    default of 130 s."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(silent.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    url = f"postgresql://nobody@127.0.0.1:{silent.getsockname()[1]}/nowhere"
    try:
        start = time.monotonic()
        with pytest.raises(StoreError):
            PostgresStore(url, timeout=1.0)
        assert time.monotonic() - start < 10.0

        async def main() -> None:
            store = AsyncPostgresStore(url, timeout=1.0)
            with pytest.raises(StoreError):
                await store.load("x")

        start = time.monotonic()
        asyncio.run(main())
        assert time.monotonic() - start < 10.0
    finally:
        silent.close()
        for conn in held:
            conn.close()


# --- processes ------------------------------------------------------------------------------

PRELUDE = """
import os, sys, time
from harel_store import Execution, StoreConflict, StoreError, TimerOp
from harel_store.postgres import PostgresStore

url, schema, go = sys.argv[1], sys.argv[2], sys.argv[3]
def wait_for_go():
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
def say(*words):
    print(*words, flush=True)
"""


class Children:
    """Child processes of one test, on its schema, released together by a file."""

    def __init__(self, url: str, schema: str, tmp_path: Path) -> None:
        self.url, self.schema = url, schema
        self.go = tmp_path / f"go-{uuid.uuid4().hex}"
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, code: str, *args: Any) -> subprocess.Popen[str]:
        paths = [ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        proc = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + code, self.url, self.schema, str(self.go)]
            + [str(a) for a in args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.procs.append(proc)
        return proc

    def start(self, *procs: subprocess.Popen[str]) -> None:
        """Let the children go at once, when all of them are ready."""
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line == "ready\n", f"a child did not get ready: {line!r} {proc.communicate()[1]}"
        self.go.touch()

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.fixture
def children(url: str, pg_schema: str, tmp_path: Path) -> Iterator[Children]:
    PostgresStore(url, schema=pg_schema).close()  # the schema exists before they race
    made = Children(url, pg_schema, tmp_path)
    yield made
    made.kill_all()


def finish(proc: subprocess.Popen[str], timeout: float = 120.0) -> list[str]:
    """The words the child printed; it must have exited cleanly."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{err}"
    return out.split()


WRITER = """
store = PostgresStore(url, schema=schema, trace_max=50)
exe = store.load("x") or Execution(id="x")
k = exe.version
while True:
    k += 1
    exe.context["k"] = k
    store.commit(
        exe,
        [("y", f"ev-{k}"), (None, f"all-{k}")],
        f"in-{k}",
        [TimerOp("schedule", f"t{k % 3}", float(k)), TimerOp("cancel", f"gone-{k}")],
        [(f"child-{k}", ("r", k), {"k": k})],
        {"k": k},
        commit_id=f"c{k}",
        epoch=k // 10,
    )
    say(k)
"""


def committed_body(k: int) -> dict[str, Any]:
    return {
        "emits": [("y", f"ev-{k}"), (None, f"all-{k}")],
        "processed_event_id": f"in-{k}",
        "timers": [TimerOp("schedule", f"t{k % 3}", float(k)), TimerOp("cancel", f"gone-{k}")],
        "spawns": [(f"child-{k}", ("r", k), {"k": k})],
        "trace": {"k": k},
    }


def check_commits(store: Any, v: int) -> None:
    """Commits 1..v are all there, whole; nothing of commit v + 1 is. Seqs increase; a
    commit killed in flight may have left a gap, never a lost entry."""
    exe = store.load("x")
    assert exe.version == v and exe.context == {"k": v}
    outbox = store.pending_outbox()
    assert [e.event for e in outbox] == [f"{w}-{k}" for k in range(1, v + 1) for w in ("ev", "all")]
    assert [e.seq for e in outbox] == sorted({e.seq for e in outbox})
    spawns = store.pending_spawns()
    assert [(s.child_id, s.root_path, s.context) for s in spawns] == [
        (f"child-{k}", ("r", k), {"k": k}) for k in range(1, v + 1)
    ]
    assert all(store.is_processed("x", f"in-{k}") for k in range(1, v + 1))
    assert not store.is_processed("x", f"in-{v + 1}")
    latest = {f"t{k % 3}": float(k) for k in range(1, v + 1)}
    assert sorted(store.due_timers(math.inf)) == sorted(("x", p, at) for p, at in latest.items())
    assert store.read_trace("x") == [{"k": k, "index": k - 1} for k in range(max(1, v - 49), v + 1)]
    stats = store.stats()
    assert (stats["executions"], stats["outbox"], stats["spawns"], stats["processed"]) == (
        1,
        2 * v,
        v,
        v,
    )
    retry = Execution(id="x")
    store.commit(retry, **committed_body(v), commit_id=f"c{v}", epoch=v // 10)
    assert retry.version == v and store.load("x").version == v


def test_a_writer_killed_mid_stream_loses_no_returned_commit(
    children: Children, url: str, pg_schema: str
) -> None:
    printed = 0
    for round_, kill_after in enumerate((30, 60, 90)):
        proc = children.spawn(WRITER)
        assert proc.stdout is not None
        seen = printed
        while seen < kill_after:
            line = proc.stdout.readline()
            assert line, f"the writer died: {proc.communicate()[1]}"
            seen = int(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        # What the child printed before it died: read through the buffer readline used
        # (communicate reads the pipe itself and would miss lines already buffered).
        assert proc.stderr is not None
        rest, err = proc.stdout.read(), proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL, err
        printed = max([seen, *map(int, rest.split())])
        with PostgresStore(url, schema=pg_schema, trace_max=50) as store:
            v = store.load("x").version
            assert printed <= v <= printed + 1, (round_, printed, v)
            check_commits(store, v)
            printed = v


INCREMENTER = """
store = PostgresStore(url, schema=schema)
me, rounds = sys.argv[4], int(sys.argv[5])
conflicts = 0
wait_for_go()
for i in range(rounds):
    while True:
        exe = store.load("counter")
        exe.context["n"] += 1
        exe.context["by"].append(me)
        time.sleep(0.001)  # the engine at work: the others commit meanwhile
        try:
            store.commit(exe, [("audit", f"{me}-{i}")], f"{me}-{i}")
            break
        except StoreConflict:
            conflicts += 1
say(conflicts)
"""


def test_racing_processes_lose_no_update(children: Children, url: str, pg_schema: str) -> None:
    with PostgresStore(url, schema=pg_schema) as store:
        store.save(Execution(id="counter", context={"n": 0, "by": []}))
    procs = [children.spawn(INCREMENTER, f"p{i}", 30) for i in range(4)]
    children.start(*procs)
    conflicts = [int(finish(p)[0]) for p in procs]
    with PostgresStore(url, schema=pg_schema) as store:
        exe = store.load("counter")
        assert exe.context["n"] == 120 and exe.version == 121
        assert Counter(exe.context["by"]) == {f"p{i}": 30 for i in range(4)}
        outbox = store.pending_outbox()
        expected = {f"p{p}-{i}" for p in range(4) for i in range(30)}
        assert sorted(e.event for e in outbox) == sorted(expected), "lost or doubled emits"
        assert [e.seq for e in outbox] == list(range(1, 121)), "a refused commit took a seq"
        assert all(store.is_processed("counter", ev) for ev in expected)
        assert store.stats()["processed"] == 120
    assert sum(conflicts) > 0, "the processes never raced"


FIRST_WRITER = """
store = PostgresStore(url, schema=schema)
me, n = sys.argv[4], int(sys.argv[5])
wait_for_go()
for j in range(n):
    exe = Execution(id=f"x{j}", context={"by": me})
    try:
        store.commit(
            exe, [("t", f"{me}-{j}")], f"v{j}", [TimerOp("schedule", "p", 1.0)],
            [(f"k{j}", "r", {})], {"by": me}, commit_id=f"first-{me}",
        )
    except StoreConflict as exc:
        assert (exc.expected, exc.found) == (0, 1), exc
    else:
        say(j)
"""


def test_concurrent_first_writes_have_one_winner(
    children: Children, url: str, pg_schema: str
) -> None:
    procs = [children.spawn(FIRST_WRITER, f"p{i}", 50) for i in range(4)]
    children.start(*procs)
    won = {f"p{i}": [int(j) for j in finish(p)] for i, p in enumerate(procs)}
    winners: dict[int, str] = {}
    for who, ids in won.items():
        for j in ids:
            assert j not in winners, f"x{j} was first-written by {winners[j]} and {who}"
            winners[j] = who
    assert sorted(winners) == list(range(50))
    with PostgresStore(url, schema=pg_schema) as store:
        for j, who in winners.items():
            exe = store.load(f"x{j}")
            assert exe.version == 1 and exe.context == {"by": who}
            assert store.read_trace(f"x{j}") == [{"by": who, "index": 0}]
        events = sorted(e.event for e in store.pending_outbox())
        assert events == sorted(f"{who}-{j}" for j, who in winners.items())
        stats = store.stats()
        assert (stats["spawns"], stats["timers"], stats["processed"]) == (50, 50, 50)


RELAY = """
store = PostgresStore(url, schema=schema)
lease = float(sys.argv[4])
wait_for_go()
claimed = []
while True:
    batch = store.claim_outbox(7, lease=lease)
    spawns = store.claim_spawns(5, lease=lease)
    timers = store.claim_due_timers(1000.0, 3, lease=lease)
    if not (batch or spawns or timers):
        break
    claimed += [f"o{e.seq}" for e in batch] + [f"s{e.seq}" for e in spawns]
    claimed += [f"t{path_}" for _, path_, _ in timers]
say(*claimed)
"""


def test_three_processes_claim_every_item_once_while_leases_live(
    children: Children, url: str, pg_schema: str
) -> None:
    with PostgresStore(url, schema=pg_schema) as store:
        exe = Execution(id="e1")
        for k in range(15):
            store.commit(
                exe,
                [("t", f"ev-{k}-{i}") for i in range(20)],
                spawns=[(f"c{k}-{i}", "r", {}) for i in range(10)],
                timers=[TimerOp("schedule", f"p{k}-{i}", float(k)) for i in range(5)],
            )
    procs = [children.spawn(RELAY, 60.0) for _ in range(3)]
    children.start(*procs)
    claims = [finish(p) for p in procs]
    every = [item for claim in claims for item in claim]
    assert len(every) == len(set(every)), "an item was leased to two relays"
    assert len(every) == 300 + 150 + 75
    assert sum(1 for claim in claims if claim) >= 2, "the relays should have shared the work"
    with PostgresStore(url, schema=pg_schema) as store:
        assert store.claim_outbox() == [] and store.claim_spawns() == []
        assert store.claim_due_timers(1000.0) == []
        assert len(store.pending_outbox()) == 300, "claims do not ack"


def test_leases_that_ran_out_in_a_dead_relay_are_claimed_again(
    children: Children, url: str, pg_schema: str
) -> None:
    with PostgresStore(url, schema=pg_schema) as store:
        exe = Execution(id="e1")
        store.commit(
            exe,
            [("t", i) for i in range(10)],
            spawns=[(f"c{i}", "r", {}) for i in range(4)],
            timers=[TimerOp("schedule", f"p{i}", 1.0) for i in range(3)],
        )
        # A relay that claims everything for a short lease and dies without an ack.
        proc = children.spawn(RELAY, 1.0)
        children.start(proc)
        assert len(finish(proc)) == 17
        assert store.claim_outbox() == [] and store.claim_spawns() == []
        assert store.claim_due_timers(1000.0) == [], "leases live for a second"
        time.sleep(1.3)
        assert [e.event for e in store.claim_outbox()] == list(range(10))
        assert len(store.claim_spawns()) == 4
        assert len(store.claim_due_timers(1000.0)) == 3
        assert store.claim_outbox() == []


LATE_WRITER = """
store = PostgresStore(url, schema=schema)
wait_for_go()
time.sleep(0.3)
store.commit(Execution(id="e1"), [("t", "wake up")])
say("committed")
"""


def test_wait_for_work_wakes_on_another_processs_commit(
    children: Children, url: str, pg_schema: str
) -> None:
    with PostgresStore(url, schema=pg_schema) as store:
        assert store.wait_for_work(0.05) is False
        proc = children.spawn(LATE_WRITER)
        children.start(proc)
        began = time.monotonic()
        assert store.wait_for_work(60) is True
        waited = time.monotonic() - began
        assert finish(proc) == ["committed"]
        assert waited < 30
        assert [e.event for e in store.claim_outbox()] == ["wake up"]
        assert store.wait_for_work(0.05) is False


def test_async_wait_for_work_wakes_on_another_processs_commit(
    children: Children, url: str, pg_schema: str
) -> None:
    async def main() -> None:
        async with AsyncPostgresStore(url, schema=pg_schema) as store:
            assert await store.wait_for_work(0.05) is False
            proc = children.spawn(LATE_WRITER)
            children.start(proc)
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            ticker = asyncio.ensure_future(tick())
            assert await store.wait_for_work(60) is True
            ticker.cancel()
            assert ticks >= 5, "the wait blocked the event loop"
            assert finish(proc) == ["committed"]
            assert [e.event for e in await store.claim_outbox()] == ["wake up"]
            assert await store.wait_for_work(0.05) is False

    asyncio.run(main())


def test_wait_for_work_counts_from_when_the_object_was_opened(opened: Callable[..., Any]) -> None:
    writer = opened()
    writer.commit(Execution(id="e1"), [("t", "x")])
    late = opened()
    assert late.wait_for_work(0) is False, "work committed before it was opened"
    assert writer.wait_for_work(0) is True, "its own commit counts"
    assert writer.wait_for_work(0) is False
    exe = writer.load("e1")
    writer.save(exe)
    writer.commit(exe, [], "v1", [TimerOp("cancel", "p")], trace={"n": 1})
    assert late.wait_for_work(0.05) is False, "no entry, no armed timer: no work"
    works: list[dict[str, Any]] = [
        {"timers": [TimerOp("schedule", "p", 1.0)]},
        {"spawns": [("c", "r", {})]},
        {"emits": [("t", "y")]},
    ]
    for work in works:
        writer.commit(exe, work.pop("emits", []), **work)
        # A commit that returned is seen at once, with no time to wait.
        assert late.wait_for_work(0) is True and late.wait_for_work(0) is False
    for bad, error in ((-1, ValueError), (math.nan, ValueError), ("1", TypeError)):
        with pytest.raises(error):
            late.wait_for_work(bad)


OPENER = """
wait_for_go()
store = PostgresStore(url, schema=schema)
store.commit(Execution(id=sys.argv[4]), [("t", sys.argv[4])])
say("ok")
"""


def test_four_processes_opening_a_fresh_schema_together(
    url: str, pg_schema: str, tmp_path: Path
) -> None:
    made = Children(url, pg_schema, tmp_path)
    try:
        procs = [made.spawn(OPENER, f"e{i}") for i in range(4)]
        made.start(*procs)
        for proc in procs:
            assert finish(proc) == ["ok"]
    finally:
        made.kill_all()
    with PostgresStore(url, schema=pg_schema) as store:
        assert store.stats()["executions"] == 4
        assert sorted(e.event for e in store.pending_outbox()) == ["e0", "e1", "e2", "e3"]
    assert sql(url, f'SELECT version FROM "{pg_schema}".harel_store_schema') == [
        (postgres.SCHEMA_VERSION,)
    ]


def test_a_conflict_leaves_nothing_of_the_loser(opened: Callable[..., Any]) -> None:
    one, two = opened(), opened()
    one.commit(Execution(id="e1"), [])
    a, b = one.load("e1"), two.load("e1")
    one.commit(a, [("t", "a")], "va", [TimerOp("schedule", "pa", 1.0)], [("ca", "r", {})], {"a": 1})
    with pytest.raises(StoreConflict) as info:
        two.commit(
            b, [("t", "b")], "vb", [TimerOp("schedule", "pb", 1.0)], [("cb", "r", {})], {"b": 1}
        )
    assert (info.value.expected, info.value.found) == (1, 2)
    assert b.version == 1
    for store in (one, two):
        assert [e.event for e in store.pending_outbox()] == ["a"]
        assert [s.child_id for s in store.pending_spawns()] == ["ca"]
        assert store.due_timers(math.inf) == [("e1", "pa", 1.0)]
        assert store.read_trace("e1") == [{"a": 1, "index": 0}]
        assert store.is_processed("e1", "va") and not store.is_processed("e1", "vb")


def test_threads_racing_one_commit_id_apply_it_once(opened: Callable[..., Any]) -> None:
    """Retries of one commit racing each other: one applies it, the others are replays
    (or, at a stale version, conflicts); never two applications."""
    store = opened()
    store.commit(Execution(id="e1"), [])
    results: list[Any] = []

    def retry(store: Any) -> None:
        exe = Execution(id="e1", version=1)
        try:
            typical(store, exe, 1, commit_id="k")
            results.append(exe.version)
        except BaseException as exc:  # noqa: BLE001 - shown below
            results.append(exc)

    stores = [opened() for _ in range(4)]
    threads = [threading.Thread(target=retry, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [2, 2, 2, 2], results
    assert store.load("e1").version == 2
    assert len(store.pending_outbox()) == 2 and len(store.pending_spawns()) == 1


# --- a server restarted under a running store ------------------------------------------------


def test_a_server_restart_under_a_running_store(pg_server: Any, pg_schema: str) -> None:
    """A writer commits on, a waiter waits on, while the server restarts (or, on a server
    the tests did not start, while every connection of the store is terminated). Each
    call either returns or raises a StoreError; a commit that raised is retried with its
    commit id. Every commit that returned is there afterwards."""
    app = f"harel-restart-{uuid.uuid4().hex[:8]}"
    url = psycopg.conninfo.make_conninfo(pg_server.url, application_name=app)
    store = PostgresStore(url, schema=pg_schema, timeout=60.0)
    waiter = PostgresStore(url, schema=pg_schema, timeout=60.0)
    returned: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        exe = Execution(id="x")
        k = 0
        while not stop.is_set():
            k += 1
            for _ in range(50):
                try:
                    store.commit(exe, [("t", k)], commit_id=f"c{k}")
                    break
                except StoreError as exc:  # a clear error; the retry is recognised
                    assert "PostgreSQL" in str(exc)
                    errors.append(exc)
                    time.sleep(0.1)
                    exe = store.load("x") or Execution(id="x")
                    if exe.version >= k:
                        break
            returned.append(k)

    assert waiter.wait_for_work(0) is False
    writer = threading.Thread(target=write)
    writer.start()
    try:
        while len(returned) < 20:
            time.sleep(0.01)
        if pg_server.throwaway:
            pg_server.restart()
        else:
            sql(
                pg_server.url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (app,),
            )
        mark = len(returned)
        deadline = time.monotonic() + 60
        while len(returned) < mark + 20 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        writer.join(120)
    assert len(returned) >= mark + 20, f"the writer did not go on after the restart: {errors}"
    # The next call of a store idle through the restart reconnects.
    assert waiter.wait_for_work(10) is True  # the writer's work (or a reconnection)
    store.commit(store.load("x"), [("t", "last")])
    assert waiter.wait_for_work(10) is True
    assert waiter.wait_for_work(0) is False
    with PostgresStore(url, schema=pg_schema) as check:
        events = [e.event for e in check.pending_outbox()]
        assert events[:-1] == list(range(1, returned[-1] + 1)), "a returned commit was lost"
        assert check.load("x").version == returned[-1] + 1
    store.close()
    waiter.close()


def test_a_call_while_the_server_is_down_is_a_clear_error(pg_server: Any, pg_schema: str) -> None:
    if not pg_server.throwaway:
        pytest.skip("needs the throwaway server, to stop it")  # pragma: no cover
    store = PostgresStore(pg_server.url, schema=pg_schema, timeout=1.0)
    astore = AsyncPostgresStore(pg_server.url, schema=pg_schema, timeout=1.0)
    try:
        store.commit(Execution(id="e1"), [("t", 1)])
        asyncio.run(astore.load("e1"))
        pg_server.stop()
        try:
            with pytest.raises(StoreError, match="PostgreSQL"):
                store.load("e1")
            with pytest.raises(StoreError, match="PostgreSQL"):
                store.commit(store_exe := Execution(id="e2"), [])
            assert store_exe.version == 0
            with pytest.raises(StoreError, match="PostgreSQL"):
                asyncio.run(astore.load("e1"))
            with pytest.raises(StoreError, match="PostgreSQL"):
                store.wait_for_work(0.2)
        finally:
            pg_server.start()
        assert store.load("e1").version == 1
        assert asyncio.run(astore.load("e1")).version == 1
        assert store.wait_for_work(5) is True  # reconnected: the commit before counts
    finally:
        store.close()
        asyncio.run(astore.close())


# --- without the extra -------------------------------------------------------------------------


def test_without_psycopg_the_store_says_which_extra_to_install() -> None:
    code = """
import sys
sys.modules["psycopg"] = sys.modules["psycopg_pool"] = None
import harel_store, harel_store.postgres
from harel_store.postgres import AsyncPostgresStore, PostgresStore
for make in (
    lambda: PostgresStore("postgresql://localhost/db"),
    lambda: AsyncPostgresStore("postgresql://localhost/db"),
    lambda: harel_store.open_store("postgresql://localhost/db"),
    lambda: harel_store.open_async_store("postgres://localhost/db"),
):
    try:
        make()
    except ImportError as exc:
        assert "pip install 'harel-store[postgres]'" in str(exc), exc
    else:
        raise AssertionError("no ImportError")
print("ok")
"""
    paths = [ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
