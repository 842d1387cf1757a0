"""harel_store._group.Group: the group commit every async durable store shares."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harel_store._group import Group


class Recorder:
    """A write that records the items of each call and takes ``pause`` seconds."""

    def __init__(self, pause: float = 0.01, fail: set[Any] | None = None) -> None:
        self.calls: list[list[Any]] = []
        self.pause = pause
        self.fail = fail or set()
        self.landed: list[Any] = []

    async def __call__(self, items: list[Any]) -> list[Any]:
        self.calls.append(list(items))
        await asyncio.sleep(self.pause)
        if self.fail & set(items):
            raise OSError("disk on fire")
        self.landed.extend(items)
        return [f"done {item}" for item in items]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_lone_caller_writes_at_once_and_alone() -> None:
    write = Recorder()

    async def main() -> Any:
        return await Group(write).run("a")

    assert run(main()) == "done a"
    assert write.calls == [["a"]]


def test_callers_that_arrive_during_a_write_share_the_next() -> None:
    write = Recorder()

    async def main() -> list[Any]:
        group: Group[str] = Group(write)
        first = asyncio.ensure_future(group.run("i0"))
        await asyncio.sleep(0.001)  # its write is in flight
        return await asyncio.gather(first, *(group.run(f"i{n}") for n in range(1, 40)))

    outcomes = run(main())
    assert outcomes == [f"done i{n}" for n in range(40)]
    assert write.calls[0] == ["i0"]
    assert len(write.calls) == 2  # the first alone, the other 39 together
    assert write.calls[1] == [f"i{n}" for n in range(1, 40)]


def test_limit_and_key_split_writes_in_order() -> None:
    write = Recorder()

    async def main() -> None:
        group: Group[tuple[str, int]] = Group(write, key=lambda item: item[0], limit=3)
        first = asyncio.ensure_future(group.run(("x", 0)))
        await asyncio.sleep(0)
        await asyncio.gather(first, *(group.run(item) for item in
                                      [("a", 1), ("a", 2), ("b", 3), ("c", 4), ("d", 5)]))  # fmt: skip

    run(main())
    assert write.calls == [[("x", 0)], [("a", 1), ("b", 3), ("c", 4)], [("a", 2), ("d", 5)]]


def test_a_failed_write_fails_its_callers_only() -> None:
    write = Recorder(fail={"bad"})

    async def main() -> list[Any]:
        group: Group[str] = Group(write, limit=2)
        first = asyncio.ensure_future(group.run("first"))
        await asyncio.sleep(0)
        tasks = [group.run(item) for item in ("bad", "x", "y")]
        return await asyncio.gather(first, *tasks, return_exceptions=True)

    first, bad, x, y = run(main())
    assert first == "done first"
    assert isinstance(bad, OSError) and isinstance(x, OSError)  # one write: bad and x
    assert y == "done y"


def test_cancelled_while_waiting_writes_nothing_and_after_lands_whole() -> None:
    write = Recorder(pause=0.05)

    async def main() -> tuple[Any, ...]:
        group: Group[str] = Group(write)
        flying = asyncio.ensure_future(group.run("flying"))
        await asyncio.sleep(0.01)  # "flying" is being written
        waiting = asyncio.ensure_future(group.run("waiting"))
        other = asyncio.ensure_future(group.run("other"))
        await asyncio.sleep(0)
        waiting.cancel()
        flying.cancel()
        results = await asyncio.gather(flying, waiting, other, return_exceptions=True)
        await group.wait()
        return tuple(results)

    flying, waiting, other = run(main())
    assert isinstance(flying, asyncio.CancelledError)
    assert isinstance(waiting, asyncio.CancelledError)
    assert other == "done other"
    assert write.landed == ["flying", "other"]  # the flying write landed whole; no "waiting"


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit"):
        Group(Recorder(), limit=0)
