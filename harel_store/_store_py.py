"""The pure-Python ``DictStore``: the reference implementation, and the fallback where
the compiled ``_store_c`` is not built. ``_store_c.pyx`` mirrors it name for name.

Layout, against the specification's:

- ``_slots``: id -> :class:`_Slot`, everything the store holds for one execution: the
  live object (as the specification's ``_by_id``), its processed marks, armed timers,
  trace ring, commit ids and writer epoch. One lookup finds all of it, and one dict entry
  is all that a write adds or :meth:`DictStore.forget` removes under a caller's key.
- ``_outbox``/``_spawns``: :class:`_Fifo`, a deque in seq order; acks at either end pop
  it, and only acks elsewhere bring in a set of the pending seqs, so acks in any order
  are O(1) amortized and the common ones touch nothing but the deque. The first claim
  adds what claims need (the never-claimed entries, the live leases).
- timers: each slot maps path -> entry, an entry being ``[fire_at, arm order, id, path,
  in heap]``. ``_heap`` orders entries by ``(fire_at, arm order)``; entries armed since
  the last sweep wait in ``_armed`` and join the heap when a sweep runs, so a timer
  re-armed between sweeps (the common case: every state entry re-arms) is updated in
  place. Re-arming or cancelling a timer already in the heap marks its entry dead
  instead of searching the heap for it; dead entries are dropped when they reach the top
  and everything is rebuilt once they outnumber live ones. A claimed timer waits in
  ``_leased`` until its lease runs out.

All or nothing: every mutating method checks its input and runs the caller's code
(``hash``, ``__eq__``, mapping methods, iterators, properties) before it writes. The only
caller code left in a write phase is one insert under a caller's key (a new slot, or a
processed mark) and the ``version`` setter; the insert comes first, and if the setter
raises it is undone with ``dict.popitem``, which removes the last insert without hashing.
Timer paths that are not exact ``str`` (whose lookups could run code) are changed on a
copy of the execution's timer table, made before the first write.
"""

from __future__ import annotations

import typing
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from copy import deepcopy
from heapq import heapify, heappop, heappush
from math import isnan
from time import monotonic, sleep
from typing import Any

from . import _checks, _operate, _transfer
from ._errors import IdempotencyConflict, StaleWriter, StoreConflict
from ._errors import shown as _shown
from ._listing import Listing as _Listing
from ._records import DEFAULT_TRACE_MAX, OutboxEntry, SpawnEntry, TimerOp
from ._records import Execution as _Exe

if typing.TYPE_CHECKING:  # Self is in typing from Python 3.11 on
    from typing_extensions import Self

    from ._errors import StoreError
    from ._records import Commit

_new = tuple.__new__
_DEAD: Any = object()  # the id slot of a timer entry that is no longer armed
_SLACK = 64  # dead or stale entries tolerated before a rebuild
_EMPTY: tuple[Any, ...] = ()
_INF = float("inf")
_NEG_INF = -_INF  # a finite float is strictly between: no float is made to check it
_SCHEDULE = "schedule"
_CANCEL = "cancel"
_STAMP = 0.001  # how long one stamp serves: marks, commit ids and entries are timed to it
_reentered = _checks.reentered
_bad_exe = _checks.bad_exe


class _Fifo:
    """Pending entries in seq order.

    Dense (``live`` is None): the deque holds exactly the pending entries, so an ack of
    either end is a pop and a seq outside the two ends is not pending. An ack anywhere
    else makes it sparse: ``live`` becomes the set of pending seqs, and acked entries
    stay in the deque until they reach its head or outnumber the pending ones, when the
    deque is rebuilt. Emptied or rebuilt, it is dense again. Every ack is O(1) amortized,
    whatever the order, and memory stays proportional to what is pending.

    ``stamps``: ``(seq, time)`` in seq order: the entries from ``seq`` up to the next
    stamp's were committed at ``time`` or within the millisecond after it, on the
    store's clock. Kept in step with what is pending.

    Claims: the first one keeps ``live`` for good and adds ``fresh``, the entries never
    claimed, in seq order; ``leases``, seq -> (expiry, entry) of the live leases;
    ``expiries``, a heap of (expiry, seq) that may hold leases already ended; and
    ``retry``, a heap of (seq, entry) whose lease ran out. A claim takes the lower seq of
    ``fresh`` and ``retry`` each time, so it costs in proportion to what it returns plus
    the leases that ran out and the acked entries it passes, each passed once.
    """

    __slots__ = ("entries", "expiries", "fresh", "leases", "live", "retry", "stamps")

    def __init__(self) -> None:
        self.entries: deque[Any] = deque()
        self.stamps: deque[tuple[int, float]] = deque()
        self.live: set[int] | None = None
        self.fresh: deque[Any] | None = None
        self.leases: dict[int, tuple[float, Any]] = {}
        self.expiries: list[tuple[float, int]] = []
        self.retry: list[tuple[int, Any]] = []

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
                if not entries:
                    self.drained()
                return
            if seq is entries[-1][0]:
                entries.pop()
                if not entries:
                    self.drained()
                return
        if type(seq) is not int:
            seq = _checks.as_int(seq, "seq")
        if live is None:
            if not entries:
                return
            if seq == entries[0][0]:
                entries.popleft()
                if not entries:
                    self.drained()
                return
            if seq == entries[-1][0]:
                entries.pop()
                if not entries:
                    self.drained()
                return
            if not entries[0][0] < seq < entries[-1][0]:
                return
            self.live = live = {e[0] for e in entries}
        if seq not in live:
            return
        live.remove(seq)
        while entries and entries[0][0] not in live:
            entries.popleft()
        fresh = self.fresh
        if fresh is not None:
            self.leases.pop(seq, None)
            limit = 2 * len(live) + _SLACK
            if len(fresh) > limit:
                self.fresh = deque([e for e in fresh if e[0] in live])
            if len(self.retry) > limit:
                self.retry = [r for r in self.retry if r[0] in live]
                heapify(self.retry)
        # Dense again only when empty or rebuilt: both follow at least as many acks as
        # the set cost to build, so acks that keep landing in the middle stay O(1).
        if not live:
            self.drained()
            if fresh is None:
                self.live = None
        elif len(entries) > 2 * len(live) + _SLACK:
            self.entries = deque([e for e in entries if e[0] in live])
            if fresh is None:
                self.live = None

    def drained(self) -> None:
        """Nothing is pending: only the last stamp may time an entry (one still to come)."""
        stamps = self.stamps
        while len(stamps) > 1:
            stamps.popleft()

    def stamp(self, first: int, now: float) -> None:
        """The entries from ``first`` on were committed at ``now``."""
        stamps = self.stamps
        if not self.entries:
            stamps.clear()  # none is pending: no stamp times anything
        elif stamps[-1][0] == first:
            stamps.pop()  # no entry came under the previous one
        stamps.append((first, now))
        if len(stamps) > 2 * len(self.entries) + 8:
            self.compact()

    def compact(self) -> None:
        """Keep only the stamps that time a pending entry, and the last."""
        live = self.live
        stamps = list(self.stamps)
        kept: deque[tuple[int, float]] = deque()
        i = 0
        for entry in self.entries:
            seq = entry[0]
            if live is not None and seq not in live:
                continue
            while i + 1 < len(stamps) and stamps[i + 1][0] <= seq:
                i += 1
            if stamps and (not kept or kept[-1] is not stamps[i]):
                kept.append(stamps[i])
        if stamps and (not kept or kept[-1] is not stamps[-1]):
            kept.append(stamps[-1])  # the entries still to come are under it
        self.stamps = kept

    def oldest(self) -> float | None:
        """When the oldest pending entry was committed, ``None`` when none is."""
        entries = self.entries
        stamps = self.stamps
        if not entries:
            return None
        first = entries[0][0]  # the head is always pending
        while len(stamps) > 1 and stamps[1][0] <= first:
            stamps.popleft()
        return stamps[0][1] if stamps else None

    def leased(self, clock: float) -> tuple[int, int]:
        """How many pending entries a lease holds at ``clock``, and how many a lease
        held that ran out unacked."""
        live = self.live
        if live is None:  # never claimed
            return 0, 0
        held = expired = 0
        for seq, (until, _) in self.leases.items():
            if seq in live:
                if until > clock:
                    held += 1
                else:
                    expired += 1
        leases = self.leases
        for seq, _ in self.retry:
            if seq in live and seq not in leases:
                expired += 1
        return held, expired

    def claim(self, limit: int, until: float, now: float) -> list[Any]:
        """Lease up to ``limit`` entries until ``until``, oldest first, skipping those
        whose lease is live at ``now``."""
        if self.fresh is None:
            if self.live is None:
                self.live = {e[0] for e in self.entries}
            self.fresh = deque(self.pending())
        live = self.live
        fresh = self.fresh
        assert live is not None and fresh is not None  # claims keep both from the first on
        leases = self.leases
        expiries = self.expiries
        retry = self.retry
        while expiries and expiries[0][0] <= now:
            expiry, seq = heappop(expiries)
            held = leases.get(seq)
            if held is not None and held[0] == expiry:
                del leases[seq]
                heappush(retry, (seq, held[1]))
        claimed: list[Any] = []
        while len(claimed) < limit:
            while retry and retry[0][0] not in live:
                heappop(retry)
            while fresh and fresh[0][0] not in live:
                fresh.popleft()
            if retry and (not fresh or retry[0][0] < fresh[0][0]):
                entry = heappop(retry)[1]
            elif fresh:
                entry = fresh.popleft()
            else:
                break
            seq = entry[0]
            leases[seq] = (until, entry)
            heappush(expiries, (until, seq))
            claimed.append(entry)
        if len(expiries) > 2 * len(leases) + _SLACK:
            self.expiries = [(held[0], seq) for seq, held in leases.items()]
            heapify(self.expiries)
        return claimed


