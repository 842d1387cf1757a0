"""harel_store.statemachine: python-statemachine charts kept in every store.

The charts run through ``Machines`` (or ``AsyncMachines`` on the async stores) must do
exactly what the same chart does in memory under python-statemachine alone: the same
configurations, history, model data and callbacks, with no callback run by a restore.
"""

from __future__ import annotations

import asyncio
import copy
import random
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("statemachine", reason="python-statemachine is the extra 'statemachine'")

from _helpers import AsyncAsSync
from statemachine import HistoryState, State, StateChart
from statemachine.model import Model

import harel_store
from harel_store import DictStore, Execution, StoreError, TimerOp
from harel_store.statemachine import AsyncMachines, Machines, send_to

# -- the charts -----------------------------------------------------------------------------


class Plant(StateChart):
    """Compound states in a parallel state, shallow and deep history, a guard that reads
    the model, an action that fails (``error.execution``), a final state."""

    class plant(State.Compound):
        class on(State.Compound):
            class running(State.Parallel):
                class heater(State.Compound):
                    cold = State(initial=True)

                    class heating(State.Compound):
                        warm = State(initial=True)
                        hot = State()
                        hotter = warm.to(hot) | hot.to(warm)
                        hh = HistoryState()
                        hh.to(warm)  # entered before heating was ever left

                    heat = cold.to(heating)
                    cool = heating.to(cold)
                    reheat = cold.to(heating.hh)

                class flow(State.Compound):
                    idle = State(initial=True)
                    flowing = State()
                    valve = idle.to(flowing) | flowing.to(idle)

            maintenance = State()
            service = running.to(maintenance)
            back = maintenance.to(running)
            h = HistoryState(type="deep")

        off = State()
        power = on.to(off, cond="allowed") | off.to(on.h)
        glitch = on.to.itself(internal=True, on="explode")

    broken = State(final=True)
    error_execution = plant.to(broken, cond="fragile")

    def allowed(self) -> bool:
        self.model.log.append("guard")
        return bool(self.model.n % 3 != 2)

    def fragile(self) -> bool:
        return bool(self.model.fragile and self.model.n >= 15)

    def explode(self) -> None:
        raise ValueError("boom")

    def on_valve(self, level: int | None = None) -> None:
        if level is not None:
            self.model.level = level

    def on_enter_state(self, state: Any, event: Any) -> None:
        self.model.log.append(f"enter {state.id} on {event}")

    def on_exit_state(self, state: Any, event: Any) -> None:
        self.model.log.append(f"exit {state.id} on {event}")

    def after_transition(self, event: Any) -> None:
        self.model.n += 1


PLANT_EVENTS = ["heat", "cool", "reheat", "hotter", "valve", "service", "back", "power", "glitch"]


class Kettle(StateChart):
    """Delayed events: boiling arms a whistle in 2 s; switching off cancels it."""

    idle = State(initial=True)
    boiling = State()
    whistling = State()
    switch = idle.to(boiling) | boiling.to(idle) | whistling.to(idle)
    whistle = boiling.to(whistling)

    def on_enter_boiling(self) -> None:
        self.send("whistle", delay=2000, send_id="whistle")

    def on_exit_boiling(self) -> None:
        self.cancel_event("whistle")

    def on_whistle(self) -> None:
        self.model.whistles += 1
        send_to(self, "ledger", "note", what=f"whistle {self.model.name}")


class Ledger(StateChart):
    """Counts what the others send it."""

    open = State(initial=True)
    note = open.to.itself(internal=True)

    def on_note(self, what: str) -> None:
        self.model.notes = [*self.model.notes, what]


# -- a Machines on every store --------------------------------------------------------------


class _Sync:
    """An ``AsyncMachines`` behind the sync methods, each run to its end on ``loop``."""

    def __init__(self, machines: AsyncMachines, loop: asyncio.AbstractEventLoop) -> None:
        self._machines = machines
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._machines, name)
        return lambda *args, **kwargs: self._loop.run_until_complete(method(*args, **kwargs))


