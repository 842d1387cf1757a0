"""The demonstration on a durable store: resumable after a crash, and shared by relays
in several processes (:mod:`.workers`).

Everything a run needs to go on lives in the store, so a run killed at any instruction
(``kill -9``) is finished by the next one started with ``--resume``:

- the driver, execution ``demo/driver``: the number of orders and the seed (every
  order's fate is drawn from it, so every process draws the same), the simulated clock
  (``tick``, ``now``), the orders admitted so far (``admitted``; ``batch_from``, the
  first of the last tick's batch), ``runs`` (the incarnation, also the writer epoch of
  its commits, so a run that was given up for dead cannot move the clock any more) and
  ``phase`` (``running``, ``stopping``, ``done``). Only the coordinator writes it. A
  run that has finished leaves its driver alone in the store, in phase ``done`` with
  what it found (``problems``, the tallies), so that a ``--resume`` says that it
  finished instead of starting another; a new run forgets it first. It also records
  ``shards`` (how many shards of each service and of the ledger the run has) and
  ``keep`` (whether finished orders stay in the store, for ``inspect``, ``show``,
  ``prune`` and ``copy`` after the run).
- the ledger, execution ``demo/ledger`` (or its shards ``demo/ledger/K``, order ``i``
  going to shard ``i % shards``): the tallies of the orders retired so far, and the ids
  of those retired since the last tick (``retired``). A relay retires an order
  with a commit of the ledger that marks its ``order_finished`` event processed, so an
  announcement delivered twice is counted once, and acks the announcement after it.
  The coordinator forgets the retired orders with their children at the next quiescent
  point (below; with ``keep`` it only clears the list), when no relay can be delivering
  to them: a delivery that had loaded
  an order just before it was forgotten would otherwise store it again (a commit
  succeeds where no row exists).
- the services (see :mod:`.workflow` for their shards), the orders in flight and their
  children, with their outbox and spawn entries and timers.

The coordinator (:class:`Coordinator`) moves the clock one tick only when the store is
quiescent at the current one: no due timer, and empty outbox and spawn tables. In-flight
work is always one of those rows until the work it causes is committed (a relay acks an
entry, or deletes a timer, after the commit of its delivery), so quiescence means every
event of the tick has been handled, by whichever process. Each tick admits the next
batch of orders; re-admitting the last batch after a crash creates only the orders that
are not in the store.

A relay (:class:`~.relay.Relay`) claims outbox entries, spawn intents and due timers with leases
(``claim_*``), and acks, or ``delete_timer``s, what it has handled. Every delivery loads
its target, skips it if ``is_processed``, runs the handler on the loaded copy and commits
it with a ``commit_id`` of this relay's own (``TOKEN:event id``): a ``StoreConflict``
(another process committed the execution meanwhile) reloads and runs the handler again,
and a commit whose outcome is unknown (a ``StoreError``, such as a dropped connection)
is retried as it was, which writes nothing if the first try landed. Like the
in-process relays, a relay "loses" the ack of some entries: it delivers them again at
its next round (skipped by ``is_processed``) before it acks them. A process that dies
holding claims leaves them to the others, or to the resumed run, once their lease runs
out.

What the relays count (events delivered, timers fired, children created) is checked
against the store only when no process of the run died: a killed process's counts die
with it. Everything else is checked from the store, whatever happened.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter
from typing import Any

from .._errors import StaleWriter, StoreConflict
from .._records import Commit, Execution
from .batched import BatchRelay
from .relay import CLAIM, DRIVER, LEASE, Refused, Relay, _Writer, ledger_ids, new_ledger
from .result import DemoResult, WorkerReport, store_checks
from .workflow import (
    EPOCH,
    FULFIL_TIMEOUT,
    MAX_PROBLEMS,
    NOTHING,
    ORDERS_PER_TICK,
    PAY_TIMEOUT,
    TICK,
    add_problem,
    expectation,
    fates,
    merged,
    new_order,
    new_services,
    order_id,
    plan,
    planned_versions,
    service_ids,
)

# The orders of a run that does not say (-n), by the kind of store: each takes about
# 10 to 15 s on a 2-core machine (PostgreSQL with fsync on, one commit per transition).
DEFAULT_ORDERS = {"memory": 20_000, "sqlite": 2_000, "postgresql": 500}
# Shards of each service and of the ledger in a batched run: a batch holds one transition
# per shard, so one shard would serialise every order through each of them. A run that
# does not batch (--no-batch) keeps one of each, the layout it had before batches.
SHARDS = 16


def default_orders(store: Any) -> int:
    """How many orders a run on ``store`` drives unless told: see :data:`DEFAULT_ORDERS`."""
    module = type(store).__module__
    for kind in ("postgres", "sqlite"):
        if kind in module.split("."):
            return DEFAULT_ORDERS["postgresql" if kind == "postgres" else kind]
    return DEFAULT_ORDERS["memory"]


class Coordinator(_Writer):
    """Opens or resumes the run recorded in the store, moves its clock, admits orders,
    and checks and clears the store at the end. One per run."""

    def __init__(
        self,
        store: Any,
        where: str,
        *,
        batch: bool = True,
        keep: bool | None = None,
        shards: int | None = None,
    ) -> None:
        super().__init__(store)
        self.where = where
        self.batch = batch  # admit each tick's orders with commit_many, else one by one
        self.skip_idle = batch  # see advance(); --no-batch keeps the run it had before
        # What the run records (None: the recorded one when resuming, else the default).
        self.asked = {"keep": keep, "shards": shards}
        self.resumed = False
        self.note = ""
        self.created = 0
        self.finished_before = 0  # orders finished by the runs before this one
        self.seen = 0  # orders finished, as the last quiescent point found
        self.forgetters: list[Any] = []  # see forget_with()
        self.peak = 0

    # -- the driver -------------------------------------------------------------------

    def open(
        self, n: int | None, seed: int | None, resume: bool, *, default_n: int | None = None
    ) -> None:
        """Start a run in an empty store, or (``resume``) take over the one in it.
        Raises :class:`Refused` when neither is possible, saying why.

        ``n`` and ``seed`` default to the recorded ones when resuming, else to
        ``default_n`` (default: :func:`default_orders`) and 1. A store whose run has
        finished is ready for a new one; resumed, it is left as it is, and
        :attr:`phase` is ``"done"`` (:meth:`conclude_finished` reports it)."""
        store = self.store
        driver = store.load(DRIVER)
        if driver is not None and driver.context["phase"] == "done" and not resume:
            self._make_way(driver)
            driver = None
        if driver is None:
            stats = store.stats()
            if any(stats.values()):
                held = ", ".join(f"{v:,} {k}" for k, v in stats.items() if v)
                raise Refused(
                    f"{self.where} is not empty ({held}) and holds no run of the "
                    "demonstration: give --store an empty database"
                )
            if resume:
                self.note = f"nothing to resume in {self.where}: starting a new run"
            if n is None:
                n = default_orders(store) if default_n is None else default_n
            seed = 1 if seed is None else seed
            keep, shards = self.asked["keep"], self.asked["shards"]
            driver = Execution(
                id=DRIVER,
                definition_id="driver",
                active_path=("driver", "running"),
                context={
                    "n": n,
                    "seed": seed,
                    "tick": 0,
                    "now": EPOCH,
                    "batch_from": 0,
                    "admitted": 0,
                    "runs": 1,
                    "phase": "running",
                    "keep": bool(keep),
                    "shards": (SHARDS if self.batch else 1) if shards is None else shards,
                },
            )
            step: tuple[str, str, str, int] | None = ("created", "", "created", 1)
        elif driver.context["phase"] == "done":
            step = None  # finished: nothing to take over
            self.resumed = True
        else:
            context = driver.context
            if not resume:
                raise Refused(
                    f"{self.where} holds an unfinished run of the demonstration "
                    f"({self._finished(context):,} of {context['n']:,} orders finished, tick "
                    f"{context['tick']}): add --resume to finish it, or give --store an "
                    "empty database"
                )
            given = {"-n": n, "--seed": seed}
            recorded = {"-n": context["n"], "--seed": context["seed"]}
            for flag, value in given.items():
                if value is not None and value != recorded[flag]:
                    raise Refused(
                        f"the run in {self.where} drives {context['n']:,} orders with seed "
                        f"{context['seed']}; {flag} {value} disagrees (leave it out to resume)"
                    )
            self._agrees(context)
            runs = context["runs"] + 1
            context["runs"] = runs
            before = context["phase"]
            if before == "stopping":
                context["phase"] = "running"
            step = ("resumed", before, f"run-{runs}", runs)
            self.resumed = True
        if step is not None:
            kind, before, what, epoch = step
            try:
                self.commit(driver, NOTHING, None, kind, before, what, epoch)
            except (StoreConflict, StaleWriter) as exc:
                raise Refused(
                    f"another process started or resumed the run in {self.where} at the "
                    f"same moment ({exc})"
                ) from None
        self.driver = driver
        self.n = driver.context["n"]
        self.seed = driver.context["seed"]
        self.shards = driver.context.get("shards", 1)
        self.fates = fates(self.n, self.seed)
        self.now = driver.context["now"]
        if driver.context["phase"] == "done":
            return
        self.finished_before = self._finished()
        # Created on every start, each only if missing: a crash may have come between.
        shards = self.shards
        for exe in (*new_services(shards), *map(new_ledger, ledger_ids(shards))):
            if store.load(exe.id) is None:
                self.create(exe, None)
        if self.resumed:  # the last batch may have been cut short
            self._admit(driver.context["batch_from"], driver.context["admitted"], again=True)

    def _agrees(self, context: dict[str, Any]) -> None:
        """Refuse a resume asked to run differently from the run it resumes."""
        shards = self.asked["shards"]
        if shards is not None and shards != context.get("shards", 1):
            raise Refused(
                f"the run in {self.where} has {context.get('shards', 1)} shards of each "
                f"service; --shards {shards} disagrees (leave it out to resume)"
            )
        if self.asked["keep"] and not context.get("keep", False):
            raise Refused(
                f"the run in {self.where} was started without --keep and has forgotten the "
                "orders it finished: leave --keep out to resume it"
            )

    def _ours(self, context: dict[str, Any]) -> list[str]:
        """The ids of the services and the ledger of the run ``context`` records."""
        shards = context.get("shards", 1)
        return [*service_ids(shards), *ledger_ids(shards)]

    def _make_way(self, driver: Execution) -> None:
        """Forget the finished run ``driver`` records, for a new one: unless the store
        holds more than what is left of that run (a run kept with ``--keep`` is never
        forgotten: it is there to be looked at)."""
        store = self.store
        ours = [i for i in self._ours(driver.context) if store.load(i) is not None]
        executions = store.stats()["executions"]
        if driver.context.get("keep"):
            raise Refused(
                f"{self.where} holds a finished run of the demonstration kept with --keep "
                f"({executions:,} executions): give --store an empty database"
            )
        if executions > len(ours) + 1:
            raise Refused(
                f"{self.where} is not empty ({executions - len(ours) - 1:,} executions "
                "besides a finished run of the demonstration): give --store an empty "
                "database"
            )
        for execution_id in (*ours, DRIVER):
            store.forget(execution_id)

    @property
    def keep(self) -> bool:
        """Whether the run keeps what it finished (``--keep``)."""
        return bool(self.driver.context.get("keep", False))

    @property
    def phase(self) -> str:
        return str(self.driver.context["phase"])

    @property
    def tick(self) -> int:
        return int(self.driver.context["tick"])

    def advance(self) -> None:
        """The next tick: move the clock, wake the relays, admit the next batch. With
        :attr:`skip_idle`, once every order is admitted, the clock goes straight to the
        first tick at which a timer is due: the ticks between would find nothing to do
        (the store is quiescent), as a sweeper sleeps until its next timer."""
        driver = self.driver
        context = driver.context
        tick = context["tick"] + 1
        if self.skip_idle and context["admitted"] >= self.n:
            tick = max(tick, self._next_timer_tick())
        self.now = now = EPOCH + tick * TICK
        first = context["admitted"]
        context.update(
            tick=tick, now=now, batch_from=first, admitted=min(self.n, first + ORDERS_PER_TICK)
        )
        wake = ([(None, "tick", tick)], (), ())
        self.commit(driver, wake, None, "tick", "running", f"tick-{tick}", context["runs"])
        self._admit(first, context["admitted"])

    def _next_timer_tick(self) -> int:
        """The first tick at which a stored timer is due (0 when there is none)."""
        limit = max_ticks(self.n)
        timers = self.store.due_timers(EPOCH + limit * TICK)
        if not timers:
            return 0
        first: float = min(t[2] for t in timers)
        return min(limit, math.ceil((first - EPOCH) / TICK))

    def _admit(self, first: int, last: int, again: bool = False) -> None:
        drawn = self.fates
        load = self.store.load
        orders = [new_order(i, drawn[i]) for i in range(first, last)]
        if again:
            orders = [order for order in orders if load(order.id) is None]
        if self.batch:
            for k in range(0, len(orders), CLAIM):
                commits = [
                    self.prepared(
                        order, ([(order.id, "place", None)], (), ()), None, "created", "", "created"
                    )
                    for order in orders[k : k + CLAIM]
                ]
                for outcome in self.commit_many(commits):
                    if outcome is None:
                        self.created += 1
                    elif not isinstance(outcome, StoreConflict):  # conflict: there already
                        raise outcome
            return
        for order in orders:
            if self.create(order, (order.id, "place", None)):
                self.created += 1

    def stop(self) -> None:
        """Tell the relays of other processes that the run is over."""
        driver = self.driver
        context = driver.context
        context["phase"] = "stopping"
        wake = ([(None, "stop", None)], (), ())
        self.commit(
            driver, wake, None, "stop", "running", f"stop-{context['runs']}", context["runs"]
        )

    # -- watching the run -------------------------------------------------------------

    def pending(self) -> int:
        """How much work is left at the current tick; ``0`` when the store is quiescent.

        Due timers are read first: new timers are never due at the current tick, so
        once there are none, the outbox and spawn counts that follow see any work the
        last of them caused."""
        due = len(self.store.due_timers(self.now))
        if due:
            return due
        stats: dict[str, int] = self.store.stats()
        self.peak = max(self.peak, stats["executions"])
        return stats["outbox"] + stats["spawns"]

    def forget_retired(self) -> int:
        """At a quiescent point: forget the orders retired since the last one, with
        their children, and say how many orders are finished. (Forgotten first, then
        cleared from the ledger's shards, in one batch: a crash between makes the next
        run forget them again.)"""
        store = self.store
        keep = self.keep
        finished = 0
        cleared: list[Commit] = []
        for ledger_id in ledger_ids(self.shards):
            ledger = store.load(ledger_id)
            if ledger is None:
                continue
            retired = ledger.context["retired"]
            if retired:
                if not keep:
                    self._forget([i for o in retired for i in (f"{o}/packing", f"{o}/shipping", o)])
                ledger.context["retired"] = []
                what = f"forgot-{self.tick}"
                cleared.append(self.prepared(ledger, NOTHING, None, "forgotten", "open", what))
            finished += ledger.context["finished"]
        for outcome in self.commit_many(cleared) if cleared else ():
            if outcome is not None:
                raise outcome
        self.seen = finished
        return finished

    def forget_with(self, stores: list[Any]) -> None:
        """Forget retired orders through ``stores`` (other connections to the same
        database), one thread each: a forget is a transaction of its own, and those of
        several connections share the database's flushes instead of queueing for one."""
        self.forgetters = stores

    def _forget(self, ids: list[str]) -> None:
        """Forget ``ids``: all are forgotten when this returns."""
        stores = self.forgetters
        if not stores:
            for execution_id in ids:
                self.store.forget(execution_id)
            return
        k = len(stores)
        with ThreadPoolExecutor(k) as pool:
            done = [pool.submit(_forget_each, s, ids[j::k]) for j, s in enumerate(stores)]
            for future in done:
                future.result()

    def _finished(self, context: dict[str, Any] | None = None) -> int:
        load = self.store.load
        shards = (self.driver.context if context is None else context).get("shards", 1)
        ledgers = [load(i) for i in ledger_ids(shards)]
        return sum(int(ledger.context["finished"]) for ledger in ledgers if ledger is not None)

    def finished(self) -> int:
        return self._finished()

    def over(self) -> bool:
        """Every order retired (as :meth:`forget_retired` found just before), or the
        clock ran out."""
        return self.seen >= self.n or self.tick >= max_ticks(self.n)

    # -- the end ----------------------------------------------------------------------

    def conclude(
        self, counts: Iterable[dict[str, int]], reports: list[WorkerReport], elapsed: float
    ) -> DemoResult:
        """Check the run from the store and the relays' counts, record the outcome in
        the driver, then forget the services and the ledger (with ``keep``, nothing:
        every order stays with its children, marks, commit ids and trace, and the checks
        count them in the store's figures too)."""
        store = self.store
        problems: list[str] = []
        expect = expectation(problems)
        total: dict[str, int] = {}
        for one in counts:
            for key, value in one.items():
                total[key] = total.get(key, 0) + value
        for report in reports:
            if report["error"]:
                problems.append(f"worker {report['worker']} failed: {report['error']}")
        self._ack_wakeups(problems)
        shards, keep = self.shards, self.keep
        ledgers = [store.load(i) for i in ledger_ids(shards)]
        shared = [store.load(i) for i in service_ids(shards)]
        services = [merged(shared[:shards]), merged(shared[shards:])]
        ledger = merged(ledgers)
        tallies = ledger.context if ledger is not None else new_ledger().context
        finished = tallies["finished"]
        if finished < self.n:
            problems.append(
                f"gave up after {self.tick} ticks with {self.n - finished:,} orders in flight"
            )
        planned = plan(self.fates)
        store_checks(
            expect,
            self.n,
            planned,
            services,
            completed=tallies["completed"],
            timed_out=tallies["timed_out"],
            children=tallies["children"],
            missed_pickups=tallies["missed_pickups"],
            notifications=finished,
        )
        problems.extend(tallies["problems"])
        expect("dead letters", total.get("dead_letters", 0), 0)
        _at_least(
            problems,
            "redeliveries skipped",
            total.get("redeliveries_skipped", 0),
            total.get("outbox_crashes", 0),
        )
        _at_least(
            problems,
            "duplicate spawns skipped",
            total.get("spawns_skipped", 0),
            total.get("spawn_crashes", 0),
        )
        timers_fired = sum(r["timers_fired"] for r in reports)
        children_created = sum(r["children_created"] for r in reports)
        payment = services[1]
        settlements = payment.context["settlements"] if payment is not None else 0
        if not self.resumed and not any(r["lost"] for r in reports):
            # What a killed process counted died with it: these hold only when none was.
            expect("region children created", children_created, tallies["children"])
            expect("timers fired", timers_fired, self.n + planned.misses + settlements)

        driver = self.driver
        before = self.phase
        driver.context.update(
            phase="done",
            problems=problems[:MAX_PROBLEMS],
            finished=finished,
            completed=tallies["completed"],
            timed_out=tallies["timed_out"],
        )
        self.commit(driver, NOTHING, None, "done", before, "done", driver.context["runs"])
        commits = self.commits + sum(r["commits"] for r in reports)
        services_left = [s for s in shared if s is not None]
        kept = self._kept(problems) if keep else []
        stays = [*services_left, *(s for s in ledgers if s is not None), driver, *kept]
        stats = store.stats()
        trace_max = store.trace_max or None
        expect(
            "store stats at the end",
            stats,
            {
                "executions": 3 * shards + 1 + len(kept),
                "outbox": 0,
                "spawns": 0,
                "timers": 0,
                "processed": sum(e.version - 1 for e in (*services_left, *kept)) + finished,
                "traces": 3 * shards + 1 + len(kept),
                "trace_steps": sum(min(e.version, trace_max or e.version) for e in stays),
            },
        )
        if keep:
            stats_after = stats
        else:
            # The driver stays, recording the finished run: a --resume says so.
            for execution_id in self._ours(driver.context):
                store.forget(execution_id)
            stats_after = store.stats()
            expected_after = _only_the_driver(stats, driver, trace_max)
            expect("store stats after forget", stats_after, expected_after)

        executions = 2 * shards + self.n + tallies["children"]
        made = self.created + children_created + (0 if self.resumed else 2)
        here = finished - self.finished_before  # the rates count this run's work only
        return DemoResult(
            orders=self.n,
            completed=tallies["completed"],
            timed_out=tallies["timed_out"],
            executions=executions,
            commits=commits,
            events_delivered=sum(r["events_delivered"] for r in reports),
            redeliveries_skipped=total.get("redeliveries_skipped", 0),
            duplicate_spawns_skipped=total.get("spawns_skipped", 0),
            timers_fired=timers_fired,
            notifications=finished,
            ticks=self.tick,
            peak_live_executions=self.peak,
            elapsed=elapsed,
            orders_per_s=here / elapsed if elapsed > 0 else 0.0,
            executions_per_s=made / elapsed if elapsed > 0 else 0.0,
            commits_per_s=commits / elapsed if elapsed > 0 else 0.0,
            stats=stats,
            stats_after_forget=stats_after,
            problems=problems,
            seed=self.seed,
            resumed=self.resumed,
            finished_before=self.finished_before,
            runs=driver.context["runs"],
            conflicts=self.conflicts + sum(r["conflicts"] for r in reports),
            workers=reports,
            kept=keep,
            shards=shards,
        )

    def _kept(self, problems: list[str]) -> list[Execution]:
        """A kept run's orders and their children, each checked against its fate: there,
        and at the version its planned events make (one commit to create it, one per
        event it handled: an event handled twice, or lost, shows here)."""
        load = self.store.load
        kept: list[Execution] = []
        for i, fate in enumerate(self.fates):
            ids = (order_id(i), f"{order_id(i)}/packing", f"{order_id(i)}/shipping")
            for execution_id, version in zip(ids, planned_versions(fate), strict=True):
                exe = load(execution_id)
                if version is None:
                    if exe is not None:
                        add_problem(problems, f"{execution_id}: stored, but never planned")
                elif exe is None:
                    add_problem(problems, f"{execution_id}: not kept")
                else:
                    kept.append(exe)
                    if exe.version != version:
                        add_problem(
                            problems,
                            f"{execution_id}: at version {exe.version}, planned {version}",
                        )
        return kept

    def conclude_finished(self) -> DemoResult:
        """The run in the store had finished and been checked: report what it recorded,
        and forget what is left of it but its driver (a run killed while it cleared the
        store leaves the services or the ledger)."""
        store = self.store
        context = self.driver.context
        recorded = list(context.get("problems", []))
        if not self.keep:
            for execution_id in self._ours(context):
                store.forget(execution_id)
        stats = store.stats()
        return DemoResult(
            orders=self.n,
            executions=0,
            commits=self.commits,
            ticks=self.tick,
            elapsed=0.0,
            orders_per_s=0.0,
            executions_per_s=0.0,
            commits_per_s=0.0,
            stats=stats,
            stats_after_forget=stats,
            problems=recorded,
            seed=self.seed,
            resumed=True,
            runs=context["runs"],
            finished_before=context.get("finished", self.n),
            workers=[],
            kept=self.keep,
            shards=context.get("shards", 1),
        )

    def _ack_wakeups(self, problems: list[str]) -> None:
        """Ack the wake-ups (``tick``, ``stop``) no relay took before it stopped;
        anything else left in the outbox is a problem."""
        store = self.store
        for seq, target, event in store.pending_outbox():
            if target is None and event[1] in ("tick", "stop"):
                store.ack_outbox(seq)
            else:
                add_problem(problems, f"left in the outbox: {seq} {target!r} {event!r}")


