"""The concurrency statement, tested (the issue, point 5).

One event loop, no lock: no method of the async store awaits internally, so each runs
whole between two suspension points. Hundreds of tasks load and commit their own and
shared executions, yielding to the loop between every two calls, while relay tasks drain
and ack the outbox and spawns and a sweeper deletes due timers. The CAS must lose no
update (each execution's version is the number of commits that succeeded on it), a
refused commit must leave no trace, and the seqs handed out must be unique and gap-free.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from harel_store import Execution, StoreConflict, TimerOp

SHARED = [f"shared-{k}" for k in range(5)]


@dataclass
class Ledger:
    """What the tasks did, to check the store against."""

    commits: Counter = field(default_factory=Counter)  # execution id -> commits that won
    conflicts: int = 0
    events: Counter = field(default_factory=Counter)  # events of the commits that won
    lost_events: set = field(default_factory=set)  # events of the commits that lost
    children: Counter = field(default_factory=Counter)
    marks: set = field(default_factory=set)
    lost_marks: set = field(default_factory=set)
    drained: list = field(default_factory=list)  # outbox entries acked, in ack order
    spawned: list = field(default_factory=list)
    deleted_timers: int = 0
    producers_done: bool = False


async def produce(astore: Any, ledger: Ledger, task: int, rounds: int, rng: random.Random) -> None:
    own = f"own-{task}"
    step = 0  # this task's commit attempts, in order
    for r in range(rounds):
        for eid in (own, SHARED[task % len(SHARED)], rng.choice(SHARED)):
            attempt = 0
            while True:
                attempt += 1
                exe = await astore.load(eid)
                await asyncio.sleep(0)
                if exe is None:
                    exe = Execution(id=eid)  # two tasks may race to create it: CAS decides
                elif rng.random() < 0.3:
                    # a stale-prone copy, as a process that deserialized the row would hold
                    exe = Execution(id=eid, version=exe.version, context=dict(exe.context))
                    await asyncio.sleep(0)
                step += 1
                tag = (task, step, eid, attempt)
                events = [("event", task, step, k) for k in range(1 + rng.randrange(3))]
                try:
                    await astore.commit(
                        exe,
                        [(rng.choice([None, own, *SHARED]), ev) for ev in events],
                        ("mark", *tag),
                        [TimerOp("schedule", ("tick", task % 3), float(rng.randrange(50)))],
                        [(("child", *tag), "region", {"tag": tag})] if rng.random() < 0.3 else (),
                        {"tag": tag},
                    )
                except StoreConflict:
                    ledger.conflicts += 1
                    ledger.lost_events.update(events)
                    ledger.lost_marks.add((eid, ("mark", *tag)))
                    await asyncio.sleep(0)
                    continue
                ledger.commits[eid] += 1
                ledger.events.update(events)
                ledger.marks.add((eid, ("mark", *tag)))
                break
            await asyncio.sleep(0)


async def relay(astore: Any, ledger: Ledger, claimed: set, kind: str, rng: random.Random) -> None:
    pending_call = astore.pending_outbox if kind == "outbox" else astore.pending_spawns
    ack = astore.ack_outbox if kind == "outbox" else astore.ack_spawn
    sink = ledger.drained if kind == "outbox" else ledger.spawned
    while True:
        done = ledger.producers_done
        pending = await pending_call()
        if not pending and done:
            return
        rng.shuffle(pending)  # ack in any order
        for entry in pending[: 1 + rng.randrange(32)]:
            if entry.seq in claimed:
                continue  # another relay took it
            claimed.add(entry.seq)
            await asyncio.sleep(0)  # "deliver"
            await ack(entry.seq)
            sink.append(entry)
        await asyncio.sleep(0)


async def sweeper(astore: Any, ledger: Ledger) -> None:
    while not ledger.producers_done:
        for eid, path, fire_at in await astore.due_timers(25.0):
            await asyncio.sleep(0)  # the timer may be re-armed meanwhile
            before = (await astore.stats())["timers"]
            await astore.delete_timer(eid, path, fire_at)
            ledger.deleted_timers += before - (await astore.stats())["timers"]
        await asyncio.sleep(0)


async def scenario(impl: Any, tasks: int, rounds: int, seed: int) -> tuple[Any, Ledger]:
    astore = impl.AsyncDictStore(trace_max=None)
    ledger = Ledger()
    rng = random.Random(seed)

    async def producers() -> None:
        await asyncio.gather(
            *(produce(astore, ledger, t, rounds, random.Random(rng.random())) for t in range(tasks))
        )
        ledger.producers_done = True

    claimed_outbox: set = set()
    claimed_spawns: set = set()
    await asyncio.gather(
        producers(),
        *(relay(astore, ledger, claimed_outbox, "outbox", random.Random(k)) for k in range(4)),
        *(relay(astore, ledger, claimed_spawns, "spawns", random.Random(k)) for k in range(2)),
        sweeper(astore, ledger),
    )
    return astore, ledger


@pytest.mark.parametrize("seed", [1, 2])
def test_many_tasks_lose_no_update_and_no_seq(impl: Any, seed: int) -> None:
    astore, ledger = asyncio.run(scenario(impl, tasks=300, rounds=3, seed=seed))

    async def check() -> None:
        assert ledger.conflicts > 0, "the scenario never raced: it tests nothing"
        # No lost update: every commit that won bumped the stored version by one.
        for eid, n in ledger.commits.items():
            exe = await astore.load(eid)
            assert exe.version == n, eid
            trace = await astore.read_trace(eid)
            assert [step["index"] for step in trace] == list(range(n)), eid
        # Seqs: every one handed out was drained exactly once, with no gap.
        seqs = [entry.seq for entry in ledger.drained]
        assert sorted(seqs) == list(range(1, len(seqs) + 1))
        spawn_seqs = [entry.seq for entry in ledger.spawned]
        assert sorted(spawn_seqs) == list(range(1, len(spawn_seqs) + 1))
        # What was drained is exactly what the winning commits emitted: nothing from a
        # commit that lost, nothing twice, nothing missing.
        assert Counter(entry.event for entry in ledger.drained) == ledger.events
        assert not ledger.lost_events & set(ledger.events)
        # Each producer's events went out in the order it emitted them.
        by_seq = sorted(ledger.drained, key=lambda entry: entry.seq)
        last: dict[int, tuple] = {}
        for entry in by_seq:
            _, task, step, k = entry.event
            assert last.get(task, (0, 0)) < (step, k), entry
            last[task] = (step, k)
        for eid, mark in ledger.marks:
            assert await astore.is_processed(eid, mark)
        for eid, mark in ledger.lost_marks:
            assert not await astore.is_processed(eid, mark)
        stats = await astore.stats()
        assert stats["outbox"] == stats["spawns"] == 0
        assert await astore.pending_outbox() == [] and await astore.pending_spawns() == []
        assert stats["executions"] == len(ledger.commits)
        assert stats["processed"] == len(ledger.marks)
        assert stats["timers"] == len(await astore.due_timers(math.inf))
        assert stats["trace_steps"] == sum(ledger.commits.values())
        assert ledger.deleted_timers > 0

    asyncio.run(check())


def test_tasks_that_interleave_forget_and_commit(impl: Any) -> None:
    """Tasks forget executions while others commit to them: each forget and each commit
    is whole, so whatever the interleaving, the store's counts match what it shows."""

    async def run() -> None:
        astore = impl.AsyncDictStore()
        ids = [f"e{k}" for k in range(20)]

        async def writer(task: int) -> None:
            rng = random.Random(task)
            for r in range(20):
                eid = rng.choice(ids)
                exe = await astore.load(eid) or Execution(id=eid)
                await asyncio.sleep(0)
                try:
                    await astore.commit(exe, [(None, (task, r))], (task, r),
                                        [TimerOp("schedule", "t", float(r))], (), {"r": r})  # fmt: skip
                except StoreConflict:
                    pass  # it was forgotten and re-created meanwhile
                await asyncio.sleep(0)

        async def forgetter() -> None:
            rng = random.Random(99)
            for _ in range(200):
                await astore.forget(rng.choice(ids))
                await asyncio.sleep(0)

        await asyncio.gather(*(writer(t) for t in range(50)), forgetter())
        stats = await astore.stats()
        loaded = [await astore.load(eid) for eid in ids]
        traces = [await astore.read_trace(eid) for eid in ids]
        assert stats["executions"] == sum(exe is not None for exe in loaded)
        assert stats["timers"] == len(await astore.due_timers(math.inf))
        assert {t[0] for t in await astore.due_timers(math.inf)} <= {
            eid for eid, exe in zip(ids, loaded) if exe is not None
        }
        assert stats["traces"] == sum(bool(t) for t in traces)
        assert stats["trace_steps"] == sum(len(t) for t in traces)
        for trace in traces:
            assert [s["index"] for s in trace] == list(range(len(trace)))
        assert [e.seq for e in await astore.pending_outbox()] == list(range(1, stats["outbox"] + 1))

    asyncio.run(run())
