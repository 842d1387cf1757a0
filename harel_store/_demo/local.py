"""The demonstration in one process on one store object, with the relays of the
specification: :func:`run`, what ``python -m harel_store`` runs on a memory store, and
the workload the benchmarks time (``demo_orders_*``).

It asks of the store only what the specification has (``load``, ``commit`` without the
keyword extras, ``is_processed``, ``pending_*`` and acks, ``due_timers`` and
``delete_timer``, ``read_trace``) and ``stats`` and ``forget``, so it runs on any store,
the specification's port included. It holds no execution between two calls of the
store: every delivery loads its target and commits the object it loaded.

- a relay drains ``pending_outbox()``, skips redeliveries with ``is_processed``, delivers
  and acks; it "crashes" before some acks, so redeliveries really happen;
- a spawn relay drains ``pending_spawns()``, creates each child unless ``load`` already
  returns one, and acks; it too "crashes" before some acks;
- a sweeper delivers ``due_timers(now)`` on a simulated clock as timeout events, then
  ``delete_timer``s them.

A finished order's ``order_finished`` announcement makes the host check it and its
children and ``forget`` them, as a long-running host must, so the store holds only the
executions in flight. The fate of each order is drawn from a seeded generator, so a run
is deterministic and checks itself.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

from .._records import Execution
from .result import DemoResult, DemoStore, store_checks
from .workflow import (
    FULFIL_TIMEOUT,
    INVENTORY,
    NOTHING,
    ORDERS_PER_TICK,
    PAY_TIMEOUT,
    PAYMENT,
    REDELIVER_EVERY,
    RESPAWN_EVERY,
    TICK,
    Event,
    Step,
    Workflow,
    add_problem,
    expectation,
    fates,
    new_child,
    new_order,
    new_services,
    order_index,
    plan,
    planned_status,
)


class _Host(Workflow):
    """The relays, the sweeper and the checks, around one store."""

    def __init__(self, store: DemoStore, drawn: list[tuple[str, int]]) -> None:
        super().__init__()
        self.store = store
        self.fates = drawn
        self.identity = getattr(store, "preserves_identity", True)
        self.commits = 0
        self.delivered = 0
        self.redeliveries_skipped = 0
        self.outbox_crashes = 0
        self.spawns_skipped = 0
        self.spawn_crashes = 0
        self.children_created = 0
        self.dead_letters = 0
        self.notifications = 0
        self.timers_fired = 0
        self._crashed_seqs: set[int] = set()
        self._crashed_spawns: set[int] = set()
        self.in_flight: dict[str, Execution] = {}  # orders created, not yet retired
        self.finished_ids: list[str] = []  # announced by "order_finished"
        self.completed = 0
        self.timed_out = 0
        self.children_joined = 0
        self.missed_pickups = 0
        self.problems: list[str] = []
        self.check_time = 0.0

    # -- the "engine": commit a step, deliver, relay, sweep ---------------------------

    def commit(
        self,
        exe: Any,
        step: Step,
        processed_event_id: str | None,
        kind: str,
        before: str,
    ) -> None:
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
        self.store.commit(exe, emits, processed_event_id, timers, spawns, trace)
        self.commits += 1

    def create(self, exe: Execution, first: tuple[Any, str, Any]) -> None:
        """Store a new execution together with the event that starts it."""
        self.commit(exe, ([first], (), ()), None, "created", "")

    def deliver(self, target: Any, event: Event) -> None:
        store = self.store
        exe = store.load(target)
        if exe is None:
            self.dead_letters += 1
            return
        if store.is_processed(target, event[0]):
            self.redeliveries_skipped += 1
            return
        before = exe.active_path[-1]
        step = self.handlers[exe.definition_id](exe, event)
        self.commit(exe, step, event[0], event[1], before)
        self.delivered += 1

    def relay_outbox(self) -> int:
        store = self.store
        entries = store.pending_outbox()
        crashed = self._crashed_seqs
        for seq, target, event in entries:
            if target is None:
                self.notifications += 1
                if event[1] == "order_finished":
                    self.finished_ids.append(event[2])
            else:
                self.deliver(target, event)
                if seq in crashed:
                    crashed.remove(seq)
                elif seq % REDELIVER_EVERY == 0:
                    crashed.add(seq)  # delivered, but the ack is lost: redelivered next drain
                    self.outbox_crashes += 1
                    continue
            store.ack_outbox(seq)
        return len(entries)

    def relay_spawns(self) -> int:
        store = self.store
        entries = store.pending_spawns()
        crashed = self._crashed_spawns
        for seq, parent_id, child_id, root_path, context in entries:
            if store.load(str(child_id)) is not None:
                self.spawns_skipped += 1  # created before a lost ack: create once only
                crashed.discard(seq)
            else:
                child = new_child(parent_id, child_id, root_path, context)
                self.create(child, (child_id, "start", None))
                self.children_created += 1
                if seq % RESPAWN_EVERY == 0:
                    crashed.add(seq)
                    self.spawn_crashes += 1
                    continue
            store.ack_spawn(seq)
        return len(entries)

    def relay(self) -> None:
        """Drain both relays until neither has anything left."""
        while self.relay_outbox() + self.relay_spawns():
            pass

    def sweep(self) -> None:
        store = self.store
        for execution_id, path, fire_at in store.due_timers(self.now):
            self.timers_fired += 1
            self.deliver(execution_id, (f"timeout:{path}@{fire_at}", "timeout", None, path))
            store.delete_timer(execution_id, path, fire_at)

    def retire(self) -> None:
        """Check each order announced finished, with its children, then forget them.
        The checks are timed apart, so that the run's throughput leaves them out."""
        store = self.store
        started = perf_counter()
        problems = self.problems
        done: list[str] = []
        for order_id in self.finished_ids:
            created = self.in_flight.pop(order_id, None)
            order = store.load(order_id)
            if created is None or order is None:
                add_problem(problems, f"{order_id}: finished twice, or never created")
                continue
            if self.identity and order is not created:
                add_problem(problems, f"{order_id}: load did not return the very object committed")
            planned = planned_status(self.fates[order_index(order_id)])
            if order.status != planned:
                add_problem(
                    problems,
                    f"{order_id}: ended {order.status} ({order.outcome}), planned {planned}",
                )
            if order.status == "completed":
                self.completed += 1
            elif order.status == "timed_out":
                self.timed_out += 1
            steps = store.read_trace(order_id)
            if not steps or steps[-1]["index"] != order.version - 1 or steps[-1]["to"] != planned:
                add_problem(
                    problems, f"{order_id}: trace does not end with commit {order.version - 1}"
                )
            if planned == "completed" and len(order.children) != 2:
                add_problem(problems, f"{order_id}: {len(order.children)} children joined, not 2")
            for child_id, outcome in order.children.items():
                child = store.load(child_id)
                if (
                    outcome != "done"
                    or child is None
                    or child.parent_id != order_id
                    or child.status != "completed"
                ):
                    add_problem(problems, f"{child_id}: missing or unfinished region child")
                else:
                    self.children_joined += 1
                    self.missed_pickups += child.context.get("missed", 0)
                done.append(child_id)
            done.append(order_id)
        self.finished_ids.clear()
        self.check_time += perf_counter() - started
        for execution_id in done:
            store.forget(execution_id)


