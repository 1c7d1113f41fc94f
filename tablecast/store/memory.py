"""The memory store: a sorted dict per partition, rebuilt from the table topic on restart."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from sortedcontainers import SortedDict

from tablecast.store.base import Record, Write, last_per_key


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

    def get(self, key: bytes) -> Record | None:
        return self._data.get(key)

    def multi_get(self, keys: Sequence[bytes]) -> list[Record | None]:
        get = self._data.get
        return [get(k) for k in keys]

    def scan(
        self, start: bytes | None, end: bytes | None, limit: int
    ) -> list[tuple[bytes, Record]]:
        with self._lock:
            keys = self._data.irange(start, end, inclusive=(True, False))
            out = []
            for key in keys:
                if len(out) >= limit:
                    break
                out.append((key, self._data[key]))
            return out

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
        self._data.clear()
