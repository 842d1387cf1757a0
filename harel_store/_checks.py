"""The checks that decide what a store may write, written once for every store in
Python: the pure ``DictStore`` takes its slow paths here, and the durable stores check
every call here. (The compiled ``DictStore`` keeps a typed twin of these functions, held
to the same messages by the parity and differential tests.)

Each function either returns the value in the form the store writes, or raises a
``TypeError``/``ValueError`` that names the bad item. None of them writes anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from copy import deepcopy
from math import isnan
from numbers import Real
from sys import maxsize as MAX_SIZE
from typing import Any, NamedTuple

from ._digest import Digest
from ._errors import shown
from ._records import Commit, OutboxEntry, SpawnEntry, TimerOp

_new = tuple.__new__
SCHEDULE = "schedule"
CANCEL = "cancel"

EXE_ERRORS = {
    "id": "an execution needs an `id` attribute, got {}",
    "hash": "execution id must be hashable, got {}",
    "version": "an execution needs a `version` attribute, got {}",
    "writable": "the version of {} is not writable",
}


def bad_exe(problem: str, value: Any) -> TypeError:
    """What ``save`` and ``commit`` raise for an execution they cannot use."""
    return TypeError(EXE_ERRORS[problem].format(type(value).__name__))


def reentered(name: str) -> RuntimeError:
    return RuntimeError(
        f"DictStore.{name}() was called while another call of the same store was running "
        "(from a caller's __hash__, __eq__, iterator or property): one writer at a time"
    )


def inconsistent(what: str) -> RuntimeError:
    """A key that compared unequal to every stored key, then equal to one."""
    return RuntimeError(f"{what} changed its hash or equality during the call: nothing was written")


def hashable(value: Any, what: str, index: int = -1) -> None:
    try:
        hash(value)
    except TypeError:
        what = what % index if index >= 0 else what
        raise TypeError(f"{what} must be hashable, got {type(value).__name__}") from None


def as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    return int(value)


def as_time(value: Any, what: str) -> float:
    """A real number of seconds (an int, a float, a ``fractions.Fraction`` or any other
    ``numbers.Real`` but a bool), as the float the stores keep; an int beyond a float's
    range is an infinity, which the callers that need a finite time refuse."""
    number: Any = value
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{what} must be a real number of seconds, got {type(value).__name__}")
    try:
        return float(number)
    except OverflowError:
        return float("inf") if number > 0 else float("-inf")


def as_now(value: Any) -> float:
    """``now`` of a sweep: a real number, not NaN (infinities are fine: all or none due)."""
    now = value if type(value) is float else as_time(value, "now")
    if isnan(now):
        raise ValueError("now must be a number, got nan")
    return now


def as_clock(value: Any) -> float:
    """What a store's ``clock`` returned: a finite number of seconds (a NaN or an
    infinity would make every lease it times last for ever, or never)."""
    now = value if type(value) is float else as_time(value, "clock()")
    if now - now != 0.0:
        raise ValueError(f"clock() must return a finite number of seconds, got {shown(value)}")
    return now


def as_trace_max(value: Any) -> int | None:
    if value is None:
        return None
    size = as_int(value, "trace_max")
    if not 0 <= size <= MAX_SIZE:
        raise ValueError(f"trace_max must be None or between 0 and {MAX_SIZE}, got {size}")
    return size


def as_codec(codec: Any) -> None:
    """Refuse a durable store's ``codec=`` that is not a codec object (``None`` is the
    default's): one without the four methods, or a codec class given for an instance."""
    if isinstance(codec, type):
        raise TypeError(
            f"codec must be a codec object, not the class {codec.__qualname__}: pass {codec.__qualname__}()"
        )
    for name in ("encode_execution", "decode_execution", "encode_value", "decode_value"):
        if not callable(getattr(codec, name, None)):
            raise TypeError(
                f"codec must have the methods encode_execution, decode_execution, "
                f"encode_value and decode_value; {type(codec).__name__} has no {name}()"
            )


def as_commit_id(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"commit_id must be a str, got {type(value).__name__}")
    return value if type(value) is str else str(value)


def as_epoch(value: Any) -> int:
    epoch: int = value if type(value) is int else as_int(value, "epoch")
    if epoch < 0:
        raise ValueError(f"epoch must be at least 0, got {epoch}")
    return epoch


def as_limit(value: Any) -> int:
    limit: int = value if type(value) is int else as_int(value, "limit")
    if limit < 0:
        raise ValueError(f"limit must be at least 0, got {limit}")
    return min(limit, MAX_SIZE)


def as_lease(value: Any) -> float:
    lease = value if type(value) is float else as_time(value, "lease")
    if not lease >= 0.0 or lease == float("inf"):
        raise ValueError(
            f"lease must be a finite number of seconds, at least 0, got {shown(value)}"
        )
    return lease


