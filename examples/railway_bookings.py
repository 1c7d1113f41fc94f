"""Railway bookings: each customer's latest booking, and every booking in a time period.

`bookings` has 9 partitions; key = customer id, value = {"ts": epoch ms, "train": ...}.
Two tables:
- `latest-booking`: customer → the latest booking, with a week of history (what a
  customer had booked at any time:  /v1/tables/latest-booking/keys/c042?as_of=<epoch ms>,
  or every version:  /v1/tables/latest-booking/keys/c042/history) and an index by train
  (whose latest booking is on a train:  /v1/tables/latest-booking/index/train/IC%20512);
- `bookings-by-time`: one row per booking under the composite key
  "<customer>|<ts as 13 digits>", so a customer's bookings between two times are a
  range query:  /v1/tables/bookings-by-time/range?from=c042|1700000000000&to=c042|1700086400000
  (or all of them with ?prefix=c042|).

    tablecast dev examples/railway_bookings.py --generate
"""

from __future__ import annotations

import random
import time
from datetime import timedelta
from typing import Any

import tablecast as tc

TOPIC = "bookings"
PARTITIONS = 9


def booking_key(customer: str, booking: dict[str, Any]) -> str:
    # zero-padded so that byte order is time order within a customer
    return f"{customer}|{booking['ts']:013d}"


def build(app_id: str = "railway", topic: str = TOPIC) -> tc.App:
    app = tc.App(app_id)
    bookings = app.stream(topic, key=tc.serde.string(), value=tc.serde.json())
    bookings.to_table().materialize(
        "latest-booking",
        history=timedelta(days=7),
        indexes={"train": lambda customer, booking: booking["train"]},
    )
    bookings.select_key(booking_key).to_table().materialize("bookings-by-time")
    return app


app = build()


def generate(bootstrap_servers: str, rate_per_s: float = 50.0) -> None:
    import orjson

    from tablecast.kafka.topics import ensure_topic

    ensure_topic(bootstrap_servers, TOPIC, PARTITIONS)
    producer = tc.producer(bootstrap_servers)
    while True:
        customer = f"c{random.randrange(200):03d}"
        booking = {"ts": int(time.time() * 1000), "train": f"IC {random.randrange(100, 999)}"}
        producer.produce(TOPIC, key=customer.encode(), value=orjson.dumps(booking))
        producer.poll(0)
        time.sleep(1.0 / rate_per_s)
