"""PostgreSQL batches: ``commit_many`` and the batch acks as operations of the core (see
:mod:`._core`: generators of statements, no I/O).

A batch of commits is one transaction of a fixed number of statements whatever its size,
with no savepoint: every commit is checked and encoded first; then one statement locks
the rows of the executions that exist (in id order, as every batch locks them, so two
batches cannot deadlock), one creates those that do not (``ON CONFLICT DO NOTHING``: a
lost race is that commit's conflict, not an error aborting the transaction) and reads
the batch's commit ids, on a snapshot taken once the locks are held; each outcome is
decided here, and one multi-row statement per table writes the applied commits, with one
``pg_notify`` at most."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, NamedTuple

from .. import _checks
from .._errors import IdempotencyConflict, StaleWriter, StoreConflict, StoreError
from ._statements import (
    _Blobs,
    _Floats,
    _Ints,
    _pack,
    _Query,
    _restore_version,
    _Single,
    _Texts,
)

_Core = Any  # the core (._core._Core), which imports this module
_Op = Generator[Any, Any, Any]
_NO_EPOCH = -1  # an epoch is at least 0; the int8 array parameters hold no NULL


class _Prepared(NamedTuple):
    """One commit of a batch, checked and encoded."""

    exe: Any
    eid: str
    version: int
    epoch: int | None
    body: bytes
    commit_id: str | None
    digest: bytes | None
    emits: list[tuple[str | None, bytes]]
    mark: str | None
    arm: list[tuple[str, float]]
    disarm: list[str]
    spawns: list[tuple[str, bytes, bytes]]
    step: bytes | None


def prepare(core: _Core, commits: Any) -> list[_Prepared]:
    """Every commit of ``commits`` checked and encoded as ``commit`` would, before any
    I/O: a ``TypeError``/``ValueError`` naming ``commits[i]``, or two commits of one
    execution, refuses the whole batch."""
    items = _checks.batch(commits)
    prepared = []
    for i, item in enumerate(items):
        try:
            prepared.append(_prepare_one(core, item))
        except (TypeError, ValueError) as exc:
            kind = TypeError if isinstance(exc, TypeError) else ValueError
            raise kind(f"commits[{i}]: {exc}") from exc
    _checks.no_twins([p.eid for p in prepared])
    return prepared


def _prepare_one(core: _Core, item: Any) -> _Prepared:

    exe, emits, processed_event_id, timers, spawns, trace, commit_id, epoch = item
    eid = _checks.durable_exe_id(exe)
    body = _checks.commit_body(emits, processed_event_id, timers, spawns, trace, str_ids=True)
    if commit_id is not None:
        commit_id = _checks.as_commit_id(commit_id)
    _checks.durable_keys(eid, body, commit_id)
    if epoch is not None:
        epoch = _checks.durable_epoch(epoch)
    version = _checks.durable_exe_version(exe)
    encode = core._encode
    blob = _pack(core._encode_exe(exe, eid))
    packed_emits = [
        (target, _pack(encode(event, "the event of emits", i)))
        for i, (target, event) in enumerate(body.emits)
    ]
    packed_spawns = [
        (
            child_id,
            _pack(encode(root_path, "the root_path of spawns", i)),
            _pack(encode(context, "the context of spawns", i)),
        )
        for i, (child_id, root_path, context) in enumerate(body.spawns)
    ]
    step = None if body.trace is None else _pack(encode(body.trace, "the trace step"))
    digest = None if commit_id is None else core._digest(body, commit_id)
    final: dict[Any, float | None] = {}  # the last op on a path decides its state
    for action, path, fire_at in body.timers:
        final.pop(path, None)
        final[path] = fire_at if action == "schedule" else None
    return _Prepared(
        exe, eid, version, epoch, blob, commit_id, digest, packed_emits, body.processed_event_id,
        [(path, at) for path, at in final.items() if at is not None],
        [path for path, at in final.items() if at is None],
        packed_spawns, step,
    )  # fmt: skip


def commit_many(core: _Core, commits: Any) -> _Op:
    """The operation of ``commit_many``: the outcome of each commit, in order."""

    batch = prepare(core, commits)
    if not batch:
        return []
    outcomes, versions, write, _ = yield from _apply(core, batch, True, True)
    yield from _commit(core, versions, [write] if write else [])
    return outcomes


_Applied = tuple[list[StoreError | None], list[tuple[_Prepared, int]], _Query | None, bool]


def _apply(
    core: _Core, batch: list[_Prepared], wake: bool, begin: bool
) -> Generator[Any, Any, _Applied]:
    """The reads of ``batch`` inside a transaction (``begin``: its first one opens it):
    each commit's outcome, the version each execution is to have once it commits, the
    statement writing the applied commits (``None`` when none is), and whether that
    statement notifies. ``wake``: whether it may (a transaction notifies once at most)."""

    sql = _sql(core)
    ids = sorted(p.eid for p in batch)
    locked = yield _Query(sql.lock, (_Texts(ids),), True, begin=begin)
    found = {eid: (v, e) for eid, v, e in locked}
    new = sorted((p for p in batch if p.eid not in found), key=lambda p: p.eid)
    keyed = [p for p in batch if p.commit_id is not None and p.eid in found]
    rows: Any = []
    if new or keyed:  # else nothing to create and no commit id to look up
        rows = yield _Query(
            sql.create,
            {
                "nid": _Texts(p.eid for p in new),
                "nver": _Ints(p.version + 1 for p in new),
                "nepoch": _Ints(_NO_EPOCH if p.epoch is None else p.epoch for p in new),
                "nbody": _Blobs(p.body for p in new),
                "kid": _Texts(p.eid for p in keyed),
                "kcid": _Texts(p.commit_id for p in keyed),
            },
            True,
        )
    created = set()
    done: dict[str, tuple[bytes, int]] = {}
    for eid, cid, digest, version in rows:
        if cid is None:
            created.add(eid)
        else:
            done[eid] = (bytes(digest), version)
    lost = [p.eid for p in new if p.eid not in created]
    if lost:  # created meanwhile by another writer: its version, or its commit id
        for eid, version, cid, digest, done_version in (
            yield _Query(sql.recheck, {"ids": _Texts(lost)})
        ):
            found[eid] = (version, None)
            if cid is not None:
                done.setdefault(f"{eid}\0{cid}", (bytes(digest), done_version))

    outcomes: list[StoreError | None] = []
    applied: list[_Prepared] = []
    versions: list[tuple[Any, int]] = []  # what to set on each exe, if the batch lands
    for p in batch:
        refused: StoreError | None = None
        if p.eid in created:
            applied.append(p)
            versions.append((p, p.version + 1))
            outcomes.append(None)
            continue
        replay = done.get(p.eid) if p.eid not in lost else done.get(f"{p.eid}\0{p.commit_id}")
        version, epoch = found.get(p.eid, (None, None))
        if replay is not None and p.commit_id is not None:
            if replay[0] != p.digest:
                refused = IdempotencyConflict(p.eid, p.commit_id)
            else:
                versions.append((p, replay[1]))
        elif p.eid in lost:
            refused = StoreConflict(p.eid, p.version, version)
        elif p.epoch is not None and epoch is not None and epoch > p.epoch:
            refused = StaleWriter(p.eid, p.epoch, epoch)
        elif version != p.version:
            refused = StoreConflict(p.eid, p.version, version)
        else:
            applied.append(p)
            versions.append((p, p.version + 1))
        outcomes.append(refused)

    updated = [p for p in applied if p.eid not in created]
    emits = [(p.eid, t, e) for p in applied for t, e in p.emits]
    arms = [(p.eid, path, at) for p in applied for path, at in p.arm]
    disarms = [(p.eid, path) for p in applied for path in p.disarm]
    spawns = [(p.eid, *s) for p in applied for s in p.spawns]
    steps = sorted((p.eid, p.step) for p in applied if p.step is not None)
    keyed = [p for p in applied if p.commit_id is not None]
    marks = [p for p in applied if p.mark is not None]
    if not applied:
        return outcomes, versions, None, False
    notifies = wake and bool(emits or arms or spawns)
    write = _Query(
        sql.write,
        {
            "uid": _Texts(p.eid for p in updated),
            "uver": _Ints(p.version + 1 for p in updated),
            "uepoch": _Ints(_NO_EPOCH if p.epoch is None else p.epoch for p in updated),
            "ubody": _Blobs(p.body for p in updated),
            "targets": _Texts(t for _, t, _ in emits),
            "events": _Blobs(e for _, _, e in emits),
            "mid": _Texts(p.eid for p in marks),
            "mev": _Texts(p.mark for p in marks),
            "aid": _Texts(a[0] for a in arms),
            "apath": _Texts(a[1] for a in arms),
            "aat": _Floats(a[2] for a in arms),
            "did": _Texts(d[0] for d in disarms),
            "dpath": _Texts(d[1] for d in disarms),
            "sid": _Texts(s[0] for s in spawns),
            "child": _Texts(s[1] for s in spawns),
            "root": _Blobs(s[2] for s in spawns),
            "ctx": _Blobs(s[3] for s in spawns),
            "rid": _Texts(eid for eid, _ in steps),
            "rstep": _Blobs(step for _, step in steps),
            "cide": _Texts(p.eid for p in keyed),
            "cidc": _Texts(p.commit_id for p in keyed),
            "cidd": _Blobs(p.digest for p in keyed),
            "cidv": _Ints(p.version + 1 for p in keyed),
            "keep": core.trace_max or 0,
            "wake": notifies,
            "channel": core.channel,
        },
        True,
    )
    return outcomes, versions, write, notifies


def _commit(
    core: _Core,
    versions: list[tuple[_Prepared, int]],
    writes: list[_Query],
    missed: list[str] | None = None,
) -> _Op:
    """Run ``writes``, the last one with the ``COMMIT`` in its round trip (a lone
    ``COMMIT`` when there is none), having set each execution's version first: an
    execution that refuses its version (frozen, a setter that raises) rolls back the
    whole transaction, nothing written; a failed write or commit sets them back. Then
    trim again the rings (and ``missed``) that another writer appended to after a
    write's snapshot, once the transaction has landed, on a snapshot that sees their
    steps (as ``commit`` does)."""

    missed = list(missed or ())
    for query in writes[:-1]:
        missed += _missed((yield query))
    set_so_far: list[_Prepared] = []
    try:
        for p, version in versions:
            _checks.set_version(p.exe, version)
            set_so_far.append(p)
        if writes:
            missed += _missed((yield writes[-1]._replace(commit=True)))
        else:
            yield _Query("COMMIT", prepare=False)
    except BaseException:
        for p in set_so_far:
            _restore_version(p.exe, p.version)
        raise
    if missed:
        params = {"rid": _Texts(sorted(set(missed))), "keep": core.trace_max}
        yield _Query(_sql(core).trim, params, True, tolerant=True)


def _missed(rows: Any) -> list[str]:
    """The rings a write of commits may have left too long (its first column); none
    for a delete (a row count)."""
    return list(rows[0][0]) if isinstance(rows, list) else []


def ack_many(core: _Core, table: str, seqs: Any) -> _Op:
    """``ack_outbox_many``/``ack_spawn_many``: one statement, one transaction."""
    kept = checked_seqs(seqs)
    if kept:
        yield _deletes(core, table, kept)


def checked_seqs(seqs: Any) -> list[int]:
    """The seqs of an ack, each an int; those no row can hold left out."""
    values = _checks.seqs(seqs, "seqs")
    return sorted({s for s in values if _checks.INT64_MIN <= s <= _checks.INT64_MAX})


def _deletes(core: _Core, table: str, values: list[Any]) -> Any:
    """The statement deleting ``values`` (seqs, or timer triples) from ``table``."""

    sql = _sql(core)
    if table == "timers":
        values = sorted(values)
        columns = (
            _Texts(t[0] for t in values),
            _Texts(t[1] for t in values),
            _Floats(t[2] for t in values),
        )
        return _Query(sql.delete_timers, columns, True)
    return _Query(sql.ack[table], (_Ints(sorted(set(values))),), True)


def delete_timer_many(core: _Core, timers: Any) -> _Op:
    """``delete_timer_many``: each triple checked as ``delete_timer`` checks its
    arguments, then one statement, one transaction."""
    triples = checked_triples(timers)
    if triples:
        yield _deletes(core, "timers", triples)


def checked_triples(timers: Any) -> list[tuple[str, str, float]]:
    """The ``(execution_id, path, fire_at)`` triples of ``delete_timer_many``, each
    checked as ``delete_timer`` checks its arguments."""
    triples = []
    for i, item in enumerate(_checks.snapshot(timers, "timers")):
        if not isinstance(item, tuple) or len(item) != 3:
            raise TypeError(
                f"timers[{i}] must be an (execution_id, path, fire_at) tuple, "
                f"got {type(item).__name__}"
            )
        execution_id, path, fire_at = item
        _checks.str_id(execution_id, f"timers[{i}] execution_id")
        _checks.str_id(path, f"timers[{i}] path")
        _checks.durable_key(execution_id, f"timers[{i}] execution_id")
        _checks.durable_key(path, f"timers[{i}] path")
        triples.append((execution_id, path, _checks.as_time(fire_at, f"timers[{i}] fire_at")))
    return triples


# --- group commit (AsyncPostgresStore) ----------------------------------------------------
#
# A part is what one caller hands the group: ("one", _Single) for commit and save,
# ("many", [_Prepared, ...]) for commit_many, ("delete", table, values) for the acks and
# the timer deletes; each checked and encoded by its caller.


def probe_version(exe: Any) -> None:
    """Refuse, in its caller, an execution whose version cannot be set (a grouped write
    sets it for every caller at once, where its failure would be theirs too)."""
    _checks.set_version(exe, exe.version)


def from_single(single: _Single) -> _Prepared:
    """A commit :meth:`~._core._Core.prepare_commit` made, as a batch takes it."""
    params = single.params
    get = params.get
    return _Prepared(
        single.exe, single.eid, single.version, single.epoch, params["body"], single.commit_id,
        params["digest"] or None, _rows(params, ("target", "event"), ("targets", "events")),
        get("pev"), _rows(params, ("path", "fire_at"), ("arm", "at")), list(get("disarm", ())),
        list(zip(get("children", ()), get("roots", ()), get("contexts", ()))), get("step"),
    )  # fmt: skip


def _rows(params: dict[str, Any], one: tuple[str, ...], many: tuple[str, ...]) -> list[Any]:
    """The rows of a part of a single commit's parameters: none, one (scalars), or
    more (arrays)."""
    if one[0] in params:
        return [tuple(params[key] for key in one)]
    return list(zip(*(params.get(key, ()) for key in many)))


def write_group(core: _Core, parts: list[Any]) -> _Op:
    """The operation of a group write: every part in one transaction, one outcome per
    part (``None``, a refusal, or a list of them for ``commit_many``). A lone commit is
    its own statement, as ``commit`` writes it: a lone caller waits for nobody and pays
    no more than ``commit`` alone."""

    if len(parts) == 1 and parts[0][0] == "one":
        try:
            yield from core.run_commit(parts[0][1])
        except (StoreConflict, StaleWriter, IdempotencyConflict) as refused:
            return [refused]
        return [None]
    if len(parts) == 1 and parts[0][0] == "delete":
        _, table, values = parts[0]
        yield _deletes(core, table, values)
        return [None]
    # Commits of one execution in two parts go in successive rounds, in their order.
    rounds: list[list[tuple[int, int, _Prepared]]] = []
    last: dict[str, int] = {}
    deletes: dict[str, list[Any]] = {}
    outcomes: list[Any] = []
    for n, part in enumerate(parts):
        if part[0] == "delete":
            deletes.setdefault(part[1], []).extend(part[2])
            outcomes.append(None)
            continue
        batch = [from_single(part[1])] if part[0] == "one" else part[1]
        outcomes.append(None if part[0] == "one" else [None] * len(batch))
        r = max((last.get(p.eid, -1) for p in batch), default=-1) + 1
        while len(rounds) <= r:
            rounds.append([])
        for i, p in enumerate(batch):
            last[p.eid] = r
            rounds[r].append((n, i, p))
    versions: list[tuple[_Prepared, int]] = []
    writes: list[_Query] = []
    missed: list[str] = []
    woke = False
    for r, members in enumerate(rounds):
        if writes:  # the write of the round before, which this round's reads must see
            missed += _missed((yield writes[0]))
            writes = []
        results, set_, write, notified = yield from _apply(
            core, [p for _, _, p in members], not woke, r == 0
        )
        woke = woke or notified
        versions.extend(set_)
        if write is not None:
            writes.append(write)
        for (n, i, _), result in zip(members, results):
            if parts[n][0] == "one":
                outcomes[n] = result
            else:
                outcomes[n][i] = result
    writes += [_deletes(core, table, values) for table, values in deletes.items()]
    if not rounds:
        writes[0] = writes[0]._replace(begin=True)
    yield from _commit(core, versions, writes, missed)
    return outcomes


class _BatchSql:
    """The batch statements of one schema (``s`` is its quoted name)."""

    def __init__(self, s: str) -> None:
        self.lock = f"""
