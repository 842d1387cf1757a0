"""PostgreSQL failover under running processes (issue 28): a primary and a synchronous
streaming standby on loopback, writers and relays (sync and async stores) on a multi-host
URL with ``target_session_attrs=read-write``; the standby is promoted and the old primary
stopped mid-stream, then brought back as a read-only standby still listed first.

Needs the PostgreSQL server binaries with ``pg_basebackup`` (Debian: ``postgresql``);
the module's own two clusters, so it runs whatever ``HAREL_STORE_PG_URL`` names. About a
minute on two cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _pg
import pytest

from harel_store import Commit, Execution, StoreError
from harel_store.postgres import AsyncPostgresStore, PostgresStore

WRITERS = 3  # sync ones, w0...; and one async writer, a0
SCHEMA: dict[str, str] = {}  # the schema of the failover test, for the one after it

# A writer: commits transitions of its execution, each with a commit id, one trace entry
# and one emitted event; after a StoreError (the server went, the outcome unknown) it
# tries the same commit again until it returns, then prints its number. It stops when
# the file ``stop`` exists.
WRITER = r"""
import os, sys, time
from harel_store import Execution, StoreError
from harel_store.postgres import PostgresStore

url, schema, name, stop = sys.argv[1:5]
store = PostgresStore(url, schema=schema, trace_max=None, timeout=60.0)
exe = Execution(id=name)
k = 0
while not os.path.exists(stop):
    k += 1
    exe.context["k"] = k
    retries = 0
    while True:
        try:
            store.commit(exe, [(None, {"w": name, "k": k})], trace={"k": k},
                         commit_id=f"{name}-{k}")
            break
        except StoreError as exc:
            retries += 1
            if retries > 200:
                raise
            print("retry", k, exc, file=sys.stderr, flush=True)
            time.sleep(0.05)
    print(k, flush=True)
store.close()
"""

# The relay: claims and acks outbox entries, printing how many it acked each time.
RELAY = r"""
import os, sys, time
from harel_store import StoreError
from harel_store.postgres import PostgresStore

url, schema, stop = sys.argv[1:4]
store = PostgresStore(url, schema=schema, timeout=60.0)
acked = 0
while not os.path.exists(stop):
    try:
        for entry in store.claim_outbox(50, lease=5.0):
            store.ack_outbox(entry.seq)
            acked += 1
    except StoreError as exc:
        print("retry", exc, file=sys.stderr, flush=True)
    print(acked, flush=True)
    time.sleep(0.02)
store.close()
"""


# The async writer: WRITER on AsyncPostgresStore, in one asyncio.run.
ASYNC_WRITER = r"""
import asyncio, os, sys
from harel_store import Execution, StoreError
from harel_store.postgres import AsyncPostgresStore

url, schema, name, stop = sys.argv[1:5]

async def main():
    async with AsyncPostgresStore(url, schema=schema, trace_max=None, timeout=60.0) as store:
        exe = Execution(id=name)
        k = 0
        while not os.path.exists(stop):
            k += 1
            exe.context["k"] = k
            retries = 0
            while True:
                try:
                    await store.commit(exe, [(None, {"w": name, "k": k})], trace={"k": k},
                                       commit_id=f"{name}-{k}")
                    break
                except StoreError as exc:
                    retries += 1
                    if retries > 200:
                        raise
                    print("retry", k, exc, file=sys.stderr, flush=True)
                    await asyncio.sleep(0.05)
            print(k, flush=True)

asyncio.run(main())
"""

# The async relay: waits for work, claims and acks; prints how many it acked and
# whether that wait woke ("acked:1") or timed out ("acked:0"). The store's log goes to
# stderr.
ASYNC_RELAY = r"""
import asyncio, logging, os, sys
from harel_store import StoreError
from harel_store.postgres import AsyncPostgresStore

url, schema, stop = sys.argv[1:4]
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="LOG %(message)s")
logging.getLogger("psycopg").setLevel(logging.ERROR)

