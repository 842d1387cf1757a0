"""The pure-Python ``DictStore``: the reference implementation, and the fallback where
the compiled ``_store_c`` is not built. ``_store_c.pyx`` mirrors it name for name.

Layout, against the specification's:

- ``_by_id``: id -> the live execution object (as specified).
- ``_outbox``/``_spawns``: :class:`_Fifo`, a deque in seq order; acks at either end pop
  it, and only acks elsewhere bring in a set of the pending seqs, so acks in any order
  are O(1) amortized and the common ones touch nothing but the deque.
- ``_processed``: id -> set of handled event ids, so :meth:`DictStore.forget` can drop an
  execution's marks without scanning the others.
- ``_timers``: id -> {path: entry}, an entry being ``[fire_at, arm order, id, path,
  in heap]``. ``_heap`` orders entries by ``(fire_at, arm order)``; entries armed since
  the last sweep wait in ``_armed`` and join the heap when ``due_timers`` runs, so a
  timer re-armed between sweeps (the common case: every state entry re-arms) is updated
  in place. Re-arming or cancelling a timer already in the heap marks its entry dead
  instead of searching the heap for it; dead entries are dropped when they reach the top
  and everything is rebuilt once they outnumber live ones.
- ``_trace``: id -> :class:`_Ring`, a deque bounded by ``trace_max`` plus the id's next
  monotonic step index.

Every mutating method checks all of its input, and runs all the caller's code (``hash``,
``__eq__``, mapping methods, iterators), before it writes anything. ``commit`` builds the
records it will enqueue while it checks, so what it writes is what it checked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from heapq import heapify, heappop, heappush
from sys import maxsize as _MAX_SIZE
from typing import Any

from ._errors import StoreConflict
from ._records import DEFAULT_TRACE_MAX, OutboxEntry, SpawnEntry, TimerOp

_new = tuple.__new__
_DEAD: Any = object()  # the id slot of a heap entry whose timer is no longer armed
_SLACK = 64  # dead heap entries / acked FIFO entries tolerated before a rebuild
_EMPTY: tuple[Any, ...] = ()
_SCHEDULE = "schedule"
_CANCEL = "cancel"


def _reentered(name: str) -> RuntimeError:
    return RuntimeError(
        f"DictStore.{name}() was called while another call of the same store was running "
        "(from a caller's __hash__, __eq__, iterator or property): one writer at a time"
    )


_EXE_ERRORS = {
    "id": "an execution needs an `id` attribute, got {}",
    "hash": "execution id must be hashable, got {}",
    "version": "an execution needs a `version` attribute, got {}",
    "writable": "the version of {} is not writable",
}


def _bad_exe(problem: str, value: Any) -> TypeError:
    """What ``save`` and ``commit`` raise for an execution they cannot use."""
    return TypeError(_EXE_ERRORS[problem].format(type(value).__name__))


def _hashable(value: Any, what: str, index: int = -1) -> None:
    try:
        hash(value)
    except TypeError:
        what = what % index if index >= 0 else what
        raise TypeError(f"{what} must be hashable, got {type(value).__name__}") from None


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    return int(value)


def _as_time(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a real number (epoch seconds), got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


def _as_trace_max(value: Any) -> int | None:
    if value is None:
        return None
    size = _as_int(value, "trace_max")
    if not 0 <= size <= _MAX_SIZE:
        raise ValueError(f"trace_max must be None or between 0 and {_MAX_SIZE}, got {size}")
    return size


def _snapshot(iterable: Any, what: str) -> tuple[Any, ...]:
    """The items as a tuple, so caller code run later cannot change what was checked."""
    if type(iterable) is tuple:
        return iterable
    if type(iterable) is list:
        return tuple(iterable)
    try:
        iterator = iter(iterable)
    except TypeError:
        raise TypeError(f"{what} must be an iterable, got {type(iterable).__name__}") from None
    return tuple(iterator)


def _outbox_entries(emits: Any, seq: int) -> list[OutboxEntry]:
    """The slow path of ``commit``'s emit check: the records for checked pairs."""
    pairs = _snapshot(emits, "emits")
    return [_new(OutboxEntry, (seq + i + 1, *_emit_pair(item, i))) for i, item in enumerate(pairs)]


