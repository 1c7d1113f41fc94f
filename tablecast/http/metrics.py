"""``/metrics``: request and replica figures in Prometheus text.

The hot path only bumps plain Python counters (a dict increment and a bisect);
prometheus-client reads them through a custom collector at scrape time, so
serving a key costs no metric-library calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tablecast.cluster.node import Node
from tablecast.live.hub import Hub
from tablecast.query.coalesce import Coalescer
from tablecast.query.ratelimit import RateLimit, WaitSlots
from tablecast.query.stats import BUCKETS, HttpStats
from tablecast.store import StoreClosed


class NodeCollector(Collector):
    def __init__(
        self,
        node: Node,
        http: HttpStats,
        rate: RateLimit | None = None,
        waits: WaitSlots | None = None,
        hub: Hub | None = None,
        coalescer: Coalescer | None = None,
    ) -> None:
        self.node = node
        self.http = http
        self.rate = rate
        self.waits = waits
        self.hub = hub
        self.coalescer = coalescer

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "tablecast_http_requests",
            "HTTP requests by route and status",
            labels=["route", "status"],
        )
        for (route, status), n in sorted(self.http.requests.items()):
            requests.add_metric([route, str(status)], n)
        yield requests
        yield CounterMetricFamily(
            "tablecast_http_requests_by_read_processes",
            "of tablecast_http_requests, those the node's read processes answered",
            value=self.http.by_readers,
        )
        latency = HistogramMetricFamily(
            "tablecast_http_request_duration_seconds", "time to answer, by route", labels=["route"]
        )
        for route, counts in sorted(self.http.buckets.items()):
            cumulative, running = [], 0
            for bound, n in zip((*map(str, BUCKETS), "+Inf"), counts, strict=True):
                running += n
                cumulative.append((bound, running))
            latency.add_metric([route], cumulative, self.http.seconds[route])
        yield latency
        limited = CounterMetricFamily(
            "tablecast_rate_limited",
            "requests refused with 429: over --rate-limit, or too many offset waits of one caller",
            labels=["limit"],
        )
        limited.add_metric(["rate"], self.rate.refused if self.rate else 0)
        limited.add_metric(["waits"], self.waits.refused if self.waits else 0)
        yield limited

        ingest = self.node.ingestor
        applied = CounterMetricFamily(
            "tablecast_records_applied", "table records applied to stores"
        )
        applied.add_metric([], ingest.records_applied)
        yield applied
        labels = ["table", "partition"]
        lag = GaugeMetricFamily(
            "tablecast_replica_lag", "records behind the topic end", labels=labels
        )
        offset = GaugeMetricFamily(
            "tablecast_replica_applied_offset", "last offset applied", labels=labels
        )
        keys = GaugeMetricFamily("tablecast_store_keys", "keys held", labels=labels)
        restoring = GaugeMetricFamily(
            "tablecast_replica_restoring", "1 while the replica restores", labels=labels
        )
        caught_up = GaugeMetricFamily(
            "tablecast_replica_caught_up", "1 while the replica counts as caught up", labels=labels
        )
        failed = GaugeMetricFamily(
            "tablecast_replica_write_failed",
            "1 while the replica's store writes fail (the partition stops advancing)",
            labels=labels,
        )
        staleness = GaugeMetricFamily(
            "tablecast_replica_staleness_seconds",
            "time since the replica was last known caught up with the topic end",
            labels=labels,
        )
        remaining = 0
        for r in list(ingest.replicas.values()):
            lv = [r.table.name, str(r.partition)]
            lag.add_metric(lv, r.lag)
            offset.add_metric(lv, r.store.applied_offset)
            with contextlib.suppress(StoreClosed):  # released while this scrape ran
                keys.add_metric(lv, len(r.store))
            restoring.add_metric(lv, 0 if r.restored else 1)
            caught_up.add_metric(lv, 1 if r.caught_up else 0)
            failed.add_metric(lv, 0 if r.failed is None else 1)
            staleness.add_metric(lv, r.staleness_ms() / 1000)
            if not r.restored:
                remaining += max(0, r.restore_target - r.position)
        yield from (lag, offset, keys, restoring, caught_up, failed, staleness)
        left = GaugeMetricFamily("tablecast_restore_remaining_records", "records left to restore")
        left.add_metric([], remaining)
        yield left
        bad = CounterMetricFamily(
            "tablecast_bad_records",
            "table-topic records kept out of answers: their key or value does not decode",
            labels=["table", "reason"],
        )
        for (table, reason), n in sorted(ingest.bad_records.items()):
            bad.add_metric([table, reason], n)
        yield bad
        yield from _counters(
            ("tablecast_store_write_failures", "store writes that failed", ingest.write_failures),
            (
                "tablecast_catalog_bad_entries",
                "catalog records refused (left out of /v1/tables)",
                ingest.catalog.bad_entries,
            ),
            (
                "tablecast_stores_dropped",
                "stores of released partitions deleted from disk",
                ingest.stores_dropped,
            ),
            (
                "tablecast_stores_restored_from_scratch",
                "stores too old to resume (compaction may have dropped tombstones)",
                ingest.restored_from_scratch,
            ),
        )
        renewed = CounterMetricFamily(
            "tablecast_kafka_consumers_renewed",
            "Kafka consumers replaced after hearing nothing while the broker answered a fresh "
            "client (deaf after a broker restart), by consumer",
            labels=["consumer"],
        )
        renewed.add_metric(["table"], ingest.consumers_renewed)
        renewed.add_metric(["catalog"], ingest.catalog.consumers_renewed)
        if self.hub is not None:
            renewed.add_metric(["watch_feed"], self.hub.feed.consumers_renewed)
        yield renewed
        left_out = GaugeMetricFamily(
            "tablecast_tables_left_out", "catalog tables not served: bad entry or topic"
        )
        left_out.add_metric([], len(ingest.left_out) + len(ingest.catalog.bad))
        yield left_out
        if self.hub is not None:
            yield from _watch_metrics(self.hub)
        if self.coalescer is not None:
            yield from _counters(
                (
                    "tablecast_forward_batches",
                    "batches of forwarded reads sent",
                    self.coalescer.batches,
                ),
                (
                    "tablecast_forward_batched_reads",
                    "forwarded reads sent in a batch",
                    self.coalescer.batched_reads,
                ),
            )


def _counters(*rows: tuple[str, str, float]) -> Iterator[Metric]:
    """One unlabelled counter per (name, help, value)."""
    for name, text, value in rows:
        counter = CounterMetricFamily(name, text)
        counter.add_metric([], value)
        yield counter


def _watch_metrics(hub: Hub) -> Iterator[Metric]:
    open_ = GaugeMetricFamily(
        "tablecast_watches", "open watches, by transport", labels=["transport"]
    )
    counts = hub.open_by_transport()
    for transport in ("sse", "websocket", "grpc"):
        open_.add_metric([transport], counts.get(transport, 0))
    yield open_
    closed = CounterMetricFamily(
        "tablecast_watch_closed",
        "watches ended, by why (client: the client left; slow_consumer: cut off for being "
        "too far behind; shutdown; unauthorized: the token expired)",
        labels=["reason"],
    )
    for reason, n in sorted(hub.closed.items()):
        closed.add_metric([reason], n)
    yield closed
    yield from _counters(
        ("tablecast_watch_events", "change events delivered to watches", hub.delivered),
        ("tablecast_watch_opened", "watches opened", hub.opened),
        ("tablecast_watch_catch_ups", "watches that read the topic privately first", hub.catch_ups),
        ("tablecast_watch_feed_records", "records the watch feed read", hub.feed.records),
    )
    fed = GaugeMetricFamily(
        "tablecast_watch_feed_partitions", "table partitions the watch feed reads"
    )
    fed.add_metric([], len(hub.parts))
    yield fed
    ring = GaugeMetricFamily(
        "tablecast_watch_ring_bytes", "recent records the feed keeps for joining watches (estimate)"
    )
    ring.add_metric([], sum(pf.ring_bytes for pf in list(hub.parts.values())))
    yield ring


def exposition(
    node: Node,
    http: HttpStats,
    rate: RateLimit | None = None,
    waits: WaitSlots | None = None,
    hub: Hub | None = None,
    coalescer: Coalescer | None = None,
) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node, http, rate, waits, hub, coalescer))
    return generate_latest(registry)