class _Ring:
    """One execution's recent trace steps, and the index its next step gets."""

    __slots__ = ("maxlen", "next_index", "steps")

    def __init__(self, maxlen: int | None) -> None:
        self.steps: deque[dict[Any, Any]] = deque(maxlen=maxlen)
        self.maxlen = maxlen  # the deque's, read here where a slot is cheaper to reach
        self.next_index = 0


class _Slot:
    """Everything the store holds for one execution id; each part ``None`` until used."""

    __slots__ = ("commits", "epoch", "exe", "marks", "paths", "ring")

    def __init__(self) -> None:
        self.exe: Any = None
        self.marks: dict[Hashable, float] | None = None  # event id -> when recorded
        self.paths: dict[Hashable, list[Any]] | None = None
        self.ring: _Ring | None = None
        # commit id -> (version, body, when recorded)
        self.commits: dict[str, tuple[int, tuple[Any, ...], float]] | None = None
        self.epoch: int | None = None


def _replay_emits(out: tuple[Any, ...] | list[Any]) -> tuple[tuple[Any, Any], ...]:
    """The emits a replay is compared with: each staged entry's target and event, an event
    that is an exact dict or list copied (no caller code runs), so that a relay which
    changes a delivered ``entry.event`` does not turn a retry of the commit into a
    conflict. What an event holds is not copied: it is compared as it is then."""
    return tuple(
        [(e[1], e[2].copy() if type(e[2]) is dict or type(e[2]) is list else e[2]) for e in out]
    )


def _body(
    emitted: tuple[Any, ...], processed_event_id: Any, ops: tuple[Any, ...], born: Any, step: Any
) -> tuple[Any, ...]:
    """What a replay of a commit id is compared with: the commit's checked input, by
    value (``emitted`` from :func:`_replay_emits`; a cancel's ``fire_at`` is None;
    contexts are copies, and so is ``step``, taken before the store stamped its index)."""
    for op in ops:
        if op[0] is _CANCEL and op[2] is not None:
            ops = _checks.timer_ops(ops)
            break
    return (
        emitted,
        processed_event_id,
        ops,
        tuple([(s[2], s[3], s[4].copy()) for s in born]) if born else _EMPTY,
        step,
    )


def _same_body(body: tuple[Any, ...], emits: Any, *rest: Any) -> bool:
    """Whether a commit's input equals ``body``: compared as given when the containers are
    lists or tuples (the common replay, cheap), else once checked and normalized."""
    processed_event_id, timers, spawns, trace = rest
    if (
        (type(emits) is list or type(emits) is tuple)
        and (type(timers) is list or type(timers) is tuple)
        and (type(spawns) is list or type(spawns) is tuple)
        and processed_event_id == body[1]
        and tuple(emits) == body[0]
        and tuple(timers) == body[2]
        and tuple([tuple(s) for s in spawns]) == body[3]
        and trace == body[4]
    ):
        return True
    checked = _checks.commit_body(emits, processed_event_id, timers, spawns, trace, str_ids=False)
    return tuple(checked) == body


_COPY_REFUSED = (
    "a DictStore cannot be copied or pickled: it holds the live executions by identity, "
    "and a copy would share or lose them; load and commit into a new store instead"
)


def _batch(commits: Any) -> list[tuple[Any, ...]]:
    """The arguments of ``commit`` for each commit of ``commit_many``, every one checked
    before the first is written. Exact types pass as they are (``commit`` copies them, and
    no caller code can run in between); anything else is checked and copied here."""
    calls: list[tuple[Any, ...]] = []
    seen: set[Any] = set()
    for i, item in enumerate(_checks.batch(commits)):
        exe, emits, mark, timers, spawns, trace, commit_id, epoch = item
        try:
            if not (
                type(exe) is _Exe
                and type(exe.id) is str
                and type(exe.version) is int
                and _plain(emits, mark, timers, spawns, trace)
            ):
                emits, timers, spawns, trace = _checked(exe, emits, mark, timers, spawns, trace)
            if commit_id is not None or epoch is not None:
                commit_id = None if commit_id is None else _checks.as_commit_id(commit_id)
                epoch = None if epoch is None else _checks.as_epoch(epoch)
        except (TypeError, ValueError) as exc:
            raise _checks.in_batch(exc, i) from exc
        eid = exe.id
        if eid in seen:
            _checks.no_twins([call[0].id for call in calls] + [eid])
        seen.add(eid)
        calls.append((exe, emits, mark, timers, spawns, trace, commit_id, epoch))
    return calls


def _plain(emits: Any, mark: Any, timers: Any, spawns: Any, trace: Any) -> bool:
    """Whether a commit is made of exact types only, all valid (no caller code runs)."""
    if mark is not None and type(mark) is not str:
        return False
    if trace is not None and type(trace) is not dict:
        return False
    if type(emits) is not list and type(emits) is not tuple:
        return False
    for item in emits:
        if type(item) is not tuple or len(item) != 2:
            return False
        target = item[0]
        if target is not None and type(target) is not str:
            return False
    if type(timers) is not list and type(timers) is not tuple:
        return False
    for op in timers:
        if type(op) is not TimerOp or type(op[1]) is not str:
            return False
        if op[0] is _SCHEDULE:
            fire_at = op[2]
            if type(fire_at) is not float or not _NEG_INF < fire_at < _INF:
                return False
        elif op[0] is not _CANCEL:
            return False
    if type(spawns) is not list and type(spawns) is not tuple:
        return False
    for item in spawns:
        if type(item) is not tuple or len(item) != 3:
            return False
        if type(item[0]) is not str or type(item[2]) is not dict:
            return False
    return True


