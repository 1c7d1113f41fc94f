"""A shop: revenue per store from Avro invoices, customers per city from a table,
revenue per city from invoices joined with their customer, and each customer's
visits (session windows).

    tablecast dev examples/shop.py --generate
    curl http://localhost:8080/v1/tables/revenue/keys/store-3
    curl http://localhost:8080/v1/tables/customers_per_city/keys/Lyon
    curl http://localhost:8080/v1/tables/revenue_per_city/keys/Lyon
    curl http://localhost:8080/v1/tables/visits/keys/c7/windows
    tablecast explain examples/shop.py      # operators, internal topics, Spark queries

`pos` carries invoices in Avro's Confluent wire format (read without a schema
registry); `customers` is a table keyed by customer id whose rows move between
cities: the count per city retracts a customer's old city when it changes, as
Kafka Streams' KTable.groupBy(...).count() does. Invoices are keyed by customer
id too, so each one joins the city its customer lives in when it is processed
(a stream-table join, Kafka Streams' KStream.join(KTable)): a move changes where
later invoices count, not earlier ones. A customer's invoices less than 30
minutes apart make one visit (a session window, Kafka Streams'
SessionWindows): `visits` holds each visit's invoice count and spend, and a
late invoice that bridges two visits merges them.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta
from typing import Any

from pyspark.sql import functions as F

import tablecast as tc

INVOICE = {
    "type": "record",
    "name": "Invoice",
    "fields": [
        {"name": "store", "type": "string"},
        {"name": "customer", "type": "string"},
        {"name": "total", "type": "double"},
    ],
}
CITIES = ["Lyon", "Paris", "Lille", "Nantes", "Nice"]
PARTITIONS = 6

VISIT_GAP = timedelta(minutes=30)


def new_visit() -> dict[str, float]:
    return {"invoices": 0, "spent": 0.0}


def visit(customer: str, invoice: dict[str, Any], v: dict[str, float]) -> dict[str, float]:
    return {"invoices": v["invoices"] + 1, "spent": round(v["spent"] + invoice["total"], 2)}


def merge_visits(customer: str, a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {"invoices": a["invoices"] + b["invoices"], "spent": round(a["spent"] + b["spent"], 2)}


def build(app_id: str = "shop", pos: str = "pos", customers_topic: str = "customers") -> tc.App:
    app = tc.App(app_id)
    invoices = app.stream(pos, key=tc.serde.string(), value=tc.serde.avro(INVOICE, confluent=True))
    # a Column picks the group (JVM); a Python callable folds the totals (Python workers)
    (
        invoices.filter(F.col("value.total") > 0)
        .group_by(F.col("value.store"))
        .aggregate(lambda: 0.0, lambda store, inv, revenue: round(revenue + inv["total"], 2))
        .materialize("revenue")
    )
    customers = app.table(customers_topic, key=tc.serde.string(), value=tc.serde.json())
    customers.group_by(lambda cid, c: (c["city"], cid)).count().materialize("customers_per_city")
    (
        invoices.join(customers, lambda inv, c: {"city": c["city"], "total": inv["total"]})
        .group_by(lambda cid, sale: sale["city"])
        .aggregate(lambda: 0.0, lambda city, sale, revenue: round(revenue + sale["total"], 2))
        .materialize("revenue_per_city")
    )
    # invoices are keyed by customer: their sessions are the customer's visits
    (
        invoices.group_by_key()
        .windowed_by(tc.windows.session(VISIT_GAP), grace=VISIT_GAP)
        .aggregate(new_visit, visit, merger=merge_visits)
        .materialize("visits")
    )
    return app


app = build()


def generate(bootstrap_servers: str, rate_per_s: float = 50.0) -> None:
    """Invoices from 10 stores, and customers who now and then move to another city."""
    import orjson

    from tablecast.kafka.topics import ensure_topic

    for topic in ("pos", "customers"):
        ensure_topic(bootstrap_servers, topic, PARTITIONS)
    wire = tc.serde.avro(INVOICE, confluent=True)
    producer = tc.producer(bootstrap_servers)
    while True:
        cid = f"c{random.randrange(200)}"
        if random.random() < 0.2:
            city = {"city": random.choice(CITIES)}
            producer.produce("customers", key=cid.encode(), value=orjson.dumps(city))
        invoice = {
            "store": f"store-{random.randrange(10)}",
            "customer": cid,
            "total": round(random.uniform(1, 200), 2),
        }
        producer.produce("pos", key=cid.encode(), value=wire.serialize(invoice))
        producer.poll(0)
        time.sleep(1.0 / rate_per_s)
