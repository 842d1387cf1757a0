"""The outbox and spawn FIFOs (API.md point 2) through every state they go through: acks at
either end, in the middle, of seqs never given or already acked, entries committed between
acks, and memory that follows what is pending rather than what was ever committed."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from harel_store import Execution

Fifo = tuple[Callable[[Any, Any, int], None], str, str]
FIFOS: dict[str, Fifo] = {
    "outbox": (
        lambda store, exe, n: store.commit(exe, [(None, None)] * n),
        "pending_outbox",
        "ack_outbox",
    ),
    "spawns": (
        lambda store, exe, n: store.commit(exe, [], spawns=[("child", "r", {})] * n),
        "pending_spawns",
        "ack_spawn",
    ),
}


class Queue:
    """One FIFO of a store: ``add(n)`` commits n entries, ``ack(*seqs)`` acks in that order,
    ``seqs()`` is what is pending, checked against ``stats()``."""

    def __init__(self, store: Any, fifo: str) -> None:
        self.store, self.fifo = store, fifo
        self.fill, self.pending, ack = FIFOS[fifo]
        self.ack_one = getattr(store, ack)
        self.exe = Execution(id="e")

    def add(self, n: int) -> None:
        self.fill(self.store, self.exe, n)

    def ack(self, *seqs: int) -> None:
        for seq in seqs:
            self.ack_one(seq)

    def seqs(self) -> list[int]:
        seqs = [e.seq for e in getattr(self.store, self.pending)()]
        assert self.store.stats()[self.fifo] == len(seqs)
        return seqs


@pytest.fixture(params=list(FIFOS))
def queue(request: pytest.FixtureRequest, impl: Any) -> Queue:
    return Queue(impl.DictStore(), request.param)


def test_acks_at_either_end(queue: Queue) -> None:
    queue.add(5)
    queue.ack(1)
    assert queue.seqs() == [2, 3, 4, 5]
    queue.ack(5)
    assert queue.seqs() == [2, 3, 4]
    queue.add(1)
    assert queue.seqs() == [2, 3, 4, 6]
    queue.ack(5, 1, 7, 0)  # acked already, or never given: between, before and after the ends
    assert queue.seqs() == [2, 3, 4, 6]
    queue.ack(6, 2, 4, 3)
    assert queue.seqs() == []
    queue.add(2)
    assert queue.seqs() == [7, 8]


def test_acks_in_the_middle_then_the_rest(queue: Queue) -> None:
    queue.add(6)
    queue.ack(3, 3)
    assert queue.seqs() == [1, 2, 4, 5, 6]
    queue.add(1)
    queue.ack(1, 2)
    assert queue.seqs() == [4, 5, 6, 7]
    queue.ack(7, 5, 5)
    assert queue.seqs() == [4, 6]
    queue.ack(4, 6)
    assert queue.seqs() == []
    queue.add(1)
    queue.ack(5, 9)
    assert queue.seqs() == [8]


def test_unknown_seqs_change_nothing_whatever_the_state(queue: Queue) -> None:
    unknown = (0, -1, 10**30, -(10**30), 2**63, 2**64 + 1)
    queue.ack(*unknown)
    queue.add(4)
    queue.ack(*unknown)
    assert queue.seqs() == [1, 2, 3, 4]
    queue.ack(2)
    queue.ack(*unknown, 2)
    assert queue.seqs() == [1, 3, 4]


@pytest.mark.parametrize("n", [1_000, 5_000])
def test_every_order_of_acks_drains_exactly_once(queue: Queue, n: int) -> None:
    """Head, tail and middle acks interleaved with new entries, against a plain list."""
    expected: list[int] = []
    given = 0
    for round_ in range(4):
        queue.add(n)
        expected += range(given + 1, given + n + 1)
        given += n
        picks = expected[::3] + expected[-1:-20:-1] + expected[:10] + expected[1::7]
        for seq in picks:
            queue.ack(seq)
            if seq in expected:
                expected.remove(seq)
        assert queue.seqs() == expected, round_
    queue.ack(*reversed(expected))
    assert queue.seqs() == []


def test_a_head_that_is_never_acked_does_not_keep_the_acked_ones(queue: Queue) -> None:
    """A poison entry at the head: everything after it is acked, 20,000 times over. The
    store keeps what is pending, not what was committed since the head was."""
    queue.add(1)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for start in range(2, 100_002, 20_000):
            queue.add(20_000)
            queue.ack(*range(start, start + 20_000))
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert queue.seqs() == [1]
    assert kept < 200_000, f"{kept} bytes kept for 1 pending entry after 100,000 acks"
