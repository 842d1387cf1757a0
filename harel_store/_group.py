"""Group commit for the async durable stores: the writes many tasks issue at once share
transactions.

While one write is in flight, the items that arrive wait; when it ends, they all go
together in the next write, so the transactions (and fsyncs) a store pays grow with the
time the database takes, not with the number of callers. A lone caller starts its write at
once and waits for nobody.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_Call = tuple[Any, "asyncio.Future[Any]"]


class Group(Generic[T]):
    """Items of many callers, written together by ``write``.

    ``write(items)`` writes the items in one transaction and returns one outcome per item,
    in order; each caller of :meth:`run` gets its item's outcome, or the exception
    ``write`` raised. ``key(item)``, when given, keeps two items of one key out of one
    write (the later waits for the next one, in its order). At most ``limit`` items go in
    one write.

    Cancellation: a caller cancelled while its item waits takes it out (nothing written);
    one cancelled after its write started raises ``CancelledError`` while that write
    lands whole, the others getting their outcomes as usual. The write runs in a task of
    its own, so no caller's cancellation interrupts it.
    """

    def __init__(
        self,
        write: Callable[[list[T]], Awaitable[list[Any]]],
        *,
        key: Callable[[T], Hashable] | None = None,
        limit: int = 500,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._write = write
        self._key = key
        self._limit = limit
        self._waiting: deque[_Call] = deque()
        self._flight: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        """Whether a write is in flight or items wait for one."""
        return self._flight is not None

    async def run(self, item: T) -> Any:
        """Queue ``item`` and return its outcome once the write that took it is done."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        call = (item, done)
        self._waiting.append(call)
        if self._flight is None:
            self._flight = loop.create_task(self._fly())
        try:
            return await done
        except asyncio.CancelledError:
            try:
                self._waiting.remove(call)
            except ValueError:
                pass  # already taken: its write lands whole
            raise

    async def wait(self) -> None:
        """Until no write is in flight and none waits (for ``close``)."""
        while self._flight is not None:
            await asyncio.shield(self._flight)

    def _take(self) -> list[_Call]:
        waiting = self._waiting
        calls: list[_Call] = []
        if self._key is None:
            while waiting and len(calls) < self._limit:
                calls.append(waiting.popleft())
            return calls
        keys: set[Hashable] = set()
        later: list[_Call] = []
        while waiting and len(calls) < self._limit:
            call = waiting.popleft()
            k = self._key(call[0])
            if k in keys:
                later.append(call)
            else:
                keys.add(k)
                calls.append(call)
        waiting.extendleft(reversed(later))
        return calls

    async def _fly(self) -> None:
        try:
            while self._waiting:
                calls = self._take()
                try:
                    outcomes = await self._write([item for item, _ in calls])
                    if len(outcomes) != len(calls):
                        raise RuntimeError(
                            f"a group write returned {len(outcomes)} outcomes "
                            f"for {len(calls)} items"
                        )
                except BaseException as exc:
                    if isinstance(exc, Exception):
                        for _, done in calls:
                            if not done.done():
                                done.set_exception(exc)
                        continue
                    # The loop is going away (the flight itself was cancelled): nobody's
                    # outcome will be known, so every caller still waiting is cancelled.
                    calls.extend(self._waiting)
                    self._waiting.clear()
                    for _, done in calls:
                        done.cancel()
                    raise
                for (_, done), outcome in zip(calls, outcomes):
                    if not done.done():
                        done.set_result(outcome)
        finally:
            self._flight = None
