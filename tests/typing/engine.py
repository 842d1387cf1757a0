"""An engine's relay, sweeper and batch writer, typed against the protocols alone, and
every store class handed to them: ``mypy --strict`` must accept all of it."""

from __future__ import annotations

from harel_store import (
    AsyncDictStore,
    AsyncExecutionStore,
    Commit,
    DictStore,
    Execution,
    ExecutionStore,
    StoreConflict,
    TimerOp,
    open_async_store,
    open_store,
)
from harel_store.postgres import AsyncPostgresStore, PostgresStore
from harel_store.sqlite import AsyncSqliteStore, SqliteStore


def relay(store: ExecutionStore) -> int:
    """Deliver claimed outbox entries as steps of their targets, then ack them."""
    entries = store.claim_outbox(50, lease=10.0)
    steps: list[Commit] = []
    for entry in entries:
        target = store.load(str(entry.target_id))
        if target is None or store.is_processed(target.id, f"outbox:{entry.seq}"):
            continue
        steps.append(Commit(target, [], f"outbox:{entry.seq}", commit_id=f"outbox:{entry.seq}"))
    outcomes = store.commit_many(steps)
    store.ack_outbox_many(entry.seq for entry, outcome in zip(entries, outcomes) if outcome is None)
    return sum(1 for outcome in outcomes if isinstance(outcome, StoreConflict))


def sweeper(store: ExecutionStore, now: float) -> None:
    """Fire the due timers, each as a step, and delete the ones fired."""
    fired: list[tuple[str, str, float]] = []
    for execution_id, path, fire_at in store.claim_due_timers(now, 100, lease=5.0):
        exe = store.load(execution_id)
        if exe is not None:
            store.commit(exe, [(None, f"timeout {path}")], commit_id=f"timer:{path}:{fire_at}")
            fired.append((execution_id, path, fire_at))
    store.delete_timer_many(fired)
    for spawn in store.claim_spawns(10):
        if store.load(str(spawn.child_id)) is None:
            store.save(Execution(id=spawn.child_id, parent_id=spawn.parent_id))
    store.ack_spawn_many(spawn.seq for spawn in store.pending_spawns())


def writer(store: ExecutionStore) -> list[str]:
    """A batch of steps with timers and a trace; the refused ones by id."""
    exes = [Execution(id=f"order-{n}") for n in range(3)]
    batch = [
        Commit(exe, [("billing", {"n": n})], f"evt-{n}", [TimerOp("schedule", "pay", 1.0)],
               trace={"event": "go"}, epoch=1)
        for n, exe in enumerate(exes)
    ]  # fmt: skip
    refused = [str(c.exe.id) for c, out in zip(batch, store.commit_many(batch)) if out is not None]
    with store:
        store.wait_for_work(0.1)
        store.forget("order-0")
        print(store.stats())
    return refused


async def async_relay(store: AsyncExecutionStore) -> None:
    entries = await store.claim_outbox(50, lease=10.0)
    steps = [Commit(await store.load(str(entry.target_id))) for entry in entries]
    outcomes = await store.commit_many(steps)
    await store.ack_outbox_many(e.seq for e, o in zip(entries, outcomes) if o is None)
    for execution_id, path, fire_at in await store.claim_due_timers(0.0):
        await store.delete_timer(execution_id, path, fire_at)
    await store.delete_timer_many([])
    async with store:
        await store.wait_for_work(0.1)
        print(await store.stats())


def operator(store: ExecutionStore) -> int:
    """Page through every execution, alert on a stuck relay, trim the dedupe horizon."""
    seen = 0
    after: str | None = None
    while page := store.list_executions(after=after, limit=500):
        seen += len(page)
        after = page[-1]
    figures = store.overview(now=0.0)
    age = figures["outbox_oldest_age"]
    if age is not None and age > 60.0:
        print("relay stuck", figures["expired_leases"])
    deleted: dict[str, int] = store.prune(7 * 86400.0)
    return seen + deleted["processed"]


async def async_operator(store: AsyncExecutionStore) -> int:
    figures = await store.overview()
    page = await store.list_executions(limit=10)
    return len(page) + (await store.prune(3600.0))["commit_ids"] + int(figures["executions"])


def every_store() -> None:
    """Never run: what mypy checks is that each store class is accepted."""
    for sync in (
        DictStore(),
        SqliteStore("x.db"),
        PostgresStore("postgresql:///x"),
        open_store("memory:"),
    ):
        relay(sync)
        sweeper(sync, 0.0)
        writer(sync)
        operator(sync)
    for asynchronous in (
        AsyncDictStore(),
        AsyncSqliteStore("x.db"),
        AsyncPostgresStore("postgresql:///x"),
        open_async_store("memory:"),
    ):
        async_relay(asynchronous).close()
        async_operator(asynchronous).close()
