"""Every operation of :class:`Machines`, written once as a generator of the store calls it
makes, and the two drivers that run such a generator on a sync or an async store.

A generator yields a :class:`Call` (a store method and its arguments), an :class:`Await`
(what python-statemachine's async engine returned) or a :class:`Sleep`; the driver sends
back the result, or throws the exception in, where the operation decides what it means.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, replace
from inspect import isawaitable
from typing import Any, TypeVar

from .._errors import IdempotencyConflict, StaleWriter, StoreConflict, StoreError
from .._records import Execution, OutboxEntry
from ._chart import DELAYED, STATE, Chart, Step, is_envelope

_LOG = logging.getLogger("harel_store.statemachine")
CONFLICT_RETRIES = 100  # reloads after a lost compare-and-set before giving up
UNKNOWN_WAITS = (0.05, 0.25)  # the waits before retrying a commit whose outcome is unknown
T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Await:
    awaitable: Any


@dataclass(frozen=True)
class Sleep:
    seconds: float


Gen = Generator[Call | Await | Sleep, Any, T]


class NoExecution(KeyError):
    """No execution has this id."""

    def __init__(self, exe_id: str) -> None:
        super().__init__(f"no execution {exe_id!r} in the store")


class Core:
    """The operations of :class:`Machines` and :class:`AsyncMachines`."""

    def __init__(
        self,
        chart_class: Any,
        charts: tuple[Any, ...],
        clock: Callable[[], float],
        lease: float,
        batch: int,
        trace: bool,
        copies: bool,
    ) -> None:
        self.default = Chart(chart_class)
        self.charts = {self.default.name: self.default}
        for cls in charts:
            chart = Chart(cls)
            if self.charts.setdefault(chart.name, chart) is not chart:
                raise ValueError(f"two chart classes are named {chart.name!r}")
        self.clock = clock
        self.lease = lease
        self.batch = batch
        self.trace = trace
        self.copies = copies  # load returns the stored object: copy before changing it

    def _chart(self, exe: Any) -> Chart:
        chart = self.charts.get(exe.definition_id)
        if chart is None:
            raise LookupError(
                f"execution {exe.id!r} runs chart {exe.definition_id!r}, which these Machines "
                f"do not know (they know {', '.join(sorted(self.charts))}): pass its class"
            )
        return chart

    def _load(self, exe_id: str) -> Gen[Any]:
        exe = yield Call("load", (exe_id,))
        if exe is not None and self.copies:
            exe = replace(exe, context=copy.deepcopy(exe.context))
        return exe

    def _commit(
        self, exe: Any, step: Step, event_id: str | None, commit_id: str, trace: dict[str, Any]
    ) -> Gen[bool]:
        """Commit the step; ``False`` when another writer got there first (look again).

        A commit whose outcome is unknown (a lost connection) is retried as it was, with
        its ``commit_id``: if the first try landed, the store recognises the retry.
        """
        args = (exe, step.emits, event_id, step.timers(), (), trace if self.trace else None)
        kwargs = {"commit_id": commit_id}
        for wait in (*UNKNOWN_WAITS, None):
            try:
                yield Call("commit", args, kwargs)
                return True
            except (StoreConflict, IdempotencyConflict):
                # The execution moved on, or this very commit id landed with another body
                # (another process handled the event): either way, look again.
                return False
            except StaleWriter:
                raise
            except StoreError:
                if wait is None:
                    raise
                yield Sleep(wait)
        raise AssertionError("unreachable")

    @staticmethod
    def _after(exe: Any, chart: Any, step: Step, trace: dict[str, Any]) -> Any:
        """``exe`` as the step left it; adds the configuration to ``trace``."""
        read = Chart.read(chart)
        trace["configuration"] = list(read["active_path"])
        return replace(
            exe,
            status=read["status"],
            active_path=read["active_path"],
            history=read["history"],
            context={"model": read["model"], "delayed": step.delayed},
        )

    def _registered(self, cls: Any) -> Chart:
        for chart in self.charts.values():
            if chart.cls is cls:
                return chart
        raise ValueError(f"{cls!r} is not one of the chart classes of these Machines")

    def start(self, exe_id: str, chart_class: Any, data: dict[str, Any]) -> Gen[bool]:
        _check_id(exe_id)
        if STATE in data:
            raise ValueError(f"{STATE!r} is the model attribute of the chart's configuration")
        chart_type = self.default if chart_class is None else self._registered(chart_class)
        if (yield Call("load", (exe_id,))) is not None:
            return False
        step = Step(exe_id, 1, self.clock(), {})
        chart, entered = chart_type.fresh(copy.deepcopy(data), step)
        if isawaitable(entered):
            yield Await(entered)
        exe = Execution(id=exe_id, definition_id=chart_type.name)
        trace = {"event": "__initial__", "via": "start"}
        exe = self._after(exe, chart, step, trace)
        return (yield from self._commit(exe, step, None, "start", trace))

    def send(
        self,
        exe_id: str,
        event: str,
        event_id: str | None,
        data: Mapping[str, Any],
        now: float | None = None,
        via: str = "send",
    ) -> Gen[bool]:
        """Run ``event`` on ``exe_id``; ``False`` when ``event_id`` was processed."""
        _check_id(exe_id)
        commit_id = f"event:{uuid.uuid4().hex if event_id is None else event_id}"
        for _ in range(CONFLICT_RETRIES):
            exe = yield from self._load(exe_id)
            if exe is None:
                raise NoExecution(exe_id)
            if event_id is not None and (yield Call("is_processed", (exe_id, event_id))):
                return False
            at = self.clock() if now is None else now
            step = Step(exe_id, exe.version + 1, at, dict(exe.context.get("delayed", {})))
            chart = self._chart(exe).build(exe, step)
            result = chart.send(event, **data)
            if isawaitable(result):
                yield Await(result)
            trace = {"event": event, "via": via}
            exe = self._after(exe, chart, step, trace)
            if (yield from self._commit(exe, step, event_id, commit_id, trace)):
                return True
        raise _busy(exe_id)

    def fire(self, exe_id: str, path: str, fire_at: float, now: float) -> Gen[None]:
        """Deliver the delayed event of a due timer, in a commit that disarms the timer."""
        for _ in range(CONFLICT_RETRIES):
            exe = yield from self._load(exe_id)
            delayed = {} if exe is None else dict(exe.context.get("delayed", {}))
            entry = delayed.get(path)
            if entry is None:  # delivered or cancelled already: a stray timer
                yield Call("delete_timer", (exe_id, path, fire_at))
                return
            step = Step(exe_id, exe.version + 1, now, delayed)
            step.remove(path)
            trace = {"event": entry["event"], "via": "timer", "timer": path}
            if entry["to"] is not None:  # a delayed send_to: now it goes to the outbox
                step.emit(entry["to"], entry["event"], entry["kwargs"])
                exe = replace(exe, context={**exe.context, "delayed": step.delayed})
                trace["to"] = entry["to"]
            else:
                chart = self._chart(exe).build(exe, step)
                result = chart.send(
                    entry["event"],
                    *entry["args"],
                    delay=0,
                    send_id=entry["send_id"],
                    **entry["kwargs"],
                )
                if isawaitable(result):
                    yield Await(result)
                exe = self._after(exe, chart, step, trace)
            if (yield from self._commit(exe, step, None, f"timer:{path}", trace)):
                return
        raise _busy(exe_id)

    def deliver(self, entry: OutboxEntry, now: float) -> Gen[None]:
        event = entry.event
        target = str(entry.target_id)
        try:
            yield from self.send(
                target, event["event"], event["event_id"], event["data"], now, via="outbox"
            )
        except NoExecution:
            _LOG.warning("dropped event %r for %r: no such execution", event["event"], target)
        yield Call("ack_outbox", (entry.seq,))

    def pump(self, now: float | None) -> Gen[int]:
        """Claim and deliver until nothing is left. Timers this package did not arm and
        outbox entries :func:`send_to` did not make are left alone (leased, unacked): they
        are another relay's."""
        handled = 0
        while True:
            at = self.clock() if now is None else float(now)
            timers = yield Call("claim_due_timers", (at, self.batch), {"lease": self.lease})
            for exe_id, path, fire_at in timers:
                if isinstance(path, str) and path.startswith(DELAYED):
                    yield from self.fire(exe_id, path, fire_at, at)
                    handled += 1
            entries = yield Call("claim_outbox", (self.batch,), {"lease": self.lease})
            for entry in entries:
                if is_envelope(entry.event) and isinstance(entry.target_id, str):
                    yield from self.deliver(entry, at)
                    handled += 1
            if not timers and not entries:
                return handled

    def configuration(self, exe_id: str) -> Gen[frozenset[str]]:
        exe = yield Call("load", (exe_id,))
        if exe is None:
            raise NoExecution(exe_id)
        return frozenset(exe.active_path)

    def data(self, exe_id: str) -> Gen[dict[str, Any]]:
        exe = yield Call("load", (exe_id,))
        if exe is None:
            raise NoExecution(exe_id)
        return copy.deepcopy(dict(exe.context.get("model", {})))