def _forget_each(store: Any, ids: list[str]) -> None:
    for execution_id in ids:
        store.forget(execution_id)


def _only_the_driver(
    stats: dict[str, int], driver: Execution, trace_max: int | None
) -> dict[str, int]:
    """What a store holds once a run has finished and been cleared: its driver."""
    expected = dict.fromkeys(stats, 0)
    expected.update(
        executions=1, traces=1, trace_steps=min(driver.version, trace_max or driver.version)
    )
    return expected


def max_ticks(n: int) -> int:
    return n // ORDERS_PER_TICK + 1 + int((PAY_TIMEOUT + FULFIL_TIMEOUT) / TICK) + 10


def _at_least(problems: list[str], what: str, got: int, least: int) -> None:
    if got < least:
        problems.append(f"{what}: got {got!r}, expected at least {least!r}")


def run_durable(
    store: Any,
    *,
    where: str,
    n: int | None = None,
    seed: int | None = None,
    resume: bool = False,
    lease: float = LEASE,
    progress: Callable[[int, int], None] | None = None,
    waiting: Callable[[int], None] | None = None,
    coordinator: Coordinator | None = None,
    batch: bool = True,
    keep: bool | None = None,
    shards: int | None = None,
) -> DemoResult:
    """Run the demonstration in this process on a durable ``store`` (``where`` names it
    in messages): start a run in an empty store (or one whose run has finished), or
    with ``resume`` finish the one it holds. ``n`` and ``seed`` default to the recorded
    ones when resuming, else to :func:`default_orders` and 1. Raises :class:`Refused`
    when the store can take neither.

    ``progress(finished, n)`` is called at every tick; ``waiting(items)`` when the run
    starts waiting for work that a stopped process claimed (``items`` of it) to be
    claimable again, as the claims' leases run out. ``batch`` (the default) writes what
    a relay handles in a round with ``commit_many`` and the batch acks
    (:class:`~.batched.BatchRelay`); ``False`` writes each transition with its own
    ``commit`` and each ack on its own. ``keep`` and ``shards`` are what
    :class:`Coordinator` takes (``None``: recorded, or the default)."""
    coord = coordinator or Coordinator(store, where, batch=batch, keep=keep, shards=shards)
    if coordinator is None:
        coord.open(n, seed, resume)
    if coord.phase == "done":
        return coord.conclude_finished()
    relay = (BatchRelay if batch else Relay)(store, lease=lease)
    start = perf_counter()
    pause = 0.001
    stalled = False
    while True:
        if relay.round():
            continue
        left = coord.pending()
        if left:
            # Claimed by a process that died: ours once their lease runs out.
            if not stalled and waiting is not None:
                waiting(left)
            stalled = True
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            continue
        pause = 0.001
        stalled = False
        finished = coord.forget_retired()
        if progress is not None:
            progress(finished, coord.n)
        if coord.over():
            break
        coord.advance()
    elapsed = perf_counter() - start
    return coord.conclude([relay.counts()], [relay.report(0, elapsed)], elapsed)