@dataclass
class Kit:
    """Machines on a store of one kind, and a sync view of that store for the checks."""

    machines: Callable[..., Any]
    store: Any


KINDS = [
    pytest.param("memory", id="memory"),
    pytest.param("memory-async", id="memory-async"),
    pytest.param("sqlite", id="sqlite", marks=pytest.mark.durable),
    pytest.param("sqlite-async", id="sqlite-async", marks=pytest.mark.durable),
    pytest.param("postgres", id="postgres", marks=pytest.mark.durable),
    pytest.param("postgres-async", id="postgres-async", marks=pytest.mark.durable),
]


@pytest.fixture(params=KINDS)
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    kind: str = request.param
    backend, _, flavour = kind.partition("-")
    if backend == "memory":
        sync_store: Any = DictStore()
        async_store: Any = harel_store.AsyncDictStore()
    elif backend == "sqlite":
        from harel_store.sqlite import AsyncSqliteStore, SqliteStore

        sync_store = SqliteStore(tmp_path / "charts.db")
        async_store = AsyncSqliteStore(tmp_path / "charts.db")
    else:
        from harel_store.postgres import AsyncPostgresStore, PostgresStore

        server = request.getfixturevalue("pg_server")
        schema = request.getfixturevalue("pg_schema")
        sync_store = PostgresStore(server.url, schema=schema)
        async_store = AsyncPostgresStore(server.url, schema=schema)
    loop = asyncio.new_event_loop()
    try:
        if flavour == "async":
            view = (
                sync_store
                if backend != "memory"
                else AsyncAsSync(async_store, loop.run_until_complete)
            )
            yield Kit(
                lambda *charts, **options: _Sync(
                    AsyncMachines(async_store, *charts, **options), loop
                ),
                view,
            )
        else:
            yield Kit(
                lambda *charts, **options: Machines(sync_store, *charts, **options), sync_store
            )
    finally:
        loop.run_until_complete(async_store.close())
        loop.close()
        sync_store.close()


def _plant_model(fragile: bool) -> dict[str, Any]:
    return {"log": [], "n": 0, "fragile": fragile, "level": 0}


def _events(seed: int, n: int) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    events: list[tuple[str, dict[str, Any]]] = []
    for _ in range(n):
        name = rng.choice([*PLANT_EVENTS, "nonsense"])
        data = {"level": rng.randrange(10)} if name == "valve" and rng.random() < 0.5 else {}
        events.append((name, data))
    return events


def _alone(events: list[tuple[str, dict[str, Any]]], fragile: bool) -> list[tuple[Any, ...]]:
    """What python-statemachine alone does with ``events``, after each one."""
    model = Model()
    vars(model).update(_plant_model(fragile))
    chart = Plant(model=model)

    def seen() -> tuple[Any, ...]:
        data = {k: v for k, v in vars(model).items() if k != "state"}
        history = {h: [s.id for s in states] for h, states in chart.history_values.items()}
        return (
            tuple(s.id for s in chart.configuration),
            history,
            copy.deepcopy(data),
            chart.is_terminated,
        )

    seen_after = [seen()]
    for name, data in events:
        chart.send(name, **data)
        seen_after.append(seen())
    return seen_after


def _stored(store: Any, exe_id: str) -> tuple[Any, ...]:
    exe = store.load(exe_id)
    return (
        tuple(exe.active_path),
        exe.history,
        exe.context["model"],
        exe.status == "completed",
    )


