"""``tablecast.Client``: asks the node that owns a key, directly.

It reads ``/v1/tables`` and ``/v1/cluster`` once, computes a key's partition
itself (by the partitioner `/v1/tables` names, as the nodes do) and sends the request to that
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

Names: every method takes the HTTP API's parameters by their names there —
``from_``/``to`` for ``from``/``to`` (``from`` is a Python keyword), ``prefix``,
``as_of``, ``order``, ``limit``, ``cursor`` — and every read the options every read
route takes (``after``, ``max_lag``, ``max_staleness_ms``, ``min_offset``,
``timeout_ms``). Earlier spellings (``windows(from_ms=, to_ms=)``, ``watch(start=,
end=)``) still work, with a DeprecationWarning. Paged reads (range, history, index,
index_range, owned) return :class:`Pages`: their items as before, the cursors followed
for you, at most ``limit`` of them, and the ``next_cursor`` that continues after them.

Errors: an error answer raises :class:`QueryError` (a refused token: :class:`AuthError`,
a subclass), also one that is not the API's JSON (a proxy's HTML page: its status and
the start of its text); ``ConnectionError`` when no node could be reached. 503 and 504
are asked of the next node, and after each round of them the client pauses (for a 503's
or 429's ``Retry-After``, up to ``max_retry_wait``) and goes round again, ``retries``
rounds in all.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import email.utils
import ssl
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypedDict, TypeVar, Unpack
from urllib.parse import quote

import httpx
import orjson

from tablecast import serde as serdes
from tablecast.client.errors import AuthError, QueryError
from tablecast.client.watch import Resumer, WatchEvent, watch_async, watch_params, watch_sync
from tablecast.contract import index_codec, positions
from tablecast.contract.partitioner import DEFAULT as DEFAULT_PARTITIONER
from tablecast.contract.partitioner import HASHES, partition_for

REFRESH_MIN_INTERVAL_S = 0.5
AFTER = "x-tablecast-after"
#: the longest Retry-After a client waits unless told otherwise (Client(max_retry_wait=))
MAX_RETRY_WAIT_S = 10.0
#: answers asked again after a pause: over the caller's rate, no replica ready, too slow
RETRIED = frozenset({429, 503, 504})
#: how much of a body that is not the API's JSON an error quotes
TEXT_START = 200
PAGE_SIZE = 1000
#: a time: epoch milliseconds, a datetime (naive: UTC) or ISO-8601 text
Time = int | dt.datetime | str
T = TypeVar("T")


class ReadOptions(TypedDict, total=False):
    """What every read takes besides its own parameters, named as in the HTTP API: who may
    answer, and how fresh the answer must be (docs/http-api.md)."""

    #: a position token: answered from a replica at least that far (merged with the
    #: client's own position of the table, which monotonic reads send anyway)
    after: str
    max_lag: int
    max_staleness_ms: int
    min_offset: str
    timeout_ms: int


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


class Pages(Generic[T]):
    """The items of a paged read, asked for page by page as they are iterated.

    With ``limit``, at most that many items — what one HTTP answer with ``?limit=``
    holds — and then :attr:`next_cursor` continues after them, as that answer's
    ``next_cursor`` does (pass it as ``cursor=`` with the same other arguments).
    """

    def __init__(
        self,
        fetch: Callable[[dict[str, Any]], dict[str, Any]],
        params: dict[str, Any],
        item: Callable[[dict[str, Any]], T],
        limit: int | None,
        page_size: int,
    ) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, not {page_size}")
        #: the cursor of the last page read (None: nothing follows it); read it once the
        #: iteration has ended
        self.next_cursor: str | None = params.get("cursor")
        self._items = self._follow(fetch, params, item, limit, page_size)

    def __iter__(self) -> Pages[T]:
        return self

    def __next__(self) -> T:
        return next(self._items)

    def _follow(
        self,
        fetch: Callable[[dict[str, Any]], dict[str, Any]],
        params: dict[str, Any],
        item: Callable[[dict[str, Any]], T],
        left: int | None,
        page_size: int,
    ) -> Iterator[T]:
        while True:
            # never more than `limit` in all: the last page ends where the limit does, so
            # its cursor is exactly where the next read starts
            page = fetch({**params, "limit": page_size if left is None else min(left, page_size)})
            self.next_cursor = page["next_cursor"]
            for raw in page["items"]:
                yield item(raw)
            if left is not None:
                left -= len(page["items"])
                if left <= 0:
                    return
            if not self.next_cursor:
                return
            params = {**params, "cursor": self.next_cursor}


def _written_key(info: dict[str, Any], key: Any) -> bytes | None:
    """The bytes the table's writer gave `key` (they chose its partition), as a node
    rebuilds them; None for a key format the client does not place itself."""
    fmt = info["key_format"]
    if fmt in ("string", "json", "long", "bytes"):
        return serdes.from_spec({"format": fmt}).serialize(key)
    layout = info.get("key_layout")
    if fmt == "debezium" and layout:
        keys = serdes.from_spec({"format": "debezium", **layout})
        return keys.writer_bytes(keys.serialize(key))  # type: ignore[attr-defined, no-any-return]
    return None


class Client:
    def __init__(
        self,
        urls: str | Sequence[str],
        token: str | None = None,
        timeout: float = 5.0,
        retries: int = 3,
        verify: str | bool = True,
        monotonic: bool = True,
        max_retry_wait: float = MAX_RETRY_WAIT_S,
    ) -> None:
        """`verify`: for https:// nodes, the CA file that signed their certificates
        (True: the system's CAs; False: no check, never in production). `monotonic`:
        send each table's latest position seen with every read of it (no answer older
        than one already seen). `retries`: how many rounds of the nodes a request makes
        at most; `max_retry_wait`: the longest pause between two (seconds) — a
        ``Retry-After`` asking for more is not waited for: its error is raised."""
        self.seeds = [urls] if isinstance(urls, str) else list(urls)
        if not self.seeds:
            raise ValueError("give at least one node URL")
        if retries < 1:
            raise ValueError(f"retries must be at least 1, not {retries}")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._headers = headers
        self._verify = _ssl_context(verify)
        self._http = httpx.Client(timeout=timeout, headers=headers, verify=self._verify)
        self.retries = retries
        self.max_retry_wait = max_retry_wait
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
        """Read the tables and which node holds which partition again (raises
        :class:`AuthError` for a refused token, ConnectionError when no node answers)."""
        self._refresh(self.retries)

    def _refresh(self, rounds: int) -> None:
        urls = list(dict.fromkeys([*self._nodes, *self.seeds]))
        # refresh=False: a failure in here must not start another refresh
        tables = _field(
            self._send(urls, "GET", "/v1/tables", refresh=False, rounds=rounds), "tables"
        )
        nodes = _field(
            self._send(urls, "GET", "/v1/cluster", refresh=False, rounds=rounds), "nodes"
        )
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

    def _maybe_refresh(self) -> None:
        if time.monotonic() - self._refreshed >= REFRESH_MIN_INTERVAL_S:
            # on failure keep the old map: the next failure tries again (and a refused
            # token is the answer of the request under way, raised from there)
            with contextlib.suppress(ConnectionError, QueryError):
                self._refresh(1)

    def _candidates(self, table: str, key: Any) -> list[str]:
        if not self._tables:
            self.refresh()
        info = self._tables.get(table)
        urls: list[str] = []
        raw = None if info is None else _written_key(info, key)
        partitioner = None if info is None else info.get("partitioner", DEFAULT_PARTITIONER)
        if raw is not None and partitioner in HASHES:  # older nodes name none: murmur2
            partition = partition_for(raw, info["partitions"], partitioner)  # type: ignore[index]
            urls = list(self._owners.get((table, partition), []))
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

    def _after(self, table: str | None, params: dict[str, Any]) -> str | None:
        """The ``X-Tablecast-After`` of a read of `table`: the client's position of it (with
        monotonic reads) and an ``after`` the caller gave, merged. A node takes one
        ``after``, the query's before the header's, so a caller's must not replace ours."""
        known = self._positions.get(table) if table is not None and self.monotonic else None
        asked = params.get("after") if table is not None else None
        if asked is not None:
            try:
                theirs = positions.parse(asked)
                known = theirs if known is None else known.merge(theirs)
            except ValueError:
                pass  # not a token of this table: sent as it is, for the node to refuse
            else:
                del params["after"]
        return None if known is None else known.text()

    # -- requests ----------------------------------------------------------------
    def _send(
        self,
        urls: list[str],
        method: str,
        path: str,
        table: str | None = None,
        params: dict[str, Any] | None = None,
        content: bytes | None = None,
        refresh: bool = True,
        rounds: int | None = None,
    ) -> httpx.Response:
        """The first answer of a node to the request; with `table` and monotonic reads, it
        is at least as fresh as every answer seen of that table (a node that could not
        catch up in time answers 504, and the next node is asked).

        A node that cannot be reached or answers 503/504 is passed over for the next;
        after each round the client pauses — as long as the longest ``Retry-After`` of
        a 503 or 429 said, else briefly — and goes round again, `rounds` times in all
        (:attr:`retries`). A 429 ends its round: the caller is over its rate there,
        and asking the others at once is what a rate limit is there to stop. A pause
        longer than :attr:`max_retry_wait` is not taken: its error is raised.
        """
        params = dict(params or {})
        after = self._after(table, params)
        headers = {AFTER: after} if after is not None else None
        rounds = self.retries if rounds is None else rounds
        last: Exception | None = None
        for attempt in range(rounds):
            # the longest Retry-After of this round, and the error that asked for it
            wait, waited_for = 0.0, None
            for url in urls:
                try:
                    r = self._http.request(
                        method, url + path, params=params or None, content=content, headers=headers
                    )
                except httpx.HTTPError as e:
                    last = e
                    if refresh:
                        self._maybe_refresh()
                    continue
                if r.status_code in RETRIED:
                    last = _error(r)
                    later = _retry_after(r.headers.get("retry-after"))
                    if later is not None and later >= wait and r.status_code != 504:
                        wait, waited_for = later, last
                    if r.status_code == 429:
                        break
                    continue
                node = r.headers.get("x-tablecast-node")
                if refresh and node and not url.endswith(node.split("://")[-1]):
                    self._maybe_refresh()  # answered through a forward: our map is behind
                if table is not None:
                    self._seen(r)
                return r
            if waited_for is not None and wait > self.max_retry_wait:
                raise waited_for  # told to come back later than we may wait
            if attempt + 1 < rounds:
                time.sleep(wait if waited_for is not None else 0.05 * (attempt + 1))
        if isinstance(last, QueryError):
            raise last
        raise ConnectionError(f"{method} {path}: no node answered ({last})")

    @staticmethod
    def _check(r: httpx.Response) -> Any:
        """The answer's JSON; its error raised (:class:`AuthError` for a refused token)."""
        if r.status_code >= 400:
            raise _error(r)
        body = _json_body(r)
        if body is _NOT_JSON:
            raise QueryError(r.status_code, "not_json", _text_start(r))
        return body

    def _paged(
        self,
        table: str | None,
        urls: Callable[[], list[str]],
        path: str,
        params: dict[str, Any],
        item: Callable[[dict[str, Any]], T],
        limit: int | None,
        page_size: int,
    ) -> Pages[T]:
        def fetch(page: dict[str, Any]) -> dict[str, Any]:
            return self._check(self._send(urls(), "GET", path, table, params=page))

        return Pages(fetch, params, item, limit, page_size)

    def get(
        self, table: str, key: Any, as_of: Time | None = None, **options: Unpack[ReadOptions]
    ) -> dict[str, Any] | None:
        """The key's record ({"key", "value", "partition", "offset", "timestamp"}), or None;
        with `as_of`, the version valid at that time (a table with a history)."""
        return self.read(table, key, as_of, **options).record

    def read(
        self, table: str, key: Any, as_of: Time | None = None, **options: Unpack[ReadOptions]
    ) -> Read:
        """The key's record (None: absent) with what the answering node said of its
        freshness: the position the answer is exact at, its lag and staleness."""
        params: dict[str, Any] = dict(options)
        if as_of is not None:
            params["as_of"] = _time(as_of)
        path, params = _key_route(table, key, "", params)
        r = self._send(self._candidates(table, key), "GET", path, table, params=params)
        record = None
        if r.status_code == 404:
            error = _error(r)
            if error.code != "key_not_found":
                raise error  # no such table, say
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

    def batch_get(
        self, table: str, keys: Sequence[Any], **options: Unpack[ReadOptions]
    ) -> list[dict[str, Any]]:
        r = self._send(
            self._nodes,
            "POST",
            f"/v1/tables/{quote(table, safe='')}/keys:batchGet",
            table,
            params=dict(options),
            content=orjson.dumps({"keys": list(keys)}),
        )
        return self._check(r)["results"]

    def range(
        self,
        table: str,
        from_: Any = None,
        to: Any = None,
        prefix: str | None = None,
        page_size: int = PAGE_SIZE,
        as_of: Time | None = None,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        **options: Unpack[ReadOptions],
    ) -> Pages[tuple[Any, Any]]:
        """Every (key, value) with from_ <= key < to (or under `prefix`) in byte order,
        following the cursors page by page; with `as_of`, the table as it was at that time
        (a table with a history). `limit`: at most that many; `cursor`: continue a read."""
        params: dict[str, Any] = {**options, **_given(cursor=cursor, prefix=prefix)}
        if from_ is not None:
            params["from"] = _text(from_)
        if to is not None:
            params["to"] = _text(to)
        if as_of is not None:
            params["as_of"] = _time(as_of)
        path = f"/v1/tables/{quote(table, safe='')}/range"
        return self._paged(table, lambda: self._nodes, path, params, _key_value, limit, page_size)

    def history(
        self,
        table: str,
        key: Any,
        from_: Time | None = None,
        to: Time | None = None,
        page_size: int = PAGE_SIZE,
        *,
        order: Literal["asc", "desc"] = "asc",
        limit: int | None = None,
        cursor: str | None = None,
        **options: Unpack[ReadOptions],
    ) -> Pages[dict[str, Any]]:
        """The key's versions with from_ <= timestamp < to, oldest first (``order="desc"``:
        newest first): {"value", "timestamp", "offset"} (a delete is a version with value
        None). ``order="desc", limit=5``: the latest five. A cursor continues the order
        it was made in only."""
        params: dict[str, Any] = {**options, **_given(cursor=cursor)}
        if from_ is not None:
            params["from"] = _time(from_)
        if to is not None:
            params["to"] = _time(to)
        if order != "asc":  # the default is not sent: a node of an older version takes none
            params["order"] = order
        path, params = _key_route(table, key, "history", params)
        owners: list[str] = []

        def urls() -> list[str]:
            if not owners:  # asked once, when the first page is
                owners.extend(self._candidates(table, key))
            return owners

        return self._paged(table, urls, path, params, _same, limit, page_size)

    def index(
        self,
        table: str,
        name: str,
        value: Any,
        page_size: int = PAGE_SIZE,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        **options: Unpack[ReadOptions],
    ) -> Pages[tuple[Any, Any]]:
        """Every (key, value) of the rows whose value under index `name` is `value`, by key."""
        path = f"/v1/tables/{quote(table, safe='')}/index/{quote(name, safe='')}/" + quote(
            _index_text(value), safe=""
        )
        params: dict[str, Any] = {**options, **_given(cursor=cursor)}
        return self._paged(table, lambda: self._nodes, path, params, _key_value, limit, page_size)

    def index_range(
        self,
        table: str,
        name: str,
        from_: Any = None,
        to: Any = None,
        page_size: int = PAGE_SIZE,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        **options: Unpack[ReadOptions],
    ) -> Pages[tuple[Any, Any, Any]]:
        """Every (index value, key, value) with from_ <= index value < to, by index value
        then key (numbers before strings)."""
        params: dict[str, Any] = {**options, **_given(cursor=cursor)}
        if from_ is not None:
            params["from"] = _index_text(from_)
        if to is not None:
            params["to"] = _index_text(to)
        path = f"/v1/tables/{quote(table, safe='')}/index/{quote(name, safe='')}"
        return self._paged(
            table,
            lambda: self._nodes,
            path,
            params,
            lambda item: (item["index"], item["key"], item["value"]),
            limit,
            page_size,
        )

    def owned(
        self,
        node_url: str,
        table: str,
        page_size: int = PAGE_SIZE,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        **options: Unpack[ReadOptions],
    ) -> Pages[tuple[Any, Any]]:
        """Every (key, value) of the partitions `node_url` answers for as active.

        Run a job beside each node over ``owned(that_node, table)`` and every key
        is handled exactly once across the cluster, however many nodes there are.
        """
        params: dict[str, Any] = {**options, "owned": "true", **_given(cursor=cursor)}
        path = f"/v1/tables/{quote(table, safe='')}/range"
        node = [node_url.rstrip("/")]
        # no table: that node's own partitions, not a read the client's positions bound
        return self._paged(None, lambda: node, path, params, _key_value, limit, page_size)

    def windows(
        self,
        table: str,
        key: Any,
        from_: Time | None = None,
        to: Time | None = None,
        *,
        from_ms: int | None = None,
        to_ms: int | None = None,
        **options: Unpack[ReadOptions],
    ) -> list[dict[str, Any]]:
        """The key's windows ({"start", "end", "value"}) that start in [from_, to) of a
        window table. `from_ms`/`to_ms`: the earlier names of `from_`/`to`."""
        from_ = _renamed(from_, from_ms, "from_ms", "from_")
        to = _renamed(to, to_ms, "to_ms", "to")
        params: dict[str, Any] = dict(options)
        if from_ is not None:
            params["from"] = _time(from_)
        if to is not None:
            params["to"] = _time(to)
        path, params = _key_route(table, key, "windows", params)
        r = self._send(self._candidates(table, key), "GET", path, table, params=params)
        return self._check(r)["items"]

    def count(self, table: str, **options: Unpack[ReadOptions]) -> int:
        path = f"/v1/tables/{quote(table, safe='')}/count"
        return self._check(self._send(self._nodes, "GET", path, table, params=dict(options)))[
            "count"
        ]

    def watch(
        self,
        table: str,
        key: Any | Sequence[Any] | None = None,
        prefix: str | None = None,
        from_: Any = None,
        to: Any = None,
        snapshot: bool = True,
        since: str | None = None,
        *,
        start: Any = None,
        end: Any = None,
    ) -> Iterator[WatchEvent]:
        """The table's rows (`key`: one key or a list; `prefix`; or keys in [`from_`, `to`))
        as a snapshot, then every change, for as long as you iterate. `start`/`end`: the
        earlier names of `from_`/`to`.

        Events: ``snapshot`` rows, ``ready`` once the snapshot is complete, then
        ``change`` (``value`` None: deleted), in offset order per partition. When
        a node fails the watch resumes on another with the last event's id, with
        no gap and no duplicate; `since` resumes from an id you kept.
        """
        from_ = _renamed(from_, start, "start", "from_")
        to = _renamed(to, end, "end", "to")
        resumer = self._resumer(table, key, prefix, from_, to, snapshot, since)
        return watch_sync(self._http, resumer, self._maybe_refresh)

    async def awatch(
        self,
        table: str,
        key: Any | Sequence[Any] | None = None,
        prefix: str | None = None,
        from_: Any = None,
        to: Any = None,
        snapshot: bool = True,
        since: str | None = None,
        *,
        start: Any = None,
        end: Any = None,
    ) -> AsyncIterator[WatchEvent]:
        """:meth:`watch` for asyncio (``async for event in client.awatch(...)``)."""
        from_ = _renamed(from_, start, "start", "from_")
        to = _renamed(to, end, "end", "to")
        resumer = self._resumer(table, key, prefix, from_, to, snapshot, since, refresh=False)
        async with httpx.AsyncClient(headers=self._headers, verify=self._verify) as http:
            async for event in watch_async(http, resumer):
                yield event

    def _resumer(
        self,
        table: str,
        key: Any,
        prefix: str | None,
        from_: Any,
        to: Any,
        snapshot: bool,
        since: str | None,
        refresh: bool = True,
    ) -> Resumer:
        params = watch_params(key, prefix, from_, to, snapshot, _text)
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


