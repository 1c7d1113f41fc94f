"""gRPC's HTTP/2 on the node's event loop: frames, streams and flow control, no threads.

A server of gRPC calls only (h2c with prior knowledge, or h2 over TLS by ALPN), as
the node's HTTP/1.1 engine is a server of its API only: each connection is an asyncio
protocol that parses frames as they arrive and answers a unary call in the same pass
when its handler answers at once (a local read), so such a call costs no task. Header
blocks are decoded by :mod:`tablecast.grpc.header_blocks`. What a peer can make us
hold is bounded: one frame of at most :data:`MAX_FRAME` bytes, one header block of
:data:`MAX_HEADER_BLOCK`, a message of :data:`MAX_MESSAGE`, request bytes of
:data:`CONNECTION_WINDOW` per connection (its window is given back only as calls take
them), :data:`MAX_STREAMS` streams and :data:`MAX_CONNECTIONS` connections; a connection
whose client does not read its answers is not read either.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import ssl
import struct
import time
import zlib
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, NamedTuple

from google.protobuf.message import Message
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tablecast.grpc.header_blocks import Decoder, HpackError

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 0xB
HEADER_TABLE_SIZE, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 1, 3, 4
MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 5, 6
FRAME = struct.Struct(">HBBBL")  # length (24 bits: 16 + 8), type, flags, stream id
SETTING = struct.Struct(">HL")
WINDOW_LIMIT = (1 << 31) - 1

#: the largest frame taken (HTTP/2's default, which we never raise)
MAX_FRAME = 16384
#: streams open at once on one connection
MAX_STREAMS = 128
#: the receive window of each stream, given back as it is read
WINDOW = 1 << 20
#: the connection's receive window, given back as calls take what they were sent: what a
#: connection can make the node hold
CONNECTION_WINDOW = (4 << 20) + (64 << 10)
#: the most a call may have waiting for a client's windows (answers to a per-message call)
MAX_PENDING = 1 << 20
#: a connection's preface must arrive within this long
PREFACE_TIMEOUT_S = 10.0
#: a connection closed for an error is dropped after this long if its client does not read
ABORT_AFTER_S = 5.0
#: the path calls of methods the server lacks are counted under
UNKNOWN_METHOD = "/unknown/unknown"
#: the longest grpc-message sent (longer ones are cut)
MAX_STATUS_MESSAGE = 1024
#: the largest request message (gRPC's default)
MAX_MESSAGE = 4 << 20
#: connections open at once; more are closed as they come
MAX_CONNECTIONS = 10_000
#: the largest header block (with its CONTINUATION frames)
MAX_HEADER_BLOCK = 64 << 10
#: header blocks kept with the call they name, per connection
KEPT_CALLS = 64


class Status(enum.IntEnum):
    """gRPC's status codes."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """A call's error answer: its status, message and trailing metadata."""

    def __init__(
        self, status: Status, message: str, metadata: Iterable[tuple[str, str]] = ()
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.metadata = status, message, tuple(metadata)


class Call(NamedTuple):
    """What a handler knows of its call besides the request message."""

    #: the request's metadata (header names lower case; pseudo-headers left out)
    metadata: dict[str, str]
    #: the client's address, "host:port"
    client: str
    #: seconds the client gives the call (grpc-timeout), None for no deadline
    timeout: float | None


class Kind(enum.Enum):
    #: one request, one response: handler(request, call) -> response or its awaitable
    UNARY = 1
    #: one request, many responses: handler(request, call) -> async iterator of them
    STREAM = 2
    #: many requests, a response to each as it comes: handler(request, call) -> response
    EACH = 3


class Method(NamedTuple):
    """One method of a service, as the server dispatches it."""

    kind: Kind
    decode: Callable[[bytes], Any]
    handler: Callable[[Any, Call], Any]


def _int(value: int, bits: int, first: int = 0) -> bytes:
    """An HPACK integer with a `bits`-bit prefix."""
    limit = (1 << bits) - 1
    if value < limit:
        return bytes((first | value,))
    return bytes((first | limit,)) + varint(value - limit)


def varint(value: int) -> bytes:
    """Seven bits a byte, lowest first, the high bit saying more follow: an HPACK integer's
    tail, and protobuf's varint."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: str, value: str) -> bytes:
    """A header field as a literal not indexed (our answers never use the client's table)."""
    n, v = name.encode(), value.encode()
    return b"\x00" + _int(len(n), 7) + n + _int(len(v), 7) + v


