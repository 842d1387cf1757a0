"""``python -m harel_store show URL ID``: one execution, readable (``--json``: one object)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any, cast

from ._common import PROG as COMMAND_LINE
from ._common import Command, UsageError, execute, existing_store

PROG = f"{COMMAND_LINE} show"
SUMMARY = "show one execution: version, fields, pending entries, timers, trace (URL ID)"
DESCRIPTION = (
    "Print the execution ID of the store at URL: its version, writer epoch and fields, "
    "the pending outbox entries addressed to it, the spawn intents it made or is the "
    "child of, its timers, its trace ring, and how many processed marks and commit ids it "
    "holds. --json prints it as one JSON object. Exits 0, 1 when the store cannot be "
    "read, 2 for a usage error (a bad URL, or an id the store holds nothing of)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="sqlite:///path.db or postgresql://...")
    parser.add_argument("id", metavar="ID", help="the execution id")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("-q", "--quiet", action="store_true", help="nothing on stderr")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harel_store show ARGV``: its exit code."""
    return execute(
        cast(Command, sys.modules[__name__]), PROG, sys.argv[1:] if argv is None else argv
    )


def run(args: argparse.Namespace) -> int:
    with existing_store(args.url) as (url, store):
        found = describe(store, args.id)
    if found is None:
        raise UsageError(f"{url.shown} holds no execution {args.id!r}")
    if args.json:
        print(json.dumps(found, default=_plain))
    else:
        _print(found)
    return 0


def describe(store: Any, eid: str) -> dict[str, Any] | None:
    """What ``show`` prints of ``eid``: a durable store's own reading when it has one,
    else one made of the public methods (without the counts of marks and commit ids)."""
    from ..sqlite import SqliteStore

    if isinstance(store, SqliteStore):
        from ..sqlite import _operate

        return _operate.show(store, eid)
    postgres = sys.modules.get("harel_store.postgres")  # loaded if the store is one
    if postgres is not None and isinstance(store, postgres.PostgresStore):
        return cast("dict[str, Any] | None", store._run("show", eid))
    own = getattr(store, "_show", None)
    if own is not None:
        return cast("dict[str, Any] | None", own(eid))
    exe = store.load(eid)
    trace = store.read_trace(eid)
    outbox = [
        {"seq": e.seq, "event": e.event, "leased_until": None, "age": None}
        for e in store.pending_outbox()
        if e.target_id == eid
    ]
    spawns = [
        {"seq": s.seq, "parent_id": s.parent_id, "child_id": s.child_id, "leased_until": None,
         "age": None}
        for s in store.pending_spawns()
        if eid in (s.parent_id, s.child_id)
    ]  # fmt: skip
    timers = [
        {"path": p, "fire_at": f, "leased_until": None}
        for e, p, f in store.due_timers(math.inf)
        if e == eid
    ]
    if exe is None and not (outbox or spawns or timers or trace):
        return None
    return {
        "id": eid, "execution": exe, "version": None if exe is None else exe.version,
        "epoch": None, "outbox": outbox, "spawns": spawns, "timers": timers, "trace": trace,
        "processed": None, "commit_ids": None,
    }  # fmt: skip


def _plain(value: Any) -> Any:
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:
        return {name: getattr(value, name) for name in fields}
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def _print(found: dict[str, Any]) -> None:
    exe = found["execution"]
    print(f"execution   {found['id']}")
    print(f"version     {found['version'] if exe is not None else '- (not saved)'}")
    print(f"epoch       {'-' if found['epoch'] is None else found['epoch']}")
    if exe is not None:
        for name, value in (_plain(exe) if not isinstance(exe, dict) else exe).items():
            print(f"  {name}: {value!r}")
    print(f"outbox      {len(found['outbox'])} pending to it")
    for e in found["outbox"]:
        lease = "" if e["leased_until"] is None else f", leased until {e['leased_until']:.3f}"
        age = "" if e["age"] is None else f", {e['age']:.1f} s old"
        print(f"  #{e['seq']}: {e['event']!r}{age}{lease}")
    print(f"spawns      {len(found['spawns'])} pending")
    for s in found["spawns"]:
        print(f"  #{s['seq']}: {s['parent_id']} -> {s['child_id']}")
    print(f"timers      {len(found['timers'])}")
    for t in found["timers"]:
        lease = "" if t["leased_until"] is None else f", leased until {t['leased_until']:.3f}"
        print(f"  {t['path']}: fires at {t['fire_at']}{lease}")
    print(f"trace       {len(found['trace'])} steps")
    for step in found["trace"]:
        print(f"  {step!r}")
    for key in ("processed", "commit_ids"):
        print(f"{key:<11} {'-' if found[key] is None else found[key]}")
