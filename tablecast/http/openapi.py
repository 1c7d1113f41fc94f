"""``/openapi.json``: the HTTP API as an OpenAPI 3.1 document."""

from __future__ import annotations

from typing import Any

ERROR = {"$ref": "#/components/schemas/Error"}


def _param(
    name: str,
    where: str,
    description: str,
    schema: dict[str, Any] | None = None,
    required: bool = False,
) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "description": description,
        "schema": schema or {"type": "string"},
    }


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    meaning = {
        400: "bad request",
        401: "auth is on and the request has no valid bearer token",
        403: "the token's grants (--auth-policy) do not cover this table or key",
        404: "table or key not found",
        405: "method not allowed",
        408: "the body did not arrive within 10 s",
        413: "body larger than 1 MiB",
        429: "over --rate-limit, or too many after/min_offset waits of this caller (Retry-After)",
        503: "no replica ready, or none within max_staleness_ms (Retry-After)",
        504: "after or min_offset not reached within timeout_ms",
    }
    return {str(c): _json(ERROR, meaning[c]) for c in codes}


REDIRECTED = {
    "description": "redirect=true: the same read on the node that answers it (Location)",
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"redirect": {"type": "string"}}}
        }
    },
}
INT: dict[str, Any] = {"type": "integer"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
KEY_ERRORS = (400, 401, 403, 404, 405, 429, 503, 504)
META_ERRORS = (400, 401, 403, 404, 405, 429)
ANY: dict[str, Any] = {}  # a table value: whatever JSON its value serde renders


def _object(*required: str, **properties: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def _page(row: dict[str, Any]) -> dict[str, Any]:
    """A page of rows: the rows, and the cursor of the next page (null after the last)."""
    return _object(items=_array(row), next_cursor={"type": ["string", "null"]})


def _array(items: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "array", **({"items": items} if items is not None else {}), **extra}


def _get(
    summary: str,
    parameters: list[dict[str, Any]],
    ok: dict[str, Any],
    ok_description: str,
    errors: tuple[int, ...] = (400, 401, 403, 404, 405, 429, 503),
) -> dict[str, Any]:
    """A GET operation answering `ok` JSON with 200, or the error JSON."""
    operation: dict[str, Any] = {"summary": summary}
    if parameters:
        operation["parameters"] = parameters
    redirect = {"307": REDIRECTED} if REDIRECT in parameters else {}
    operation["responses"] = {"200": _json(ok, ok_description), **redirect, **_errors(*errors)}
    return {"get": operation}


TABLE = _param("table", "path", "table name")
KEY = _param(
    "key",
    "path",
    "the key's text form, URL-encoded (string as is, long as digits, JSON as JSON text)",
)
KEY_QUERY = _param("key", "query", "the key's text form", required=True)
INDEX = _param("index", "path", "the index name (the table's indexes in /v1/tables)")
MAX_LAG = _param(
    "max_lag",
    "query",
    "let a replica at most this many records behind answer",
    {"type": "integer", "minimum": 0},
)
MAX_STALENESS = _param(
    "max_staleness_ms",
    "query",
    "let a replica last known at its topic's end at most this many ms ago answer (a standby "
    "too), and none staler",
    {"type": "integer", "minimum": 0},
)
MIN_OFFSET = _param("min_offset", "query", "PARTITION:OFFSET the replica must have applied first")
AFTER = _param(
    "after",
    "query",
    "a position token (an X-Tablecast-Position, as it came): answer only from replicas at "
    "least that far, waiting up to timeout_ms (also as header X-Tablecast-After); an offset "
    "beyond its partition's end is refused (400)",
)
TIMEOUT = _param(
    "timeout_ms",
    "query",
    "how long after or min_offset may wait (default 1000)",
    {"type": "integer", "minimum": 0, "maximum": 30000},
)
REDIRECT = _param(
    "redirect",
    "query",
    "true: answer 307 to the node that answers the read instead of forwarding it",
    {"enum": ["true", "false"]},
)
#: the consistency options every read route takes (tablecast.query.consistency)
READ = [MAX_LAG, MAX_STALENESS, MIN_OFFSET, AFTER, TIMEOUT, REDIRECT]
AS_OF = _param(
    "as_of",
    "query",
    "a time (epoch ms or ISO-8601): answer as the table was then (a table with a history; "
    "400 before the history it keeps)",
)
LIMIT = _param("limit", "query", "page size", {**INT, "minimum": 1, "maximum": 10000})
CURSOR = _param("cursor", "query", "next_cursor of the previous page")


def document() -> dict[str, Any]:
    record = _object(
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
    table = _object(
        name=STR,
        topic=STR,
        partitions=INT,
        kind={"enum": ["kv", "window"]},
        key_format=STR,
        value_format=STR,
        history_ms=INT,
        indexes=_array(STR),
        **{"global": {"type": "boolean"}},
    )
    replica = _object(
        table=STR,
        partition=INT,
        role={"enum": ["active", "standby", "warming"]},
        offset=INT,
        lag=INT,
    )
    epoch_ms = {"type": "integer", "minimum": 0}
    history = _page(_object(value=ANY, timestamp=INT, offset=INT))
    history_params = [
        _param("from", "query", "first record time (inclusive), epoch ms or ISO-8601"),
        _param("to", "query", "end record time (exclusive), epoch ms or ISO-8601"),
        _param(
            "order",
            "query",
            "asc (default): oldest first; desc: newest first (a cursor continues its own "
            "order only: given with the other one it is a 400)",
            {"enum": ["asc", "desc"]},
        ),
        LIMIT,
        CURSOR,
        *READ,
    ]
    paths: dict[str, Any] = {
        "/v1/tables": _get(
            "list tables (with --auth-policy, those the token may read)",
            [],
            _object(tables=_array(table)),
            "tables",
            (401, 429),
        ),
        "/v1/tables/{table}/keys/{key}": _get(
            "read one key (with as_of, its value at that time)",
            [TABLE, KEY, AS_OF, *READ],
            record,
            "the key's latest value, or with as_of the version valid then",
            KEY_ERRORS,
        ),
        "/v1/tables/{table}/keys/{key}/history": _get(
            "a key's versions by record timestamp, oldest first (order=desc: newest first); "
            "a delete is a version with a null value (a table with a history)",
            [TABLE, KEY, *history_params],
            history,
            "a page of versions",
            KEY_ERRORS,
        ),
        "/v1/tables/{table}/keys:batchGet": {
            "post": {
                "summary": "read many keys, answers in request order; a key outside the "
                "token's grants (--auth-policy) answers found false, forbidden true, no value",
                "parameters": [TABLE, *READ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": _object("keys", keys=_array(maxItems=1000))}
                    },
                },
                "responses": {
                    "200": _json(
                        _object(
                            results=_array(_object(key=ANY, found=BOOL, value=ANY, forbidden=BOOL))
                        ),
                        "results",
                    ),
                    "307": REDIRECTED,
                    **_errors(400, 401, 403, 404, 405, 408, 413, 429, 503, 504),
                },
            }
        },
        "/v1/tables/{table}/range": _get(
            "keys in serialized-byte order across all partitions (with --auth-policy, only "
            "the keys the token may read)",
            [
                TABLE,
                _param("from", "query", "first key (inclusive)"),
                _param("to", "query", "end key (exclusive)"),
                _param("prefix", "query", "keys starting with these bytes"),
                LIMIT,
                CURSOR,
                AS_OF,
                _param(
                    "owned",
                    "query",
                    "true: only the partitions this node is active for",
                    {"enum": ["true", "false"]},
                ),
                *READ,
            ],
            _page(_object(key=ANY, value=ANY)),
            "a page",
            KEY_ERRORS,
        ),
        "/v1/tables/{table}/index/{index}/{value}": _get(
            "the rows whose value under the index is this one, by key, over all partitions "
            "(with --auth-policy, only the keys the token may read)",
            [
                TABLE,
                INDEX,
                _param(
                    "value",
                    "path",
                    "the index value: a JSON number, a JSON string (quoted), or else the text "
                    "as it is",
                ),
                LIMIT,
                CURSOR,
                *READ,
            ],
            _page(_object(key=ANY, value=ANY)),
            "a page",
            KEY_ERRORS,
        ),
        "/v1/tables/{table}/index/{index}": _get(
            "the rows whose value under the index is in [from, to), by value (numbers before "
            "strings) then key, over all partitions (with --auth-policy, only the keys the "
            "token may read)",
            [
                TABLE,
                INDEX,
                _param("from", "query", "first index value (inclusive), written as in the path"),
                _param("to", "query", "end index value (exclusive)"),
                LIMIT,
                CURSOR,
                *READ,
            ],
            _page(_object(index=ANY, key=ANY, value=ANY)),
            "a page",
            KEY_ERRORS,
        ),
        "/v1/tables/{table}/keys/{key}/windows": _get(
            "a window table's windows for a key, by start time",
            [
                TABLE,
                KEY,
                _param("from", "query", "earliest window start, epoch ms", epoch_ms),
                _param("to", "query", "latest window start, epoch ms", epoch_ms),
                *READ,
            ],
            _object(items=_array(_object(start=INT, end=INT, value=ANY))),
            "windows",
            KEY_ERRORS,
        ),
        "/v1/tables/{table}/count": _get(
            "number of keys (with --auth-policy, of the keys the token may read)",
            [TABLE, *READ],
            _object(count=INT),
            "count",
            KEY_ERRORS,
        ),
        "/v1/tables/{table}/keys/{key}/metadata": _get(
            "where a key lives",
            [TABLE, KEY],
            _object(partition=INT, active={"type": ["object", "null"]}, standbys={"type": "array"}),
            "owners",
            META_ERRORS,
        ),
        **{
            f"/v1/tables/{{table}}/{what}": _get(
                f"{summary}, the key given as ?key= (any key text, also one ending in "
                "/windows or /metadata, which a URL path cannot carry)",
                [TABLE, KEY_QUERY, *extra],
                ok,
                description,
                errors,
            )
            for what, summary, extra, ok, description, errors in (
                (
                    "keys",
                    "read one key",
                    [AS_OF, *READ],
                    record,
                    "the key's latest value, or with as_of the version valid then",
                    KEY_ERRORS,
                ),
                (
                    "windows",
                    "a window table's windows for a key",
                    [*READ],
                    _object(items=_array(_object(start=INT, end=INT, value=ANY))),
                    "windows",
                    KEY_ERRORS,
                ),
                (
                    "history",
                    "a key's versions",
                    history_params,
                    history,
                    "a page of versions",
                    KEY_ERRORS,
                ),
                (
                    "metadata",
                    "where a key lives",
                    [],
                    _object(
                        partition=INT,
                        active={"type": ["object", "null"]},
                        standbys={"type": "array"},
                    ),
                    "owners",
                    META_ERRORS,
                ),
            )
        },
        "/v1/tables/{table}/watch": {
            "get": {
                "summary": "follow rows live (SSE; the same path speaks WebSocket, one JSON "
                'message per event `{"event", "id", "data"}`): the selected rows as `snapshot` '
                "events, `ready`, then a `change` for every later update in offset order per "
                "partition; every event's `id` is a resume token (Last-Event-ID or since= on any "
                "node continues right after it); a `: keep-alive` comment at least every 15 s; "
                "a client too far behind is cut off and resumes with its last id; with "
                "--auth-policy only the token's rows",
                "parameters": [
                    TABLE,
                    _param(
                        "key",
                        "query",
                        "a key to follow (text form); repeat for more (at most 1000)",
                        {"type": "array", "items": STR, "maxItems": 1000},
                    ),
                    _param("prefix", "query", "follow keys starting with these bytes"),
                    _param("from", "query", "follow keys from this one (inclusive)"),
                    _param("to", "query", "follow keys up to this one (exclusive)"),
                    _param(
                        "snapshot",
                        "query",
                        "false: no snapshot, changes from now on",
                        {"enum": ["true", "false"]},
                    ),
                    _param(
                        "since",
                        "query",
                        "resume after the event with this id (offsets beyond their partitions' "
                        "ends: 400)",
                    ),
                    _param(
                        "access_token",
                        "query",
                        "the bearer token, for browsers (EventSource and WebSocket send no header)",
                    ),
                    _param("Last-Event-ID", "header", "resume after the event with this id"),
                ],
                "responses": {
                    "200": {
                        "description": "`text/event-stream`: `id:`, `event:` (snapshot, ready, "
                        "change, error) and `data:` per event — snapshot "
                        '`{"key", "value", "partition", "offset", "timestamp"}`, ready '
                        '`{"rows"}`, change `{"key", "value" (null: deleted), "partition", '
                        '"offset", "timestamp"}`, error `{"error": {"code", "message"}}` '
                        "before the stream ends (the node stopping, the token expiring)",
                        "content": {"text/event-stream": {"schema": STR}},
                    },
                    **_errors(400, 401, 403, 404, 405, 429, 503),
                },
            }
        },
        "/v1/cluster": _get(
            "nodes and their replicas (with --auth-policy, of the tables the token may read)",
            [],
            _object(nodes=_array(_object(id=STR, url=STR, state=STR, replicas=_array(replica)))),
            "the cluster",
            (401, 429),
        ),
        "/healthz": {
            "get": {"summary": "liveness", "responses": {"200": {"description": "alive"}}}
        },
        "/readyz": {
            "get": {
                "summary": "200 once every active replica is caught up (with --auth-metrics, "
                'the details need a token; without one the body is only {"ready"})',
                "responses": {
                    "200": {"description": "ready"},
                    "401": {"description": "--auth-metrics and an invalid token"},
                    "503": {"description": "restoring"},
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus text (with --auth-metrics, needs a bearer token)",
                "responses": {
                    "200": {"description": "metrics", "content": {"text/plain": {"schema": STR}}},
                    "401": {"description": "--auth-metrics and no valid token"},
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "this document",
                "responses": {"200": {"description": "OpenAPI 3.1"}},
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "tablecast",
            "version": "1",
            "description": "Query the live state of Kafka streams.",
        },
        "paths": paths,
        "components": {
            "schemas": {
                "Error": _object(
                    "error",
                    error=_object(
                        "code",
                        "message",
                        code={
                            "enum": [
                                "table_not_found",
                                "key_not_found",
                                "not_found",
                                "bad_request",
                                "unauthorized",
                                "forbidden",
                                "method_not_allowed",
                                "request_timeout",
                                "payload_too_large",
                                "rate_limited",
                                "partition_unavailable",
                                "timeout",
                            ]
                        },
                        message=STR,
                    ),
                )
            }
        },
    }
