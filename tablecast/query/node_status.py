"""Node status answers: health, readiness, and the cluster view.

``GET /healthz`` — liveness: ``200 {"status": "ok", "node", "incarnation",
"kafka"}`` while the process serves HTTP. It doubles as the nodes' direct
check of each other: a request with ``x-tablecast-challenge: <nonce>`` gets the
answer signed with the cluster secret over the body and the nonce
(``x-tablecast-signature``), so nobody without the secret can answer as a node.

``GET /readyz`` — *can this node serve reads of its share now?* ``200`` when
the catalog is loaded and every partition this node is the target active of
(and every partition of a global table) is held and caught up, i.e. was read
to the end of its topic at least once; ``503`` otherwise (the body lists the
partitions still restoring). A Kafka outage does not by itself make a node
unready: caught-up data stays servable, and the assignment is kept while Kafka
is unreachable, so a node that was ready stays ready. The body says how fresh
it is: ``"kafka": "reachable" | "unreachable"`` (this node's own connection,
judged by its heartbeats coming back), ``"kafka_silent_ms"`` (since Kafka last
carried one back, on this node's clock) and ``"stale": true`` while Kafka is
unreachable — the data may then miss any write made since ``kafka_silent_ms``
ago.

``GET /v1/cluster`` — every live node with its replicas (docs/http-api.md), plus for
each node ``"kafka"`` (for a peer: its own account from its last direct
answer), ``"heartbeat_age_ms"`` (since this node *received* the peer's last
heartbeat through Kafka; null if none since this node started) and
``"direct_check_age_ms"`` (since the peer last answered a direct check). Ages
are measured on this node's monotonic clock, never by comparing two clocks, but
for each replica's ``"freshness_ms"``: the age of the newest record it applied,
its timestamp (from the clock that wrote the record) against this node's wall clock.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from tablecast.cluster.liveness import CHALLENGE_HEADER, signed_health
from tablecast.cluster.node import Node
from tablecast.cluster.replica import age_ms
from tablecast.query.policy import Grants


def tables(node: Node, grants: Grants | None = None) -> bytes:
    """The served tables; with a policy, only those the caller may read some of."""
    infos = node.tables.values()
    if grants is not None:
        infos = [t for t in infos if grants.allows_table(t.name)]
    return orjson.dumps({"tables": [t.public() for t in infos]})


def _kafka(node: Node) -> str:
    return "reachable" if node.membership.kafka_reachable else "unreachable"


def health(node: Node, headers: Any) -> tuple[int, bytes, list[tuple[str, str]]]:
    m = node.membership
    body, extra = signed_health(
        node.signer, node.id, m.incarnation, _kafka(node), headers.get(CHALLENGE_HEADER)
    )
    return 200, body, extra


def cluster(node: Node, grants: Grants | None = None) -> bytes:
    """Every live node and the replicas it holds, with the role each plays for routing
    (with a policy, only replicas of tables the caller may read)."""
    view = node.view
    described = node.membership.describe()
    now_ms = int(time.time() * 1000)
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
                "freshness_ms": age_ms(state.get("newest_ms"), now_ms),
                **({"error": state["error"]} if "error" in state else {}),
            }
            for (t, p), state in sorted(member.replicas.items())
            if grants is None or grants.allows_table(t)
        ]
        how = described.get(member.id, {})
        nodes.append(
            {
                "id": member.id,
                "url": member.url,
                "state": "leaving" if member.leaving else "ready" if member.ready else "restoring",
                "kafka": how.get("kafka", "unknown"),
                "heartbeat_age_ms": how.get("heartbeat_age_ms"),
                "direct_check_age_ms": how.get("direct_check_age_ms"),
                "replicas": replicas,
            }
        )
    return orjson.dumps(
        {
            "nodes": nodes,
            "kafka": _kafka(node),
            "membership": {"rejected_records": node.membership.rejected},
        }
    )


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
    reachable = node.membership.kafka_reachable
    body = {
        "ready": ready,
        "catalog_loaded": node.ingestor.catalog.loaded,
        "restoring": restoring,
        "kafka": "reachable" if reachable else "unreachable",
        "kafka_silent_ms": round(node.membership.kafka_silent_s * 1000),
        "stale": not reachable,
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
