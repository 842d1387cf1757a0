"""The order workflow: its state machines, the fates the seed gives the orders, and what
one transition hands a store.

There is no engine in this package, so the workflow is a hand-rolled state machine::

    order     new --place--> reserving --reserved--> paying --paid--> fulfilling --join--> completed
              paying --retry--> paying          (re-entry: the payment timer is re-armed)
              paying --timeout--> timed_out     (the reservation is released)
    inventory a shared execution: answers reserve, counts release
    payment   a shared execution: batches charges and settles them on its own timer;
              a "flaky" card is asked to retry once, a "lost" charge is never answered
    packing   start --> picking --picked--> done                        (region child)
    shipping  start --> awaiting_pickup --timeout--> done               (region child)
              a missed pickup re-arms the timer from inside the sweep; delete_timer's
              guard keeps the re-armed timer

``fulfilling`` is an AND-state: entering it spawns the two region children with a context
and records them in the order's ``children``; each child reports ``region_done`` to the
order, which completes once both have. A finished order announces itself with an
untargeted ``order_finished`` event. Every transition is one commit: the advanced
execution, the events it emits, the dedupe mark of the event it handled, the timers of
the states it leaves (cancel) and enters (schedule), the spawns, and a trace step.

A handler changes only the execution it is handed and returns what the transition does;
it keeps no count of its own, so a host may run it again on a reloaded copy after a
conflict. What the checks need to count lives in the executions (the payment service's
``settlements``, a shipping child's ``missed`` pickups).

The services may be sharded (:attr:`Workflow.shards`): order ``i`` then talks to
``inventory/k`` and ``payment/k`` with ``k = i % shards``, as an engine partitions a hot
aggregate. A shared execution takes one transition per event it handles, and no batch
holds two transitions of one execution, so one shared execution serialises every order
through it; ``shards`` of them take ``shards`` transitions per batch. With one shard
(the default) the ids are the plain ``inventory`` and ``payment``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

from .._records import Execution, TimerOp

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
REDELIVER_EVERY = 97  # a relay "crashes" before acking outbox seqs divisible by this
RESPAWN_EVERY = 13  # and a spawn relay before acking spawn seqs divisible by this
EPOCH = 1_700_000_000.0  # the simulated clock's start, in epoch seconds
MAX_PROBLEMS = 50  # a broken store fails every order alike: the first few say enough

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

# What travels through the outbox: (id, kind, source, data), a plain tuple so that the
# durable stores' JSON codec carries it as it is. ``id`` is the dedupe key, ``source``
# the emitter (None for a timeout).
Event = tuple[str, str, Any, Any]
Send = tuple[Any, str, Any]  # (target_id, kind, data): an event to emit
Spawn = tuple[str, str, dict[str, Any]]
Step = tuple[Sequence[Send], tuple[TimerOp, ...], tuple[Spawn, ...]]  # what a transition does
NOTHING: Step = ((), (), ())


class Plan(NamedTuple):
    """How many orders the seed gave each fate."""

    lost: int  # cards never answered: the order times out
    flaky: int  # cards answered "retry" once
    misses: int  # shipments (of orders that complete) whose first pickup is missed


def fates(n: int, seed: int) -> list[tuple[str, int]]:
    """``(card, misses)`` of orders ``0`` to ``n - 1``, drawn from ``seed``: every process
    of a run, and a resumed run, draws the same."""
    rng = random.Random(seed)
    draw = rng.random
    out = []
    for _ in range(n):
        x = draw()
        card = "lost" if x < LOST_CARDS else "flaky" if x < LOST_CARDS + FLAKY_CARDS else "ok"
        out.append((card, 1 if draw() < MISSED_PICKUPS else 0))
    return out


def plan(drawn: Sequence[tuple[str, int]]) -> Plan:
    lost = flaky = misses = 0
    for card, missed in drawn:
        if card == "lost":
            lost += 1
        else:
            flaky += card == "flaky"
            misses += missed
    return Plan(lost, flaky, misses)


def order_id(i: int) -> str:
    return f"order-{i}"


def order_index(execution_id: str) -> int:
    return int(execution_id[6:])


def new_order(i: int, fate: tuple[str, int]) -> Execution:
    card, misses = fate
    return Execution(
        id=f"order-{i}",
        definition_id="order",
        active_path=ORDER_NEW,
        context={"items": 1 + i % 5, "card": card, "misses": misses, "attempts": 1},
    )


def planned_status(fate: tuple[str, int]) -> str:
    return "timed_out" if fate[0] == "lost" else "completed"


def planned_versions(fate: tuple[str, int]) -> tuple[int, int | None, int | None]:
    """The versions a finished order and its ``packing`` and ``shipping`` children end
    at (``None``: never created): one commit creates each, then one per event handled.
    An order handles place, reserved, then timeout (a lost card), or paid (after a
    retry, with a flaky card) and two region_done; packing handles start and picked,
    shipping start and one pickup timeout per miss, plus the last."""
    card, misses = fate
    if card == "lost":
        return 4, None, None
    return 6 + (card == "flaky"), 3, 3 + misses


def shard_id(service: str, k: int, shards: int) -> str:
    """The id of shard ``k`` of ``service`` (the plain name when there is one shard)."""
    return service if shards == 1 else f"{service}/{k}"


def service_ids(shards: int) -> list[str]:
    """Every shared service's id: the inventory shards, then the payment shards."""
    return [shard_id(s, k, shards) for s in (INVENTORY, PAYMENT) for k in range(shards)]