def _checked(
    exe: Any, emits: Any, mark: Any, timers: Any, spawns: Any, trace: Any
) -> tuple[Any, ...]:
    """A commit's parts checked and copied as ``commit`` checks them, whatever their
    types: an execution's id and version, the outbox pairs, the timer ops, the spawn
    triples (contexts copied) and the trace step."""
    try:
        eid = exe.id
    except AttributeError:
        raise _bad_exe("id", exe) from None
    try:
        hash(eid)
    except TypeError:
        raise _bad_exe("hash", eid) from None
    try:
        version = exe.version
    except AttributeError:
        raise _bad_exe("version", exe) from None
    if type(version) is not int:
        _checks.as_int(version, "execution version")
    if mark is not None:
        _checks.hashable(mark, "processed_event_id")
    pairs = [(entry[1], entry[2]) for entry in _checks.outbox_entries(emits, 0)]
    ops = _checks.timer_ops(_checks.snapshot(timers, "timers"))
    born = [(entry[2], entry[3], entry[4]) for entry in _checks.spawn_entries(spawns, eid, 0)]
    step = None if trace is None else _checks.trace_step(trace, "trace")
    return pairs, ops, born, step


class DictStore:
    """The in-memory ``ExecutionStore``: ``load`` returns the very object that was saved.

    Nothing is serialized or copied on the way in or out, and nothing survives the
    process. ``trace_max`` is how many trace steps are kept per execution (``0`` or
    ``None`` keeps all). ``clock`` (a function giving seconds, ``time.monotonic`` by
    default) times the leases of claims; tests and simulations pass their own. It must
    return a finite number: a claim that reads a NaN raises ``ValueError``.

    One writer at a time: the store takes no lock, and a write made from inside another
    write of the same store (from a key's ``__hash__``, say) raises ``RuntimeError``. A
    store is a context manager; ``copy``, ``deepcopy`` and ``pickle`` of it raise
    ``TypeError``, since a copy would share or lose the live executions it holds.
    """

    __slots__ = (
        "_armed",
        "_busy",
        "_clock",
        "_heap",
        "_leased",
        "_listing",
        "_maxlen",
        "_mixed",
        "_n_dead",
        "_n_exes",
        "_n_ids",
        "_n_marks",
        "_n_rings",
        "_n_steps",
        "_n_timers",
        "_outbox",
        "_seen_work",
        "_seq",
        "_slots",
        "_spawn_seq",
        "_spawns",
        "_stamp",
        "_timer_seq",
        "_trace_max",
        "_until",
    )

    #: ``load`` returns the very object that was saved (``False`` for the durable stores).
    preserves_identity = True
    #: Nothing survives the process (``True`` for the durable stores).
    durable = False

    _busy: bool
    _mixed: bool
    _trace_max: int | None
    _maxlen: int | None
    _clock: Callable[[], float]
    _slots: dict[Hashable, _Slot]
    _outbox: _Fifo
    _spawns: _Fifo
    _heap: list[list[Any]]
    _armed: list[list[Any]]
    _leased: list[tuple[float, int, list[Any]]]
    _listing: _Listing | None
    _seq: int
    _spawn_seq: int
    _timer_seq: int
    _seen_work: int
    _stamp: float
    _until: float
    _n_exes: int
    _n_marks: int
    _n_ids: int
    _n_timers: int
    _n_dead: int
    _n_rings: int
    _n_steps: int

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # The tables exist before __init__ runs, so a subclass that skips it still works.
        self = object.__new__(cls)
        self._busy = False
        self._mixed = False  # a mark or timer path that is not an exact str was stored
        self._trace_max = self._maxlen = DEFAULT_TRACE_MAX
        self._clock = monotonic
        self._slots = {}
        self._outbox = _Fifo()
        self._spawns = _Fifo()
        self._heap = []
        self._armed = []
        self._leased = []
        self._listing = None
        self._stamp = self._until = -float("inf")  # the first commit stamps
        self._seq = self._spawn_seq = self._timer_seq = self._seen_work = 0
        self._n_exes = self._n_marks = self._n_ids = self._n_timers = self._n_dead = 0
        self._n_rings = self._n_steps = 0
        return self

    def __init__(
        self,
        *,
        trace_max: int | None = DEFAULT_TRACE_MAX,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be a function giving seconds, got {type(clock).__name__}")
        self.trace_max = trace_max
        self._clock = monotonic if clock is None else _finite(clock)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(_COPY_REFUSED)

    def __copy__(self) -> Any:
        raise TypeError(_COPY_REFUSED)

    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError(_COPY_REFUSED)

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
            self._trace_max = _checks.as_trace_max(value)
            self._maxlen = self._trace_max or None
        finally:
            self._busy = False

    def load(self, execution_id: Hashable) -> Any:
        """The live object saved under ``execution_id``, or ``None``: no copy."""
        slot = self._slots.get(execution_id)
        return None if slot is None else slot.exe

    def save(self, exe: Any, *, epoch: int | None = None) -> None:
        """CAS-write ``exe`` and bump ``exe.version``.

        Raises :class:`StoreConflict` when a *different* object is stored under
        ``exe.id`` at a *different* version, and :class:`StaleWriter` when ``epoch`` is
        below the execution's writer epoch (a greater one claims it).
        """
        if self._busy:
            raise _reentered("save")
        if epoch is not None:
            # The epoch's checks are commit's, as in the compiled store: the same lookups.
            self.commit(exe, _EMPTY, epoch=epoch)
            return
        # commit's CAS, alone: save is called on its own often enough to skip the rest.
        self._busy = True
        try:
            try:
                eid = exe.id
            except AttributeError:
                raise _bad_exe("id", exe) from None
            slots = self._slots
            try:
                slot = slots.get(eid)
            except TypeError:
                raise _bad_exe("hash", eid) from None
            try:
                version = exe.version
            except AttributeError:
                raise _bad_exe("version", exe) from None
            if type(version) is not int:
                version = _checks.as_int(version, "execution version")
            prev = None if slot is None else slot.exe
            if prev is not exe and prev is not None:
                found = prev.version
                if found != version:
                    raise StoreConflict(eid, version, found)
            new = slot is None
            if slot is None:
                slot = _Slot()
                if slots.setdefault(eid, slot) is not slot:
                    raise _checks.inconsistent("the execution id")
            try:
                exe.version = version + 1
            except BaseException as exc:
                if new:
                    slots.popitem()
                if isinstance(exc, AttributeError):
                    raise _bad_exe("writable", exe) from None
                raise
            if prev is not exe:
                if prev is None:
                    self._n_exes += 1
                slot.exe = exe
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
        *,
        commit_id: str | None = None,
        epoch: int | None = None,
    ) -> None:
        """The event-boundary write: save ``exe`` (CAS), then enqueue ``emits``, mark
        ``processed_event_id``, apply ``timers``, enqueue ``spawns``, record ``trace``.

        All or nothing: on bad input (``TypeError``/``ValueError`` naming the item), a
        :class:`StoreConflict`, a :class:`StaleWriter` or an error raised by the caller's
        own code, neither the store nor ``exe.version`` changes. With ``commit_id``, a
        replay of a commit this execution already applied writes nothing (and sets
        ``exe.version`` to the version that commit produced, unless ``exe`` is the stored
        object); the same id with another body raises :class:`IdempotencyConflict`.
        """
        if self._busy:
            raise _reentered("commit")
        self._busy = True
        try:
            try:
                eid = exe.id
            except AttributeError:
                raise _bad_exe("id", exe) from None
            calls = False  # whether the write phase calls functions (else all is inline)
            if commit_id is not None or epoch is not None:
                fence = self._fence(exe, eid, commit_id, epoch, emits, processed_event_id,
                                    timers, spawns, trace)  # fmt: skip
                if fence is None:
                    return  # a replay: nothing to write
                commit_id, epoch = fence
                calls = True
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
                out = _checks.outbox_entries(emits, self._seq)
                seq = self._seq + len(out)
            str_keys = True  # every mark and path an exact str: lookups run no caller code
            if processed_event_id is not None and type(processed_event_id) is not str:
                _checks.hashable(processed_event_id, "processed_event_id")
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
                        try:
                            action, path, fire_at = one
                        except ValueError:  # not three items: the general path names it
                            path = None
                        if type(path) is not str:
                            one = None
                        elif action is _SCHEDULE:
                            if type(fire_at) is not float or not _NEG_INF < fire_at < _INF:
                                one = None
                        elif action is not _CANCEL:
                            one = None
                if one is None:
                    calls = True
                    ops = (
                        tuple(timers)
                        if type(timers) is list
                        else _checks.snapshot(timers, "timers")
                    )
                    for op in ops:
                        # Actions are compared by identity: string constants in a caller's
                        # code are interned; any other action takes the slow path.
                        if type(op) is not TimerOp or len(op) != 3 or type(op[1]) is not str:
                            ops = _checks.timer_ops(ops)
                            break
                        if op[0] is _SCHEDULE:
                            fire_at = op[2]
                            if type(fire_at) is not float or not _NEG_INF < fire_at < _INF:
                                ops = _checks.timer_ops(ops)
                                break
                        elif op[0] is not _CANCEL:
                            ops = _checks.timer_ops(ops)
                            break
                    for op in ops:
                        if type(op[1]) is not str:
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
                born = _checks.spawn_entries(spawns, eid, self._spawn_seq)
                spawn_seq = self._spawn_seq + len(born)
            if trace is None:
                step = None
            else:
                step = trace.copy() if type(trace) is dict else _checks.trace_step(trace, "trace")
            if commit_id is not None:
                # What a replay is compared with, made whole now: the write phase only
                # files it under the commit id (an exact str).
                body = _body(
                    _replay_emits(out) if out else _EMPTY,
                    processed_event_id,
                    ops if one is None else (one,),
                    born,
                    None if step is None else step.copy(),
                )
            # When marks, commit ids and entries are recorded: the store's clock, read
            # here, before the CAS, as it may be the caller's code.
            if processed_event_id is not None or commit_id is not None or out or born:
                # One stamp (a float object) serves every commit of a millisecond.
                clock = self._clock  # a slot read, then a call: cheaper than a method call
                now = clock()  # a finite float (_finite checks a caller's clock)
                stamp = self._stamp
                if not now < self._until or not stamp <= now:
                    stamp = self._restamp(now)
            slots = self._slots
            try:
                slot = slots.get(eid)
            except TypeError:
                raise _bad_exe("hash", eid) from None
            # CAS, read as late as possible so no caller code runs between check and write.
            try:
                version = exe.version
            except AttributeError:
                raise _bad_exe("version", exe) from None
            if type(version) is not int:
                version = _checks.as_int(version, "execution version")
            prev = None if slot is None else slot.exe
            if prev is not exe and prev is not None:
                found = prev.version
                if found != version:
                    raise StoreConflict(eid, version, found)
            plain = str_keys and not self._mixed  # no lookup below runs caller code
            plan = None
            if not plain and (ops or one is not None):
                # Paths whose lookups may run caller code change a copy, made now.
                if one is not None:
                    ops = (one,)
                    one = None
                plan = _plan_timers(None if slot is None else slot.paths, ops, eid)
                calls = True
            if one is not None:
                paths = None if slot is None else slot.paths
                old = None if paths is None else paths.get(path)
                if old is None or action is not _SCHEDULE or old[4]:
                    ops = (one,)  # not a re-arm in place
                    one = None
                    calls = True
            if step is not None:
                ring = None if slot is None else slot.ring
                # One lookup, as the compiled store stamps: the step is the store's own copy.
                step.setdefault("index", 0 if ring is None else ring.next_index)
                if ring is not None and ring.maxlen != self._maxlen:
                    ring = None  # a new ring, or one resized: _push_step makes it
                if ring is None:
                    calls = True
            if calls:
                # The functions the write phase calls, each a frame deeper: a
                # RecursionError they would raise is raised now, before any write.
                _headroom()

            # The write phase. The one insert under a caller's key comes first; then the
            # version setter, the last caller code, undoing that insert if it raises.
            undo: dict[Any, Any] | None = None
            late_mark = processed_event_id is not None  # an exact str among strs: no code runs
            if slot is None:
                slot = _Slot()
                if late_mark:
                    slot.marks = {processed_event_id: stamp}
                if slots.setdefault(eid, slot) is not slot:
                    raise _checks.inconsistent("the execution id")
                undo = slots
            elif late_mark and not plain:
                undo = self._mark_first(slot, processed_event_id, stamp)
                late_mark = False
            try:
                exe.version = version + 1
            except BaseException as exc:
                if undo is not None:
                    undo.popitem()
                    if undo is not slots:
                        self._n_marks -= 1
                if isinstance(exc, AttributeError):
                    raise _bad_exe("writable", exe) from None
                raise
            if prev is not exe:
                if prev is None:
                    self._n_exes += 1
                slot.exe = exe
            if late_mark:
                marks = slot.marks
                if undo is slots:
                    self._n_marks += 1
                elif marks is None:
                    slot.marks = {processed_event_id: stamp}
                    self._n_marks += 1
                elif processed_event_id not in marks:
                    marks[processed_event_id] = stamp
                    self._n_marks += 1
            if not str_keys:
                self._mixed = True
            if commit_id is not None:
                _enter(slot, commit_id, epoch, version + 1, body, stamp)
                self._n_ids += 1
            elif epoch is not None:
                _enter(slot, None, epoch, version + 1, None, 0.0)

            if out:
                fifo = self._outbox  # _Fifo.extend, inlined: this is the hot path
                fifo.entries.extend(out)
                if fifo.live is not None:  # the pending seqs are kept: count these in
                    fifo.live.update(range(self._seq + 1, seq + 1))
                    if fifo.fresh is not None:
                        fifo.fresh.extend(out)
                self._seq = seq
            if one is not None:
                self._timer_seq = n = self._timer_seq + 1
                old[0] = fire_at  # type: ignore[index]  # not in the heap yet: re-arm in place
                old[1] = n  # type: ignore[index]
            if plan is not None:
                self._apply_plan(slot, plan)
            elif ops:
                self._apply_timers(slot, eid, ops)
            if born:
                fifo = self._spawns
                fifo.entries.extend(born)
                if fifo.live is not None:
                    fifo.live.update(range(self._spawn_seq + 1, spawn_seq + 1))
                    if fifo.fresh is not None:
                        fifo.fresh.extend(born)
                self._spawn_seq = spawn_seq
            if step is not None:
                if ring is None:
                    self._push_step(slot, step)
                else:  # _push_step, inlined: this is the hot path
                    ring.next_index += 1
                    steps = ring.steps
                    if len(steps) != ring.maxlen:
                        self._n_steps += 1
                    steps.append(step)
        finally:
            self._busy = False

    def commit_many(self, commits: Iterable[Commit]) -> list[StoreError | None]:
        """Each :class:`~harel_store.Commit` of ``commits`` as :meth:`commit` applies it,
        in order: per commit ``None`` (applied, or a replay of its ``commit_id``) or the
        :class:`StoreConflict`, :class:`StaleWriter` or :class:`IdempotencyConflict` that
        :meth:`commit` would have raised, which wrote nothing and does not stop the
        others. Every commit is checked before the first is written: bad input in any
        (``TypeError``/``ValueError`` naming ``commits[i]``, two commits of one
        execution) raises and writes nothing."""
        if self._busy:
            raise _reentered("commit_many")
        calls = _batch(commits)
        outcomes: list[StoreError | None] = []
        commit = self.commit
        for exe, emits, mark, timers, spawns, trace, commit_id, epoch in calls:
            try:
                commit(exe, emits, mark, timers, spawns, trace, commit_id=commit_id, epoch=epoch)
            except (StoreConflict, StaleWriter, IdempotencyConflict) as refused:
                outcomes.append(refused)
            else:
                outcomes.append(None)
        return outcomes

    def is_processed(self, execution_id: Hashable, event_id: Hashable) -> bool:
        """Whether a commit of ``execution_id`` recorded ``event_id`` as handled."""
        slot = self._slots.get(execution_id)
        if slot is None or slot.marks is None:
            return False
        return event_id in slot.marks

    def pending_outbox(self) -> list[OutboxEntry]:
        """A copy of the unacked outbox entries, oldest first."""
        return self._outbox.pending()

    def ack_outbox(self, seq: int) -> None:
        """Drop the outbox entry ``seq`` (ending its lease); an unknown or already-acked
        seq is a no-op."""
        if self._busy:
            raise _reentered("ack_outbox")
        self._busy = True
        try:
            self._outbox.ack(seq)
        finally:
            self._busy = False

    def ack_outbox_many(self, seqs: Iterable[int]) -> None:
        """:meth:`ack_outbox` each of ``seqs`` (ints, all checked before the first ack)."""
        if self._busy:
            raise _reentered("ack_outbox_many")
        for seq in _checks.seqs(seqs, "seqs"):
            self.ack_outbox(seq)

    def claim_outbox(self, limit: int = 100, *, lease: float = 30.0) -> list[OutboxEntry]:
        """Lease up to ``limit`` unacked outbox entries that no live lease holds, oldest
        first, for ``lease`` seconds: until then no other claim returns them; unacked
        after it, they are claimable again. Costs in proportion to what it returns plus
        the leases that ran out and the acked entries it passes."""
        if self._busy:
            raise _reentered("claim_outbox")
        self._busy = True
        try:
            limit = _checks.as_limit(limit)
            lease = _checks.as_lease(lease)
            now = self._now()
            return self._outbox.claim(limit, now + lease, now)
        finally:
            self._busy = False

    def pending_spawns(self) -> list[SpawnEntry]:
        """A copy of the unacked spawn intents, oldest first."""
        return self._spawns.pending()

    def ack_spawn(self, seq: int) -> None:
        """Drop the spawn intent ``seq`` (ending its lease); an unknown or already-acked
        seq is a no-op."""
        if self._busy:
            raise _reentered("ack_spawn")
        self._busy = True
        try:
            self._spawns.ack(seq)
        finally:
            self._busy = False

    def ack_spawn_many(self, seqs: Iterable[int]) -> None:
        """:meth:`ack_spawn` each of ``seqs`` (ints, all checked before the first ack)."""
        if self._busy:
            raise _reentered("ack_spawn_many")
        for seq in _checks.seqs(seqs, "seqs"):
            self.ack_spawn(seq)

    def claim_spawns(self, limit: int = 100, *, lease: float = 30.0) -> list[SpawnEntry]:
        """:meth:`claim_outbox` for the spawn intents."""
        if self._busy:
            raise _reentered("claim_spawns")
        self._busy = True
        try:
            limit = _checks.as_limit(limit)
            lease = _checks.as_lease(lease)
            now = self._now()
            return self._spawns.claim(limit, now + lease, now)
        finally:
            self._busy = False

    def due_timers(self, now: float) -> list[tuple[Hashable, Hashable, float]]:
        """``(execution_id, path, fire_at)`` of every armed timer with ``fire_at <= now``,
        oldest ``fire_at`` first (ties in arming order), leased ones included. Timers
        stay armed until :meth:`delete_timer`. Costs in proportion to the due timers."""
        if type(now) is not float or isnan(now):
            now = _checks.as_now(now)
        if self._busy:
            # From caller code run inside another call (a finalizer, a gc callback): a
            # read that leaves the timer structures as the outer call has them.
            leased = [e for _, _, e in self._leased]
            due = [
                e for e in [*self._heap, *self._armed, *leased] if e[2] is not _DEAD and e[0] <= now
            ]
            due.sort()
            return [(e[2], e[3], e[0]) for e in due]
        self._busy = True
        try:
            if self._armed:
                self._heap_armed()
            heap = self._heap
            while heap and heap[0][2] is _DEAD:
                heappop(heap)
                self._n_dead -= 1
            due = []
            if heap and heap[0][0] <= now:
                size = len(heap)
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
            if self._leased:
                due += [e for _, _, e in self._leased if e[0] <= now and e[2] is not _DEAD]
        finally:
            self._busy = False
        if not due:
            return []
        due.sort()
        return [(e[2], e[3], e[0]) for e in due]

    def claim_due_timers(
        self, now: float, limit: int = 100, *, lease: float = 30.0
    ) -> list[tuple[Hashable, Hashable, float]]:
        """Lease up to ``limit`` due timers that no live lease holds, oldest ``fire_at``
        first, for ``lease`` seconds (see :meth:`claim_outbox`). Deleting or re-arming a
        timer ends its lease. Costs in proportion to what it returns plus the leases
        that ran out."""
        if self._busy:
            raise _reentered("claim_due_timers")
        self._busy = True
        try:
            now = _checks.as_now(now)
            limit = _checks.as_limit(limit)
            lease = _checks.as_lease(lease)
            clock = self._now()
            if self._armed:
                self._heap_armed()
            heap = self._heap
            leased = self._leased
            while leased and leased[0][0] <= clock:
                entry = heappop(leased)[2]
                if entry[2] is _DEAD:
                    self._n_dead -= 1
                else:
                    heappush(heap, entry)
            claimed: list[tuple[Hashable, Hashable, float]] = []
            until = clock + lease
            while heap and len(claimed) < limit:
                entry = heap[0]
                if entry[2] is _DEAD:
                    heappop(heap)
                    self._n_dead -= 1
                    continue
                if not entry[0] <= now:
                    break
                heappop(heap)
                heappush(leased, (until, entry[1], entry))
                claimed.append((entry[2], entry[3], entry[0]))
            return claimed
        finally:
            self._busy = False

    def delete_timer(self, execution_id: Hashable, path: Hashable, fire_at: float) -> None:
        """Disarm the timer only if it still fires at ``fire_at``, so a sweep that read it
        before a re-arm cannot delete the re-armed timer. Ends its lease. ``fire_at`` is
        a real number of seconds (else ``TypeError``), compared as the float timers are
        armed at, as in every store."""
        if self._busy:
            raise _reentered("delete_timer")
        self._busy = True
        try:
            if type(fire_at) is not float:  # a Real's __float__ is caller code: run it here
                fire_at = _checks.as_time(fire_at, "fire_at")
            slot = self._slots.get(execution_id)
            if slot is None or slot.paths is None:
                return
            paths = slot.paths
            entry = paths.get(path)
            if entry is None or entry[0] != fire_at:
                return
            if type(path) is str and not self._mixed:
                del paths[path]
            else:
                paths = paths.copy()  # the key's own code runs on a copy, before any write
                if paths.pop(path, None) is not entry:
                    raise _checks.inconsistent("the timer path")
            slot.paths = paths or None
            entry[2] = _DEAD
            self._n_timers -= 1
            self._n_dead += 1
            if self._n_dead > self._n_timers + _SLACK:
                self._compact_timers()
        finally:
            self._busy = False

    def delete_timer_many(self, timers: Iterable[tuple[Hashable, Hashable, float]]) -> None:
        """:meth:`delete_timer` each ``(execution_id, path, fire_at)`` of ``timers``, all
        checked before the first is deleted."""
        if self._busy:
            raise _reentered("delete_timer_many")
        for execution_id, path, fire_at in _checks.timer_triples(timers):
            self.delete_timer(execution_id, path, fire_at)

    def append_trace(self, execution_id: Hashable, entry: Mapping[str, Any]) -> None:
        """Record a trace step for ``execution_id`` outside a commit."""
        self._record_trace(execution_id, entry)

    def read_trace(self, execution_id: Hashable) -> list[dict[str, Any]]:
        """A copy of the recent steps of ``execution_id``, oldest first (or ``[]``)."""
        slot = self._slots.get(execution_id)
        if slot is None or slot.ring is None:
            return []
        return list(slot.ring.steps)

    def forget(self, execution_id: Hashable) -> None:
        """Drop an execution with its processed marks, armed timers, trace ring, trace
        index, commit ids and writer epoch, in time proportional to what it holds.
        Pending outbox and spawn entries stay: they are owed to a relay. An unknown id is
        a no-op."""
        if self._busy:
            raise _reentered("forget")
        self._busy = True
        try:
            slot = self._slots.pop(execution_id, None)  # the one write under the caller's key
            if slot is None:
                return
            if slot.exe is not None:
                self._n_exes -= 1
            if slot.marks is not None:
                self._n_marks -= len(slot.marks)
            if slot.commits is not None:
                self._n_ids -= len(slot.commits)
            if slot.paths is not None:
                for entry in slot.paths.values():
                    entry[2] = _DEAD
                self._n_timers -= len(slot.paths)
                self._n_dead += len(slot.paths)
                if self._n_dead > self._n_timers + _SLACK:
                    self._compact_timers()
            if slot.ring is not None:
                self._n_rings -= 1
                self._n_steps -= len(slot.ring.steps)
            listing = self._listing
            if listing is not None:
                # The id's own code runs again here: if it raises, the listing is made
                # anew by the next list_executions.
                self._listing = None
                listing.forgot(execution_id)
                self._listing = listing
        finally:
            self._busy = False

    def stats(self) -> dict[str, int]:
        """Counts for monitoring, each O(1)."""
        return {
            "executions": self._n_exes,
            "outbox": len(self._outbox),
            "spawns": len(self._spawns),
            "timers": self._n_timers,
            "processed": self._n_marks,
            "traces": self._n_rings,
            "trace_steps": self._n_steps,
        }

    def overview(self, *, now: float | None = None) -> dict[str, Any]:
        """What the store holds and whether its relays and sweepers keep up: the counts
        of :meth:`stats` with ``commit_ids``, the age in seconds of the oldest pending
        outbox and spawn entry, the live and the run-out leases, and ``timers_due`` and
        ``next_timer_at`` at ``now`` (default the store's clock). Ages and leases are
        on the store's clock. Costs in proportion to the live leases and the due timers,
        not to what the store holds."""
        if self._busy:
            raise _reentered("overview")
        self._busy = True
        try:
            clock = self._now()
            now = clock if now is None else _checks.as_now(now)
            outbox = self._outbox
            spawns = self._spawns
            outbox_leased, outbox_expired = outbox.leased(clock)
            spawns_leased, spawns_expired = spawns.leased(clock)
            timers_leased = timers_expired = 0
            for until, _, entry in self._leased:
                if entry[2] is not _DEAD:
                    if until > clock:
                        timers_leased += 1
                    else:
                        timers_expired += 1
            due, next_at = self._timers_at(now)
            return dict(zip(_operate.OVERVIEW_KEYS, (
                self._n_exes, len(outbox), len(spawns), self._n_timers, self._n_marks,
                self._n_ids, _operate.age(clock, outbox.oldest()),
                _operate.age(clock, spawns.oldest()), outbox_leased, spawns_leased,
                timers_leased, outbox_expired + spawns_expired + timers_expired, due, next_at,
            )))  # fmt: skip
        finally:
            self._busy = False

    def list_executions(self, *, after: Hashable | None = None, limit: int = 100) -> list[Any]:
        """Up to ``limit`` execution ids, in the order the store first held them, after
        ``after`` (the last id of the previous page; ``None`` from the start). An id
        forgotten since its page was read still marks where that page ended; an id this
        store never listed raises ``ValueError``. Costs in proportion to the page."""
        if self._busy:
            raise _reentered("list_executions")
        limit = _operate.as_page(limit)
        self._busy = True
        try:
            listing = self._listing
            # Dropped while it works: if an id's own code raises, the next call starts anew.
            self._listing = None
            if listing is None:
                listing = _Listing()
            page = listing.page(self._slots, after, limit)
            self._listing = listing
            return page
        finally:
            self._busy = False

    def prune(self, older_than: float) -> dict[str, int]:
        """Delete the processed marks and commit ids recorded more than ``older_than``
        seconds ago (on the store's clock), in every execution; how many of each it
        deleted. An event whose mark is gone is no longer deduplicated, and a replay of a
        commit id that is gone is applied as a new commit."""
        if self._busy:
            raise _reentered("prune")
        older_than = _operate.as_older_than(older_than)
        self._busy = True
        try:
            # A stamp may be up to _STAMP older than what it times: never prune early.
            cutoff = self._now() - older_than - _STAMP
            # Worked out aside (keys whose own code runs are hashed here), then written.
            plans = []
            gone_marks = gone_ids = 0
            for slot in self._slots.values():
                marks = slot.marks
                commits = slot.commits
                new_marks: Any = marks
                new_commits: Any = commits
                if marks is not None and any(t < cutoff for t in marks.values()):
                    new_marks = {k: t for k, t in marks.items() if not t < cutoff}
                    gone_marks += len(marks) - len(new_marks)
                if commits is not None and any(c[2] < cutoff for c in commits.values()):
                    new_commits = {k: c for k, c in commits.items() if not c[2] < cutoff}
                    gone_ids += len(commits) - len(new_commits)
                if new_marks is not marks or new_commits is not commits:
                    plans.append((slot, new_marks or None, new_commits or None))
            for slot, new_marks, new_commits in plans:
                slot.marks = new_marks
                slot.commits = new_commits
            self._n_marks -= gone_marks
            self._n_ids -= gone_ids
            return dict(zip(_operate.PRUNE_KEYS, (gone_marks, gone_ids)))
        finally:
            self._busy = False

    def wait_for_work(self, timeout: float) -> bool:
        """``True`` as soon as this store has committed outbox or spawn entries or armed a
        timer since it was made or since the previous ``wait_for_work`` returned (work
        committed by another thread); ``False`` after ``timeout`` seconds without any.
        It looks at the store's counters, pausing 1 ms between looks at first and up to
        20 ms, so a commit pays nothing for it."""
        timeout = _checks.as_timeout(timeout)
        deadline = monotonic() + timeout
        pause = 0.001
        while True:
            count = self._seq + self._spawn_seq + self._timer_seq
            if count != self._seen_work:
                self._seen_work = count
                return True
            left = deadline - monotonic()
            if left <= 0.0:
                return False
            sleep(min(pause, left))
            pause = min(pause * 2.0, 0.02)

    def close(self) -> None:
        """Nothing to release: the store lives and dies with the process."""

    def _record_trace(self, execution_id: Hashable, entry: Mapping[str, Any]) -> None:
        if self._busy:
            raise _reentered("append_trace")
        self._busy = True
        try:
            step = _checks.trace_step(entry, "trace entry")
            if type(execution_id) is not str:
                _checks.hashable(execution_id, "execution_id")
            slots = self._slots
            slot = slots.get(execution_id)
            if "index" not in step:
                step["index"] = 0 if slot is None or slot.ring is None else slot.ring.next_index
            if slot is None:
                slot = _Slot()
                if slots.setdefault(execution_id, slot) is not slot:
                    raise _checks.inconsistent("the execution id")
            self._push_step(slot, step)
        finally:
            self._busy = False

    def _dump(self) -> Iterator[tuple[Any, ...]]:
        """Everything the store holds, as the records of :mod:`harel_store._copy`, for
        :func:`harel_store.copy_store`. They hold the store's own objects (executions,
        events, contexts, steps, commit bodies): nothing may write to the store until the
        iterator is exhausted or closed."""
        slots = list(self._slots.items())
        commits = 0
        for _, slot in slots:
            if slot.commits is not None:
                commits += len(slot.commits)
        outbox = self._outbox.pending()
        spawns = self._spawns.pending()
        yield ("total", self._n_exes + self._n_marks + commits + self._n_rings
               + self._n_timers + len(outbox) + len(spawns) + 1)  # fmt: skip
        for _, slot in slots:
            if slot.exe is not None:
                yield ("execution", slot.exe, slot.epoch)
        for eid, slot in slots:
            if slot.marks is not None:
                for event_id in slot.marks:
                    yield ("mark", eid, event_id)
        for eid, slot in slots:
            if slot.commits is not None:
                for commit_id, (version, body, _) in slot.commits.items():
                    yield ("commit", eid, commit_id, version, body)
        for eid, slot in slots:
            if slot.ring is not None:
                yield ("trace", eid, slot.ring.next_index, list(slot.ring.steps))
        timers = [e for _, slot in slots if slot.paths is not None for e in slot.paths.values()]
        timers.sort(key=lambda entry: entry[1])  # arming order
        for entry in timers:
            yield ("timer", entry[2], entry[3], entry[0])
        for record in outbox:
            yield ("outbox", record)
        for record in spawns:
            yield ("spawn", record)
        yield ("seqs", self._seq, self._spawn_seq)

    def _restore(self, records: Iterable[tuple[Any, ...]]) -> None:
        """Write the records of :mod:`harel_store._copy` into this empty store (else
        :class:`~harel_store.StoreError`): all or nothing, the tables are built aside and
        installed at the end. Executions, events, contexts, steps and bodies are
        deep-copied, ids are not (an execution's copy keeps its id object); the last
        ``trace_max`` steps of a ring are kept."""
        if self._busy:
            raise _reentered("_restore")
        self._busy = True
        try:
            if self._slots or len(self._outbox) or len(self._spawns):
                raise _transfer.not_empty(self, {
                    "executions": self._n_exes, "processed marks": self._n_marks,
                    "timers": self._n_timers, "trace rings": self._n_rings,
                    "outbox entries": len(self._outbox), "spawn intents": len(self._spawns),
                })  # fmt: skip
            slots: dict[Hashable, _Slot] = {}
            outbox = _Fifo()
            spawns = _Fifo()
            armed: list[list[Any]] = []
            seq = spawn_seq = last_out = last_spawn = 0
            n_exes = n_marks = n_ids = n_rings = n_steps = 0
            now = self._now()  # what is restored counts as recorded now
            mixed = False
            for record in records:
                kind = record[0]
                if kind == "execution":
                    _, exe, epoch = record
                    try:
                        eid = exe.id
                    except AttributeError:
                        raise _bad_exe("id", exe) from None
                    # The copy keeps the id object the other records name: a copy of
                    # an id hashed by identity would split the execution from them.
                    exe = deepcopy(exe, {id(eid): eid})
                    try:
                        version = exe.version
                    except AttributeError:
                        raise _bad_exe("version", exe) from None
                    _checks.as_int(version, "execution version")
                    if epoch is not None:
                        epoch = _checks.as_epoch(epoch)
                    slot = _restored_slot(slots, eid)
                    if slot.exe is not None:
                        raise ValueError(f"two executions with the id {_shown(eid)} to restore")
                    slot.exe = exe
                    slot.epoch = epoch
                    n_exes += 1
                elif kind == "mark":
                    _, eid, event_id = record
                    _checks.hashable(event_id, "event id")
                    slot = _restored_slot(slots, eid)
                    if slot.marks is None:
                        slot.marks = {}
                    if event_id in slot.marks:
                        raise ValueError(
                            f"two processed marks {_shown(event_id)} of {_shown(eid)} to restore"
                        )
                    slot.marks[event_id] = now
                    n_marks += 1
                    mixed = mixed or type(event_id) is not str
                elif kind == "commit":
                    _, eid, commit_id, version, body = record
                    commit_id = _checks.as_commit_id(commit_id)
                    version = _checks.as_int(version, "commit version")
                    body = _checks.restored_body(body, commit_id)
                    slot = _restored_slot(slots, eid)
                    if slot.commits is None:
                        slot.commits = {}
                    if commit_id in slot.commits:
                        raise ValueError(
                            f"two commit ids {_shown(commit_id)} of {_shown(eid)} to restore"
                        )
                    slot.commits[commit_id] = (version, body, now)
                    n_ids += 1
                elif kind == "trace":
                    _, eid, next_index, steps = record
                    next_index = _checks.restored_counter(next_index, "next_index")
                    kept = [deepcopy(_checks.trace_step(s, "trace step")) for s in steps]
                    if not 0 <= len(kept) <= next_index:
                        raise ValueError(f"the trace of {_shown(eid)} holds {len(kept)} steps, "
                                         f"more than its next index {next_index}")  # fmt: skip
                    slot = _restored_slot(slots, eid)
                    if slot.ring is not None:
                        raise ValueError(f"two trace rings of {_shown(eid)} to restore")
                    slot.ring = ring = _Ring(self._maxlen)
                    ring.steps.extend(kept)
                    ring.next_index = next_index
                    n_rings += 1
                    n_steps += len(ring.steps)
                elif kind == "timer":
                    _, eid, path, fire_at = record
                    _checks.hashable(path, "timer path")
                    fire_at = _checks.as_time(fire_at, "fire_at")
                    if fire_at - fire_at != 0.0:
                        raise ValueError(f"fire_at must be finite, got {fire_at!r}")
                    slot = _restored_slot(slots, eid)
                    if slot.paths is None:
                        slot.paths = {}
                    if path in slot.paths:
                        raise ValueError(f"two timers {_shown(path)} of {_shown(eid)} to restore")
                    entry = [fire_at, len(armed) + 1, eid, path, False]
                    slot.paths[path] = entry
                    armed.append(entry)
                    mixed = mixed or type(path) is not str
                elif kind == "outbox":
                    n, target, event = record[1]
                    n = _checks.restored_counter(n, "seq")
                    if n <= last_out:
                        raise ValueError(f"outbox seq {n} out of order")
                    last_out = n
                    if target is not None:
                        _checks.hashable(target, "target_id")
                    outbox.entries.append(_new(OutboxEntry, (n, target, deepcopy(event))))
                elif kind == "spawn":
                    n, parent_id, child_id, root_path, context = record[1]
                    n = _checks.restored_counter(n, "seq")
                    if n <= last_spawn:
                        raise ValueError(f"spawn seq {n} out of order")
                    last_spawn = n
                    _checks.hashable(parent_id, "parent_id")
                    _checks.hashable(child_id, "child_id")
                    context = deepcopy(_checks.trace_step(context, "spawn context"))
                    born = (n, parent_id, child_id, deepcopy(root_path), context)
                    spawns.entries.append(_new(SpawnEntry, born))
                elif kind == "seqs":
                    seq = _checks.restored_counter(record[1], "outbox seq")
                    spawn_seq = _checks.restored_counter(record[2], "spawn seq")
                elif kind != "total":
                    _transfer.check_kind(kind)

            if outbox.entries:
                outbox.stamps.append((outbox.entries[0][0], now))
            if spawns.entries:
                spawns.stamps.append((spawns.entries[0][0], now))
            # Install: no caller code runs from here on.
            self._slots = slots
            self._listing = None
            self._outbox = outbox
            self._spawns = spawns
            self._heap = []
            self._armed = armed
            self._leased = []
            # An empty store may have handed out seqs (acked since): a late ack of one
            # must not drop a new entry, so seqs never go back.
            self._seq = max(self._seq, seq, last_out)
            self._spawn_seq = max(self._spawn_seq, spawn_seq, last_spawn)
            self._timer_seq = len(armed)
            self._n_exes = n_exes
            self._n_marks = n_marks
            self._n_ids = n_ids
            self._n_timers = len(armed)
            self._n_dead = 0
            self._n_rings = n_rings
            self._n_steps = n_steps
            self._mixed = self._mixed or mixed
        finally:
            self._busy = False

    def _fence(
        self, exe: Any, eid: Hashable, commit_id: Any, epoch: Any, *body: Any
    ) -> tuple[str | None, int | None] | None:
        """The first checks of a commit that carries a commit id or an epoch: the id
        (a replay of a commit already applied returns None, after setting ``exe.version``
        to what that commit produced unless ``exe`` is the stored object; the same id
        with another body raises :class:`IdempotencyConflict`), then the epoch
        (:class:`StaleWriter`). Returns the checked id and epoch."""
        if epoch is not None and (type(epoch) is not int or epoch < 0):
            epoch = _checks.as_epoch(epoch)
        if commit_id is not None and type(commit_id) is not str:
            commit_id = _checks.as_commit_id(commit_id)
        try:
            slot = self._slots.get(eid)
        except TypeError:
            raise _bad_exe("hash", eid) from None
        if slot is None:
            return commit_id, epoch
        if commit_id is not None and slot.commits is not None:
            done = slot.commits.get(commit_id)
            if done is not None:
                if not _same_body(done[1], *body):
                    raise IdempotencyConflict(eid, commit_id)
                if exe is not slot.exe:
                    try:
                        exe.version = done[0]
                    except AttributeError:
                        raise _bad_exe("writable", exe) from None
                return None
        if epoch is not None and slot.epoch is not None and epoch < slot.epoch:
            raise StaleWriter(eid, epoch, slot.epoch)
        return commit_id, epoch

    def _mark_first(
        self, slot: _Slot, event_id: Hashable, now: float
    ) -> dict[Hashable, float] | None:
        """Insert a mark whose lookups may run caller code, before the version setter;
        the table to ``popitem()`` if that raises, or None when nothing was added."""
        marks = slot.marks
        if marks is None:
            slot.marks = marks = {event_id: now}
        else:
            size = len(marks)
            marks.setdefault(event_id, now)
            if len(marks) == size:
                return None
        self._n_marks += 1
        return marks

    def _restamp(self, stamp: float) -> float:
        """The stamp of the commits from ``stamp`` (a reading of the clock) on, and of
        the outbox and spawn entries they add."""
        self._stamp = stamp
        self._until = stamp + _STAMP
        self._outbox.stamp(self._seq + 1, stamp)
        self._spawns.stamp(self._spawn_seq + 1, stamp)
        return stamp

    def _now(self) -> float:
        return self._clock()

    def _timers_at(self, now: float) -> tuple[int, float | None]:
        """How many armed timers are due at ``now`` (leased ones included), and the
        earliest ``fire_at`` after it; in proportion to the due and dead ones."""
        if self._armed:
            self._heap_armed()
        heap = self._heap
        size = len(heap)
        due = 0
        later = []
        stack = [0] if heap else []
        while stack:
            i = stack.pop()
            entry = heap[i]
            if entry[0] <= now or entry[2] is _DEAD:
                if entry[2] is not _DEAD:
                    due += 1
                child = 2 * i + 1
                stack.extend(c for c in (child, child + 1) if c < size)
            else:  # the rest of this branch fires later still
                later.append(entry[0])
        for _, _, entry in self._leased:
            if entry[2] is not _DEAD:
                if entry[0] <= now:
                    due += 1
                else:
                    later.append(entry[0])
        return due, min(later) if later else None

    def _apply_timers(self, slot: _Slot, eid: Hashable, ops: tuple[TimerOp, ...]) -> None:
        """Apply checked ops whose paths are exact strs, in place: no caller code runs."""
        paths = slot.paths
        if paths is None:
            slot.paths = paths = {}
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
                slot.paths = None
            if self._n_dead > self._n_timers + _SLACK:
                self._compact_timers()

    def _apply_plan(self, slot: _Slot, plan: tuple[Any, ...]) -> None:
        """Write what :func:`_plan_timers` worked out: no caller code runs."""
        paths, killed, armed = plan
        slot.paths = paths or None
        for entry in killed:
            entry[2] = _DEAD
        for entry in armed:
            self._timer_seq = entry[1] = self._timer_seq + 1
        self._armed += armed
        self._n_timers += len(armed) - len(killed)
        self._n_dead += len(killed)
        if self._n_dead > self._n_timers + _SLACK:
            self._compact_timers()

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
        leased = [t for t in self._leased if t[2][2] is not _DEAD]
        heapify(leased)
        self._leased = leased
        self._n_dead = 0

    def _push_step(self, slot: _Slot, step: dict[Any, Any]) -> None:
        """Append a stamped step to the slot's ring: no caller code runs."""
        ring = slot.ring
        maxlen = self._maxlen
        if ring is None:
            slot.ring = ring = _Ring(maxlen)
            self._n_rings += 1
        elif ring.maxlen != maxlen:
            kept = deque(ring.steps, maxlen=maxlen)
            self._n_steps += len(kept) - len(ring.steps)
            ring.steps = kept
            ring.maxlen = maxlen
        ring.next_index += 1
        steps = ring.steps
        if len(steps) != maxlen:
            self._n_steps += 1
        steps.append(step)


