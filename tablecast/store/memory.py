"""The memory store: a sorted dict per partition, rebuilt from the table topic on restart."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from sortedcontainers import SortedDict

from tablecast.store.base import NO_VIEWS, Record, StoreClosed, Version, Views, Write, last_per_key
from tablecast.store.indexes import MemoryIndexes, rows_of
from tablecast.store.versions import MemoryVersions


class _Closed:
    """Stands in for a closed store's data: every use raises, so a reader that
    raced the close re-routes instead of answering a false 404 from emptied data.
    Swapping the dict for this costs the hot path nothing (no flag to check)."""

    def _closed(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise StoreClosed("the store was closed")

    get = pop = irange = bisect_left = __getitem__ = __setitem__ = __len__ = _closed


_CLOSED: Any = _Closed()


class MemoryStore:
    def __init__(self, views: Views = NO_VIEWS) -> None:
        self._data: SortedDict = SortedDict()
        self._applied = -1
        # point reads are single dict lookups (atomic under the GIL); scans walk
        # the sorted index, which must not change under them, and so do history and
        # index reads
        self._lock = threading.Lock()
        self.views = views
        self._history = MemoryVersions(views.history_ms) if views.history_ms else None
        self._indexes = MemoryIndexes() if views.indexes else None
        self._closed = False

    @property
    def applied_offset(self) -> int:
        return self._applied

    @property
    def synced_ms(self) -> int:
        return 0  # rebuilt from the topic on every open: never resumed, never stale

    def mark_synced(self, wall_ms: int) -> None:
        pass

    def get(self, key: bytes) -> Record | None:
        return self._data.get(key)

    def multi_get(self, keys: Sequence[bytes]) -> list[Record | None]:
        get = self._data.get
        return [get(k) for k in keys]

    def scan(
        self, start: bytes | None, end: bytes | None, limit: int
    ) -> list[tuple[bytes, Record]]:
        with self._lock:
            data = self._data
            keys = data.irange(start, end, inclusive=(True, False))
            out = []
            for key in keys:
                if len(out) >= limit:
                    break
                out.append((key, data[key]))
            return out

    def count_range(self, start: bytes | None, end: bytes | None) -> int:
        with self._lock:  # two positions in the sorted index, not a walk
            data = self._data
            lo = 0 if start is None else data.bisect_left(start)
            hi = len(data) if end is None else data.bisect_left(end)
            return max(0, hi - lo)

    def skip_past(self, offset: int) -> None:
        self._applied = max(self._applied, offset)

    def apply(self, writes: Sequence[Write]) -> None:
        if not writes:
            return
        with self._lock:
            data = self._data
            last = last_per_key(writes)
            for w in last.values():
                if w.value is None:
                    data.pop(w.key, None)
                else:
                    data[w.key] = Record(w.value, w.offset, w.timestamp)
            if self._history is not None:
                self._history.apply(writes)
            if self._indexes is not None:
                self._indexes.apply(last)
            self._applied = max(self._applied, writes[-1].offset)

    @property
    def history_floor(self) -> int | None:
        return None if self._history is None else self._history.floor

    def _views(self) -> tuple[MemoryVersions | None, MemoryIndexes | None]:
        if self._closed:
            raise StoreClosed("the store was closed")
        return self._history, self._indexes

    def as_of(self, key: bytes, at: int) -> Version | None:
        with self._lock:
            return _history(self._views()[0]).as_of(key, at)

    def versions(self, key: bytes, start: int, end: int, limit: int) -> list[Version]:
        with self._lock:
            return _history(self._views()[0]).versions(key, start, end, limit)

    def scan_as_of(
        self, start: bytes | None, end: bytes | None, at: int, limit: int
    ) -> list[tuple[bytes, Version]]:
        with self._lock:
            return _history(self._views()[0]).scan_as_of(start, end, at, limit)

    def index_scan(
        self, name: str, start: bytes | None, end: bytes | None, limit: int
    ) -> list[tuple[bytes, Record]]:
        with self._lock:
            indexes = self._views()[1]
            if indexes is None or name not in self.views.indexes:
                raise ValueError(f"this store keeps no index {name!r}")
            return rows_of(indexes.scan(name, start, end, limit), self.multi_get)

    def __len__(self) -> int:
        return len(self._data)

    def close(self) -> None:
        # the data is left to the garbage collector rather than cleared: a reader
        # holding the old dict finishes with a consistent answer, later ones raise
        with self._lock:
            self._data = _CLOSED
            self._closed = True


def _history(history: MemoryVersions | None) -> MemoryVersions:
    if history is None:
        raise ValueError("this store keeps no history")
    return history
