"""An order chart in python-statemachine, kept in SQLite, resumed after a kill, then moved
to PostgreSQL.

    pip install 'harel-store[statemachine,postgres]'
    python examples/order_chart.py                                # SQLite, then a SQLite copy
    python examples/order_chart.py --to postgresql://user@host/db # SQLite, then PostgreSQL

1. Five orders and a warehouse start in a SQLite file. Each order waits for its payment
   with a 30-minute timeout (a delayed event: a timer in the store), and once paid asks
   the warehouse to reserve its items (``send_to``: the outbox) and is packed and
   labelled in two parallel regions, with a hold that resumes where it was (a deep
   history state).
2. A worker process (this file with ``--work``) handles the events one by one and is
   killed with SIGKILL half way through.
3. This process runs the same list of events again: each event id already processed is
   skipped, the rest is handled once, and what the killed worker had claimed from the
   outbox comes back when its lease runs out.
4. ``harel_store.copy_store`` moves everything (executions, timers, processed marks,
   outbox) to the destination (``--to``, an empty database), where the orders go on: the
   last label arrives, and an hour later the unpaid order times out.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from statemachine import HistoryState, State, StateChart

from harel_store import copy_store, open_store
from harel_store.statemachine import Machines, send_to

PAYMENT_TIMEOUT_MS = 30 * 60 * 1000
LEASE = 1.0  # what a killed worker claimed is delivered by another this soon


class Order(StateChart):
    awaiting_payment = State(initial=True)

    class fulfilment(State.Compound):
        class work(State.Parallel):
            class packing(State.Compound):
                picking = State(initial=True)
                packed = State(final=True)
                pack = picking.to(packed)

            class shipping(State.Compound):
                waiting_label = State(initial=True)
                labelled = State(final=True)
                label = waiting_label.to(labelled)

        ready = State(final=True)
        done_state_work = work.to(ready)  # both regions are final
        h = HistoryState(type="deep")

    on_hold = State()
    shipped = State(final=True)
    cancelled = State(final=True)
    pay = awaiting_payment.to(fulfilment)
    payment_timeout = awaiting_payment.to(cancelled)
    hold = fulfilment.to(on_hold)
    release = on_hold.to(fulfilment.h)  # back where it was, in both regions
    done_state_fulfilment = fulfilment.to(shipped)

    def on_enter_awaiting_payment(self) -> None:
        self.send("payment_timeout", delay=PAYMENT_TIMEOUT_MS, send_id="payment")

    def on_exit_awaiting_payment(self) -> None:
        self.cancel_event("payment")

    def on_pay(self) -> None:
        send_to(self, "warehouse", "reserve", order=self.model.order, items=self.model.items)


class Warehouse(StateChart):
    open = State(initial=True)
    reserve = open.to.itself(internal=True)

    def on_reserve(self, order: str, items: list[str]) -> None:
        self.model.reserved = {**self.model.reserved, order: items}


ORDERS = {f"order-{n}": [f"sku-{n}", f"sku-{n + 10}"] for n in range(1, 6)}
WORK = [  # (order, event): what the worker handles, in this order
    ("order-1", "pay"),
    ("order-2", "pay"),
    ("order-3", "pay"),
    ("order-1", "pack"),
    ("order-2", "pack"),
    ("order-2", "hold"),  # order-2 waits; packed already, it stays so
    ("order-1", "label"),
    ("order-4", "pay"),
    ("order-3", "label"),
    ("order-2", "release"),
    ("order-2", "label"),
    ("order-3", "pack"),
    ("order-4", "pack"),
]
KILL_AFTER = 6  # events the worker reports before it is killed
LATER = [("order-4", "label")]  # after the move
EXPECTED = {
    "order-1": {"shipped"},
    "order-2": {"shipped"},
    "order-3": {"shipped"},
    "order-4": {"shipped"},
    "order-5": {"cancelled"},  # never paid: timed out
}


def shown(url: str) -> str:
    """``url`` without the user and password of a PostgreSQL URL."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}"


def machines_on(store: Any, now: float | None = None) -> Machines:
    clock = time.time if now is None else (lambda: now)
    return Machines(store, Order, Warehouse, clock=clock, lease=LEASE)


def settle(machines: Machines, store: Any, now: float | None = None) -> int:
    """Deliver what is due, waiting for what a killed worker still holds a lease on."""
    handled = 0
    while True:
        at = time.time() if now is None else now
        handled += machines.pump(now=at)
        if not store.pending_outbox() and not store.due_timers(at):
            return handled
        time.sleep(0.1)


def handle(machines: Machines, events: list[tuple[str, str]], out: Any) -> None:
    for order, event in events:
        handled = machines.send(order, event, event_id=f"{order}:{event}")
        machines.pump()  # the warehouse's reservations
        print(f"  {order} {event}" + ("" if handled else " (already handled)"), file=out)
        out.flush()


def work(url: str) -> None:
    """The worker process: handles WORK, slowly, as events arrive."""
    with open_store(url) as store:
        machines = machines_on(store)
        for order, event in WORK:
            handle(machines, [(order, event)], sys.stdout)
            time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="where the SQLite files go (default: a temporary one)")
    parser.add_argument("--to", help="the store to move to (default: a SQLite file in --dir)")
    parser.add_argument("--work", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.work:
        work(args.work)
        return 0
    directory = Path(args.dir or tempfile.mkdtemp(prefix="orders-"))
    directory.mkdir(parents=True, exist_ok=True)
    source = f"sqlite:///{directory / 'orders.db'}"
    destination = args.to or f"sqlite:///{directory / 'orders-moved.db'}"

    print(f"1. orders in {source}")
    with open_store(source) as store:
        machines = machines_on(store)
        machines.start("warehouse", chart=Warehouse, reserved={})
        for order, items in ORDERS.items():
            machines.start(order, order=order, items=items)
        print(f"  {len(ORDERS)} orders await payment, {len(store.due_timers(1e18))} timeouts armed")

    print("2. a worker process handles the events, and is killed")
    worker = subprocess.Popen(
        [sys.executable, __file__, "--work", source], stdout=subprocess.PIPE, text=True
    )
    assert worker.stdout is not None
    for _ in range(KILL_AFTER):
        print(worker.stdout.readline(), end="")
    worker.send_signal(signal.SIGKILL)
    worker.communicate()
    print(f"  worker {worker.pid} killed with SIGKILL (exit {worker.returncode})")

    print("3. resumed here: the same events again")
    with open_store(source) as store:
        machines = machines_on(store)
        handle(machines, WORK, sys.stdout)
        settle(machines, store)
        for order in ORDERS:
            print(f"  {order}: {sorted(machines.configuration(order))}")

    print(f"4. moved to {shown(destination)}")
    with open_store(source) as src, open_store(destination) as dst:
        counts = copy_store(src, dst)
        print(f"  copied {counts}")
        machines = machines_on(dst)
        handle(machines, LATER, sys.stdout)
        an_hour_later = time.time() + 3600
        print(f"  an hour later: {settle(machines_on(dst, an_hour_later), dst, an_hour_later)} due")
        final = {order: machines.configuration(order) for order in ORDERS}
        for order, configuration in final.items():
            print(f"  {order}: {sorted(configuration)}")
        reserved = machines.data("warehouse")["reserved"]
        print(f"  warehouse reserved for {sorted(reserved)}")
    if final != EXPECTED or sorted(reserved) != [f"order-{n}" for n in range(1, 5)]:
        print("unexpected outcome", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
