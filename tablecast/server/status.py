"""Node status answers: health, readiness, and the cluster view."""

from __future__ import annotations

import orjson

from tablecast.cluster.node import Node


def tables(node: Node) -> bytes:
    return orjson.dumps({"tables": [t.public() for t in node.tables.values()]})


def cluster(node: Node) -> bytes:
    """Every live node and the replicas it holds, with the role each plays for routing."""
    view = node.view
    nodes = []
    for member in sorted(view.members.values(), key=lambda m: m.id):
        replicas = [
            {
                "table": t,
                "partition": p,
                "role": view.role(member.id, (t, p)),
                "offset": state.get("offset", -1),
                "lag": state.get("lag", 0),
                # older nodes do not say: serving or warming is all they knew
                "state": state.get("state", "serving" if state.get("caught_up") else "warming"),
                "staleness_ms": state.get("staleness_ms", 0),
                **({"error": state["error"]} if "error" in state else {}),
            }
            for (t, p), state in sorted(member.replicas.items())
        ]
        nodes.append(
            {
                "id": member.id,
                "url": member.url,
                "state": "ready" if member.ready else "restoring",
                "replicas": replicas,
            }
        )
    return orjson.dumps({"nodes": nodes})


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
        if not r.restored
    ]
    ready = node.ready
    body = {
        "ready": ready,
        "catalog_loaded": node.ingestor.catalog.loaded,
        "restoring": restoring,
        "degraded": degraded(node),
    }
    return (200 if ready else 503), orjson.dumps(body)


def degraded(node: Node) -> list[dict[str, object]]:
    """Restored replicas that are failing to write or no longer count as caught up."""
    return [
        {
            "table": r.table.name,
            "partition": r.partition,
            "state": r.status,
            "lag": r.lag,
            "staleness_ms": r.staleness_ms(),
            "offset": r.position,
            **({"error": r.failed} if r.failed is not None else {}),
        }
        for r in list(node.ingestor.replicas.values())
        if r.restored and (r.failed is not None or not r.caught_up or r.stale_since is not None)
    ]
