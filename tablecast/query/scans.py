"""What a paged read takes from one partition's store: rows, rows as of a time, or an index.

Each scan reads up to `n` rows of one store in one call, sorted by a *sort key*
(the row key, or for an index the encoded index value followed by the row
key), each with the item the answer shows. Pages over many partitions merge
on the sort key (:func:`tablecast.query.local.merged`), and their cursors carry the
last sort key. A scan applies the caller's grants itself: a range or as-of
scan reads only the granted key spans, an index scan skips rows outside them.
Asked for its record fields, each item also names the record it shows (partition,
offset, timestamp), as a key read's answer does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tablecast.contract import index_codec
from tablecast.contract.table_info import TableInfo
from tablecast.query.errors import ApiError
from tablecast.query.policy import KeyScope, Span
from tablecast.query.queries import PartitionScan
from tablecast.store import PartitionStore
from tablecast.store.base import Record, Version

#: (sort key, the item the answer shows)
Row = tuple[bytes, dict[str, Any]]
#: rows read at a time while skipping rows outside the grants
FILTER_CHUNK = 64


class Scan:
    """A scan of one kind; :meth:`read` is called inside a replica's exact read."""

    #: what an internal call names it by (``view=``), with its own parameters
    view = "rows"

    def __init__(
        self, info: TableInfo, scope: KeyScope | None, record_fields: bool = False
    ) -> None:
        self.info = info
        self.scope = scope
        self.record_fields = record_fields
        self._value = info.value_serde.to_json
        self._key = info.key_serde.to_json

    def read(
        self, store: PartitionStore, partition: int, lo: bytes | None, hi: bytes | None, n: int
    ) -> list[Row]:
        """Up to `n` rows of `partition`'s store with lo <= sort key < hi, in sort-key order."""
        out: list[Row] = []
        for s_lo, s_hi in self._spans(lo, hi):
            for key, record in store.scan(s_lo, s_hi, n - len(out)):
                out.append((key, self._item(key, record, partition)))
            if len(out) >= n:
                break
        return out

    def _item(self, key: bytes, record: Record | Version, partition: int) -> dict[str, Any]:
        """What the answer shows of the row of `key`, as `record` holds it."""
        item = {"key": self._key(key), "value": self._value(record.value)}
        if self.record_fields:
            item["partition"] = partition
            item["offset"] = record.offset
            item["timestamp"] = record.timestamp
        return item

    def share(self) -> dict[str, Any]:
        """What a :class:`~tablecast.query.queries.PartitionScan` passes on for a peer to run
        the same scan, beyond its view."""
        return {"record_fields": True} if self.record_fields else {}

    def _spans(self, lo: bytes | None, hi: bytes | None) -> list[Span]:
        return [(lo, hi)] if self.scope is None else self.scope.clip(lo, hi)


class AsOfScan(Scan):
    """The table as it was at time `at`: each key's version valid then (deletes left out)."""

    view = "as_of"

    def __init__(
        self, info: TableInfo, scope: KeyScope | None, at: int, record_fields: bool = False
    ) -> None:
        super().__init__(info, scope, record_fields)
        self.at = at

    def read(
        self, store: PartitionStore, partition: int, lo: bytes | None, hi: bytes | None, n: int
    ) -> list[Row]:
        check_floor(self.info, store, self.at)
        out: list[Row] = []
        for s_lo, s_hi in self._spans(lo, hi):
            for key, version in store.scan_as_of(s_lo, s_hi, self.at, n - len(out)):
                out.append((key, self._item(key, version, partition)))
            if len(out) >= n:
                break
        return out

    def share(self) -> dict[str, Any]:
        return {**super().share(), "as_of": self.at}


class IndexScan(Scan):
    """Rows by their values under one index; items say the value (``"index"``) when the
    page spans several values, not for a lookup of one."""

    view = "index"

    def __init__(
        self,
        info: TableInfo,
        scope: KeyScope | None,
        name: str,
        with_value: bool = True,
        record_fields: bool = False,
    ) -> None:
        super().__init__(info, scope, record_fields)
        self.name = name
        self.with_value = with_value

    def read(
        self, store: PartitionStore, partition: int, lo: bytes | None, hi: bytes | None, n: int
    ) -> list[Row]:
        allows: Callable[[bytes], bool] | None = None if self.scope is None else self.scope.allows
        out: list[Row] = []
        while len(out) < n:
            ask = n - len(out) if allows is None else max(n - len(out), FILTER_CHUNK)
            rows = store.index_scan(self.name, lo, hi, ask)
            for composite, record in rows:
                value, key = index_codec.split(composite)
                if allows is not None and not allows(key):
                    continue
                item = self._item(key, record, partition)
                if self.with_value:
                    item = {"index": value, **item}
                out.append((composite, item))
                if len(out) >= n:
                    break
            if len(rows) < ask:
                break
            lo = rows[-1][0] + b"\x00"
        return out

    def share(self) -> dict[str, Any]:
        return {**super().share(), "index": self.name, "with_value": self.with_value}


def check_floor(info: TableInfo, store: PartitionStore, at: int) -> None:
    """400 unless `at` is within what the store's history keeps (where as_of is exact)."""
    floor = store.history_floor
    if floor is not None and at < floor:
        raise ApiError(
            "bad_request",
            f"as_of {at} is before what {info.name!r} keeps of its history: "
            f"{info.history_ms} ms before the latest record time, so from {floor}",
        )


def scan_for(info: TableInfo, scope: KeyScope | None, q: PartitionScan) -> Scan:
    """The scan a peer's :class:`~tablecast.query.queries.PartitionScan` asks for."""
    if q.view in ("rows", None):
        return Scan(info, scope, q.record_fields)
    if q.view == "as_of" and q.as_of is not None:
        require_history(info)
        return AsOfScan(info, scope, q.as_of, q.record_fields)
    if q.view == "index" and q.index is not None:
        require_index(info, q.index)
        return IndexScan(info, scope, q.index, q.with_value, q.record_fields)
    raise ApiError("bad_request", "view is rows, as_of (with as_of=) or index (with index=)")


def require_kv(info: TableInfo) -> None:
    """400 for a window table: its rows are a key's windows, read by key."""
    if info.kind != "kv":
        raise ApiError(
            "bad_request", f"{info.name!r} is a window table: read /keys/{{key}}/windows"
        )


def require_history(info: TableInfo) -> None:
    if info.history_ms is None:
        raise ApiError(
            "bad_request",
            f"{info.name!r} keeps no history (materialize it with history=...)",
        )


def require_index(info: TableInfo, name: str) -> None:
    if name not in info.indexes:
        raise ApiError(
            "not_found",
            f"{info.name!r} has no index {name!r}"
            + (f" (its indexes: {', '.join(info.indexes)})" if info.indexes else ""),
        )
