"""Node status answers: health, readiness, and the cluster view."""

from __future__ import annotations

import orjson

from tablecast.cluster.node import Node


def tables(node: Node) -> bytes:
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
        {
            "table": r.table.name,
            "partition": r.partition,
            "lag": r.lag,
            "restored": r.position,
            "target": r.restore_target,
        }
        for r in node.ingestor.replicas.values()
        if not r.caught_up
    ]
    ready = node.ready
    body = {"ready": ready, "catalog_loaded": node.ingestor.catalog.loaded, "restoring": restoring}
    return (200 if ready else 503), orjson.dumps(body)
