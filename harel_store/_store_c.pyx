"""The compiled ``DictStore``: ``_store_py`` with typed counters, C-level record
construction and a ring buffer per trace. Same names, same order, same behaviour; the
docstrings and type hints live in ``_store_py``."""

from collections import deque
from collections.abc import Mapping
from heapq import heapify, heappop, heappush
from sys import maxsize as _MAX_SIZE

from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.ref cimport Py_INCREF
from cpython.set cimport PySet_Add, PySet_Contains, PySet_Discard
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_SET_ITEM

from ._errors import StoreConflict
from ._records import DEFAULT_TRACE_MAX, OutboxEntry, SpawnEntry, TimerOp

cdef extern from "Python.h":
    object PyType_GenericAlloc(type cls, Py_ssize_t nitems)
    bint PyObject_IS_GC(object obj)
    int PyObject_GC_IsTracked(object obj)
    void PyObject_GC_UnTrack(object obj)

cdef extern from *:
    """
    #ifndef HAREL_STORE_CYTHON_VERSION
    #define HAREL_STORE_CYTHON_VERSION "unknown"
    #endif
    """
    const char *HAREL_STORE_CYTHON_VERSION

__cython_version__ = HAREL_STORE_CYTHON_VERSION.decode()

cdef type _OutboxEntry = OutboxEntry
cdef type _SpawnEntry = SpawnEntry
cdef type _TimerOp = TimerOp
cdef object _DEAD = object()
cdef Py_ssize_t _SLACK = 64
cdef tuple _EMPTY = ()
cdef str _SCHEDULE = "schedule"
cdef str _CANCEL = "cancel"


cdef inline object _new3(type cls, object a, object b, object c):
    # What tuple.__new__(cls, (a, b, c)) does, without the argument tuple.
    cdef object record = PyType_GenericAlloc(cls, 3)
    Py_INCREF(a)
    PyTuple_SET_ITEM(record, 0, a)
    Py_INCREF(b)
    PyTuple_SET_ITEM(record, 1, b)
    Py_INCREF(c)
    PyTuple_SET_ITEM(record, 2, c)
    return record


cdef inline object _untracked(object record, Py_ssize_t size):
    # What the collector does to an exact tuple whose items cannot form a cycle, done
    # here because it never does it for tuple subclasses: entries that wait in a FIFO
    # would otherwise be traversed by every collection for as long as they wait.
    cdef Py_ssize_t i
    cdef object item
    for i in range(size):
        item = <object>PyTuple_GET_ITEM(record, i)
        if PyObject_IS_GC(item) and PyObject_GC_IsTracked(item):
            return record
    PyObject_GC_UnTrack(record)
    return record


cdef inline object _new5(type cls, object a, object b, object c, object d, object e):
    cdef object record = PyType_GenericAlloc(cls, 5)
    Py_INCREF(a)
    PyTuple_SET_ITEM(record, 0, a)
    Py_INCREF(b)
    PyTuple_SET_ITEM(record, 1, b)
    Py_INCREF(c)
    PyTuple_SET_ITEM(record, 2, c)
    Py_INCREF(d)
    PyTuple_SET_ITEM(record, 3, d)
    Py_INCREF(e)
    PyTuple_SET_ITEM(record, 4, e)
    return record


cdef object _reentered(str name):
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


cdef object _bad_exe(str problem, object value):
    return TypeError(_EXE_ERRORS[problem].format(type(value).__name__))


cdef int _hashable(object value, str what, Py_ssize_t index=-1) except -1:
    try:
        hash(value)
    except TypeError:
        what = what % index if index >= 0 else what
        raise TypeError(f"{what} must be hashable, got {type(value).__name__}") from None
    return 0


