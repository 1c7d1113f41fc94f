"""How a key's partition is picked, bit for bit, by the producers that write tables.

``murmur2``: partition = (murmur2(key_bytes) & 0x7fffffff) % partitions, as Kafka's
Java producer, Kafka Connect, Kafka Streams and Spark's Kafka sink compute it.
librdkafka agrees only with ``partitioner: murmur2_random`` (see :data:`PRODUCER_CONFIG`).
``consistent_random``: librdkafka's default (confluent-kafka, and the clients of
Go, .NET, Node and C built on it): CRC-32 of the key bytes % partitions.
``unknown``: a writer whose choice cannot be computed (a custom partitioner, keys
moved by hand): nodes look a key up instead (:mod:`tablecast.query.locate`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Final

_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF

#: librdkafka settings that make a confluent-kafka producer partition like Java's.
PRODUCER_CONFIG: Final = {"partitioner": "murmur2_random"}


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit int, as Java returns it."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    tail = length & ~3
    for i in range(0, tail, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _murmur2_hash(key: bytes) -> int:
    return murmur2(key) & 0x7FFFFFFF


#: a partitioner's name -> the non-negative hash whose remainder by the partition count
#: is a key's partition
HASHES: Final[dict[str, Callable[[bytes], int]]] = {
    "murmur2": _murmur2_hash,
    "consistent_random": zlib.crc32,
}
DEFAULT: Final = "murmur2"
#: the partitioner of a topic whose writer's choice tablecast cannot compute
UNKNOWN: Final = "unknown"
#: every partitioner a table may name
PARTITIONERS: Final = (*HASHES, UNKNOWN)


class Unplaced(LookupError):
    """A key of a table whose partitioner is :data:`UNKNOWN`: no function places it."""


def unplaced(key: bytes) -> int:
    """What an ``unknown`` table's key -> partition function does: refuse to guess."""
    raise Unplaced("the topic's writer places keys in a way no function here computes")


def partition_for(key: bytes, partitions: int, partitioner: str = DEFAULT) -> int:
    """The partition `partitioner` picks for a serialized, non-null key."""
    if partitions <= 0:
        raise ValueError("partitions must be positive")
    return HASHES[partitioner](key) % partitions


class Partitioner:
    """:func:`partition_for` for one partition count, memoized for hot keys.

    Pure-Python murmur2 costs about a microsecond, a sixth of a point read; a
    served table's hot keys are hashed once. The memo is bounded: when full it
    starts over rather than tracking recency.
    """

    def __init__(
        self,
        partitions: int,
        partitioner: str = DEFAULT,
        max_entries: int = 1 << 18,
        written: Callable[[bytes], bytes] | None = None,
    ):
        """`written`: the bytes the writer hashed for a key as a table keeps it, where the
        two differ (a Debezium key's envelope)."""
        if partitions <= 0:
            raise ValueError("partitions must be positive")
        self.partitions = partitions
        hashed = HASHES[partitioner]
        self._hash = hashed if written is None else lambda key: hashed(written(key))
        self._max = max_entries
        self._memo: dict[bytes, int] = {}

    def __call__(self, key: bytes) -> int:
        p = self._memo.get(key)
        if p is None:
            if len(self._memo) >= self._max:
                self._memo = {}
            p = self._memo[key] = self._hash(key) % self.partitions
        return p
