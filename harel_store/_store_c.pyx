"""The compiled ``DictStore``: ``_store_py`` with typed counters, C-level record
construction and a ring buffer per trace. Same names, same order, same behaviour; the
docstrings and type hints live in ``_store_py``, and the checks of unusual input are the
very functions of ``_checks`` that the pure store calls."""

from collections import deque
from copy import deepcopy
from heapq import heapify, heappop, heappush
from time import monotonic, sleep

from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_FromDouble
from libc.math cimport INFINITY
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.ref cimport PyObject, Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM

from . import _checks, _operate, _records, _transfer
from . import _digest
from ._errors import IdempotencyConflict, StaleWriter, StoreConflict
from ._errors import shown as _shown
from ._listing import Listing as _Listing
from ._records import DEFAULT_TRACE_MAX, OutboxEntry, SpawnEntry, TimerOp
from ._records import Execution as _Exe

cdef extern from "Python.h":
    object PyType_GenericAlloc(type cls, Py_ssize_t nitems)
    bint PyObject_IS_GC(object obj)
    bint PyTuple_CheckExact(object obj)
    int PyObject_GC_IsTracked(object obj)
    void PyObject_GC_UnTrack(object obj)
    # A borrowed reference: compared, never owned.
    PyObject *PyDict_SetDefault(object d, object key, object default) except NULL
    Py_ssize_t PyDict_GET_SIZE(object d)
    bint PyCFunction_Check(object obj)
    int PyCFunction_GET_FLAGS(object func)
    void *PyCFunction_GET_FUNCTION(object func)
    PyObject *PyCFunction_GET_SELF(object func)
    int METH_O
    void Py_DECREF(PyObject *obj)
    void Py_XDECREF(PyObject *obj)
    ctypedef struct _Type "PyTypeObject":
        unsigned long tp_flags
        unsigned int tp_version_tag
        void *tp_getattro
        void *tp_setattro
    _Type *Py_TYPE(object obj)
    unsigned long Py_TPFLAGS_VALID_VERSION_TAG
    PyObject *_PyType_Lookup(_Type *tp, object name)
    PyObject *PyObject_GenericGetAttr(PyObject *obj, PyObject *name)
    int PyObject_GenericSetAttr(PyObject *obj, PyObject *name, PyObject *value)
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member

ctypedef PyObject *(*_MethO)(PyObject *, PyObject *)

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
cdef type _Commit = _records.Commit
cdef object _DEAD = object()
cdef Py_ssize_t _SLACK = 64
cdef tuple _EMPTY = ()
cdef str _SCHEDULE = "schedule"
cdef str _CANCEL = "cancel"
cdef double _STAMP = 0.001
cdef object _reentered = _checks.reentered
cdef object _bad_exe = _checks.bad_exe


# An exact Execution's id and version are read and written in their slots, as the
# interpreter's specialised LOAD_ATTR_SLOT does: Cython's generic attribute access cost
# about 400 instructions a commit. The slots are used only while Execution's attribute
# lookup is still the one checked here (same descriptors, generic getattr/setattr); the
# type's version tag, which CPython resets on any change to the class, keeps that check
# cheap. Anything else (a subclass, a replaced attribute, a deleted slot) goes generic.
cdef type _Execution = _Exe
cdef object _MemberType = type(_Exe.version)
cdef object _ID_DESCR = _Exe.__dict__["id"]
cdef object _VERSION_DESCR = _Exe.__dict__["version"]
cdef unsigned int _exe_tag = 0


cdef Py_ssize_t _slot_offset(object descr):
    cdef PyMemberDef *member
    if type(descr) is not _MemberType:
        return 0
    member = (<PyMemberDescrObject *>descr).d_member
    # 16 is T_OBJECT_EX and 1 READONLY, the same values from 3.10 to 3.13.
    if member.type != 16 or member.flags & 1:
        return 0
    return member.offset


cdef Py_ssize_t _ID_AT = _slot_offset(_ID_DESCR)
cdef Py_ssize_t _VERSION_AT = _slot_offset(_VERSION_DESCR)


cdef bint _slots_checked(_Type *tp):
    global _exe_tag
    if (
        _ID_AT == 0
        or _VERSION_AT == 0
        or tp.tp_getattro != <void *>PyObject_GenericGetAttr
        or tp.tp_setattro != <void *>PyObject_GenericSetAttr
        or _PyType_Lookup(tp, "id") != <PyObject *>_ID_DESCR
        or _PyType_Lookup(tp, "version") != <PyObject *>_VERSION_DESCR
    ):
        return False
    # _PyType_Lookup gives the type a tag where it can; without one, check every time.
    if tp.tp_flags & Py_TPFLAGS_VALID_VERSION_TAG:
        _exe_tag = tp.tp_version_tag
    return True


cdef inline bint _own_slots(object exe):
    cdef _Type *tp = Py_TYPE(exe)
    if <PyObject *>tp != <PyObject *>_Execution:
        return False
    if tp.tp_flags & Py_TPFLAGS_VALID_VERSION_TAG and tp.tp_version_tag == _exe_tag:
        return True
    return _slots_checked(tp)


cdef inline PyObject **_slot_at(object exe, Py_ssize_t offset):
    return <PyObject **>((<char *><PyObject *>exe) + offset)


cdef inline object _exe_attr(object exe, Py_ssize_t offset, str name):
    cdef PyObject *held
    if _own_slots(exe):
        held = _slot_at(exe, offset)[0]
        if held != NULL:
            return <object>held
    try:
        return getattr(exe, name)
    except AttributeError:
        raise _bad_exe(name, exe) from None


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
    # What the collector does to an exact tuple, done here because it never does it for
    # tuple subclasses: entries that wait in a FIFO would otherwise be traversed by every
    # collection for as long as they wait. As for a tuple, any item that is or may later
    # become tracked (an untracked dict may be filled) keeps the record tracked.
    cdef Py_ssize_t i
    cdef object item
    for i in range(size):
        item = <object>PyTuple_GET_ITEM(record, i)
        if PyObject_IS_GC(item) and (not PyTuple_CheckExact(item) or PyObject_GC_IsTracked(item)):
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


