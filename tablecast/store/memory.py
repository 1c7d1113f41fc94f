"""The memory store: a sorted dict per partition, rebuilt from the table topic on restart."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from sortedcontainers import SortedDict

from tablecast.store.base import Record, StoreClosed, Write, last_per_key


class _Closed:
    """Stands in for a closed store's data: every use raises, so a reader that
    raced the close re-routes instead of answering a false 404 from emptied data.
    Swapping the dict for this costs the hot path nothing (no flag to check)."""

    def _closed(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise StoreClosed("the store was closed")

    get = pop = irange = bisect_left = __getitem__ = __setitem__ = __len__ = _closed


_CLOSED: Any = _Closed()


class MemoryStore:
    def __init__(self) -> None:
        self._data: SortedDict = SortedDict()
        self._applied = -1
        # point reads are single dict lookups (atomic under the GIL); scans walk
        # the sorted index, which must not change under them
        self._lock = threading.Lock()

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

    def apply(self, writes: Sequence[Write]) -> None:
        if not writes:
            return
        with self._lock:
            data = self._data
            for w in last_per_key(writes).values():
                if w.value is None:
                    data.pop(w.key, None)
                else:
                    data[w.key] = Record(w.value, w.offset, w.timestamp)
            self._applied = max(self._applied, writes[-1].offset)

    def __len__(self) -> int:
        return len(self._data)

    def close(self) -> None:
        # the data is left to the garbage collector rather than cleared: a reader
        # holding the old dict finishes with a consistent answer, later ones raise
        with self._lock:
            self._data = _CLOSED
