"""Every HTTP route of a node, declared once.

Each :class:`Route` names its method, its path (``{name}`` one segment,
``{name:path}`` the rest, slashes included), the method of
:class:`~tablecast.http.app.HttpApp` that answers it (for a read, the decoder of
the read it asks, which the router answers), and its parameters. That one table
drives matching (:class:`Routes`, one compiled expression), decoding, the query
parameters a route takes (any other is answered with 400 naming it), and the
``/openapi.json`` document (:mod:`tablecast.http.openapi`, for the routes with
a summary), in the order they are declared here. A route whose ``{name:path}`` is
followed by more of the path is tried before the others: a key path ending in
``/history`` is the history route's (``?key=`` carries any key text).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tablecast.console.api import NODE_ROUTE
from tablecast.http import decode
from tablecast.query.coalesce import ANSWERS_PATH, BATCH_PATH
from tablecast.query.errors import ApiError
from tablecast.query.queries import Query
from tablecast.query.request import path_segment

STR: Mapping[str, Any] = {"type": "string"}
INT: Mapping[str, Any] = {"type": "integer"}
BOOL: Mapping[str, Any] = {"type": "boolean"}
ANY: Mapping[str, Any] = {}  # a table value: whatever JSON its value serde renders


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "path", "query" or "header"
    description: str = ""
    schema: Mapping[str, Any] = field(default_factory=lambda: dict(STR))
    required: bool = False

    def openapi(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "in": self.where,
            "required": self.required or self.where == "path",
            "description": self.description,
            "schema": dict(self.schema),
        }


@dataclass(frozen=True, eq=False)  # each declared once: equal when the same
class Route:
    #: what /metrics calls it; routes of one name take the same query parameters
    name: str
    method: str
    path: str
    #: the HttpApp method that answers it: endpoint(args, request, proto); "read" for a
    #: route that asks a read (`read`), which the router answers
    endpoint: str
    params: tuple[Param, ...] = ()
    #: what the OpenAPI document says of it; a route without one is internal, undocumented
    summary: str = ""
    ok: Mapping[str, Any] | None = None
    ok_description: str = ""
    errors: tuple[int, ...] = ()
    #: the whole OpenAPI responses object, for a route whose 200 is not one JSON schema
    responses: Mapping[str, Any] | None = None
    body: Mapping[str, Any] | None = None
    #: False: the endpoint reads its query string itself (the watch: keys repeat)
    checked: bool = True
    #: the read it asks (:mod:`tablecast.query.queries`), decoded from its path parameters
    #: and request (:mod:`tablecast.http.decode`)
    read: Callable[[Mapping[str, str], decode.HttpRequest], Query] | None = None

    @property
    def documented_path(self) -> str:
        return self.path.replace(":path}", "}")


def object_of(*required: str, **properties: Mapping[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def _array(items: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "array", **({"items": items} if items is not None else {}), **extra}


def _page(row: Mapping[str, Any]) -> dict[str, Any]:
    """A page of rows: the rows, and the cursor of the next page (null after the last)."""
    return object_of(items=_array(row), next_cursor={"type": ["string", "null"]})


# -- parameters ------------------------------------------------------------------------
TABLE = Param("table", "path", "table name")
KEY = Param(
    "key",
    "path",
    "the key's text form, URL-encoded (string as is, long as digits, JSON as JSON text)",
)
KEY_QUERY = Param("key", "query", "the key's text form", required=True)
INDEX = Param("index", "path", "the index name (the table's indexes in /v1/tables)")
MAX_LAG = Param(
    "max_lag",
    "query",
    "let a replica at most this many records behind answer",
    {"type": "integer", "minimum": 0},
)
MAX_STALENESS = Param(
    "max_staleness_ms",
    "query",
    "let a replica last known at its topic's end at most this many ms ago answer (a standby "
    "too), and none staler",
    {"type": "integer", "minimum": 0},
)
MIN_OFFSET = Param("min_offset", "query", "PARTITION:OFFSET the replica must have applied first")
AFTER = Param(
    "after",
    "query",
    "a position token (an X-Tablecast-Position, as it came): answer only from replicas at "
    "least that far, waiting up to timeout_ms (also as header X-Tablecast-After); an offset "
    "beyond its partition's end is refused (400)",
)
TIMEOUT = Param(
    "timeout_ms",
    "query",
    "how long after or min_offset may wait (default 1000)",
    {"type": "integer", "minimum": 0, "maximum": 30000},
)
REDIRECT = Param(
    "redirect",
    "query",
    "true: answer 307 to the node that answers the read instead of forwarding it",
    {"enum": ["true", "false"]},
)
#: the consistency options every read route takes (tablecast.query.consistency)
READ = (MAX_LAG, MAX_STALENESS, MIN_OFFSET, AFTER, TIMEOUT, REDIRECT)
AS_OF = Param(
    "as_of",
    "query",
    "a time (epoch ms or ISO-8601): answer as the table was then (a table with a history; "
    "400 before the history it keeps)",
)
LIMIT = Param("limit", "query", "page size", {**INT, "minimum": 1, "maximum": 10000})
CURSOR = Param("cursor", "query", "next_cursor of the previous page")
RECORD_FIELDS = Param(
    "record_fields",
    "query",
    "true: each item also gives its record's partition, offset and timestamp (as a key read)",
    {"enum": ["true", "false"]},
)
EPOCH_MS = {"type": "integer", "minimum": 0}
HISTORY = (
    Param("from", "query", "first record time (inclusive), epoch ms or ISO-8601"),
    Param("to", "query", "end record time (exclusive), epoch ms or ISO-8601"),
    Param(
        "order",
        "query",
        "asc (default): oldest first; desc: newest first (a cursor continues its own "
        "order only: given with the other one it is a 400)",
        {"enum": ["asc", "desc"]},
    ),
    LIMIT,
    CURSOR,
    *READ,
)
WINDOWS = (
    Param("from", "query", "earliest window start, epoch ms", EPOCH_MS),
    Param("to", "query", "latest window start, epoch ms", EPOCH_MS),
)


def _internal(*names: str) -> tuple[Param, ...]:
    return tuple(Param(name, "query") for name in names)


# -- answers ---------------------------------------------------------------------------
RECORD = object_of(
    "key",
    "value",
    "partition",
    "offset",
    "timestamp",
    key=ANY,
    value=ANY,
    partition=INT,
    offset=INT,
    timestamp=INT,
)
TABLE_INFO = object_of(
    name=STR,
    topic=STR,
    partitions=INT,
    kind={"enum": ["kv", "window"]},
    key_format=STR,
    value_format=STR,
    partitioner={"enum": ["murmur2", "consistent_random", "unknown"]},
    attached=BOOL,
    key_layout=object_of(head=STR, fields=_array(STR)),
    history_ms=INT,
    indexes=_array(STR),
    **{"global": BOOL},
)
REPLICA = object_of(
    table=STR,
    partition=INT,
    role={"enum": ["active", "standby", "warming"]},
    offset=INT,
    lag=INT,
    state={"enum": ["warming", "serving", "stale", "failed"]},
    staleness_ms=INT,
    # how old the newest record it applied is, by the record's timestamp; null before one
    freshness_ms={"type": ["integer", "null"]},
)
VERSIONS = _page(object_of(value=ANY, timestamp=INT, offset=INT))
#: an item of a page of rows: its key and value, and with record_fields=true its record's
#: partition, offset and timestamp
ROW_FIELDS: dict[str, Mapping[str, Any]] = dict(
    key=ANY, value=ANY, partition=INT, offset=INT, timestamp=INT
)
WINDOW_LIST = object_of(items=_array(object_of(start=INT, end=INT, value=ANY)))
OWNERS = object_of(partition=INT, active={"type": ["object", "null"]}, standbys={"type": "array"})
KEY_ERRORS = (400, 401, 403, 404, 405, 429, 503, 504)
META_ERRORS = (400, 401, 403, 404, 405, 429)
BY_QUERY = (
    ", the key given as ?key= (any key text, also one ending in /windows or /metadata, "
    "which a URL path cannot carry)"
)
WATCH_ANSWER = {
    "200": {
        "description": "`text/event-stream`: `id:`, `event:` (snapshot, ready, "
        "change, error) and `data:` per event — snapshot "
        '`{"key", "value", "partition", "offset", "timestamp"}`, ready '
        '`{"rows"}`, change `{"key", "value" (null: deleted), "partition", '
        '"offset", "timestamp"}`, error `{"error": {"code", "message"}}` '
        "before the stream ends (the node stopping, the token expiring)",
        "content": {"text/event-stream": {"schema": STR}},
    }
}

TABLES = "/v1/tables/{table}"
ROUTES: tuple[Route, ...] = (
    # -- the public API, in the order of the document ------------------------------------
    Route(
        "tables",
        "GET",
        "/v1/tables",
        "tables",
        summary="list tables (with --auth-policy, those the token may read)",
        ok=object_of(tables=_array(TABLE_INFO)),
        ok_description="tables (partitioner: how the topic's writer picks a key's partition; "
        "attached: a topic tablecast attach made a table; key_layout: how a Debezium key's "
        "bytes are rebuilt)",
        errors=(401, 429),
    ),
    Route(
        "key",
        "GET",
        TABLES + "/keys/{key:path}",
        "read",
        (TABLE, KEY, AS_OF, *READ),
        summary="read one key (with as_of, its value at that time)",
        ok=RECORD,
        ok_description="the key's latest value, or with as_of the version valid then",
        errors=KEY_ERRORS,
        read=decode.key_query,
    ),
    Route(
        "history",
        "GET",
        TABLES + "/keys/{key:path}/history",
        "read",
        (TABLE, KEY, *HISTORY),
        summary="a key's versions by record timestamp, oldest first (order=desc: newest "
        "first); a delete is a version with a null value (a table with a history)",
        ok=VERSIONS,
        ok_description="a page of versions",
        errors=KEY_ERRORS,
        read=decode.history_query,
    ),
    Route(
        "batch_get",
        "POST",
        TABLES + "/keys:batchGet",
        "batch_get",
        (TABLE, *READ),
        summary="read many keys, answers in request order; a key outside the token's grants "
        "(--auth-policy) answers found false, forbidden true, no value",
        ok=object_of(results=_array(object_of(key=ANY, found=BOOL, value=ANY, forbidden=BOOL))),
        ok_description="results",
        errors=(400, 401, 403, 404, 405, 408, 413, 429, 503, 504),
        body={
            "required": True,
            "content": {
                "application/json": {"schema": object_of("keys", keys=_array(maxItems=1000))}
            },
        },
    ),
    Route(
        "range",
        "GET",
        TABLES + "/range",
        "read",
        (
            TABLE,
            Param("from", "query", "first key (inclusive)"),
            Param("to", "query", "end key (exclusive)"),
            Param("prefix", "query", "keys starting with these bytes"),
            LIMIT,
            CURSOR,
            AS_OF,
            Param(
                "owned",
                "query",
                "true: only the partitions this node is active for",
                {"enum": ["true", "false"]},
            ),
            RECORD_FIELDS,
            *READ,
        ),
        summary="keys in serialized-byte order across all partitions (with --auth-policy, "
        "only the keys the token may read)",
        ok=_page(object_of("key", "value", **ROW_FIELDS)),
        ok_description="a page",
        errors=KEY_ERRORS,
        read=decode.range_query,
    ),
    Route(
        "index_lookup",
        "GET",
        TABLES + "/index/{index}/{value:path}",
        "read",
        (
            TABLE,
            INDEX,
            Param(
                "value",
                "path",
                "the index value: a JSON number, a JSON string (quoted), or else the text as it is",
            ),
            LIMIT,
            CURSOR,
            RECORD_FIELDS,
            *READ,
        ),
        summary="the rows whose value under the index is this one, by key, over all "
        "partitions (with --auth-policy, only the keys the token may read)",
        ok=_page(object_of("key", "value", **ROW_FIELDS)),
        ok_description="a page",
        errors=KEY_ERRORS,
        read=decode.index_query,
    ),
    Route(
        "index_range",
        "GET",
        TABLES + "/index/{index}",
        "read",
        (
            TABLE,
            INDEX,
            Param("from", "query", "first index value (inclusive), written as in the path"),
            Param("to", "query", "end index value (exclusive)"),
            LIMIT,
            CURSOR,
            RECORD_FIELDS,
            *READ,
        ),
        summary="the rows whose value under the index is in [from, to), by value (numbers "
        "before strings) then key, over all partitions (with --auth-policy, only the keys "
        "the token may read)",
        ok=_page(object_of("index", "key", "value", index=ANY, **ROW_FIELDS)),
        ok_description="a page",
        errors=KEY_ERRORS,
        read=decode.index_query,
    ),
    Route(
        "windows",
        "GET",
        TABLES + "/keys/{key:path}/windows",
        "read",
        (TABLE, KEY, *WINDOWS, *READ),
        summary="a window table's windows for a key, by start time",
        ok=WINDOW_LIST,
        ok_description="windows",
        errors=KEY_ERRORS,
        read=decode.windows_query,
    ),
    Route(
        "count",
        "GET",
        TABLES + "/count",
        "read",
        (TABLE, *READ),
        summary="number of keys (with --auth-policy, of the keys the token may read)",
        ok=object_of(count=INT),
        ok_description="count",
        errors=KEY_ERRORS,
        read=decode.count_query,
    ),
    Route(
        "metadata",
        "GET",
        TABLES + "/keys/{key:path}/metadata",
        "read",
        (TABLE, KEY),
        summary="where a key lives",
        ok=OWNERS,
        ok_description="owners",
        errors=META_ERRORS,
        read=decode.metadata_query,
    ),
    Route(
        "key",
        "GET",
        TABLES + "/keys",
        "read",
        (TABLE, KEY_QUERY, AS_OF, *READ),
        summary="read one key" + BY_QUERY,
        ok=RECORD,
        ok_description="the key's latest value, or with as_of the version valid then",
        errors=KEY_ERRORS,
        read=decode.key_query,
    ),
    Route(
        "windows",
        "GET",
        TABLES + "/windows",
        "read",
        (TABLE, KEY_QUERY, *READ),
        summary="a window table's windows for a key" + BY_QUERY,
        ok=WINDOW_LIST,
        ok_description="windows",
        errors=KEY_ERRORS,
        read=decode.windows_query,
    ),
    Route(
        "history",
        "GET",
        TABLES + "/history",
        "read",
        (TABLE, KEY_QUERY, *HISTORY),
        summary="a key's versions" + BY_QUERY,
        ok=VERSIONS,
        ok_description="a page of versions",
        errors=KEY_ERRORS,
        read=decode.history_query,
    ),
    Route(
        "metadata",
        "GET",
        TABLES + "/metadata",
        "read",
        (TABLE, KEY_QUERY),
        summary="where a key lives" + BY_QUERY,
        ok=OWNERS,
        ok_description="owners",
        errors=META_ERRORS,
        read=decode.metadata_query,
    ),
    Route(
        "watch",
        "GET",
        TABLES + "/watch",
        "watch",
        (
            TABLE,
            Param(
                "key",
                "query",
                "a key to follow (text form); repeat for more (at most 1000)",
                {"type": "array", "items": STR, "maxItems": 1000},
            ),
            Param("prefix", "query", "follow keys starting with these bytes"),
            Param("from", "query", "follow keys from this one (inclusive)"),
            Param("to", "query", "follow keys up to this one (exclusive)"),
            Param(
                "snapshot",
                "query",
                "false: no snapshot, changes from now on",
                {"enum": ["true", "false"]},
            ),
            Param(
                "since",
                "query",
                "resume after the event with this id (offsets beyond their partitions' ends: 400)",
            ),
            Param(
                "access_token",
                "query",
                "the bearer token, for browsers (EventSource and WebSocket send no header)",
            ),
            Param("Last-Event-ID", "header", "resume after the event with this id"),
        ),
        summary="follow rows live (SSE; the same path speaks WebSocket, one JSON message per "
        'event `{"event", "id", "data"}`): the selected rows as `snapshot` events, `ready`, '
        "then a `change` for every later update in offset order per partition; every event's "
        "`id` is a resume token (Last-Event-ID or since= on any node continues right after "
        "it); a `: keep-alive` comment at least every 15 s; a client too far behind is cut "
        "off and resumes with its last id; with --auth-policy only the token's rows",
        responses=WATCH_ANSWER,
        errors=(400, 401, 403, 404, 405, 429, 503),
        checked=False,
    ),
    Route(
        "cluster",
        "GET",
        "/v1/cluster",
        "cluster",
        summary="nodes and their replicas (with --auth-policy, of the tables the token may read)",
        ok=object_of(nodes=_array(object_of(id=STR, url=STR, state=STR, replicas=_array(REPLICA)))),
        ok_description="the cluster",
        errors=(401, 429),
    ),
    Route(
        "healthz",
        "GET",
        "/healthz",
        "health",
        summary="liveness",
        responses={"200": {"description": "alive"}},
    ),
    Route(
        "readyz",
        "GET",
        "/readyz",
        "readiness",
        summary="200 once every active replica is caught up (with --auth-metrics, the details "
        'need a token; without one the body is only {"ready"})',
        responses={
            "200": {"description": "ready"},
            "401": {"description": "--auth-metrics and an invalid token"},
            "503": {"description": "restoring"},
        },
    ),
    Route(
        "metrics",
        "GET",
        "/metrics",
        "metrics",
        summary="Prometheus text (with --auth-metrics, needs a bearer token)",
        responses={
            "200": {"description": "metrics", "content": {"text/plain": {"schema": STR}}},
            "401": {"description": "--auth-metrics and no valid token"},
        },
    ),
    Route(
        "openapi",
        "GET",
        "/openapi.json",
        "openapi",
        summary="this document",
        responses={"200": {"description": "OpenAPI 3.1"}},
    ),
    # -- between nodes -------------------------------------------------------------------
    Route(
        "internal_scan",
        "GET",
        "/internal/tables/{table}/scan",
        "read",
        (
            *READ,
            *_internal(
                "partitions",
                "start",
                "end",
                "limit",
                "view",
                "index",
                "as_of",
                "value",
                "record_fields",
            ),
        ),
        read=decode.partition_scan,
    ),
    Route(
        "internal_count",
        "GET",
        "/internal/tables/{table}/count",
        "read",
        (*READ, *_internal("partitions")),
        read=decode.partition_count,
    ),
    Route(
        "internal_locate",
        "GET",
        "/internal/tables/{table}/locate",
        "read",
        (*READ, *_internal("partitions", "keys")),
        read=decode.locate_share,
    ),
    Route(
        "internal_snapshot",
        "GET",
        "/internal/tables/{table}/snapshot",
        "internal_snapshot",
        _internal("partitions", "keys", "spans", "at_least"),
    ),
    Route("internal_batch", "POST", ANSWERS_PATH, "internal_batch"),
    Route("internal_batch", "POST", BATCH_PATH, "internal_batch"),
    Route("internal_console", "GET", NODE_ROUTE, "console_node"),
    # -- the console ---------------------------------------------------------------------
    Route("ui", "GET", "/ui", "ui_index"),
    Route("ui", "GET", "/ui/", "ui_index"),
    Route("ui", "GET", "/ui/static/{name:path}", "ui_file"),
    Route("ui_api", "GET", "/ui/api/node", "console_node"),
    Route("ui_api", "GET", "/ui/api/nodes", "console_nodes"),
    Route("ui_api", "GET", "/ui/api/pipeline", "console_pipeline"),
    Route("ui_api", "GET", "/ui/api/deadletters", "console_dead_letters"),
)

_PARAM = re.compile(r"\{(\w+)(:path)?\}")


def _pattern(path: str) -> tuple[str, list[str]]:
    """A route's path as a regular expression of its own groups, and its parameters' names."""
    names: list[str] = []
    out: list[str] = []
    at = 0
    for m in _PARAM.finditer(path):
        out.append(re.escape(path[at : m.start()]))
        out.append("(.*)" if m.group(2) else "([^/]*)")
        names.append(m.group(1))
        at = m.end()
    out.append(re.escape(path[at:]))
    return "".join(out), names


def _tried_later(route: Route) -> bool:
    """False for a route with more of its path after a ``{name:path}`` (tried first)."""
    _, rest_param, after = route.path.partition(":path}")
    return not (rest_param and after)


@dataclass
class Routes:
    """:data:`ROUTES` compiled: one expression matches a path against every route at once
    (the first route that matches wins), and the query parameters each route name takes."""

    routes: tuple[Route, ...] = ROUTES
    #: query parameters by route name (those of every route of that name)
    known: dict[str, frozenset[str]] = field(init=False)

    def __post_init__(self) -> None:
        parts, self._by_group = [], {}
        group = 1
        for route in sorted(self.routes, key=_tried_later):
            pattern, names = _pattern(route.path)
            parts.append(f"({pattern})")
            self._by_group[group] = (route, tuple(range(group + 1, group + 1 + len(names))), names)
            group += 1 + len(names)
        self._match = re.compile("|".join(parts)).fullmatch
        known: dict[str, set[str]] = {}
        for route in self.routes:
            names = known.setdefault(route.name, set())
            names.update(p.name for p in route.params if p.where == "query")
        self.known = {name: frozenset(names) for name, names in known.items()}

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route of `path` (as received: each parameter is percent-decoded here, so a
        key's %2F is data) and its path parameters; 404 or 405 as ApiError."""
        m = self._match(path)
        if m is None:
            raise ApiError("not_found", f"no route for {method} {path}")
        route, groups, names = self._by_group[m.lastindex]  # type: ignore[index]
        if method != route.method:
            raise ApiError(
                "method_not_allowed", f"{method} is not allowed here; use {route.method}"
            )
        return route, {n: path_segment(m.group(g)) for n, g in zip(names, groups, strict=True)}

    def check(self, route: Route, params: Mapping[str, str]) -> None:
        """400 naming the query parameters `route` does not take."""
        if not route.checked:
            return
        known = self.known[route.name]
        unknown = params.keys() - known
        if unknown:
            takes = ", ".join(sorted(known)) or "none"
            raise ApiError(
                "bad_request",
                f"unknown query parameter(s): {', '.join(sorted(unknown))} "
                f"(this route takes: {takes})",
            )