# -- tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fragile", [False, True])
def test_a_stored_chart_does_what_python_statemachine_does_alone(kit: Kit, fragile: bool) -> None:
    """After every event, the execution holds the configuration (in the chart's own
    order), the history and the model data of the same chart run in memory alone; its
    model's log shows that the same callbacks ran, and none ran to restore it."""
    events = _events(seed=7 if fragile else 11, n=60)
    expected = _alone(events, fragile)
    machines = kit.machines(Plant)
    assert machines.start("p1", **_plant_model(fragile)) is True
    assert _stored(kit.store, "p1") == expected[0]
    for (name, data), after in zip(events, expected[1:], strict=True):
        machines.send("p1", name, **data)
        assert _stored(kit.store, "p1") == after, name
        assert machines.configuration("p1") == frozenset(after[0])
    assert machines.data("p1") == expected[-1][2]
    if fragile:
        assert expected[-1][3], "the sequence reaches the final state"


def test_every_kind_of_state_is_restored_exactly(kit: Kit) -> None:
    """Both parallel regions in nested compound states, remembered by a shallow history
    and, while off, by a deep one, come back as they were, in the chart's own order."""
    events = [(name, {}) for name in ["heat", "hotter", "valve", "cool", "power", "power"]]
    expected = _alone([*events, ("reheat", {})], fragile=False)
    machines = kit.machines(Plant)
    machines.start("p1", **_plant_model(False))
    for name, _ in events[:5]:
        machines.send("p1", name)
    assert _stored(kit.store, "p1") == expected[5]
    exe = kit.store.load("p1")
    assert exe.active_path == ("plant", "off")
    assert exe.history == {"hh": ["hot"], "h": ["running", "heater", "flow", "flowing", "cold"]}
    machines.send("p1", "power")  # back on, through the deep history
    assert _stored(kit.store, "p1") == expected[6]
    assert machines.configuration("p1") == {"plant", "on", "running", "heater", "cold", "flow",
                                            "flowing"}  # fmt: skip
    machines.send("p1", "reheat")  # the shallow history of heating: hot, not warm
    assert _stored(kit.store, "p1") == expected[7]
    assert machines.configuration("p1") >= {"heating", "hot", "flowing"}


def test_an_event_id_is_handled_once(kit: Kit) -> None:
    machines = kit.machines(Plant)
    assert machines.start("p1", **_plant_model(False)) is True
    assert machines.start("p1", **_plant_model(True)) is False  # exists: unchanged
    version = kit.store.load("p1").version
    assert machines.send("p1", "heat", event_id="evt-1") is True
    assert machines.send("p1", "heat", event_id="evt-1") is False
    assert machines.send("p1", "cool", event_id="evt-1") is False
    exe = kit.store.load("p1")
    assert exe.version == version + 1
    assert kit.store.is_processed("p1", "evt-1")
    assert "heating" in exe.active_path and exe.context["model"]["fragile"] is False
    assert machines.send("p1", "cool") is True  # no id: no dedupe
    assert "cold" in machines.configuration("p1")


def test_delayed_events_are_timers_cancelled_in_the_same_commit(kit: Kit) -> None:
    now = [1000.0]
    machines = kit.machines(Kettle, Ledger, clock=lambda: now[0])
    machines.start("ledger", chart=Ledger, notes=[])
    machines.start("k1", name="k1", whistles=0)
    machines.send("k1", "switch", event_id="on-1")  # boiling: a whistle at 1002.0
    [(exe_id, path, fire_at)] = kit.store.due_timers(1e12)
    assert (exe_id, fire_at) == ("k1", 1002.0) and path.endswith("/whistle")
    version = kit.store.load("k1").version
    machines.send("k1", "switch", event_id="off-1")  # switched off: the timer goes with it
    assert kit.store.load("k1").version == version + 1
    assert kit.store.due_timers(1e12) == []
    assert kit.store.load("k1").context["delayed"] == {}

    machines.send("k1", "switch", event_id="on-2")  # boiling again at 1000.0
    assert machines.pump(now=1001.9) == 0
    assert machines.configuration("k1") == {"boiling"}
    assert machines.pump(now=1002.0) == 2  # the whistle, then its note to the ledger
    assert machines.configuration("k1") == {"whistling"}
    assert machines.data("k1")["whistles"] == 1
    assert machines.data("ledger")["notes"] == ["whistle k1"]
    assert machines.pump(now=1e9) == 0
    trace = kit.store.read_trace("k1")[-1]
    assert trace["event"] == "whistle" and trace["via"] == "timer"


