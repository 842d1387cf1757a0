"""The benchmarks' baseline: the pseudocode of ``/work/shared/spec/dictstore.md`` typed in.

``SpecDictStore`` is "what typing in the specification gives you": plain lists rebuilt
on every ack, a dict of timers scanned on every sweep, ``del steps[:n]`` on the trace
list, ``_processed`` as a set of tuples. It follows the specification line for line,
including what the package deliberately does better (no input checks, quadratic drains,
due timers in dict order), so that every figure of the suite can be read against it.

Used only by ``bench_store.py``; not part of the package and not tested as a store.
"""

from __future__ import annotations

from typing import Any

from harel_store import DEFAULT_TRACE_MAX, OutboxEntry, SpawnEntry, StoreConflict


class SpecDictStore:
    """``DictStore`` exactly as the specification writes it."""

    def __init__(self, *, trace_max: Any = DEFAULT_TRACE_MAX) -> None:
        self._by_id: dict[Any, Any] = {}
        self._outbox: list[OutboxEntry] = []
        self._processed: set[tuple[Any, Any]] = set()
        self._timers: dict[tuple[Any, Any], float] = {}
        self._spawns: list[SpawnEntry] = []
        self._trace: dict[Any, list[dict[Any, Any]]] = {}
        self._trace_idx: dict[Any, int] = {}
        self.trace_max = trace_max
        self._seq = 0
        self._spawn_seq = 0

    def load(self, execution_id):
        return self._by_id.get(execution_id)

    def save(self, exe):
        prev = self._by_id.get(exe.id)
        if prev is not None and prev is not exe and prev.version != exe.version:
            raise StoreConflict(exe.id, expected=exe.version, found=prev.version)
        exe.version += 1
        self._by_id[exe.id] = exe

    def commit(self, exe, emits, processed_event_id=None, timers=(), spawns=(), trace=None):
        self.save(exe)
        for target_id, event in emits:
            self._seq += 1
            self._outbox.append(OutboxEntry(self._seq, target_id, event))
        if processed_event_id is not None:
            self._processed.add((exe.id, processed_event_id))
        for op in timers:
            if op.action == "schedule":
                self._timers[(exe.id, op.path)] = op.fire_at
            else:
                self._timers.pop((exe.id, op.path), None)
        for child_id, root_path, context in spawns:
            self._spawn_seq += 1
            self._spawns.append(
                SpawnEntry(self._spawn_seq, exe.id, child_id, root_path, dict(context))
            )
        if trace is not None:
            self._record_trace(exe.id, trace)

    def is_processed(self, execution_id, event_id):
        return (execution_id, event_id) in self._processed

    def pending_outbox(self):
        return list(self._outbox)

    def ack_outbox(self, seq):
        self._outbox = [e for e in self._outbox if e.seq != seq]

    def pending_spawns(self):
        return list(self._spawns)

    def ack_spawn(self, seq):
        self._spawns = [s for s in self._spawns if s.seq != seq]

    def due_timers(self, now):
        return [(eid, path, fa) for (eid, path), fa in self._timers.items() if fa <= now]

    def delete_timer(self, execution_id, path, fire_at):
        if self._timers.get((execution_id, path)) == fire_at:
            del self._timers[(execution_id, path)]

    def _record_trace(self, execution_id, entry):
        idx = self._trace_idx.get(execution_id, 0)
        self._trace_idx[execution_id] = idx + 1
        steps = self._trace.setdefault(execution_id, [])
        steps.append({**entry, "index": entry.get("index", idx)})
        if self.trace_max and len(steps) > self.trace_max:
            del steps[: len(steps) - self.trace_max]

    def append_trace(self, execution_id, entry):
        self._record_trace(execution_id, entry)

    def read_trace(self, execution_id):
        return list(self._trace.get(execution_id, []))

    def close(self):
        pass


class SpecAsyncDictStore(SpecDictStore):
    """The specification's ``AsyncDictStore``: the same structures and logic behind
    ``async def`` methods that await nothing (``_record_trace`` stays plain). Each
    coroutine carries its body itself, as the specification's twin does."""

    async def load(self, execution_id):
        return self._by_id.get(execution_id)

    async def save(self, exe):
        SpecDictStore.save(self, exe)

    async def commit(self, exe, emits, processed_event_id=None, timers=(), spawns=(), trace=None):
        prev = self._by_id.get(exe.id)
        if prev is not None and prev is not exe and prev.version != exe.version:
            raise StoreConflict(exe.id, expected=exe.version, found=prev.version)
        exe.version += 1
        self._by_id[exe.id] = exe
        for target_id, event in emits:
            self._seq += 1
            self._outbox.append(OutboxEntry(self._seq, target_id, event))
        if processed_event_id is not None:
            self._processed.add((exe.id, processed_event_id))
        for op in timers:
            if op.action == "schedule":
                self._timers[(exe.id, op.path)] = op.fire_at
            else:
                self._timers.pop((exe.id, op.path), None)
        for child_id, root_path, context in spawns:
            self._spawn_seq += 1
            self._spawns.append(
                SpawnEntry(self._spawn_seq, exe.id, child_id, root_path, dict(context))
            )
        if trace is not None:
            self._record_trace(exe.id, trace)

    async def is_processed(self, execution_id, event_id):
        return (execution_id, event_id) in self._processed

    async def pending_outbox(self):
        return list(self._outbox)

    async def ack_outbox(self, seq):
        self._outbox = [e for e in self._outbox if e.seq != seq]

    async def pending_spawns(self):
        return list(self._spawns)

    async def ack_spawn(self, seq):
        self._spawns = [s for s in self._spawns if s.seq != seq]

    async def due_timers(self, now):
        return [(eid, path, fa) for (eid, path), fa in self._timers.items() if fa <= now]

    async def delete_timer(self, execution_id, path, fire_at):
        if self._timers.get((execution_id, path)) == fire_at:
            del self._timers[(execution_id, path)]

    async def append_trace(self, execution_id, entry):
        self._record_trace(execution_id, entry)

    async def read_trace(self, execution_id):
        return list(self._trace.get(execution_id, []))

    async def close(self):
        pass


class SpecDemoStore(SpecDictStore):
    """The spec port plus ``stats`` and ``forget``, which the demo workload
    (``harel_store._demo.run``) calls but the specification does not have.

    The demo calls both only after it has taken its ``elapsed`` time, to check the
    store, so they do not enter the figures. ``forget`` only hides an execution's
    marks and timers (``stats`` filters them): the spec's layout has no per-id index,
    and removing them for real would cost a scan of every mark per forgotten id."""

    def __init__(self, *, trace_max: Any = DEFAULT_TRACE_MAX) -> None:
        super().__init__(trace_max=trace_max)
        self._forgotten: set[Any] = set()

    def forget(self, execution_id):
        self._by_id.pop(execution_id, None)
        self._trace.pop(execution_id, None)
        self._trace_idx.pop(execution_id, None)
        self._forgotten.add(execution_id)

    def stats(self):
        gone = self._forgotten
        return {
            "executions": len(self._by_id),
            "outbox": len(self._outbox),
            "spawns": len(self._spawns),
            "timers": sum(1 for eid, _ in self._timers if eid not in gone),
            "processed": sum(1 for eid, _ in self._processed if eid not in gone),
            "traces": len(self._trace),
            "trace_steps": sum(len(steps) for steps in self._trace.values()),
        }
