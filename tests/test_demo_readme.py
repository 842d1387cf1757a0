"""The README's walk-through (a demonstration kept with ``--keep``, then ``inspect``,
``show``, ``prune`` and ``copy``) run as written, in its order, in one directory, and what
each command prints compared with the store's own figures. (``tests/test_readme.py``
runs each README command on its own too.)"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from test_readme import README, fenced_blocks, subprocess_env

HEADING = "#### A walk-through: a demonstration kept, inspected, pruned and copied"


def section() -> str:
    text = README.read_text("utf-8")
    assert HEADING in text, f"the README has no section {HEADING!r}"
    after = text.split(HEADING, 1)[1]
    return re.split(r"^#{1,4} ", after, maxsplit=1, flags=re.MULTILINE)[0]


def walk_through() -> list[list[str]]:
    """The argv of each command of the walk-through's ``sh`` block, in order."""
    blocks = [body for lang, body in fenced_blocks(section()) if lang == "sh"]
    assert len(blocks) == 1, "the walk-through has one sh block"
    return [shlex.split(line) for line in blocks[0].splitlines() if line.strip()]


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert argv[:3] == ["python", "-m", "harel_store"], argv
    proc = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=cwd,
        env=subprocess_env(pure=False),
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stdout}\n{proc.stderr}"
    return proc


def figures(text: str) -> dict[str, str]:
    """``inspect``'s lines, one figure each."""
    return dict(line.split(None, 1) for line in text.splitlines() if line.strip())


def path_of(url: str, cwd: Path) -> Path:
    assert url.startswith("sqlite:///"), url
    return cwd / url[len("sqlite:///") :]


def test_the_walk_through_runs_as_written(tmp_path: Path) -> None:
    from harel_store._demo.workflow import fates, plan
    from harel_store.sqlite import SqliteStore

    commands = walk_through()
    verbs = [argv[3] if argv[3:4] and not argv[3].startswith("-") else "demo" for argv in commands]
    assert verbs == ["demo", "inspect", "show", "prune", "copy"]
    demo, inspect, show, prune, copy = commands
    assert "--keep" in demo
    url = demo[demo.index("--store") + 1]
    n = int(demo[demo.index("-n") + 1])
    served = n - plan(fates(n, 1)).lost

    out = run(demo, tmp_path).stdout
    assert "OK: every order completed or timed out as planned" in out
    with SqliteStore(path_of(url, tmp_path)) as store:
        overview = store.overview()
        shards = store.load("demo/driver").context["shards"]
        order_id = show[5]
        order = store.load(order_id)
        steps = store.read_trace(order_id)
    assert overview["executions"] == n + 2 * served + 3 * shards + 1
    # what the README says of them
    prose = " ".join(section().split())
    assert f"the {n} orders, their {2 * served} region children" in prose
    assert f"completed at version {order.version}, its {len(steps)} trace steps" in prose
    assert f"{order.version - 1} marks and {order.version} commit ids" in prose

    # inspect prints the overview's figures
    shown = figures(run(inspect, tmp_path).stdout)
    for key in ("executions", "outbox", "spawns", "timers", "processed", "commit_ids"):
        assert int(shown[key]) == overview[key], key
    assert overview["outbox"] == overview["spawns"] == overview["timers"] == 0

    # show prints the execution as the store holds it
    text = run(show, tmp_path).stdout
    view = figures(text)
    assert view["execution"] == order_id
    assert int(view["version"]) == order.version
    assert view["trace"] == f"{len(steps)} steps"
    assert int(view["processed"]) == order.version - 1  # one mark per event handled
    assert int(view["commit_ids"]) == order.version  # one id per commit
    assert f"'to': '{order.active_path[-1]}'" in text

    # prune deletes every mark and commit id (--older-than 0s), and says how many
    out = run(prune, tmp_path).stdout
    assert f"{overview['processed']:,} processed marks" in out
    assert f"{overview['commit_ids']:,} commit ids" in out
    with SqliteStore(path_of(url, tmp_path)) as store:
        pruned = store.overview()
        stats = store.stats()
    assert pruned["processed"] == pruned["commit_ids"] == 0
    assert pruned["executions"] == overview["executions"]

    # copy makes a store holding the same
    run(copy, tmp_path)
    with SqliteStore(path_of(copy[5], tmp_path)) as copied:
        assert copied.stats() == stats
        assert copied.load(order_id) == order
        assert copied.read_trace(order_id) == steps
