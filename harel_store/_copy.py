"""Moving between stores: :func:`copy_store` (and ``python -m harel_store copy``, in
:mod:`harel_store.cli.copy`).

A store that can be copied has two private methods, and :func:`copy_store` streams one
into the other, so it works between any two stores that have them:

``_dump() -> Iterator[record]``
    Everything the store holds, as the plain records below, in this order: one
    ``("total", n)`` first (``n`` the number of records that follow, or ``None`` when
    unknown), then every record of one kind before the next kind. A durable store reads
    them in one read transaction (a consistent snapshot); a memory store yields its own
    objects, so nothing may write to it until the iterator is exhausted or closed.
``_restore(records: Iterable[record]) -> None``
    Writes the records into the store, which must be empty: it holds no execution,
    processed mark, timer, trace ring, commit id or pending outbox or spawn entry (seq
    counters left by acked entries do not count). A non-empty store raises the
    :class:`~harel_store.StoreError` of :func:`not_empty` before it takes a record. All
    or nothing: a durable store writes in one transaction, after checking emptiness
    inside it; a memory store builds its tables aside and installs them at the end. Any
    error (a bad record, a value the codec refuses, a non-``str`` id in a durable store,
    an exception raised by the iterator) leaves the store as it was. Records are
    borrowed: a store keeps copies (encoded, or deep-copied), never the record's objects
    but its ids (a memory store keeps the id objects, so an id hashed by identity still
    finds its execution's records).
    It ignores ``("total", n)`` and raises ``ValueError`` for a kind it does not know.

The records (each a tuple whose first item is its kind):

``("total", n)``
    How many records follow, for progress; ``None`` when unknown.
``("execution", exe, epoch)``
    An execution, its ``version`` the stored one, and its writer epoch (``int`` or ``None``).
``("mark", execution_id, event_id)``
    A processed mark.
``("commit", execution_id, commit_id, version, body)``
    A commit id, the version its commit produced, and what a replay is compared with:
    either the commit's checked body as a 5-tuple (emit pairs, processed event id, timer
    ops, spawn triples, trace step: :class:`harel_store._checks.Body`'s fields, as the
    memory stores keep it), or a :class:`Digest` (a durable store's SHA-256 of it). A
    durable store digests a tuple body with its codec's canonical encoding, and takes a
    :class:`Digest` made by the same encoding as it is; a :class:`Digest` of another
    encoding is a ``StoreError`` (it cannot be recomputed). A memory store keeps either:
    it compares a replay with a :class:`Digest` by digesting the replay's body.
``("trace", execution_id, next_index, steps)``
    A trace ring: its steps, oldest first, each a ``dict`` holding its ``"index"``, and the
    index the next step gets. The receiving store keeps the last ``trace_max`` steps (its
    own setting; ``None`` keeps all) and stamps the ``i``-th of ``k`` kept steps, where it
    records an index apart, ``next_index - k + i``.
``("timer", execution_id, path, fire_at)``
    An armed timer; all of them in arming order (so ties in ``due_timers`` keep their
    order), unleased.
``("outbox", OutboxEntry)`` and ``("spawn", SpawnEntry)``
    The pending entries with their seqs, in seq order, unleased.
``("seqs", outbox_seq, spawn_seq)``
    The last seqs the store allocated (``0`` for none). The receiving store allocates
    after the greatest of these, the seqs it copied and the seqs it allocated itself (an
    empty store may have handed out seqs since acked): its seqs never go back.

Leases are not copied: a claimed, unacked entry or timer is claimable at once in the copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._transfer import COUNTED, Record

__all__ = ["PROGRESS_EVERY", "Progress", "copy_store"]

Progress = Callable[[int, "int | None"], object]
PROGRESS_EVERY = 1000  # records between two calls of a progress callback


def _method(store: Any, name: str, role: str) -> Callable[..., Any]:
    method = getattr(store, name, None)
    if not callable(method):
        raise TypeError(
            f"{type(store).__name__} cannot be copied {role}: it has no {name}() "
            "(copy_store takes sync stores that implement _dump() and _restore(); open "
            "an async store's database with open_store)"
        )
    return method  # type: ignore[no-any-return]


class _Tally:
    """Counts the records on their way from ``src`` to ``dst`` and reports progress."""

    __slots__ = ("counts", "done", "progress", "total")

    def __init__(self, progress: Progress | None) -> None:
        self.counts = dict.fromkeys(COUNTED.values(), 0)
        self.done = 0
        self.total: int | None = None
        self.progress = progress

    def stream(self, records: Iterable[Record]) -> Iterator[Record]:
        progress = self.progress
        counts = self.counts
        for record in records:
            kind = record[0]
            if kind == "total":
                total = record[1]
                self.total = total if type(total) is int and total >= 0 else None
                if progress is not None:
                    progress(0, self.total)
                continue
            key = COUNTED.get(kind)
            if key is not None:
                counts[key] += 1
            self.done += 1
            yield record
            if progress is not None and self.done % PROGRESS_EVERY == 0:
                progress(self.done, self.total)
        # The last call comes before dst writes (or commits) what it read, so an
        # exception from it still leaves dst as it was.
        if progress is not None:
            progress(self.done, self.total)


def copy_store(src: Any, dst: Any, *, progress: Progress | None = None) -> dict[str, int]:
    """Copy everything ``src`` holds into the empty store ``dst``, and return how many of
    each thing were copied (``executions``, ``processed``, ``commit_ids``, ``traces``,
    ``timers``, ``outbox``, ``spawns``).

    Copied: executions with their versions and writer epochs, processed marks, commit ids
    (a replay of one on ``dst`` is recognised: a no-op with an equal body, an
    :class:`~harel_store.IdempotencyConflict` with another), armed timers in arming order,
    trace rings with the index of their next step, pending outbox and spawn entries with
    their seqs; ``dst`` allocates seqs after the last ones ``src`` allocated. Leases are
    not copied. ``dst`` keeps the last ``dst.trace_max`` steps of each ring (a ``dst``
    opened with ``trace_max=None`` keeps them all).

    A ``dst`` that is not empty raises :class:`~harel_store.StoreError`, and nothing is
    written. So does anything that goes wrong on the way (``dst`` is written all at once,
    in one transaction for a durable store): a durable ``dst`` refuses ids that are not
    ``str`` with a ``TypeError`` and values its codec cannot encode with a ``TypeError``
    naming them; commit ids copied from a durable store into another with a codec of
    another class raise ``StoreError`` (their digests cannot be recomputed).

    From durable to memory, a commit id keeps the durable store's digest of its body
    (a ``Digest``); the memory store compares a replay with it by digesting the replay's
    body in the same encoding. From memory to durable, the body is digested by
    ``dst``'s codec.

    ``progress(done, total)``, if given, is called when the copy starts, every
    1,000 records (``PROGRESS_EVERY``) and when the last record is read, before ``dst`` is
    written; ``total`` is ``None`` when ``src`` cannot tell. An exception it raises
    stops the copy with nothing written.

    A durable ``src`` is read in one snapshot while others go on writing to it; a memory
    ``src`` must not be written to during the copy. Both stores are sync stores (an async
    memory store works too); each is used by this thread only while the copy runs.
    """
    if src is dst:
        raise ValueError("cannot copy a store into itself")
    if progress is not None and not callable(progress):
        raise TypeError(
            f"progress must be a function of (done, total), got {type(progress).__name__}"
        )
    dump = _method(src, "_dump", "from")
    restore = _method(dst, "_restore", "into")
    tally = _Tally(progress)
    records = dump()
    try:
        restore(tally.stream(records))
    finally:
        close = getattr(records, "close", None)
        if close is not None:
            close()
    return tally.counts
