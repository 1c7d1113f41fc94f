"""The API's error answers: ``{"error": {"code", "message"}}`` with a fixed status per code.

docs/http-api.md lists the codes.
"""

from __future__ import annotations

import orjson

STATUS = {
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "table_not_found": 404,
    "key_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "payload_too_large": 413,
    "rate_limited": 429,
    "partition_unavailable": 503,
    "timeout": 504,
    "internal": 500,
}


class ApiError(Exception):
    def __init__(self, code: str, message: str, headers: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = STATUS[code]
        self.headers = headers or []

    def body(self) -> bytes:
        return orjson.dumps({"error": {"code": self.code, "message": self.message}})
