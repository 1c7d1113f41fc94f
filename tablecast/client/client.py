"""``tablecast.Client``: asks the node that owns a key, directly.

It reads ``/v1/tables`` and ``/v1/cluster`` once, computes a key's partition
itself (Kafka's murmur2, as the nodes do) and sends the request to that
partition's active replica, skipping the forwarding hop. When that node cannot
be reached it tries the standbys, then any node (every node answers every
key); when an answer comes from another node than the one asked, or a node
fails, the map is stale and is read again.

Monotonic reads: the client keeps, per table, the latest position its answers
carried (``X-Tablecast-Position``, merged partition by partition) and sends it
with every read of that table (``X-Tablecast-After``), so no answer is older
than one it has seen, whichever node answers — also across hand-overs.
``Client(..., monotonic=False)`` switches that off. :meth:`Client.wrote` adds
a producer's acknowledged table-topic record to the position (read-your-writes).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from tablecast import serde as serdes
from tablecast.client.watch import Resumer, WatchEvent, watch_async, watch_params, watch_sync
from tablecast.kafka import indexes, positions
from tablecast.kafka.partitioner import partition_for

REFRESH_MIN_INTERVAL_S = 0.5
AFTER = "x-tablecast-after"
#: a time: epoch milliseconds, a datetime (naive: UTC) or ISO-8601 text
Time = int | dt.datetime | str


@dataclass(frozen=True)
class Read:
    """One key read: the record (None: the key is absent) and the answer's headers."""

    record: dict[str, Any] | None
    #: the node that read its store
    node: str | None
    #: ``X-Tablecast-Position``: the answer is exact at this position of the key's partition
    position: str | None
    #: records, and milliseconds, the answering replica was behind its topic's end
    lag: int | None
    staleness_ms: int | None


