"""Range-scan cursors: opaque to clients, and rejected if altered.

A cursor names the last key a page returned and the query it belongs to,
signed with HMAC-SHA256 under a key every node of the app derives alike, so a
page can be continued on any node.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import orjson

from tablecast.query.errors import ApiError


class Cursors:
    def __init__(self, secret: bytes) -> None:
        self._key = hashlib.sha256(b"tablecast-cursor\x00" + secret).digest()

    def encode(self, last_key: bytes, query: list[str | None]) -> str:
        payload = base64.urlsafe_b64encode(orjson.dumps([last_key.hex(), query])).rstrip(b"=")
        return payload.decode() + "." + self._sign(payload)

    def decode(self, cursor: str, query: list[str | None]) -> bytes:
        """The last key of the previous page; 400 for a cursor not made by us for this query."""
        if not cursor.isascii():  # ours are base64 and a dot; encode() would raise on others
            raise ApiError("bad_request", "invalid cursor")
        payload, _, sig = cursor.encode().partition(b".")
        if not payload or not hmac.compare_digest(sig, self._sign(payload).encode()):
            raise ApiError("bad_request", "invalid cursor")
        try:
            last_hex, made_for = orjson.loads(
                base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4))
            )
            last = bytes.fromhex(last_hex)
        except (ValueError, TypeError, orjson.JSONDecodeError):
            raise ApiError("bad_request", "invalid cursor") from None
        if made_for != query:
            raise ApiError("bad_request", "the cursor belongs to a different query")
        return last

    def _sign(self, payload: bytes) -> str:
        mac = hmac.new(self._key, payload, hashlib.sha256).digest()[:18]
        return base64.urlsafe_b64encode(mac).decode()