def _emit_pair(item: Any, i: int) -> tuple[Any, Any]:
    if type(item) is not tuple or len(item) != 2:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(
                f"emits[{i}] must be a (target_id, event) pair, got {type(item).__name__}"
            )
        item = (item[0], item[1])
    target = item[0]
    if target is not None and type(target) is not str:
        _hashable(target, "emits[%d] target_id", i)
    return item  # type: ignore[no-any-return]


def _timer_ops(ops: tuple[Any, ...]) -> tuple[TimerOp, ...]:
    """The slow path of ``commit``'s timer check: each op made a ``TimerOp`` with an exact
    action and, for a schedule, a finite float ``fire_at``."""
    return tuple([_timer_op(op, i) for i, op in enumerate(ops)])


def _timer_op(op: Any, i: int) -> TimerOp:
    if type(op) is TimerOp:
        action, path, fire_at = op
    else:
        try:
            action, path, fire_at = op.action, op.path, op.fire_at
        except AttributeError:
            raise TypeError(
                f"timers[{i}] must be a TimerOp (action, path, fire_at), got {type(op).__name__}"
            ) from None
    if type(path) is not str:
        _hashable(path, "timers[%d].path", i)
    if action == "schedule":
        if type(fire_at) is not float:
            fire_at = _as_time(fire_at, f"timers[{i}].fire_at")
        if fire_at - fire_at != 0.0:
            raise ValueError(f"timers[{i}].fire_at must be finite, got {fire_at!r}")
        return _new(TimerOp, (_SCHEDULE, path, fire_at))
    if action == "cancel":
        return _new(TimerOp, (_CANCEL, path, None))
    raise ValueError(f"timers[{i}].action must be 'schedule' or 'cancel', got {action!r}")


def _spawn_entries(spawns: Any, parent_id: Any, seq: int) -> list[SpawnEntry]:
    """The slow path of ``commit``'s spawn check: the records for checked triples."""
    items: list[SpawnEntry] = []
    for item in _snapshot(spawns, "spawns"):
        i = len(items)
        if (type(item) is not tuple or len(item) != 3) and (
            not isinstance(item, (tuple, list)) or len(item) != 3
        ):
            raise TypeError(
                f"spawns[{i}] must be a (child_id, root_path, context) triple, got {type(item).__name__}"
            )
        child_id, root_path, context = item
        if type(child_id) is not str:
            _hashable(child_id, "spawns[%d] child_id", i)
        if type(context) is dict:
            context = context.copy()
        elif isinstance(context, Mapping):
            context = dict(context)
        else:
            raise TypeError(f"spawns[{i}] context must be a mapping, got {type(context).__name__}")
        items.append(_new(SpawnEntry, (seq + i + 1, parent_id, child_id, root_path, context)))
    return items


def _trace_step(entry: Any, what: str) -> dict[Any, Any]:
    if type(entry) is dict:
        return entry.copy()
    if isinstance(entry, Mapping):
        return dict(entry)
    raise TypeError(f"{what} must be a mapping, got {type(entry).__name__}")


