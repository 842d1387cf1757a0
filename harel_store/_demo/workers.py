"""The demonstration with its relays in N worker processes sharing one database.

This process coordinates (:class:`~.durable.Coordinator`): it opens or resumes the run,
moves the clock whenever the store is quiescent, admits the orders, and checks the run
at the end. Each worker opens its own store on the same URL and runs a
:class:`~.durable.Relay`: it claims outbox entries, spawn intents and due timers with
leases, so no two workers hold the same work, and waits with ``wait_for_work`` when
there is none. A worker stops when the driver says the run is over, or when this
process is gone (so ``kill -9`` of the coordinator leaves no worker behind for long);
whatever a dead worker held is claimed by the others once its lease runs out.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import time
import traceback
from collections.abc import Callable
from time import perf_counter
from typing import Any

from .._open import open_store
from .durable import LEASE, Coordinator, Relay
from .result import DemoResult, WorkerReport

IDLE_WAIT = 0.25  # seconds a worker waits for work before it looks around again
STOP_TIMEOUT = 60.0  # seconds the workers are given to report once told to stop


def run_workers(
    url: str,
    coord: Coordinator,
    workers: int,
    *,
    lease: float = LEASE,
    progress: Callable[[int, int], None] | None = None,
) -> DemoResult:
    """Run the demonstration opened by ``coord`` (on the store of ``url``) with its
    relays in ``workers`` processes."""
    if coord.phase == "done":
        return coord.conclude_finished()
    # Spawned, not forked: a worker opens its own store, and shares no connection, lock
    # or thread with this process. Each reports through a pipe of its own (no semaphore
    # to leak when a process is killed), whose end tells when a worker died silently.
    context = multiprocessing.get_context("spawn")
    procs = []
    pipes = []
    for k in range(1, workers + 1):
        receive, send = context.Pipe(duplex=False)
        proc = context.Process(
            target=work,
            args=(url, k, lease, send, os.getpid()),
            name=f"harel-store-demo-worker-{k}",
            daemon=True,
        )
        proc.start()
        send.close()
        procs.append(proc)
        pipes.append(receive)
    problems: list[str] = []
    start = perf_counter()
    try:
        pause = 0.002
        while True:
            left = coord.pending()
            if left:
                if not any(proc.is_alive() for proc in procs):
                    problems.append(f"every worker stopped with {left:,} items of work left")
                    break
                time.sleep(pause)
                pause = min(pause * 1.5, 0.05)
                continue
            pause = 0.002
            finished = coord.forget_retired()
            if progress is not None:
                progress(finished, coord.n)
            if coord.over():
                break
            coord.advance()
        elapsed = perf_counter() - start
    finally:
        try:
            coord.stop()
        finally:  # stopped or not, the workers stop with this process (daemons)
            reports = _collect(pipes, procs)
    result = coord.conclude([counts for _, counts in reports], [r for r, _ in reports], elapsed)
    result["problems"][:0] = problems
    return result


def _collect(pipes: list[Any], procs: list[Any]) -> list[tuple[WorkerReport, dict[str, int]]]:
    """Each worker's report and counts, in worker order; a worker that sent none gets
    a report that says it was lost."""
    reports: dict[int, tuple[WorkerReport, dict[str, int]]] = {}
    deadline = time.monotonic() + STOP_TIMEOUT
    waiting = dict(zip(pipes, range(1, len(pipes) + 1)))
    while waiting:
        left = deadline - time.monotonic()
        ready: list[Any] = multiprocessing.connection.wait(list(waiting), max(0.0, left))
        if not ready:
            break
        for pipe in ready:
            k = waiting.pop(pipe)
            try:
                reports[k] = pipe.recv()
            except EOFError:  # gone without a word
                pass
            pipe.close()
    for pipe in waiting:
        pipe.close()
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
    for k, proc in enumerate(procs, 1):
        if k not in reports:
            reports[k] = _failed(k, proc.pid or 0, "", lost=True)
    return [reports[k] for k in sorted(reports)]


def _failed(
    worker: int, pid: int, error: str, *, lost: bool = False
) -> tuple[WorkerReport, dict[str, int]]:
    report = WorkerReport(
        worker=worker,
        pid=pid,
        commits=0,
        events_delivered=0,
        timers_fired=0,
        children_created=0,
        orders_retired=0,
        conflicts=0,
        elapsed=0.0,
        commits_per_s=0.0,
        error=error,
        lost=lost,
    )
    return report, {}


def work(url: str, worker: int, lease: float, results: Any, parent: int) -> None:
    """A worker process: relay until the run is over or the coordinator is gone."""
    try:
        with open_store(url) as store:
            relay = Relay(store, lease=lease)
            start = perf_counter()
            while True:
                did = relay.round()
                if relay.phase != "running":
                    break
                if not did:
                    if os.getppid() != parent:
                        break
                    store.wait_for_work(IDLE_WAIT)
            elapsed = perf_counter() - start
            report = relay.report(worker, elapsed), relay.counts()
    except BaseException:  # noqa: BLE001 - the coordinator reports it
        report = _failed(worker, os.getpid(), traceback.format_exc(limit=5))
    with results, contextlib.suppress(OSError):  # a coordinator killed hears nothing
        results.send(report)