def as_timeout(value: Any) -> float:
    """``timeout`` of ``wait_for_work``: seconds, at least 0 (infinity waits for ever)."""
    timeout = value if type(value) is float else as_time(value, "timeout")
    if not timeout >= 0.0:
        raise ValueError(f"timeout must be a number of seconds, at least 0, got {shown(value)}")
    return timeout


def snapshot(iterable: Any, what: str) -> tuple[Any, ...]:
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


def outbox_entries(emits: Any, seq: int) -> list[OutboxEntry]:
    """The records for checked ``(target_id, event)`` pairs, seqs from ``seq + 1``."""
    pairs = snapshot(emits, "emits")
    return [_new(OutboxEntry, (seq + i + 1, *emit_pair(item, i))) for i, item in enumerate(pairs)]


def emit_pair(item: Any, i: int) -> tuple[Any, Any]:
    if type(item) is not tuple or len(item) != 2:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(
                f"emits[{i}] must be a (target_id, event) pair, got {type(item).__name__}"
            )
        item = (item[0], item[1])
    target = item[0]
    if target is not None and type(target) is not str:
        hashable(target, "emits[%d] target_id", i)
    return item  # type: ignore[no-any-return]


def timer_ops(ops: tuple[Any, ...]) -> tuple[TimerOp, ...]:
    """Each op made a ``TimerOp`` with an exact action and, for a schedule, a finite float
    ``fire_at``."""
    return tuple([timer_op(op, i) for i, op in enumerate(ops)])


def timer_op(op: Any, i: int) -> TimerOp:
    if isinstance(op, tuple):
        if len(op) != 3:
            raise TypeError(
                f"timers[{i}] must be a TimerOp (action, path, fire_at), "
                f"got a {type(op).__name__} of {len(op)} items"
            )
        if type(op) is TimerOp:
            action, path, fire_at = op
        else:
            action, path, fire_at = _timer_fields(op, i)
    else:
        action, path, fire_at = _timer_fields(op, i)
    if type(path) is not str:
        hashable(path, "timers[%d].path", i)
    if action == "schedule":
        given = fire_at
        if type(fire_at) is not float:
            fire_at = as_time(fire_at, f"timers[{i}].fire_at")
        if fire_at - fire_at != 0.0:
            text = "an int beyond a float's range" if isinstance(given, int) else repr(fire_at)
            raise ValueError(f"timers[{i}].fire_at must be finite, got {text}")
        return _new(TimerOp, (SCHEDULE, path, fire_at))
    if action == "cancel":
        return _new(TimerOp, (CANCEL, path, None))
    raise ValueError(f"timers[{i}].action must be 'schedule' or 'cancel', got {shown(action)}")


def _timer_fields(op: Any, i: int) -> tuple[Any, Any, Any]:
    try:
        return op.action, op.path, op.fire_at
    except AttributeError:
        raise TypeError(
            f"timers[{i}] must be a TimerOp (action, path, fire_at), got {type(op).__name__}"
        ) from None


def spawn_entries(spawns: Any, parent_id: Any, seq: int) -> list[SpawnEntry]:
    """The records for checked ``(child_id, root_path, context)`` triples, seqs from
    ``seq + 1``, each context copied."""
    items: list[SpawnEntry] = []
    for item in snapshot(spawns, "spawns"):
        i = len(items)
        if (type(item) is not tuple or len(item) != 3) and (
            not isinstance(item, (tuple, list)) or len(item) != 3
        ):
            raise TypeError(
                f"spawns[{i}] must be a (child_id, root_path, context) triple, got {type(item).__name__}"
            )
        child_id, root_path, context = item
        if type(child_id) is not str:
            hashable(child_id, "spawns[%d] child_id", i)
        if type(context) is dict:
            context = context.copy()
        elif isinstance(context, Mapping):
            context = dict(context)
        else:
            raise TypeError(f"spawns[{i}] context must be a mapping, got {type(context).__name__}")
        items.append(_new(SpawnEntry, (seq + i + 1, parent_id, child_id, root_path, context)))
    return items


def trace_step(entry: Any, what: str) -> dict[Any, Any]:
    if type(entry) is dict:
        return entry.copy()
    if isinstance(entry, Mapping):
        return dict(entry)
    raise TypeError(f"{what} must be a mapping, got {type(entry).__name__}")


def str_id(value: Any, what: str) -> str:
    """Ids of a durable store are ``str``, as the specification types them."""
    if type(value) is not str:
        raise TypeError(f"{what} must be a str in a durable store, got {type(value).__name__}")
    return value


# An id is a key of the durable stores' indexes, two to an index entry: PostgreSQL refuses
# an entry past about 2,700 bytes, so each id is held well below half of that.
KEY_BYTES_MAX = 1000


