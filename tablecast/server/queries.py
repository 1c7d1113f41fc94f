"""Query handlers: read the node's stores and render the SPEC's answers."""

from __future__ import annotations

from typing import Any

import orjson

from tablecast.cluster.node import Node
from tablecast.kafka.catalog import TableInfo
from tablecast.kafka.partitioner import partition_for
from tablecast.serde import SerdeError
from tablecast.server.errors import ApiError

RETRY_AFTER = [("retry-after", "1")]


def list_tables(node: Node) -> bytes:
    return orjson.dumps({"tables": [t.public() for t in node.tables.values()]})


def cluster(node: Node) -> bytes:
    """The nodes this node knows and the replicas each holds (only itself, until membership)."""
    me = {
        "id": node.id,
        "url": node.config.url,
        "state": "ready" if node.ready else "restoring",
        "replicas": [r.public() for r in node.ingestor.replicas.values()],
    }
    return orjson.dumps({"nodes": [me]})


def readiness(node: Node) -> tuple[int, bytes]:
    restoring = [
        {"table": r.table.name, "partition": r.partition, "lag": r.lag}
        for r in node.ingestor.replicas.values()
        if not r.caught_up
    ]
    ready = node.ready
    body = {"ready": ready, "catalog_loaded": node.ingestor.catalog.loaded, "restoring": restoring}
    return (200 if ready else 503), orjson.dumps(body)


def table(node: Node, name: str) -> TableInfo:
    info = node.tables.get(name)
    if info is None:
        raise ApiError("table_not_found", f"no table named {name!r}")
    return info


def parse_key(node: Node, info: TableInfo, text: str) -> tuple[Any, bytes]:
    """The key object and its serialized bytes, from the key's text form in the URL."""
    if len(text) > node.config.max_key_bytes:
        raise ApiError("bad_request", f"key longer than {node.config.max_key_bytes} characters")
    key_serde = info.key_serde
    try:
        key = key_serde.parse_text(text)
        return key, key_serde.serialize(key)
    except SerdeError as e:
        raise ApiError(
            "bad_request", f"key {text!r} is not a {key_serde.format} key: {e}"
        ) from None


def get_key(
    node: Node, table_name: str, key_text: str, params: dict[str, str]
) -> tuple[int, bytes, list[tuple[str, str]]]:
    info = table(node, table_name)
    _, raw = parse_key(node, info, key_text)
    partition = partition_for(raw, info.partitions)
    replica = node.replica(info.name, partition)
    max_lag = _int_param(params, "max_lag")
    if replica is None or not (
        replica.caught_up or (max_lag is not None and replica.lag <= max_lag)
    ):
        raise ApiError(
            "partition_unavailable",
            f"partition {partition} of {info.name!r} has no replica ready here yet",
            RETRY_AFTER,
        )
    headers = [("x-tablecast-node", node.id), ("x-tablecast-lag", str(replica.lag))]
    record = replica.store.get(raw)
    if record is None:
        raise ApiError("key_not_found", f"key {key_text!r} is not in {info.name!r}", headers)
    body = orjson.dumps(
        {
            "key": info.key_serde.to_json(raw),
            "value": info.value_serde.to_json(record.value),
            "partition": partition,
            "offset": record.offset,
            "timestamp": record.timestamp,
        }
    )
    return 200, body, headers


def _int_param(params: dict[str, str], name: str) -> int | None:
    text = params.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ApiError("bad_request", f"{name} must be an integer, not {text!r}") from None
    if value < 0:
        raise ApiError("bad_request", f"{name} must not be negative")
    return value