def _headroom(frames: int = 6) -> None:
    """Return only if ``frames`` more calls fit under the recursion limit: more than the
    deepest chain of calls of a commit's write phase (a helper, the helper it calls, a
    comprehension, the comparisons of a heap)."""
    if frames:
        _headroom(frames - 1)


def _finite(clock: Callable[[], Any]) -> Callable[[], float]:
    """``clock``, whose every reading is checked: a finite number of seconds, as a float
    (the commit path then compares it as it is)."""

    def read() -> float:
        now = clock()
        if type(now) is float and now - now == 0.0:
            return now
        return _checks.as_clock(now)

    return read


def _enter(slot: _Slot, commit_id: Any, epoch: Any, version: int, body: Any, now: float) -> None:
    """Record a landed commit's id, with its body (:func:`_body`) and when, and its epoch."""
    if commit_id is not None:
        if slot.commits is None:
            slot.commits = {}
        slot.commits[commit_id] = (version, body, now)
    if epoch is not None and (slot.epoch is None or epoch > slot.epoch):
        slot.epoch = epoch


def _plan_timers(
    paths: dict[Hashable, list[Any]] | None, ops: tuple[Any, ...], eid: Hashable
) -> tuple[dict[Hashable, list[Any]], list[list[Any]], list[list[Any]]]:
    """The timer table after ``ops``, worked out on a copy: the entries they kill and the
    new entries they arm (arm orders are set when written). Runs the paths' own code, so
    it comes before the first write."""
    table = {} if paths is None else paths.copy()
    killed: list[list[Any]] = []
    armed: list[list[Any]] = []
    for op in ops:
        path = op[1]
        old = table.pop(path, None)
        if old is not None:
            killed.append(old)
        if op[0] is _SCHEDULE:
            entry = [op[2], 0, eid, path, False]
            table[path] = entry
            armed.append(entry)
    return table, killed, armed


def _restored_slot(slots: dict[Hashable, _Slot], eid: Hashable) -> _Slot:
    """The slot of ``eid`` in tables being restored, made on first use."""
    if type(eid) is not str:
        _checks.hashable(eid, "execution id")
    slot = slots.get(eid)
    if slot is None:
        slot = slots[eid] = _Slot()
    return slot