def test_send_to_goes_through_the_outbox_of_the_senders_commit(kit: Kit) -> None:
    machines = kit.machines(Kettle, Ledger, clock=lambda: 0.0)
    machines.start("ledger", chart=Ledger, notes=[])
    machines.start("k1", name="k1", whistles=0)
    machines.send("k1", "switch")
    machines.pump(now=5.0)  # the whistle fires and sends a note: one commit of k1
    assert machines.data("ledger")["notes"] == ["whistle k1"]
    [step] = [s for s in kit.store.read_trace("ledger") if s["via"] == "outbox"]
    assert step["event"] == "note"
    assert kit.store.pending_outbox() == []


def test_the_outbox_entry_is_committed_with_the_step_and_marked_once_delivered() -> None:
    store = DictStore()
    machines = Machines(store, Kettle, Ledger, clock=lambda: 0.0)
    machines.start("ledger", chart=Ledger, notes=[])
    machines.start("k1", name="k1", whistles=0)
    machines.send("k1", "switch")
    with pytest.raises(ZeroDivisionError):  # the delivery fails after its commit...
        Machines(_FailingAck(store), Kettle, Ledger, lease=0.0).pump(now=5.0)
    [entry] = store.pending_outbox()
    assert entry.target_id == "ledger" and entry.event["event"] == "note"
    assert entry.event["data"] == {"what": "whistle k1"} and entry.event["sender"] == "k1"
    assert store.is_processed("ledger", entry.event["event_id"])
    assert machines.pump(now=5.0) == 1  # ...so the redelivery only acks it
    assert machines.data("ledger")["notes"] == ["whistle k1"]
    assert store.pending_outbox() == []