def new_services(shards: int = 1) -> list[Execution]:
    """The shared services, as created at the start of a run: the inventory shards,
    then the payment shards."""
    inventories, payments = zip(*(_new_services(k, shards) for k in range(shards)), strict=True)
    return [*inventories, *payments]


def merged(services: Sequence[Execution | None]) -> Execution | None:
    """The shards of one service as one execution whose counts are their sums and whose
    lists are their concatenations (``None`` when a shard is missing): what the checks
    read."""
    if not services or any(s is None for s in services):
        return None
    context: dict[str, Any] = {}
    for service in services:
        assert service is not None
        for key, value in service.context.items():
            context[key] = context[key] + value if key in context else value
    first = services[0]
    assert first is not None
    return Execution(id=first.definition_id, definition_id=first.definition_id, context=context)


def _new_services(k: int, shards: int) -> tuple[Execution, Execution]:
    inventory = Execution(
        id=shard_id(INVENTORY, k, shards),
        definition_id=INVENTORY,
        active_path=(INVENTORY, "open"),
        context={"reservations": 0, "releases": 0, "reserved_items": 0},
    )
    payment = Execution(
        id=shard_id(PAYMENT, k, shards),
        definition_id=PAYMENT,
        active_path=(PAYMENT, "idle"),
        context={"pending": [], "settled": 0, "lost": 0, "settlements": 0},
    )
    return inventory, payment


def new_child(parent_id: Any, child_id: Any, root_path: Any, context: dict[str, Any]) -> Execution:
    return Execution(
        id=child_id,
        definition_id=root_path,
        active_path=(root_path, "start"),
        context=context,
        parent_id=parent_id,
    )


def expectation(problems: list[str]) -> Callable[[str, object, object], None]:
    """``expect(what, got, want)`` adds a problem unless ``got == want``."""

    def expect(what: str, got: object, want: object) -> None:
        if got != want:
            problems.append(f"{what}: got {got!r}, expected {want!r}")

    return expect


def add_problem(problems: list[str], text: str) -> None:
    if len(problems) < MAX_PROBLEMS:
        problems.append(text)
    elif len(problems) == MAX_PROBLEMS:
        problems.append("... and more")


