"""The record key of a window table: Kafka Streams' time-windowed format.

key bytes = the inner key's serialized bytes + the window start in epoch ms as
8 bytes big-endian (what Kafka Streams' ``TimeWindowedSerializer`` writes).
A window record lives in the partition of its *inner* key, so a key and all of
its windows are in one place (Kafka Streams' ``WindowedStreamPartitioner``).

A session window table's key is the inner key + the session's start + its end
(8 bytes big-endian each). Kafka Streams' ``SessionKeySchema`` writes end then
start; start first keeps a key's sessions ordered by start in a store, so the
``/windows?from=&to=`` range read by start works on both kinds of table.
"""

from __future__ import annotations

import struct

_START = struct.Struct(">q")


def window_key(key: bytes, start_ms: int) -> bytes:
    return key + _START.pack(start_ms)


#: the bytes of a window key after its inner key: the window's start
WINDOW_SUFFIX = 8


def split_window_key(data: bytes) -> tuple[bytes, int]:
    if len(data) < WINDOW_SUFFIX:
        raise ValueError("a window key is at least 8 bytes")
    return data[:-WINDOW_SUFFIX], _START.unpack(data[-WINDOW_SUFFIX:])[0]


SESSION_SUFFIX = 16


def session_key(key: bytes, start_ms: int, end_ms: int) -> bytes:
    return key + _START.pack(start_ms) + _START.pack(end_ms)


def split_session_key(data: bytes) -> tuple[bytes, int, int]:
    if len(data) < SESSION_SUFFIX:
        raise ValueError("a session window key is at least 16 bytes")
    return data[:-16], _START.unpack(data[-16:-8])[0], _START.unpack(data[-8:])[0]


#: the key layouts of Kafka Streams' windowed and session store changelogs, as attached
#: tables name them (``kafka-streams-window:INNER``)
STREAMS_WINDOW = "kafka-streams-window"
STREAMS_SESSION = "kafka-streams-session"
STREAMS_LAYOUTS = (STREAMS_WINDOW, STREAMS_SESSION)
#: the formats of the key inside such a store's key
STREAMS_INNER = ("string", "json", "long", "bytes")
#: a windowed store's changelog key ends with the window start and a 4-byte sequence number
#: (``WindowKeySchema.toStoreKeyBinary``): one for each duplicate a join store keeps
_STREAMS_WINDOW_SUFFIX = 12


def from_streams_window_key(data: bytes) -> bytes:
    """A Kafka Streams windowed store changelog key (inner + start + sequence number) as a
    window table's key (inner + start): duplicates of one window are one row here."""
    if len(data) < _STREAMS_WINDOW_SUFFIX:
        raise ValueError("a Kafka Streams window key is at least 12 bytes")
    return data[:-4]


def from_streams_session_key(data: bytes) -> bytes:
    """A Kafka Streams session store changelog key (inner + end + start) as a session
    table's key (inner + start + end)."""
    if len(data) < SESSION_SUFFIX:
        raise ValueError("a Kafka Streams session key is at least 16 bytes")
    return data[:-16] + data[-8:] + data[-16:-8]