class _Fifo:
    """Pending entries in seq order.

    Dense (``live`` is None): the deque holds exactly the pending entries, so an ack of
    either end is a pop and a seq outside the two ends is not pending. An ack anywhere
    else makes it sparse: ``live`` becomes the set of pending seqs, and acked entries
    stay in the deque until they reach its head or outnumber the pending ones, when the
    deque is rebuilt. Emptied or rebuilt, it is dense again. Every ack is O(1) amortized,
    whatever the order, and memory stays proportional to what is pending.
    """

    __slots__ = ("entries", "live")

    def __init__(self) -> None:
        self.entries: deque[Any] = deque()
        self.live: set[int] | None = None

    def __len__(self) -> int:
        return len(self.entries) if self.live is None else len(self.live)

    def pending(self) -> list[Any]:
        live = self.live
        if live is None:
            return list(self.entries)
        return [e for e in self.entries if e[0] in live]

    def ack(self, seq: Any) -> None:
        entries = self.entries
        live = self.live
        if live is None and entries:
            # A relay acks with the seq of the entry it read: the very int stored here,
            # recognised without reading it.
            if seq is entries[0][0]:
                entries.popleft()
                return
            if seq is entries[-1][0]:
                entries.pop()
                return
        if type(seq) is not int:
            seq = _as_int(seq, "seq")
        if live is None:
            if not entries:
                return
            if seq == entries[0][0]:
                entries.popleft()
                return
            if seq == entries[-1][0]:
                entries.pop()
                return
            if not entries[0][0] < seq < entries[-1][0]:
                return
            self.live = live = {e[0] for e in entries}
        if seq not in live:
            return
        live.remove(seq)
        while entries and entries[0][0] not in live:
            entries.popleft()
        # Dense again only when empty or rebuilt: both follow at least as many acks as
        # the set cost to build, so acks that keep landing in the middle stay O(1).
        if not live:
            self.live = None
        elif len(entries) > 2 * len(live) + _SLACK:
            self.entries = deque([e for e in entries if e[0] in live])
            self.live = None


class _Ring:
    """One execution's recent trace steps, and the index its next step gets."""

    __slots__ = ("next_index", "steps")

    def __init__(self, maxlen: int | None) -> None:
        self.steps: deque[dict[Any, Any]] = deque(maxlen=maxlen)
        self.next_index = 0


