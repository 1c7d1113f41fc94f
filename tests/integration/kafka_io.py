"""Producing and reading test records on the real broker."""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import Consumer, Message, Producer

from tablecast.contract.partitioner import PRODUCER_CONFIG
from tablecast.kafka.config import client_conf
from tablecast.kafka.produce import produce_waiting


def produce(
    bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes | None]]
) -> None:
    # client_conf: the process's Kafka settings (config.use), so SASL_SSL tests produce too
    p = Producer(client_conf(bootstrap, PRODUCER_CONFIG))
    for key, value in records:
        produce_waiting(p, topic, key=key, value=value)
        p.poll(0)
    assert p.flush(60) == 0


def read_all(
    bootstrap: str, topic: str, expect: int, timeout: float = 60.0, to_the_end: bool = False
) -> list[Message]:
    """Read `topic` from the start until `expect` records arrived (or fail after `timeout`);
    `to_the_end`: then on until a poll finds nothing more (a topic that may hold more than
    `expect`, all written already)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{topic}-{time.time()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expect and time.monotonic() < deadline:
            out.extend(m for m in c.consume(1000, 0.5) if m.error() is None)
        while to_the_end and len(out) >= expect and time.monotonic() < deadline:
            more = [m for m in c.consume(1000, 1.0) if m.error() is None]
            if not more:
                break
            out.extend(more)
    finally:
        c.close()
    assert len(out) >= expect, f"{topic}: {len(out)} of {expect} records after {timeout}s"
    return out
