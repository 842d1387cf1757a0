"""The relay of the demonstration on a durable store (see :mod:`.durable`): the
commits of a writer with its own ``commit_id`` token, retried when their outcome is
unknown, and :class:`Relay`, which claims outbox entries, spawn intents and due timers,
delivers them one commit each, and retires finished orders into the ledger.
:mod:`.batched` batches the same work."""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from .._errors import IdempotencyConflict, StaleWriter, StoreConflict, StoreError
from .._records import Commit, Execution, OutboxEntry, SpawnEntry
from .result import WorkerReport
from .workflow import (
    NOTHING,
    REDELIVER_EVERY,
    RESPAWN_EVERY,
    Event,
    Step,
    Workflow,
    add_problem,
    fates,
    new_child,
    order_index,
    planned_status,
    shard_id,
)

DRIVER = "demo/driver"
LEDGER = "demo/ledger"
LEASE = 10.0  # seconds a claim holds: a killed run's claims are taken over after this
CLAIM = 100  # entries per claim
RETRIES = 5  # tries of a commit whose outcome is unknown
ONE_BY_ONE = 2  # batches this small are written with commit (see _Writer.commit_many)


class Refused(Exception):
    """The store cannot take this run: it holds something else, or a run and no
    ``--resume``. The message says what to do."""


def _never() -> bool:
    return False


def ledger_ids(shards: int) -> list[str]:
    """The ledger's shards: order ``i`` is retired into shard ``i % shards``."""
    return [shard_id(LEDGER, k, shards) for k in range(shards)]


def new_ledger(execution_id: str = LEDGER) -> Execution:
    return Execution(
        id=execution_id,
        definition_id="ledger",
        active_path=("ledger", "open"),
        context={
            "finished": 0,
            "completed": 0,
            "timed_out": 0,
            "children": 0,
            "missed_pickups": 0,
            "problems": [],
            "retired": [],
        },
    )


class _Writer(Workflow):
    """The workflow's commits on a durable store, each with a ``commit_id`` of this
    writer's own: ``TOKEN:what``. Retried after an error that leaves its outcome
    unknown, a commit writes nothing if it had landed; the same work done by another
    writer (a relay that took over an expired claim) is refused by the CAS instead, and
    is then seen by ``is_processed``, so each commit that returns counts exactly once."""

    def __init__(self, store: Any) -> None:
        super().__init__()
        self.store = store
        self.token = uuid.uuid4().hex[:12]
        self.commits = 0
        self.conflicts = 0

    def commit(
        self,
        exe: Any,
        step: Step,
        processed_event_id: str | None,
        kind: str,
        before: str,
        what: str,
        epoch: int | None = None,
    ) -> None:
        self._write(self.prepared(exe, step, processed_event_id, kind, before, what, epoch))
        self.commits += 1

    def _write(self, one: Commit) -> None:
        commit = self.store.commit
        for attempt in range(RETRIES):
            try:
                commit(*one[:6], commit_id=one.commit_id, epoch=one.epoch)
                return
            except (StoreConflict, IdempotencyConflict, StaleWriter):
                raise
            except StoreError:
                # Applied or not, nobody knows: the same commit again, under the same
                # commit_id, writes nothing if the first one landed.
                if attempt == RETRIES - 1:
                    raise
                time.sleep(0.05 * 2**attempt)

    def prepared(
        self,
        exe: Any,
        step: Step,
        processed_event_id: str | None,
        kind: str,
        before: str,
        what: str,
        epoch: int | None = None,
    ) -> Commit:
        """The :class:`~harel_store.Commit` of one transition, as :meth:`commit` writes it."""
        sends, timers, spawns = step
        emits: list[tuple[Any, Event]] = []
        if sends:
            source = exe.id
            prefix = f"{source}@{exe.version}."
            emits = [
                (target, (prefix + str(k), what, source, data))
                for k, (target, what, data) in enumerate(sends)
            ]
        trace = {"event": kind, "from": before, "to": exe.active_path[-1], "at": self.now}
        return Commit(
            exe, emits, processed_event_id, timers, spawns, trace, f"{self.token}:{what}", epoch
        )

    def commit_many(self, commits: list[Commit]) -> list[StoreError | None]:
        """:meth:`commit` for a batch (no two of one execution): one outcome each, an
        unknown outcome retried as :meth:`commit` retries it. A batch of up to
        :data:`ONE_BY_ONE` goes one ``commit`` at a time: a ``commit_many`` of one costs
        about twice a ``commit`` on PostgreSQL (measured), and the outcomes are the same."""
        outcomes: list[StoreError | None] = []
        if len(commits) <= ONE_BY_ONE:
            for one in commits:
                try:
                    self._write(one)
                except (StoreConflict, IdempotencyConflict, StaleWriter) as exc:
                    outcomes.append(exc)
                else:
                    outcomes.append(None)
                    self.commits += 1
            return outcomes
        for attempt in range(RETRIES):
            try:
                outcomes = self.store.commit_many(commits)
                break
            except (StoreConflict, IdempotencyConflict, StaleWriter):
                raise
            except StoreError:
                if attempt == RETRIES - 1:
                    raise
                time.sleep(0.05 * 2**attempt)
        self.commits += sum(outcome is None for outcome in outcomes)
        return outcomes

    def create(self, exe: Execution, first: tuple[Any, str, Any] | None) -> bool:
        """Store a new execution, with the event that starts it; ``False`` when it is
        already there (created before a crash, or by another relay)."""
        step: Step = ([first], (), ()) if first is not None else NOTHING
        try:
            self.commit(exe, step, None, "created", "", "created")
        except StoreConflict:
            return False
        return True