class DictStore:
    """The in-memory ``ExecutionStore``: ``load`` returns the very object that was saved.

    One writer at a time; see the README on concurrency.
    """

    __slots__ = (
        "_armed",
        "_busy",
        "_by_id",
        "_heap",
        "_maxlen",
        "_mixed",
        "_n_dead",
        "_n_marks",
        "_n_steps",
        "_n_timers",
        "_outbox",
        "_processed",
        "_seq",
        "_spawn_seq",
        "_spawns",
        "_timer_seq",
        "_timers",
        "_trace",
        "_trace_max",
    )

    def __init__(self, *, trace_max: int | None = DEFAULT_TRACE_MAX) -> None:
        self._busy = False
        self._mixed = False  # a key that is not an exact str was stored: lookups may run code
        self.trace_max = trace_max
        self._by_id: dict[Hashable, Any] = {}
        self._outbox = _Fifo()
        self._processed: dict[Hashable, set[Hashable]] = {}
        self._timers: dict[Hashable, dict[Hashable, list[Any]]] = {}
        self._heap: list[list[Any]] = []
        self._armed: list[list[Any]] = []
        self._spawns = _Fifo()
        self._trace: dict[Hashable, _Ring] = {}
        self._seq = 0
        self._spawn_seq = 0
        self._timer_seq = 0
        self._n_marks = 0
        self._n_timers = 0
        self._n_dead = 0
        self._n_steps = 0

    @property
    def trace_max(self) -> int | None:
        """Steps kept per execution; ``0``/``None`` keeps all. A change applies to an
        execution's ring at its next append."""
        return self._trace_max

    @trace_max.setter
    def trace_max(self, value: int | None) -> None:
        if self._busy:
            raise _reentered("trace_max")
        self._busy = True
        try:
            self._trace_max = _as_trace_max(value)
            self._maxlen = self._trace_max or None
        finally:
            self._busy = False

    def load(self, execution_id: Hashable) -> Any:
        """The live object saved under ``execution_id``, or ``None``: no copy."""
        return self._by_id.get(execution_id)

    def save(self, exe: Any) -> None:
        """CAS-write ``exe`` and bump ``exe.version``.

        Raises :class:`StoreConflict` when a *different* object is stored under
        ``exe.id`` at a *different* version.
        """
        # commit's CAS, alone: save is called on its own often enough to skip the rest.
        if self._busy:
            raise _reentered("save")
        self._busy = True
        try:
            try:
                eid = exe.id
            except AttributeError:
                raise _bad_exe("id", exe) from None
            by_id = self._by_id
            try:
                prev = by_id.get(eid)
            except TypeError:
                raise _bad_exe("hash", eid) from None
            try:
                version = exe.version
            except AttributeError:
                raise _bad_exe("version", exe) from None
            if type(version) is not int:
                version = _as_int(version, "execution version")
            if prev is not exe and prev is not None:
                found = prev.version
                if found != version:
                    raise StoreConflict(eid, version, found)
            try:
                exe.version = version + 1
            except AttributeError:
                raise _bad_exe("writable", exe) from None
            if prev is not exe:
                by_id[eid] = exe
        finally:
            self._busy = False

    def commit(
        self,
        exe: Any,
        emits: Iterable[tuple[Hashable | None, Any]],
        processed_event_id: Hashable | None = None,
        timers: Iterable[TimerOp] = (),
        spawns: Iterable[tuple[Hashable, Any, Mapping[Any, Any]]] = (),
        trace: Mapping[str, Any] | None = None,
    ) -> None:
        """The event-boundary write: save ``exe`` (CAS), then enqueue ``emits``, mark
        ``processed_event_id``, apply ``timers``, enqueue ``spawns``, record ``trace``.

        All or nothing: on bad input (``TypeError``/``ValueError`` naming the item) or a
        :class:`StoreConflict`, neither the store nor ``exe.version`` changes.
        """
        if self._busy:
            raise _reentered("commit")
        self._busy = True
        try:
            try:
                eid = exe.id
            except AttributeError:
                raise _bad_exe("id", exe) from None
            # Check everything, building the records as we go: what is written later is
            # what was checked, whatever caller code runs in between. The loops are the
            # exact-type fast paths; anything else takes the slow path.
            seq = self._seq
            out: list[OutboxEntry] | tuple[()] | None
            if emits is _EMPTY:
                out = _EMPTY
            elif type(emits) is list or type(emits) is tuple:
                out = []
                try:
                    for item in emits:
                        if type(item) is not tuple:
                            out = None
                            break
                        target, event = item
                        if target is not None and type(target) is not str:
                            out = None
                            break
                        seq += 1
                        out.append(_new(OutboxEntry, (seq, target, event)))
                except ValueError:  # an item that is not a pair: the slow path names it
                    out = None
            else:
                out = None
            if out is None:
                out = _outbox_entries(emits, self._seq)
                seq = self._seq + len(out)
            str_keys = type(eid) is str  # every key a str: lookups run no caller code
            if processed_event_id is not None and type(processed_event_id) is not str:
                _hashable(processed_event_id, "processed_event_id")
                str_keys = False
            ops: tuple[Any, ...] = _EMPTY
            one = None
            if timers is not _EMPTY:
                if (type(timers) is list or type(timers) is tuple) and len(timers) == 1:
                    # One op, the common case, is unpacked once into locals: no snapshot
                    # and no loop. Anything unusual about it takes the general path below.
                    one = timers[0]
                    if type(one) is not TimerOp:
                        one = None
                    else:
                        action, path, fire_at = one
                        if type(path) is not str:
                            one = None
                        elif action is _SCHEDULE:
                            if type(fire_at) is not float or fire_at - fire_at != 0.0:
                                one = None
                        elif action is not _CANCEL:
                            one = None
                if one is None:
                    ops = tuple(timers) if type(timers) is list else _snapshot(timers, "timers")
                    for op in ops:
                        # Actions are compared by identity: string constants in a caller's
                        # code are interned; any other action takes the slow path.
                        if type(op) is not TimerOp or type(op[1]) is not str:
                            ops = _timer_ops(ops)
                            str_keys = False
                            break
                        if op[0] is _SCHEDULE:
                            fire_at = op[2]
                            if type(fire_at) is not float or fire_at - fire_at != 0.0:
                                ops = _timer_ops(ops)
                                str_keys = False
                                break
                        elif op[0] is not _CANCEL:
                            ops = _timer_ops(ops)
                            str_keys = False
                            break
            spawn_seq = self._spawn_seq
            born: list[SpawnEntry] | tuple[()] | None
            if spawns is _EMPTY:
                born = _EMPTY
            elif type(spawns) is list or type(spawns) is tuple:
                # Exact dicts are copied here: dict.copy runs no caller code.
                born = []
                try:
                    for item in spawns:
                        if type(item) is not tuple:
                            born = None
                            break
                        child_id, root_path, context = item
                        if type(child_id) is not str or type(context) is not dict:
                            born = None
                            break
                        spawn_seq += 1
                        born.append(
                            _new(SpawnEntry, (spawn_seq, eid, child_id, root_path, context.copy()))
                        )
                except ValueError:
                    born = None
            else:
                born = None
            if born is None:
                born = _spawn_entries(spawns, eid, self._spawn_seq)
                spawn_seq = self._spawn_seq + len(born)
            if trace is None:
                step = None
            else:
                step = trace.copy() if type(trace) is dict else _trace_step(trace, "trace")
                stamp = "index" not in step

            # CAS, read as late as possible so no caller code runs between check and write.
            by_id = self._by_id
            try:
                prev = by_id.get(eid)
            except TypeError:
                raise _bad_exe("hash", eid) from None
            try:
                version = exe.version
            except AttributeError:
                raise _bad_exe("version", exe) from None
            if type(version) is not int:
                version = _as_int(version, "execution version")
            if prev is not exe and prev is not None:
                found = prev.version
                if found != version:
                    raise StoreConflict(eid, version, found)
            if not str_keys or self._mixed:
                self._probe(eid, processed_event_id, ops if one is None else (one,))
                self._mixed = True
            try:
                exe.version = version + 1
            except AttributeError:
                raise _bad_exe("writable", exe) from None
            if prev is not exe:
                by_id[eid] = exe

            if out:
                fifo = self._outbox
                fifo.entries.extend(out)
                if fifo.live is not None:
                    fifo.live.update(range(self._seq + 1, seq + 1))
                self._seq = seq
            if processed_event_id is not None:
                marks = self._processed.get(eid)
                if marks is None:
                    self._processed[eid] = {processed_event_id}
                    self._n_marks += 1
                elif processed_event_id not in marks:
                    marks.add(processed_event_id)
                    self._n_marks += 1
            if one is not None:
                paths = self._timers.get(eid)
                old = None if paths is None else paths.get(path)
                if old is not None and action is _SCHEDULE and not old[4]:
                    self._timer_seq = n = self._timer_seq + 1
                    old[0] = fire_at  # not in the heap yet: re-arm in place
                    old[1] = n
                else:
                    ops = (one,)
            if ops:
                timers_ = self._timers
                paths = timers_.get(eid)
                if paths is None:
                    timers_[eid] = paths = {}
                died = False
                for op in ops:
                    path = op[1]
                    old = paths.get(path)
                    if op[0] is _CANCEL:
                        if old is not None:
                            del paths[path]
                            old[2] = _DEAD
                            self._n_dead += 1
                            self._n_timers -= 1
                            died = True
                        continue
                    self._timer_seq = n = self._timer_seq + 1
                    if old is None:
                        self._n_timers += 1
                    elif not old[4]:
                        old[0] = op[2]  # not in the heap yet: re-arm in place
                        old[1] = n
                        continue
                    else:
                        old[2] = _DEAD
                        self._n_dead += 1
                        died = True
                    entry = [op[2], n, eid, path, False]
                    paths[path] = entry
                    self._armed.append(entry)
                if died:
                    if not paths:
                        del timers_[eid]
                    if self._n_dead > self._n_timers + _SLACK:
                        self._compact_timers()
            if born:
                fifo = self._spawns
                fifo.entries.extend(born)
                if fifo.live is not None:
                    fifo.live.update(range(self._spawn_seq + 1, spawn_seq + 1))
                self._spawn_seq = spawn_seq
            if step is not None:
                # _push_step, inlined: this is the hot path.
                ring = self._trace.get(eid)
                maxlen = self._maxlen
                if ring is None or ring.steps.maxlen != maxlen:
                    ring = self._ring(eid)
                index = ring.next_index
                ring.next_index = index + 1
                if stamp:
                    step["index"] = index
                steps = ring.steps
                if len(steps) != maxlen:
                    self._n_steps += 1
                steps.append(step)
        finally:
            self._busy = False

    def is_processed(self, execution_id: Hashable, event_id: Hashable) -> bool:
        """Whether a commit of ``execution_id`` recorded ``event_id`` as handled."""
        marks = self._processed.get(execution_id)
        return marks is not None and event_id in marks

    def pending_outbox(self) -> list[OutboxEntry]:
        """A copy of the unacked outbox entries, oldest first."""
        return self._outbox.pending()

    def ack_outbox(self, seq: int) -> None:
        """Drop the outbox entry ``seq``; an unknown or already-acked seq is a no-op."""
        if self._busy:
            raise _reentered("ack_outbox")
        self._busy = True
        try:
            self._outbox.ack(seq)
        finally:
            self._busy = False

    def pending_spawns(self) -> list[SpawnEntry]:
        """A copy of the unacked spawn intents, oldest first."""
        return self._spawns.pending()

    def ack_spawn(self, seq: int) -> None:
        """Drop the spawn intent ``seq``; an unknown or already-acked seq is a no-op."""
        if self._busy:
            raise _reentered("ack_spawn")
        self._busy = True
        try:
            self._spawns.ack(seq)
        finally:
            self._busy = False

    def due_timers(self, now: float) -> list[tuple[Hashable, Hashable, float]]:
        """``(execution_id, path, fire_at)`` of every armed timer with ``fire_at <= now``,
        oldest ``fire_at`` first (ties in arming order). Timers stay armed until
        :meth:`delete_timer`. Costs in proportion to the due timers."""
        if type(now) is not float:
            now = _as_time(now, "now")
        if self._armed:
            self._heap_armed()
        heap = self._heap
        while heap and heap[0][2] is _DEAD:
            heappop(heap)
            self._n_dead -= 1
        if not heap or not heap[0][0] <= now:
            return []
        size = len(heap)
        due = []
        stack = [0]
        while stack:
            i = stack.pop()
            entry = heap[i]
            if entry[2] is not _DEAD:
                due.append(entry)
            child = 2 * i + 1
            if child < size and heap[child][0] <= now:
                stack.append(child)
            child += 1
            if child < size and heap[child][0] <= now:
                stack.append(child)
        due.sort()
        return [(e[2], e[3], e[0]) for e in due]

    def delete_timer(self, execution_id: Hashable, path: Hashable, fire_at: float) -> None:
        """Disarm the timer only if it still fires at ``fire_at``, so a sweep that read it
        before a re-arm cannot delete the re-armed timer."""
        if self._busy:
            raise _reentered("delete_timer")
        self._busy = True
        try:
            paths = self._timers.get(execution_id)
            if paths is None:
                return
            entry = paths.get(path)
            # `not ==`, as the specification compares, for fire_at objects with their own __eq__
            if entry is None or not entry[0] == fire_at or entry[2] is _DEAD:  # noqa: SIM201
                return
            del paths[path]
            if not paths:
                del self._timers[execution_id]
            entry[2] = _DEAD
            self._n_timers -= 1
            self._n_dead += 1
            if self._n_dead > self._n_timers + _SLACK:
                self._compact_timers()
        finally:
            self._busy = False

    def append_trace(self, execution_id: Hashable, entry: Mapping[str, Any]) -> None:
        """Record a trace step for ``execution_id`` outside a commit."""
        self._record_trace(execution_id, entry)

    def read_trace(self, execution_id: Hashable) -> list[dict[str, Any]]:
        """A copy of the recent steps of ``execution_id``, oldest first (or ``[]``)."""
        ring = self._trace.get(execution_id)
        return [] if ring is None else list(ring.steps)

    def forget(self, execution_id: Hashable) -> None:
        """Drop an execution with its processed marks, armed timers, trace ring and
        trace index, in time proportional to what it holds. Pending outbox and spawn
        entries stay: they are owed to a relay. An unknown id is a no-op."""
        if self._busy:
            raise _reentered("forget")
        self._busy = True
        try:
            # Every lookup before the first pop: an id that collides with this one in
            # any table runs its __eq__ here, and if that raises nothing is dropped.
            tables = (self._by_id, self._processed, self._timers, self._trace)
            if not any([execution_id in table for table in tables]):  # noqa: C419 - no short cut
                return
            self._by_id.pop(execution_id, None)
            marks = self._processed.pop(execution_id, None)
            if marks is not None:
                self._n_marks -= len(marks)
            paths = self._timers.pop(execution_id, None)
            if paths is not None:
                for entry in paths.values():
                    entry[2] = _DEAD
                self._n_timers -= len(paths)
                self._n_dead += len(paths)
                if self._n_dead > self._n_timers + _SLACK:
                    self._compact_timers()
            ring = self._trace.pop(execution_id, None)
            if ring is not None:
                self._n_steps -= len(ring.steps)
        finally:
            self._busy = False

    def stats(self) -> dict[str, int]:
        """Counts for monitoring, each O(1)."""
        return {
            "executions": len(self._by_id),
            "outbox": len(self._outbox),
            "spawns": len(self._spawns),
            "timers": self._n_timers,
            "processed": self._n_marks,
            "traces": len(self._trace),
            "trace_steps": self._n_steps,
        }

    def close(self) -> None:
        """Nothing to release: the store lives and dies with the process."""

    def _record_trace(self, execution_id: Hashable, entry: Mapping[str, Any]) -> None:
        if self._busy:
            raise _reentered("append_trace")
        self._busy = True
        try:
            step = _trace_step(entry, "trace entry")
            stamp = "index" not in step
            if type(execution_id) is not str:
                _hashable(execution_id, "execution_id")
                self._mixed = True
            self._push_step(execution_id, step, stamp)
        finally:
            self._busy = False

    def _probe(
        self, eid: Hashable, processed_event_id: Hashable | None, ops: tuple[TimerOp, ...]
    ) -> None:
        """Run the key lookups a commit is about to make, before it writes: where a
        caller's key collides with a stored one, the ``__eq__`` of either runs and may
        raise. Needed once any key is not an exact str (``_mixed``): two strs compare
        without running code."""
        _ = eid in self._trace
        marks = self._processed.get(eid)
        if marks is not None and processed_event_id is not None:
            _ = processed_event_id in marks
        paths = self._timers.get(eid)
        if paths:
            for op in ops:
                _ = op[1] in paths

    def _heap_armed(self) -> None:
        """Move the timers armed since the last sweep into the heap."""
        heap = self._heap
        armed = [e for e in self._armed if e[2] is not _DEAD]
        self._n_dead -= len(self._armed) - len(armed)
        self._armed = []
        for entry in armed:
            entry[4] = True
        if len(armed) > len(heap):
            heap.extend(armed)
            heapify(heap)
        else:
            for entry in armed:
                heappush(heap, entry)

    def _compact_timers(self) -> None:
        heap = [e for e in self._heap if e[2] is not _DEAD]
        heapify(heap)
        self._heap = heap
        self._armed = [e for e in self._armed if e[2] is not _DEAD]
        self._n_dead = 0

    def _push_step(self, execution_id: Hashable, step: dict[Any, Any], stamp: bool) -> None:
        ring = self._trace.get(execution_id)
        if ring is None or ring.steps.maxlen != self._maxlen:
            ring = self._ring(execution_id)
        index = ring.next_index
        ring.next_index = index + 1
        if stamp:
            step["index"] = index
        steps = ring.steps
        if len(steps) != self._maxlen:
            self._n_steps += 1
        steps.append(step)

    def _ring(self, execution_id: Hashable) -> _Ring:
        """The ring of ``execution_id``, created, or re-cut to a changed ``trace_max``."""
        ring = self._trace.get(execution_id)
        if ring is None:
            self._trace[execution_id] = ring = _Ring(self._maxlen)
        else:
            kept = deque(ring.steps, maxlen=self._maxlen)
            self._n_steps += len(kept) - len(ring.steps)
            ring.steps = kept
        return ring