def run(
    n: int,
    store_factory: Callable[[], DemoStore],
    *,
    progress: Callable[[int, int], None] | None = None,
    seed: int = 1,
) -> DemoResult:
    """Drive ``n`` orders through the workflow on a store made by ``store_factory`` and
    check the outcome.

    Finished orders and their children are checked and forgotten as the run goes; the
    two shared services are forgotten at the end. ``progress(finished_orders, n)`` is
    called once per simulated tick. The result's ``problems`` lists the checks that
    failed; it is empty on success. ``elapsed`` and the throughputs cover the workflow,
    forgetting included, and leave the checks out.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    drawn = fates(n, seed)
    store = store_factory()
    flow = _Host(store, drawn)
    max_ticks = n // ORDERS_PER_TICK + 1 + int((PAY_TIMEOUT + FULFIL_TIMEOUT) / TICK) + 10
    created = ticks = peak = 0

    start = perf_counter()
    inventory, payment = new_services()
    flow.commit(inventory, NOTHING, None, "created", "")
    flow.commit(payment, NOTHING, None, "created", "")
    in_flight = flow.in_flight
    while (created < n or in_flight) and ticks < max_ticks:
        ticks += 1
        flow.now += TICK
        flow.sweep()
        for i in range(created, min(n, created + ORDERS_PER_TICK)):
            order = new_order(i, drawn[i])
            in_flight[order.id] = order  # type: ignore[index]
            flow.create(order, (order.id, "place", None))
            created += 1
        flow.relay()
        peak = max(peak, store.stats()["executions"])
        flow.retire()
        if progress is not None:
            progress(flow.notifications, n)
    elapsed = perf_counter() - start - flow.check_time

    problems = flow.problems
    expect = expectation(problems)
    if in_flight:
        problems.append(f"gave up after {ticks} ticks with {len(in_flight)} orders in flight")
    planned = plan(drawn)
    services = [store.load(INVENTORY), store.load(PAYMENT)]
    store_checks(
        expect,
        n,
        planned,
        services,
        completed=flow.completed,
        timed_out=flow.timed_out,
        children=flow.children_joined,
        missed_pickups=flow.missed_pickups,
        notifications=flow.notifications,
    )
    expect("region children created", flow.children_created, flow.children_joined)
    expect("redeliveries skipped", flow.redeliveries_skipped, flow.outbox_crashes)
    expect("duplicate spawns skipped", flow.spawns_skipped, flow.spawn_crashes)
    expect("dead letters", flow.dead_letters, 0)
    if services[1] is not None:
        expect(
            "timers fired",
            flow.timers_fired,
            n + planned.misses + services[1].context["settlements"],
        )

    # What is left: the two services, holding the marks of every event they handled
    # and the last trace_max steps of each of their commits (all commits trace).
    stats = store.stats()
    trace_max = store.trace_max or None
    live = [s for s in services if s is not None]
    expect(
        "store stats at the end",
        stats,
        {
            "executions": 2,
            "outbox": 0,
            "spawns": 0,
            "timers": 0,
            "processed": sum(s.version - 1 for s in live),
            "traces": 2,
            "trace_steps": sum(min(s.version, trace_max or s.version) for s in live),
        },
    )
    for service in (INVENTORY, PAYMENT):
        store.forget(service)
    stats_after = store.stats()
    expect("store stats after forget", stats_after, dict.fromkeys(stats, 0))

    executions = 2 + created + flow.children_created
    return DemoResult(
        orders=n,
        completed=flow.completed,
        timed_out=flow.timed_out,
        executions=executions,
        commits=flow.commits,
        events_delivered=flow.delivered,
        redeliveries_skipped=flow.redeliveries_skipped,
        duplicate_spawns_skipped=flow.spawns_skipped,
        timers_fired=flow.timers_fired,
        notifications=flow.notifications,
        ticks=ticks,
        peak_live_executions=peak,
        elapsed=elapsed,
        orders_per_s=flow.notifications / elapsed if elapsed > 0 else 0.0,
        executions_per_s=executions / elapsed if elapsed > 0 else 0.0,
        commits_per_s=flow.commits / elapsed if elapsed > 0 else 0.0,
        stats=stats,
        stats_after_forget=stats_after,
        problems=problems,
    )