cdef class _Fifo:
    """Pending entries in seq order; ``live`` is None (dense) or the pending seqs."""

    cdef object entries
    cdef _MethO append
    cdef set live
    cdef object fresh
    cdef dict leases
    cdef list expiries
    cdef list retry
    cdef object stamps

    def __cinit__(self):
        self.renew(deque())
        self.stamps = deque()
        self.live = None
        self.fresh = None
        self.leases = {}
        self.expiries = []
        self.retry = []

    def __len__(self):
        return len(self.entries) if self.live is None else len(self.live)

    cdef list pending(self):
        cdef object e
        if self.live is None:
            return list(self.entries)
        return [e for e in self.entries if (<tuple>e)[0] in self.live]

    cdef inline int renew(self, object entries) except -1:
        # deque.append's C function is kept and called directly: a commit appends two or
        # three records, and a Python-level call (or deque.extend's iterator) costs more.
        cdef object append = entries.append
        if (
            not PyCFunction_Check(append)
            or PyCFunction_GET_FLAGS(append) != METH_O
            or PyCFunction_GET_SELF(append) != <PyObject *>entries
        ):
            raise RuntimeError("collections.deque.append is not a one-argument C function of its deque")
        self.entries = entries
        self.append = <_MethO>PyCFunction_GET_FUNCTION(append)
        return 0

    cdef int extend(self, tuple records, long long first, long long last) except -1:
        cdef object record
        cdef PyObject *done
        for record in records:
            done = self.append(<PyObject *>self.entries, <PyObject *>record)
            if done is NULL:
                return -1
            Py_DECREF(done)
        if self.live is not None:
            self.live.update(range(first, last + 1))
            if self.fresh is not None:
                self.fresh.extend(records)
        return 0

    cdef int drained(self) except -1:
        cdef object stamps = self.stamps
        while len(stamps) > 1:
            stamps.popleft()
        return 0

    cdef int stamp(self, long long first, object now) except -1:
        cdef object stamps = self.stamps
        if not self.entries:
            stamps.clear()
        elif (<tuple>stamps[len(stamps) - 1])[0] == first:
            stamps.pop()
        stamps.append((first, now))
        if len(stamps) > 2 * len(self.entries) + 8:
            self.compact()
        return 0

    cdef int compact(self) except -1:
        cdef set live = self.live
        cdef list stamps = list(self.stamps)
        cdef object kept = deque()
        cdef Py_ssize_t i = 0
        cdef object entry, seq
        for entry in self.entries:
            seq = (<tuple>entry)[0]
            if live is not None and seq not in live:
                continue
            while i + 1 < len(stamps) and (<tuple>stamps[i + 1])[0] <= seq:
                i += 1
            if stamps and (not kept or kept[len(kept) - 1] is not stamps[i]):
                kept.append(stamps[i])
        if stamps and (not kept or kept[len(kept) - 1] is not stamps[len(stamps) - 1]):
            kept.append(stamps[len(stamps) - 1])
        self.stamps = kept
        return 0

    cdef object oldest(self):
        cdef object entries = self.entries
        cdef object stamps = self.stamps
        cdef object first
        if not entries:
            return None
        first = (<tuple>entries[0])[0]
        while len(stamps) > 1 and (<tuple>stamps[1])[0] <= first:
            stamps.popleft()
        return (<tuple>stamps[0])[1] if stamps else None

    cdef tuple leased(self, double clock):
        cdef set live = self.live
        cdef dict leases = self.leases
        cdef Py_ssize_t held = 0, expired = 0
        cdef object seq, lease, retried
        if live is None:
            return 0, 0
        for seq, lease in leases.items():
            if seq in live:
                if PyFloat_AS_DOUBLE((<tuple>lease)[0]) > clock:
                    held += 1
                else:
                    expired += 1
        for retried in self.retry:
            seq = (<tuple>retried)[0]
            if seq in live and seq not in leases:
                expired += 1
        return held, expired

    cdef int ack(self, object seq) except -1:
        cdef object entries = self.entries
        cdef object e
        cdef set live = self.live
        cdef Py_ssize_t size = len(entries), limit
        if live is None and size:
            # Identity: the int stored here is recognised without touching its memory.
            if seq is (<tuple>entries[0])[0]:
                entries.popleft()
                if size == 1:
                    self.drained()
                return 0
            if seq is (<tuple>entries[size - 1])[0]:
                entries.pop()
                if size == 1:
                    self.drained()
                return 0
        if type(seq) is not int:
            seq = _checks.as_int(seq, "seq")
        if live is None:
            if not size:
                return 0
            if seq == (<tuple>entries[0])[0]:
                entries.popleft()
                if size == 1:
                    self.drained()
                return 0
            if seq == (<tuple>entries[size - 1])[0]:
                entries.pop()
                if size == 1:
                    self.drained()
                return 0
            if not (<tuple>entries[0])[0] < seq < (<tuple>entries[size - 1])[0]:
                return 0
            self.live = live = {(<tuple>e)[0] for e in entries}
        if seq not in live:
            return 0
        live.discard(seq)
        while entries and (<tuple>entries[0])[0] not in live:
            entries.popleft()
        fresh = self.fresh
        if fresh is not None:
            self.leases.pop(seq, None)
            limit = 2 * len(live) + _SLACK
            if len(fresh) > limit:
                self.fresh = deque([e for e in fresh if (<tuple>e)[0] in live])
            if len(self.retry) > limit:
                self.retry = [e for e in self.retry if (<tuple>e)[0] in live]
                heapify(self.retry)
        if not live:
            self.drained()
            if fresh is None:
                self.live = None
        elif len(entries) > 2 * len(live) + _SLACK:
            self.renew(deque([e for e in entries if (<tuple>e)[0] in live]))
            if fresh is None:
                self.live = None
        return 0

    cdef list claim(self, Py_ssize_t limit, double until, double now):
        cdef list claimed = []
        cdef list expiries, retry
        cdef dict leases = self.leases
        cdef tuple held
        cdef object entry, fresh, seq
        cdef set live
        if self.fresh is None:
            if self.live is None:
                self.live = {(<tuple>e)[0] for e in self.entries}
            self.fresh = deque(self.pending())
        live = self.live
        fresh = self.fresh
        expiries = self.expiries
        retry = self.retry
        while expiries and PyFloat_AS_DOUBLE((<tuple>expiries[0])[0]) <= now:
            expiry, seq = heappop(expiries)
            held = leases.get(seq)
            if held is not None and held[0] == expiry:
                del leases[seq]
                heappush(retry, (seq, held[1]))
        while PyList_GET_SIZE(claimed) < limit:
            while retry and (<tuple>retry[0])[0] not in live:
                heappop(retry)
            while fresh and (<tuple>fresh[0])[0] not in live:
                fresh.popleft()
            if retry and (not fresh or (<tuple>retry[0])[0] < (<tuple>fresh[0])[0]):
                entry = (<tuple>heappop(retry))[1]
            elif fresh:
                entry = fresh.popleft()
            else:
                break
            seq = (<tuple>entry)[0]
            leases[seq] = (until, entry)
            heappush(expiries, (until, seq))
            claimed.append(entry)
        if len(expiries) > 2 * len(leases) + _SLACK:
            self.expiries = [((<tuple>held)[0], seq) for seq, held in leases.items()]
            heapify(self.expiries)
        return claimed


