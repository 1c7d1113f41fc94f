"""The memory store: a dict per partition, rebuilt from the table topic on restart."""

from __future__ import annotations

from collections.abc import Sequence

from tablecast.store.base import Record, Write


class MemoryStore:
    def __init__(self) -> None:
        self._data: dict[bytes, Record] = {}
        self._applied = -1

    @property
    def applied_offset(self) -> int:
        return self._applied

    def get(self, key: bytes) -> Record | None:
        return self._data.get(key)

    def apply(self, writes: Sequence[Write]) -> None:
        data = self._data
        for w in writes:
            if w.value is None:
                data.pop(w.key, None)
            else:
                data[w.key] = Record(w.value, w.offset, w.timestamp)
        if writes:
            self._applied = max(self._applied, writes[-1].offset)

    def __len__(self) -> int:
        return len(self._data)

    def close(self) -> None:
        self._data.clear()
