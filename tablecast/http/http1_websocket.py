"""WebSocket on the loop engine (``serve --http-engine loop``): the watch route's upgrade.

The handshake's checks and the frames are the websockets library's (its
sans-I/O ``ServerProtocol``); this module moves bytes between it and the
connection and gives the app the part of RSGI's WebSocket protocol it uses:
``close(status)`` to refuse before accepting, ``await accept()``, then the
transport's ``send_str``/``receive``, and ``close(code)`` to end it.

A watch's client has nothing to say but pings and a close, so what it may
send is held small: a message over :data:`MAX_MESSAGE` closes the WebSocket
with 1009, messages the app has not read beyond :data:`MAX_UNREAD` with 1008,
and a text message that is not UTF-8 with 1007.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol

from websockets.datastructures import Headers
from websockets.frames import Opcode
from websockets.http11 import Request
from websockets.protocol import OPEN
from websockets.server import ServerProtocol

from tablecast.query.errors import STATUS, ApiError


class _Connection(Protocol):
    """What this module uses of the loop engine's connection (http/http1.py imports this
    module, so it is named here rather than imported)."""

    server: Any
    writable: asyncio.Event

    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...
    def refuse(self, error: ApiError) -> None: ...
    async def drained(self) -> None: ...


#: how long a close we sent waits for the client's close before the connection is dropped
CLOSE_WAIT_S = 2.0
#: the close code of a stopping server (RFC 6455)
GOING_AWAY = 1001
#: a client that reads nothing this long while messages wait is cut off (as an SSE client is,
#: tablecast.live.sinks): else a stalled reader would hold its connection for ever
WRITE_WAIT_S = 10.0
#: a message from the client larger than this closes the WebSocket (1009): a watch reads none
MAX_MESSAGE = 16 * 1024
#: bytes of the client's messages held for the app before it reads them (it reads none while
#: a watch is prepared); more close the WebSocket (1008)
MAX_UNREAD = 64 * 1024
#: close codes (RFC 6455): a text message not UTF-8; a policy violated
INVALID_DATA = 1007
POLICY_VIOLATION = 1008
#: the API's error code for a refusal's status (404: the plain not_found)
_CODES = {status: code for code, status in STATUS.items()}


class Message:
    """What ``receive`` returns, as RSGI's: kind 0 closed, 1 bytes, 2 text."""

    __slots__ = ("data", "kind", "size")

    def __init__(self, kind: int, data: bytes | str | None = None, size: int = 0) -> None:
        self.kind, self.data = kind, data
        #: its bytes on the wire (held unread, they count against MAX_UNREAD)
        self.size = size


CLOSED = Message(0)


