"""Issue 27 item 6's ratios on one durable store, the sides alternating in one process.

``bench_durable.py`` runs each case in its own stretch of time; on a shared machine the
disk and the other cores change between stretches, and a ratio of a fsync-bound case (the
single commit) to a CPU-bound one (the batch) moves with them. Here every repeat runs each
side once, one after the other, on the bench's commit database (its cases' own code), and
the ratios are taken from each side's best and median repeat::

    python perf/pairs_durable.py --store postgres --repeat 5
    python perf/pairs_durable.py --store sqlite-full --tasks 1,2,4,32
    python perf/pairs_durable.py --store sqlite-normal --tasks 1 --peers

Sides: ``single`` (``commit_typical``), ``batch`` (``commit_typical_batch``, per commit
in batches of 100), ``tasks_N`` (``commit_typical_tasks`` with N tasks through one async
store) and with ``--peers`` eventsourcing's and LangGraph's one write. Prints
microseconds per commit and the ratios single/batch, tasks_1/tasks_N and peer/batch.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import bench_durable as bd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--store", choices=bd.TARGETS, default="postgres")
    parser.add_argument("--repeat", type=int, default=5, help="repeats of every side (default 5)")
    parser.add_argument("--commits", type=int, default=1000, help="commits a side (default 1000)")
    parser.add_argument("--tasks", default="1,32", help="task counts, comma-separated (1,32)")
    parser.add_argument("--peers", action="store_true", help="eventsourcing and LangGraph too")
    args = parser.parse_args()
    counts = sorted({int(n) for n in args.tasks.split(",")} | {1})
    if args.repeat < 1 or args.commits < bd.BATCH or counts[0] < 1:
        parser.error(f"--repeat >= 1, --commits >= {bd.BATCH} and task counts >= 1")
    target, sizes = args.store, bd.FULL
    data = tempfile.mkdtemp(prefix="harel-pairs-")
    server = None
    try:
        url = None
        if target == "postgres":
            import _pg

            server = _pg.acquire()
            url = server.url
        env = bd.Env(Path(data), url)
        bd.build_commit_db(target, env, sizes)
        n = args.commits // bd.BATCH * bd.BATCH  # whole batches

        def per_commit(case: Callable[..., float], loops: int, *extra: int) -> float:
            return case(loops, target, env, sizes, *extra) / n

        sides: dict[str, Callable[[], float]] = {
            "single": partial(per_commit, bd.time_commit_typical, n),
            "batch": partial(per_commit, bd.time_commit_typical_batch, n // bd.BATCH),
        }
        for k in counts:
            sides[f"tasks_{k}"] = partial(per_commit, bd.time_commit_typical_tasks, n, k)
        if args.peers:
            sides["eventsourcing"] = partial(per_commit, bd.time_eventsourcing, n)
            sides["langgraph"] = partial(per_commit, bd.time_langgraph, n)
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.repeat):
            for name, side in sides.items():
                times[name].append(side())
        for name, values in times.items():
            print(f"{target} {name:>13}: best {min(values) * 1e6:7.1f} us, "
                  f"median {statistics.median(values) * 1e6:7.1f} us per commit")  # fmt: skip
        pairs = [("single", "batch")] + [("tasks_1", f"tasks_{k}") for k in counts if k > 1]
        pairs += [(peer, "batch") for peer in bd.PEERS if peer in times]
        for one, many in pairs:
            best = min(times[one]) / min(times[many])
            median = statistics.median(times[one]) / statistics.median(times[many])
            print(f"{target} {one}/{many}: {best:.2f}x (best), {median:.2f}x (median)")
    finally:
        if server is not None:
            server.destroy()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