class Relay(_Writer):
    """A relay of the outbox and the spawn intents and a sweeper of due timers, all by
    claims; it also retires finished orders into the ledger. :meth:`round` does one
    round of each and says how much it did."""

    def __init__(
        self,
        store: Any,
        *,
        lease: float = LEASE,
        limit: int = CLAIM,
        stopped: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(store)
        self.lease = lease
        self.limit = limit
        # Asked between two deliveries: True ends the round there (what it claimed and
        # did not handle goes to others as the leases run out).
        self.stopped = stopped or _never
        driver = store.load(DRIVER)
        if driver is None:
            raise Refused("no run of the demonstration in this store")
        self.n = driver.context["n"]
        self.fates = fates(self.n, driver.context["seed"])
        self.shards = driver.context.get("shards", 1)
        self.phase = driver.context["phase"]
        self.now = driver.context["now"]
        self.delivered = 0
        self.redeliveries_skipped = 0
        self.outbox_crashes = 0
        self.spawns_skipped = 0
        self.spawn_crashes = 0
        self.children_created = 0
        self.dead_letters = 0
        self.timers_fired = 0
        self.retired = 0
        self._lost_acks: list[OutboxEntry] = []
        self._lost_spawn_acks: list[SpawnEntry] = []

    def round(self) -> int:
        store = self.store
        done = self._redeliver()
        outbox = store.claim_outbox(self.limit, lease=self.lease)
        spawns = store.claim_spawns(self.limit, lease=self.lease)
        # Read after the claims: while a relay holds work the clock cannot move, so
        # this is the tick the claimed work belongs to.
        driver = store.load(DRIVER)
        if driver is None:  # the run is over and forgotten
            self.phase = "gone"
            return done
        self.phase = driver.context["phase"]
        self.now = now = driver.context["now"]
        timers = store.claim_due_timers(now, self.limit, lease=self.lease)
        stopped = self.stopped
        for execution_id, path, fire_at in timers:
            if stopped():
                return done
            event = (f"timeout:{path}@{fire_at}", "timeout", None, path)
            self.timers_fired += self.deliver(execution_id, event)
            store.delete_timer(execution_id, path, fire_at)
        for entry in spawns:
            if stopped():
                return done
            self._spawn(entry)
        for entry in outbox:
            if stopped():
                return done
            self._relay(entry)
        return done + len(timers) + len(spawns) + len(outbox)

    def deliver(self, target: Any, event: Event) -> bool:
        """Handle ``event`` on the stored ``target``; ``False`` if it was handled before
        or the target is gone."""
        store = self.store
        event_id = event[0]
        conflicts = 0
        while True:
            exe = store.load(target)
            if exe is None:
                self.dead_letters += 1
                return False
            if store.is_processed(target, event_id):
                self.redeliveries_skipped += 1
                return False
            before = exe.active_path[-1]
            step = self.handlers[exe.definition_id](exe, event)
            try:
                self.commit(exe, step, event_id, event[1], before, event_id)
            except StoreConflict:
                self.conflicts += 1
                conflicts += 1
                if conflicts > 2:
                    time.sleep(random.random() * 0.001 * conflicts)
                continue
            self.delivered += 1
            return True

    def _relay(self, entry: OutboxEntry) -> None:
        seq, target, event = entry
        if target is None:
            if event[1] == "order_finished":
                self.retire(event)
            # "tick" and "stop" only wake relays up
        else:
            self.deliver(target, event)
            if seq % REDELIVER_EVERY == 0:
                self._lost_acks.append(entry)  # the ack is lost: delivered again next round
                self.outbox_crashes += 1
                return
        self.store.ack_outbox(seq)

    def _spawn(self, entry: SpawnEntry) -> None:
        seq, parent_id, child_id, root_path, context = entry
        if self.store.load(child_id) is not None:
            self.spawns_skipped += 1
        elif self.create(
            new_child(parent_id, child_id, root_path, context), (child_id, "start", None)
        ):
            self.children_created += 1
            if seq % RESPAWN_EVERY == 0:
                self._lost_spawn_acks.append(entry)
                self.spawn_crashes += 1
                return
        else:
            self.spawns_skipped += 1
        self.store.ack_spawn(seq)

    def _redeliver(self) -> int:
        """What lost its ack last round: delivered (or spawned) again, then acked."""
        store = self.store
        lost, spawns = self._lost_acks, self._lost_spawn_acks
        if not lost and not spawns:
            return 0
        self._lost_acks, self._lost_spawn_acks = [], []
        for seq, target, event in lost:
            self.deliver(target, event)
            store.ack_outbox(seq)
        for seq, _, child_id, _, _ in spawns:
            if store.load(child_id) is not None:
                self.spawns_skipped += 1
            store.ack_spawn(seq)
        return len(lost) + len(spawns)

    def retire(self, event: Event) -> None:
        """Check a finished order and its children and count it in the ledger, once:
        the ledger's commit marks the announcement processed. The coordinator forgets
        them at the end of the tick."""
        store = self.store
        event_id, order_id = event[0], event[2]
        ledger_id = self.ledger_of(order_id)
        tally: dict[str, Any] | None = None
        while True:
            ledger = store.load(ledger_id)
            if ledger is None:
                raise StoreError(f"{ledger_id} is missing from the store")
            if store.is_processed(ledger_id, event_id):
                self.redeliveries_skipped += 1
                break
            if tally is None:
                tally = self._tally(order_id)
            context = ledger.context
            context["finished"] += 1
            context["retired"].append(order_id)
            for key, value in tally.items():
                if key == "problems":
                    for text in value:
                        add_problem(context["problems"], text)
                else:
                    context[key] += value
            try:
                self.commit(ledger, NOTHING, event_id, "order_finished", "open", event_id)
            except StoreConflict:
                self.conflicts += 1
                continue
            self.retired += 1
            break

    def ledger_of(self, order_id: str) -> str:
        """The ledger shard that retires ``order_id``."""
        return shard_id(LEDGER, order_index(order_id) % self.shards, self.shards)

    def _tally(self, order_id: str) -> dict[str, Any]:
        store = self.store
        order = store.load(order_id)
        if order is None:
            return {"problems": [f"{order_id}: announced finished, but not stored"]}
        problems: list[str] = []
        planned = planned_status(self.fates[order_index(order_id)])
        status = order.status
        if status != planned:
            problems.append(f"{order_id}: ended {status} ({order.outcome}), planned {planned}")
        steps = store.read_trace(order_id)
        if not steps or steps[-1]["index"] != order.version - 1 or steps[-1]["to"] != planned:
            problems.append(f"{order_id}: trace does not end with commit {order.version - 1}")
        if planned == "completed" and len(order.children) != 2:
            problems.append(f"{order_id}: {len(order.children)} children joined, not 2")
        joined = missed = 0
        for child_id, outcome in order.children.items():
            child = store.load(child_id)
            if (
                outcome != "done"
                or child is None
                or child.parent_id != order_id
                or child.status != "completed"
            ):
                problems.append(f"{child_id}: missing or unfinished region child")
            else:
                joined += 1
                missed += child.context.get("missed", 0)
        return {
            "completed": status == "completed",
            "timed_out": status == "timed_out",
            "children": joined,
            "missed_pickups": missed,
            "problems": problems,
        }

    def report(self, worker: int, elapsed: float) -> WorkerReport:
        return WorkerReport(
            worker=worker,
            pid=os.getpid(),
            commits=self.commits,
            events_delivered=self.delivered,
            timers_fired=self.timers_fired,
            children_created=self.children_created,
            orders_retired=self.retired,
            conflicts=self.conflicts,
            elapsed=elapsed,
            commits_per_s=self.commits / elapsed if elapsed > 0 else 0.0,
            error="",
            lost=False,
        )

    def counts(self) -> dict[str, int]:
        """The counters the end-of-run checks add up over every relay of the run."""
        return {
            "redeliveries_skipped": self.redeliveries_skipped,
            "outbox_crashes": self.outbox_crashes,
            "spawns_skipped": self.spawns_skipped,
            "spawn_crashes": self.spawn_crashes,
            "dead_letters": self.dead_letters,
        }