def durable_key(value: str, what: str, i: int = -1) -> None:
    """Refuse a ``str`` id longer than :data:`KEY_BYTES_MAX` bytes in UTF-8, as every
    durable store does before it writes (``what % i`` names it)."""
    if (
        len(value) * 4 > KEY_BYTES_MAX
        and len(value.encode("utf-8", "surrogatepass")) > KEY_BYTES_MAX
    ):
        name = what if i < 0 else what % i
        raise ValueError(
            f"{name} is {len(value.encode('utf-8', 'surrogatepass')):,} bytes in UTF-8; a "
            f"durable store holds ids of at most {KEY_BYTES_MAX:,} bytes"
        )


def commit_keys(
    execution_id: str, body: Body, commit_id: str | None
) -> Iterator[tuple[str, str, int]]:
    """Every id a commit keeps as a key, as ``(id, what, i)`` (``what % i`` names it when
    ``i >= 0``): its execution id, processed event id, emit targets, timer paths, child
    ids and commit id."""
    yield execution_id, "execution id", -1
    if body.processed_event_id is not None:
        yield body.processed_event_id, "processed_event_id", -1
    for i, (target, _) in enumerate(body.emits):
        if target is not None:
            yield target, "emits[%d] target_id", i
    for i, op in enumerate(body.timers):
        path: Any = op.path  # a str: commit_body(str_ids=True) checked it
        yield path, "timers[%d].path", i
    for i, spawn in enumerate(body.spawns):
        yield spawn[0], "spawns[%d] child_id", i
    if commit_id is not None:
        yield commit_id, "commit_id", -1


def durable_keys(execution_id: str, body: Body, commit_id: str | None) -> None:
    """:func:`durable_key` for every id of :func:`commit_keys`."""
    for value, what, i in commit_keys(execution_id, body, commit_id):
        if len(value) * 4 > KEY_BYTES_MAX:  # else short enough whatever its characters
            durable_key(value, what, i)


class Body(NamedTuple):
    """A commit's input, checked and normalized: what a durable store writes, and what a
    replayed ``commit_id`` is compared with."""

    emits: tuple[tuple[Any, Any], ...]
    processed_event_id: Any
    timers: tuple[TimerOp, ...]
    spawns: tuple[tuple[Any, Any, dict[Any, Any]], ...]
    trace: dict[Any, Any] | None


def commit_body(
    emits: Any, processed_event_id: Any, timers: Any, spawns: Any, trace: Any, *, str_ids: bool
) -> Body:
    """Check a whole commit body as every store does; ``str_ids`` adds the durable
    stores' rule that event ids, child ids, target ids and timer paths are ``str``."""
    pairs = snapshot(emits, "emits")
    plain = True  # every pair an exact 2-tuple with a str or None target: kept as it is
    for item in pairs:
        if type(item) is not tuple or len(item) != 2:
            plain = False
            break
        target = item[0]
        if target is not None and type(target) is not str:
            plain = False
            break
    if not plain:
        pairs = tuple([emit_pair(item, i) for i, item in enumerate(pairs)])
    if processed_event_id is not None and type(processed_event_id) is not str:
        if str_ids:
            str_id(processed_event_id, "processed_event_id")
        else:
            hashable(processed_event_id, "processed_event_id")
    ops = timer_ops(snapshot(timers, "timers"))
    born = tuple([entry[2:] for entry in spawn_entries(spawns, None, 0)])  # (child, root, context)
    step = None if trace is None else trace_step(trace, "trace")
    if str_ids:
        # Only an id that is not a str is named: a message made for each would cost more.
        for i, (target, _) in enumerate(() if plain else pairs):
            if target is not None and type(target) is not str:
                str_id(target, f"emits[{i}] target_id")
        for i, op in enumerate(ops):
            if type(op.path) is not str:
                str_id(op.path, f"timers[{i}].path")
        for i, (child_id, _, _) in enumerate(born):
            if type(child_id) is not str:
                str_id(child_id, f"spawns[{i}] child_id")
    return _new(Body, (pairs, processed_event_id, ops, born, step))


# The highest seq or trace index a copy may bring into a memory store: far past any real
# count, and far enough below 2**63 that the compiled store's counters never wrap.
COUNTER_MAX = 2**62


def restored_counter(value: Any, what: str) -> int:
    """A seq, seq counter or trace index of a copy's record."""
    n: int = value if type(value) is int else as_int(value, what)
    if not 0 <= n <= COUNTER_MAX:
        raise ValueError(f"{what} must be between 0 and 2**62, got {n}")
    return n


