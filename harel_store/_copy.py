"""Moving between stores: :func:`copy_store`, and ``python -m harel_store copy`` (:func:`main`).

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

import argparse
import contextlib
import hashlib
import os
import reprlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from . import _checks
from ._errors import StoreError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Digest", "commit_digest", "copy_store", "main", "not_empty"]

Record = tuple[Any, ...]
Progress = Callable[[int, "int | None"], object]

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
PROGRESS_EVERY = 1000  # records between two calls of a progress callback
PROGRESS_INTERVAL = 1.0  # seconds before the command line shows progress, and between lines


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


class _Unequal:
    """Compares equal to nothing but itself: fills a :class:`Digest`'s five items, so a
    memory store's cheap field-by-field replay check always falls through to the full
    comparison, which the digest decides."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<digested>"


_UNEQUAL = _Unequal()
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)


class Digest(tuple[Any, ...]):
    """A durable store's record of a commit body: a SHA-256 of it in a canonical encoding,
    with the function (``canonical``, a codec's ``canonical_value``) that encodes it.

    It stands where a memory store keeps a body (a 5-tuple), and compares equal to a
    5-tuple body whose digest it is, so a memory store that copied it recognises a replay
    of the commit; an unequal or unencodable body is a different one. Immutable:
    copying returns it.
    """

    sha256: bytes
    canonical: Callable[[Any], str | bytes]

    def __new__(cls, sha256: bytes, canonical: Callable[[Any], str | bytes]) -> Self:
        if type(sha256) is not bytes or len(sha256) != 32:
            raise TypeError(f"a Digest holds 32 bytes of SHA-256, got {type(sha256).__name__}")
        if not callable(canonical):
            raise TypeError(f"canonical must be a function, got {type(canonical).__name__}")
        self = tuple.__new__(cls, (_UNEQUAL,) * 5)
        self.sha256 = sha256
        self.canonical = canonical
        return self

    def same_encoding(self, canonical: Callable[[Any], str | bytes]) -> bool:
        """Whether ``canonical`` encodes as the function this digest was made with (see
        :func:`same_encoding`)."""
        return same_encoding(self.canonical, canonical)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Digest):
            return self.sha256 == other.sha256 and self.same_encoding(other.canonical)
        if type(other) is tuple and len(other) == 5:
            try:
                return body_digest(self.canonical, other) == self.sha256
            except _ENCODE_ERRORS:
                return False  # a body the encoding refuses is not the one it encoded
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(self.sha256)

    def __repr__(self) -> str:
        return f"Digest({self.sha256.hex()[:16]}...)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Digest, (self.sha256, self.canonical))

    def __copy__(self) -> Digest:
        return self

    def __deepcopy__(self, memo: Any) -> Digest:
        return self


def same_encoding(a: Callable[[Any], Any], b: Callable[[Any], Any]) -> bool:
    """Whether two canonical encoders are the same function, or methods of two codecs
    that share the method's function (a ``JsonCodec`` subclass that inherits
    ``canonical_value``): a codec's canonical encoding is taken not to depend on the
    codec object's state."""
    if a is b:
        return True
    func = getattr(a, "__func__", None)
    return func is not None and func is getattr(b, "__func__", None)


def body_digest(canonical: Callable[[Any], str | bytes], body: Sequence[Any]) -> bytes:
    """The SHA-256 a durable store records for a commit body (the five fields of
    :class:`harel_store._checks.Body`), encoded by ``canonical``: the same value the
    SQLite and PostgreSQL stores' ``_digest`` compute."""
    emits, processed_event_id, timers, spawns, trace = body
    value = [
        [[target, event] for target, event in emits],
        processed_event_id,
        [[action, path, fire_at] for action, path, fire_at in timers],
        [[child, root, context] for child, root, context in spawns],
        trace,
    ]
    data = canonical(value)
    if type(data) is str:
        data = data.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).digest()  # type: ignore[arg-type]


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
    from ._checks import Body

    return digest(Body(*body), commit_id)


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
            f"unknown record kind {reprlib.repr(kind)}: the kinds are {', '.join(sorted(KINDS))}"
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


