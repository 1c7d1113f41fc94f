"""The Schema Registry wire format of Confluent's serializers (Java, confluent-kafka, Go,
.NET): byte 0, the writer schema's id as 4 bytes big-endian, then the payload in that
schema (Avro binary, or JSON text for JSON Schema)."""

from __future__ import annotations

import struct

MAGIC = 0
_HEAD = struct.Struct(">bI")
HEAD_SIZE = _HEAD.size


def split(data: bytes) -> tuple[int, bytes]:
    """(schema id, payload) of a record written in the wire format; ValueError if it is not."""
    if len(data) < HEAD_SIZE:
        raise ValueError(f"{len(data)} bytes: shorter than the wire format's 5-byte head")
    magic, schema_id = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"first byte {magic & 0xFF}, not the wire format's 0")
    return schema_id, data[HEAD_SIZE:]


def join(schema_id: int, payload: bytes) -> bytes:
    return _HEAD.pack(MAGIC, schema_id) + payload
