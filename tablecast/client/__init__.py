"""The partition-aware Python client (``tablecast.Client``).

The errors are imported at once and need no HTTP client; the client itself (httpx) is
imported when first named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tablecast.client.errors import AuthError, QueryError, WatchAuthError, WatchError

if TYPE_CHECKING:
    from tablecast.client.client import Client, Pages, Read, ReadOptions
    from tablecast.client.watch import WatchEvent

__all__ = [
    "AuthError",
    "Client",
    "Pages",
    "QueryError",
    "Read",
    "ReadOptions",
    "WatchAuthError",
    "WatchError",
    "WatchEvent",
]


def __getattr__(name: str) -> Any:
    if name in ("Client", "Pages", "Read", "ReadOptions"):
        from tablecast.client import client

        return getattr(client, name)
    if name == "WatchEvent":
        from tablecast.client import watch

        return watch.WatchEvent
    raise AttributeError(f"module 'tablecast.client' has no attribute {name!r}")