cdef object _as_int(object value, str what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    return int(value)


cdef double _as_time(object value, str what) except? -1.0:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a real number (epoch seconds), got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


cdef object _as_trace_max(object value):
    if value is None:
        return None
    value = _as_int(value, "trace_max")
    if not 0 <= value <= _MAX_SIZE:
        raise ValueError(f"trace_max must be None or between 0 and {_MAX_SIZE}, got {value}")
    return value


cdef tuple _snapshot(object iterable, str what):
    if type(iterable) is tuple:
        return <tuple>iterable
    if type(iterable) is list:
        return tuple(<list>iterable)
    try:
        iterator = iter(iterable)
    except TypeError:
        raise TypeError(f"{what} must be an iterable, got {type(iterable).__name__}") from None
    return tuple(iterator)


cdef list _outbox_entries(object emits, long long seq):
    cdef list out = []
    cdef object item
    for i, item in enumerate(_snapshot(emits, "emits")):
        item = _emit_pair(item, i)
        seq += 1
        out.append(_untracked(_new3(_OutboxEntry, seq, (<tuple>item)[0], (<tuple>item)[1]), 3))
    return out


cdef object _emit_pair(object item, Py_ssize_t i):
    if type(item) is not tuple or len(<tuple>item) != 2:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(f"emits[{i}] must be a (target_id, event) pair, got {type(item).__name__}")
        item = (item[0], item[1])
    target = (<tuple>item)[0]
    if target is not None and type(target) is not str:
        _hashable(target, "emits[%d] target_id", i)
    return item


cdef tuple _timer_ops(tuple ops):
    return tuple([_timer_op(op, i) for i, op in enumerate(ops)])


cdef object _timer_op(object op, Py_ssize_t i):
    cdef double at
    if type(op) is _TimerOp:
        action, path, fire_at = <tuple>op
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
        if type(fire_at) is float:
            at = PyFloat_AS_DOUBLE(fire_at)
        else:
            at = _as_time(fire_at, f"timers[{i}].fire_at")
        if at - at != 0.0:
            raise ValueError(f"timers[{i}].fire_at must be finite, got {fire_at!r}")
        return _new3(_TimerOp, _SCHEDULE, path, at)
    if action == "cancel":
        return _new3(_TimerOp, _CANCEL, path, None)
    raise ValueError(f"timers[{i}].action must be 'schedule' or 'cancel', got {action!r}")


cdef list _spawn_entries(object spawns, object parent_id, long long seq):
    cdef list items = []
    cdef object item, child_id, root_path, context
    cdef Py_ssize_t i
    for item in _snapshot(spawns, "spawns"):
        i = len(items)
        if type(item) is not tuple or len(<tuple>item) != 3:
            if not isinstance(item, (tuple, list)) or len(item) != 3:
                raise TypeError(
                    f"spawns[{i}] must be a (child_id, root_path, context) triple, got {type(item).__name__}"
                )
        child_id, root_path, context = item
        if type(child_id) is not str:
            _hashable(child_id, "spawns[%d] child_id", i)
        if type(context) is dict:
            context = (<dict>context).copy()
        elif isinstance(context, Mapping):
            context = dict(context)
        else:
            raise TypeError(f"spawns[{i}] context must be a mapping, got {type(context).__name__}")
        items.append(_untracked(_new5(_SpawnEntry, seq + i + 1, parent_id, child_id, root_path, context), 5))
    return items


cdef dict _trace_step(object entry, str what):
    if type(entry) is dict:
        return (<dict>entry).copy()
    if isinstance(entry, Mapping):
        return dict(entry)
    raise TypeError(f"{what} must be a mapping, got {type(entry).__name__}")


cdef class _Fifo:
    """Pending entries in seq order; ``live`` is None (dense) or the pending seqs."""

    cdef object entries
    cdef object live
    cdef object _append
    cdef object _popleft

    def __init__(self):
        self._reset(deque())
        self.live = None

    cdef inline void _reset(self, object entries):
        self.entries = entries
        self._append = entries.append
        self._popleft = entries.popleft

    def __len__(self):
        return len(self.entries) if self.live is None else len(<set>self.live)

    cdef list pending(self):
        cdef object e
        if self.live is None:
            return list(self.entries)
        return [e for e in self.entries if PySet_Contains(self.live, (<tuple>e)[0])]

    cdef int ack(self, object seq) except -1:
        cdef object entries = self.entries
        cdef object first, last, e
        cdef set live
        cdef Py_ssize_t size = len(entries)
        if self.live is None and size:
            # Identity: the int stored here is recognised without touching its memory.
            if seq is (<tuple>entries[0])[0]:
                self._popleft()
                return 0
            if seq is (<tuple>entries[size - 1])[0]:
                entries.pop()
                return 0
        if type(seq) is not int:
            seq = _as_int(seq, "seq")
        if self.live is None:
            if not entries:
                return 0
            first = (<tuple>entries[0])[0]
            if seq == first:
                self._popleft()
                return 0
            last = (<tuple>entries[len(entries) - 1])[0]
            if seq == last:
                entries.pop()
                return 0
            if not first < seq < last:
                return 0
            self.live = {(<tuple>e)[0] for e in entries}
        live = <set>self.live
        if not PySet_Discard(live, seq):
            return 0
        while entries and not PySet_Contains(live, (<tuple>entries[0])[0]):
            self._popleft()
        if not live:
            self.live = None
        elif len(entries) > 2 * len(live) + _SLACK:
            self._reset(deque([e for e in entries if PySet_Contains(live, (<tuple>e)[0])]))
            self.live = None
        return 0

    cdef inline int extend(self, list records) except -1:
        cdef object record
        for record in records:
            self._append(record)
            if self.live is not None:
                PySet_Add(self.live, (<tuple>record)[0])
        return 0


cdef class _Ring:
    """One execution's recent trace steps, and the index its next step gets.

    ``steps`` is a ring buffer: once ``maxlen`` steps are held, a new step overwrites the
    oldest, at ``head``, so trimming costs nothing."""

    cdef list steps
    cdef Py_ssize_t head
    cdef Py_ssize_t maxlen
    cdef long long next_index

    def __init__(self, Py_ssize_t maxlen):
        self.steps = []
        self.head = 0
        self.maxlen = maxlen
        self.next_index = 0

    cdef list ordered(self):
        if self.head == 0:
            return list(self.steps)
        return self.steps[self.head:] + self.steps[:self.head]

    cdef Py_ssize_t resize(self, Py_ssize_t maxlen):
        """Re-cut to a new ``maxlen`` (0: unbounded); returns the change in steps held."""
        cdef list steps = self.ordered()
        cdef Py_ssize_t before = len(steps)
        if maxlen and len(steps) > maxlen:
            del steps[:len(steps) - maxlen]
        self.steps = steps
        self.head = 0
        self.maxlen = maxlen
        return len(steps) - before

    cdef inline int push(self, object step) except -1:
        """Store ``step``; true when it added to the steps held (nothing overwritten)."""
        cdef Py_ssize_t head
        if self.maxlen == 0 or PyList_GET_SIZE(self.steps) < self.maxlen:
            self.steps.append(step)
            return True
        head = self.head
        self.steps[head] = step
        head += 1
        self.head = 0 if head == self.maxlen else head
        return False


cdef class DictStore:
    """The in-memory ``ExecutionStore``: ``load`` returns the very object that was saved."""

    cdef dict _by_id
    cdef _Fifo _outbox
    cdef dict _processed
    cdef dict _timers
    cdef list _heap
    cdef list _armed
    cdef _Fifo _spawns
    cdef dict _trace
    cdef object _trace_max
    cdef Py_ssize_t _maxlen
    cdef long long _seq
    cdef long long _spawn_seq
    cdef long long _timer_seq
    cdef Py_ssize_t _n_marks
    cdef Py_ssize_t _n_timers
    cdef Py_ssize_t _n_dead
    cdef Py_ssize_t _n_steps
    cdef bint _busy
    cdef bint _mixed

    def __init__(self, *, trace_max=DEFAULT_TRACE_MAX):
        self.trace_max = trace_max
        self._by_id = {}
        self._outbox = _Fifo()
        self._processed = {}
        self._timers = {}
        self._heap = []
        self._armed = []
        self._spawns = _Fifo()
        self._trace = {}
        self._seq = 0
        self._spawn_seq = 0
        self._timer_seq = 0
        self._n_marks = 0
        self._n_timers = 0
        self._n_dead = 0
        self._n_steps = 0

    @property
    def trace_max(self):
        return self._trace_max

    @trace_max.setter
    def trace_max(self, value):
        if self._busy:
            raise _reentered("trace_max")
        self._busy = True
        try:
            value = _as_trace_max(value)
            self._trace_max = value
            self._maxlen = value or 0
        finally:
            self._busy = False

    def load(self, execution_id):
        return self._by_id.get(execution_id)

    def save(self, exe):
        if self._busy:
            raise _reentered("save")
        self._commit(exe, _EMPTY, None, _EMPTY, _EMPTY, None)

    def commit(self, exe, emits, processed_event_id=None, timers=(), spawns=(), trace=None):
        self._commit(exe, emits, processed_event_id, timers, spawns, trace)

    cdef int _commit(
        self, object exe, object emits, object processed_event_id, object timers, object spawns,
        object trace,
    ) except -1:
        cdef tuple ops
        cdef object item
        cdef list out = None
        cdef list born = None
        cdef dict step = None
        cdef bint stamp = False
        cdef bint str_keys = True
        cdef object eid, prev, version, found, target, action, fire_at, marks, child_id, context
        cdef long long n
        if self._busy:
            raise _reentered("commit")
        self._busy = True
        try:
            try:
                eid = exe.id
            except AttributeError:
                raise _bad_exe("id", exe) from None

            if emits is _EMPTY:
                pass
            elif type(emits) is list or type(emits) is tuple:
                out = []
                n = self._seq
                for item in emits:
                    if type(item) is not tuple or len(<tuple>item) != 2:
                        out = None
                        break
                    target = (<tuple>item)[0]
                    if target is not None and type(target) is not str:
                        out = None
                        break
                    n += 1
                    out.append(_untracked(_new3(_OutboxEntry, n, target, (<tuple>item)[1]), 3))
            if out is None and emits is not _EMPTY:
                out = _outbox_entries(emits, self._seq)
            if processed_event_id is not None and type(processed_event_id) is not str:
                _hashable(processed_event_id, "processed_event_id")
                str_keys = False
            if timers is _EMPTY:
                ops = _EMPTY
            else:
                ops = _snapshot(timers, "timers")
                for item in ops:
                    if (
                    type(item) is not _TimerOp
                    or type((<tuple>item)[0]) is not str
                    or type((<tuple>item)[1]) is not str
                ):
                        ops = _timer_ops(ops)
                        str_keys = False
                        break
                    action = (<tuple>item)[0]
                    if action == _SCHEDULE:
                        fire_at = (<tuple>item)[2]
                        if type(fire_at) is not float or (
                            PyFloat_AS_DOUBLE(fire_at) - PyFloat_AS_DOUBLE(fire_at) != 0.0
                        ):
                            ops = _timer_ops(ops)
                            str_keys = False
                            break
                    elif action != _CANCEL:
                        ops = _timer_ops(ops)
                        str_keys = False
                        break
            if spawns is not _EMPTY:
                if type(spawns) is list or type(spawns) is tuple:
                    # Exact dicts are copied here: dict.copy runs no caller code.
                    born = []
                    n = self._spawn_seq
                    for item in spawns:
                        if type(item) is not tuple or len(<tuple>item) != 3:
                            born = None
                            break
                        child_id = (<tuple>item)[0]
                        context = (<tuple>item)[2]
                        if type(child_id) is not str or type(context) is not dict:
                            born = None
                            break
                        n += 1
                        born.append(
                            _untracked(
                                _new5(_SpawnEntry, n, eid, child_id, (<tuple>item)[1], (<dict>context).copy()),
                                5,
                            )
                        )
                if born is None:
                    born = _spawn_entries(spawns, eid, self._spawn_seq)
            if trace is not None:
                step = (<dict>trace).copy() if type(trace) is dict else _trace_step(trace, "trace")
                stamp = "index" not in step

            try:
                prev = self._by_id.get(eid)
            except TypeError:
                raise _bad_exe("hash", eid) from None
            try:
                version = exe.version
            except AttributeError:
                raise _bad_exe("version", exe) from None
            if type(version) is not int:
                version = _as_int(version, "execution version")
            if prev is not None and prev is not exe:
                found = prev.version
                if found != version:
                    raise StoreConflict(eid, version, found)
            if not str_keys or type(eid) is not str or self._mixed:
                self._probe(eid, processed_event_id, ops)
                self._mixed = True
            try:
                exe.version = version + 1
            except AttributeError:
                raise _bad_exe("writable", exe) from None
            if prev is not exe:
                self._by_id[eid] = exe

            if out:
                self._outbox.extend(out)
                self._seq += len(out)
            if processed_event_id is not None:
                marks = self._processed.get(eid)
                if marks is None:
                    self._processed[eid] = {processed_event_id}
                    self._n_marks += 1
                elif not PySet_Contains(marks, processed_event_id):
                    PySet_Add(marks, processed_event_id)
                    self._n_marks += 1
            if ops:
                self._apply_timers(eid, ops)
            if born:
                self._spawns.extend(born)
                self._spawn_seq += len(born)
            if step is not None:
                self._push_step(eid, step, stamp)
        finally:
            self._busy = False
        return 0

    def is_processed(self, execution_id, event_id):
        marks = self._processed.get(execution_id)
        return marks is not None and PySet_Contains(marks, event_id) == 1

    def pending_outbox(self):
        return self._outbox.pending()

    def ack_outbox(self, seq):
        if self._busy:
            raise _reentered("ack_outbox")
        self._busy = True
        try:
            self._outbox.ack(seq)
        finally:
            self._busy = False

    def pending_spawns(self):
        return self._spawns.pending()

    def ack_spawn(self, seq):
        if self._busy:
            raise _reentered("ack_spawn")
        self._busy = True
        try:
            self._spawns.ack(seq)
        finally:
            self._busy = False

    def due_timers(self, now):
        cdef double at = PyFloat_AS_DOUBLE(now) if type(now) is float else _as_time(now, "now")
        if self._armed:
            self._heap_armed()
        cdef list heap = self._heap
        cdef list due = []
        cdef list entry
        while heap and (<list>heap[0])[2] is _DEAD:
            heappop(heap)
            self._n_dead -= 1
        if not heap or not PyFloat_AS_DOUBLE((<list>heap[0])[0]) <= at:
            return []
        _collect_due(heap, 0, PyList_GET_SIZE(heap), at, due)
        due.sort()
        return [(entry[2], entry[3], entry[0]) for entry in due]

    def delete_timer(self, execution_id, path, fire_at):
        cdef dict paths = self._timers.get(execution_id)
        cdef list entry
        if self._busy:
            raise _reentered("delete_timer")
        self._busy = True
        try:
            if paths is None:
                return
            entry = paths.get(path)
            if entry is None or not entry[0] == fire_at or entry[2] is _DEAD:
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

    def append_trace(self, execution_id, entry):
        self._record(execution_id, entry)

    def read_trace(self, execution_id):
        cdef _Ring ring = self._trace.get(execution_id)
        return [] if ring is None else ring.ordered()

    def forget(self, execution_id):
        cdef list entry
        cdef _Ring ring
        if self._busy:
            raise _reentered("forget")
        self._busy = True
        try:
            held = [
                execution_id in self._by_id,
                execution_id in self._processed,
                execution_id in self._timers,
                execution_id in self._trace,
            ]
            if not any(held):
                return
            self._by_id.pop(execution_id, None)
            marks = self._processed.pop(execution_id, None)
            if marks is not None:
                self._n_marks -= len(marks)
            paths = self._timers.pop(execution_id, None)
            if paths is not None:
                for entry in (<dict>paths).values():
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

    def stats(self):
        return {
            "executions": len(self._by_id),
            "outbox": len(self._outbox),
            "spawns": len(self._spawns),
            "timers": self._n_timers,
            "processed": self._n_marks,
            "traces": len(self._trace),
            "trace_steps": self._n_steps,
        }

    def close(self):
        pass

    def _record_trace(self, execution_id, entry):
        self._record(execution_id, entry)

    cdef int _record(self, object execution_id, object entry) except -1:
        cdef dict step = (<dict>entry).copy() if type(entry) is dict else _trace_step(entry, "trace entry")
        cdef bint stamp = "index" not in step
        if self._busy:
            raise _reentered("append_trace")
        self._busy = True
        try:
            if type(execution_id) is not str:
                _hashable(execution_id, "execution_id")
                self._mixed = True
            return self._push_step(execution_id, step, stamp)
        finally:
            self._busy = False

    cdef int _probe(self, object eid, object processed_event_id, tuple ops) except -1:
        cdef object op
        eid in self._trace
        marks = self._processed.get(eid)
        if marks is not None and processed_event_id is not None:
            processed_event_id in marks
        paths = self._timers.get(eid)
        if paths:
            for op in ops:
                (<tuple>op)[1] in paths
        return 0

    cdef int _apply_timers(self, object eid, tuple ops) except -1:
        cdef dict timers = self._timers
        cdef dict paths = timers.get(eid)
        cdef list entry, old
        cdef object op, path, n
        if paths is None:
            paths = {}
            timers[eid] = paths
        for op in ops:
            path = (<tuple>op)[1]
            old = paths.get(path)
            if (<tuple>op)[0] == "cancel":
                if old is not None:
                    del paths[path]
                    old[2] = _DEAD
                    self._n_dead += 1
                    self._n_timers -= 1
                continue
            self._timer_seq += 1
            n = self._timer_seq
            if old is None:
                self._n_timers += 1
            elif old[4] is False:
                old[0] = (<tuple>op)[2]
                old[1] = n
                continue
            else:
                old[2] = _DEAD
                self._n_dead += 1
            entry = [(<tuple>op)[2], n, eid, path, False]
            paths[path] = entry
            self._armed.append(entry)
        if not paths:
            del timers[eid]
        if self._n_dead > self._n_timers + _SLACK:
            self._compact_timers()
        return 0

    cdef int _heap_armed(self) except -1:
        cdef list heap = self._heap
        cdef list armed = [e for e in self._armed if (<list>e)[2] is not _DEAD]
        cdef list entry
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
        return 0

    cdef int _compact_timers(self) except -1:
        cdef list heap = [e for e in self._heap if (<list>e)[2] is not _DEAD]
        heapify(heap)
        self._heap = heap
        self._armed = [e for e in self._armed if (<list>e)[2] is not _DEAD]
        self._n_dead = 0
        return 0

    cdef int _push_step(self, object execution_id, dict step, bint stamp) except -1:
        cdef _Ring ring = self._trace.get(execution_id)
        cdef long long index
        if ring is None:
            ring = _Ring(self._maxlen)
            self._trace[execution_id] = ring
        elif ring.maxlen != self._maxlen:
            self._n_steps += ring.resize(self._maxlen)
        index = ring.next_index
        ring.next_index = index + 1
        if stamp:
            step["index"] = index
        if ring.push(step):
            self._n_steps += 1
        return 0


cdef int _collect_due(list heap, Py_ssize_t i, Py_ssize_t size, double now, list due) except -1:
    # Depth-first over the heap's subtrees whose root is due: visits only due entries
    # and their immediate children.
    cdef list entry
    while i < size:
        entry = <list>PyList_GET_ITEM(heap, i)
        if not PyFloat_AS_DOUBLE(entry[0]) <= now:
            return 0
        if entry[2] is not _DEAD:
            due.append(entry)
        _collect_due(heap, 2 * i + 1, size, now, due)
        i = 2 * i + 2
    return 0
