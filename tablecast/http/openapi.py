"""``/openapi.json``: the HTTP API as an OpenAPI 3.1 document, written from the routes the
node serves (:mod:`tablecast.http.routes`)."""

from __future__ import annotations

from typing import Any

from tablecast.http.routes import REDIRECT, ROUTES, STR, Route, object_of

ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: Any, description: str) -> dict[str, Any]:
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


def operation(route: Route) -> dict[str, Any]:
    """The route as an OpenAPI operation."""
    op: dict[str, Any] = {"summary": route.summary}
    if route.params:
        op["parameters"] = [p.openapi() for p in route.params]
    if route.body is not None:
        op["requestBody"] = route.body
    if route.responses is not None:
        op["responses"] = {**route.responses, **_errors(*route.errors)}
    else:
        redirect = {"307": REDIRECTED} if REDIRECT in route.params else {}
        ok = _json(route.ok, route.ok_description)
        op["responses"] = {"200": ok, **redirect, **_errors(*route.errors)}
    return op


def document(routes: tuple[Route, ...] = ROUTES) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for route in routes:
        if route.summary:  # the others are between nodes, or the console's
            paths.setdefault(route.documented_path, {})[route.method.lower()] = operation(route)
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
                "Error": object_of(
                    "error",
                    error=object_of(
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
