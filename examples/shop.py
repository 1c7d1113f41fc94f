"""A shop: revenue per store from Avro invoices, customers per city from a table, and
revenue per city from invoices joined with their customer.

    tablecast dev examples/shop.py --generate
    curl http://localhost:8080/v1/tables/revenue/keys/store-3
    curl http://localhost:8080/v1/tables/customers_per_city/keys/Lyon
    curl http://localhost:8080/v1/tables/revenue_per_city/keys/Lyon
    tablecast explain examples/shop.py      # operators, internal topics, Spark queries

`pos` carries invoices in Avro's Confluent wire format (read without a schema
registry); `customers` is a table keyed by customer id whose rows move between
cities: the count per city retracts a customer's old city when it changes, as
Kafka Streams' KTable.groupBy(...).count() does. Invoices are keyed by customer
id too, so each one joins the city its customer lives in when it is processed
(a stream-table join, Kafka Streams' KStream.join(KTable)): a move changes where
later invoices count, not earlier ones.
"""

from __future__ import annotations

import random
import time

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

app = tc.App("shop")
invoices = app.stream("pos", key=tc.serde.string(), value=tc.serde.avro(INVOICE, confluent=True))
# a Column picks the group (JVM); a Python callable folds the totals (Python workers)
(
    invoices.filter(F.col("value.total") > 0)
    .group_by(F.col("value.store"))
    .aggregate(lambda: 0.0, lambda store, inv, revenue: round(revenue + inv["total"], 2))
    .materialize("revenue")
)
customers = app.table("customers", key=tc.serde.string(), value=tc.serde.json())
customers.group_by(lambda cid, c: (c["city"], cid)).count().materialize("customers_per_city")
(
    invoices.join(customers, lambda inv, c: {"city": c["city"], "total": inv["total"]})
    .group_by(lambda cid, sale: sale["city"])
    .aggregate(lambda: 0.0, lambda city, sale, revenue: round(revenue + sale["total"], 2))
    .materialize("revenue_per_city")
)


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
