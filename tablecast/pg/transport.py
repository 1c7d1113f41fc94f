"""A connection after its startup: messages taken from the bytes as they arrive, each
handled at once unless it has to wait, the answers to a whole read of them written in
one go.

The session hands back, for each message, nothing (handled), :data:`STOP` (the client
said goodbye) or what to wait for; while it waits, later messages stay in the buffer,
in order. The buffer is bounded: past :data:`MAX_BUFFERED` bytes the connection stops
reading until it is worked off, and while the client does not read its answers no new
message is handled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, Protocol

from tablecast.pg import wire

log = logging.getLogger(__name__)

#: what the session says when the client sent Terminate
STOP = object()
#: bytes held before the connection stops reading (a whole message fits)
MAX_BUFFERED = wire.MAX_MESSAGE + 64 * 1024


class Handler(Protocol):
    out: list[bytes]
    size: int
    running: asyncio.Task[Any] | None

    def handle(self, kind: bytes, payload: wire.Payload) -> object: ...

    def violated(self, error: wire.ProtocolViolation) -> None: ...

    def kept_reply(self, request: bytes) -> bytes | None: ...

    def chunk_begin(self) -> None: ...

    def chunk_end(self, request: bytes | None) -> None: ...


class Messages(asyncio.Protocol):
    def __init__(self, session: Handler, transport: asyncio.Transport) -> None:
        self.session = session
        self.transport = transport
        self.buf = bytearray()
        self.busy = False
        self.reading = True
        self.loop = asyncio.get_running_loop()
        #: set when the connection is over
        self.finished: asyncio.Future[None] = self.loop.create_future()
        #: while the client does not read: what resumes writing
        self._writable: asyncio.Future[None] | None = None

    def start(self, pending: bytes) -> None:
        """Take over the connection, with the bytes read before it (already buffered)."""
        self.transport.set_protocol(self)
        if pending:
            self.data_received(pending)

    # -- input ------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        whole = not self.buf and not self.busy and self._writable is None
        if whole:  # a packet of whole messages, perhaps one answered before
            reply = self.session.kept_reply(data)
            if reply is not None:
                self.transport.write(reply)
                return
            self.session.chunk_begin()
        self.buf += data
        if len(self.buf) > MAX_BUFFERED and self.reading:
            self.transport.pause_reading()
            self.reading = False
        if not self.busy:
            self.process(data if whole else None)

    def process(self, packet: bytes | None = None) -> None:
        """Handle the buffered messages; `packet`: the bytes they all came in, when they
        did in one (its reply may be kept)."""
        buf = self.buf
        session = self.session
        try:
            while not self.busy and self._writable is None and len(buf) >= 5:
                length = int.from_bytes(buf[1:5], "big", signed=True)
                if not 4 <= length <= wire.MAX_MESSAGE:
                    raise wire.ProtocolViolation(f"a message of {length} bytes")
                if len(buf) < 1 + length:
                    break
                kind = bytes(buf[:1])
                payload = wire.Payload(bytes(buf[5 : 1 + length]))
                del buf[: 1 + length]
                pending = session.handle(kind, payload)
                if pending is STOP:
                    self.flush()
                    self.transport.close()
                    return
                if pending is not None:
                    self.busy = True
                    task = self.loop.create_task(self._resume(pending))  # type: ignore[arg-type]
                    session.running = task
        except wire.ProtocolViolation as e:
            session.violated(e)
            self.flush()
            self.transport.close()
            return
        if packet is not None:
            session.chunk_end(packet if not buf and not self.busy else None)
        self.flush()
        if not self.reading and len(buf) < MAX_BUFFERED // 2 and not self.busy:
            self.transport.resume_reading()
            self.reading = True

    async def _resume(self, pending: Awaitable[Any]) -> None:
        try:
            await pending
        except wire.ProtocolViolation as e:
            self.session.violated(e)
            self.flush()
            self.transport.close()
            return
        except asyncio.CancelledError:
            if self.finished.done():
                return  # the connection is gone
            raise
        except Exception:
            log.exception("a PostgreSQL connection failed")
            self.transport.close()
            return
        finally:
            self.session.running = None
        self.busy = False
        self.process()

    # -- output -----------------------------------------------------------------------------
    def flush(self) -> None:
        session = self.session
        if session.out:
            self.transport.write(b"".join(session.out))
            session.out.clear()
            session.size = 0

    async def drain(self) -> None:
        """Write what is gathered; wait while the client does not read."""
        self.flush()
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)
        if not self.busy:
            self.process()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_result(None)
        running = self.session.running
        if running is not None and not running.done():
            running.cancel()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
