"""The calls of a durable store that take an id it keeps as a key (the id ``b`` in one
place), and the name its error gives that place: the SQLite and PostgreSQL tests of the
id length limit share them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harel_store import Execution, TimerOp

# Every call of a durable store that takes an id it keeps as a key, with the id ``b`` in
# one place, and the name its error gives that place.
KEYED_CALLS: list[tuple[Callable[[Any, str], Any], str]] = [
    (lambda s, b: s.commit(Execution(id=b), []), "execution id"),
    (lambda s, b: s.save(Execution(id=b)), "execution id"),
    (lambda s, b: s.commit(Execution(id="e2"), [("t", 1), (b, "ev")]), "emits[1] target_id"),
    (lambda s, b: s.commit(Execution(id="e2"), [], b), "processed_event_id"),
    (
        lambda s, b: s.commit(
            Execution(id="e2"), [], timers=[TimerOp("cancel", "p"), TimerOp("schedule", b, 2)]
        ),
        "timers[1].path",
    ),
    (
        lambda s, b: s.commit(Execution(id="e2"), [], spawns=[(b, "r", {})]),
        "spawns[0] child_id",
    ),
    (lambda s, b: s.commit(Execution(id="e2"), [], commit_id=b), "commit_id"),
    (lambda s, b: s.append_trace(b, {}), "execution_id"),
    (lambda s, b: s.load(b), "execution_id"),
    (lambda s, b: s.is_processed(b, "v1"), "execution_id"),
    (lambda s, b: s.is_processed("e1", b), "event_id"),
    (lambda s, b: s.delete_timer(b, "p", 1.0), "execution_id"),
    (lambda s, b: s.delete_timer("e1", b, 1.0), "path"),
    (lambda s, b: s.forget(b), "execution_id"),
    (lambda s, b: s.read_trace(b), "execution_id"),
]
