"""HTTP requests as reads: a read route's path and query parameters decoded into the query
value it asks (:mod:`tablecast.query.queries`), 400 for a parameter that does not parse.

What the values mean, and whether the caller may read them, is the router's to judge
(an ``after`` token of another table, a key the caller's grants exclude); this module
reads only how HTTP spells them. Which parameters a route takes at all is declared
with the route (:mod:`tablecast.http.routes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from tablecast.query.auth import Caller
from tablecast.query.consistency import AFTER_HEADER, ReadOptions, bound_of
from tablecast.query.errors import ApiError
from tablecast.query.fanout import limit_param, partitions_of
from tablecast.query.params import int_param, time_param
from tablecast.query.queries import (
    DEFAULT_LIMIT,
    BatchQuery,
    CountQuery,
    HistoryQuery,
    IndexQuery,
    KeyQuery,
    LocateShare,
    MetadataQuery,
    PartitionCount,
    PartitionScan,
    RangeQuery,
    SnapshotShare,
    WindowsQuery,
)
from tablecast.query.request import Request

Args = Mapping[str, str]
NO_PARAMS: dict[str, str] = {}


class HttpRequest(Request):
    """A request as HTTP spells it: the read core's :class:`Request` with the query string
    and its parameters, which only this module's decoders read."""

    __slots__ = ("params", "query")

    def __init__(
        self,
        params: dict[str, str],
        query: str,
        headers: Any,
        caller: Caller | None = None,
        scope: Any = None,
        authorization: str | None = None,
    ) -> None:
        super().__init__(headers, caller, scope, authorization)
        self.params = params
        self.query = query


def bound(req: HttpRequest) -> ReadOptions:
    """The consistency bound the request asks (``after`` as a parameter or a header)."""
    params = req.params
    return bound_of(params, params.get("after") or req.headers.get(AFTER_HEADER))


def header_bound(headers: Any) -> ReadOptions:
    """The bound of a request without a query string: an ``after`` header's, if any."""
    return bound_of(NO_PARAMS, headers.get(AFTER_HEADER))


def key_query(args: Args, req: HttpRequest) -> KeyQuery:
    b = bound(req)
    as_of = time_param(req.params, "as_of", None)
    table, key = args["table"], key_of(args, req)
    return KeyQuery.latest(table, key, b) if as_of is None else KeyQuery.at(table, key, as_of, b)


def windows_query(args: Args, req: HttpRequest) -> WindowsQuery:
    params = req.params
    return WindowsQuery.between(
        args["table"],
        key_of(args, req),
        time_param(params, "from", None),
        time_param(params, "to", None),
        bound(req),
    )


def history_query(args: Args, req: HttpRequest) -> HistoryQuery:
    params = req.params
    return HistoryQuery.versions(
        args["table"],
        key_of(args, req),
        time_param(params, "from", None),
        time_param(params, "to", None),
        limit=limit_param(params),
        newest_first=newest_first(params),
        cursor=params.get("cursor") or None,
        bound=bound(req),
    )


def metadata_query(args: Args, req: HttpRequest) -> MetadataQuery:
    return MetadataQuery.of_key(args["table"], key_of(args, req))


def range_query(args: Args, req: HttpRequest) -> RangeQuery:
    params = req.params
    return RangeQuery.between(
        args["table"],
        params.get("from"),
        params.get("to"),
        prefix=params.get("prefix"),
        as_of=time_param(params, "as_of", None),
        owned=params.get("owned") == "true",
        limit=limit_param(params),
        cursor=params.get("cursor") or None,
        bound=bound(req),
        record_fields=params.get("record_fields") == "true",
    )


def index_query(args: Args, req: HttpRequest) -> IndexQuery:
    """``/index/NAME/VALUE`` (`args` holds the value) or ``/index/NAME?from=&to=``."""
    params = req.params
    table, index, value = args["table"], args["index"], args.get("value")
    limit, cursor, b = limit_param(params), params.get("cursor") or None, bound(req)
    fields = params.get("record_fields") == "true"
    if value is not None:
        return IndexQuery.equal(
            table, index, value, limit=limit, cursor=cursor, bound=b, record_fields=fields
        )
    return IndexQuery.between(
        table,
        index,
        params.get("from"),
        params.get("to"),
        limit=limit,
        cursor=cursor,
        bound=b,
        record_fields=fields,
    )