#: ":status: 200" (static entry 8) and content-type (static name 31) as a literal
RESPONSE_HEADERS = b"\x88" + _int(31, 4) + _int(16, 7) + b"application/grpc"
OK_TRAILERS = literal("grpc-status", "0")
_PRINTABLE = frozenset(range(0x20, 0x7F)) - {ord("%")}


#: a unary answer in one write: its HEADERS frame, then its DATA frame's header and the
#: message's prefix (the message follows), then the OK trailers' HEADERS frame
REPLY_HEAD = struct.Struct(f">HBBBL{len(RESPONSE_HEADERS)}sHBBBLBL")
OK_TAIL = struct.Struct(f">HBBBL{len(OK_TRAILERS)}s")
HEADERS_FRAME = (0, len(RESPONSE_HEADERS), HEADERS, END_HEADERS)
TRAILERS_FRAME = (0, len(OK_TRAILERS), HEADERS, END_HEADERS | END_STREAM)


def trailers(status: Status, message: str, metadata: Iterable[tuple[str, str]] = ()) -> bytes:
    """A call's trailers; its message percent-encoded as gRPC asks."""
    raw = message.encode("utf-8")[:MAX_STATUS_MESSAGE]
    encoded = "".join(chr(b) if b in _PRINTABLE else f"%{b:02X}" for b in raw)
    block = literal("grpc-status", str(int(status)))
    if encoded:
        block += literal("grpc-message", encoded)
    for name, value in metadata:
        block += literal(name, value)
    return block


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME.pack(n >> 8, n & 0xFF, kind, flags, stream) + payload


def message(body: bytes) -> bytes:
    """A gRPC length-prefixed message, not compressed (answers never are)."""
    return b"\x00" + len(body).to_bytes(4, "big") + body


#: the encodings a request's messages may be compressed with (its grpc-encoding), by the
#: window bits zlib reads them with; gRPC's "deflate" is the zlib format
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
ACCEPT_ENCODING = ("grpc-accept-encoding", "gzip,deflate,identity")


def decompressed(body: bytes, encoding: str | None) -> bytes:
    """A compressed request message's bytes, never more than :data:`MAX_MESSAGE` of them
    (a small message may inflate to gigabytes); a GrpcError where they cannot be had."""
    wbits = ENCODINGS.get((encoding or "").strip().lower())
    if wbits is None:
        if not encoding or encoding.strip().lower() == "identity":
            raise GrpcError(Status.INTERNAL, "a compressed message with no grpc-encoding")
        # gRPC's answer to an encoding the server lacks: UNIMPLEMENTED, naming what it takes
        raise GrpcError(
            Status.UNIMPLEMENTED, f"no message encoding {encoding[:64]!r}", (ACCEPT_ENCODING,)
        )
    inflate = zlib.decompressobj(wbits)
    try:
        out = inflate.decompress(body, MAX_MESSAGE + 1)
    except zlib.error:
        raise GrpcError(Status.INTERNAL, f"a {encoding} message that does not inflate") from None
    if len(out) > MAX_MESSAGE:
        raise GrpcError(Status.RESOURCE_EXHAUSTED, "a message over 4 MiB")
    if not inflate.eof:
        raise GrpcError(Status.INTERNAL, f"a {encoding} message cut short")
    return out


def timeout_of(text: str | None) -> float | None:
    """The seconds of a grpc-timeout header ("100m", "5S"): at most eight ASCII digits and a
    unit, as gRPC spells it; None when absent or unreadable."""
    if not text or not 2 <= len(text) <= 9:
        return None
    digits = text[:-1]
    if not (digits.isascii() and digits.isdigit()):
        return None
    unit = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}.get(text[-1])
    return None if unit is None else int(digits) * unit


def valid_field(name: str, value: str) -> bool:
    """Whether a request's header field may be taken as HTTP/2 says: a name of lower-case
    token characters (a pseudo-header's ':' first), a value without NUL, CR or LF; a
    request with another is malformed (and could be written on to a peer)."""
    return bool(_NAME(name)) and not _BAD_VALUE(value)


