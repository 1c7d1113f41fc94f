"""Point-of-sale invoices: shipments, loyalty points per card, and a masked feed for Hadoop.

`pos` carries invoices keyed by store id. From it:
- HOME-DELIVERY invoices (a branch of `split`) become shipment records on `shipments`;
- PRIME customers' invoices (split by customer type) earn loyalty points. They are
  re-keyed by card number and repartitioned through `<app>.repartition.rewards-0` with a custom
  partitioner (the card's last four digits), so one card's points are kept in
  one place: `transform_values` keeps each card's running points in its
  persistent state, and the running totals make the queryable `rewards` table;
  each new total is also announced on `notifications`;
- every invoice, its card number masked, is flattened into one record per line
  on `hadoop-sink`;
- a card that buys at the coffee counter and in the electronics department
  within 20 minutes of each other earns a promotion: the two departments'
  invoices, re-keyed by card, meet in a windowed stream-stream join (Kafka
  Streams in Action's coffee-and-electronics join) and each pair is written
  to `promotions`.

    tablecast dev examples/point_of_sale.py --generate
    curl localhost:8080/v1/tables/rewards/keys/4000123400010037   # CARDS[1]: one the generator uses
"""

from __future__ import annotations

import random
import time
from datetime import timedelta
from typing import Any

import tablecast as tc

TOPIC = "pos"
PARTITIONS = 6
BY_CARD_PARTITIONS = 4
PROMOTION_WINDOW = timedelta(minutes=20)


def card_partition(card: str, points: Any, partitions: int) -> int:
    """Cards are spread by their last four digits (the custom partitioner)."""
    return int(card[-4:]) % partitions


def home_delivery(store: str, invoice: dict[str, Any]) -> bool:
    return invoice["delivery"] == "HOME-DELIVERY"


def shipment(store: str, invoice: dict[str, Any]) -> dict[str, Any]:
    return {"invoice": invoice["id"], "store": store, "address": invoice["address"]}


def customer_type(store: str, invoice: dict[str, Any]) -> str:
    return invoice["customer_type"]


def card_of(store: str, invoice: dict[str, Any]) -> str:
    return invoice["card"]


def points_of(card: str, invoice: dict[str, Any]) -> int:
    return int(invoice["total"])  # a point per whole unit spent


def earn(card: str, points: int, state: Any) -> dict[str, int]:
    """The card's running rewards, kept in its own state across invoices and restarts."""
    rewards = state.get({"points": 0, "invoices": 0})
    rewards = {"points": rewards["points"] + points, "invoices": rewards["invoices"] + 1}
    state.set(rewards)
    return rewards


def department(card: str, invoice: dict[str, Any]) -> str:
    return invoice["department"]


def promotion(coffee: dict[str, Any], electronics: dict[str, Any]) -> dict[str, Any]:
    return {
        "card": coffee["card"],
        "coffee": coffee["id"],
        "electronics": electronics["id"],
        "spent": round(coffee["total"] + electronics["total"], 2),
    }


def notification(card: str, rewards: dict[str, int] | None) -> dict[str, Any] | None:
    return None if rewards is None else {"card": card, "points": rewards["points"]}


def masked_lines(store: str, invoice: dict[str, Any]) -> list[dict[str, Any]]:
    card = "*" * (len(invoice["card"]) - 4) + invoice["card"][-4:]
    return [
        {"invoice": invoice["id"], "store": store, "card": card, **line}
        for line in invoice["lines"]
    ]


def build(app_id: str = "pos", topic: str = TOPIC) -> tc.App:
    app = tc.App(app_id)
    invoices = app.stream(topic, key=tc.serde.string(), value=tc.serde.json())
    # Kafka Streams' split().branch(): one named stream per kind of invoice that matters
    by_delivery = invoices.split({"home": home_delivery})
    by_delivery["home"].map_values(shipment).to(f"{app_id}-shipments")
    by_customer = invoices.split(by=customer_type, names=["PRIME"])
    rewards = (
        by_customer["PRIME"]
        .select_key(card_of)
        .map_values(points_of)
        .repartition(partitions=BY_CARD_PARTITIONS, partitioner=card_partition)
        .transform_values(earn)
        .to_table()
        .materialize("rewards")
    )
    rewards.to_stream().map_values(notification).to(f"{app_id}-notifications")
    invoices.flat_map_values(masked_lines).to(f"{app_id}-hadoop-sink")
    # KStream-KStream join: one promotion per coffee and electronics invoice of a card
    # that are at most 20 minutes apart (either first)
    by_department = invoices.select_key(card_of).split(
        by=department, names=["coffee", "electronics"]
    )
    by_department["coffee"].join(
        by_department["electronics"], promotion, window=tc.windows.join(before=PROMOTION_WINDOW)
    ).to(f"{app_id}-promotions")
    return app


app = build()


CARDS = [f"40001234{n:04d}{(n * 37) % 10000:04d}" for n in range(30)]


def invoice(i: int, rng: random.Random) -> tuple[str, dict[str, Any]]:
    """A random invoice of store `store-N`, paid with one of a few dozen cards."""
    store = f"store-{rng.randrange(8)}"
    lines = [
        {
            "item": f"sku-{rng.randrange(50)}",
            "qty": rng.randrange(1, 4),
            "price": round(rng.uniform(1, 90), 2),
        }
        for _ in range(rng.randrange(1, 4))
    ]
    return store, {
        "id": f"inv-{i:06d}",
        "card": rng.choice(CARDS),
        "customer_type": rng.choice(["PRIME", "NON-PRIME"]),
        "delivery": rng.choice(["HOME-DELIVERY", "STORE-PICKUP"]),
        "department": rng.choice(["coffee", "electronics", "grocery"]),
        "address": {"city": rng.choice(["Lyon", "Paris", "Lille"])},
        "lines": lines,
        "total": round(sum(x["qty"] * x["price"] for x in lines), 2),
    }


def generate(bootstrap_servers: str, rate_per_s: float = 20.0) -> None:
    import orjson

    from tablecast.kafka.topics import ensure_topic

    ensure_topic(bootstrap_servers, TOPIC, PARTITIONS)
    producer = tc.producer(bootstrap_servers)
    rng = random.Random()
    i = 0
    while True:
        store, inv = invoice(i, rng)
        producer.produce(TOPIC, key=store.encode(), value=orjson.dumps(inv))
        producer.poll(0)
        i += 1
        time.sleep(1.0 / rate_per_s)
