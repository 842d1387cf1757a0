"""The demonstration with its relays in N worker processes sharing one database.

This process coordinates (:class:`~.durable.Coordinator`): it opens or resumes the run,
moves the clock whenever the store is quiescent, admits the orders, and checks the run
at the end. Each worker opens its own store on the same URL and runs a
:class:`~.relay.Relay`: it claims outbox entries, spawn intents and due timers with
leases, so no two workers hold the same work, and waits with ``wait_for_work`` when
there is none. On PostgreSQL a batched run's coordinator forgets retired orders on
:data:`FORGETTERS` connections of its own at once (a forget is a transaction). A worker
stops when the driver says the run is over, or when this process is gone (so ``kill -9`` of the coordinator leaves no worker behind for long);
whatever a dead worker held is claimed by the others once its lease runs out.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

from .._open import open_store
from .batched import BatchRelay
from .durable import Coordinator
from .relay import LEASE, Relay
from .result import DemoResult, WorkerReport

IDLE_WAIT = 0.25  # seconds a worker waits for work before it looks around again
STOP_TIMEOUT = 60.0  # seconds the workers are given to report once told to stop
HALT_TIMEOUT = 10.0  # seconds the workers are given to stop on SIGTERM when the run is cut short
STALL = 1.0  # seconds the work left stays as it is before the run says it waits for leases
FORGETTERS = 4  # connections the coordinator forgets retired orders on (PostgreSQL, batched)


class _Stop:
    """SIGTERM in a worker (the coordinator's, when the run is cut short): noted, and
    seen between two deliveries, so that no store call is cut in two."""

    asked = False

    @classmethod
    def ask(cls, signum: int, frame: Any) -> None:
        cls.asked = True

    @classmethod
    def seen(cls) -> bool:
        return cls.asked


def run_workers(
    url: str,
    coord: Coordinator,
    workers: int,
    *,
    lease: float = LEASE,
    progress: Callable[[int, int], None] | None = None,
    waiting: Callable[[int], None] | None = None,
    batch: bool = True,
) -> DemoResult:
    """Run the demonstration opened by ``coord`` (on the store of ``url``) with its
    relays in ``workers`` processes. ``progress`` and ``waiting`` are called as by
    :func:`~.durable.run_durable` (``waiting`` when the work left has not changed for
    :data:`STALL` seconds: claimed by a process that stopped). ``batch`` as there: the
    workers run :class:`~.batched.BatchRelay`, or with ``False`` :class:`~.relay.Relay`.

    Cut short by an exception (a signal, a store error), the workers are stopped with
    SIGTERM, killed after :data:`HALT_TIMEOUT` seconds, and the exception goes on: the
    run stays in the store for ``--resume``."""
    if coord.phase == "done":
        return coord.conclude_finished()
    # Spawned, not forked: a worker opens its own store, and shares no connection, lock
    # or thread with this process. Each reports through a pipe of its own (no semaphore
    # to leak when a process is killed), whose end tells when a worker died silently.
    context = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    pipes: list[Any] = []
    problems: list[str] = []
    forgetters: list[Any] = []
    try:
        if batch and url.startswith(("postgresql:", "postgres:")) and not coord.keep:
            # SQLite has one writer at a time: forgets on several connections would
            # only wait for each other there.
            for _ in range(FORGETTERS):
                forgetters.append(open_store(url))
            coord.forget_with(forgetters)
        with _sigint_ignored_by_children():
            for k in range(1, workers + 1):
                receive, send = context.Pipe(duplex=False)
                pipes.append(receive)
                proc = context.Process(
                    target=work,
                    args=(url, k, lease, send, os.getpid(), batch),
                    name=f"harel-store-demo-worker-{k}",
                    daemon=True,
                )
                proc.start()
                send.close()
                procs.append(proc)
        start = perf_counter()
        pause = 0.002
        last, since, told = 0, 0.0, False
        while True:
            left = coord.pending()
            if left:
                if not any(proc.is_alive() for proc in procs):
                    problems.append(f"every worker stopped with {left:,} items of work left")
                    break
                now = time.monotonic()
                if left != last:
                    last, since = left, now
                elif not told and now - since >= STALL and waiting is not None:
                    waiting(left)
                    told = True
                time.sleep(pause)
                pause = min(pause * 1.5, 0.05)
                continue
            pause = 0.002
            last, told = 0, False
            finished = coord.forget_retired()
            if progress is not None:
                progress(finished, coord.n)
            if coord.over():
                break
            coord.advance()
        elapsed = perf_counter() - start
        coord.stop()
        reports = _collect(pipes, procs)
    except BaseException:
        _halt(procs, pipes)
        raise
    finally:
        coord.forget_with([])
        for store in forgetters:
            store.close()
    result = coord.conclude([counts for _, counts in reports], [r for r, _ in reports], elapsed)
    result["problems"][:0] = problems
    return result


@contextlib.contextmanager
def _sigint_ignored_by_children() -> Iterator[None]:
    """Start processes that ignore SIGINT from their first instruction (the disposition
    goes through exec): Ctrl-C reaches every process of the terminal's group, and the
    coordinator, not each worker, decides what it does. Meanwhile this process holds a
    SIGINT back (blocked) and takes it after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = hasattr(signal, "pthread_sigmask")
    if mask:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
        if mask:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _halt(procs: list[Any], pipes: list[Any]) -> None:
    """Stop the workers of a run cut short: SIGTERM, then SIGKILL for those still there
    after :data:`HALT_TIMEOUT` seconds."""
    for proc in procs:
        with contextlib.suppress(OSError, ValueError):
            proc.terminate()
    deadline = time.monotonic() + HALT_TIMEOUT
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
    for pipe in pipes:
        pipe.close()


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


def work(
    url: str, worker: int, lease: float, results: Any, parent: int, batch: bool = True
) -> None:
    """A worker process: relay until the run is over or the coordinator is gone, or
    until SIGTERM (the coordinator's, when the run is cut short: what the worker claimed
    goes to the resumed run as the leases run out). SIGINT is the coordinator's to
    handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _Stop.ask)
    report = _relay(url, worker, lease, parent, batch)
    if _Stop.asked:
        return
    with results, contextlib.suppress(OSError):  # a coordinator killed hears nothing
        results.send(report)


def _relay(
    url: str, worker: int, lease: float, parent: int, batch: bool
) -> tuple[WorkerReport, dict[str, int]]:
    try:
        with open_store(url) as store:
            relay = (BatchRelay if batch else Relay)(store, lease=lease, stopped=_Stop.seen)
            start = perf_counter()
            while not _Stop.asked:
                did = relay.round()
                if relay.phase != "running":
                    break
                if not did:
                    if os.getppid() != parent:
                        break
                    store.wait_for_work(IDLE_WAIT)
            elapsed = perf_counter() - start
            return relay.report(worker, elapsed), relay.counts()
    except BaseException:  # noqa: BLE001 - the coordinator reports it
        return _failed(worker, os.getpid(), traceback.format_exc(limit=5))
