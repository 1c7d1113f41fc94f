"""tablecast: serve the live state of Kafka streams.

The public API: ``App`` and its streams and tables, ``serde``,
``windows``, ``Client`` and the errors it raises (``QueryError``, its subclass
``AuthError`` for a refused token, ``WatchError`` and ``WatchAuthError``), and
``producer`` (a Kafka producer for feeding an App's input: Java's partitioning and
the Kafka client settings in force), and ``attach`` / ``detach`` (serve a topic
something else writes as a table, no pipeline; ``AttachError`` says why one cannot).
Everything else is internal and may change.
``App`` is imported lazily so that a serving node never loads PySpark, and
``Client`` so that Spark executors, which import this package to run an App's
callables, need no HTTP client; the errors are imported lazily too, from a module
that needs no HTTP client either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tablecast import serde, windows
from tablecast.version import __version__ as __version__

if TYPE_CHECKING:
    from tablecast.client import Client
    from tablecast.client.errors import AuthError, QueryError, WatchAuthError, WatchError
    from tablecast.kafka.attach import AttachError, attach, detach
    from tablecast.pipeline.app import App

__all__ = [
    "App",
    "AttachError",
    "AuthError",
    "Client",
    "QueryError",
    "WatchAuthError",
    "WatchError",
    "attach",
    "detach",
    "producer",
    "serde",
    "windows",
]
#: what `tablecast.client.errors` holds: the errors the client raises
_ERRORS = ("AuthError", "QueryError", "WatchAuthError", "WatchError")


def producer(bootstrap_servers: str, settings: dict[str, Any] | None = None) -> Any:
    """A confluent-kafka ``Producer`` for an App's input topics.

    It partitions keys as Kafka's Java producer does (murmur2, so Spark and
    the serving nodes agree on every key's partition), applies the Kafka
    client settings in force (``--kafka-config`` / ``TABLECAST_KAFKA_CONFIG``:
    SASL, TLS ...), waits for every in-sync replica and is idempotent.
    `settings` are further librdkafka settings (e.g. ``{"linger.ms": 20}``).
    """
    from confluent_kafka import Producer

    from tablecast.contract.partitioner import PRODUCER_CONFIG
    from tablecast.kafka.config import producer_conf

    return Producer(producer_conf(bootstrap_servers, {**PRODUCER_CONFIG, **(settings or {})}))


def __getattr__(name: str) -> Any:
    if name == "App":
        from tablecast.pipeline.app import App

        return App
    if name == "Client":
        from tablecast.client import client

        return client.Client
    if name in ("attach", "detach", "AttachError"):
        from tablecast.kafka import attach

        return getattr(attach, name)
    if name in _ERRORS:
        from tablecast.client import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'tablecast' has no attribute {name!r}")