_NAME = re.compile(r":?[!#$%&'*+\-.^_`|~0-9a-z]+").fullmatch
_BAD_VALUE = re.compile(r"[\x00\r\n]").search


class _MalformedRequest(Exception):
    """A request HTTP/2 calls malformed: its stream is reset, the connection goes on."""


class _ConnectionError(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class Stream:
    """One call on a connection."""

    __slots__ = (
        "call",
        "data",
        "ended",
        "held",
        "id",
        "method",
        "path",
        "pending",
        "received",
        "replied",
        "send_window",
        "task",
        "trailers",
        "waiter",
    )

    def __init__(self, sid: int, path: str, method: Method, call: Call, send_window: int) -> None:
        self.id, self.path, self.method, self.call = sid, path, method, call
        self.data = bytearray()
        self.received = 0  # bytes of DATA since the stream's window was last given back
        self.held = 0  # bytes of DATA held here, not given back to the connection's window
        self.ended = False  # the client sent END_STREAM
        self.replied = False  # our response headers went out
        self.send_window = send_window
        self.pending = bytearray()  # DATA the windows hold back
        self.trailers: bytes | None = None  # to send once `pending` is out
        self.task: asyncio.Task[None] | None = None
        self.waiter: asyncio.Future[None] | None = None


class Connection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.methods = server.methods
        self.handled = server.handled
        self.transport: asyncio.Transport | None = None
        self.client = ""
        self.buf = bytearray()
        self.preface = False
        self.decoder = Decoder(list_size=MAX_HEADER_BLOCK)
        self.calls: dict[bytes, tuple[int, tuple[str, Method | None, Call]]] = {}
        self.block: bytearray | None = None  # a header block awaiting its CONTINUATION
        self.block_stream = 0
        self.block_flags = 0
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0
        self.send_window = 65535
        self.peer_window = 65535  # the client's initial stream window
        self.peer_frame = 16384
        self.unacked = 0  # DATA bytes taken since the connection's window was given back
        self.paused = False
        self.closing = False
        self.dead = False
        #: frames written while a read is parsed, sent together when it is
        self.out: list[bytes] | None = None
        #: a dynamic table size update owed at the start of our next header block (the
        #: client made its table smaller than HPACK's default)
        self.table_update = b""
        self._preface_timer: asyncio.TimerHandle | None = None

    # -- the connection ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        if len(self.server.connections) >= MAX_CONNECTIONS:
            log.warning("%d gRPC connections open: new ones are closed", MAX_CONNECTIONS)
            self.dead = True
            transport.abort()  # type: ignore[attr-defined]
            return
        self.server.connections.add(self)
        self._preface_timer = asyncio.get_running_loop().call_later(
            PREFACE_TIMEOUT_S, self._lost, "no HTTP/2 preface in time"
        )
        settings = b"".join(
            SETTING.pack(k, v)
            for k, v in (
                (MAX_CONCURRENT_STREAMS, MAX_STREAMS),
                (INITIAL_WINDOW_SIZE, WINDOW),
                (MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK),
            )
        )
        transport.write(  # type: ignore[attr-defined]
            frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, (CONNECTION_WINDOW - 65535).to_bytes(4, "big"))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = True
        if self._preface_timer is not None:
            self._preface_timer.cancel()
        self.server.connections.discard(self)
        for stream in self.streams.values():
            self._cancel(stream)
        self.streams.clear()

    def pause_writing(self) -> None:
        # a client that does not read its answers is not read from either, so what it
        # sends cannot pile up answers here
        self.paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.transport is not None and not self.dead:
            self.transport.resume_reading()
        for stream in list(self.streams.values()):
            self._wake(stream)

    def _write(self, data: bytes) -> None:
        if self.out is not None:
            self.out.append(data)
        elif self.transport is not None and not self.dead:
            self.transport.write(data)

    def _send_out(self) -> None:
        out, self.out = self.out, None
        if out and self.transport is not None and not self.dead:
            self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        if self.buf:  # a frame cut by the last read
            self.buf += data
            data = bytes(self.buf)
            self.buf.clear()
        if not self.preface:
            if len(data) < len(PREFACE):
                if not PREFACE.startswith(data):
                    self._lost("not HTTP/2 with prior knowledge")
                    return
                self.buf += data
                return
            if not data.startswith(PREFACE):
                self._lost("not HTTP/2 with prior knowledge")
                return
            data = data[len(PREFACE) :]
            self.preface = True
            if self._preface_timer is not None:
                self._preface_timer.cancel()
        # what the calls of one read answer (and the PING and WINDOW_UPDATE frames it asks
        # for) leaves in one write
        self.out = out = []
        pos, end = 0, len(data)
        try:
            while end - pos >= 9 and not self.dead:
                high, low, kind, flags, sid = FRAME.unpack_from(data, pos)
                length = high << 8 | low
                if length > MAX_FRAME:
                    raise _ConnectionError(FRAME_SIZE_ERROR, "a frame over the size allowed")
                stop = pos + 9 + length
                if stop > end:
                    break
                payload = data[pos + 9 : stop]
                pos = stop
                self._frame(kind, flags, sid & 0x7FFFFFFF, payload)
        except _ConnectionError as e:
            self.goaway(e.code, str(e))
        except Exception:  # a case this parser missed: this connection ends, the node goes on
            log.exception("gRPC connection from %s failed", self.client)
            self.goaway(INTERNAL_ERROR, "internal error")
        finally:
            if pos < end and not self.dead:
                self.buf += data[pos:]
            if self.out is out:
                self.out = None
                if out and self.transport is not None and not self.dead:
                    self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _lost(self, why: str) -> None:
        log.debug("gRPC connection from %s closed: %s", self.client, why)
        self.dead = True
        for stream in self.streams.values():
            self._cancel(stream)
        self.streams.clear()
        transport = self.transport
        if transport is not None:
            transport.close()
            # what is still unsent waits for a client that may never read it
            asyncio.get_running_loop().call_later(ABORT_AFTER_S, transport.abort)

    def goaway(self, code: int = NO_ERROR, why: str = "") -> None:
        """Say no further stream is taken; an error closes the connection now, NO_ERROR once
        its streams are done."""
        if self.dead or self.transport is None:
            return
        payload = self.last_stream.to_bytes(4, "big") + code.to_bytes(4, "big") + why.encode()
        self._write(frame(GOAWAY, 0, 0, payload))
        self._send_out()
        self.closing = True
        if code != NO_ERROR:
            self._lost(why)
        elif not self.streams:
            self.transport.close()

    # -- frames --------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self.block is not None and kind != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block was cut by another frame")
        if kind == HEADERS:
            if sid == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
            if flags & PADDED:
                payload = _unpadded(flags, payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            if flags & END_HEADERS:
                self._headers(sid, flags, payload)
            else:
                self.block, self.block_stream, self.block_flags = bytearray(payload), sid, flags
        elif kind == DATA:
            self._data(sid, flags, payload)
        elif kind == CONTINUATION:
            if self.block is None or sid != self.block_stream:
                raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            self.block += payload
            if len(self.block) > MAX_HEADER_BLOCK:
                raise _ConnectionError(ENHANCE_YOUR_CALM, "a header block over the size allowed")
            if flags & END_HEADERS:
                block, self.block = bytes(self.block), None
                self._headers(sid, self.block_flags, block)
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise _ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of a wrong size")
            self._window(sid, int.from_bytes(payload, "big") & 0x7FFFFFFF)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(sid, payload)
        elif kind == PING:
            if len(payload) != 8 or sid != 0:
                raise _ConnectionError(PROTOCOL_ERROR, "a malformed PING")
            if not flags & ACK and self.transport is not None:
                self._write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            stream = self.streams.get(sid)
            if stream is not None:
                if stream.trailers is None:
                    self.handled[(stream.path, int(Status.CANCELLED))] += 1
                self._drop(stream)
        elif kind == GOAWAY:
            self.goaway()
        elif kind == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and frame types this server does not know are ignored, as HTTP/2 asks

    def _settings(self, sid: int, payload: bytes) -> None:
        if sid != 0 or len(payload) % 6:
            raise _ConnectionError(PROTOCOL_ERROR, "a malformed SETTINGS")
        for at in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, at)
            if key == INITIAL_WINDOW_SIZE:
                if value > WINDOW_LIMIT:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "a window over 2^31-1")
                change, self.peer_window = value - self.peer_window, value
                for stream in self.streams.values():
                    stream.send_window += change
            elif key == HEADER_TABLE_SIZE:
                # our blocks never index; a smaller table is still announced, as HPACK asks
                self.table_update = _int(min(value, 4096), 5, 0x20) if value < 4096 else b""
            elif key == MAX_FRAME_SIZE:
                if not 16384 <= value <= 16777215:
                    raise _ConnectionError(PROTOCOL_ERROR, "a frame size out of range")
                self.peer_frame = value
        if self.transport is not None:
            self._write(frame(SETTINGS, ACK, 0))
        for stream in list(self.streams.values()):
            self._flush(stream)

    def _window(self, sid: int, increment: int) -> None:
        if increment == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
        if sid == 0:
            self.send_window += increment
            if self.send_window > WINDOW_LIMIT:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "a window over 2^31-1")
            for stream in list(self.streams.values()):
                if stream.pending or stream.trailers is not None:
                    self._flush(stream)
        else:
            stream = self.streams.get(sid)
            if stream is not None:
                stream.send_window += increment
                if stream.send_window > WINDOW_LIMIT:
                    self._fail(stream, GrpcError(Status.INTERNAL, "a window over 2^31-1"))
                    self._reset(sid, FLOW_CONTROL_ERROR)
                    self._drop(stream)
                    return
                self._flush(stream)

    def _data(self, sid: int, flags: int, payload: bytes) -> None:
        if sid == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        stream = self.streams.get(sid)
        if stream is None:  # ended here (its answer or reset may still be on the way): dropped
            if sid > self.last_stream:
                raise _ConnectionError(PROTOCOL_ERROR, "DATA on a stream never opened")
            self._consumed(len(payload))
            return
        if stream.ended:
            self._consumed(len(payload))
            self._reset(sid, STREAM_CLOSED)
            self._drop(stream)
            return
        stream.received += len(payload)
        # the whole request in one frame, as unary calls mostly come: no buffer
        if (
            flags == END_STREAM
            and not stream.data
            and stream.method.kind is not Kind.EACH
            and payload[:1] == b"\x00"
            and int.from_bytes(payload[1:5], "big") == len(payload) - 5
        ):
            stream.ended = True
            self.unacked += len(payload)  # taken now (_consumed, inline on the hot path)
            if self.unacked >= CONNECTION_WINDOW // 4:
                self._consumed(0)
            self._dispatch(stream, payload[5:])
            return
        stream.held += len(payload)
        stream.data += _unpadded(flags, payload)
        if len(stream.data) > MAX_MESSAGE + 5:
            stream.pending.clear()  # nothing more for it: its trailers go now
            self._fail(stream, GrpcError(Status.RESOURCE_EXHAUSTED, "a message over 4 MiB"))
            self._drop(stream)
            return
        if stream.method.kind is Kind.EACH:
            self._each(stream)
        if flags & END_STREAM:
            stream.ended = True
            self._dispatch(stream)
        elif stream.received >= WINDOW // 2 and self.transport is not None:
            self._write(frame(WINDOW_UPDATE, 0, sid, stream.received.to_bytes(4, "big")))
            stream.received = 0

    def _headers(self, sid: int, flags: int, block: bytes) -> None:
        stream = self.streams.get(sid)
        if stream is not None:  # the client's trailers: only their END_STREAM matters here
            self._decode(block)
            if flags & END_STREAM and not stream.ended:
                stream.ended = True
                self._dispatch(stream)
            return
        if sid <= self.last_stream or not sid & 1:
            raise _ConnectionError(PROTOCOL_ERROR, "a stream id out of order")
        self.last_stream = sid
        try:
            path, method, call = self._call_of(block)
        except _MalformedRequest:
            self._reset(sid, PROTOCOL_ERROR)
            return
        if self.closing or len(self.streams) >= MAX_STREAMS:
            self._reset(sid, REFUSED_STREAM)
            return
        if method is None:
            self._refuse(sid, flags, Status.UNIMPLEMENTED, f"no method {path}")
            return
        if not call.metadata.get("content-type", "").startswith("application/grpc"):
            self._refuse(sid, flags, Status.INTERNAL, "content-type is not application/grpc")
            return
        stream = Stream(sid, path, method, call, self.peer_window)
        self.streams[sid] = stream
        if flags & END_STREAM:
            stream.ended = True
            self._dispatch(stream)

    def _call_of(self, block: bytes) -> tuple[str, Method | None, Call]:
        """The path, method and call a request's header block names. A block that leaves
        the decoder's table as it was names the same call the next time: kept, its metadata
        shared by the calls it starts (handlers only read it)."""
        generation = self.decoder.generation
        known = self.calls.get(block)
        if known is not None and known[0] == generation:
            return known[1]
        path = ""
        metadata: dict[str, str] = {}
        for name, value in self._decode(block):
            if not valid_field(name, value):
                raise _MalformedRequest(f"a header field {name[:64]!r} HTTP/2 does not allow")
            if name[0] == ":":
                if name == ":path":
                    path = value
            else:
                metadata[name] = value
        call = Call(metadata, self.client, timeout_of(metadata.get("grpc-timeout")))
        named = (path, self.methods.get(path), call)
        if self.decoder.generation == generation:
            if len(self.calls) >= KEPT_CALLS:
                self.calls.clear()
            self.calls[block] = (generation, named)
        return named

    def _decode(self, block: bytes) -> list[tuple[str, str]]:
        try:
            return self.decoder.decode(block)
        except HpackError as e:
            raise _ConnectionError(COMPRESSION_ERROR, f"a header block: {e}") from None

    # -- calls ---------------------------------------------------------------------------

    def _messages(self, stream: Stream) -> list[bytes] | None:
        """The whole messages in a stream's data, taken from it, compressed ones inflated
        (None: one that could not be, the call answered with why)."""
        data, out, at = stream.data, [], 0
        while len(data) - at >= 5:
            size = int.from_bytes(data[at + 1 : at + 5], "big")
            if len(data) - at - 5 < size:
                break
            body = bytes(data[at + 5 : at + 5 + size])
            if data[at]:
                try:
                    body = decompressed(body, stream.call.metadata.get("grpc-encoding"))
                except GrpcError as e:
                    self._fail(stream, e)
                    return None
            out.append(body)
            at += 5 + size
        del data[:at]
        return out

    def _dispatch(self, stream: Stream, body: bytes | None = None) -> None:
        """The client is done sending: answer the call (`body`: its one request message,
        when it came whole in one frame)."""
        if stream.held:
            self._consumed(stream.held)
            stream.held = 0
        kind = stream.method.kind
        if kind is Kind.EACH:
            if stream.data:
                self._fail(stream, GrpcError(Status.INTERNAL, "a message cut short"))
            else:
                self._finish(stream, Status.OK)
            return
        if body is None:
            messages = self._messages(stream)
            if messages is None:
                return
            if len(messages) != 1 or stream.data:
                self._fail(stream, GrpcError(Status.INTERNAL, "a call takes one request message"))
                return
            body = messages[0]
        try:
            request = stream.method.decode(body)
        except Exception:
            self._fail(stream, GrpcError(Status.INVALID_ARGUMENT, "the request does not parse"))
            return
        if kind is Kind.STREAM:
            stream.task = asyncio.get_running_loop().create_task(self._stream(stream, request))
            return
        try:
            answer = stream.method.handler(request, stream.call)
        except GrpcError as e:
            self._fail(stream, e)
            return
        except Exception:
            log.exception("gRPC %s failed", stream.method.handler)
            self._fail(stream, GrpcError(Status.INTERNAL, "internal error"))
            return
        if isinstance(answer, (bytes, Message)):
            self._reply(stream, answer)
        else:  # what answers later (a read forwarded, a token's signing key fetched)
            stream.task = asyncio.get_running_loop().create_task(self._later(stream, answer))

    def _each(self, stream: Stream) -> None:
        messages = self._messages(stream)
        taken = stream.held - len(stream.data)
        if taken > 0:
            self._consumed(taken)
            stream.held -= taken
        for body in messages or ():
            if len(stream.pending) > MAX_PENDING:  # a client that takes no answers
                stream.pending.clear()
                self._fail(stream, GrpcError(Status.RESOURCE_EXHAUSTED, "answers not read"))
                self._drop(stream)
                return
            try:
                self._send(stream, stream.method.handler(stream.method.decode(body), stream.call))
            except GrpcError as e:
                self._fail(stream, e)
                return
            except Exception:
                self._fail(stream, GrpcError(Status.INVALID_ARGUMENT, "the request does not parse"))
                return

    async def _later(self, stream: Stream, answer: Awaitable[Any]) -> None:
        deadline = asyncio.timeout(stream.call.timeout)
        try:
            async with deadline:
                response = await answer
        except GrpcError as e:
            self._fail(stream, e)
        except TimeoutError:
            self._timed_out(stream, deadline)
        except Exception:
            log.exception("gRPC %s failed", stream.method.handler)
            self._fail(stream, GrpcError(Status.INTERNAL, "internal error"))
        else:
            self._reply(stream, response)

    async def _stream(self, stream: Stream, request: Any) -> None:
        responses: AsyncIterator[Any] = stream.method.handler(request, stream.call)
        deadline = asyncio.timeout(stream.call.timeout)
        try:
            async with deadline:
                async for response in responses:
                    self._send(stream, response)
                    while (stream.pending or self.paused) and not self.dead:
                        stream.waiter = asyncio.get_running_loop().create_future()
                        await stream.waiter
            self._finish(stream, Status.OK)
        except GrpcError as e:
            self._fail(stream, e)
        except TimeoutError:
            self._timed_out(stream, deadline)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("gRPC %s failed", stream.method.handler)
            self._fail(stream, GrpcError(Status.INTERNAL, "internal error"))
        finally:
            aclose = getattr(responses, "aclose", None)
            if aclose is not None:
                await aclose()

    def _timed_out(self, stream: Stream, deadline: asyncio.Timeout) -> None:
        if deadline.expired():
            self._fail(stream, GrpcError(Status.DEADLINE_EXCEEDED, "the call's deadline passed"))
        else:  # a handler's own wait, not the client's deadline
            log.exception("gRPC %s failed", stream.method.handler)
            self._fail(stream, GrpcError(Status.INTERNAL, "internal error"))

    # -- answers -------------------------------------------------------------------------

    def _reply(self, stream: Stream, response: Any) -> None:
        """A unary call's answer: headers, its message and the trailers, in one write when
        the windows let them."""
        body = response if isinstance(response, bytes) else response.SerializeToString()
        n = len(body) + 5
        sid = stream.id
        if (
            n <= stream.send_window
            and n <= self.send_window
            and n <= self.peer_frame
            and sid in self.streams
            and not self.dead
            and not self.table_update
        ):
            self.send_window -= n
            self._write(
                REPLY_HEAD.pack(
                    *HEADERS_FRAME, sid, RESPONSE_HEADERS, n >> 8, n & 0xFF, DATA, 0, sid, 0, n - 5
                )
                + body
                + OK_TAIL.pack(*TRAILERS_FRAME, sid, OK_TRAILERS)
            )
            del self.streams[sid]
            self.handled[(stream.path, 0)] += 1
            if self.closing:
                self._closed()
            return
        self._send(stream, response)
        self._finish(stream, Status.OK)

    def _send(self, stream: Stream, response: Any) -> None:
        """One response message, held back when the windows do not let it out yet."""
        if stream.id not in self.streams or self.transport is None:
            return
        if not stream.replied:
            stream.replied = True
            block = self._owed_update() + RESPONSE_HEADERS
            self._write(frame(HEADERS, END_HEADERS, stream.id, block))
        stream.pending += message(
            response if isinstance(response, bytes) else response.SerializeToString()
        )
        self._flush(stream)

    def _fail(self, stream: Stream, error: GrpcError) -> None:
        self._finish(stream, error.status, error.message, error.metadata)

    def _finish(
        self,
        stream: Stream,
        status: Status,
        why: str = "",
        metadata: Iterable[tuple[str, str]] = (),
    ) -> None:
        if stream.id not in self.streams or stream.trailers is not None:
            return
        self.handled[(stream.path, int(status))] += 1
        block = trailers(status, why, metadata)
        if not stream.replied:  # trailers only
            stream.replied = True
            block = RESPONSE_HEADERS + block
        stream.trailers = block
        self._flush(stream)

    def _refuse(self, sid: int, flags: int, status: Status, why: str) -> None:
        """A trailers-only answer for a stream that was never opened as a call."""
        self.handled[(UNKNOWN_METHOD, int(status))] += 1
        if self.transport is not None:
            block = self._owed_update() + RESPONSE_HEADERS + trailers(status, why)
            self._write(frame(HEADERS, END_HEADERS | END_STREAM, sid, block))
            if not flags & END_STREAM:
                self._reset(sid, NO_ERROR)

    def _flush(self, stream: Stream) -> None:
        """Send what the windows let out of a stream's pending DATA, then its trailers."""
        transport = self.transport
        if transport is None or self.dead or stream.id not in self.streams:
            return
        pending = stream.pending
        while pending:
            n = min(len(pending), stream.send_window, self.send_window, self.peer_frame)
            if n <= 0:
                return
            self._write(frame(DATA, 0, stream.id, bytes(pending[:n])))
            del pending[:n]
            stream.send_window -= n
            self.send_window -= n
        if stream.trailers is not None:
            block = self._owed_update() + stream.trailers
            self._write(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, block))
            if not stream.ended:  # the client may still be sending: it need not
                self._reset(stream.id, NO_ERROR)
            self._drop(stream)
        self._wake(stream)

    def _wake(self, stream: Stream) -> None:
        waiter = stream.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _owed_update(self) -> bytes:
        """The dynamic table size update owed at the start of our next header block."""
        owed, self.table_update = self.table_update, b""
        return owed

    def _consumed(self, n: int) -> None:
        """Give `n` bytes of DATA back to the connection's window, once they are taken."""
        self.unacked += n
        if self.unacked >= CONNECTION_WINDOW // 4:
            self._write(frame(WINDOW_UPDATE, 0, 0, self.unacked.to_bytes(4, "big")))
            self.unacked = 0

    def _drop(self, stream: Stream) -> None:
        """A stream ended here without its answer (its trailers sent if they could be)."""
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
        if stream.held:
            self._consumed(stream.held)
            stream.held = 0
        self._cancel(stream)
        self._closed()

    def _reset(self, sid: int, code: int) -> None:
        if self.transport is not None and not self.dead:
            self._write(frame(RST_STREAM, 0, sid, code.to_bytes(4, "big")))

    def _cancel(self, stream: Stream) -> None:
        task = stream.task
        # a call's own task that ends it (its trailers sent) is finishing, not cancelled
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        self._wake(stream)

    def _closed(self) -> None:
        if self.closing and not self.streams and self.transport is not None:
            self._send_out()
            self.transport.close()


