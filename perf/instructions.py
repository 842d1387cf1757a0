"""Instructions per typical commit, counted by valgrind's callgrind, for each
implementation: the same commit as ``bench_store.py``'s ``commit_typical``, from the same
store, counted over the commit loop alone (the store's construction and the process's
start and exit are not counted). A count moves by well under 1% between runs where
pyperf's wall-clock medians on a shared virtual machine move by 10% or more, so it tells
whether a change to the hot path saves work; pyperf's ratios stay the measure of speed.
The collector's work that the commits cause is counted, as in ``commit_typical``.

    python perf/instructions.py                  # compiled, pure and spec, 1,000 commits
    python perf/instructions.py --impl pure,spec --commits 2000
    python perf/instructions.py --case id_epoch  # with a fresh commit_id and epoch=1
    python perf/instructions.py --case replayed  # each id_epoch commit sent again
    python perf/instructions.py --case batch     # commit_typical_batch vs _singles

``--case batch`` counts the timed region of ``bench_store.py``'s ``commit_typical_batch``
and ``commit_typical_singles`` (the typical commit on 100 executions in turn, one
``commit_many`` per 100 or one ``commit`` call each, the bench's own loops), each per
commit, and their ratio: the instruction count of issue 27's "``commit_many`` of 100 no
slower per commit than 100 ``commit`` calls".

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
from collections.abc import Callable
from itertools import starmap
from pathlib import Path
from typing import Any

import bench_store

COLLECTED = re.compile(r"Collected : (\d+)")


CASES = ("typical", "id_epoch", "replayed", "batch")
REGIONS = ("batched", "singles")  # what --case batch counts, each in its own process


def inner(impl_name: str, commits: int, case: str = "typical") -> None:
    """The counted loop: ``commits`` typical commits into a fresh commit store; with
    ``case="id_epoch"`` each also with a fresh ``commit_id`` and ``epoch=1``, as
    ``bench_store.py``'s ``commit_typical_id_epoch``; with ``case="replayed"`` those
    commits land first, uncounted, and the loop sends each again, as ``commit_replayed``."""
    impl = bench_store.load_impl(impl_name)
    sizes = bench_store.Sizes()
    store = bench_store.commit_store(impl, sizes)
    if case in REGIONS:
        batch_region(store, commits, sizes, case == "batched")
        return
    exe = store.load("exe-0")
    commit = store.commit
    emits, spawns, step = bench_store.EMITS, bench_store.SPAWNS, bench_store.STEP
    work = bench_store.typical_work(commits)
    calls: list[tuple[Any, ...]] = list(work)
    one: Callable[..., None]
    if case == "typical":
        one = lambda event_id, rearm: commit(
            exe, emits, processed_event_id=event_id, timers=rearm, spawns=spawns, trace=step
        )
    else:
        calls = [(event_id, rearm, f"commit-{i}") for i, (event_id, rearm) in enumerate(work)]
        one = lambda event_id, rearm, commit_id: commit(
            exe, emits, processed_event_id=event_id, timers=rearm, spawns=spawns, trace=step,
            commit_id=commit_id, epoch=1,
        )  # fmt: skip
        if case == "replayed":
            for call in calls:
                one(*call)
    version = exe.version
    bench_store.settle()
    deque(starmap(one, calls), maxlen=0)
    if not store.is_processed("exe-0", work[-1][0]):
        raise RuntimeError("the typical commits did not commit")
    if case == "replayed" and exe.version != version:
        raise RuntimeError("the replayed commits wrote something")


def batch_region(store: Any, commits: int, sizes: bench_store.Sizes, batched: bool) -> None:
    """``time_commit_typical_batch``'s timed loop over ``commits`` commits, run once
    through ``itertools.starmap`` so that only it is counted."""
    batches = bench_store.batch_work(commits, store, min(bench_store.BATCH, sizes.executions))
    commit, commit_many = store.commit, store.commit_many

    def run(batches: list[list[Any]]) -> None:
        if batched:
            for batch in batches:
                commit_many(batch)
        else:
            for batch in batches:
                for exe, emits, event_id, rearm, spawns, step, _, _ in batch:
                    commit(
                        exe, emits, processed_event_id=event_id, timers=rearm, spawns=spawns,
                        trace=step,
                    )  # fmt: skip

    bench_store.settle()
    deque(starmap(run, [(batches,)]), maxlen=0)
    last = batches[-1][-1]
    if not store.is_processed(last.exe.id, last.processed_event_id):
        raise RuntimeError("the batch region did not commit")


def count(impl_name: str, commits: int, case: str = "typical") -> int:
    """Instructions callgrind counted inside the commit loop of one process."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            "valgrind", "--tool=callgrind", "--collect-atstart=no",
            "--toggle-collect=starmap_next", f"--callgrind-out-file={tmp}/out",
            sys.executable, str(Path(__file__).resolve()), "--inner", impl_name, str(commits), case,
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
    parser.add_argument(
        "--case", default="typical", choices=CASES,
        help="the typical commit, the same with a fresh commit_id and epoch=1, its replay, "
        "or the batched and single commits of commit_typical_batch and _singles (all but "
        "typical: compiled and pure only, the spec port has none of them)",
    )  # fmt: skip
    parser.add_argument("--inner", nargs=3, metavar=("IMPL", "N", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args.inner[0], int(args.inner[1]), args.inner[2])
        return
    if args.commits < 1:
        parser.error("--commits must be at least 1")
    if shutil.which("valgrind") is None:
        sys.exit("perf/instructions.py needs valgrind on the PATH (apt-get install valgrind)")
    impls = args.impl
    if args.case != "typical":
        if impls == ("spec",):
            parser.error(f"--case {args.case} is not a commit the spec port has")
        impls = tuple(name for name in impls if name != "spec")
    if args.case == "batch":
        print(f"Instructions per commit of commit_typical_batch ({args.commits:,} commits in")
        print(f"batches of {bench_store.BATCH}) and _singles (one commit call each), callgrind:")
        for name in impls:
            batched, singles = (count(name, args.commits, r) / args.commits for r in REGIONS)
            print(
                f"  {name:9} batched {batched:9,.0f}   singles {singles:9,.0f}"
                f"   singles / batched: {singles / batched:.2f}x"
            )
        return
    per_commit = {name: count(name, args.commits, args.case) / args.commits for name in impls}
    what = {
        "typical": "typical commit",
        "id_epoch": "typical commit with commit_id and epoch",
        "replayed": "replay of a typical commit with commit_id and epoch",
    }[args.case]
    print(f"Instructions per {what} ({args.commits:,} commits, callgrind):")
    for name, n in per_commit.items():
        line = f"  {name:9} {n:9,.0f}"
        if "spec" in per_commit and name != "spec":
            line += f"   spec / {name}: {per_commit['spec'] / n:.2f}x"
        print(line)


if __name__ == "__main__":
    main()