def _renamed(value: Any, old_value: Any, old: str, new: str) -> Any:
    """A parameter given by its earlier name: still taken, with a DeprecationWarning."""
    if old_value is None:
        return value
    if value is not None:
        raise TypeError(f"give {new}= or {old}=, not both")
    warnings.warn(f"{old}= is now {new}= (the HTTP API's name)", DeprecationWarning, stacklevel=3)
    return old_value


def _given(**params: Any) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def _key_value(item: dict[str, Any]) -> tuple[Any, Any]:
    return item["key"], item["value"]


def _same(item: dict[str, Any]) -> dict[str, Any]:
    return item


#: what :func:`_json_body` gives for a body that is not JSON
_NOT_JSON: Any = object()


def _json_body(r: httpx.Response) -> Any:
    """The answer's JSON, or :data:`_NOT_JSON`: a body another type names (a proxy's HTML
    error page) is never parsed."""
    kind = r.headers.get("content-type", "")
    if kind and "json" not in kind.lower():
        return _NOT_JSON
    try:
        return orjson.loads(r.content)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _text_start(r: httpx.Response) -> str:
    kind = r.headers.get("content-type") or "no content type"
    text = " ".join(r.text[: TEXT_START * 4].split())[:TEXT_START]
    return f"not the API's JSON ({kind}): {text}"


def _error(r: httpx.Response) -> QueryError:
    """The error an answer stands for: the API's code and message, or — for a body that is
    not the API's error JSON — a code of the status's reason and the start of the text.
    A refused token (401, 403) is an :class:`AuthError`, whoever refused it."""
    body = _json_body(r)
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        code, message = err["code"], str(err.get("message", ""))
    else:
        reason = "_".join(r.reason_phrase.lower().split())
        code, message = reason or "http_error", _text_start(r)
    kind = AuthError if r.status_code in (401, 403) else QueryError
    return kind(r.status_code, code, message)


def _field(r: httpx.Response, name: str) -> Any:
    """`name` of a successful answer's JSON (QueryError if the answer is no such thing)."""
    body = Client._check(r)
    if not isinstance(body, dict) or name not in body:
        raise QueryError(r.status_code, "not_json", _text_start(r))
    return body[name]


def _retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` in seconds (delta-seconds or an HTTP date); None if absent or
    not understood."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


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
    if isinstance(value, str) and index_codec.parse_text(value) == value:
        return value
    index_codec.encode_value(value)  # refuses what no index holds
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
