"""The boundary with python-statemachine: a chart built in a stored configuration without
running any callback, run with its delayed events and cancellations recorded in a
:class:`Step`, and read back as the execution keeps it.

python-statemachine is reached as ``Any`` from here only: its annotations are partial,
and the rest of the package stays strictly typed without it installed.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Iterable, Mapping
from inspect import iscoroutinefunction
from typing import Any

from .._errors import StoreError
from .._records import TimerOp

EXTRA = "pip install 'harel-store[statemachine]'"


def _library() -> Any:
    try:
        library = importlib.import_module("statemachine")
    except ImportError as exc:
        raise ImportError(f"harel_store.statemachine needs python-statemachine 3: {EXTRA}") from exc
    version = str(getattr(library, "__version__", "0"))
    if version.split(".")[0] != "3":
        raise ImportError(
            f"harel_store.statemachine needs python-statemachine 3, found {version}: {EXTRA}"
        )
    return library


_sm = _library()
_Model: Any = importlib.import_module("statemachine.model").Model
_OrderedSet: Any = importlib.import_module("statemachine.orderedset").OrderedSet

STATE = "state"  # the model attribute python-statemachine keeps the configuration in
DELAYED = "delayed/"  # how the path of every timer this package arms begins
_STEP = "_harel_store_step"  # the chart attribute that holds the step being recorded


class Step:
    """The effects of one step, recorded as the chart runs: delayed events (timers to
    arm and to disarm) and events for other executions (outbox entries)."""

    def __init__(self, exe_id: str, version: int, now: float, delayed: dict[str, Any]) -> None:
        self.exe_id = exe_id
        self.version = version  # the version this step's commit makes: it names the timers
        self.now = now
        self.delayed = delayed  # path -> delayed event, as the commit will store them
        self.armed: list[str] = []  # the paths this step added, in the order it sent them
        self.disarmed: list[str] = []  # the paths of stored timers this step removed
        self.sent = 0  # delayed events sent in this step: numbers their paths
        self.emits: list[tuple[str, dict[str, Any]]] = []

    def delay(
        self,
        event: str,
        args: Iterable[Any],
        kwargs: Mapping[str, Any],
        send_id: str | None,
        delay_ms: float,
        to: str | None = None,
    ) -> None:
        path = f"{DELAYED}{self.version}.{self.sent}/{event}"
        self.sent += 1
        self.delayed[path] = {
            "event": event,
            "args": tuple(args),
            "kwargs": dict(kwargs),
            "send_id": send_id,
            "to": to,
            "fire_at": self.now + float(delay_ms) / 1000.0,
        }
        self.armed.append(path)

    def cancel(self, send_id: str) -> None:
        for path in [p for p, entry in self.delayed.items() if entry["send_id"] == send_id]:
            self.remove(path)

    def remove(self, path: str) -> None:
        del self.delayed[path]
        if path in self.armed:
            self.armed.remove(path)
        else:
            self.disarmed.append(path)

    def emit(self, target: str, event: str, data: dict[str, Any]) -> None:
        event_id = uuid.uuid4().hex  # the receiver's processed mark
        self.emits.append(
            (target, {"event": event, "data": data, "event_id": event_id, "sender": self.exe_id})
        )

    def timers(self) -> list[TimerOp]:
        ops = [TimerOp("cancel", path) for path in self.disarmed]
        ops += [TimerOp("schedule", path, self.delayed[path]["fire_at"]) for path in self.armed]
        return ops


def is_envelope(event: Any) -> bool:
    """Whether an outbox entry's event is one :func:`send_to` made."""
    return type(event) is dict and {"event", "data", "event_id"} <= event.keys()


def send_to(
    chart: Any,
    target_id: str,
    event: str,
    *,
    delay: float | None = None,
    send_id: str | None = None,
    **data: Any,
) -> None:
    """Send ``event``, with ``data`` as its keyword arguments, to the execution
    ``target_id``, from a callback of a chart that :class:`Machines` runs.

    The event goes into the outbox in the sender's commit, and :meth:`Machines.pump`
    delivers it once. With ``delay`` (milliseconds, as python-statemachine's ``send``
    counts) it is first a timer of the sender, which ``cancel_event(send_id)`` cancels.
    """
    step: Step | None = getattr(chart, _STEP, None)
    if step is None:
        raise RuntimeError("send_to works in a callback of a chart run by Machines")
    if not isinstance(target_id, str) or not isinstance(event, str):
        raise TypeError("send_to takes a target execution id and an event name, both str")
    if delay is not None and delay > 0:
        step.delay(event, (), data, send_id, delay, to=target_id)
    else:
        step.emit(target_id, event, data)


