"""Open positions → NASDAQ share-holders, and a weekly e-mail sent once per client.

`share-holders` is a compacted topic: key = position id, value = the whole
position ({"client", "exchange", "symbol", "quantity"}), null = closed. The
table `us-share-holders` maps each client holding a NASDAQ position to the set
of those position ids; a client whose last one closes disappears. "SELECT
DISTINCT client" is a scan of its keys. Run it with

    tablecast dev examples/share_holders.py --generate --nodes 3

then   curl localhost:8080/v1/tables/us-share-holders/range
and    python examples/share_holders.py mail http://127.0.0.1:8080   (once per node)
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from typing import Any

import tablecast as tc

TOPIC = "share-holders"
PARTITIONS = 6
EXCHANGES = ["NASDAQ", "NYSE", "LSE"]


def on_nasdaq(position_id: str, position: dict[str, Any]) -> bool:
    return position["exchange"] == "NASDAQ"


def by_client(position_id: str, position: dict[str, Any]) -> tuple[str, list[str]]:
    return position["client"], [position_id]


def union(held: list[str], more: list[str]) -> list[str]:
    return sorted(set(held) | set(more))


def difference(held: list[str], gone: list[str]) -> list[str] | None:
    left = sorted(set(held) - set(gone))
    return left or None  # no NASDAQ position left: the client leaves the table


def build(app_id: str = "shareholders", topic: str = TOPIC) -> tc.App:
    app = tc.App(app_id)
    positions = app.table(topic, key=tc.serde.string(), value=tc.serde.json())
    (
        positions.filter(on_nasdaq)
        .group_by(by_client)
        .reduce(union, difference)
        .materialize("us-share-holders")
    )
    return app


app = build()


def expected(positions: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """The table, computed directly from the latest positions (the test's reference)."""
    out: dict[str, set[str]] = {}
    for pid, pos in positions.items():
        if pos["exchange"] == "NASDAQ":
            out.setdefault(pos["client"], set()).add(pid)
    return {client: sorted(ids) for client, ids in out.items()}


def weekly_email(
    node_url: str, send: Callable[[str, list[str]], None], table: str = "us-share-holders"
) -> int:
    """Mail every client this node is active for.

    Run beside every node: each client gets exactly one mail across the cluster.
    """
    sent = 0
    with tc.Client(node_url) as client:
        for client_id, positions in client.owned(node_url, table):
            send(client_id, positions)
            sent += 1
    return sent


def generate(bootstrap_servers: str, rate_per_s: float = 50.0) -> None:
    """Open, move and close positions forever."""
    import orjson

    from tablecast.kafka.topics import COMPACTED, ensure_topic

    ensure_topic(bootstrap_servers, TOPIC, PARTITIONS, COMPACTED)
    producer = tc.producer(bootstrap_servers)
    while True:
        pid = f"pos-{random.randrange(500):04d}"
        if random.random() < 0.2:
            producer.produce(TOPIC, key=pid.encode(), value=None)
        else:
            position = {
                "client": f"client-{random.randrange(60):03d}",
                "symbol": "AAPL",
                "exchange": random.choice(EXCHANGES),
                "quantity": random.randrange(1, 500),
            }
            producer.produce(TOPIC, key=pid.encode(), value=orjson.dumps(position))
        producer.poll(0)
        time.sleep(1.0 / rate_per_s)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "mail":
    count = weekly_email(
        sys.argv[2], lambda c, ps: print(f"mail to {c}: {len(ps)} NASDAQ position(s)")
    )
    print(f"{count} mail(s) sent by the node at {sys.argv[2]}")