def _unpadded(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise _ConnectionError(PROTOCOL_ERROR, "padding longer than its frame")
    return payload[1 : len(payload) - payload[0]]


class Server:
    """gRPC methods (by path, "/package.Service/Method") served on a host and port; its
    figures are a Prometheus collector (:meth:`collect`)."""

    def __init__(self, methods: dict[str, Method]) -> None:
        self.methods = methods
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        #: calls ended, by method path and status code (a method the server lacks as one
        #: path; codes as ints: an enum member hashes in Python, once per call)
        self.handled: defaultdict[tuple[str, int], int] = defaultdict(int)

    def collect(self) -> Iterator[Metric]:
        handled = CounterMetricFamily(
            "tablecast_grpc_server_handled",
            "gRPC calls ended, by method and status (as grpc-prometheus names them)",
            labels=["grpc_service", "grpc_method", "grpc_code"],
        )
        for (path, status), n in sorted(self.handled.items()):
            service, _, method = path.strip("/").partition("/")
            handled.add_metric([service, method, Status(status).name], n)
        yield handled
        yield GaugeMetricFamily(
            "tablecast_grpc_connections", "gRPC connections open", value=len(self.connections)
        )

    async def start(self, host: str, port: int, tls: tuple[str, str] | None = None) -> None:
        context = None
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(*tls)
            context.set_alpn_protocols(["h2"])
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Connection(self), host, port, ssl=context, reuse_address=True
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace: float | None) -> None:
        """Take no new connection or call; give the calls under way `grace` seconds (None:
        none)."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.goaway()
        deadline = time.monotonic() + (grace or 0.0)
        while any(c.streams for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()  # the grace is over: nothing more is sent
            connection.connection_lost(None)
        await asyncio.sleep(0)
