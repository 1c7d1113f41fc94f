"""The Schema Registry wire format of Confluent's serializers (Java, confluent-kafka, Go,
.NET): byte 0, the writer schema's id as 4 bytes big-endian, then the payload in that
schema (Avro binary, JSON text for JSON Schema; for Protobuf, first the path of the
message type within the schema's file, then the message)."""

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


def message_indexes(data: bytes) -> tuple[list[int], bytes]:
    """(path of the message type, message) of a Protobuf payload: a count and that many
    indexes, each a zigzag varint; a lone 0 byte is the file's first message, ``[0]``."""
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= len(data) or shift > 63:
                raise ValueError("the message indexes end early")
            b = data[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return (result >> 1) ^ -(result & 1)  # zigzag
            shift += 7

    count = varint()
    if count == 0:
        return [0], data[pos:]
    if not 0 < count <= 64:
        raise ValueError(f"{count} message indexes")
    path = [varint() for _ in range(count)]
    if any(i < 0 for i in path):
        raise ValueError(f"message indexes {path}")
    return path, data[pos:]
