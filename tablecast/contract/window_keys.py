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


def split_window_key(data: bytes) -> tuple[bytes, int]:
    if len(data) < 8:
        raise ValueError("a window key is at least 8 bytes")
    return data[:-8], _START.unpack(data[-8:])[0]


SESSION_SUFFIX = 16


def session_key(key: bytes, start_ms: int, end_ms: int) -> bytes:
    return key + _START.pack(start_ms) + _START.pack(end_ms)


def split_session_key(data: bytes) -> tuple[bytes, int, int]:
    if len(data) < SESSION_SUFFIX:
        raise ValueError("a session window key is at least 16 bytes")
    return data[:-16], _START.unpack(data[-16:-8])[0], _START.unpack(data[-8:])[0]
