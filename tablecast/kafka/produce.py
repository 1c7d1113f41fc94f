"""Producing when librdkafka's local queue may be full (bulk loads, a broker away)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer


def produce_waiting(p: Producer, topic: str, wait_s: float = 0.05, **record: Any) -> None:
    """``p.produce(topic, **record)``, serving delivery reports for `wait_s` at a time while
    the queue is full instead of raising BufferError."""
    while True:
        try:
            p.produce(topic, **record)
            return
        except BufferError:
            p.poll(wait_s)