async def main():
    async with AsyncPostgresStore(url, schema=schema, timeout=60.0) as store:
        acked = 0
        while not os.path.exists(stop):
            try:
                woke = await store.wait_for_work(1.0)
                entries = await store.claim_outbox(50, lease=5.0)
                await store.ack_outbox_many(entry.seq for entry in entries)
                acked += len(entries)
            except StoreError as exc:
                print("retry", exc, file=sys.stderr, flush=True)
                await asyncio.sleep(0.02)
                continue
            print(f"{acked}:{int(woke)}", flush=True)
            await asyncio.sleep(0.02)

asyncio.run(main())
"""


def user_of(server: _pg.Server) -> str:
    return server.url.split("://")[1].split("@")[0]


def ha_url(first: _pg.Server, second: _pg.Server) -> str:
    return (
        f"postgresql://{user_of(first)}@127.0.0.1:{_pg.port_of(first)},"
        f"127.0.0.1:{_pg.port_of(second)}/postgres?sslmode=disable&gssencmode=disable"
        "&target_session_attrs=read-write&connect_timeout=3"
    )


def sql(url: str, statement: str) -> list[Any]:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description else []


def wait_for(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[_pg.Server, _pg.Server]]:
    bindir = _pg.find_bindir()
    if bindir is None or not (bindir / "pg_basebackup").exists():
        reason = "no PostgreSQL server binaries with pg_basebackup"
        if _pg.required():
            pytest.fail(f"{_pg.REQUIRE_ENV} is set: {reason}", pytrace=False)
        pytest.skip(reason)
    primary = _pg.start_throwaway(bindir)
    standby = None
    try:
        standby = _pg.start_standby(primary, bindir)
        _pg.wait_until_ready(standby.url)
        _pg.configure(primary, "synchronous_standby_names = '*'")
        primary.ctl("reload")
        wait_for(
            "the standby streams synchronously",
            lambda: sql(primary.url, "SELECT sync_state FROM pg_stat_replication") == [("sync",)],
        )
        yield primary, standby
    finally:
        if standby is not None:
            standby.destroy()
        primary.destroy()


def lines(path: Path) -> list[str]:
    return path.read_text().split()


def test_writers_and_a_relay_continue_on_the_promoted_standby(
    pair: tuple[_pg.Server, _pg.Server], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="harel_store")
    primary, standby = pair
    url = ha_url(primary, standby)
    schema = SCHEMA["before"] = _pg.fresh_schema()
    stop = tmp_path / "stop"
    listener = PostgresStore(url, schema=schema)  # opens the schema before the writers
    assert listener.wait_for_work(0.0) in (True, False)  # its listening connection
    procs: list[tuple[subprocess.Popen[str], Path]] = []
    files = contextlib.ExitStack()

    def spawn(name: str, *args: str) -> None:
        out = tmp_path / f"{name}.out"
        proc = subprocess.Popen(
            [sys.executable, "-c", *args],
            stdout=files.enter_context(out.open("w")),
            stderr=files.enter_context(out.with_suffix(".err").open("w")),
            text=True,
        )
        procs.append((proc, out))

    try:
        for w in range(WRITERS):
            spawn(f"w{w}", WRITER, url, schema, f"w{w}", str(stop))
        spawn("a0", ASYNC_WRITER, url, schema, "a0", str(stop))
        writers = [(f"w{w}", out) for w, (_, out) in enumerate(procs[:WRITERS])]
        writers.append(("a0", procs[WRITERS][1]))
        spawn("relay", RELAY, url, schema, str(stop))
        spawn("arelay", ASYNC_RELAY, url, schema, str(stop))
        arelay = procs[-1][1]
        wait_for(
            "every writer committed on the primary",
            lambda: all(len(lines(out)) >= 20 for _, out in writers),
        )
        # Fail over mid-stream: the standby becomes the primary, the old one stops.
        standby.ctl("-w", "promote")
        primary.stop()
        at_failover = {out: len(lines(out)) for _, out in procs}
        wait_for(
            "every writer and the relay went on on the new primary",
            lambda: all(len(lines(out)) >= at_failover[out] + 20 for _, out in procs),
        )
        assert sql(standby.url, "SELECT pg_is_in_recovery()") == [(False,)]
        # The async relay's wait_for_work woke on the new primary (its listening
        # connection, on the old one, was replaced), and its pool's new connections
        # went there: said once.
        assert any(line.endswith(":1") for line in lines(arelay)[at_failover[arelay] :])
        logged = arelay.with_suffix(".err").read_text()
        assert logged.count("no longer to") == 1, logged
        assert f":{_pg.port_of(standby)}, no longer" in logged
        # wait_for_work, whose listening connection was on the old primary, wakes on
        # the new one: the writers commit there.
        assert listener.wait_for_work(30.0) is True
        # Its pooled connection, on the old primary, is found dead and replaced by one
        # to the new: each logged once.
        assert listener.load("w0") is not None
        moved = [r for r in caplog.records if "no longer to" in r.getMessage()]
        assert len(moved) == 1 and f":{_pg.port_of(standby)}," in moved[0].getMessage()
        assert listener.load("w1") is not None
        assert len([r for r in caplog.records if "no longer to" in r.getMessage()]) == 1
        stop.touch()
        for proc, out in procs:
            assert proc.wait(timeout=120) == 0, (out.with_suffix(".err")).read_text()
        # Every commit that returned is on the new primary, each applied once.
        with PostgresStore(standby.url, schema=schema, trace_max=None) as store:
            for name, out in writers:
                returned = [int(k) for k in lines(out)]
                assert returned == list(range(1, len(returned) + 1))
                exe = store.load(name)
                assert exe is not None
                assert exe.version == len(returned) == exe.context["k"]
                assert [step["k"] for step in store.read_trace(name)] == returned
        retried = "".join((out.with_suffix(".err")).read_text() for _, out in procs)
        print(retried)  # shown with -s: what the failover cost the processes
    finally:
        stop.touch()
        for proc, _ in procs:
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait(timeout=10)
        files.close()
        listener.close()


def test_the_old_primary_back_as_a_read_only_standby(
    pair: tuple[_pg.Server, _pg.Server], caplog: pytest.LogCaptureFixture
) -> None:
    """After the failover of the test above: the old primary returns read-only, still
    first in the URL. A store on the URL commits on the new primary; a store on the old
    one alone gets a StoreError to retry, and its connection is discarded."""
    caplog.set_level(logging.INFO, logger="harel_store")
    old, new = pair
    if "before" not in SCHEMA:
        pytest.skip("runs after the failover of the test above")
    _pg.demote(old, new)
    _pg.wait_until_ready(old.url)
    assert sql(old.url, "SELECT pg_is_in_recovery()") == [(True,)]
    schema = _pg.fresh_schema()
    with PostgresStore(ha_url(old, new), schema=schema) as store:
        exe = Execution(id="after")
        store.commit(exe, [], commit_id="after-1")
        assert exe.version == 1
    with pytest.raises(StoreError, match="Retry: the session is read-only"):
        PostgresStore(old.url, schema=schema)  # its schema is not there to create
    # A store on the old primary alone, on a schema from before the failover.
    with PostgresStore(old.url, schema=SCHEMA["before"]) as stale:
        assert stale._pool is not None
        idle = list(stale._pool._pool._pool)  # psycopg-pool's idle connections
        exe = Execution(id="refused")
        caplog.clear()
        with pytest.raises(StoreError, match="Retry: the session is read-only"):
            stale.commit(exe, [], commit_id="refused-1")
        assert exe.version == 0
        assert all(conn.closed for conn in idle)
        closing = [r for r in caplog.records if "closing a connection" in r.getMessage()]
        assert len(closing) == 1 and "SQLSTATE 25006" in closing[0].getMessage()
        with pytest.raises(StoreError, match="read-only"):
            stale.commit(exe, [], commit_id="refused-1")
        assert stale.pool_stats()["connections_num"] >= 2  # a new one for each try

    async def the_async_twin() -> None:
        async with AsyncPostgresStore(ha_url(old, new), schema=schema) as store:
            exe = Execution(id="after-async")
            await store.commit(exe, [], commit_id="after-async-1")
            assert exe.version == 1
        async with AsyncPostgresStore(old.url, schema=SCHEMA["before"]) as stale:
            exe = Execution(id="refused-async")
            caplog.clear()
            with pytest.raises(StoreError, match="Retry: the session is read-only"):
                await stale.commit(exe, [], commit_id="refused-async-1")
            assert exe.version == 0
            closing = [r for r in caplog.records if "closing a connection" in r.getMessage()]
            assert len(closing) == 1 and "SQLSTATE 25006" in closing[0].getMessage()
            with pytest.raises(StoreError, match="read-only"):
                await stale.commit(exe, [], commit_id="refused-async-1")
            assert stale.pool_stats()["connections_num"] >= 2  # a new one for each try

    asyncio.run(the_async_twin())


@pytest.fixture(scope="module")
def lone(pair: tuple[_pg.Server, _pg.Server]) -> Iterator[_pg.Server]:
    """A throwaway server of these tests' own, to stop, start and reconfigure."""
    bindir = _pg.find_bindir()
    assert bindir is not None
    server = _pg.start_throwaway(bindir)
    yield server
    server.destroy()


