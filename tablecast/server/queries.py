"""Query handlers: read the node's stores and render the SPEC's answers (SPEC §3)."""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Awaitable
from typing import Any

import orjson

from tablecast.cluster.node import Node
from tablecast.cluster.replica import Replica
from tablecast.kafka.catalog import TableInfo
from tablecast.kafka.windowed import split_window_key, window_key
from tablecast.serde import SerdeError
from tablecast.server.cursor import Cursors
from tablecast.server.errors import ApiError

Headers = list[tuple[str, str]]
Answer = tuple[int, bytes, Headers]

RETRY_AFTER = [("retry-after", "1")]
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
MAX_BATCH = 1_000
MAX_WAIT_MS = 30_000


class Queries:
    def __init__(self, node: Node, cursors: Cursors) -> None:
        self.node = node
        self.cursors = cursors
        self._node_header = ("x-tablecast-node", node.id)

    # -- lookups shared by every handler -------------------------------------
    def table(self, name: str) -> TableInfo:
        info = self.node.tables.get(name)
        if info is None:
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
        except SerdeError as e:
            raise ApiError(
                "bad_request", f"key {text!r} is not a {serde.format} key: {e}"
            ) from None

    def replica(self, info: TableInfo, partition: int, params: dict[str, str]) -> Replica:
        """The local replica that may answer for `partition`, or 503."""
        replica = self.node.replica(info.name, partition)
        max_lag = int_param(params, "max_lag", None) if params else None
        if replica is not None and replica.caught_up:
            return replica
        if replica is not None and max_lag is not None and replica.lag <= max_lag:
            return replica
        raise ApiError(
            "partition_unavailable",
            f"partition {partition} of {info.name!r} has no replica ready here yet",
            RETRY_AFTER,
        )

    def _headers(self, replica: Replica) -> Headers:
        return [self._node_header, ("x-tablecast-lag", str(replica.lag))]

    # -- point reads -----------------------------------------------------------
    def get_key(
        self, table: str, key_text: str, params: dict[str, str]
    ) -> Answer | Awaitable[Answer]:
        info = self.table(table)
        if info.kind != "kv":
            raise ApiError(
                "bad_request", f"{table!r} is a window table: read /keys/{{key}}/windows"
            )
        raw = self.key_bytes(info, key_text)
        partition = info.partition_of(raw)
        replica = self.replica(info, partition, params)
        if "min_offset" in params:
            return self._after_offset(
                replica, params, lambda: self._read_key(info, raw, partition, replica, key_text)
            )
        return self._read_key(info, raw, partition, replica, key_text)

    def _read_key(
        self, info: TableInfo, raw: bytes, partition: int, replica: Replica, key_text: str
    ) -> Answer:
        headers = self._headers(replica)
        record = replica.store.get(raw)
        if record is None:
            raise ApiError("key_not_found", f"key {key_text!r} is not in {info.name!r}", headers)
        body = orjson.dumps(
            {
                "key": info.key_serde.to_json(raw),
                "value": info.value_serde.to_json(record.value),
                "partition": partition,
                "offset": record.offset,
                "timestamp": record.timestamp,
            }
        )
        return 200, body, headers

    async def _after_offset(self, replica: Replica, params: dict[str, str], read: Any) -> Answer:
        """Monotonic reads: wait until `replica` applied the offset `min_offset=P:O` names."""
        text = params["min_offset"]
        p_text, _, o_text = text.partition(":")
        try:
            want_partition, want_offset = int(p_text), int(o_text)
        except ValueError:
            raise ApiError(
                "bad_request", f"min_offset must be PARTITION:OFFSET, not {text!r}"
            ) from None
        if want_partition != replica.partition:
            raise ApiError(
                "bad_request",
                f"min_offset names partition {want_partition}, the key is in {replica.partition}",
            )
        timeout_ms = int_param(params, "timeout_ms", 1000)
        if timeout_ms > MAX_WAIT_MS:
            raise ApiError("bad_request", f"timeout_ms is at most {MAX_WAIT_MS}")
        deadline = time.monotonic() + timeout_ms / 1000
        while replica.store.applied_offset < want_offset:
            if time.monotonic() >= deadline:
                raise ApiError(
                    "timeout",
                    f"offset {want_offset} of partition {want_partition} "
                    f"not applied within {timeout_ms} ms",
                )
            await asyncio.sleep(0.005)
        return read()

    def batch_get(self, table: str, body: bytes, params: dict[str, str]) -> Answer:
        info = self.table(table)
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ApiError("bad_request", 'the body must be JSON: {"keys": [...]}') from None
        keys = request.get("keys") if isinstance(request, dict) else None
        if not isinstance(keys, list):
            raise ApiError("bad_request", 'the body must be {"keys": [...]}')
        if len(keys) > MAX_BATCH:
            raise ApiError("bad_request", f"at most {MAX_BATCH} keys per batch")
        serde = info.key_serde
        raws: list[bytes] = []
        for key in keys:
            try:
                raws.append(serde.serialize(serde.from_json(key)))
            except SerdeError as e:
                raise ApiError(
                    "bad_request", f"key {key!r} is not a {serde.format} key: {e}"
                ) from None
        by_partition: dict[int, list[int]] = {}
        for i, raw in enumerate(raws):
            by_partition.setdefault(info.partition_of(raw), []).append(i)
        found: list[Any] = [None] * len(raws)
        for partition, idx in by_partition.items():
            store = self.replica(info, partition, params).store
            for i, record in zip(idx, store.multi_get([raws[i] for i in idx]), strict=True):
                found[i] = record
        value_json = info.value_serde.to_json
        results = [
            {"key": key, "found": True, "value": value_json(rec.value)}
            if rec is not None
            else {"key": key, "found": False}
            for key, rec in zip(keys, found, strict=True)
        ]
        return 200, orjson.dumps({"results": results}), [self._node_header]

    # -- scans -----------------------------------------------------------------
    def range(self, table: str, params: dict[str, str]) -> Answer:
        info = self.table(table)
        if info.kind != "kv":
            raise ApiError(
                "bad_request", f"{table!r} is a window table: read /keys/{{key}}/windows"
            )
        limit = int_param(params, "limit", DEFAULT_LIMIT)
        if not 1 <= limit <= MAX_LIMIT:
            raise ApiError("bad_request", f"limit must be between 1 and {MAX_LIMIT}")
        start = self.key_bytes(info, params["from"]) if "from" in params else None
        end = self.key_bytes(info, params["to"]) if "to" in params else None
        if "prefix" in params:
            prefix = prefix_bytes(info, params["prefix"])
            start = prefix if start is None else max(start, prefix)
            after = prefix_end(prefix)
            end = after if end is None else (end if after is None else min(end, after))
        query = [params.get("from"), params.get("to"), params.get("prefix")]
        if params.get("cursor"):
            last = self.cursors.decode(params["cursor"], query)
            start = last + b"\x00"  # the next key after `last` in byte order
        if start is not None and end is not None and start >= end:
            return 200, b'{"items":[],"next_cursor":null}', []
        pages = [
            self.replica(info, p, params).store.scan(start, end, limit + 1)
            for p in range(info.partitions)
        ]
        merged = list(_take(heapq.merge(*pages, key=lambda kv: kv[0]), limit + 1))
        more = len(merged) > limit
        merged = merged[:limit]
        kj, vj = info.key_serde.to_json, info.value_serde.to_json
        body = {
            "items": [{"key": kj(k), "value": vj(rec.value)} for k, rec in merged],
            "next_cursor": self.cursors.encode(merged[-1][0], query) if more else None,
        }
        return 200, orjson.dumps(body), [self._node_header]

    def windows(self, table: str, key_text: str, params: dict[str, str]) -> Answer:
        info = self.table(table)
        if info.kind != "window":
            raise ApiError("bad_request", f"{table!r} is not a window table")
        raw = self.key_bytes(info, key_text)
        time_from = int_param(params, "from", 0)
        time_to = int_param(params, "to", 2**62)
        partition = info.partition_of(raw)
        replica = self.replica(info, partition, params)
        size = int(info.extra.get("size_ms", 0))
        entries = replica.store.scan(
            window_key(raw, time_from), window_key(raw, time_to + 1), MAX_LIMIT
        )
        vj = info.value_serde.to_json
        items = []
        for k, rec in entries:
            if len(k) != len(raw) + 8:
                continue  # a longer key that shares these bytes, not one of this key's windows
            _, start = split_window_key(k)
            items.append({"start": start, "end": start + size, "value": vj(rec.value)})
        return 200, orjson.dumps({"items": items}), self._headers(replica)

    def count(self, table: str, params: dict[str, str]) -> Answer:
        info = self.table(table)
        total = sum(len(self.replica(info, p, params).store) for p in range(info.partitions))
        return 200, orjson.dumps({"count": total}), [self._node_header]

    def metadata(self, table: str, key_text: str) -> Answer:
        info = self.table(table)
        partition = info.partition_of(self.key_bytes(info, key_text))
        replica = self.node.replica(info.name, partition)
        active = (
            {"node": self.node.id, "url": self.node.config.url}
            if replica and replica.caught_up
            else None
        )
        return 200, orjson.dumps({"partition": partition, "active": active, "standbys": []}), []


def _take(it: Any, n: int) -> Any:
    for i, item in enumerate(it):
        if i >= n:
            return
        yield item


def prefix_bytes(info: TableInfo, text: str) -> bytes:
    """A prefix of serialized keys: the text's UTF-8 bytes (string and compact-JSON keys)."""
    fmt = info.key_serde.format
    if fmt in ("string", "json"):
        return text.encode()
    if fmt == "bytes":
        try:
            return text.encode("latin-1")
        except UnicodeEncodeError:
            raise ApiError("bad_request", "a bytes prefix is latin-1 text") from None
    raise ApiError("bad_request", f"prefix scans need string, json or bytes keys, not {fmt}")


def prefix_end(prefix: bytes) -> bytes | None:
    """The least byte string above every one that starts with `prefix` (None: no bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def int_param(params: dict[str, str], name: str, default: int | None) -> Any:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError("bad_request", f"{name} must be an integer, not {text!r}") from None
    if value < 0:
        raise ApiError("bad_request", f"{name} must not be negative")
    return value
