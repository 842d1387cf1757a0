"""The record stream of dump and restore, which every store speaks (see :mod:`._copy`),
and what a store that must not be copied by ``copy.copy`` inherits.

Below every store and above the checks: the stores import it, it imports no store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import _checks
from ._digest import Digest
from ._errors import StoreError, shown

__all__ = ["COUNTED", "KINDS", "Record", "Uncopyable", "commit_digest", "durable_rows", "not_empty"]

Record = tuple[Any, ...]

# What copy_store returns, by record kind.
COUNTED = {
    "execution": "executions",
    "mark": "processed",
    "commit": "commit_ids",
    "trace": "traces",
    "timer": "timers",
    "outbox": "outbox",
    "spawn": "spawns",
}
KINDS = frozenset([*COUNTED, "total", "seqs"])


class Uncopyable:
    """A durable store refuses ``copy``, ``deepcopy`` and pickling: a copy would share
    its connections (closing one would close the other's). ``_copy_hint`` says what to
    do instead."""

    __slots__ = ()
    _copy_hint = "open another store on the same database"

    def _refused(self) -> TypeError:
        name = type(self).__name__
        return TypeError(
            f"{name} objects cannot be copied or pickled (a copy would share its "
            f"connections): {self._copy_hint}"
        )

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise self._refused()

    def __copy__(self) -> Any:
        raise self._refused()

    def __deepcopy__(self, memo: Any) -> Any:
        raise self._refused()


def commit_digest(
    body: Any,
    canonical: Callable[[Any], str | bytes],
    digest: Callable[[Any, str], bytes],
    execution_id: str,
    commit_id: str,
) -> bytes:
    """What a durable store records for the body of a ``("commit", ...)`` record: the
    :class:`Digest`'s bytes when it was made by ``canonical``'s encoding, else the store's
    own ``digest(Body, commit_id)`` of a 5-tuple body."""
    if isinstance(body, Digest):
        if not body.same_encoding(canonical):
            raise StoreError(
                f"execution {execution_id!r}: commit id {commit_id!r} is recorded as a "
                "digest made by another codec's canonical encoding, which this store's "
                "codec cannot compare a replay with: copy between stores whose codecs "
                "share their canonical_value (or encode_value); nothing was written"
            )
        return body.sha256
    if type(body) is not tuple or len(body) != 5:
        raise TypeError(
            f"execution {execution_id!r}: the body of commit id {commit_id!r} must be a "
            f"5-tuple or a Digest, got {type(body).__name__}"
        )
    return digest(_checks.Body(*body), commit_id)


def not_empty(store: Any, held: dict[str, int]) -> StoreError:
    """What ``_restore`` raises for a store that holds something (``held``: counts by
    kind, zeros included or not)."""
    shown = ", ".join(f"{n:,} {what}" for what, n in held.items() if n) or "data"
    return StoreError(
        f"cannot copy into {type(store).__name__}: it is not empty (it holds {shown}); "
        "copy_store copies into an empty store only, and nothing was written"
    )


def check_kind(kind: Any) -> None:
    """A ``ValueError`` for a record kind that is not one of :data:`KINDS`."""
    if kind not in KINDS:
        raise ValueError(
            f"unknown record kind {shown(kind)}: the kinds are {', '.join(sorted(KINDS))}"
        )


def durable_rows(
    records: Iterable[Any],
    *,
    encode: Callable[[Any, str], Any],
    encode_exe: Callable[[Any, str], Any],
    canonical: Callable[[Any], str | bytes],
    digest: Callable[[Any, str], bytes],
    keep: int | None,
) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """The rows a durable store's ``_restore`` writes for ``records``, each checked, as
    ``(kind, row)``: ``execution`` (id, version, epoch, encoded), ``mark`` (id, event id),
    ``commit`` (id, commit id, digest, version), ``step`` (id, index, encoded),
    ``trace`` (id, next index, steps kept), ``timer`` (id, path, fire_at), ``outbox``
    (seq, target, encoded), ``spawn`` (seq, parent, child, encoded root path, encoded
    context), and ``seqs`` (last outbox seq, last spawn seq) when the records say.
    ``encode(value, what)`` and ``encode_exe(exe, id)`` give the store's stored form;
    each ring keeps its last ``keep`` steps (0 or None: all). A bad record raises
    ``TypeError``/``ValueError`` naming it, before its row is yielded."""
    for record in records:
        kind = record[0]
        if kind == "execution":
            _, exe, epoch = record
            try:
                eid = exe.id
            except AttributeError:
                raise _checks.bad_exe("id", exe) from None
            eid = _copied_id(eid, "execution id")
            version = _checks.durable_exe_version(exe)
            if epoch is not None:
                epoch = _checks.durable_epoch(epoch)
            yield kind, (eid, version, epoch, encode_exe(exe, eid))
        elif kind == "mark":
            _, eid, event_id = record
            eid = _copied_id(eid, "execution id")
            yield kind, (eid, _copied_id(event_id, "processed event id"))
        elif kind == "commit":
            _, eid, commit_id, version, body = record
            eid = _copied_id(eid, "execution id")
            commit_id = _checks.as_commit_id(commit_id)
            version = _int64(version, "commit version", _checks.INT64_MIN)
            sha = commit_digest(body, canonical, digest, eid, commit_id)
            yield kind, (eid, commit_id, sha, version)
        elif kind == "trace":
            _, eid, next_index, steps = record
            eid = _copied_id(eid, "execution id")
            steps = list(steps)
            next_index = _int64(next_index, "next_index")
            if next_index < len(steps):
                raise ValueError(
                    f"the trace of {eid!r} holds {len(steps)} steps, more than its "
                    f"next index {next_index}"
                )
            if keep and len(steps) > keep:
                steps = steps[len(steps) - keep :]
            first = next_index - len(steps)
            for i, step in enumerate(steps):
                step = _checks.trace_step(step, "trace step")
                yield "step", (eid, first + i, encode(step, f"a trace step of {eid!r}"))
            yield kind, (eid, next_index, len(steps))
        elif kind == "timer":
            _, eid, path, fire_at = record
            fire_at = _checks.as_time(fire_at, "fire_at")
            if fire_at - fire_at != 0.0:
                raise ValueError(f"fire_at must be finite, got {fire_at!r}")
            yield kind, (_copied_id(eid, "execution id"), _copied_id(path, "timer path"), fire_at)
        elif kind == "outbox":
            seq, target, event = record[1]
            seq = _copied_seq(seq)
            if target is not None:
                target = _copied_id(target, "outbox target_id")
            yield kind, (seq, target, encode(event, f"the event of outbox entry {seq}"))
        elif kind == "spawn":
            seq, parent_id, child_id, root_path, context = record[1]
            seq = _copied_seq(seq)
            what = f"of spawn intent {seq}"
            context = _checks.trace_step(context, f"the context {what}")
            row = (
                seq,
                _copied_id(parent_id, "spawn parent_id"),
                _copied_id(child_id, "spawn child_id"),
                encode(root_path, f"the root_path {what}"),
                encode(context, f"the context {what}"),
            )
            yield kind, row
        elif kind == "seqs":
            yield kind, (_int64(record[1], "outbox seq"), _int64(record[2], "spawn seq"))
        elif kind != "total":
            check_kind(kind)


# The ids of each row of durable_rows that a durable store keeps as keys: (index, name).
KEYS: dict[str, tuple[tuple[int, str], ...]] = {
    "execution": ((0, "the id of an execution to copy"),),
    "mark": ((0, "the execution id of a processed mark to copy"),
             (1, "the event id of a processed mark to copy")),
    "commit": ((0, "the execution id of a commit id to copy"), (1, "a commit id to copy")),
    "step": ((0, "the execution id of a trace step to copy"),),
    "trace": ((0, "the execution id of a trace ring to copy"),),
    "timer": ((0, "the execution id of a timer to copy"), (1, "the path of a timer to copy")),
    "outbox": ((1, "the target_id of an outbox entry to copy"),),
    "spawn": ((1, "the parent_id of a spawn intent to copy"),
              (2, "the child_id of a spawn intent to copy")),
}  # fmt: skip


def durable_row_keys(kind: str, row: tuple[Any, ...]) -> None:
    """:func:`harel_store._checks.durable_key` for the ids of a row of
    :func:`durable_rows` (a ``ValueError`` naming the first too long)."""
    for index, what in KEYS.get(kind, ()):
        if row[index] is not None:
            _checks.durable_key(row[index], what)


def _copied_id(value: Any, what: str) -> str:
    """An id copied into a durable store: a ``str``, as in every durable store."""
    if type(value) is not str:
        raise TypeError(
            f"{what} must be a str in a durable store, got {type(value).__name__} "
            f"{shown(value)}: a store holding it cannot be copied into a durable "
            "one; nothing was written"
        )
    return value


def _int64(value: Any, what: str, low: int = 0) -> int:
    number: int = _checks.as_int(value, what)
    if not low <= number <= _checks.INT64_MAX:
        raise ValueError(f"{what} must be between {low} and {_checks.INT64_MAX}, got {number}")
    return number


def _copied_seq(value: Any) -> int:
    seq = _int64(value, "seq")
    if not seq:
        raise ValueError("a seq is at least 1, got 0")
    return seq
