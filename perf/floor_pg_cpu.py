"""The client's part of perf/floor_pg.py's single commit in instructions (callgrind), which
the shared machine's load does not move: per commit, the store's ``commit``, the same
statement run directly (``prepare_commit``, then psycopg, no pool), ``prepare_commit``
alone, and the floor's whole commit (its encodings and psycopg).

    python perf/floor_pg_cpu.py [--loops 1000] [--pg-url URL]

Each part runs in a process of its own under ``valgrind --tool=callgrind``, twice (200
commits, then 200 + loops): the difference over ``loops`` is the part's count per
commit, without the start-up. The server is the one ``HAREL_STORE_PG_URL`` (or
``--pg-url``) names, else a throwaway cluster as the tests start theirs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

PARTS = ("commit", "direct", "prepare", "floor")
_COLLECTED = re.compile(r"Collected : (\d+)")


def run_part(part: str, loops: int, url: str) -> None:
    """``loops`` typical commits of ``part``, in this process (the child's work)."""
    import floor_pg
    from floor import EVENT, LATER, STEP

    from harel_store import Execution, TimerOp

    floor_pg.STORE_SCHEMA = f"cpu_{part}"
    floor_pg.FLOOR_SCHEMA = f"cpu_lean_{part}"
    tags = [uuid.uuid4().hex[:8] for _ in range(loops)]
    if part == "floor":
        floor = floor_pg.PgFloor(url, floor_pg.FLOOR_SCHEMA)
        fexe = Execution(id="exe-0", definition_id="order")
        floor.populate(fexe)
        for i, tag in enumerate(tags):
            floor.commit(fexe, "exe-1", EVENT, f"e-{tag}", LATER + i, STEP, f"c-{tag}", 1)
        return
    store, exe = floor_pg.pg_store_for(url)
    core = store._core
    emits = [("exe-1", EVENT)]

    def args(i: int, tag: str) -> tuple[Any, ...]:
        rearm = [TimerOp("schedule", "root/wait", LATER + i)]
        return (exe, emits, f"x-{tag}", rearm, (), STEP, f"c-{tag}", 1)

    if part == "commit":
        for i, tag in enumerate(tags):
            a = args(i, tag)
            store.commit(*a[:6], commit_id=a[6], epoch=a[7])
    elif part == "prepare":
        for i, tag in enumerate(tags):
            core.prepare_commit(*args(i, tag))
    else:
        conn = store._pool.get()
        for i, tag in enumerate(tags):
            single = core.prepare_commit(*args(i, tag))
            sql = core.sql.commit(single.shape)
            conn.execute(sql, single.params, prepare=True, binary=True).fetchall()
            exe.version += 1
        store._pool.put(conn)
    store.close()


def instructions(part: str, loops: int, url: str) -> int:
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--part", part, "--loops", str(loops), "--pg-url", url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"no count from callgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=1000)
    parser.add_argument("--pg-url")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    url = args.pg_url or os.environ.get("HAREL_STORE_PG_URL")
    if args.part:
        run_part(args.part, args.loops, url)
        return
    server = None
    if not url:
        import _pg

        server = _pg.acquire()
        url = server.url
    try:
        for part in PARTS:
            base = instructions(part, 200, url)
            more = instructions(part, 200 + args.loops, url)
            print(f"{part:8s} {(more - base) / args.loops / 1e3:7.1f} k instructions per commit")
    finally:
        if server is not None:
            server.destroy()


if __name__ == "__main__":
    main()
