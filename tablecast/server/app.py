"""The node's HTTP API (SPEC §3) as an RSGI application, served by granian.

RSGI is granian's native interface and measured fastest here (BENCHMARKS.md),
so there is no framework: :meth:`HttpApp.__call__` matches the route, calls a
handler from :mod:`queries` or :mod:`status`, and turns :class:`ApiError` into
the SPEC's error JSON. No client input reaches the client as a stack trace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import orjson

from tablecast.cluster.node import Node
from tablecast.server import openapi, status
from tablecast.server.cursor import Cursors
from tablecast.server.errors import ApiError
from tablecast.server.metrics import HttpStats, exposition
from tablecast.server.queries import Answer, Queries

log = logging.getLogger(__name__)

JSON = ("content-type", "application/json")
PROMETHEUS = ("content-type", "text/plain; version=0.0.4; charset=utf-8")
MAX_BODY = 1 << 20

Handler = Callable[[dict[str, str], Any], Answer | Awaitable[Answer]]


class HttpApp:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.queries = Queries(node, Cursors(node.config.app_id.encode()))
        self.stats = HttpStats()
        self._openapi = orjson.dumps(openapi.document())

    async def __call__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":
            return
        started = time.perf_counter()
        route = "unmatched"
        try:
            route, handler = self.match(scope.method, scope.path)
            answer = handler(_params(scope.query_string), proto)
            if not isinstance(answer, tuple):
                answer = await answer
        except ApiError as e:
            answer = (e.status, e.body(), e.headers)
        except Exception:  # no client input may produce a stack trace or a hung request
            log.exception("unhandled error on %s %s", scope.method, scope.path)
            answer = (500, ApiError("internal", "internal error").body(), [])
        code, body, headers = answer
        proto.response_bytes(code, [PROMETHEUS if route == "metrics" else JSON, *headers], body)
        self.stats.record(route, code, time.perf_counter() - started)

    def match(self, method: str, path: str) -> tuple[str, Handler]:
        """The route's name (for metrics) and its handler(params, proto)."""
        q = self.queries
        parts = path.split("/", 5)  # "", "v1", "tables", t, "keys", rest (may hold "/")
        n = len(parts)
        if n > 2 and parts[1] == "v1":
            if parts[2] == "tables" and n > 3:
                table = parts[3]
                if n == 6 and parts[4] == "keys":
                    _get(method)
                    rest = parts[5]
                    if rest.endswith("/windows"):
                        return "windows", lambda p, _: q.windows(table, rest[:-8], p)
                    if rest.endswith("/metadata"):
                        return "metadata", lambda p, _: q.metadata(table, rest[:-9])
                    return "key", lambda p, _: q.get_key(table, rest, p)
                if n == 5:
                    what = parts[4]
                    if what == "keys:batchGet":
                        if method != "POST":
                            raise ApiError("method_not_allowed", "keys:batchGet takes POST")
                        return "batch_get", lambda p, proto: self._batch_get(table, p, proto)
                    _get(method)
                    if what == "range":
                        return "range", lambda p, _: q.range(table, p)
                    if what == "count":
                        return "count", lambda p, _: q.count(table, p)
            elif n == 3 and parts[2] == "tables":
                _get(method)
                return "tables", lambda p, _: (200, status.tables(self.node), [])
            elif n == 3 and parts[2] == "cluster":
                _get(method)
                return "cluster", lambda p, _: (200, status.cluster(self.node), [])
        elif n == 2:
            name = parts[1]
            if name == "healthz":
                return "healthz", lambda p, _: (200, b'{"status":"ok"}', [])
            if name == "readyz":
                return "readyz", lambda p, _: (*status.readiness(self.node), [])
            if name == "metrics":
                return "metrics", lambda p, _: (200, exposition(self.node, self.stats), [])
            if name == "openapi.json":
                return "openapi", lambda p, _: (200, self._openapi, [])
        raise ApiError("not_found", f"no route for {method} {path}")

    async def _batch_get(self, table: str, params: dict[str, str], proto: Any) -> Answer:
        body = await proto()
        if len(body) > MAX_BODY:
            raise ApiError("bad_request", f"the body is larger than {MAX_BODY} bytes")
        return self.queries.batch_get(table, body, params)


def _get(method: str) -> None:
    if method != "GET":
        raise ApiError("method_not_allowed", f"{method} is not allowed here; use GET")


def _params(query: str) -> dict[str, str]:
    if not query:
        return {}
    try:
        return dict(parse_qsl(query, keep_blank_values=True, max_num_fields=64))
    except ValueError as e:
        raise ApiError("bad_request", f"bad query string: {e}") from None
