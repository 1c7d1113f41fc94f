"""The partition-aware Python client (``tablecast.Client``)."""

from tablecast.client.client import Client, QueryError

__all__ = ["Client", "QueryError"]