SELECT id, version, epoch FROM {s}.executions
WHERE id = ANY (%s::text[]) ORDER BY id FOR UPDATE"""
        self.create = f"""
WITH ins AS (
    INSERT INTO {s}.executions (id, version, epoch, body)
    SELECT i, v, nullif(e, -1), b
    FROM unnest(%(nid)s::text[], %(nver)s::int8[], %(nepoch)s::int8[], %(nbody)s::bytea[])
        AS u (i, v, e, b)
    ORDER BY i
    ON CONFLICT (id) DO NOTHING
    RETURNING id
)
SELECT id, NULL::text, NULL::bytea, NULL::int8 FROM ins
UNION ALL
SELECT c.execution_id, c.commit_id, c.digest, c.version
FROM {s}.commit_ids AS c JOIN unnest(%(kid)s::text[], %(kcid)s::text[]) AS u (i, k)
    ON c.execution_id = u.i AND c.commit_id = u.k"""
        self.recheck = f"""
SELECT x.id, x.version, c.commit_id, c.digest, c.version
FROM {s}.executions AS x LEFT JOIN {s}.commit_ids AS c ON c.execution_id = x.id
WHERE x.id = ANY (%(ids)s::text[])"""
        # The rings' trims: the steps each ring's index finds (a hash join of the whole
        # trace table would be the plan the planner picks for a small table), a range of
        # the key bounded on both sides, from 0 (as the single commit's, _schema._TRIMMED).
        trim = f"""DELETE FROM {s}.trace WHERE ctid = ANY (ARRAY(
    SELECT o.ctid FROM ring AS r CROSS JOIN LATERAL (
        SELECT tr.ctid FROM {s}.trace AS tr
        WHERE tr.execution_id = r.execution_id AND tr.idx >= 0
          AND tr.idx < r.next_index - %(keep)s::bigint
        OFFSET 0
    ) AS o
    WHERE %(keep)s::bigint > 0
))"""
        self.write = f"""