def _busy(exe_id: str) -> StoreError:
    return StoreError(f"execution {exe_id!r} changed under each of {CONFLICT_RETRIES} tries")


def _check_id(exe_id: Any) -> None:
    if not isinstance(exe_id, str):
        raise TypeError(f"an execution id is a str, got {type(exe_id).__name__}")


def run(store: Any, gen: Gen[T]) -> T:
    """Run an operation on a sync store."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            op = gen.send(reply) if error is None else gen.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply, error = None, None
        if isinstance(op, Await):
            # python-statemachine returns an awaitable only inside a running event loop.
            close = getattr(op.awaitable, "close", None)
            if close is not None:
                close()
            error = RuntimeError(
                "a chart with async callbacks, called in a running event loop: use AsyncMachines"
            )
            continue
        try:
            if isinstance(op, Call):
                reply = getattr(store, op.method)(*op.args, **(op.kwargs or {}))
            else:
                time.sleep(op.seconds)
        except Exception as exc:  # noqa: BLE001 - thrown into the operation, which decides
            error = exc


async def run_async(store: Any, gen: Gen[T]) -> T:
    """Run an operation on an async store."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            op = gen.send(reply) if error is None else gen.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply, error = None, None
        try:
            if isinstance(op, Call):
                reply = await getattr(store, op.method)(*op.args, **(op.kwargs or {}))
            elif isinstance(op, Sleep):
                await asyncio.sleep(op.seconds)
            else:
                reply = await op.awaitable
        except Exception as exc:  # noqa: BLE001 - thrown into the operation, which decides
            error = exc