cdef class _Ring:
    """One execution's recent trace steps, and the index its next step gets.

    ``steps`` is a ring buffer: once ``maxlen`` steps are held, a new step overwrites the
    oldest, at ``head``, so trimming costs nothing."""

    cdef list steps
    cdef Py_ssize_t head
    cdef Py_ssize_t maxlen
    cdef long long next_index

    def __cinit__(self, Py_ssize_t maxlen):
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


cdef class _Slot:
    """Everything the store holds for one execution id; each part ``None`` until used."""

    cdef readonly object exe  # read by _listing
    cdef dict marks
    cdef dict paths
    cdef _Ring ring
    cdef dict commits
    cdef object epoch


cdef tuple _own(object records, type cls, Py_ssize_t size):
    # What a _checks helper returned, as this module will read it, unchecked: a helper
    # replaced at run time must not make it read past the end of a record.
    cdef tuple checked = tuple(records)
    cdef object record
    for record in checked:
        if (
            type(record) is not cls
            or PyTuple_GET_SIZE(record) != size
            or (size == 5 and type((<tuple>record)[4]) is not dict)
        ):
            raise RuntimeError(
                f"harel_store._checks returned {record!r} where a {cls.__name__} of the "
                "store's own making was due: was the module changed at run time?"
            )
    return checked


cdef tuple _replay_emits(tuple out):
    # The staged records are the store's own tuples of 3 items: read in place.
    cdef tuple emitted = PyTuple_New(PyTuple_GET_SIZE(out))
    cdef object record, event
    cdef Py_ssize_t i
    for i in range(PyTuple_GET_SIZE(out)):
        record = (<tuple>out)[i]
        event = (<tuple>record)[2]
        if type(event) is dict:
            event = (<dict>event).copy()
        elif type(event) is list:
            event = (<list>event)[:]
        record = ((<tuple>record)[1], event)
        Py_INCREF(record)
        PyTuple_SET_ITEM(emitted, i, record)
    return emitted


cdef tuple _body(tuple emitted, object processed_event_id, tuple ops, tuple born, object step):
    # The staged spawns are the store's own tuples of 5 items, their contexts its own
    # exact dicts: read in place, as the pure store's copies read them.
    cdef object op, record
    cdef tuple spawned = _EMPTY
    cdef Py_ssize_t i
    for op in ops:
        if (<tuple>op)[0] is _CANCEL and (<tuple>op)[2] is not None:
            ops = _own(_checks.timer_ops(ops), _TimerOp, 3)
            break
    if born:
        spawned = PyTuple_New(PyTuple_GET_SIZE(born))
        for i in range(PyTuple_GET_SIZE(born)):
            record = (<tuple>born)[i]
            record = ((<tuple>record)[2], (<tuple>record)[3], (<dict>(<tuple>record)[4]).copy())
            Py_INCREF(record)
            PyTuple_SET_ITEM(spawned, i, record)
    return (emitted, processed_event_id, ops, spawned, step)


cdef bint _same_body(
    tuple body, object emits, object processed_event_id, object timers, object spawns, object trace,
) except -1:
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


cdef list _batch(object commits):
    # Each call a tuple or a Commit, read in place: the original Commit when it needs no copy.
    cdef list calls = []
    cdef set seen = set()
    cdef Py_ssize_t i = 0, size
    cdef object item, call, exe, eid, commit_id, epoch
    # A copy: caller code run by the checks below cannot change what is written.
    cdef list items = list(commits) if type(commits) is list else list(_checks.batch(commits))
    for item in items:
        if type(item) is not _Commit and not isinstance(item, _Commit):
            _checks.batch(items)  # names the item that is not a Commit
        call = item
        exe = <object>PyTuple_GET_ITEM(item, 0)
        eid = None
        try:
            if not (
                _own_slots(exe)
                and type(eid := _exe_attr(exe, _ID_AT, "id")) is str
                and type(_exe_attr(exe, _VERSION_AT, "version")) is int
                and _plain(
                    <object>PyTuple_GET_ITEM(item, 1), <object>PyTuple_GET_ITEM(item, 2),
                    <object>PyTuple_GET_ITEM(item, 3), <object>PyTuple_GET_ITEM(item, 4),
                    <object>PyTuple_GET_ITEM(item, 5),
                )
            ):
                emits, timers, spawns, trace = _checked(
                    exe, item[1], item[2], item[3], item[4], item[5]
                )
                call = (exe, emits, item[2], timers, spawns, trace, item[6], item[7])
                eid = None
            commit_id = <object>PyTuple_GET_ITEM(item, 6)
            epoch = <object>PyTuple_GET_ITEM(item, 7)
            if commit_id is not None or epoch is not None:
                call = (
                    *call[:6],
                    None if commit_id is None else _checks.as_commit_id(commit_id),
                    None if epoch is None else _checks.as_epoch(epoch),
                )
        except (TypeError, ValueError) as exc:
            raise _checks.in_batch(exc, i) from exc
        if eid is None:  # a plain commit's id was read above
            eid = exe.id
        size = len(seen)
        seen.add(eid)
        if len(seen) == size:
            _checks.no_twins([c[0].id for c in calls] + [eid])
        calls.append(call)
        i += 1
    return calls


cdef bint _plain(object emits, object mark, object timers, object spawns, object trace):
    cdef object item, target, op, fire_at
    if mark is not None and type(mark) is not str:
        return False
    if trace is not None and type(trace) is not dict:
        return False
    if type(emits) is not list and type(emits) is not tuple:
        return False
    for item in emits:
        if type(item) is not tuple or PyTuple_GET_SIZE(item) != 2:
            return False
        target = (<tuple>item)[0]
        if target is not None and type(target) is not str:
            return False
    if type(timers) is not list and type(timers) is not tuple:
        return False
    for op in timers:
        if type(op) is not _TimerOp or type((<tuple>op)[1]) is not str:
            return False
        if (<tuple>op)[0] is _SCHEDULE:
            fire_at = (<tuple>op)[2]
            if type(fire_at) is not float or (
                PyFloat_AS_DOUBLE(fire_at) - PyFloat_AS_DOUBLE(fire_at) != 0.0
            ):
                return False
        elif (<tuple>op)[0] is not _CANCEL:
            return False
    if type(spawns) is not list and type(spawns) is not tuple:
        return False
    for item in spawns:
        if type(item) is not tuple or PyTuple_GET_SIZE(item) != 3:
            return False
        if type((<tuple>item)[0]) is not str or type((<tuple>item)[2]) is not dict:
            return False
    return True


cdef tuple _checked(object exe, object emits, object mark, object timers, object spawns, object trace):
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


