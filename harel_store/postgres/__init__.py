"""``PostgresStore``: the durable store for many processes on many machines, on psycopg 3.

It needs the extra ``pip install 'harel-store[postgres]'`` (psycopg 3), imported only when
a store is made: ``import harel_store`` never needs psycopg.

Any number of store objects, in any processes and machines, may share one database (one
store object is used by one thread, or one event loop, at a time). Each store keeps its
tables in one PostgreSQL schema (``schema=``, default ``harel_store``): stores with
different schemas in one database do not see each other.

Schema (version :data:`SCHEMA_VERSION`; :data:`MIGRATIONS` is a list whose index is the
version it upgrades from, recorded in ``harel_store_schema``; a schema at this version
that lacks one of the tables, indexes or sequences it must have is refused at open as
damaged, nothing changed). Every encoded value is a
``bytea``: one tag byte (``t`` when the codec returned ``str``, stored as UTF-8; ``b``
for ``bytes``) and the data, so decoding gets back what encoding returned.

- ``executions(id, version, epoch, body)``: the codec's blob beside its broken-out
  ``version`` and the writer ``epoch``.
- ``outbox(seq, target_id, event, lease_until)`` and ``spawns(seq, parent_id, child_id,
  root_path, context, lease_until)``: ``seq`` from a sequence (``outbox_seq``,
  ``spawns_seq``), so seqs start at 1 and increase in the order they are allocated; a
  commit that is refused allocates none, one killed in flight may leave a gap.
- ``processed(execution_id, event_id)``: the dedupe marks.
- ``timers(execution_id, path, fire_at, seq, lease_until)``: one row per timer; ``seq``
  (``timers_seq``) is the arming order; re-arming gives the row a new ``seq`` and no lease.
- ``trace(execution_id, idx, step)`` and ``trace_index(execution_id, next_index)``: the
  ring and the per-execution monotonic index. ``idx`` is the index a step was stamped
  with, added on read when the step carries no ``"index"`` of its own; the ring is
  trimmed by ``idx``, deleting just the overflow. Appends to one ring (a commit's
  step, ``append_trace``) take turns on its ``trace_index`` row, which they update; one
  that waited for another does not see, in its statement's snapshot, the steps appended
  meanwhile, and its statement says so (the index moved by more than its own step): the
  store then trims the ring again, in a statement of its own, so it holds at most
  ``trace_max`` steps once the call returns.
- ``commit_ids(execution_id, commit_id, digest, version)``: a SHA-256 of the commit's
  body in the codec's canonical encoding, and the version the commit produced.

**One round trip per commit.** A commit is one SQL statement, a data-modifying ``WITH``
(:meth:`._schema._Sql.commit`), run in autocommit mode, so it is one transaction and one network
round trip, and prepared once per connection (``prepare=True``). It holds only the parts
the commit uses (a save is the CAS and the commit id's record): parts that write nothing
still cost their planning and their executor's start at each call. It reads
nothing before ``UPDATE executions ... WHERE id = ... AND version = ...``, the CAS
(a concurrent writer's update makes PostgreSQL re-check the ``WHERE`` against
the new row, so of two writers at one version exactly one updates), and a first write is
an ``INSERT ... ON CONFLICT (id) DO NOTHING`` (of two first writers exactly one inserts).
Every other part (emits, the mark, timers, spawns, the trace step, the commit id, the
``pg_notify``) writes only ``WHERE EXISTS`` a row from the CAS, so a refused commit
writes nothing and takes no seq. Timer ops are reduced to the last op per path before
they are sent (the final state is the same; one statement cannot touch a row twice).
The stored version and epoch are read only when the commit is refused; a replay of a
``commit_id`` finds the version moved past it (or, were it not, violates the commit id's
key: the statement fails whole). Only a refused commit needs a second statement, which
tells a conflict from a replay (or one whose trace step raced an append: the trim
above). ``exe.version`` is set before the statement runs, so an execution that refuses
its new version (frozen, or a setter that raises) is refused with nothing written; it is set back when the commit is
not applied. Loads, acks, claims and ``stats`` are one statement each too.

**Forget and the writers of an execution** take their row locks in one order, so they
serialize and never deadlock: a commit locks the execution's row (its CAS or first
insert) before any other row of the execution, then the ring's ``trace_index`` row
before its steps; an append locks the ring's row before its steps; ``forget`` (one
transaction) locks the execution's row, then the ring's, inserting a row that does not
exist (so a first write or a first append waits too; the deletes remove it), and only
then deletes, in a statement of its own whose snapshot sees everything the writers it
waited for wrote: nothing of a forgotten execution is left behind.

**Claims** lease rows with ``FOR UPDATE SKIP LOCKED`` and leases on the database clock
(``now()``), so relays on machines with different clocks agree. **Wake-ups**: a commit
that makes work calls ``pg_notify`` inside its own statement, so the notification is sent
when the data is committed and never before; :meth:`PostgresStore.wait_for_work`
uses ``LISTEN`` on a connection of its own, opened at its first call, and begins each
wait with an empty statement on it: the notifications of every commit that returned
before the wait arrive before that statement's reply. Work committed before the
``LISTEN`` is seen from the seq counters, read when the store opened and again at every
(re)connection of the listener (a seq taken by a commit still in flight then wakes the
wait early: the claim that follows finds nothing yet, and the commit's notification wakes
the next wait). A dropped connection can cost a spurious wake-up, never a missed one.

**Connections** come from psycopg-pool (:mod:`._connections`): a ``ConnectionPool``, or
for the async store an ``AsyncConnectionPool`` on the event loop it runs on (one per loop,
each closed by a keeper task as its loop ends); ``pool_size`` at most, one kept open,
each replaced after ``max_lifetime`` seconds. A connection is checked by the store as it
leaves the pool, without a round trip: a closed socket, or one the server wrote to while
the connection was idle (a restart's "terminating connection"), gets it replaced. So the
first call after a server restart reconnects; while the server is down a call finds it
out within ``connect_timeout`` and raises :class:`~harel_store.StoreError` with the
driver's reason (opening tries again for that long first). Reads, acks and claims are
retried once on a new connection when theirs fails mid-call, or when the server refused
them for a reason of the moment (read-only, a serialization failure, a deadlock); a
commit is not (its arguments may be iterators it has read, and a lost connection may
have applied it): it raises a ``StoreError`` that says so, and a retry with the same
``commit_id`` is recognised. A batch lost in its ``COMMIT``'s round trip is looked up by
the transaction id it read with its ``BEGIN`` (``pg_xact_status``, on the same server). A connection that saw the server turn read-only (SQLSTATE
25006, as on a primary demoted by a failover) or shut down is closed, never used again;
after a 25006 the pool's idle connections go too, so the next call connects anew (and,
with several hosts and ``target_session_attrs=read-write``, reaches the new primary).

**Errors**: every psycopg error becomes a :class:`~harel_store.StoreError` chaining it,
whose message gives the server's words, its SQLSTATE and what to do: *Retry* (the
connection was lost; 57P01-57P03 shutdown; 25006 read-only; 40001, 40P01; 55P03, 57014
timeouts; 53300 too many connections) or *Fix the setup* (42501 privileges; 42P01, 3F000
missing table or schema; 23505 a unique violation in rows the store never writes twice;
53100 disk full; a refused login). A conninfo libpq cannot read is a ``ValueError`` when
the store is made, before any connection. No message shows a password: the conninfo and
what the driver says of it go through :func:`harel_store._redact.redact`.

**Copying**: ``_dump`` streams a ``REPEATABLE READ`` snapshot through server-side
cursors, ``_restore`` writes into an empty schema in one transaction that locks its
tables (:func:`harel_store.copy_store`, ``python -m harel_store copy``).

**PgBouncer** in transaction mode does not keep a server connection's prepared
statements across transactions (before PgBouncer 1.21 and its
``max_prepared_statements``): pass ``prepare=False``, which prepares nothing.

The package: :mod:`._schema` (the migrations and every statement), :mod:`._core` (every
operation once, as a generator of statements, shared by both stores), :mod:`._connections`
(connections and pools), :mod:`._store` (:class:`PostgresStore`) and :mod:`._aio`
(:class:`AsyncPostgresStore`).
"""

from ._aio import AsyncPostgresStore
from ._schema import MIGRATIONS, SCHEMA_VERSION
from ._store import PostgresStore

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "AsyncPostgresStore", "PostgresStore"]

# Shown, documented and reported by their public path.
PostgresStore.__module__ = AsyncPostgresStore.__module__ = __name__