WITH upd AS (
    UPDATE {s}.executions AS x SET version = u.v, body = u.b, epoch = coalesce(nullif(u.e, -1), x.epoch)
    FROM unnest(%(uid)s::text[], %(uver)s::int8[], %(uepoch)s::int8[], %(ubody)s::bytea[])
        AS u (i, v, e, b)
    WHERE x.id = u.i
), emit AS (
    INSERT INTO {s}.outbox (target_id, event)
    SELECT t, e FROM unnest(%(targets)s::text[], %(events)s::bytea[])
        WITH ORDINALITY AS u (t, e, o)
    ORDER BY o
), mark AS (
    INSERT INTO {s}.processed (execution_id, event_id)
    SELECT i, e FROM unnest(%(mid)s::text[], %(mev)s::text[]) AS u (i, e)
    ON CONFLICT DO NOTHING
), arm AS (
    INSERT INTO {s}.timers AS tm (execution_id, path, fire_at)
    SELECT i, p, f FROM unnest(%(aid)s::text[], %(apath)s::text[], %(aat)s::float8[])
        WITH ORDINALITY AS u (i, p, f, o)
    ORDER BY o
    ON CONFLICT (execution_id, path) DO UPDATE
    SET fire_at = excluded.fire_at, seq = excluded.seq, lease_until = '-infinity'
), disarm AS (
    DELETE FROM {s}.timers AS tm
    USING unnest(%(did)s::text[], %(dpath)s::text[]) AS u (i, p)
    WHERE tm.execution_id = u.i AND tm.path = u.p
), spawn AS (
    INSERT INTO {s}.spawns (parent_id, child_id, root_path, context)
    SELECT i, c, r, x
    FROM unnest(%(sid)s::text[], %(child)s::text[], %(root)s::bytea[], %(ctx)s::bytea[])
        WITH ORDINALITY AS u (i, c, r, x, o)
    ORDER BY o
), seen AS (
    SELECT execution_id, next_index FROM {s}.trace_index
    WHERE execution_id = ANY (%(rid)s::text[])
), ring AS (
    INSERT INTO {s}.trace_index AS ti (execution_id, next_index)
    SELECT i, 1 FROM unnest(%(rid)s::text[]) AS i ORDER BY i
    ON CONFLICT (execution_id) DO UPDATE SET next_index = ti.next_index + 1
    RETURNING execution_id, next_index
), step AS (
    INSERT INTO {s}.trace (execution_id, idx, step)
    SELECT r.execution_id, r.next_index - 1, u.s
    FROM ring AS r JOIN unnest(%(rid)s::text[], %(rstep)s::bytea[]) AS u (i, s)
        ON u.i = r.execution_id
), trim AS (
    {trim}
), rec AS (
    INSERT INTO {s}.commit_ids (execution_id, commit_id, digest, version)
    SELECT * FROM unnest(%(cide)s::text[], %(cidc)s::text[], %(cidd)s::bytea[], %(cidv)s::int8[])
), wake AS (
    SELECT pg_notify(%(channel)s, '') WHERE %(wake)s::bool
)
SELECT ARRAY(
    SELECT r.execution_id FROM ring AS r LEFT JOIN seen AS n USING (execution_id)
    WHERE %(keep)s::bigint > 0 AND r.next_index <> coalesce(n.next_index, 0) + 1
), (SELECT count(*) FROM wake)"""
        # The trim once a write has landed (as the store's ``commit`` trims again), under
        # the locks of the rings' rows, taken in id order as every writer takes them.
        self.trim = f"""
WITH ring AS (
    SELECT execution_id, next_index FROM {s}.trace_index
    WHERE execution_id = ANY (%(rid)s::text[]) ORDER BY execution_id FOR UPDATE
)
{trim}"""
        self.ack = {
            table: f"DELETE FROM {s}.{table} WHERE seq = ANY (%s::int8[])"
            for table in ("outbox", "spawns")
        }
        self.delete_timers = f"""
DELETE FROM {s}.timers AS tm
USING unnest(%s::text[], %s::text[], %s::float8[]) AS u (i, p, f)
WHERE tm.execution_id = u.i AND tm.path = u.p AND tm.fire_at = u.f"""


_CACHE: dict[str, _BatchSql] = {}


def _sql(core: _Core) -> _BatchSql:
    sql = _CACHE.get(core.schema)
    if sql is None:
        sql = _CACHE[core.schema] = _BatchSql(core.sql.schema)
    return sql
