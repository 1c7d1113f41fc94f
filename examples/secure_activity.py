"""Cross-node queries with auth: Avro events aggregated per user, served by two nodes with JWT.

`page-views` carries Avro records in the Confluent wire format (magic byte +
schema id) that the pipeline reads without a schema registry. The table
`activity` holds per user {"views", "ms"}. Two nodes require a bearer JWT
(HS256); a query to either node for any user gives the same answer, the
forwarded hop carrying the caller's token.

With the policy beside this file (`secure_activity.policy.yaml`) each user
reads only their own activity — the token's `sub` is the key — and a token
with `"admin": true` reads everything; the node that reads the store applies
it, whichever node the query came to.

    tablecast dev examples/secure_activity.py --generate --nodes 2   (no auth in dev)
    tablecast serve --app activity --port 8080 --auth-jwt-secret $SECRET \
        --auth-policy examples/secure_activity.policy.yaml            (with auth)
"""

from __future__ import annotations

import random
import time
from typing import Any

import tablecast as tc

TOPIC = "page-views"
PARTITIONS = 4
SCHEMA_ID = 7
SCHEMA = {
    "type": "record",
    "name": "PageView",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "page", "type": "string"},
        {"name": "ms", "type": "long"},
    ],
}
VIEWS = tc.serde.avro(SCHEMA, confluent=True, schema_id=SCHEMA_ID)


def start() -> dict[str, int]:
    return {"views": 0, "ms": 0}


def add(user: str, view: dict[str, Any], total: dict[str, int]) -> dict[str, int]:
    return {"views": total["views"] + 1, "ms": total["ms"] + view["ms"]}


def build(app_id: str = "activity", topic: str = TOPIC) -> tc.App:
    app = tc.App(app_id)
    views = app.stream(topic, key=tc.serde.string(), value=VIEWS)
    views.group_by_key().aggregate(start, add, value=tc.serde.json()).materialize("activity")
    return app


app = build()


def generate(bootstrap_servers: str, rate_per_s: float = 100.0) -> None:

    from tablecast.kafka.topics import ensure_topic

    ensure_topic(bootstrap_servers, TOPIC, PARTITIONS)
    producer = tc.producer(bootstrap_servers)
    while True:
        user = f"u{random.randrange(100):03d}"
        view = {
            "user": user,
            "page": f"/p/{random.randrange(20)}",
            "ms": random.randrange(10, 5000),
        }
        producer.produce(TOPIC, key=user.encode(), value=VIEWS.serialize(view))
        producer.poll(0)
        time.sleep(1.0 / rate_per_s)