class _FailingAck:
    """A store whose ``ack_outbox`` fails: the process died after the delivery's commit."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def ack_outbox(self, seq: int) -> None:
        raise ZeroDivisionError


def test_a_delayed_send_to_is_a_timer_of_the_sender_then_an_outbox_entry() -> None:
    class Reminder(StateChart):
        waiting = State(initial=True)
        done = State(final=True)
        finish = waiting.to(done)

        def on_enter_waiting(self) -> None:
            send_to(self, "ledger", "note", delay=500, send_id="nag", what="nag")
            send_to(self, "ledger", "note", delay=800, send_id="late", what="late")

        def on_exit_waiting(self) -> None:
            self.cancel_event("late")

    store = DictStore()
    machines = Machines(store, Reminder, Ledger, clock=lambda: 10.0)
    machines.start("ledger", chart=Ledger, notes=[])
    machines.start("r1")
    assert [(p.rsplit("/", 1)[1], t) for _, p, t in store.due_timers(99.0)] == [
        ("note", 10.5),
        ("note", 10.8),
    ]
    assert store.pending_outbox() == []
    assert machines.pump(now=10.6) == 2  # the timer, then the entry it put in the outbox
    machines.send("r1", "finish")
    assert store.due_timers(99.0) == [] and machines.pump(now=99.0) == 0
    assert machines.data("ledger")["notes"] == ["nag"]


def test_a_commit_whose_reply_was_lost_is_retried_with_its_commit_id() -> None:
    store = DictStore()
    lossy = _LosesReplies(store, losses=2)
    machines = Machines(lossy, Plant)
    machines.start("p1", **_plant_model(False))
    machines.send("p1", "heat", event_id="e1")
    assert lossy.lost == 2 and lossy.commit_ids == ["start", "event:e1", "event:e1", "event:e1"]
    log = machines.data("p1")["log"]
    assert log.count("enter heating on heat") == 1
    assert store.load("p1").version == 2


class _LosesReplies:
    """A store whose first ``losses`` commits land and then fail, as a lost reply does."""

    def __init__(self, store: Any, losses: int) -> None:
        self._store = store
        self.losses = losses
        self.lost = 0
        self.commit_ids: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def commit(self, *args: Any, **kwargs: Any) -> None:
        self.commit_ids.append(kwargs["commit_id"])
        self._store.commit(*args, **kwargs)
        if kwargs["commit_id"] != "start" and self.lost < self.losses:
            self.lost += 1
            raise StoreError("connection lost")


def test_a_lost_compare_and_set_reloads_and_runs_the_event_again(tmp_path: Path) -> None:
    """Another process moved the execution on between our load and our commit: the step
    runs again on what it committed, and each event counts once."""
    from harel_store.sqlite import SqliteStore

    with SqliteStore(tmp_path / "c.db") as a, SqliteStore(tmp_path / "c.db") as b:
        other = Machines(b, Plant)
        racing = _BeforeCommit(a, lambda: other.send("p1", "valve", event_id="e-other"))
        machines = Machines(racing, Plant)
        other.start("p1", **_plant_model(False))
        assert machines.send("p1", "heat", event_id="e-mine") is True
        assert racing.commits == 2  # the first lost its compare-and-set
        data = machines.data("p1")
        assert data["n"] == 2
        assert data["log"].count("enter heating on heat") == 1
        assert data["log"].count("enter flowing on valve") == 1


class _BeforeCommit:
    def __init__(self, store: Any, before: Callable[[], Any]) -> None:
        self._store = store
        self._before: Callable[[], Any] | None = before
        self.commits = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def commit(self, *args: Any, **kwargs: Any) -> None:
        self.commits += 1
        before, self._before = self._before, None
        if before is not None:
            before()
        self._store.commit(*args, **kwargs)


def test_what_pump_does_not_own_it_leaves_alone() -> None:
    store = DictStore()
    machines = Machines(store, Ledger)
    machines.start("ledger", notes=[])
    other = Execution(id="engine-1")
    store.commit(
        other,
        [("ledger", {"kind": "not a chart event"}), (None, "untargeted")],
        timers=[TimerOp("schedule", "engine/deadline", 1.0)],
    )
    assert machines.pump(now=5.0) == 0
    assert len(store.pending_outbox()) == 2 and len(store.due_timers(5.0)) == 1


def test_an_event_for_a_missing_execution_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    class Sender(StateChart):
        a = State(initial=True)
        b = State(final=True)
        go = a.to(b)

        def on_go(self) -> None:
            send_to(self, "nobody", "hello")

    store = DictStore()
    machines = Machines(store, Sender)
    machines.start("s1")
    machines.send("s1", "go")
    assert machines.pump() == 1
    assert store.pending_outbox() == []
    assert "no such execution" in caplog.text


def test_misuse_is_refused() -> None:
    store = DictStore()
    machines = Machines(store, Plant)
    with pytest.raises(KeyError, match="no execution 'p9'"):
        machines.send("p9", "heat")
    with pytest.raises(KeyError):
        machines.configuration("p9")
    with pytest.raises(ValueError, match="'state'"):
        machines.start("p1", state="on")
    with pytest.raises(TypeError, match="a str"):
        machines.start(7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not one of the chart classes"):
        machines.start("l1", chart=Ledger)
    Machines(store, Ledger).start("l1", notes=[])
    with pytest.raises(LookupError, match="runs chart 'Ledger'"):
        machines.send("l1", "note", what="x")
    with pytest.raises(TypeError, match="StateChart"):
        Machines(store, dict)
    with pytest.raises(ValueError, match="two chart classes"):
        Machines(store, Ledger, type("Ledger", (Ledger,), {}))
    with pytest.raises(RuntimeError, match="run by Machines"):
        send_to(Ledger(model=_model(notes=[])), "x", "note")


def _model(**data: Any) -> Any:
    model = Model()
    vars(model).update(data)
    return model


def test_an_invoking_state_is_refused() -> None:
    class Invoker(StateChart):
        busy = State(initial=True, invoke=lambda: 1)
        done = State(final=True)
        finish = busy.to(done)

    with pytest.raises(TypeError, match="invokes"):
        Machines(DictStore(), Invoker).start("i1")


class Brewer(StateChart):
    """A chart with async callbacks: python-statemachine runs it on its async engine."""

    idle = State(initial=True)
    brewing = State()
    brew = idle.to(brewing)
    ready = brewing.to(idle)

    async def on_enter_brewing(self) -> None:
        await asyncio.sleep(0)
        self.model.brews += 1
        await self.send("ready", delay=1000)


def test_an_async_chart_runs_on_async_machines() -> None:
    async def main() -> tuple[Any, ...]:
        store = harel_store.AsyncDictStore()
        machines = AsyncMachines(store, Brewer, clock=lambda: 0.0)
        await machines.start("b1", brews=0)
        await machines.send("b1", "brew")
        timers = await store.due_timers(9.0)
        handled = await machines.pump(now=1.0)
        return timers, handled, await machines.configuration("b1"), await machines.data("b1")

    timers, handled, configuration, data = asyncio.run(main())
    assert [t[2] for t in timers] == [1.0] and handled == 1
    assert configuration == {"idle"} and data == {"brews": 1}


def test_an_async_chart_runs_on_sync_machines_outside_an_event_loop() -> None:
    machines = Machines(DictStore(), Brewer, clock=lambda: 0.0)
    machines.start("b1", brews=0)
    machines.send("b1", "brew")
    assert machines.pump(now=1.0) == 1
    assert machines.data("b1") == {"brews": 1}


def test_sync_machines_refuse_an_async_chart_inside_an_event_loop() -> None:
    machines = Machines(DictStore(), Brewer)

    async def main() -> None:
        machines.start("b1", brews=0)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine was never awaited"
        with pytest.raises(RuntimeError, match="use AsyncMachines"):
            asyncio.run(main())


def test_import_harel_store_never_imports_python_statemachine() -> None:
    code = "import sys, harel_store; assert 'statemachine' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_without_python_statemachine_the_import_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['statemachine'] = None\n"
        "try:\n"
        "    import harel_store.statemachine\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True
    )
    assert "pip install 'harel-store[statemachine]'" in done.stdout


def test_an_event_the_chart_refuses_commits_nothing() -> None:
    """A ``StateMachine`` (python-statemachine's strict chart) raises on an event it cannot
    take: the error reaches the caller and the store is unchanged."""
    from statemachine import StateMachine

    class Door(StateMachine):
        closed = State(initial=True)
        opened = State()
        open = closed.to(opened)
        close = opened.to(closed)

    store = DictStore()
    machines = Machines(store, Door)
    machines.start("d1")
    with pytest.raises(Door.TransitionNotAllowed):
        machines.send("d1", "close", event_id="e1")
    assert store.load("d1").version == 1 and not store.is_processed("d1", "e1")
    assert machines.send("d1", "open", event_id="e1") is True
    assert machines.configuration("d1") == {"opened"}


def test_an_execution_that_changes_under_every_try_is_given_up() -> None:
    class Contended:
        def __init__(self, store: Any) -> None:
            self._store = store
            self.commits = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self._store, name)

        def commit(self, exe: Any, *args: Any, **kwargs: Any) -> None:
            self.commits += 1
            raise harel_store.StoreConflict(exe.id, exe.version, exe.version + 1)

    store = DictStore()
    Machines(store, Plant).start("p1", **_plant_model(False))
    contended = Contended(store)
    with pytest.raises(StoreError, match="changed under each of 100 tries"):
        Machines(contended, Plant).send("p1", "heat")
    assert contended.commits == 100 and store.load("p1").version == 1