def count_query(args: Args, req: HttpRequest) -> CountQuery:
    return CountQuery.rows(args["table"], bound(req))


def batch_query(table: str, body: bytes, req: HttpRequest) -> BatchQuery:
    """A batchGet's keys from its JSON body, ``{"keys": [...]}``."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ApiError("bad_request", 'the body must be JSON: {"keys": [...]}') from None
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, list):
        raise ApiError("bad_request", 'the body must be {"keys": [...]}')
    return BatchQuery.of_keys(table, keys, bound(req))


def partition_scan(args: Args, req: HttpRequest) -> PartitionScan:
    """A peer's ``/internal/tables/{t}/scan``: rows of some of this node's partitions."""
    params = req.params
    try:
        start = bytes.fromhex(params["start"]) if "start" in params else None
        end = bytes.fromhex(params["end"]) if "end" in params else None
    except ValueError:
        raise ApiError("bad_request", "start and end are hex") from None
    limit: int = int_param(params, "limit", DEFAULT_LIMIT)
    if limit < 1:
        raise ApiError("bad_request", "limit must be at least 1")
    return PartitionScan(
        args["table"],
        partitions_of(params.get("partitions", "")),
        bound(req),
        params.get("view"),
        start,
        end,
        limit,
        time_param(params, "as_of", None),
        params.get("index"),
        params.get("value") != "false",
        params.get("record_fields") == "true",
    )


def partition_count(args: Args, req: HttpRequest) -> PartitionCount:
    """A peer's ``/internal/tables/{t}/count``: the rows of some of this node's partitions."""
    partitions = partitions_of(req.params.get("partitions", ""))
    return PartitionCount(args["table"], partitions, bound(req))


def locate_share(args: Args, req: HttpRequest) -> LocateShare:
    """A peer's ``/internal/tables/{t}/locate``: which of some of this node's partitions
    hold which keys (hex, comma-separated)."""
    params = req.params
    try:
        keys = tuple(bytes.fromhex(k) for k in params.get("keys", "").split(",") if k)
    except ValueError:
        raise ApiError("bad_request", "keys are hex") from None
    partitions = partitions_of(params.get("partitions", ""))
    return LocateShare(args["table"], partitions, keys, bound(req))


def snapshot_share(args: Args, req: HttpRequest) -> SnapshotShare:
    """A peer's ``/internal/tables/{t}/snapshot``: its watch's rows in some of this node's
    partitions (``keys`` or ``spans`` in hex, ``at_least`` as partition:position pairs)."""
    params = req.params
    try:
        keys = None
        if "keys" in params:
            keys = tuple(bytes.fromhex(k) for k in params["keys"].split(",") if k)
        spans = () if keys is not None else tuple(_spans(params.get("spans", "")))
        at_least = []
        for item in params.get("at_least", "").split(","):
            if item:
                p, _, o = item.partition(":")
                at_least.append((int(p), int(o)))
    except ValueError:
        raise ApiError("bad_request", "keys, spans and at_least are hex and p:o lists") from None
    partitions = partitions_of(params.get("partitions", ""))
    return SnapshotShare(args["table"], partitions, keys, spans, tuple(at_least))


def _spans(text: str) -> list[tuple[bytes | None, bytes | None]]:
    """``START-END;...`` in hex (an empty side: unbounded); ValueError for anything else."""
    spans = []
    for item in text.split(";") if text else []:
        lo, dash, hi = item.partition("-")
        if not dash:
            raise ValueError(item)
        spans.append((bytes.fromhex(lo) if lo else None, bytes.fromhex(hi) if hi else None))
    return spans


def key_of(args: Args, req: HttpRequest) -> str:
    """The key of a key route: in its path, or (any key text) as ?key=."""
    key = args.get("key")
    if key is None:
        key = req.params.get("key")
        if key is None:
            raise ApiError("bad_request", "this route needs ?key=<the key's text form>")
    return key


def newest_first(params: Mapping[str, str]) -> bool:
    """``order`` of a history read: True for ``desc`` (newest first), False for ``asc``."""
    order = params.get("order", "asc")
    if order not in ("asc", "desc"):
        raise ApiError("bad_request", f"order must be asc or desc, not {order!r}")
    return order == "desc"