def restored_body(body: Any, commit_id: Any) -> tuple[Any, ...]:
    """The body a copy's commit record brings: a durable store's :class:`Digest` as it
    is, else deep-copied and checked as a commit's own input is, in the form a memory
    store keeps: emits as ``(target_id, event)`` pairs,
    the processed id, checked timer ops, spawns as ``(child_id, root_path,
    context)``, the trace step or ``None``."""

    if type(body) is Digest:  # a durable store's record of a body: immutable, compared as is
        if tuple.__len__(body) != 5:
            raise TypeError(f"the digest of commit id {shown(commit_id)} is not a 5-tuple")
        return body
    if not isinstance(body, (tuple, list)):
        raise TypeError(
            f"the body of commit id {shown(commit_id)} must be a 5-tuple, got {type(body).__name__}"
        )
    parts = deepcopy(tuple(body))
    if len(parts) != 5:
        raise TypeError(
            f"the body of commit id {shown(commit_id)} must be a 5-tuple, got {len(parts)} items"
        )
    checked = commit_body(*parts, str_ids=False)
    return (
        checked.emits,
        checked.processed_event_id,
        checked.timers,
        checked.spawns,
        checked.trace,
    )


# The execution as a durable store takes it: a str id, and integers a database column
# holds (a signed 64-bit INTEGER in SQLite, a BIGINT in PostgreSQL).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def durable_exe_id(exe: Any) -> str:
    """``exe.id``, which a durable store requires to be a ``str``."""
    try:
        eid = exe.id
    except AttributeError:
        raise bad_exe("id", exe) from None
    if type(eid) is not str:
        str_id(eid, "execution id")
    return eid  # type: ignore[no-any-return]


def durable_exe_version(exe: Any) -> int:
    """``exe.version``: an int that fits a 64-bit column, with room for the next one."""
    try:
        version = exe.version
    except AttributeError:
        raise bad_exe("version", exe) from None
    if type(version) is not int:
        version = as_int(version, "execution version")
    if not INT64_MIN <= version < INT64_MAX:
        raise ValueError(
            f"execution version must fit in a signed 64-bit integer with the next one "
            f"(below 2**63 - 1), got {version}"
        )
    return version


def durable_epoch(value: Any) -> int:
    """:func:`as_epoch`, within a 64-bit column."""
    epoch = as_epoch(value)
    if epoch > INT64_MAX:
        raise ValueError(f"epoch must fit in a signed 64-bit integer, got {epoch}")
    return epoch


def set_version(exe: Any, version: int) -> None:
    """Give ``exe`` the version a durable store committed (or replayed)."""
    try:
        exe.version = version
    except AttributeError:
        raise bad_exe("writable", exe) from None


def batch(commits: Any) -> tuple[Any, ...]:
    """The commits of ``commit_many``, snapshotted: each must be a :class:`Commit`."""
    items = snapshot(commits, "commits")
    for i, item in enumerate(items):
        if not isinstance(item, Commit):
            raise TypeError(f"commits[{i}] must be a harel_store.Commit, got {type(item).__name__}")
    return items


def no_twins(ids: list[Any]) -> None:
    """Two commits of one execution in one batch are refused (the second would always
    conflict with the first): ``ids`` are the batch's execution ids, in order."""
    first: dict[Any, int] = {}
    for i, eid in enumerate(ids):
        j = first.setdefault(eid, i)
        if j != i:
            raise ValueError(
                f"commits[{j}] and commits[{i}] are both of execution {shown(eid)}: "
                "one commit per execution in a batch"
            )


def seqs(values: Any, what: str) -> tuple[int, ...]:
    """The seqs of ``ack_outbox_many``/``ack_spawn_many``, each an int."""
    items = snapshot(values, what)
    for i, value in enumerate(items):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{what}[{i}] must be an int, got {type(value).__name__}")
    return tuple(int(v) for v in items)


def timer_triples(timers: Any) -> list[tuple[Any, Any, float]]:
    """The ``(execution_id, path, fire_at)`` triples of ``delete_timer_many``, checked as
    ``delete_timer`` checks its arguments (ids hashable, ``fire_at`` a real number)."""
    triples = []
    for i, item in enumerate(snapshot(timers, "timers")):
        try:
            execution_id, path, fire_at = item
        except (TypeError, ValueError):
            raise TypeError(
                f"timers[{i}] must be an (execution_id, path, fire_at) triple, "
                f"got {type(item).__name__}"
            ) from None
        hashable(execution_id, "the execution id of timers[%d]", i)
        hashable(path, "the path of timers[%d]", i)
        triples.append((execution_id, path, as_time(fire_at, f"the fire_at of timers[{i}]")))
    return triples


def in_batch(exc: TypeError | ValueError, i: int) -> TypeError | ValueError:
    """``exc``, raised by the checks of one commit of a batch, naming ``commits[i]``."""
    kind = TypeError if isinstance(exc, TypeError) else ValueError
    return kind(f"commits[{i}]: {exc}")