def _copied_id(value: Any, what: str) -> str:
    """An id copied into a durable store: a ``str``, as in every durable store."""
    if type(value) is not str:
        raise TypeError(
            f"{what} must be a str in a durable store, got {type(value).__name__} "
            f"{reprlib.repr(value)}: a store holding it cannot be copied into a durable "
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
    (a :class:`Digest`); the memory store compares a replay with it by digesting the
    replay's body in the same encoding. From memory to durable, the body is digested by
    ``dst``'s codec.

    ``progress(done, total)``, if given, is called when the copy starts, every
    :data:`PROGRESS_EVERY` records and when the last record is read, before ``dst`` is
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


# --- python -m harel_store copy SRC_URL DST_URL ------------------------------------------


class _Display:
    """Progress on stderr: nothing for a copy that takes less than
    :data:`PROGRESS_INTERVAL`, then a line about that often, and a last one."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.start = self.last = time.monotonic()
        self.shown = False
        self.done = 0
        self.total: int | None = None

    def __call__(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total
        now = time.monotonic()
        if now - self.last >= PROGRESS_INTERVAL:
            self.last = now
            self.show(now)

    def finish(self) -> None:
        """The last line, when any was shown before."""
        if self.shown:
            self.show(time.monotonic())

    def show(self, now: float) -> None:
        self.shown = True
        done, total = self.done, self.total
        of = "" if total is None else f"/{total:,}"
        share = f" ({100 * done / total:.0f}%)" if total else ""
        print(
            f"  copied {done:,}{of} records{share}, {now - self.start:.1f} s",
            file=self.stream,
            flush=True,
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harel_store copy",
        description=(
            "Copy everything a store holds (executions, pending outbox and spawn entries, "
            "processed marks, timers, trace rings, commit ids, writer epochs) into an "
            "empty store, in one transaction: from SQLite to PostgreSQL, say, when an "
            "engine outgrows one machine. Leases are not copied. Stop the engine's "
            "writers to a memory source first; a durable source is read in one snapshot."
        ),
    )
    parser.add_argument(
        "src",
        metavar="SRC_URL",
        help="the store to copy: sqlite:///path.db, postgresql://..., memory: (an empty one)",
    )
    parser.add_argument(
        "dst",
        metavar="DST_URL",
        help="the empty store to copy into: sqlite:///path.db or postgresql://...",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harel_store copy SRC_URL DST_URL``: 0 when everything was copied,
    1 with a message on stderr when nothing was, 2 for a usage error (a bad option or
    URL, or a destination that would vanish with the command). A SQLite file the command
    made for the copy is removed when the copy fails; a missing or empty SQLite source is
    refused before anything is opened."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has shown
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    from ._open import private_store, redact, sqlite_file

    src_url, dst_url = redact(args.src), redact(args.dst)

    def fail(message: str, code: int = 1) -> int:
        print(f"{parser.prog}: error: {message}", file=sys.stderr, flush=True)
        return code

    try:
        private_store(args.src)
    except ValueError as exc:
        return fail(f"cannot open {src_url}: {exc}", 2)
    try:
        throwaway = private_store(args.dst)
    except ValueError as exc:
        return fail(f"cannot open {dst_url}: {exc}", 2)
    if throwaway:
        return fail(
            f"{dst_url} would vanish with this command, and the copy with it: copy into "
            "a SQLite file (sqlite:///path.db) or PostgreSQL (postgresql://...)",
            2,
        )
    source, target = sqlite_file(args.src), sqlite_file(args.dst)
    if source is not None:
        problem = _unfit_source(source)
        if problem is not None:
            return fail(f"cannot open {src_url}: {problem}")
    made = target if target is not None and _make(target) else None
    code = 1
    try:
        code = _copy_urls(args, src_url, dst_url, fail)
    finally:
        if made is not None and code != 0:
            _remove(made)
    return code


def _copy_urls(
    args: argparse.Namespace, src_url: str, dst_url: str, fail: Callable[[str], int]
) -> int:
    """Open both stores, copy, close them: :func:`main`'s exit code."""
    from ._open import open_store

    opened: list[Any] = []
    try:
        try:
            # trace_max=None: the copy keeps every step the source holds; each store
            # object that opens the copy later trims its rings to its own trace_max.
            for url in (args.src, args.dst):
                opened.append(open_store(url, trace_max=None))
        except (StoreError, ValueError, TypeError, ImportError, OSError) as exc:
            which = src_url if not opened else dst_url
            return fail(f"cannot open {which}: {exc}")
        src, dst = opened
        start = time.monotonic()
        display = None if args.quiet else _Display(sys.stderr)
        try:
            counts = copy_store(src, dst, progress=display)
        except KeyboardInterrupt:
            fail(f"interrupted: nothing was written to {dst_url}")
            return 130
        except (StoreError, ValueError, TypeError, OSError) as exc:
            note = "" if "nothing was written" in str(exc) else "; nothing was written"
            return fail(f"cannot copy {src_url} to {dst_url}: {exc}{note}")
        if display is not None:
            display.finish()
        elapsed = time.monotonic() - start
        summary = ", ".join(f"{n:,} {what}" for what, n in counts.items())
        print(f"copied {src_url} to {dst_url} in {elapsed:.2f} s: {summary}")
        return 0
    finally:
        for store in reversed(opened):
            store.close()


def _unfit_source(path: str) -> str | None:
    """Why the SQLite file ``path`` cannot be copied from, found without writing to it:
    opening a missing or empty file as a store would make a harel_store database of
    it. ``None`` when it may be opened (a store refuses a file of another kind itself,
    before writing)."""
    import pathlib
    import sqlite3

    if not os.path.exists(path):
        return f"no such database file: {path}"
    # mode=rw: never creates the file; and, unlike mode=ro, removes the -wal and -shm
    # files it opens when it closes.
    uri = f"{pathlib.Path(path).absolute().as_uri()}?mode=rw"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            (tables,) = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error:
        return None
    return None if tables else f"{path} is empty: it holds no harel_store database"


def _make(path: str) -> bool:
    """Create the empty file ``path`` unless something is there: whether it was made."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError:  # there already, or cannot be made: opening the store says why
        return False
    return True


def _remove(path: str) -> None:
    """Remove the database file ``path`` this command made, and SQLite's files beside it."""
    for name in (path, f"{path}-wal", f"{path}-shm"):
        with contextlib.suppress(OSError):
            os.remove(name)