def test_a_server_that_is_down(lone: _pg.Server, caplog: pytest.LogCaptureFixture) -> None:
    """Opening while the server is down tries again for connect_timeout, then raises a
    StoreError naming the host without the password; it opens once the server is back;
    a call while it is down raises, and the first call after it is back passes. The
    sync store, then the async one (which opens at its first call)."""
    caplog.set_level(logging.INFO, logger="harel_store")
    secret = "pw-" + "x" * 8
    url = lone.url + f"&password={secret}"
    where = f"127.0.0.1:{_pg.port_of(lone)}"
    schema = _pg.fresh_schema()
    lone.stop()
    with pytest.raises(StoreError) as info:
        PostgresStore(url, schema=schema, connect_timeout=1.0)
    assert "cannot open" in str(info.value) and where in str(info.value)
    assert secret not in str(info.value)
    said = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(said) == 1 and secret not in said[0].getMessage()  # once, not per try
    # Opened while the server comes back.
    starting = threading.Thread(target=lambda: (time.sleep(1.0), lone.start()))
    starting.start()
    try:
        store = PostgresStore(url, schema=schema, connect_timeout=5.0, timeout=60.0)
    finally:
        starting.join()
    with store:
        store.commit(Execution(id="e1"), [])
        lone.stop()
        with pytest.raises(StoreError) as info:
            store.load("e1")
        assert where in str(info.value) and secret not in str(info.value)
        lone.start()
        loaded = store.load("e1")
        assert loaded is not None and loaded.version == 1

    lone.stop()
    caplog.clear()
    astore = AsyncPostgresStore(url, schema=schema, connect_timeout=1.0)
    with pytest.raises(StoreError) as info:
        asyncio.run(astore.load("e1"))
    assert "cannot open" in str(info.value) and where in str(info.value)
    assert secret not in str(info.value)
    said = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(said) == 1 and secret not in said[0].getMessage()
    asyncio.run(astore.close())
    astore = AsyncPostgresStore(url, schema=schema, connect_timeout=5.0, timeout=60.0)
    starting = threading.Thread(target=lambda: (time.sleep(1.0), lone.start()))
    starting.start()
    try:
        loaded = asyncio.run(astore.load("e1"))  # opened while the server comes back
    finally:
        starting.join()
    assert loaded is not None and loaded.version == 1

    async def down_and_back() -> None:
        lone.stop()
        with pytest.raises(StoreError) as info:
            await astore.load("e1")
        assert where in str(info.value) and secret not in str(info.value)
        lone.start()
        loaded = await astore.load("e1")
        assert loaded is not None and loaded.version == 1
        await astore.close()

    asyncio.run(down_and_back())


