"""The store interface every backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from tablecast.contract.views import NO_VIEWS as NO_VIEWS
from tablecast.contract.views import Views as Views


class StoreClosed(Exception):
    """A read of a store that was closed under it: the reader must go elsewhere."""


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
    #: the row's index entries (:func:`tablecast.contract.index_codec.entries`); () for none
    index: tuple[bytes, ...] = ()


class Version(NamedTuple):
    """One version of a key in a table's history: a None value says it was deleted then."""

    value: bytes | None
    offset: int
    timestamp: int


class PartitionStore(Protocol):
    """The latest record per key of one table partition.

    ``applied_offset`` is the offset of the last record applied (-1 for none);
    :meth:`apply` moves data, count and offset together, so a reader or a
    restart never sees one without the others. Readers may run on another
    thread than the one applying. After :meth:`close` every read raises
    :class:`StoreClosed` (never a wrong answer), so a reader racing a release
    can re-route its request.

    ``synced_ms`` is the wall-clock time (epoch ms) at which the store was last
    known to hold everything its topic had (0: unknown); :meth:`mark_synced`
    records it durably, so a node that reopens the store after a long absence
    can tell whether compaction may have dropped tombstones it never saw.
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

    def count_range(self, start: bytes | None, end: bytes | None) -> int:
        """How many keys lie in start <= key < end (what a policy lets a caller count)."""
        ...

    def apply(self, writes: Sequence[Write]) -> None: ...

    def skip_past(self, offset: int) -> None:
        """Count the record at `offset`, which changes nothing, as applied (one left out as
        bad): the applied offset moves to it, durably, if it was below."""
        ...

    # -- history (Views.history_ms) --------------------------------------------
    @property
    def views(self) -> Views: ...

    @property
    def history_floor(self) -> int | None:
        """The earliest time :meth:`as_of` answers exactly: stream time (the largest record
        timestamp applied) less the history's retention; None without a history."""
        ...

    def as_of(self, key: bytes, at: int) -> Version | None:
        """The version of `key` valid at time `at` (the latest with timestamp <= at)."""
        ...

    def versions(self, key: bytes, start: int, end: int, limit: int) -> list[Version]:
        """Up to `limit` versions of `key` with start <= timestamp < end, oldest first."""
        ...

    def scan_as_of(
        self, start: bytes | None, end: bytes | None, at: int, limit: int
    ) -> list[tuple[bytes, Version]]:
        """Up to `limit` keys in start <= key < end with a value (not a delete) valid at
        `at`, ascending by key bytes."""
        ...

    # -- indexes (Views.indexes) -----------------------------------------------
    def index_scan(
        self, name: str, start: bytes | None, end: bytes | None, limit: int
    ) -> list[tuple[bytes, Record]]:
        """Up to `limit` rows of index `name` with start <= encoded value + key < end, in that
        order: (encoded value + key, the row's record)."""
        ...

    @property
    def synced_ms(self) -> int: ...

    def mark_synced(self, wall_ms: int) -> None: ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


def last_per_key(writes: Sequence[Write]) -> dict[bytes, Write]:
    """A batch reduced to its last write per key: all a compacted table keeps."""
    return {w.key: w for w in writes}
