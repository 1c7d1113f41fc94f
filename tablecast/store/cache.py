"""A read cache in front of a durable store, as Kafka Streams puts one in front of RocksDB.

Point reads of hot keys are answered from a dict of decoded records instead of
a RocksDB lookup (about 0.7 µs saved per read, a sixth of a GET's handler).
The cache is bounded by an estimate of its bytes; when full it drops its oldest
eighth (a dict keeps insertion order) rather than tracking recency, which keeps
a hit to one dict lookup. Starting over instead, as it once did, left it half
full on average: a working set larger than the cache hit half as often.

Readers run on the HTTP thread while the ingestion thread applies batches, so
a reader must never put a record in the cache that a newer write has already
replaced. The generation works as a seqlock: an apply makes it odd before it
writes and even again after it has dropped the written keys. A reader fills
the cache only from an even generation, and takes its entry back out if the
generation moved meanwhile — so a value read just before an apply and
remembered just after that apply's drops never stays. The applied offset moves only
after the dropped keys are gone, so a reader that waits for an offset
(``min_offset``) never reads an older value from the cache.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import TypeVar

from tablecast.store.base import PartitionStore, Record, StoreClosed, Version, Views, Write

#: dict slot, key and Record object overhead per entry, beyond the bytes themselves
ENTRY_OVERHEAD = 200
#: a full cache drops this share of its entries at once, the oldest first
DROP_SHARE = 8
K = TypeVar("K")
V = TypeVar("V")


def drop_oldest(entries: dict[K, V]) -> Iterator[tuple[K, V]]:
    """Take the oldest share of `entries` out, yielding each one taken.

    Another thread may take entries out meanwhile (an apply drops the keys it wrote):
    one already gone is skipped, and a listing of the oldest that such a drop cut
    short (its iterator made before the drop) is made again."""
    while True:
        try:
            oldest = list(islice(entries, max(1, len(entries) // DROP_SHARE)))
            break
        except RuntimeError:  # the dict changed size during the listing
            continue
    for key in oldest:
        value = entries.pop(key, None)
        if value is not None:
            yield key, value


class CachedStore:
    def __init__(self, inner: PartitionStore, max_bytes: int) -> None:
        self.inner = inner
        self.max_bytes = max_bytes
        self._records: dict[bytes, Record] = {}
        self._bytes = 0
        self._generation = 0
        self._applied = inner.applied_offset
        self._closed = False
        #: reads answered from the cache, and read from the store (the console shows the rate)
        self.hits = self.misses = 0

    @property
    def applied_offset(self) -> int:
        return self._applied

    @property
    def synced_ms(self) -> int:
        return self.inner.synced_ms

    def mark_synced(self, wall_ms: int) -> None:
        self.inner.mark_synced(wall_ms)

    def get(self, key: bytes) -> Record | None:
        record = self._records.get(key)
        if record is not None:
            if self._closed:  # a read that raced the close remembered its record after it
                raise StoreClosed("the store was closed")
            self.hits += 1
            return record
        self.misses += 1
        generation = self._generation
        record = self.inner.get(key)
        if record is not None and not generation & 1:  # no apply was under way
            self._remember(key, record, generation)
        return record

    def _remember(self, key: bytes, record: Record, generation: int) -> None:
        size = len(key) + len(record.value) + ENTRY_OVERHEAD
        if size > self.max_bytes:
            return
        before = self._records.pop(key, None)  # remembered twice by readers on two threads
        if before is not None:
            self._bytes -= len(key) + len(before.value) + ENTRY_OVERHEAD
        while self._bytes + size > self.max_bytes:
            if not self._records:  # the estimate drifted (applies drop keys meanwhile)
                self._bytes = 0
                break
            for k, gone in drop_oldest(self._records):
                self._bytes -= len(k) + len(gone.value) + ENTRY_OVERHEAD
        self._records[key] = record
        self._bytes += size
        if self._generation != generation:  # an apply ran meanwhile: this may be stale
            self._records.pop(key, None)

    def multi_get(self, keys: Sequence[bytes]) -> list[Record | None]:
        return self.inner.multi_get(keys)

    def scan(
        self, start: bytes | None, end: bytes | None, limit: int
    ) -> list[tuple[bytes, Record]]:
        return self.inner.scan(start, end, limit)

    def count_range(self, start: bytes | None, end: bytes | None) -> int:
        return self.inner.count_range(start, end)

    # history and index reads go to the store: they are not the point reads the cache is for
    @property
    def views(self) -> Views:
        return self.inner.views

    @property
    def history_floor(self) -> int | None:
        return self.inner.history_floor

    def as_of(self, key: bytes, at: int) -> Version | None:
        return self.inner.as_of(key, at)

    def versions(self, key: bytes, start: int, end: int, limit: int) -> list[Version]:
        return self.inner.versions(key, start, end, limit)

    def scan_as_of(
        self, start: bytes | None, end: bytes | None, at: int, limit: int
    ) -> list[tuple[bytes, Version]]:
        return self.inner.scan_as_of(start, end, at, limit)

    def index_scan(
        self, name: str, start: bytes | None, end: bytes | None, limit: int
    ) -> list[tuple[bytes, Record]]:
        return self.inner.index_scan(name, start, end, limit)

    def skip_past(self, offset: int) -> None:
        self.inner.skip_past(offset)
        self._applied = self.inner.applied_offset

    def apply(self, writes: Sequence[Write]) -> None:
        if not writes:
            return
        self._generation += 1  # odd: readers must not fill the cache now
        try:
            self.inner.apply(writes)
        finally:
            records = self._records
            for w in writes if records else ():  # a store restoring has nothing cached
                gone = records.pop(w.key, None)
                if gone is not None:
                    self._bytes -= len(w.key) + len(gone.value) + ENTRY_OVERHEAD
            self._generation += 1  # even again, and different from any reader's
        self._applied = self.inner.applied_offset

    def __len__(self) -> int:
        return len(self.inner)

    def close(self) -> None:
        self._closed = True
        self._records = {}
        self.inner.close()
