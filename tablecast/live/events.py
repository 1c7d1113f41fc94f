"""What a watch sends: table rows and changes, rendered once and shared by every watcher.

A :class:`Change` is one table-topic record (or one snapshot row). Its JSON
(``{"key", "value", "partition", "offset", "timestamp"}``) is rendered once, on
first use, and so is each transport's whole event when the token is the
change's own one-partition token: the thousand watchers of one key then share
one bytes object per change instead of a thousand renderings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from tablecast.contract.table_info import TableInfo
from tablecast.live.resume_token import single

SNAPSHOT, READY, CHANGE, ERROR = "snapshot", "ready", "change", "error"
_DATA = b'{"key":%b,"value":%b,"partition":%d,"offset":%d,"timestamp":%d}'


class Renderer:
    """A table's keys and values as JSON text (its serdes, looked up once)."""

    __slots__ = ("_key", "_value", "raw_json_values", "table", "table_quoted")

    def __init__(self, info: TableInfo) -> None:
        from urllib.parse import quote

        self.table = info.name
        self.table_quoted = quote(info.name, safe="")
        self._key = info.key_serde.to_json
        self._value = info.value_serde.to_json
        #: JSON values are checked when read from the topic: spliced in as stored
        self.raw_json_values = info.value_serde.format == "json"

    def key(self, raw: bytes) -> bytes:
        return orjson.dumps(self._key(raw))

    def key_object(self, raw: bytes) -> Any:
        return self._key(raw)

    def value(self, raw: bytes | None) -> bytes:
        if raw is None:
            return b"null"
        if self.raw_json_values:
            return raw
        return orjson.dumps(self._value(raw))


class Change:
    """One record of a table partition: an upsert, or a delete (value None)."""

    __slots__ = (
        "_data",
        "_shared",
        "_value_json",
        "key",
        "offset",
        "partition",
        "renderer",
        "timestamp",
        "value",
    )

    def __init__(
        self,
        renderer: Renderer,
        partition: int,
        key: bytes,
        value: bytes | None,
        offset: int,
        timestamp: int,
    ) -> None:
        self.renderer = renderer
        self.partition = partition
        self.key = key
        self.value = value
        self.offset = offset
        self.timestamp = timestamp
        self._data: bytes | None = None
        self._value_json: bytes | None = None
        #: per encoder: the whole event with the one-partition token, shared by its watchers
        self._shared: dict[str, Any] | None = None

    @classmethod
    def rendered(
        cls,
        renderer: Renderer,
        partition: int,
        key: bytes,
        value_json: bytes,
        offset: int,
        timestamp: int,
    ) -> Change:
        """A row whose value came already rendered as JSON (from a peer)."""
        change = cls(renderer, partition, key, None, offset, timestamp)
        change._value_json = value_json
        return change

    @property
    def value_json(self) -> bytes:
        """The value as JSON text (``null``: deleted)."""
        value = self._value_json
        if value is None:
            value = self._value_json = self.renderer.value(self.value)
        return value

    @property
    def data(self) -> bytes:
        data = self._data
        if data is None:
            r = self.renderer
            data = self._data = _DATA % (
                r.key(self.key),
                self.value_json,
                self.partition,
                self.offset,
                self.timestamp,
            )
        return data

    @property
    def single_token(self) -> str:
        """The token after this change for a watch over its partition only."""
        return single(self.renderer.table_quoted, self.partition, self.offset + 1)

    def shared(self, encoder: Encoder) -> Any:
        """The change event as `encoder` puts it, with the one-partition token (rendered once
        for all the watchers of this partition that use that encoder)."""
        cache = self._shared
        if cache is None:
            cache = self._shared = {}
        event = cache.get(encoder.name)
        if event is None:
            event = cache[encoder.name] = encoder.encode(CHANGE, self.single_token, self)
        return event


class Encoder:
    """How one transport writes events. Subclasses say how; ``name`` is for metrics."""

    name = "?"

    def encode(self, kind: str, token: str | None, change: Change | None, extra: Any = None) -> Any:
        raise NotImplementedError

    def keep_alive(self, token: str | None) -> Any:
        raise NotImplementedError


class SseEncoder(Encoder):
    """``text/event-stream``: ``id:``, ``event:`` and one ``data:`` line per event."""

    name = "sse"

    def encode(
        self, kind: str, token: str | None, change: Change | None, extra: Any = None
    ) -> bytes:
        data = change.data if change is not None else orjson.dumps(extra or {})
        if token is None:
            return b"event: %b\ndata: %b\n\n" % (kind.encode(), data)
        return b"id: %b\nevent: %b\ndata: %b\n\n" % (token.encode(), kind.encode(), data)

    def keep_alive(self, token: str | None) -> bytes:
        # an id with no data moves the client's Last-Event-ID without firing an event
        # (HTML's EventSource: "dispatch the event" sets the id, then returns on empty data),
        # so a quiet watch's resume point stays recent
        if token is None:
            return b": keep-alive\n\n"
        return b": keep-alive\nid: %b\n\n" % token.encode()


class WsEncoder(Encoder):
    """WebSocket: one JSON text message per event, ``{"event", "id", "data"}``."""

    name = "websocket"

    def encode(self, kind: str, token: str | None, change: Change | None, extra: Any = None) -> str:
        data = change.data if change is not None else orjson.dumps(extra or {})
        return (
            b'{"event":%b,"id":%b,"data":%b}' % (orjson.dumps(kind), orjson.dumps(token), data)
        ).decode()

    def keep_alive(self, token: str | None) -> str:
        return orjson.dumps({"event": "keep-alive", "id": token}).decode()


SSE = SseEncoder()
WS = WsEncoder()

Check = Callable[[bytes, bytes | None], str | None]
