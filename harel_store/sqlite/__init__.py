"""``SqliteStore``: the durable store for one machine, on the standard library's ``sqlite3``.

Any number of store objects, in any threads and processes, may share one database file.
One store object holds one connection; threads may share it, and its calls then take
turns (each holds the object's lock), so a transaction never sees another thread's
statements. ``":memory:"`` is a private database of one store object, gone when it
closes.

Schema (version :data:`SCHEMA_VERSION`, created on first open; :data:`MIGRATIONS` is a
list whose index is the version it upgrades from, recorded in ``harel_store_schema``):

- ``executions(id, version, epoch, body)``: the codec's blob beside its broken-out
  ``version`` and the writer ``epoch``.
- ``outbox(seq, target_id, event, lease_until, committed_at)`` and ``spawns(seq,
  parent_id, child_id, root_path, context, lease_until, committed_at)``: ``seq`` an
  ``AUTOINCREMENT`` key, so seqs start at 1, are never reused and leave no gap (a refused
  commit rolls back, allocating nothing).
- ``processed(execution_id, event_id, recorded_at)``: the dedupe marks.
- ``timers(execution_id, path, fire_at, seq, lease_until)``, keyed by ``(execution_id,
  path)``: ``seq`` is the arming order, taken from the work counter; re-arming updates
  the row with a new ``seq`` and no lease.
- ``trace(execution_id, idx, step)``, keyed by ``(execution_id, idx)``, and
  ``trace_index(execution_id, next_index)``: the ring, whose indexes are consecutive, so
  a step takes the index after the ring's last one and the trim deletes one range; and a
  row per ring, holding the index of its next step while it holds none (``0``, or a
  copied ring's). A step is stored as it was handed; ``idx`` is the index it was stamped
  with, added on read when the step carries no ``"index"`` of its own.
- ``commit_ids(execution_id, commit_id, digest, version, recorded_at)``: a SHA-256 of the
  commit's body in the codec's canonical encoding, and the version the commit produced.
- ``work(n)``: a counter bumped by each commit that enqueues outbox or spawn entries or
  arms timers (by one per timer armed); :meth:`SqliteStore.wait_for_work` polls it.

Every write is one ``BEGIN IMMEDIATE`` transaction: it takes the write lock before it
reads, so two writers never both read a version and then race to write it, and a busy
database is waited out by the busy timeout (a deferred ``BEGIN`` that upgrades a read
lock fails at once with "database is locked" instead). Under that lock the CAS is
``UPDATE ... WHERE id = ? AND version = ?``, or an ``INSERT`` when no row exists; of two
writers at the same version exactly one wins, in any processes. The database runs in WAL
mode, so readers never wait for the writer.

Costs, for a database of N executions: ``load``, ``save``, ``commit``, ``is_processed``,
``delete_timer``, acks and ``forget`` are index lookups (``O(log N)`` each, plus what the
call writes); ``commit`` trims the trace ring by deleting just the overflow;
``due_timers``/``claim_due_timers`` walk the ``(fire_at, seq)`` index over the due timers
only; ``claim_outbox``/``claim_spawns`` walk the seq order over the leased entries they
skip and the ones they return; ``pending_*`` and ``read_trace`` read what they return;
``stats`` counts rows, ``O(N)``, about a millisecond per hundred thousand rows;
``prune`` walks every mark and commit id, a few thousand keys per transaction (no index
on when they were recorded: no commit pays for one).

The package: :mod:`._schema` (the migrations, the SQL statements, and the schema's check,
creation and upgrade at open), :mod:`._connection` (the constructor's arguments, the ids
the store binds, write transactions and the driver's errors), :mod:`._store`
(:class:`SqliteStore`), :mod:`._copying` (its ``_dump`` and ``_restore`` rows) and
:mod:`._aio` (:class:`AsyncSqliteStore`, the sync store run on a thread of its own).
"""

from .._codec import JSON, Codec, JsonCodec
from ._aio import AsyncSqliteStore
from ._connection import BUSY_TIMEOUT_MAX
from ._schema import MIGRATIONS, SCHEMA_VERSION  # read there: patch them there
from ._store import SqliteStore

__all__ = [
    "BUSY_TIMEOUT_MAX",
    "JSON",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AsyncSqliteStore",
    "Codec",
    "JsonCodec",
    "SqliteStore",
]

# Shown, documented and reported by their public path.
SqliteStore.__module__ = AsyncSqliteStore.__module__ = __name__
