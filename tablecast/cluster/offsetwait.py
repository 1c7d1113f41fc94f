"""Waiting for a replica's applied offset without polling: the applying thread wakes the waiters.

A ``min_offset`` read waits on the event loop until the ingest thread has
applied an offset. The ingest thread calls :meth:`AppliedWaiters.advanced`
after each batch it applies to the replica — one truthiness test when nobody
waits, which is nearly always — and wakes the waiters whose offset is now
applied through ``call_soon_threadsafe``. A read so answers within one loop
iteration of the apply, instead of up to a poll interval later, and a node
with many waiting reads spends nothing on them until their offset arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

_Waiter = tuple[int, asyncio.Future[None], asyncio.AbstractEventLoop]


class AppliedWaiters:
    __slots__ = ("_lock", "_waiting")

    def __init__(self) -> None:
        self._waiting: list[_Waiter] = []
        self._lock = threading.Lock()

    def wait(self, offset: int) -> asyncio.Future[None]:
        """A future done once `offset` is applied (or the replica is released).

        The caller checks the applied offset again after this returns: an apply
        that ran between its first check and this registration woke nobody.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiting.append((offset, future, loop))
        return future

    def forget(self, future: asyncio.Future[None]) -> None:
        """Drop a waiter that stopped waiting (timed out) before its offset came."""
        with self._lock:
            self._waiting = [w for w in self._waiting if w[1] is not future]

    def advanced(self, applied: int) -> None:
        """Called by the applying thread: wake every waiter whose offset is now applied."""
        if not self._waiting:
            return
        with self._lock:
            ready = [w for w in self._waiting if w[0] <= applied]
            if not ready:
                return
            self._waiting = [w for w in self._waiting if w[0] > applied]
        for _, future, loop in ready:
            _wake_from(loop, future)

    def wake_all(self) -> None:
        """The replica was released: every waiter looks again (and re-routes its read)."""
        with self._lock:
            ready, self._waiting = self._waiting, []
        for _, future, loop in ready:
            _wake_from(loop, future)

    def __len__(self) -> int:
        return len(self._waiting)


def wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _wake_from(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    # a closed loop: the node is stopping, and nobody waits any more
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(wake, future)