cdef class DictStore:
    """The in-memory ``ExecutionStore``: ``load`` returns the very object that was saved."""

    cdef dict _slots
    cdef _Fifo _outbox
    cdef _Fifo _spawns
    cdef list _heap
    cdef list _armed
    cdef list _leased
    cdef object _listing
    cdef object _trace_max
    cdef object _clock
    cdef bint _monotonic
    cdef object _stamp
    cdef double _stamped
    cdef Py_ssize_t _maxlen
    cdef long long _seq
    cdef long long _spawn_seq
    cdef long long _timer_seq
    cdef long long _seen_work
    cdef Py_ssize_t _n_exes
    cdef Py_ssize_t _n_marks
    cdef Py_ssize_t _n_ids
    cdef Py_ssize_t _n_timers
    cdef Py_ssize_t _n_dead
    cdef Py_ssize_t _n_rings
    cdef Py_ssize_t _n_steps
    cdef bint _busy
    cdef bint _mixed

    preserves_identity = True
    durable = False

    def __cinit__(self, *args, **kwargs):
        # Everything the C code relies on exists before __init__ runs (or is skipped).
        self._slots = {}
        self._outbox = _Fifo()
        self._spawns = _Fifo()
        self._heap = []
        self._armed = []
        self._leased = []
        self._trace_max = DEFAULT_TRACE_MAX
        self._maxlen = DEFAULT_TRACE_MAX
        self._clock = monotonic
        self._monotonic = True
        self._stamped = -INFINITY

    def __init__(self, *, trace_max=DEFAULT_TRACE_MAX, clock=None):
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be a function giving seconds, got {type(clock).__name__}")
        self.trace_max = trace_max
        self._clock = monotonic if clock is None else clock
        self._monotonic = self._clock is monotonic

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __reduce_ex__(self, protocol):
        raise TypeError(_COPY_REFUSED)

    def __copy__(self):
        raise TypeError(_COPY_REFUSED)

    def __deepcopy__(self, memo):
        raise TypeError(_COPY_REFUSED)

    @property
    def trace_max(self):
        return self._trace_max

    @trace_max.setter
    def trace_max(self, value):
        if self._busy:
            raise _reentered("trace_max")
        self._busy = True
        try:
            value = _checks.as_trace_max(value)
            self._trace_max = value
            self._maxlen = value or 0
        finally:
            self._busy = False

    def load(self, execution_id):
        cdef _Slot slot = self._slots.get(execution_id)
        return None if slot is None else slot.exe

    def save(self, exe, *, epoch=None):
        if self._busy:
            raise _reentered("save")
        self._commit(exe, _EMPTY, None, _EMPTY, _EMPTY, None, None, epoch)

    def commit(
        self, exe, emits, processed_event_id=None, timers=(), spawns=(), trace=None, *,
        commit_id=None, epoch=None,
    ):
        self._commit(exe, emits, processed_event_id, timers, spawns, trace, commit_id, epoch)

    cdef int _commit(
        self, object exe, object emits, object processed_event_id, object timers, object spawns,
        object trace, object commit_id, object epoch,
    ) except -1:
        cdef tuple ops = _EMPTY
        cdef object item
        # Staged in tuples made at their final size: no list, no growth, no item array.
        cdef tuple out = None
        cdef tuple born = None
        cdef tuple body = None
        cdef object record
        cdef Py_ssize_t i, count
        cdef dict step = None
        cdef dict slots = self._slots
        cdef dict marks = None
        cdef dict undo = None
        cdef _Slot slot
        cdef _Ring ring
        cdef tuple plan = None
        cdef bint str_keys = True
        cdef bint late_mark
        cdef object eid, prev, version, found, target, action, fire_at, child_id, context, held
        cdef PyObject *prior
        cdef tuple fence
        cdef long long n
        cdef object now = None
        cdef double at
        cdef Py_ssize_t size
        if self._busy:
            raise _reentered("commit")
        self._busy = True
        try:
            eid = _exe_attr(exe, _ID_AT, "id")
            if commit_id is not None or epoch is not None:
                fence = self._fence(exe, eid, commit_id, epoch, emits, processed_event_id, timers, spawns, trace)
                if fence is None:
                    return 0
                commit_id, epoch = fence

            if emits is _EMPTY:
                pass
            elif type(emits) is list or type(emits) is tuple:
                count = len(emits)
                out = PyTuple_New(count)
                n = self._seq
                i = 0
                for item in emits:
                    # A finalizer run by a collection that an allocation here sets off can
                    # resize the list: any size but the one counted takes the slow path.
                    if i == count or type(item) is not tuple or PyTuple_GET_SIZE(item) != 2:
                        out = None
                        break
                    target = (<tuple>item)[0]
                    if target is not None and type(target) is not str:
                        out = None
                        break
                    n += 1
                    record = _untracked(_new3(_OutboxEntry, n, target, (<tuple>item)[1]), 3)
                    Py_INCREF(record)
                    PyTuple_SET_ITEM(out, i, record)
                    i += 1
                if i != count:
                    out = None
            if out is None and emits is not _EMPTY:
                out = _own(_checks.outbox_entries(emits, self._seq), _OutboxEntry, 3)
            if processed_event_id is not None and type(processed_event_id) is not str:
                _checks.hashable(processed_event_id, "processed_event_id")
                str_keys = False
            if timers is not _EMPTY:
                if type(timers) is tuple:
                    ops = <tuple>timers
                elif type(timers) is list:
                    ops = tuple(<list>timers)
                else:
                    ops = _checks.snapshot(timers, "timers")
                for item in ops:
                    if (
                        type(item) is not _TimerOp
                        or PyTuple_GET_SIZE(item) != 3
                        or type((<tuple>item)[1]) is not str
                    ):
                        ops = _own(_checks.timer_ops(ops), _TimerOp, 3)
                        break
                    # Actions by identity, as in the pure store: others take the slow path.
                    action = (<tuple>item)[0]
                    if action is _SCHEDULE:
                        fire_at = (<tuple>item)[2]
                        if type(fire_at) is not float or (
                            PyFloat_AS_DOUBLE(fire_at) - PyFloat_AS_DOUBLE(fire_at) != 0.0
                        ):
                            ops = _own(_checks.timer_ops(ops), _TimerOp, 3)
                            break
                    elif action is not _CANCEL:
                        ops = _own(_checks.timer_ops(ops), _TimerOp, 3)
                        break
                for item in ops:
                    if type((<tuple>item)[1]) is not str:
                        str_keys = False
                        break
            if spawns is not _EMPTY:
                if type(spawns) is list or type(spawns) is tuple:
                    # Exact dicts are copied here: dict.copy runs no caller code.
                    count = len(spawns)
                    born = PyTuple_New(count)
                    n = self._spawn_seq
                    i = 0
                    for item in spawns:
                        if i == count or type(item) is not tuple or PyTuple_GET_SIZE(item) != 3:
                            born = None
                            break
                        child_id = (<tuple>item)[0]
                        context = (<tuple>item)[2]
                        if type(child_id) is not str or type(context) is not dict:
                            born = None
                            break
                        n += 1
                        record = _untracked(
                            _new5(_SpawnEntry, n, eid, child_id, (<tuple>item)[1], (<dict>context).copy()),
                            5,
                        )
                        Py_INCREF(record)
                        PyTuple_SET_ITEM(born, i, record)
                        i += 1
                    if i != count:
                        born = None
                if born is None:
                    born = _own(_checks.spawn_entries(spawns, eid, self._spawn_seq), _SpawnEntry, 5)
            if trace is not None:
                step = (<dict>trace).copy() if type(trace) is dict else _checks.trace_step(trace, "trace")
            if commit_id is not None:
                # What a replay is compared with, made whole now: the write phase only
                # files it under the commit id (an exact str), running no Python code.
                body = _body(
                    _replay_emits(out) if out else _EMPTY,
                    processed_event_id,
                    ops,
                    born,
                    None if step is None else step.copy(),
                )
            if processed_event_id is not None or commit_id is not None or out or born:
                # When marks, commit ids and entries are recorded, read before the CAS.
                at = self._now()
                if not 0.0 <= at - self._stamped < _STAMP:
                    self._restamp(at)
                now = self._stamp
            try:
                slot = slots.get(eid)
            except TypeError:
                raise _bad_exe("hash", eid) from None
            version = _exe_attr(exe, _VERSION_AT, "version")
            if type(version) is not int:
                version = _checks.as_int(version, "execution version")
            prev = None if slot is None else slot.exe
            if prev is not None and prev is not exe:
                found = prev.version
                if found != version:
                    raise StoreConflict(eid, version, found)
            if ops and (not str_keys or self._mixed):
                plan = _plan_timers(None if slot is None else slot.paths, ops, eid)
            if step is not None:
                # One lookup: the step is the store's own copy, so stamping it is no write.
                PyDict_SetDefault(
                    step, "index", 0 if slot is None or slot.ring is None else slot.ring.next_index
                )

            # The write phase: one insert under a caller's key, then the version setter,
            # which undoes that insert if it raises; then no caller code at all.
            late_mark = processed_event_id is not None
            if slot is None:
                slot = _Slot()
                if late_mark:
                    slot.marks = {processed_event_id: now}
                if PyDict_SetDefault(slots, eid, slot) != <PyObject *>slot:
                    raise _checks.inconsistent("the execution id")
                undo = slots
            elif late_mark and (not str_keys or self._mixed):
                undo = self._mark_first(slot, processed_event_id, now)
                late_mark = False
            try:
                if _own_slots(exe):
                    # What the slot's setter does: the old value is released last.
                    held = version + 1
                    Py_INCREF(held)
                    prior = _slot_at(exe, _VERSION_AT)[0]
                    _slot_at(exe, _VERSION_AT)[0] = <PyObject *>held
                    Py_XDECREF(prior)
                else:
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
                    slot.marks = {processed_event_id: now}
                    self._n_marks += 1
                else:
                    size = PyDict_GET_SIZE(marks)
                    PyDict_SetDefault(marks, processed_event_id, now)
                    self._n_marks += PyDict_GET_SIZE(marks) - size
            if not str_keys:
                self._mixed = True
            if commit_id is not None:
                _enter(slot, commit_id, epoch, version + 1, body, now)
                self._n_ids += 1
            elif epoch is not None:
                _enter(slot, None, epoch, version + 1, None, now)

            if out:
                self._outbox.extend(out, self._seq + 1, self._seq + len(out))
                self._seq += len(out)
            if plan is not None:
                self._apply_plan(slot, plan)
            elif ops:
                self._apply_timers(slot, eid, ops)
            if born:
                self._spawns.extend(born, self._spawn_seq + 1, self._spawn_seq + len(born))
                self._spawn_seq += len(born)
            if step is not None:
                self._push_step(slot, step)
        finally:
            self._busy = False
        return 0

    def commit_many(self, commits):
        if self._busy:
            raise _reentered("commit_many")
        cdef list calls = _batch(commits)
        cdef list outcomes = []
        cdef object call
        for call in calls:
            try:
                self._commit(
                    <object>PyTuple_GET_ITEM(call, 0), <object>PyTuple_GET_ITEM(call, 1),
                    <object>PyTuple_GET_ITEM(call, 2), <object>PyTuple_GET_ITEM(call, 3),
                    <object>PyTuple_GET_ITEM(call, 4), <object>PyTuple_GET_ITEM(call, 5),
                    <object>PyTuple_GET_ITEM(call, 6), <object>PyTuple_GET_ITEM(call, 7),
                )
            except (StoreConflict, StaleWriter, IdempotencyConflict) as refused:
                outcomes.append(refused)
            else:
                outcomes.append(None)
        return outcomes

    def is_processed(self, execution_id, event_id):
        cdef _Slot slot = self._slots.get(execution_id)
        if slot is None or slot.marks is None:
            return False
        return event_id in slot.marks

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

    def ack_outbox_many(self, seqs):
        if self._busy:
            raise _reentered("ack_outbox_many")
        for seq in _checks.seqs(seqs, "seqs"):
            self.ack_outbox(seq)

    def claim_outbox(self, limit=100, *, lease=30.0):
        return self._claim(self._outbox, "claim_outbox", limit, lease)

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

    def ack_spawn_many(self, seqs):
        if self._busy:
            raise _reentered("ack_spawn_many")
        for seq in _checks.seqs(seqs, "seqs"):
            self.ack_spawn(seq)

    def claim_spawns(self, limit=100, *, lease=30.0):
        return self._claim(self._spawns, "claim_spawns", limit, lease)

    def due_timers(self, now):
        cdef double at = PyFloat_AS_DOUBLE(now) if type(now) is float else _checks.as_now(now)
        cdef list heap, due = []
        cdef list entry
        cdef tuple held
        if at != at:
            _checks.as_now(now)  # raises: a NaN now
        if self._busy:
            return self._due_in_place(at)
        self._busy = True
        try:
            if self._armed:
                self._heap_armed()
            heap = self._heap
            while heap and (<list>heap[0])[2] is _DEAD:
                heappop(heap)
                self._n_dead -= 1
            if heap and PyFloat_AS_DOUBLE((<list>heap[0])[0]) <= at:
                _collect_due(heap, 0, PyList_GET_SIZE(heap), at, due)
            for held in self._leased:
                entry = <list>held[2]
                if PyFloat_AS_DOUBLE(entry[0]) <= at and entry[2] is not _DEAD:
                    due.append(entry)
        finally:
            self._busy = False
        if not due:
            return []
        due.sort()
        return [(entry[2], entry[3], entry[0]) for entry in due]

    cdef list _due_in_place(self, double at):
        # due_timers from caller code run inside another call (a finalizer, a gc
        # callback): a read that leaves the timer structures as the outer call has them.
        cdef list due = []
        cdef object entry
        cdef tuple held
        for entry in [*self._heap, *self._armed, *[held[2] for held in self._leased]]:
            if (<list>entry)[2] is not _DEAD and PyFloat_AS_DOUBLE((<list>entry)[0]) <= at:
                due.append(entry)
        due.sort()
        return [((<list>entry)[2], (<list>entry)[3], (<list>entry)[0]) for entry in due]

    def claim_due_timers(self, now, limit=100, *, lease=30.0):
        cdef double at, clock, until
        cdef Py_ssize_t count
        cdef list heap, leased, entry, claimed = []
        if self._busy:
            raise _reentered("claim_due_timers")
        self._busy = True
        try:
            at = _checks.as_now(now)
            count = _checks.as_limit(limit)
            until = _checks.as_lease(lease)
            clock = self._now()
            until += clock
            if self._armed:
                self._heap_armed()
            heap = self._heap
            leased = self._leased
            while leased and PyFloat_AS_DOUBLE((<tuple>leased[0])[0]) <= clock:
                entry = <list>(<tuple>heappop(leased))[2]
                if entry[2] is _DEAD:
                    self._n_dead -= 1
                else:
                    heappush(heap, entry)
            while heap and PyList_GET_SIZE(claimed) < count:
                entry = <list>heap[0]
                if entry[2] is _DEAD:
                    heappop(heap)
                    self._n_dead -= 1
                    continue
                if not PyFloat_AS_DOUBLE(entry[0]) <= at:
                    break
                heappop(heap)
                heappush(leased, (until, entry[1], entry))
                claimed.append((entry[2], entry[3], entry[0]))
            return claimed
        finally:
            self._busy = False

    def delete_timer(self, execution_id, path, fire_at):
        cdef _Slot slot
        cdef dict paths
        cdef list entry
        cdef double at
        if self._busy:
            raise _reentered("delete_timer")
        self._busy = True
        try:
            if type(fire_at) is not float:
                fire_at = _checks.as_time(fire_at, "fire_at")
            at = PyFloat_AS_DOUBLE(fire_at)
            slot = self._slots.get(execution_id)
            if slot is None or slot.paths is None:
                return
            paths = slot.paths
            entry = paths.get(path)
            if entry is None or PyFloat_AS_DOUBLE(entry[0]) != at:
                return
            if type(path) is str and not self._mixed:
                del paths[path]
            else:
                paths = paths.copy()
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

    def delete_timer_many(self, timers):
        if self._busy:
            raise _reentered("delete_timer_many")
        for execution_id, path, fire_at in _checks.timer_triples(timers):
            self.delete_timer(execution_id, path, fire_at)

    def append_trace(self, execution_id, entry):
        self._record(execution_id, entry)

    def read_trace(self, execution_id):
        cdef _Slot slot = self._slots.get(execution_id)
        if slot is None or slot.ring is None:
            return []
        return slot.ring.ordered()

    def forget(self, execution_id):
        cdef _Slot slot
        cdef list entry
        if self._busy:
            raise _reentered("forget")
        self._busy = True
        try:
            slot = self._slots.pop(execution_id, None)
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
                self._listing = None
                listing.forgot(execution_id)
                self._listing = listing
        finally:
            self._busy = False

    def stats(self):
        return {
            "executions": self._n_exes,
            "outbox": len(self._outbox),
            "spawns": len(self._spawns),
            "timers": self._n_timers,
            "processed": self._n_marks,
            "traces": self._n_rings,
            "trace_steps": self._n_steps,
        }

    def overview(self, *, now=None):
        cdef double clock
        cdef Py_ssize_t timers_leased = 0, timers_expired = 0
        cdef tuple held
        cdef list entry
        if self._busy:
            raise _reentered("overview")
        self._busy = True
        try:
            clock = self._now()
            now = clock if now is None else _checks.as_now(now)
            outbox_leased, outbox_expired = self._outbox.leased(clock)
            spawns_leased, spawns_expired = self._spawns.leased(clock)
            for held in self._leased:
                entry = <list>held[2]
                if entry[2] is not _DEAD:
                    if PyFloat_AS_DOUBLE(held[0]) > clock:
                        timers_leased += 1
                    else:
                        timers_expired += 1
            due, next_at = self._timers_at(now)
            return dict(zip(_operate.OVERVIEW_KEYS, (
                self._n_exes, len(self._outbox), len(self._spawns), self._n_timers,
                self._n_marks, self._n_ids, _operate.age(clock, self._outbox.oldest()),
                _operate.age(clock, self._spawns.oldest()), outbox_leased, spawns_leased,
                timers_leased, outbox_expired + spawns_expired + timers_expired, due, next_at,
            )))
        finally:
            self._busy = False

    def list_executions(self, *, after=None, limit=100):
        if self._busy:
            raise _reentered("list_executions")
        limit = _operate.as_page(limit)
        self._busy = True
        try:
            listing = self._listing
            self._listing = None
            if listing is None:
                listing = _Listing()
            page = listing.page(self._slots, after, limit)
            self._listing = listing
            return page
        finally:
            self._busy = False

    def prune(self, older_than):
        cdef double cutoff
        cdef _Slot slot
        cdef dict marks, commits
        cdef object new_marks, new_commits, t, done
        cdef list plans = []
        cdef tuple plan
        cdef Py_ssize_t gone_marks = 0, gone_ids = 0
        if self._busy:
            raise _reentered("prune")
        older_than = _operate.as_older_than(older_than)
        self._busy = True
        try:
            cutoff = self._now() - <double>older_than - _STAMP
            for slot in self._slots.values():
                marks = slot.marks
                commits = slot.commits
                new_marks = marks
                new_commits = commits
                if marks is not None and any(<double>t < cutoff for t in marks.values()):
                    new_marks = {k: t for k, t in marks.items() if not <double>t < cutoff}
                    gone_marks += len(marks) - len(new_marks)
                if commits is not None and any(
                    <double>(<tuple>done)[2] < cutoff for done in commits.values()
                ):
                    new_commits = {
                        k: done for k, done in commits.items()
                        if not <double>(<tuple>done)[2] < cutoff
                    }
                    gone_ids += len(commits) - len(new_commits)
                if new_marks is not marks or new_commits is not commits:
                    plans.append((slot, new_marks or None, new_commits or None))
            for plan in plans:
                slot = <_Slot>plan[0]
                slot.marks = plan[1]
                slot.commits = plan[2]
            self._n_marks -= gone_marks
            self._n_ids -= gone_ids
            return dict(zip(_operate.PRUNE_KEYS, (gone_marks, gone_ids)))
        finally:
            self._busy = False

    def wait_for_work(self, timeout):
        timeout = _checks.as_timeout(timeout)
        cdef double deadline = monotonic() + timeout
        cdef double pause = 0.001
        cdef double left
        cdef long long count
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

    def close(self):
        pass

    def _record_trace(self, execution_id, entry):
        self._record(execution_id, entry)

    cdef int _record(self, object execution_id, object entry) except -1:
        cdef dict step
        cdef _Slot slot
        if self._busy:
            raise _reentered("append_trace")
        self._busy = True
        try:
            step = (<dict>entry).copy() if type(entry) is dict else _checks.trace_step(entry, "trace entry")
            if type(execution_id) is not str:
                _checks.hashable(execution_id, "execution_id")
            slot = self._slots.get(execution_id)
            if "index" not in step:
                step["index"] = 0 if slot is None or slot.ring is None else slot.ring.next_index
            if slot is None:
                slot = _Slot()
                if PyDict_SetDefault(self._slots, execution_id, slot) != <PyObject *>slot:
                    raise _checks.inconsistent("the execution id")
            return self._push_step(slot, step)
        finally:
            self._busy = False

    def _dump(self):
        cdef _Slot slot
        cdef list slots = list(self._slots.items())
        cdef list outbox = self._outbox.pending()
        cdef list spawns = self._spawns.pending()
        cdef list timers
        cdef Py_ssize_t commits = 0
        for _, slot in slots:
            if slot.commits is not None:
                commits += len(slot.commits)
        yield ("total", self._n_exes + self._n_marks + commits + self._n_rings
               + self._n_timers + len(outbox) + len(spawns) + 1)
        for _, slot in slots:
            if slot.exe is not None:
                yield ("execution", slot.exe, slot.epoch)
        for eid, slot in slots:
            if slot.marks is not None:
                for event_id in slot.marks:
                    yield ("mark", eid, event_id)
        for eid, slot in slots:
            if slot.commits is not None:
                for commit_id, done in slot.commits.items():
                    yield ("commit", eid, commit_id, (<tuple>done)[0], (<tuple>done)[1])
        for eid, slot in slots:
            if slot.ring is not None:
                yield ("trace", eid, slot.ring.next_index, slot.ring.ordered())
        timers = []
        for _, slot in slots:
            if slot.paths is not None:
                timers.extend(slot.paths.values())
        timers.sort(key=lambda entry: entry[1])  # arming order
        for entry in timers:
            yield ("timer", entry[2], entry[3], entry[0])
        for record in outbox:
            yield ("outbox", record)
        for record in spawns:
            yield ("spawn", record)
        yield ("seqs", self._seq, self._spawn_seq)

    def _restore(self, records):
        cdef dict slots = {}
        cdef _Fifo outbox = _Fifo(), spawns = _Fifo()
        cdef list armed = [], entry
        cdef _Slot slot
        cdef _Ring ring
        cdef long long seq = 0, spawn_seq = 0, last_out = 0, last_spawn = 0, n
        cdef Py_ssize_t n_exes = 0, n_marks = 0, n_ids = 0, n_rings = 0, n_steps = 0
        cdef bint mixed = False
        cdef object now
        cdef object kind, exe, eid, version, epoch, event_id, commit_id, body, next_index
        cdef object path, fire_at, target, event, parent_id, child_id, root_path, context
        cdef list kept
        if self._busy:
            raise _reentered("_restore")
        self._busy = True
        try:
            if self._slots or len(self._outbox) or len(self._spawns):
                raise _transfer.not_empty(self, {
                    "executions": self._n_exes, "processed marks": self._n_marks,
                    "timers": self._n_timers, "trace rings": self._n_rings,
                    "outbox entries": len(self._outbox), "spawn intents": len(self._spawns),
                })
            now = PyFloat_FromDouble(self._now())  # what is restored counts as recorded now
            for record in records:
                kind = record[0]
                if kind == "execution":
                    _, exe, epoch = record
                    try:
                        eid = exe.id
                    except AttributeError:
                        raise _bad_exe("id", exe) from None
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
                    if (
                        type(body) is not tuple and type(body) is not _digest.Digest
                    ) or PyTuple_GET_SIZE(body) != 5:
                        raise RuntimeError(
                            f"harel_store._checks.restored_body returned {body!r}, not a body: "
                            "was the module changed at run time?"
                        )
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
                                         f"more than its next index {next_index}")
                    slot = _restored_slot(slots, eid)
                    if slot.ring is not None:
                        raise ValueError(f"two trace rings of {_shown(eid)} to restore")
                    ring = _Ring(self._maxlen)
                    slot.ring = ring
                    for step in kept:
                        ring.push(step)
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
                    item, target, event = record[1]
                    n = _checks.restored_counter(item, "seq")
                    if n <= last_out:
                        raise ValueError(f"outbox seq {n} out of order")
                    last_out = n
                    if target is not None:
                        _checks.hashable(target, "target_id")
                    outbox.entries.append(_new3(_OutboxEntry, n, target, deepcopy(event)))
                elif kind == "spawn":
                    item, parent_id, child_id, root_path, context = record[1]
                    n = _checks.restored_counter(item, "seq")
                    if n <= last_spawn:
                        raise ValueError(f"spawn seq {n} out of order")
                    last_spawn = n
                    _checks.hashable(parent_id, "parent_id")
                    _checks.hashable(child_id, "child_id")
                    context = deepcopy(_checks.trace_step(context, "spawn context"))
                    spawns.entries.append(
                        _new5(_SpawnEntry, n, parent_id, child_id, deepcopy(root_path), context)
                    )
                elif kind == "seqs":
                    seq = _checks.restored_counter(record[1], "outbox seq")
                    spawn_seq = _checks.restored_counter(record[2], "spawn seq")
                elif kind != "total":
                    _transfer.check_kind(kind)

            if outbox.entries:
                outbox.stamps.append(((<tuple>outbox.entries[0])[0], now))
            if spawns.entries:
                spawns.stamps.append(((<tuple>spawns.entries[0])[0], now))
            self._slots = slots
            self._listing = None
            self._outbox = outbox
            self._spawns = spawns
            self._heap = []
            self._armed = armed
            self._leased = []
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

    cdef tuple _fence(
        self, object exe, object eid, object commit_id, object epoch, object emits,
        object processed_event_id, object timers, object spawns, object trace,
    ):
        cdef _Slot slot
        cdef object done
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
                if not _same_body(<tuple>(<tuple>done)[1], emits, processed_event_id, timers, spawns, trace):
                    raise IdempotencyConflict(eid, commit_id)
                if exe is not slot.exe:
                    try:
                        exe.version = (<tuple>done)[0]
                    except AttributeError:
                        raise _bad_exe("writable", exe) from None
                return None
        if epoch is not None and slot.epoch is not None and epoch < slot.epoch:
            raise StaleWriter(eid, epoch, slot.epoch)
        return commit_id, epoch

    cdef dict _mark_first(self, _Slot slot, object event_id, object now):
        cdef dict marks = slot.marks
        cdef Py_ssize_t size
        if marks is None:
            marks = {event_id: now}
            slot.marks = marks
        else:
            size = len(marks)
            PyDict_SetDefault(marks, event_id, now)
            if len(marks) == size:
                return None
        self._n_marks += 1
        return marks

    cdef int _restamp(self, double at) except -1:
        self._stamp = PyFloat_FromDouble(at)
        self._stamped = at
        self._outbox.stamp(self._seq + 1, self._stamp)
        self._spawns.stamp(self._spawn_seq + 1, self._stamp)
        return 0

    cdef double _now(self) except? -1.0:
        cdef double at
        cdef timespec ts
        if self._monotonic:  # time.monotonic's own clock and arithmetic, without the call
            clock_gettime(CLOCK_MONOTONIC, &ts)
            return <double>(ts.tv_sec * 1000000000LL + ts.tv_nsec) / 1e9
        now = self._clock()
        if type(now) is float:
            at = PyFloat_AS_DOUBLE(now)
            if at - at == 0.0:
                return at
        return _checks.as_clock(now)

    cdef list _claim(self, _Fifo fifo, str name, object limit, object lease):
        cdef double now
        if self._busy:
            raise _reentered(name)
        self._busy = True
        try:
            limit = _checks.as_limit(limit)
            lease = _checks.as_lease(lease)
            now = self._now()
            return fifo.claim(limit, now + <double>lease, now)
        finally:
            self._busy = False

    cdef tuple _timers_at(self, double now):
        cdef list heap, entry, later = [], stack
        cdef Py_ssize_t size, i, child, due = 0
        cdef tuple held
        if self._armed:
            self._heap_armed()
        heap = self._heap
        size = len(heap)
        stack = [0] if size else []
        while stack:
            i = stack.pop()
            entry = <list>heap[i]
            if PyFloat_AS_DOUBLE(entry[0]) <= now or entry[2] is _DEAD:
                if entry[2] is not _DEAD:
                    due += 1
                child = 2 * i + 1
                if child < size:
                    stack.append(child)
                if child + 1 < size:
                    stack.append(child + 1)
            else:
                later.append(entry[0])
        for held in self._leased:
            entry = <list>held[2]
            if entry[2] is not _DEAD:
                if PyFloat_AS_DOUBLE(entry[0]) <= now:
                    due += 1
                else:
                    later.append(entry[0])
        return due, min(later) if later else None

    cdef int _apply_timers(self, _Slot slot, object eid, tuple ops) except -1:
        cdef dict paths = slot.paths
        cdef list entry, old
        cdef object op, path
        cdef bint died = False
        if paths is None:
            paths = {}
            slot.paths = paths
        for op in ops:
            path = (<tuple>op)[1]
            old = paths.get(path)
            if (<tuple>op)[0] is _CANCEL:
                if old is not None:
                    del paths[path]
                    old[2] = _DEAD
                    self._n_dead += 1
                    self._n_timers -= 1
                    died = True
                continue
            self._timer_seq += 1
            if old is None:
                self._n_timers += 1
            elif old[4] is False:
                old[0] = (<tuple>op)[2]  # not in the heap yet: re-arm in place
                old[1] = self._timer_seq
                continue
            else:
                old[2] = _DEAD
                self._n_dead += 1
                died = True
            entry = [(<tuple>op)[2], self._timer_seq, eid, path, False]
            paths[path] = entry
            self._armed.append(entry)
        if died:
            if not paths:
                slot.paths = None
            if self._n_dead > self._n_timers + _SLACK:
                self._compact_timers()
        return 0

    cdef int _apply_plan(self, _Slot slot, tuple plan) except -1:
        cdef dict paths = plan[0]
        cdef list killed = plan[1], armed = plan[2], entry
        slot.paths = paths or None
        for entry in killed:
            entry[2] = _DEAD
        for entry in armed:
            self._timer_seq += 1
            entry[1] = self._timer_seq
        self._armed += armed
        self._n_timers += len(armed) - len(killed)
        self._n_dead += len(killed)
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
        cdef list leased = [t for t in self._leased if (<list>(<tuple>t)[2])[2] is not _DEAD]
        heapify(heap)
        self._heap = heap
        self._armed = [e for e in self._armed if (<list>e)[2] is not _DEAD]
        heapify(leased)
        self._leased = leased
        self._n_dead = 0
        return 0

    cdef int _push_step(self, _Slot slot, dict step) except -1:
        cdef _Ring ring = slot.ring
        if ring is None:
            ring = _Ring(self._maxlen)
            slot.ring = ring
            self._n_rings += 1
        elif ring.maxlen != self._maxlen:
            self._n_steps += ring.resize(self._maxlen)
        ring.next_index += 1
        if ring.push(step):
            self._n_steps += 1
        return 0


cdef int _enter(
    _Slot slot, object commit_id, object epoch, object version, tuple body, object now
) except -1:
    if commit_id is not None:
        if slot.commits is None:
            slot.commits = {}
        slot.commits[commit_id] = (version, body, now)
    if epoch is not None and (slot.epoch is None or epoch > slot.epoch):
        slot.epoch = epoch
    return 0


cdef tuple _plan_timers(dict paths, tuple ops, object eid):
    cdef dict table = {} if paths is None else paths.copy()
    cdef list killed = [], armed = [], entry
    cdef object op, path, old
    for op in ops:
        path = (<tuple>op)[1]
        old = table.pop(path, None)
        if old is not None:
            killed.append(old)
        if (<tuple>op)[0] is _SCHEDULE:
            entry = [(<tuple>op)[2], 0, eid, path, False]
            table[path] = entry
            armed.append(entry)
    return table, killed, armed


cdef _Slot _restored_slot(dict slots, object eid):
    cdef _Slot slot
    if type(eid) is not str:
        _checks.hashable(eid, "execution id")
    slot = slots.get(eid)
    if slot is None:
        slot = _Slot()
        slots[eid] = slot
    return slot


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