def is_chart_class(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, _sm.StateChart)


class Chart:
    """A chart class as the store keeps its instances."""

    def __init__(self, cls: Any) -> None:
        if not is_chart_class(cls):
            raise TypeError(f"a chart class is a python-statemachine StateChart, got {cls!r}")
        self.cls = cls
        self.name = str(cls.name)  # the executions' definition_id
        self.values: dict[str, Any] = {s.id: s.value for s in cls.states_map.values()}
        self.any = list(self.values.values())[:1]  # a configuration, to pass the constructor
        self.checked = False

    def build(self, exe: Any, step: Step) -> Any:
        """The chart of ``exe``, in its configuration and history, no callback run."""
        model = self.model(exe.context.get("model", {}))
        try:
            values = [self.values[state_id] for state_id in exe.active_path]
            history = {h: [self.values[i] for i in ids] for h, ids in exe.history.items()}
        except KeyError as exc:
            raise StoreError(
                f"execution {exe.id!r} holds state {exc.args[0]!r}, unknown to {self.name}"
            ) from None
        # Set before the chart is made, so that it does not enter its initial state (an
        # empty configuration, which python-statemachine can reach, is set after it).
        setattr(model, STATE, values[0] if len(values) == 1 else _OrderedSet(values or self.any))
        chart = self.cls(model=model)
        if not values:
            setattr(model, STATE, None)
        states = chart._config._instance_states  # the state objects the engine records
        chart.history_values = {h: [states[v] for v in vs] for h, vs in history.items()}
        if exe.status == "completed":
            chart._engine.running = False
        self._hook(chart, step)
        return chart

    def fresh(self, data: Mapping[str, Any], step: Step) -> tuple[Any, Any]:
        """A new chart with ``data`` on its model, and what entering its initial
        configuration returned (an awaitable on python-statemachine's async engine)."""
        model = self.model(data)
        # A state keeps the constructor from entering the initial configuration before
        # the chart is hooked; then it is emptied and started.
        setattr(model, STATE, _OrderedSet(self.any))
        chart = self.cls(model=model)
        setattr(model, STATE, None)
        self._hook(chart, step)
        engine = chart._engine
        engine.start()  # the sync engine enters the configuration; the async one queues it
        if iscoroutinefunction(engine.activate_initial_state):
            return chart, chart.activate_initial_state()
        return chart, None

    @staticmethod
    def model(data: Mapping[str, Any]) -> Any:
        model = _Model()
        for key, value in data.items():
            setattr(model, key, value)
        return model

    @staticmethod
    def read(chart: Any) -> dict[str, Any]:
        """What the execution keeps of ``chart``, but its delayed events."""
        return {
            "active_path": tuple(str(s.id) for s in chart.configuration),
            "history": {
                str(h): [str(s.id) for s in states] for h, states in chart.history_values.items()
            },
            "status": "completed" if chart.is_terminated else "running",
            "model": {k: v for k, v in vars(chart.model).items() if k != STATE},
        }

    def _hook(self, chart: Any, step: Step) -> None:
        """Record the chart's delayed events and cancellations in ``step``, in place of
        python-statemachine's queue, whose delayed events live only in the process."""
        if not self.checked:  # what a chart invokes is known once one is made
            registry = chart._callbacks
            if any(s.invoke.key in registry for s in self.cls.states_map.values()):
                raise TypeError(f"{self.name}: a state that invokes cannot be kept in a store")
            self.checked = True
        engine = chart._engine

        def put(trigger: Any, internal: bool = False) -> None:
            event = trigger.event
            delay = getattr(event, "delay", 0) or 0
            if delay > 0:
                step.delay(str(event.id), trigger.args, trigger.kwargs, trigger.send_id, delay)
            else:
                engine.put(trigger, internal=internal)

        def cancel_event(send_id: str) -> None:
            step.cancel(send_id)
            engine.cancel_event(send_id)

        # Past StateChart.__setattr__, which would refuse a state named like an attribute.
        object.__setattr__(chart, "_put_nonblocking", put)
        object.__setattr__(chart, "cancel_event", cancel_event)
        object.__setattr__(chart, _STEP, step)
