"""What every store's ``overview``, ``list_executions`` and ``prune`` share: the checks of
their arguments, the keys of an overview, the durations the command line takes, and the
shape of one execution as ``show`` prints it, and the line a claim that took over leases
logs."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any

from ._checks import as_limit, as_time
from ._errors import shown

# The figures of an overview, in the order the command line prints them.
OVERVIEW_KEYS = (
    "executions", "outbox", "spawns", "timers", "processed", "commit_ids",
    "outbox_oldest_age", "spawns_oldest_age", "outbox_leased", "spawns_leased",
    "timers_leased", "expired_leases", "timers_due", "next_timer_at",
)  # fmt: skip
PRUNE_KEYS = ("processed", "commit_ids")
PRUNE_BATCH = 5000  # rows a durable store deletes per transaction while pruning

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def as_older_than(value: Any) -> float:
    """``older_than`` of ``prune``: seconds, finite and at least 0."""
    seconds = value if type(value) is float else as_time(value, "older_than")
    if not 0.0 <= seconds < math.inf:
        raise ValueError(
            f"older_than must be a finite number of seconds, at least 0, got {shown(value)}"
        )
    return seconds


def as_after(value: Any) -> Any:
    """``after`` of ``list_executions`` on a durable store: ``None`` or a ``str``."""
    if value is not None and type(value) is not str:
        raise TypeError(f"after must be None or an execution id (str), got {shown(value)}")
    return value


def as_page(value: Any) -> int:
    """``limit`` of ``list_executions``."""
    return as_limit(value)


def duration(text: str) -> float:
    """Seconds of a duration written as a number and a unit: ``90s``, ``15m``, ``12h``,
    ``7d``; a ``ValueError`` naming the accepted form otherwise."""
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise ValueError(
            f"{text!r} is not a duration: write a number and one of s, m, h, d (e.g. 7d, 12h)"
        )
    return float(found.group(1)) * _UNITS[found.group(2)]


def age(now: float, then: float | None) -> float | None:
    """Seconds from ``then`` to ``now`` (never below 0), ``None`` for no ``then``."""
    return None if then is None else max(0.0, now - then)


def execution_view(
    eid: str, exe: Any, trace: list[Any], counted: tuple[Any, int, int], rows: Any
) -> dict[str, Any] | None:
    """One execution as ``show`` prints it, from a durable store's reading: ``counted``
    its epoch, marks and commit ids; ``rows`` its outbox entries ``(seq, event,
    leased_until, age)``, spawn intents ``(seq, parent_id, child_id, leased_until, age)``
    and timers ``(path, fire_at, leased_until)``, events decoded, a lease of ``0`` or
    ``None`` being none. ``None`` when the store holds nothing of it."""
    epoch, marks, commits = counted
    outbox, spawns, timers = rows
    if exe is None and not (outbox or spawns or timers or marks or commits or trace):
        return None
    return {
        "id": eid,
        "execution": exe,
        "version": None if exe is None else exe.version,
        "epoch": epoch,
        "outbox": [
            {"seq": s, "event": e, "leased_until": lu or None, "age": max(0.0, at)}
            for s, e, lu, at in outbox
        ],
        "spawns": [
            {
                "seq": s,
                "parent_id": p,
                "child_id": c,
                "leased_until": lu or None,
                "age": max(0.0, at),
            }
            for s, p, c, lu, at in spawns
        ],
        "timers": [{"path": p, "fire_at": f, "leased_until": lu or None} for p, f, lu in timers],
        "trace": trace,
        "processed": marks,
        "commit_ids": commits,
    }


_TAKEN_WHAT = {"outbox": "outbox entries", "spawns": "spawn intents", "timers": "timers"}
_TAKEN_NAMED = 10  # the line names this many of them at most


def log_takeover(log: logging.Logger, where: str, table: str, taken: Sequence[Any]) -> None:
    """One WARNING for a claim of ``table`` that took over ``taken`` (the seqs of outbox
    entries or spawn intents, the ``(execution_id, path)`` of timers) whose lease ran out
    unacked."""
    named = ", ".join(map(str, taken[:_TAKEN_NAMED]))
    if len(taken) > _TAKEN_NAMED:
        named += f", ... ({len(taken) - _TAKEN_NAMED} more)"
    log.warning(
        "%s: a claim took over %d %s whose lease ran out unacked (a worker died or is "
        "slow): %s",
        where, len(taken), _TAKEN_WHAT[table], named,
    )  # fmt: skip