def test_a_batch_whose_connection_is_lost_is_settled(lone: _pg.Server) -> None:
    """A batch (one transaction begun and committed by the store) whose connection is
    lost: before its COMMIT was sent, it raises a StoreError that says nothing was
    written (retry); during its COMMIT, the store asks the server (pg_xact_status of the
    transaction's id, read with its BEGIN) and returns the outcomes of a batch that
    committed. The COMMIT is held by a synchronous standby that never comes, the lock
    by another transaction; the backend is terminated there. Sync, then async."""
    app = "harel-doubt"
    url = lone.url + f"&application_name={app}"
    schema = _pg.fresh_schema()

    def backend(waiting_on: str) -> int:
        query = (
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'harel-doubt' "
            f"AND '{waiting_on}' IN (wait_event, wait_event_type)"
        )
        found: list[Any] = []
        wait_for(
            f"a backend waiting on {waiting_on}",
            lambda: found.extend(sql(lone.url, query)) or found,
        )
        return int(found[0][0])

    def terminate(waiting_on: str) -> None:
        sql(lone.url, f"SELECT pg_terminate_backend({backend(waiting_on)})")

    def commits_held() -> None:
        sql(lone.url, "ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        sql(lone.url, "SELECT pg_reload_conf()")

    def commits_go() -> None:
        sql(lone.url, "ALTER SYSTEM RESET synchronous_standby_names")
        sql(lone.url, "SELECT pg_reload_conf()")

    def locked(eid: str) -> Any:
        import psycopg

        blocker = psycopg.connect(lone.url)
        blocker.execute(f'SELECT FROM "{schema}".executions WHERE id = %s FOR UPDATE', (eid,))
        return blocker

    with PostgresStore(url, schema=schema) as store:
        exe = Execution(id="e1")
        store.commit(exe, [])
        # Lost before its COMMIT: nothing written, and the store says so.
        blocker = locked("e1")
        got: list[Any] = []
        batch = threading.Thread(
            target=lambda: got.append(_outcome(store.commit_many, [Commit(exe, [(None, "x")])]))
        )
        batch.start()
        terminate("Lock")  # waiting for the row lock
        batch.join()
        blocker.close()
        assert isinstance(got[0], StoreError) and "nothing was written" in str(got[0]), got
        assert "Retry" in str(got[0]) and exe.version == 1
        assert store.load("e1").version == 1  # type: ignore[union-attr]
        # Lost during its COMMIT, which landed (locally: the standby never came).
        commits_held()
        try:
            got.clear()
            batch = threading.Thread(
                target=lambda: got.append(
                    _outcome(store.commit_many, [Commit(exe, [(None, "y")], commit_id="c2")])
                )
            )
            batch.start()
            terminate("SyncRep")
            batch.join()
        finally:
            commits_go()
        assert got == [[None]] and exe.version == 2
        assert store.load("e1").version == 2  # type: ignore[union-attr]

    async def the_async_twin() -> None:
        async with AsyncPostgresStore(url, schema=schema) as astore:
            exe = await astore.load("e1")
            assert exe is not None
            commits_held()
            try:
                batch = asyncio.ensure_future(
                    astore.commit_many([Commit(exe, [(None, "z")], commit_id="c3")])
                )
                await asyncio.to_thread(terminate, "SyncRep")
                assert await batch == [None]
            finally:
                commits_go()
            assert exe.version == 3
            assert (await astore.load("e1")).version == 3  # type: ignore[union-attr]
            assert len(await astore.pending_outbox()) == 2

    asyncio.run(the_async_twin())


def _outcome(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except StoreError as exc:
        return exc
