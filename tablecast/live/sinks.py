"""Where a watch's events go: an SSE response, or a queue a WebSocket or gRPC writer drains.

The hub adds events to a sink and flushes each sink it touched once per
batch, so a watcher costs one write per batch, not one per event.

Slow consumers are cut off, never waited for (docs/operations.md, "Watches"):
a sink whose client is too far behind is closed with its reason, and the
client resumes from the last event it did get (``Last-Event-ID``), on any node,
with no gap. How "too far behind" is seen depends on the transport:

- WebSocket and gRPC writes wait for the connection, so the events not yet
  written pile up in the sink's queue: too many bytes there, or an oldest event
  queued too long, closes it.
- An SSE response on the loop engine (``--http-engine loop``) says how many
  bytes its connection holds that the client's TCP has not taken yet: too many,
  or none taken for too long while some wait, closes it. Nothing else is needed
  for it, so this works where the kernel's sock_diag does not.
- granian's streamed HTTP response takes every write at once (an unbounded
  channel) and gives no signal, so an SSE sink counts the bytes it handed over
  and the hub compares them with what the client's TCP stack acknowledged
  (:mod:`tablecast.live.tcpdiag`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

#: a queued sink holding more than this is behind: closed
MAX_QUEUED_BYTES = 8 * 1024 * 1024
#: ... or one whose oldest unsent event has waited this long (seconds)
MAX_BEHIND_S = 10.0

#: an SSE client this far behind (bytes handed over that its TCP has not taken) is cut off
MAX_UNACKED_BYTES = 8 * 1024 * 1024
#: ... or one that has taken nothing new for this long while data waits for it
MAX_STALLED_S = 10.0

SLOW = "slow_consumer"


@dataclass
class Progress:
    """What is known of one connection's progress: bytes handed over, and bytes its client
    has taken (acknowledged by its TCP, or taken from the node's buffer by the kernel)."""

    handed: int
    acked: int
    #: bytes handed over that the client has not taken (framing makes it a floor)
    backlog: int = 0
    #: when the client last took something while data waited for it
    stalled_since: float | None = None

    def judge(self, handed: int, acked: int, now: float) -> bool:
        """Take in a new look; True when the client is too far behind."""
        progress = acked - self.acked
        self.backlog = max(0, self.backlog + (handed - self.handed) - progress)
        self.handed, self.acked = handed, acked
        if self.backlog == 0 or progress > 0:
            self.stalled_since = None if self.backlog == 0 else now
        elif self.stalled_since is None:
            self.stalled_since = now
        stalled = self.stalled_since is not None and now - self.stalled_since > MAX_STALLED_S
        return self.backlog > MAX_UNACKED_BYTES or stalled


class Sink:
    """What the hub writes to. `done` completes when the stream must end (its reason in
    :attr:`reason`); the transport's handler waits on it."""

    __slots__ = ("_touched", "done", "events", "last_write", "pending", "reason")

    def __init__(self, touched: Callable[[Sink], None]) -> None:
        self.pending: list[Any] = []
        self._touched = touched
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.reason: str | None = None
        self.events = 0
        #: when the hub last flushed events to it (monotonic): a busy stream needs no keep-alive
        self.last_write = 0.0

    @property
    def closed(self) -> bool:
        return self.done.done()

    def add(self, event: Any) -> None:
        if not self.pending:
            self._touched(self)
        self.pending.append(event)

    def flush(self) -> None:
        raise NotImplementedError

    def close(self, reason: str | None = None) -> None:
        if not self.done.done():
            self.reason = reason
            self.pending.clear()
            self.done.set_result(None)

    def behind(self, now: float) -> bool:
        """Whether the client is too far behind (queued sinks; SSE is judged by the hub)."""
        return False


class StreamSink(Sink):
    """A streamed HTTP response (SSE): each flush is one write, handed to the engine at once."""

    __slots__ = ("_buffered", "handed", "measured", "peer", "progress", "transport")

    def __init__(
        self, transport: Any, touched: Callable[[Sink], None], peer: tuple[str, int] | None
    ) -> None:
        super().__init__(touched)
        self.transport = transport
        #: the client's address and port: its TCP connection's progress is looked up by it
        self.peer = peer
        #: bytes handed over, counted as HTTP/1.1 chunks go on the wire
        self.handed = 0
        #: the bytes the connection holds that the kernel has not taken (None: the engine
        #: cannot say, granian's; the hub then asks the kernel's TCP counters)
        self._buffered: Callable[[], int] | None = getattr(transport, "buffered", None)
        #: the connection says itself how far behind its client is
        self.measured = self._buffered is not None
        self.progress = Progress(0, 0)

    def behind(self, now: float) -> bool:
        buffered = self._buffered
        if buffered is None or self.closed:
            return False
        return self.progress.judge(self.handed, self.handed - buffered(), now)

    def flush(self) -> None:
        pending = self.pending
        if not pending or self.closed:
            pending.clear()
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        self.events += len(pending)
        pending.clear()
        # chunked framing: hex size, CRLF, data, CRLF
        self.handed += len(data) + len(b"%x" % len(data)) + 4
        # the engine queues the write and answers at once: nothing to await
        self.transport.send_bytes(data)
        buffered = self._buffered
        if buffered is not None and buffered() > MAX_UNACKED_BYTES:
            # the client reads slower than its watch writes: cut off now, not at the next look
            self.close(SLOW)

    def close(self, reason: str | None = None) -> None:
        super().close(reason)
        # granian ends the response when the transport is freed: whatever still holds this
        # sink must not hold the response open
        self.transport = None
        self._buffered = None


class QueueSink(Sink):
    """Events for a writer that awaits its connection (WebSocket, gRPC)."""

    __slots__ = ("_wake", "oldest", "queue", "queued_bytes", "size")

    def __init__(self, touched: Callable[[Sink], None], size: Callable[[Any], int] = len) -> None:
        super().__init__(touched)
        self.queue: deque[Any] = deque()
        self.queued_bytes = 0
        self.oldest = 0.0
        self.size = size
        self._wake = asyncio.Event()

    def flush(self) -> None:
        pending = self.pending
        if not pending or self.closed:
            pending.clear()
            return
        if not self.queue:
            self.oldest = time.monotonic()
        size = self.size
        self.queued_bytes += sum(size(e) for e in pending)
        self.queue.extend(pending)
        pending.clear()
        if self.queued_bytes > MAX_QUEUED_BYTES:
            self.close(SLOW)
            return
        self._wake.set()

    def behind(self, now: float) -> bool:
        return bool(self.queue) and now - self.oldest > MAX_BEHIND_S

    async def drain(self) -> AsyncIterator[Any]:
        """Every event as it is queued, until the sink is closed (the writer's loop)."""
        while True:
            events = await self.take()
            if not events:
                return
            for event in events:
                yield event

    async def take(self) -> list[Any]:
        """The events queued so far, waiting for some; empty once the sink is closed."""
        while not self.queue:
            if self.closed:
                return []
            self._wake.clear()
            await self._wake.wait()  # set by a flush, or by close
        items = list(self.queue)
        self.queue.clear()
        self.queued_bytes = 0
        return items

    def close(self, reason: str | None = None) -> None:
        super().close(reason)
        self._wake.set()
