"""The relay of :mod:`.durable` batched as an engine batches: a round claims outbox
entries, spawn intents and due timers, handles them all, writes the transitions with
one ``commit_many`` per wave and acks with one ``ack_outbox_many``, ``ack_spawn_many``
and ``delete_timer_many`` at the end.

Two transitions of one execution cannot share a batch (each is a compare-and-set on the
version the other moves), so the work of a round goes in waves: each wave holds the
next transition of every execution that has work left, and each shared execution (a
shard of a service or of the ledger) takes one wave per event it receives: a run with
``shards`` of each moves that many of their events per wave. A transition refused
by a ``StoreConflict`` (another process committed its execution meanwhile) is handled
again on a fresh copy in the next wave; an execution whose transition was applied is
not loaded again for its next one (its copy is the stored one, unless another process
committed it since: then the commit is refused, and the execution loaded again). These
copies are dropped whenever the clock moves: the coordinator forgets retired orders
only between two ticks, and a copy of a forgotten execution would store it again.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .._errors import StoreConflict, StoreError
from .._records import Commit
from .relay import DRIVER, Relay
from .workflow import NOTHING, REDELIVER_EVERY, RESPAWN_EVERY, Event, add_problem, new_child

_Prepare = Callable[[Any], Commit | None]
THIN = 4  # a wave of fewer targets than a claim's limit over this claims more work first
FRESH = 10_000  # copies a relay keeps at most


class _Job:
    """One transition to make on ``target``: ``prepare(exe)`` turns the stored copy (or
    ``None``) into its commit, or returns ``None`` when there is nothing to commit (the
    event was handled before); ``then()`` runs once its commit is applied. Applied or
    skipped, ``item`` goes to ``acks`` (when there is one): acked after the job is done."""

    __slots__ = ("acks", "blind", "item", "prepare", "target", "then")

    def __init__(
        self,
        target: Any,
        prepare: _Prepare,
        then: Callable[[], None] | None = None,
        acks: list[Any] | None = None,
        item: Any = None,
    ) -> None:
        self.target = target
        self.prepare = prepare
        self.then = then
        self.acks = acks
        self.item = item
        self.blind = False  # prepare without loading first (see BatchRelay._spawning)

    def skipped(self) -> None:
        if self.acks is not None:
            self.acks.append(self.item)

    def applied(self) -> None:
        if self.then is not None:
            self.then()
        self.skipped()


class _Acks:
    """What a round has handled and not acked yet: outbox seqs, spawn seqs, timers."""

    __slots__ = ("outbox", "spawns", "timers")

    def __init__(self) -> None:
        self.outbox: list[int] = []
        self.spawns: list[int] = []
        self.timers: list[tuple[Any, str, float]] = []

    def __len__(self) -> int:
        return len(self.outbox) + len(self.spawns) + len(self.timers)

    def flush(self, store: Any) -> None:
        """One transaction for each kind (after the commits of what they ack)."""
        if self.timers:
            store.delete_timer_many(list(self.timers))
            self.timers.clear()
        if self.spawns:
            store.ack_spawn_many(list(self.spawns))
            self.spawns.clear()
        if self.outbox:
            store.ack_outbox_many(list(self.outbox))
            self.outbox.clear()


class BatchRelay(Relay):
    """:class:`~.relay.Relay` with its writes batched: see the module's docstring."""

    def round(self) -> int:
        store = self.store
        done = self._redeliver()
        queues: dict[Any, deque[_Job]] = {}
        acks = _Acks()
        claimed = self._claim(queues, acks, timers=True)
        if claimed is None:
            return done
        load = store.load
        fresh = self._fresh  # copies known to be the stored ones, as far as this relay knows
        refused = 0
        while queues:
            if self.stopped():
                return done + claimed
            if len(queues) < self.limit // THIN:
                # A thin wave (a shared execution's events go one per wave): what the
                # last waves caused may fill it.
                claimed += self._claim(queues, acks, timers=False) or 0
            commits: list[Commit] = []
            targets: list[Any] = []
            for target in list(queues):
                queue = queues[target]
                while queue:
                    if target in fresh:
                        exe = fresh[target]
                    elif queue[0].blind:
                        exe = None  # a new child: its commit is refused if it is there
                    else:
                        exe = fresh[target] = load(target)
                    commit = queue[0].prepare(exe)
                    if commit is not None:
                        commits.append(commit)
                        targets.append(target)
                        break
                    queue.popleft().skipped()
                if not queue:
                    del queues[target]
            if not commits:
                break
            conflicts = 0
            outcomes = self.commit_many(commits)
            for target, commit, outcome in zip(targets, commits, outcomes, strict=True):
                if outcome is None:
                    fresh[target] = commit.exe  # its version moved with the commit
                    queue = queues[target]
                    queue.popleft().applied()
                    if not queue:
                        del queues[target]
                elif isinstance(outcome, StoreConflict):
                    fresh.pop(target, None)
                    queues[target][0].blind = False  # load it next time
                    conflicts += 1
                else:
                    raise outcome
            self.conflicts += conflicts
            refused = refused + 1 if conflicts == len(commits) else 0
            if refused > 2:  # only conflicts, again: let the other writer through
                time.sleep(random.random() * 0.001 * refused)
            if len(acks) >= self.limit:
                acks.flush(store)
        acks.flush(store)
        return done + claimed

    _fresh: dict[Any, Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fresh = {}

    def _claim(self, queues: dict[Any, deque[_Job]], acks: _Acks, *, timers: bool) -> int | None:
        """Claim outbox entries and spawn intents (and with ``timers`` due timers) and
        queue their jobs; how many were claimed, ``None`` when the run is gone."""
        store = self.store
        outbox = store.claim_outbox(self.limit, lease=self.lease)
        spawns = store.claim_spawns(self.limit, lease=self.lease)
        due: list[Any] = []
        if timers:
            # Read after the claims: while a relay holds work the clock cannot move, so
            # this is the tick the claimed work belongs to.
            driver = store.load(DRIVER)
            if driver is None:  # the run is over and forgotten
                self.phase = "gone"
                return None
            self.phase = driver.context["phase"]
            if driver.context["now"] != self.now or len(self._fresh) > FRESH:
                self._fresh.clear()
            self.now = now = driver.context["now"]
            due = store.claim_due_timers(now, self.limit, lease=self.lease)
        jobs: list[_Job] = []
        for triple in due:
            execution_id, path, fire_at = triple
            event = (f"timeout:{path}@{fire_at}", "timeout", None, path)
            jobs.append(self._delivery(execution_id, event, acks.timers, triple, fired=True))
        for entry in spawns:
            jobs.append(self._spawning(entry, acks.spawns))
        for entry in outbox:
            seq, target, event = entry
            if target is None:
                if event[1] == "order_finished":
                    jobs.append(self._retiring(event, acks.outbox, seq))
                else:  # "tick" and "stop" only wake relays up
                    acks.outbox.append(seq)
                continue
            if seq % REDELIVER_EVERY == 0:
                self._lost_acks.append(entry)  # the ack is lost: delivered again next round
                self.outbox_crashes += 1
                jobs.append(self._delivery(target, event, None, seq))
            else:
                jobs.append(self._delivery(target, event, acks.outbox, seq))
        for job in jobs:
            queues.setdefault(job.target, deque()).append(job)
        return len(due) + len(spawns) + len(outbox)

    # -- the jobs ---------------------------------------------------------------------

    def _delivery(
        self, target: Any, event: Event, acks: list[Any] | None, item: Any, *, fired: bool = False
    ) -> _Job:
        event_id = event[0]

        def prepare(exe: Any) -> Commit | None:
            if exe is None:
                self.dead_letters += 1
                return None
            if self.store.is_processed(target, event_id):
                self.redeliveries_skipped += 1
                return None
            before = exe.active_path[-1]
            step = self.handlers[exe.definition_id](exe, event)
            return self.prepared(exe, step, event_id, event[1], before, event_id)

        def applied() -> None:
            self.delivered += 1
            self.timers_fired += fired

        return _Job(target, prepare, applied, acks, item)

    def _spawning(self, entry: Any, acks: list[int]) -> _Job:
        seq, parent_id, child_id, root_path, context = entry

        def prepare(exe: Any) -> Commit | None:
            if exe is not None:  # created before, by this round or another
                self.spawns_skipped += 1
                acks.append(seq)
                return None
            child = new_child(parent_id, child_id, root_path, context)
            step = ([(child_id, "start", None)], (), ())
            return self.prepared(child, step, None, "created", "", "created")

        def applied() -> None:
            self.children_created += 1
            if seq % RESPAWN_EVERY == 0:
                self._lost_spawn_acks.append(entry)
                self.spawn_crashes += 1
            else:
                acks.append(seq)

        job = _Job(child_id, prepare, applied)
        # Not loaded first: a child is new but when its intent is delivered again (a
        # claim taken over), and then the commit that creates it is refused by the CAS,
        # and the job is prepared again from a loaded copy.
        job.blind = True
        return job

    def _retiring(self, event: Event, acks: list[int], seq: int) -> _Job:
        event_id, order_id = event[0], event[2]
        ledger_id = self.ledger_of(order_id)
        tally: list[dict[str, Any]] = []  # read once, however many tries

        def prepare(ledger: Any) -> Commit | None:
            if ledger is None:
                raise StoreError(f"{ledger_id} is missing from the store")
            if self.store.is_processed(ledger_id, event_id):
                self.redeliveries_skipped += 1
                return None
            if not tally:
                tally.append(self._tally(order_id))
            context = ledger.context
            context["finished"] += 1
            context["retired"].append(order_id)
            for key, value in tally[0].items():
                if key == "problems":
                    for text in value:
                        add_problem(context["problems"], text)
                else:
                    context[key] += value
            return self.prepared(ledger, NOTHING, event_id, "order_finished", "open", event_id)

        def applied() -> None:
            self.retired += 1

        return _Job(ledger_id, prepare, applied, acks, seq)
