"""The store interface every backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol


class Record(NamedTuple):
    """What a store keeps per key: the value and where in the topic it came from."""

    value: bytes
    offset: int
    timestamp: int


class Write(NamedTuple):
    """One table-topic record to apply: a None value deletes the key."""

    key: bytes
    value: bytes | None
    offset: int
    timestamp: int


class PartitionStore(Protocol):
    """The latest record per key of one table partition.

    ``applied_offset`` is the offset of the last record applied (-1 for none);
    :meth:`apply` moves data, count and offset together, so a reader or a
    restart never sees one without the others. Readers may run on another
    thread than the one applying.
    """

    @property
    def applied_offset(self) -> int: ...

    def get(self, key: bytes) -> Record | None: ...

    def multi_get(self, keys: Sequence[bytes]) -> list[Record | None]: ...

    def scan(
        self, start: bytes | None, end: bytes | None, limit: int
    ) -> list[tuple[bytes, Record]]:
        """Up to `limit` entries with start <= key < end, ascending by key bytes."""
        ...

    def apply(self, writes: Sequence[Write]) -> None: ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


def last_per_key(writes: Sequence[Write]) -> dict[bytes, Write]:
    """A batch reduced to its last write per key: all a compacted table keeps."""
    return {w.key: w for w in writes}
