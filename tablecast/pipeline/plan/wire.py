"""Private byte formats of the pipeline's internal records.

A table ``group_by`` selects a (group key, group value) pair per source row;
the pair travels as one value, ``pack_pair``'d, so every step in between can
stay generic over (key bytes, value bytes). Records on a repartition topic
carry a record id that lets the aggregating query drop copies a restarted
query wrote again (Spark's Kafka sink is at-least-once).
"""

from __future__ import annotations

import struct
from typing import Any

from tablecast.serde import Serde, SerdeError

_LEN = struct.Struct(">I")
_RID = struct.Struct(">iqqb")
RID_SIZE = _RID.size


def pack_pair(key: bytes, value: bytes) -> bytes:
    return _LEN.pack(len(key)) + key + value


def unpack_pair(data: bytes) -> tuple[bytes, bytes]:
    (n,) = _LEN.unpack_from(data)
    return data[4 : 4 + n], data[4 + n :]


def record_id(partition: int, offset: int, seq: int, slot: int) -> bytes:
    """Identifies one change a source record caused (slot 0: retraction, 1: addition)."""
    return _RID.pack(partition, offset, seq, slot)


def unpack_record_id(rid: bytes) -> tuple[int, int, int, int]:
    """(partition, offset, seq, slot) of the source record a change came from."""
    return _RID.unpack(rid)


def split_ids(blob: bytes) -> set[bytes]:
    return {blob[i : i + RID_SIZE] for i in range(0, len(blob), RID_SIZE)}


class PairSerde(Serde):
    """(group key, group value) as one value: how a table group_by's selection travels."""

    format = "pair"

    def __init__(self, key: Serde, value: Serde) -> None:
        self.key = key
        self.value = value

    def serialize(self, obj: Any) -> bytes:
        k, v = obj
        return pack_pair(self.key.serialize(k), self.value.serialize(v))

    def deserialize(self, data: bytes) -> Any:
        try:
            k, v = unpack_pair(data)
        except struct.error as e:
            raise SerdeError(str(e)) from None
        return self.key.deserialize(k), self.value.deserialize(v)

    def spec(self) -> dict[str, Any]:
        return {"format": "pair", "key": self.key.spec(), "value": self.value.spec()}
