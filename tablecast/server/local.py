"""Reads from this node's own stores: the building blocks the router answers with."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from itertools import islice
from typing import Any

import orjson

from tablecast.cluster.node import Node
from tablecast.cluster.replica import Replica
from tablecast.kafka.catalog import TableInfo
from tablecast.kafka.windowed import split_window_key, window_key
from tablecast.serde import SerdeError
from tablecast.server.errors import ApiError
from tablecast.server.policy import Scope, Span
from tablecast.store import Record, StoreClosed

Headers = list[tuple[str, str]]
Answer = tuple[int, bytes, Headers]

RETRY_AFTER = [("retry-after", "1")]
MAX_WINDOWS = 10_000
#: the least a range scan reads from one partition's store at a time
MIN_CHUNK = 16
#: a key read's body; the value goes in as JSON text
ENTRY = b'{"key":%b,"value":%b,"partition":%d,"offset":%d,"timestamp":%d}'


class Local:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.node_header = ("x-tablecast-node", node.id)
        self._by_lag: dict[int, Headers] = {}

    def table(self, name: str) -> TableInfo:
        info = self.node.tables.get(name)
        if info is None:
            ingestor = self.node.ingestor
            if not ingestor.catalog.loaded:
                # a node still reading the catalog cannot tell: ask again, or another node
                raise ApiError(
                    "partition_unavailable", "this node is still loading the catalog", RETRY_AFTER
                )
            if name in ingestor.catalog.tables:
                # in the catalog, but its topic not checked yet (a node just started, Kafka
                # slow to answer) or left out until fixed: the table exists, it is not servable
                why = ingestor.left_out.get(name, "its topic is being checked")
                raise ApiError(
                    "partition_unavailable", f"table {name!r} is not served yet: {why}", RETRY_AFTER
                )
            raise ApiError("table_not_found", f"no table named {name!r}")
        return info

    def key_bytes(self, info: TableInfo, text: str) -> bytes:
        """The serialized key for its text form in a URL."""
        if len(text) > self.node.config.max_key_bytes:
            raise ApiError(
                "bad_request", f"key longer than {self.node.config.max_key_bytes} characters"
            )
        serde = info.key_serde
        try:
            return serde.text_to_bytes(text)
        # a serde's parser may fail in its own way (JSON, Avro, int range): all mean bad input
        except (SerdeError, ValueError, TypeError, OverflowError) as e:
            raise ApiError(
                "bad_request", f"key {text!r} is not a {serde.format} key: {e}"
            ) from None

    def readable(self, info: TableInfo, partition: int, max_lag: int | None) -> Replica | None:
        """This node's replica of `partition` if it may answer: caught up, or within `max_lag`,
        or, when no node has a caught-up replica of it, one that has been restored (a
        partition whose writes fail keeps answering what it holds, reported as stale)."""
        slot = (info.name, partition)
        replica = self.node.ingestor.replicas.get(slot)
        if replica is None or replica.closed:
            return None
        if replica.caught_up or (max_lag is not None and replica.lag <= max_lag):
            return replica
        if replica.restored and not self.node.view.candidates(slot):
            return replica
        return None

    def require(self, info: TableInfo, partition: int, max_lag: int | None) -> Replica:
        replica = self.readable(info, partition, max_lag)
        if replica is None:
            raise unavailable(info, partition)
        return replica

    def headers(self, replica: Replica, position: int) -> Headers:
        """The read headers: who answered, the position the answer is exact at, and how far
        behind the topic's end (records and milliseconds) that position was known to be."""
        lag = max(0, replica.end_offset - position)
        cached = replica.position_header
        if cached is None or cached[0] != position:  # reads between two applies share it
            token = position_token(replica.table.name, replica.partition, position)
            cached = replica.position_header = (position, ("x-tablecast-position", token))
        token = cached[1]
        if replica.stale_since is not None:  # rare: behind, or cut off from Kafka
            return [
                self.node_header,
                ("x-tablecast-lag", str(lag)),
                ("x-tablecast-staleness-ms", str(replica.staleness_ms())),
                token,
            ]
        fresh = self._by_lag.get(lag)
        if fresh is None:
            if len(self._by_lag) > 1024:  # lags seen while catching up: start over
                self._by_lag.clear()
            fresh = self._by_lag[lag] = (
                self.node_header,
                ("x-tablecast-lag", str(lag)),
                ("x-tablecast-staleness-ms", "0"),
            )
        return [*fresh, token]

    def read_key(
        self, info: TableInfo, raw: bytes, partition: int, replica: Replica, key_text: str
    ) -> Answer:
        try:
            record, position = replica.read(partial(replica.store.get, raw), raw)
        except StoreClosed:
            raise unavailable(info, partition) from None  # released under this read
        if record is None:
            raise ApiError(
                "key_not_found",
                f"key {key_text!r} is not in {info.name!r}",
                self.headers(replica, position),
            )
        value = info.value_serde
        # %-formatting bytes beats building a dict for orjson by a third on the hot path
        # (JSON values are checked at ingest, so the stored bytes are valid JSON)
        if value.format == "json":
            body = record.value
        else:
            try:
                body = orjson.dumps(value.to_json(record.value))
            except SerdeError:  # stored before values were checked at ingest: unreadable
                raise ApiError(
                    "key_not_found",
                    f"key {key_text!r} is not in {info.name!r}",
                    self.headers(replica, position),
                ) from None
        return (
            200,
            ENTRY
            % (
                orjson.dumps(info.key_serde.to_json(raw)),
                body,
                partition,
                record.offset,
                record.timestamp,
            ),
            self.headers(replica, position),
        )

    def windows(
        self, info: TableInfo, raw: bytes, replica: Replica, time_from: int, time_to: int
    ) -> Answer:
        size = int(info.extra.get("size_ms", 0))
        try:
            entries, position = replica.read(
                partial(
                    replica.store.scan,
                    window_key(raw, time_from),
                    window_key(raw, time_to + 1),
                    MAX_WINDOWS,
                )
            )
        except StoreClosed:
            raise unavailable(info, replica.partition) from None
        vj = info.value_serde.to_json
        items = []
        for k, rec in entries:
            if len(k) != len(raw) + 8:
                continue  # a longer key that shares these bytes, not one of this key's windows
            _, start = split_window_key(k)
            items.append({"start": start, "end": start + size, "value": vj(rec.value)})
        return 200, orjson.dumps({"items": items}), self.headers(replica, position)

    def scan(
        self,
        info: TableInfo,
        partitions: Iterable[int],
        start: bytes | None,
        end: bytes | None,
        limit: int,
        max_lag: int | None,
        scope: Scope | None = None,
    ) -> list[tuple[bytes, Record]]:
        """Up to `limit` entries of these local partitions in [start, end) — and within
        `scope`, the caller's grants — merged in key order.

        Each partition is read a chunk at a time as the merge takes from it, so a
        page holds about `limit` records whatever the partition count, where
        reading `limit` from every partition first would hold partitions × limit.
        """
        replicas = [self.require(info, p, max_lag) for p in partitions]
        spans = [(start, end)] if scope is None else scope.clip(start, end)
        if not replicas or not spans:
            return []
        # a fair share each first: evenly spread keys then take one read per partition
        chunk = min(limit, max(MIN_CHUNK, -(-limit // len(replicas)) + 1))
        rows = (_rows(info, r, spans, chunk, limit) for r in replicas)
        return list(merge_sorted(rows, limit))

    def count(
        self,
        info: TableInfo,
        partitions: Iterable[int],
        max_lag: int | None,
        scope: Scope | None = None,
    ) -> int:
        """Keys in these local partitions; with a `scope`, only those the caller may read."""
        total = 0
        for p in partitions:
            store = self.require(info, p, max_lag).store
            try:
                if scope is None:
                    total += len(store)
                else:
                    total += sum(store.count_range(lo, hi) for lo, hi in scope.spans)
            except StoreClosed:
                raise unavailable(info, p) from None
        return total

    def multi_get(
        self, info: TableInfo, partition: int, raws: Sequence[bytes], max_lag: int | None
    ) -> list[Record | None]:
        try:
            return self.require(info, partition, max_lag).store.multi_get(raws)
        except StoreClosed:
            raise unavailable(info, partition) from None


def position_token(table: str, partition: int, position: int) -> str:
    """``X-Tablecast-Position`` of a one-partition read: every record of `partition` below
    `position` is reflected, none above. Opaque to clients, who pass it back as is."""
    return f"{table}@{partition}:{position}"


def unavailable(info: TableInfo, partition: int) -> ApiError:
    return ApiError(
        "partition_unavailable",
        f"partition {partition} of {info.name!r} has no replica ready yet",
        RETRY_AFTER,
    )


def _rows(
    info: TableInfo, replica: Replica, spans: Sequence[Span], chunk: int, most: int
) -> Iterator[tuple[bytes, Record]]:
    """A partition's entries within `spans` (sorted, disjoint), read `chunk` at a time; the
    chunk doubles up to `most` while the merge keeps taking from this partition."""
    for lo, hi in spans:
        while True:
            try:
                rows = replica.store.scan(lo, hi, chunk)
            except StoreClosed:
                raise unavailable(info, replica.partition) from None
            yield from rows
            if len(rows) < chunk:
                break
            lo = rows[-1][0] + b"\x00"  # the least key after the last one read
            chunk = min(chunk * 2, most)


def merge_sorted(
    pages: Iterable[Iterable[tuple[bytes, Any]]], limit: int
) -> Iterator[tuple[bytes, Any]]:
    """The first `limit` entries of pages each sorted by key, in key order."""
    return islice(heapq.merge(*pages, key=lambda kv: kv[0]), limit)
