"""Small helpers for the prometheus-client collectors each part of a node keeps."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric


def counters(*rows: tuple[str, str, float]) -> Iterator[Metric]:
    """One unlabelled counter per (name, help, value)."""
    for name, text, value in rows:
        counter = CounterMetricFamily(name, text)
        counter.add_metric([], value)
        yield counter
