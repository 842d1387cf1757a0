"""python-statemachine's ``StateChart`` kept in any store: ``Machines(store, chart_class)``.

Needs python-statemachine 3 (``pip install 'harel-store[statemachine]'``); without it,
importing this module raises ``ImportError`` saying so, and ``import harel_store`` never
imports it.

One execution per chart instance. Every call loads the execution, builds the chart in its
configuration without running any action, guard or entry/exit callback, runs one step of
python-statemachine and writes all of it in one ``commit``:

- the execution: ``active_path`` holds the active state ids in the chart's own order,
  ``history`` what each history state remembers (state ids), ``status`` is
  ``"completed"`` once a top-level final state is reached, ``definition_id`` is the chart
  class's ``name``, and ``context`` is ``{"model": ..., "delayed": ...}``: the attributes
  of the chart's model (all but ``state``) and the delayed events not yet delivered;
- the event's id as the processed mark (``event:<id>`` as the ``commit_id``);
- a timer (``TimerOp``) for each delayed event the step sent (``send(..., delay=...)``, in
  milliseconds as python-statemachine counts), cancelled by ``cancel_event``;
- an outbox entry for each event sent to another execution with :func:`send_to`;
- a trace step: the event, how it came (``send``, ``timer``, ``outbox``, ``start``) and
  the configuration after it.

:meth:`Machines.pump` delivers due timers and outbox entries, each in a commit of its
target that also disarms the timer or marks the entry's event processed, so a delivery
repeated after a kill changes nothing. Nothing of a step stays in the process between two
calls, so any number of processes may share a durable store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

from .._records import OutboxEntry, TimerOp
from ._chart import send_to
from ._core import Core, run, run_async

__all__ = ["AsyncChartStore", "AsyncMachines", "ChartStore", "Machines", "send_to"]


class ChartStore(Protocol):
    """The store methods :class:`Machines` calls; every sync store of this package has
    them."""

    def load(self, execution_id: str) -> Any: ...
    def commit(
        self,
        exe: Any,
        emits: list[tuple[str, Any]],
        processed_event_id: str | None = None,
        timers: list[TimerOp] = ...,
        spawns: tuple[()] = (),
        trace: dict[str, Any] | None = None,
        *,
        commit_id: str | None = None,
    ) -> None: ...
    def is_processed(self, execution_id: str, event_id: str) -> bool: ...
    def claim_outbox(self, limit: int = ..., *, lease: float = ...) -> list[OutboxEntry]: ...
    def ack_outbox(self, seq: int) -> None: ...
    def claim_due_timers(
        self, now: float, limit: int = ..., *, lease: float = ...
    ) -> Sequence[tuple[Hashable, Hashable, float]]: ...
    def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None: ...


class AsyncChartStore(Protocol):
    """The store methods :class:`AsyncMachines` awaits; every async store of this package
    has them."""

    async def load(self, execution_id: str) -> Any: ...
    async def commit(
        self,
        exe: Any,
        emits: list[tuple[str, Any]],
        processed_event_id: str | None = None,
        timers: list[TimerOp] = ...,
        spawns: tuple[()] = (),
        trace: dict[str, Any] | None = None,
        *,
        commit_id: str | None = None,
    ) -> None: ...
    async def is_processed(self, execution_id: str, event_id: str) -> bool: ...
    async def claim_outbox(self, limit: int = ..., *, lease: float = ...) -> list[OutboxEntry]: ...
    async def ack_outbox(self, seq: int) -> None: ...
    async def claim_due_timers(
        self, now: float, limit: int = ..., *, lease: float = ...
    ) -> Sequence[tuple[Hashable, Hashable, float]]: ...
    async def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None: ...


class Machines:
    """The charts of ``chart_class``, and of the other ``charts`` classes whose executions
    share ``store`` (those they send events to), kept in ``store``.

    ``clock`` gives the time of a step in epoch seconds (a delayed event fires at that
    time plus its delay); ``lease`` is how long :meth:`pump` holds what it claims (what a
    killed process claimed is delivered once its lease runs out); ``batch`` is how many
    timers or outbox entries one claim takes; ``trace=False`` records no trace steps.
    """

    def __init__(
        self,
        store: ChartStore,
        chart_class: type[Any],
        *charts: type[Any],
        clock: Callable[[], float] = time.time,
        lease: float = 30.0,
        batch: int = 100,
        trace: bool = True,
    ) -> None:
        self.store = store
        copies = bool(getattr(store, "preserves_identity", True))
        self._core = Core(chart_class, charts, clock, lease, batch, trace, copies)

    def start(self, id: str, *, chart: type[Any] | None = None, **data: Any) -> bool:
        """Create the execution ``id``: a chart of class ``chart`` (by default the first
        class) with ``data`` as its model's attributes, in its initial configuration,
        committed with what entering it sent. ``False``, changing nothing, when ``id``
        exists already."""
        return run(self.store, self._core.start(id, chart, data))

    def send(self, id: str, event: str, *, event_id: str | None = None, **data: Any) -> bool:
        """Send ``event`` to the chart of ``id`` (with ``data``, as python-statemachine's
        ``send`` takes keywords) and commit the whole step at once, marking ``event_id``
        processed. ``False``, changing nothing, when ``event_id`` was processed already:
        repeated with its ``event_id``, a send happens once. ``KeyError`` when there is
        no execution ``id``."""
        return run(self.store, self._core.send(id, event, event_id, data))

    def pump(self, now: float | None = None) -> int:
        """Deliver the delayed events due at ``now`` (by default the clock's time) and the
        events of :func:`send_to`, claiming them, until none is left; return how many."""
        return run(self.store, self._core.pump(now))

    def configuration(self, id: str) -> frozenset[str]:
        """The ids of the active states of ``id``."""
        return run(self.store, self._core.configuration(id))

    def data(self, id: str) -> dict[str, Any]:
        """A copy of the model data of ``id``."""
        return run(self.store, self._core.data(id))


class AsyncMachines:
    """:class:`Machines` on an async store; a chart with ``async`` callbacks runs on
    python-statemachine's async engine."""

    def __init__(
        self,
        store: AsyncChartStore,
        chart_class: type[Any],
        *charts: type[Any],
        clock: Callable[[], float] = time.time,
        lease: float = 30.0,
        batch: int = 100,
        trace: bool = True,
    ) -> None:
        self.store = store
        copies = bool(getattr(store, "preserves_identity", True))
        self._core = Core(chart_class, charts, clock, lease, batch, trace, copies)

    async def start(self, id: str, *, chart: type[Any] | None = None, **data: Any) -> bool:
        """:meth:`Machines.start`."""
        return await run_async(self.store, self._core.start(id, chart, data))

    async def send(self, id: str, event: str, *, event_id: str | None = None, **data: Any) -> bool:
        """:meth:`Machines.send`."""
        return await run_async(self.store, self._core.send(id, event, event_id, data))

    async def pump(self, now: float | None = None) -> int:
        """:meth:`Machines.pump`."""
        return await run_async(self.store, self._core.pump(now))

    async def configuration(self, id: str) -> frozenset[str]:
        """:meth:`Machines.configuration`."""
        return await run_async(self.store, self._core.configuration(id))

    async def data(self, id: str) -> dict[str, Any]:
        """:meth:`Machines.data`."""
        return await run_async(self.store, self._core.data(id))
