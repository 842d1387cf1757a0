"""The demonstration behind ``python -m harel_store``: many orders driven through a small
statechart workflow, using only the store's public API.

There is no engine in this package, so the workflow is a hand-rolled state machine. What
it asks of the store is what an engine asks:

- every transition is one ``commit``: the advanced execution, the events it emits (to
  another execution, to itself, or untargeted), the dedupe mark of the event it handled,
  the timers of the states it leaves (cancel) and enters (schedule), the region children
  of an AND-state it enters (spawns), and a trace step;
- a relay drains ``pending_outbox()``, skips redeliveries with ``is_processed``, delivers
  and acks; it "crashes" before some acks, so redeliveries really happen;
- a spawn relay drains ``pending_spawns()``, creates each child unless ``load`` already
  returns one, and acks; it too "crashes" before some acks;
- a sweeper delivers ``due_timers(now)`` on a simulated clock as timeout events, then
  ``delete_timer``s them.

The workflow::

    order     new --place--> reserving --reserved--> paying --paid--> fulfilling --join--> completed
              paying --retry--> paying          (re-entry: the payment timer is re-armed)
              paying --timeout--> timed_out     (the reservation is released)
    inventory one shared execution: answers reserve, counts release
    payment   one shared execution: batches charges and settles them on its own timer;
              a "flaky" card is asked to retry once, a "lost" charge is never answered
    packing   start --> picking --picked--> done                        (region child)
    shipping  start --> awaiting_pickup --timeout--> done               (region child)
              a missed pickup re-arms the timer from inside the sweep; delete_timer's
              guard keeps the re-armed timer

``fulfilling`` is an AND-state: entering it spawns the two region children with a context
and records them in the order's ``children``; each child reports ``region_done`` to the
order, which completes once both have. A finished order announces itself with an
untargeted event; the host then checks it and its children and ``forget``s them, as a
long-running host must, so the store holds only the executions in flight. The fate of
each order (card, missed pickup) is drawn from a seeded generator, so a run is
deterministic and checks itself.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from time import perf_counter
from typing import Any, Final, NamedTuple, Protocol, TypedDict

from ._protocols import ExecutionStore
from ._records import Execution, TimerOp

TICK = 1.0  # simulated seconds per round of sweep, admission and relaying
ORDERS_PER_TICK = 250
RESERVE_TIMEOUT = 10.0
PAY_TIMEOUT = 30.0
FULFIL_TIMEOUT = 60.0
SETTLE_EVERY = 2.0
PICKUP_DELAY = 1.0
LOST_CARDS = 0.05  # charges the payment service never answers: those orders time out
FLAKY_CARDS = 0.10  # charges answered "retry" once
MISSED_PICKUPS = 0.10  # shipments whose first pickup is missed
REDELIVER_EVERY = 97  # the relay "crashes" before acking outbox seqs divisible by this
RESPAWN_EVERY = 13  # and the spawn relay before acking spawn seqs divisible by this
EPOCH = 1_700_000_000.0  # the simulated clock's start, in epoch seconds

INVENTORY = "inventory"
PAYMENT = "payment"

SCHEDULE: Final = "schedule"
T_RESERVING = "order/reserving"
T_PAYING = "order/paying"
T_FULFILLING = "order/fulfilling"
T_SETTLE = "payment/settle"
T_PICKUP = "shipping/awaiting_pickup"
CANCEL_RESERVING = TimerOp("cancel", T_RESERVING)
CANCEL_PAYING = TimerOp("cancel", T_PAYING)
CANCEL_FULFILLING = TimerOp("cancel", T_FULFILLING)

ORDER_NEW = ("order", "new")
ORDER_RESERVING = ("order", "reserving")
ORDER_PAYING = ("order", "paying")
ORDER_FULFILLING = ("order", "fulfilling")
ORDER_COMPLETED = ("order", "completed")
ORDER_TIMED_OUT = ("order", "timed_out")
PACKING_PICKING = ("packing", "picking")
SHIPPING_AWAITING = ("shipping", "awaiting_pickup")


class Event(NamedTuple):
    """What travels through the outbox: ``id`` is the dedupe key, ``source`` the emitter."""

    id: str
    kind: str
    source: Hashable | None
    data: Any = None


Send = tuple[Hashable | None, str, Any]  # (target_id, kind, data): an event to emit
Spawn = tuple[Hashable, str, dict[str, Any]]
Step = tuple[Sequence[Send], tuple[TimerOp, ...], tuple[Spawn, ...]]  # what a transition does
NOTHING: Step = ((), (), ())


class DemoStore(ExecutionStore, Protocol):
    """A synchronous store with the extras the demonstration uses."""

    @property
    def trace_max(self) -> int | None: ...
    def forget(self, execution_id: Hashable) -> None: ...
    def stats(self) -> dict[str, int]: ...


class DemoResult(TypedDict):
    """What :func:`run` reports. ``executions`` counts every execution created: orders,
    their region children and the two shared services."""

    orders: int
    completed: int
    timed_out: int
    executions: int
    commits: int
    events_delivered: int
    redeliveries_skipped: int
    duplicate_spawns_skipped: int
    timers_fired: int
    notifications: int
    ticks: int
    peak_live_executions: int
    elapsed: float
    executions_per_s: float
    commits_per_s: float
    stats: dict[str, int]
    stats_after_forget: dict[str, int]
    problems: list[str]


MAX_PROBLEMS = 50  # a broken store fails every order alike: the first few say enough


class _Workflow:
    """The state machines, the relays and the sweeper, around one store."""

    def __init__(self, store: DemoStore) -> None:
        self.store = store
        self.now = EPOCH
        self.handlers: dict[str, Callable[[Any, Event], Step]] = {
            "order": self._order,
            INVENTORY: self._inventory,
            PAYMENT: self._payment,
            "packing": self._packing,
            "shipping": self._shipping,
        }
        self.finished = 0
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
        self.settlements = 0
        self.missed_pickups = 0
        self._crashed_seqs: set[int] = set()
        self._crashed_spawns: set[int] = set()
        self.in_flight: dict[Hashable, Execution] = {}  # orders created, not yet retired
        self.finished_ids: list[Hashable] = []  # announced by "order_finished"
        self.completed = 0
        self.timed_out = 0
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
        emits: list[tuple[Hashable | None, Event]] = []
        if sends:
            source = exe.id
            prefix = f"{source}@{exe.version}."
            emits = [
                (target, Event(prefix + str(k), what, source, data))
                for k, (target, what, data) in enumerate(sends)
            ]
        trace = {"event": kind, "from": before, "to": exe.active_path[-1], "at": self.now}
        self.store.commit(exe, emits, processed_event_id, timers, spawns, trace)
        self.commits += 1

    def create(self, exe: Execution, first: Send) -> None:
        """Store a new execution together with the event that starts it."""
        self.commit(exe, ([first], (), ()), None, "created", "")

    def deliver(self, target: Hashable, event: Event) -> None:
        store = self.store
        exe = store.load(target)
        if exe is None:
            self.dead_letters += 1
            return
        if store.is_processed(target, event.id):
            self.redeliveries_skipped += 1
            return
        before = exe.active_path[-1]
        step = self.handlers[exe.definition_id](exe, event)
        self.commit(exe, step, event.id, event.kind, before)
        self.delivered += 1

    def relay_outbox(self) -> int:
        store = self.store
        entries = store.pending_outbox()
        crashed = self._crashed_seqs
        for seq, target, event in entries:
            if target is None:
                self.notifications += 1
                if event.kind == "order_finished":
                    self.finished_ids.append(event.source)
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
            if store.load(child_id) is not None:
                self.spawns_skipped += 1  # created before a lost ack: create once only
                crashed.discard(seq)
            else:
                child = Execution(
                    id=child_id,
                    definition_id=root_path,
                    active_path=(root_path, "start"),
                    context=context,
                    parent_id=parent_id,
                )
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
            self.deliver(execution_id, Event(f"timeout:{path}@{fire_at}", "timeout", None, path))
            store.delete_timer(execution_id, path, fire_at)

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)
        elif len(self.problems) == MAX_PROBLEMS:
            self.problems.append("... and more")

    def retire(self) -> None:
        """Check each order announced finished, with its children, then forget them.
        The checks are timed apart, so that the run's throughput leaves them out."""
        store = self.store
        started = perf_counter()
        done: list[Hashable] = []
        for order_id in self.finished_ids:
            order = self.in_flight.pop(order_id, None)
            if order is None or store.load(order_id) is not order:
                self.problem(f"{order_id}: load did not return the very object committed")
                continue
            planned = "timed_out" if order.context["card"] == "lost" else "completed"
            if order.status != planned:
                self.problem(
                    f"{order_id}: ended {order.status} ({order.outcome}), planned {planned}"
                )
            if order.status == "completed":
                self.completed += 1
            elif order.status == "timed_out":
                self.timed_out += 1
            steps = store.read_trace(order_id)
            if not steps or steps[-1]["index"] != order.version - 1 or steps[-1]["to"] != planned:
                self.problem(f"{order_id}: trace does not end with commit {order.version - 1}")
            if planned == "completed" and len(order.children) != 2:
                self.problem(f"{order_id}: {len(order.children)} children joined, not 2")
            for child_id, outcome in order.children.items():
                child = store.load(child_id)
                if (
                    outcome != "done"
                    or child is None
                    or child.parent_id != order_id
                    or child.status != "completed"
                ):
                    self.problem(f"{child_id}: missing or unfinished region child")
                done.append(child_id)
            done.append(order_id)
        self.finished_ids.clear()
        self.check_time += perf_counter() - started
        for execution_id in done:
            store.forget(execution_id)

    # -- the state machines ----------------------------------------------------------

    def _order(self, exe: Execution, ev: Event) -> Step:
        state = exe.active_path[1]
        kind = ev.kind
        now = self.now
        if state == "new":
            if kind == "place":
                exe.active_path = ORDER_RESERVING
                timer = TimerOp(SCHEDULE, T_RESERVING, now + RESERVE_TIMEOUT)
                return [(INVENTORY, "reserve", exe.context["items"])], (timer,), ()
        elif state == "reserving":
            if kind == "reserved":
                exe.active_path = ORDER_PAYING
                timer = TimerOp(SCHEDULE, T_PAYING, now + PAY_TIMEOUT)
                return (
                    [(PAYMENT, "charge", (exe.context["card"], 1))],
                    (CANCEL_RESERVING, timer),
                    (),
                )
            if kind == "timeout" and ev.data == T_RESERVING:
                return self._give_up(exe, "reservation timeout")
        elif state == "paying":
            if kind == "paid":
                exe.active_path = ORDER_FULFILLING
                order_id = exe.id
                context = {"order": order_id, "items": exe.context["items"]}
                packing = f"{order_id}/packing"
                shipping = f"{order_id}/shipping"
                exe.children = {packing: None, shipping: None}
                timer = TimerOp(SCHEDULE, T_FULFILLING, now + FULFIL_TIMEOUT)
                spawns = (
                    (packing, "packing", context),
                    (shipping, "shipping", {**context, "misses": exe.context["misses"]}),
                )
                return [], (CANCEL_PAYING, timer), spawns
            if kind == "retry":
                # Re-entering ``paying`` re-arms its timer: same path, so it replaces.
                attempt = ev.data + 1
                exe.context["attempts"] = attempt
                timer = TimerOp(SCHEDULE, T_PAYING, now + PAY_TIMEOUT)
                return [(PAYMENT, "charge", (exe.context["card"], attempt))], (timer,), ()
            if kind == "timeout" and ev.data == T_PAYING:
                return self._give_up(exe, "payment timeout")
        elif state == "fulfilling":
            if kind == "region_done":
                children = exe.children
                children[ev.source] = "done"
                if all(children.values()):  # the join
                    exe.active_path = ORDER_COMPLETED
                    exe.status = "completed"
                    exe.outcome = "delivered"
                    self.finished += 1
                    return [(None, "order_finished", "completed")], (CANCEL_FULFILLING,), ()
                return NOTHING
            if kind == "timeout" and ev.data == T_FULFILLING:
                return self._give_up(exe, "fulfilment timeout")
        return NOTHING  # not handled in this state: marked processed all the same

    def _give_up(self, exe: Execution, why: str) -> Step:
        exe.active_path = ORDER_TIMED_OUT
        exe.status = "timed_out"
        exe.outcome = why
        self.finished += 1
        sends: list[Send] = [(None, "order_finished", "timed_out")]
        if why != "reservation timeout":
            sends.append((INVENTORY, "release", exe.context["items"]))
        return sends, (), ()  # the timer that fired is deleted by the sweeper

    def _inventory(self, exe: Execution, ev: Event) -> Step:
        context = exe.context
        if ev.kind == "reserve":
            context["reservations"] += 1
            context["reserved_items"] += ev.data
            return [(ev.source, "reserved", None)], (), ()
        if ev.kind == "release":
            context["releases"] += 1
            context["reserved_items"] -= ev.data
        return NOTHING

    def _payment(self, exe: Execution, ev: Event) -> Step:
        context = exe.context
        if ev.kind == "charge":
            card, attempt = ev.data
            if card == "lost":
                context["lost"] += 1
                return NOTHING
            context["pending"].append((ev.source, card, attempt))
            if exe.active_path[1] == "batching":
                return NOTHING
            exe.active_path = (PAYMENT, "batching")
            return [], (TimerOp(SCHEDULE, T_SETTLE, self.now + SETTLE_EVERY),), ()
        if ev.kind == "timeout" and ev.data == T_SETTLE:
            sends: list[Send] = [
                (order_id, "retry" if card == "flaky" and attempt == 1 else "paid", attempt)
                for order_id, card, attempt in context["pending"]
            ]
            context["settled"] += len(sends)
            context["pending"] = []
            exe.active_path = (PAYMENT, "idle")
            self.settlements += 1
            return sends, (), ()
        return NOTHING

    def _packing(self, exe: Execution, ev: Event) -> Step:
        state = exe.active_path[1]
        if state == "start" and ev.kind == "start":
            exe.active_path = PACKING_PICKING
            return [(exe.id, "picked", None)], (), ()
        if state == "picking" and ev.kind == "picked":
            return self._region_done(exe)
        return NOTHING

    def _shipping(self, exe: Execution, ev: Event) -> Step:
        state = exe.active_path[1]
        if state == "start" and ev.kind == "start":
            exe.active_path = SHIPPING_AWAITING
            return [], (TimerOp(SCHEDULE, T_PICKUP, self.now + PICKUP_DELAY),), ()
        if state == "awaiting_pickup" and ev.kind == "timeout" and ev.data == T_PICKUP:
            context = exe.context
            if context["misses"]:
                # Re-armed while the sweep that fired it is still running: the sweep's
                # delete_timer(..., old fire_at) must leave this new timer alone.
                context["misses"] -= 1
                self.missed_pickups += 1
                return [], (TimerOp(SCHEDULE, T_PICKUP, self.now + PICKUP_DELAY),), ()
            return self._region_done(exe)
        return NOTHING

    def _region_done(self, exe: Execution) -> Step:
        exe.active_path = (exe.active_path[0], "done")
        exe.status = "completed"
        return [(exe.parent_id, "region_done", None)], (), ()


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
    store = store_factory()
    flow = _Workflow(store)
    rng = random.Random(seed)
    planned_lost = planned_flaky = planned_misses = 0
    max_ticks = n // ORDERS_PER_TICK + 1 + int((PAY_TIMEOUT + FULFIL_TIMEOUT) / TICK) + 10
    created = ticks = peak = 0

    start = perf_counter()
    inventory = Execution(
        id=INVENTORY,
        definition_id=INVENTORY,
        active_path=(INVENTORY, "open"),
        context={"reservations": 0, "releases": 0, "reserved_items": 0},
    )
    payment = Execution(
        id=PAYMENT,
        definition_id=PAYMENT,
        active_path=(PAYMENT, "idle"),
        context={"pending": [], "settled": 0, "lost": 0},
    )
    flow.commit(inventory, NOTHING, None, "created", "")
    flow.commit(payment, NOTHING, None, "created", "")
    while (created < n or flow.in_flight) and ticks < max_ticks:
        ticks += 1
        flow.now += TICK
        flow.sweep()
        for i in range(created, min(n, created + ORDERS_PER_TICK)):
            draw = rng.random()
            if draw < LOST_CARDS:
                card = "lost"
                planned_lost += 1
            elif draw < LOST_CARDS + FLAKY_CARDS:
                card = "flaky"
                planned_flaky += 1
            else:
                card = "ok"
            misses = 1 if rng.random() < MISSED_PICKUPS else 0
            if misses and card != "lost":
                planned_misses += 1
            order_id = f"order-{i}"
            order = Execution(
                id=order_id,
                definition_id="order",
                active_path=ORDER_NEW,
                context={"items": 1 + i % 5, "card": card, "misses": misses, "attempts": 1},
            )
            flow.in_flight[order_id] = order
            flow.create(order, (order_id, "place", None))
            created += 1
        flow.relay()
        peak = max(peak, store.stats()["executions"])
        flow.retire()
        if progress is not None:
            progress(flow.finished, n)
    elapsed = perf_counter() - start - flow.check_time

    problems = flow.problems
    expect = _expectation(problems)
    if flow.in_flight:
        problems.append(f"gave up after {ticks} ticks with {len(flow.in_flight)} orders in flight")
    expect("orders completed", flow.completed, n - planned_lost)
    expect("orders timed out", flow.timed_out, planned_lost)
    expect("reservations", inventory.context["reservations"], n)
    expect("releases", inventory.context["releases"], planned_lost)
    expect("charges lost", payment.context["lost"], planned_lost)
    expect("charges settled", payment.context["settled"], n - planned_lost + planned_flaky)
    expect("charges pending", payment.context["pending"], [])
    expect("region children", flow.children_created, 2 * (n - planned_lost))
    expect("redeliveries skipped", flow.redeliveries_skipped, flow.outbox_crashes)
    expect("duplicate spawns skipped", flow.spawns_skipped, flow.spawn_crashes)
    expect("dead letters", flow.dead_letters, 0)
    expect("order notifications", flow.notifications, n)
    expect("missed pickups", flow.missed_pickups, planned_misses)
    expect(
        "timers fired",
        flow.timers_fired,
        planned_lost + (n - planned_lost) + planned_misses + flow.settlements,
    )

    # What is left: the two services, holding the marks of every event they handled
    # and the last trace_max steps of each of their commits (all commits trace).
    stats = store.stats()
    trace_max = store.trace_max or None
    services = (inventory, payment)
    expect(
        "store stats at the end",
        stats,
        {
            "executions": 2,
            "outbox": 0,
            "spawns": 0,
            "timers": 0,
            "processed": sum(s.version - 1 for s in services),
            "traces": 2,
            "trace_steps": sum(min(s.version, trace_max or s.version) for s in services),
        },
    )
    for service in services:
        store.forget(service.id)
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
        executions_per_s=executions / elapsed if elapsed > 0 else 0.0,
        commits_per_s=flow.commits / elapsed if elapsed > 0 else 0.0,
        stats=stats,
        stats_after_forget=stats_after,
        problems=problems,
    )


def _expectation(problems: list[str]) -> Callable[[str, object, object], None]:
    def expect(what: str, got: object, want: object) -> None:
        if got != want:
            problems.append(f"{what}: got {got!r}, expected {want!r}")

    return expect