class QueryError(Exception):
    """A query the cluster answered with an error (the API's error code and message)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class Client:
    def __init__(
        self,
        urls: str | Sequence[str],
        token: str | None = None,
        timeout: float = 5.0,
        retries: int = 3,
        verify: str | bool = True,
        monotonic: bool = True,
    ) -> None:
        """`verify`: for https:// nodes, the CA file that signed their certificates
        (True: the system's CAs; False: no check, never in production). `monotonic`:
        send each table's latest position seen with every read of it (no answer older
        than one already seen)."""
        self.seeds = [urls] if isinstance(urls, str) else list(urls)
        if not self.seeds:
            raise ValueError("give at least one node URL")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._headers = headers
        self._verify = _ssl_context(verify)
        self._http = httpx.Client(timeout=timeout, headers=headers, verify=self._verify)
        self.retries = retries
        self._tables: dict[str, dict[str, Any]] = {}
        #: (table, partition) -> node URLs, the active first
        self._owners: dict[tuple[str, int], list[str]] = {}
        self._nodes: list[str] = list(self.seeds)
        self._refreshed = 0.0
        self.monotonic = monotonic
        #: table -> the latest position its answers carried (and writes acknowledged)
        self._positions: dict[str, positions.Position] = {}

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the cluster map ---------------------------------------------------------
    def refresh(self) -> None:
        last: Exception | None = None
        for url in [*self._nodes, *self.seeds]:
            try:
                tables = self._http.get(f"{url}/v1/tables").raise_for_status().json()["tables"]
                nodes = self._http.get(f"{url}/v1/cluster").raise_for_status().json()["nodes"]
            except (httpx.HTTPError, ValueError, KeyError) as e:
                last = e
                continue
            self._tables = {t["name"]: t for t in tables}
            owners: dict[tuple[str, int], list[tuple[int, str]]] = {}
            rank = {"active": 0, "standby": 1, "warming": 2}
            for node in nodes:
                for r in node["replicas"]:
                    owners.setdefault((r["table"], r["partition"]), []).append(
                        (rank[r["role"]], node["url"])
                    )
            self._owners = {slot: [u for _, u in sorted(us)] for slot, us in owners.items()}
            self._nodes = [n["url"] for n in nodes] or self._nodes
            self._refreshed = time.monotonic()
            return
        raise ConnectionError(f"no node answered: {last}")

    def _maybe_refresh(self) -> None:
        if time.monotonic() - self._refreshed >= REFRESH_MIN_INTERVAL_S:
            # on failure keep the old map: the next failure tries again
            with contextlib.suppress(ConnectionError):
                self.refresh()

    def _candidates(self, table: str, key: Any) -> list[str]:
        if not self._tables:
            self.refresh()
        info = self._tables.get(table)
        urls: list[str] = []
        if info is not None and info["key_format"] in ("string", "json", "long", "bytes"):
            raw = serdes.from_spec({"format": info["key_format"]}).serialize(key)
            urls = list(self._owners.get((table, partition_for(raw, info["partitions"])), []))
        return urls + [u for u in self._nodes if u not in urls]

    # -- positions ---------------------------------------------------------------
    @staticmethod
    def token_for(table: str, partition: int, offset: int) -> str:
        """The position token of a record acknowledged at `offset` of `partition` of the
        table's topic: a read ``after`` it reflects that record (or something later)."""
        return positions.after_record(table, [(partition, offset)]).text()

    def position(self, table: str) -> str | None:
        """The latest position of `table` this client has seen (None: none yet)."""
        known = self._positions.get(table)
        return None if known is None else known.text()

    def observe(self, token: str) -> None:
        """Take in a position token from elsewhere (another client, a watch event's id):
        later reads of its table are at least that fresh."""
        self._merge(positions.parse(token))

    def wrote(self, table: str, partition: int, offset: int) -> None:
        """Read-your-writes: a producer's record acknowledged at `offset` of `partition` of
        the table's own topic (written directly, in the pipeline's format) is seen by every
        later read of `table` through this client."""
        self._merge(positions.after_record(table, [(partition, offset)]))

    def _merge(self, position: positions.Position) -> None:
        known = self._positions.get(position.table)
        self._positions[position.table] = position if known is None else known.merge(position)

    def _seen(self, r: httpx.Response) -> None:
        token = r.headers.get("x-tablecast-position")
        if token:
            with contextlib.suppress(ValueError):  # not ours to judge: keep reading
                self._merge(positions.parse(token))

    # -- requests ----------------------------------------------------------------
    def _send(
        self, urls: list[str], method: str, path: str, table: str | None = None, **kw: Any
    ) -> httpx.Response:
        """The first answer of a node to the request; with `table` and monotonic reads, it
        is at least as fresh as every answer seen of that table (a node that could not
        catch up in time answers 504, and the next node is asked)."""
        known = self._positions.get(table) if table is not None and self.monotonic else None
        if known is not None:
            kw["headers"] = {**kw.get("headers", {}), AFTER: known.text()}
        last: Exception | None = None
        for attempt in range(self.retries):
            for url in urls:
                try:
                    r = self._http.request(method, url + path, **kw)
                except httpx.HTTPError as e:
                    last = e
                    self._maybe_refresh()
                    continue
                if r.status_code in (503, 504):
                    code = "partition_unavailable" if r.status_code == 503 else "timeout"
                    last = QueryError(r.status_code, code, r.text)
                    continue
                node = r.headers.get("x-tablecast-node")
                if node and not url.endswith(node.split("://")[-1]):
                    self._maybe_refresh()  # answered through a forward: our map is behind
                if table is not None:
                    self._seen(r)
                return r
            time.sleep(0.05 * (attempt + 1))
        if isinstance(last, QueryError):
            raise last
        raise ConnectionError(f"{method} {path}: no node answered ({last})")

    @staticmethod
    def _check(r: httpx.Response) -> Any:
        body = r.json()
        if r.status_code >= 400:
            err = body.get("error", {})
            raise QueryError(r.status_code, err.get("code", "unknown"), err.get("message", ""))
        return body

    def get(
        self, table: str, key: Any, as_of: Time | None = None, **params: Any
    ) -> dict[str, Any] | None:
        """The key's record ({"key", "value", "partition", "offset", "timestamp"}), or None;
        with `as_of`, the version valid at that time (a table with a history)."""
        return self.read(table, key, as_of, **params).record

    def read(self, table: str, key: Any, as_of: Time | None = None, **params: Any) -> Read:
        """The key's record (None: absent) with what the answering node said of its
        freshness: the position the answer is exact at, its lag and staleness."""
        if as_of is not None:
            params["as_of"] = _time(as_of)
        path, params = _key_route(table, key, "", params)
        r = self._send(self._candidates(table, key), "GET", path, table, params=params or None)
        if r.status_code == 404 and r.json().get("error", {}).get("code") == "key_not_found":
            record = None
        else:
            record = self._check(r)
        h = r.headers
        return Read(
            record,
            h.get("x-tablecast-node"),
            h.get("x-tablecast-position"),
            _int_or_none(h.get("x-tablecast-lag")),
            _int_or_none(h.get("x-tablecast-staleness-ms")),
        )

    def batch_get(self, table: str, keys: Sequence[Any]) -> list[dict[str, Any]]:
        r = self._send(
            self._nodes,
            "POST",
            f"/v1/tables/{quote(table, safe='')}/keys:batchGet",
            table,
            content=orjson.dumps({"keys": list(keys)}),
        )
        return self._check(r)["results"]

    def range(
        self,
        table: str,
        from_: Any = None,
        to: Any = None,
        prefix: str | None = None,
        page_size: int = 1000,
        as_of: Time | None = None,
    ) -> Iterator[tuple[Any, Any]]:
        """Every (key, value) in byte order, following the cursors page by page; with
        `as_of`, the table as it was at that time (a table with a history)."""
        params: dict[str, Any] = {"limit": page_size}
        if from_ is not None:
            params["from"] = _text(from_)
        if to is not None:
            params["to"] = _text(to)
        if prefix is not None:
            params["prefix"] = prefix
        if as_of is not None:
            params["as_of"] = _time(as_of)
        for item in self._pages(table, f"/v1/tables/{quote(table, safe='')}/range", params):
            yield item["key"], item["value"]

    def history(
        self,
        table: str,
        key: Any,
        from_: Time | None = None,
        to: Time | None = None,
        page_size: int = 1000,
    ) -> Iterator[dict[str, Any]]:
        """The key's versions with from_ <= timestamp < to, oldest first: {"value",
        "timestamp", "offset"} (a delete is a version with value None)."""
        params: dict[str, Any] = {"limit": page_size}
        if from_ is not None:
            params["from"] = _time(from_)
        if to is not None:
            params["to"] = _time(to)
        path, params = _key_route(table, key, "history", params)
        urls = self._candidates(table, key)
        while True:
            page = self._check(self._send(urls, "GET", path, table, params=params))
            yield from page["items"]
            if not page["next_cursor"]:
                return
            params["cursor"] = page["next_cursor"]

    def index(
        self, table: str, name: str, value: Any, page_size: int = 1000
    ) -> Iterator[tuple[Any, Any]]:
        """Every (key, value) of the rows whose value under index `name` is `value`, by key."""
        path = f"/v1/tables/{quote(table, safe='')}/index/{quote(name, safe='')}/" + quote(
            _index_text(value), safe=""
        )
        for item in self._pages(table, path, {"limit": page_size}):
            yield item["key"], item["value"]

    def index_range(
        self, table: str, name: str, from_: Any = None, to: Any = None, page_size: int = 1000
    ) -> Iterator[tuple[Any, Any, Any]]:
        """Every (index value, key, value) with from_ <= index value < to, by index value
        then key (numbers before strings)."""
        params: dict[str, Any] = {"limit": page_size}
        if from_ is not None:
            params["from"] = _index_text(from_)
        if to is not None:
            params["to"] = _index_text(to)
        path = f"/v1/tables/{quote(table, safe='')}/index/{quote(name, safe='')}"
        for item in self._pages(table, path, params):
            yield item["index"], item["key"], item["value"]

    def _pages(self, table: str, path: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        while True:
            page = self._check(self._send(self._nodes, "GET", path, table, params=params))
            yield from page["items"]
            if not page["next_cursor"]:
                return
            params["cursor"] = page["next_cursor"]

    def owned(self, node_url: str, table: str, page_size: int = 1000) -> Iterator[tuple[Any, Any]]:
        """Every (key, value) of the partitions `node_url` answers for as active.

        Run a job beside each node over ``owned(that_node, table)`` and every key
        is handled exactly once across the cluster, however many nodes there are.
        """
        params: dict[str, Any] = {"limit": page_size, "owned": "true"}
        path = f"/v1/tables/{quote(table, safe='')}/range"
        while True:
            page = self._check(self._http.get(node_url.rstrip("/") + path, params=params))
            for item in page["items"]:
                yield item["key"], item["value"]
            if not page["next_cursor"]:
                return
            params["cursor"] = page["next_cursor"]

    def windows(
        self, table: str, key: Any, from_ms: int | None = None, to_ms: int | None = None
    ) -> list[dict[str, Any]]:
        params = {k: v for k, v in (("from", from_ms), ("to", to_ms)) if v is not None}
        path, params = _key_route(table, key, "windows", params)
        r = self._send(self._candidates(table, key), "GET", path, table, params=params or None)
        return self._check(r)["items"]

    def count(self, table: str) -> int:
        return self._check(
            self._send(self._nodes, "GET", f"/v1/tables/{quote(table, safe='')}/count", table)
        )["count"]

    def watch(
        self,
        table: str,
        key: Any | Sequence[Any] | None = None,
        prefix: str | None = None,
        start: Any = None,
        end: Any = None,
        snapshot: bool = True,
        since: str | None = None,
    ) -> Iterator[WatchEvent]:
        """The table's rows (`key`: one key or a list; `prefix`; or keys in [`start`, `end`))
        as a snapshot, then every change, for as long as you iterate.

        Events: ``snapshot`` rows, ``ready`` once the snapshot is complete, then
        ``change`` (``value`` None: deleted), in offset order per partition. When
        a node fails the watch resumes on another with the last event's id, with
        no gap and no duplicate; `since` resumes from an id you kept.
        """
        resumer = self._resumer(table, key, prefix, start, end, snapshot, since)
        return watch_sync(self._http, resumer, self._maybe_refresh)

    async def awatch(
        self,
        table: str,
        key: Any | Sequence[Any] | None = None,
        prefix: str | None = None,
        start: Any = None,
        end: Any = None,
        snapshot: bool = True,
        since: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """:meth:`watch` for asyncio (``async for event in client.awatch(...)``)."""
        resumer = self._resumer(table, key, prefix, start, end, snapshot, since, refresh=False)
        async with httpx.AsyncClient(headers=self._headers, verify=self._verify) as http:
            async for event in watch_async(http, resumer):
                yield event

    def _resumer(
        self,
        table: str,
        key: Any,
        prefix: str | None,
        start: Any,
        end: Any,
        snapshot: bool,
        since: str | None,
        refresh: bool = True,
    ) -> Resumer:
        params = watch_params(key, prefix, start, end, snapshot, _text)
        one = key[0] if isinstance(key, list | tuple) and key else key
        if refresh and one is not None and not isinstance(key, set | frozenset):

            def nodes() -> list[str]:
                return self._candidates(table, one)  # its owner reads the snapshot locally
        else:

            def nodes() -> list[str]:
                return list(dict.fromkeys([*self._nodes, *self.seeds]))

        resumer = Resumer(table, params, nodes)
        resumer.parser.last_id = since
        return resumer

    def tables(self) -> list[dict[str, Any]]:
        return self._check(self._send(self._nodes, "GET", "/v1/tables"))["tables"]

    def cluster(self) -> dict[str, Any]:
        return self._check(self._send(self._nodes, "GET", "/v1/cluster"))


def _int_or_none(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _text(key: Any) -> str:
    """A key's text form in URLs: strings as they are, numbers as digits, anything else as JSON."""
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        return key.decode("latin-1")
    return orjson.dumps(key).decode()


def _time(t: Time) -> str:
    """A time as the API takes it: epoch ms, or ISO-8601 (a naive datetime is UTC)."""
    if isinstance(t, dt.datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        return str((t - _EPOCH) // dt.timedelta(milliseconds=1))
    return str(t)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _index_text(value: Any) -> str:
    """An index value as a URL writes it: a string as is unless it would read as a number
    or as quoted JSON (then JSON-quoted), a number as JSON."""
    if isinstance(value, str) and indexes.parse_text(value) == value:
        return value
    indexes.encode_value(value)  # refuses what no index holds
    return orjson.dumps(value).decode()


def _ssl_context(verify: str | bool) -> ssl.SSLContext | bool:
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return verify


def _key_route(
    table: str, key: Any, sub: str, params: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """A key route's path and parameters: the key in the path, or in ?key= when its text
    ends like a sub-route (a server sees the path decoded, so /a%2Fwindows reads as one)."""
    text, t = _text(key), quote(table, safe="")
    if text.endswith(("/windows", "/metadata", "/history")):
        return f"/v1/tables/{t}/{sub or 'keys'}", {**params, "key": text}
    return f"/v1/tables/{t}/keys/{quote(text, safe='')}" + (f"/{sub}" if sub else ""), params