class Workflow:
    """The state machines. ``now`` is the simulated clock the host sets; ``handlers``
    maps a ``definition_id`` to its machine."""

    def __init__(self) -> None:
        self.now = EPOCH
        self.shards = 1
        self.handlers: dict[str, Callable[[Any, Event], Step]] = {
            "order": self._order,
            INVENTORY: self._inventory,
            PAYMENT: self._payment,
            "packing": self._packing,
            "shipping": self._shipping,
        }

    def _order(self, exe: Execution, ev: Event) -> Step:
        state = exe.active_path[1]
        kind = ev[1]
        now = self.now
        if state == "new":
            if kind == "place":
                exe.active_path = ORDER_RESERVING
                timer = TimerOp(SCHEDULE, T_RESERVING, now + RESERVE_TIMEOUT)
                return (
                    [(self._shard(INVENTORY, exe), "reserve", exe.context["items"])],
                    (timer,),
                    (),
                )
        elif state == "reserving":
            if kind == "reserved":
                exe.active_path = ORDER_PAYING
                timer = TimerOp(SCHEDULE, T_PAYING, now + PAY_TIMEOUT)
                return (
                    [(self._shard(PAYMENT, exe), "charge", (exe.context["card"], 1))],
                    (CANCEL_RESERVING, timer),
                    (),
                )
            if kind == "timeout" and ev[3] == T_RESERVING:
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
                    (
                        shipping,
                        "shipping",
                        {**context, "misses": exe.context["misses"], "missed": 0},
                    ),
                )
                return [], (CANCEL_PAYING, timer), spawns
            if kind == "retry":
                # Re-entering ``paying`` re-arms its timer: same path, so it replaces.
                attempt = ev[3] + 1
                exe.context["attempts"] = attempt
                timer = TimerOp(SCHEDULE, T_PAYING, now + PAY_TIMEOUT)
                charge = (self._shard(PAYMENT, exe), "charge", (exe.context["card"], attempt))
                return [charge], (timer,), ()
            if kind == "timeout" and ev[3] == T_PAYING:
                return self._give_up(exe, "payment timeout")
        elif state == "fulfilling":
            if kind == "region_done":
                children = exe.children
                children[ev[2]] = "done"
                if all(children.values()):  # the join
                    exe.active_path = ORDER_COMPLETED
                    exe.status = "completed"
                    exe.outcome = "delivered"
                    return [(None, "order_finished", "completed")], (CANCEL_FULFILLING,), ()
                return NOTHING
            if kind == "timeout" and ev[3] == T_FULFILLING:
                return self._give_up(exe, "fulfilment timeout")
        return NOTHING  # not handled in this state: marked processed all the same

    def _shard(self, service: str, order: Execution) -> str:
        shards = self.shards
        return service if shards == 1 else f"{service}/{order_index(str(order.id)) % shards}"

    def _give_up(self, exe: Execution, why: str) -> Step:
        exe.active_path = ORDER_TIMED_OUT
        exe.status = "timed_out"
        exe.outcome = why
        sends: list[Send] = [(None, "order_finished", "timed_out")]
        if why != "reservation timeout":
            sends.append((self._shard(INVENTORY, exe), "release", exe.context["items"]))
        return sends, (), ()  # the timer that fired is deleted by the sweeper

    def _inventory(self, exe: Execution, ev: Event) -> Step:
        context = exe.context
        kind = ev[1]
        if kind == "reserve":
            context["reservations"] += 1
            context["reserved_items"] += ev[3]
            return [(ev[2], "reserved", None)], (), ()
        if kind == "release":
            context["releases"] += 1
            context["reserved_items"] -= ev[3]
        return NOTHING

    def _payment(self, exe: Execution, ev: Event) -> Step:
        context = exe.context
        kind = ev[1]
        if kind == "charge":
            card, attempt = ev[3]
            if card == "lost":
                context["lost"] += 1
                return NOTHING
            context["pending"].append((ev[2], card, attempt))
            if exe.active_path[1] == "batching":
                return NOTHING
            exe.active_path = (PAYMENT, "batching")
            return [], (TimerOp(SCHEDULE, T_SETTLE, self.now + SETTLE_EVERY),), ()
        if kind == "timeout" and ev[3] == T_SETTLE:
            sends: list[Send] = [
                (order_id, "retry" if card == "flaky" and attempt == 1 else "paid", attempt)
                for order_id, card, attempt in context["pending"]
            ]
            context["settled"] += len(sends)
            context["settlements"] += 1
            context["pending"] = []
            exe.active_path = (PAYMENT, "idle")
            return sends, (), ()
        return NOTHING

    def _packing(self, exe: Execution, ev: Event) -> Step:
        state = exe.active_path[1]
        if state == "start" and ev[1] == "start":
            exe.active_path = PACKING_PICKING
            return [(exe.id, "picked", None)], (), ()
        if state == "picking" and ev[1] == "picked":
            return self._region_done(exe)
        return NOTHING

    def _shipping(self, exe: Execution, ev: Event) -> Step:
        state = exe.active_path[1]
        if state == "start" and ev[1] == "start":
            exe.active_path = SHIPPING_AWAITING
            return [], (TimerOp(SCHEDULE, T_PICKUP, self.now + PICKUP_DELAY),), ()
        if state == "awaiting_pickup" and ev[1] == "timeout" and ev[3] == T_PICKUP:
            context = exe.context
            if context["misses"]:
                # Re-armed while the sweep that fired it is still running: the sweep's
                # delete_timer(..., old fire_at) must leave this new timer alone.
                context["misses"] -= 1
                context["missed"] += 1
                return [], (TimerOp(SCHEDULE, T_PICKUP, self.now + PICKUP_DELAY),), ()
            return self._region_done(exe)
        return NOTHING

    def _region_done(self, exe: Execution) -> Step:
        exe.active_path = (exe.active_path[0], "done")
        exe.status = "completed"
        return [(exe.parent_id, "region_done", None)], (), ()
