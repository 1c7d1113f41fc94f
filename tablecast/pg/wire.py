"""PostgreSQL protocol 3.0 on the wire: frontend messages read from a stream, backend
messages built.

Every read is bounded: a startup packet or a message longer than this module
allows is a protocol violation (SQLSTATE 08P01), answered and the connection
closed, never buffered.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence

PROTOCOL_3 = 196608
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
#: a startup packet's largest size (PostgreSQL's own MAX_STARTUP_PACKET_LENGTH)
MAX_STARTUP = 10_000
#: a message's largest size: a query of a megabyte is a query nobody here needs
MAX_MESSAGE = 1 << 20

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">ci")


class ProtocolViolation(Exception):
    """The peer broke the protocol (SQLSTATE 08P01): answered, then the connection closes."""


class Payload:
    """A message's payload read field by field; a field past its end is a violation."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def int16(self) -> int:
        return self._unpack(_I16)

    def int32(self) -> int:
        return self._unpack(_I32)

    def _unpack(self, s: struct.Struct) -> int:
        end = self.pos + s.size
        if end > len(self.data):
            raise ProtocolViolation("a message ends inside a field")
        (value,) = s.unpack_from(self.data, self.pos)
        self.pos = end
        return int(value)

    def bytes(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise ProtocolViolation("a message ends inside a field")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def cstring(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolViolation("a string without its terminating zero byte")
        out = self.data[self.pos : end]
        self.pos = end + 1
        try:
            return out.decode()
        except UnicodeDecodeError:
            raise ProtocolViolation("a string that is not UTF-8") from None


async def read_startup(reader: asyncio.StreamReader) -> tuple[int, Payload]:
    """A startup-phase packet: (its code, the rest)."""
    head = await reader.readexactly(4)
    (length,) = _I32.unpack(head)
    if not 8 <= length <= MAX_STARTUP:
        raise ProtocolViolation(f"a startup packet of {length} bytes")
    body = await reader.readexactly(length - 4)
    payload = Payload(body)
    return payload.int32(), payload


async def read_message(reader: asyncio.StreamReader) -> tuple[bytes, Payload]:
    """A message after startup: (its type byte, its payload)."""
    kind, length = _HEAD.unpack(await reader.readexactly(5))
    if not 4 <= length <= MAX_MESSAGE:
        raise ProtocolViolation(f"a message of {length} bytes")
    return kind, Payload(await reader.readexactly(length - 4))


def startup_parameters(payload: Payload) -> dict[str, str]:
    """A StartupMessage's name/value pairs."""
    out: dict[str, str] = {}
    while True:
        name = payload.cstring()
        if not name:
            return out
        out[name] = payload.cstring()
        if len(out) > 64:
            raise ProtocolViolation("a startup packet with more than 64 parameters")


# -- backend messages ------------------------------------------------------------------------
def message(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + _I32.pack(len(payload) + 4) + payload


def _cstr(text: str) -> bytes:
    return text.encode().replace(b"\0", b"") + b"\0"


AUTH_OK = message(b"R", _I32.pack(0))
AUTH_CLEARTEXT = message(b"R", _I32.pack(3))
PARSE_COMPLETE = message(b"1")
BIND_COMPLETE = message(b"2")
CLOSE_COMPLETE = message(b"3")
NO_DATA = message(b"n")
PORTAL_SUSPENDED = message(b"s")
EMPTY_QUERY = message(b"I")


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", _cstr(name) + _cstr(value))


def backend_key_data(pid: int, secret: int) -> bytes:
    return message(b"K", _I32.pack(pid) + _I32.pack(secret))


def _ready(status: bytes) -> bytes:
    return message(b"Z", status)


_READY = {s: _ready(s) for s in (b"I", b"T", b"E")}


def ready_for_query(status: bytes = b"I") -> bytes:
    return _READY.get(status) or _ready(status)


def row_description(fields: Sequence[tuple[str, int, int, int]]) -> bytes:
    """(name, type OID, type size, format code) of each column."""
    parts = [_I16.pack(len(fields))]
    for name, oid, size, fmt in fields:
        parts.append(_cstr(name) + struct.pack(">ihihih", 0, 0, oid, size, -1, fmt))
    return message(b"T", b"".join(parts))


def parameter_description(oids: Sequence[int]) -> bytes:
    return message(b"t", _I16.pack(len(oids)) + b"".join(_I32.pack(o) for o in oids))


def data_row(values: Sequence[bytes | None]) -> bytes:
    parts = [_I16.pack(len(values))]
    for v in values:
        parts.append(_I32.pack(-1) if v is None else _I32.pack(len(v)) + v)
    return message(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    return message(b"C", _cstr(tag))


def error_response(code: str, text: str, severity: str = "ERROR", detail: str = "") -> bytes:
    fields = b"S" + _cstr(severity) + b"V" + _cstr(severity) + b"C" + _cstr(code)
    fields += b"M" + _cstr(text)
    if detail:
        fields += b"D" + _cstr(detail)
    return message(b"E", fields + b"\0")
