"""The record key of a window table: Kafka Streams' time-windowed format.

key bytes = the inner key's serialized bytes + the window start in epoch ms as
8 bytes big-endian (what Kafka Streams' ``TimeWindowedSerializer`` writes).
A window record lives in the partition of its *inner* key, so a key and all of
its windows are in one place (Kafka Streams' ``WindowedStreamPartitioner``).
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
