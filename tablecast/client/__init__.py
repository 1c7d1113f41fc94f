"""The partition-aware Python client (``tablecast.Client``)."""

from tablecast.client.client import Client, QueryError
from tablecast.client.watch import WatchError, WatchEvent

__all__ = ["Client", "QueryError", "WatchError", "WatchEvent"]
