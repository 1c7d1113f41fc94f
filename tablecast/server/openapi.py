"""``/openapi.json``: the HTTP API of SPEC §3 as an OpenAPI 3.1 document."""

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
        404: "table or key not found",
        405: "method not allowed",
        503: "no replica ready (Retry-After)",
        504: "min_offset not reached in time",
    }
    return {str(c): _json(ERROR, meaning[c]) for c in codes}


TABLE = _param("table", "path", "table name")
KEY = _param(
    "key",
    "path",
    "the key's text form, URL-encoded (string as is, long as digits, JSON as JSON text)",
)
MAX_LAG = _param(
    "max_lag",
    "query",
    "let a replica at most this many records behind answer",
    {"type": "integer", "minimum": 0},
)
MIN_OFFSET = _param("min_offset", "query", "PARTITION:OFFSET the replica must have applied first")
TIMEOUT = _param(
    "timeout_ms",
    "query",
    "how long min_offset may wait",
    {"type": "integer", "minimum": 0, "maximum": 30000},
)
ANY = {}  # a table value: whatever JSON its value serde renders


def document() -> dict[str, Any]:
    record = {
        "type": "object",
        "required": ["key", "value", "partition", "offset", "timestamp"],
        "properties": {
            "key": ANY,
            "value": ANY,
            "partition": {"type": "integer"},
            "offset": {"type": "integer"},
            "timestamp": {"type": "integer"},
        },
    }
    table = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "topic": {"type": "string"},
            "partitions": {"type": "integer"},
            "kind": {"enum": ["kv", "window"]},
            "global": {"type": "boolean"},
            "key_format": {"type": "string"},
            "value_format": {"type": "string"},
        },
    }
    replica = {
        "type": "object",
        "properties": {
            "table": {"type": "string"},
            "partition": {"type": "integer"},
            "role": {"enum": ["active", "standby", "warming"]},
            "offset": {"type": "integer"},
            "lag": {"type": "integer"},
        },
    }
    paths: dict[str, Any] = {
        "/v1/tables": {
            "get": {
                "summary": "list tables",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"tables": {"type": "array", "items": table}},
                        },
                        "tables",
                    )
                },
            }
        },
        "/v1/tables/{table}/keys/{key}": {
            "get": {
                "summary": "read one key",
                "parameters": [TABLE, KEY, MAX_LAG, MIN_OFFSET, TIMEOUT],
                "responses": {
                    "200": _json(record, "the key's latest value"),
                    **_errors(400, 404, 405, 503, 504),
                },
            }
        },
        "/v1/tables/{table}/keys:batchGet": {
            "post": {
                "summary": "read many keys, answers in request order",
                "parameters": [TABLE, MAX_LAG],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["keys"],
                                "properties": {"keys": {"type": "array", "maxItems": 1000}},
                            }
                        }
                    },
                },
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "results": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "key": ANY,
                                            "found": {"type": "boolean"},
                                            "value": ANY,
                                        },
                                    },
                                }
                            },
                        },
                        "results",
                    ),
                    **_errors(400, 404, 405, 503),
                },
            }
        },
        "/v1/tables/{table}/range": {
            "get": {
                "summary": "keys in serialized-byte order across all partitions",
                "parameters": [
                    TABLE,
                    _param("from", "query", "first key (inclusive)"),
                    _param("to", "query", "end key (exclusive)"),
                    _param("prefix", "query", "keys starting with these bytes"),
                    _param(
                        "limit",
                        "query",
                        "page size",
                        {"type": "integer", "minimum": 1, "maximum": 10000},
                    ),
                    _param("cursor", "query", "next_cursor of the previous page"),
                    MAX_LAG,
                    _param(
                        "owned",
                        "query",
                        "true: only the partitions this node is active for",
                        {"enum": ["true", "false"]},
                    ),
                ],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "items": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {"key": ANY, "value": ANY},
                                    },
                                },
                                "next_cursor": {"type": ["string", "null"]},
                            },
                        },
                        "a page",
                    ),
                    **_errors(400, 404, 405, 503),
                },
            }
        },
        "/v1/tables/{table}/keys/{key}/windows": {
            "get": {
                "summary": "a window table's windows for a key, by start time",
                "parameters": [
                    TABLE,
                    KEY,
                    _param(
                        "from",
                        "query",
                        "earliest window start, epoch ms",
                        {"type": "integer", "minimum": 0},
                    ),
                    _param(
                        "to",
                        "query",
                        "latest window start, epoch ms",
                        {"type": "integer", "minimum": 0},
                    ),
                    MAX_LAG,
                ],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "items": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "start": {"type": "integer"},
                                            "end": {"type": "integer"},
                                            "value": ANY,
                                        },
                                    },
                                }
                            },
                        },
                        "windows",
                    ),
                    **_errors(400, 404, 405, 503),
                },
            }
        },
        "/v1/tables/{table}/count": {
            "get": {
                "summary": "number of keys",
                "parameters": [TABLE, MAX_LAG],
                "responses": {
                    "200": _json(
                        {"type": "object", "properties": {"count": {"type": "integer"}}}, "count"
                    ),
                    **_errors(400, 404, 405, 503),
                },
            }
        },
        "/v1/tables/{table}/keys/{key}/metadata": {
            "get": {
                "summary": "where a key lives",
                "parameters": [TABLE, KEY],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "partition": {"type": "integer"},
                                "active": {"type": ["object", "null"]},
                                "standbys": {"type": "array"},
                            },
                        },
                        "owners",
                    ),
                    **_errors(400, 404, 405),
                },
            }
        },
        "/v1/cluster": {
            "get": {
                "summary": "nodes and their replicas",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "nodes": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "id": {"type": "string"},
                                            "url": {"type": "string"},
                                            "state": {"type": "string"},
                                            "replicas": {"type": "array", "items": replica},
                                        },
                                    },
                                }
                            },
                        },
                        "the cluster",
                    )
                },
            }
        },
        "/healthz": {
            "get": {"summary": "liveness", "responses": {"200": {"description": "alive"}}}
        },
        "/readyz": {
            "get": {
                "summary": "200 once every active replica is caught up",
                "responses": {"200": {"description": "ready"}, "503": {"description": "restoring"}},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus text",
                "responses": {
                    "200": {
                        "description": "metrics",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
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
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {
                                "code": {
                                    "enum": [
                                        "table_not_found",
                                        "key_not_found",
                                        "not_found",
                                        "bad_request",
                                        "unauthorized",
                                        "forbidden",
                                        "method_not_allowed",
                                        "partition_unavailable",
                                        "timeout",
                                    ]
                                },
                                "message": {"type": "string"},
                            },
                        }
                    },
                }
            }
        },
    }