class WebSocket:
    """One upgraded connection: the app's RSGI protocol object and, once accepted, its
    transport."""

    def __init__(self, conn: _Connection, target: str, headers: dict[str, str]) -> None:
        self._conn = conn
        #: the answer accepting it, or (any status but 101) why it is malformed
        self._handshake = ServerProtocol().accept(Request(target, Headers(headers)))
        self._protocol: ServerProtocol | None = None  # once accepted
        self._early: list[bytes] = []  # frames that came with the handshake, before accept
        self._early_bytes = 0
        self._messages: deque[Message] = deque()
        self._unread = 0  # bytes of the messages held for the app
        self._arrived = asyncio.Event()
        self._parts: list[bytes] = []  # a fragmented message's frames so far
        self._text = False
        self.answered = False
        self.gone = False

    def malformed(self) -> ApiError | None:
        """Why this is no WebSocket handshake (the app is not called), or None."""
        if self._handshake.status_code == 101:
            return None
        why = self._handshake.body.decode(errors="replace").strip()
        return ApiError("bad_request", why or "not a WebSocket handshake")

    # -- RSGI, before the upgrade ---------------------------------------------------
    async def accept(self) -> WebSocket:
        self.answered = True
        self._conn.write(self._handshake.serialize())
        self._protocol = ServerProtocol(state=OPEN, max_size=MAX_MESSAGE)
        for data in self._early:
            self._receive(data)
        self._early.clear()
        return self

    def close(self, code: int) -> None:
        """Before accepting: refuse with HTTP status `code`; after: close with WebSocket `code`."""
        if self._protocol is None:
            if not self.answered:
                self.answered = True
                error = ApiError(_CODES.get(code, "bad_request"), "the WebSocket is refused")
                self._conn.refuse(error)
            return
        if self._protocol.state is OPEN:
            self._protocol.send_close(code)
            self._flush()
        # the client answers a close with its own (then the library ends the stream); a
        # client that does not is closed on
        self._conn.server.loop.call_later(CLOSE_WAIT_S, self._conn.close)

    # -- RSGI, the transport --------------------------------------------------------
    async def send_str(self, data: str) -> None:
        if self.gone or self._protocol is None or self._protocol.state is not OPEN:
            raise ConnectionError("the WebSocket is closed")
        self._protocol.send_text(data.encode())
        self._flush()
        if not self._conn.writable.is_set():
            try:
                await asyncio.wait_for(self._conn.drained(), WRITE_WAIT_S)
            except TimeoutError:
                self._conn.abort()  # what is buffered would never be read: not flushed first
                raise ConnectionError("the client read nothing while messages waited") from None

    async def receive(self) -> Message:
        while not self._messages:
            if self.gone:
                return CLOSED
            self._arrived.clear()
            await self._arrived.wait()
        message = self._messages.popleft()
        self._unread -= message.size
        return message

    # -- from the connection --------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._protocol is None:
            # the app checks the caller before accepting; a client that does not wait for
            # the answer may send what may be held unread, not fill our memory meanwhile
            self._early_bytes += len(data)
            if self._early_bytes > MAX_UNREAD:
                self._early.clear()
                self._conn.abort()
                return
            self._early.append(data)
        else:
            self._receive(data)

    def connection_lost(self) -> None:
        self.gone = True
        self._arrived.set()

    def _receive(self, data: bytes) -> None:
        protocol = self._protocol
        assert protocol is not None
        protocol.receive_data(data)
        for frame in protocol.events_received():
            if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                self._text = frame.opcode is Opcode.TEXT
                self._parts = [frame.data]
            elif frame.opcode is Opcode.CONT:
                self._parts.append(frame.data)
            elif frame.opcode is Opcode.CLOSE:
                self._messages.append(CLOSED)
                continue
            else:  # ping and pong: the library answers pings itself
                continue
            if frame.fin:
                data = b"".join(self._parts)
                self._parts = []
                message = self._message(protocol, data)
                if message is None:
                    break
                self._messages.append(message)
        self._flush()
        if self._messages:
            self._arrived.set()

    def _message(self, protocol: ServerProtocol, data: bytes) -> Message | None:
        """The client's message as the app reads it; None when it closed the WebSocket (the
        app reads a close next)."""
        if self._text:
            try:
                message = Message(2, data.decode(), len(data))
            except UnicodeDecodeError:
                return self._fail(protocol, INVALID_DATA, "a text message must be UTF-8")
        else:
            message = Message(1, data, len(data))
        self._unread += len(data)
        if self._unread > MAX_UNREAD:
            return self._fail(protocol, POLICY_VIOLATION, "a watch reads no messages")
        return message

    def _fail(self, protocol: ServerProtocol, code: int, reason: str) -> None:
        """Close with `code` and read nothing more of the client; the app sees it closed."""
        protocol.fail(code, reason)
        self._messages.clear()
        self._unread = 0
        self._messages.append(CLOSED)
        return None

    def _flush(self) -> None:
        assert self._protocol is not None
        for data in self._protocol.data_to_send():
            if data:
                self._conn.write(data)
            else:  # the library's end of stream: the close handshake is over, or failed
                self._conn.close()
