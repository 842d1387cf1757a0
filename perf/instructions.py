"""Instructions per typical commit, counted by valgrind's callgrind, for each
implementation: the same commit as ``bench_store.py``'s ``commit_typical``, from the same
store, counted over the commit loop alone (the store's construction and the process's
start and exit are not counted). A count moves by well under 1% between runs where
pyperf's wall-clock medians on a shared virtual machine move by 10% or more, so it tells
whether a change to the hot path saves work; pyperf's ratios stay the measure of speed.
The collector's work that the commits cause is counted, as in ``commit_typical``.

    python perf/instructions.py                  # compiled, pure and spec, 1,000 commits
    python perf/instructions.py --impl pure,spec --commits 2000

Needs ``valgrind`` on the PATH. Each implementation is counted in its own process:
``python perf/instructions.py --inner IMPL N`` runs the commits, and the counting is
switched on only inside ``itertools.starmap``, which drives them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from itertools import starmap
from pathlib import Path

import bench_store

COLLECTED = re.compile(r"Collected : (\d+)")


def inner(impl_name: str, commits: int) -> None:
    """The counted loop: ``commits`` typical commits into a fresh commit store."""
    impl = bench_store.load_impl(impl_name)
    sizes = bench_store.Sizes()
    store = bench_store.commit_store(impl, sizes)
    exe = store.load("exe-0")
    commit = store.commit
    emits, spawns, step = bench_store.EMITS, bench_store.SPAWNS, bench_store.STEP
    work = bench_store.typical_work(commits)
    bench_store.settle()
    deque(
        starmap(
            lambda event_id, rearm: commit(
                exe, emits, processed_event_id=event_id, timers=rearm, spawns=spawns, trace=step
            ),
            work,
        ),
        maxlen=0,
    )
    if not store.is_processed("exe-0", work[-1][0]):
        raise RuntimeError("the typical commits did not commit")


def count(impl_name: str, commits: int) -> int:
    """Instructions callgrind counted inside the commit loop of one process."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            "valgrind", "--tool=callgrind", "--collect-atstart=no",
            "--toggle-collect=starmap_next", f"--callgrind-out-file={tmp}/out",
            sys.executable, str(Path(__file__).resolve()), "--inner", impl_name, str(commits),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    found = COLLECTED.search(proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"valgrind failed for {impl_name} ({proc.returncode}):\n{proc.stderr}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--impl", default="all", type=bench_store.parse_impls,
        help="as bench_store.py's --impl (default: all)",
    )  # fmt: skip
    parser.add_argument("--commits", type=int, default=1000, help="commits counted (default: 1000)")
    parser.add_argument("--inner", nargs=2, metavar=("IMPL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args.inner[0], int(args.inner[1]))
        return
    if args.commits < 1:
        parser.error("--commits must be at least 1")
    if shutil.which("valgrind") is None:
        sys.exit("perf/instructions.py needs valgrind on the PATH (apt-get install valgrind)")
    impls = args.impl
    per_commit = {name: count(name, args.commits) / args.commits for name in impls}
    print(f"Instructions per typical commit ({args.commits:,} commits, callgrind):")
    for name, n in per_commit.items():
        line = f"  {name:9} {n:9,.0f}"
        if "spec" in per_commit and name != "spec":
            line += f"   spec / {name}: {per_commit['spec'] / n:.2f}x"
        print(line)


if __name__ == "__main__":
    main()
