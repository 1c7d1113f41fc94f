"""Reading a consumer in batches without holding a lone record back."""

from __future__ import annotations

from typing import Any


def take(consumer: Any, size: int, wait_s: float) -> list[Any]:
    """Up to `size` messages: what the consumer holds now, else the first to come within
    `wait_s` and whatever came with it. (``consume(n, timeout)`` waits for a full batch or
    the timeout, which would hold a lone record back; one ``poll`` per message is tens of
    times slower.)"""
    msgs = consumer.consume(size, 0)
    if not msgs:
        msgs = consumer.consume(1, wait_s)
        if msgs:
            msgs += consumer.consume(size - 1, 0)
    return list(msgs)
