"""The node's HTTP API (SPEC §3) as an RSGI application, served by granian.

RSGI is granian's native interface and measured fastest here (NOTES.md), so
there is no framework: :meth:`HttpApp.__call__` splits the path, dispatches to
a handler, and turns :class:`ApiError` into the SPEC's error JSON. A handler
returns ``(status, body)`` or ``(status, body, headers)``.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qs

import orjson

from tablecast.cluster.node import Node
from tablecast.server import queries
from tablecast.server.errors import ApiError

log = logging.getLogger(__name__)

JSON = ("content-type", "application/json")

Answer = tuple[int, bytes] | tuple[int, bytes, list[tuple[str, str]]]


class HttpApp:
    def __init__(self, node: Node) -> None:
        self.node = node

    async def __call__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":
            return
        try:
            answer = self.route(scope.method, scope.path, scope.query_string)
        except ApiError as e:
            answer = (e.status, e.body(), e.headers)
        except Exception:  # no client input may produce a stack trace or a hung request
            log.exception("unhandled error on %s %s", scope.method, scope.path)
            answer = (500, ApiError("internal", "internal error").body())
        status, body = answer[0], answer[1]
        headers = [JSON, *(answer[2] if len(answer) > 2 else ())]  # type: ignore[misc]
        proto.response_bytes(status, headers, body)

    def route(self, method: str, path: str, query_string: str) -> Answer:
        params = _params(query_string)
        parts = path.strip("/").split("/", 4)
        if parts[0] == "v1":
            if method != "GET":
                raise ApiError("method_not_allowed", f"{method} is not allowed on {path}")
            if len(parts) == 2 and parts[1] == "tables":
                return 200, queries.list_tables(self.node)
            if len(parts) == 2 and parts[1] == "cluster":
                return 200, queries.cluster(self.node)
            if len(parts) == 5 and parts[1] == "tables" and parts[3] == "keys":
                return queries.get_key(self.node, parts[2], parts[4], params)
        elif len(parts) == 1 and method == "GET":
            if parts[0] == "healthz":
                return 200, b'{"status":"ok"}'
            if parts[0] == "readyz":
                return queries.readiness(self.node)
        raise ApiError("not_found", f"no route for {method} {path}")


def _params(query_string: str) -> dict[str, str]:
    if not query_string:
        return {}
    try:
        parsed = parse_qs(query_string, keep_blank_values=True, strict_parsing=False)
    except ValueError as e:
        raise ApiError("bad_request", f"bad query string: {e}") from None
    return {k: v[-1] for k, v in parsed.items()}


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)
