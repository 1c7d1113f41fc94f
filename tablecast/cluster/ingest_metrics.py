"""A node's ingestion figures for ``/metrics``: its replicas (lag, position, keys, restore,
staleness), the records it kept out, its stores and its Kafka consumers.

Read at scrape time from the plain counters the ingestion keeps (a prometheus-client
collector). Other parts of the node with Kafka consumers of their own add them to
:attr:`IngestMetrics.renewals`, so every replaced consumer is in one metric.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tablecast.cluster.ingest import Ingestor
from tablecast.metric_families import counters
from tablecast.store import StoreClosed


class IngestMetrics:
    def __init__(self, ingestor: Ingestor) -> None:
        self.ingestor = ingestor
        #: Kafka consumers replaced after going deaf, by consumer: how many so far
        self.renewals: dict[str, Callable[[], int]] = {
            "table": lambda: ingestor.consumers_renewed,
            "catalog": lambda: ingestor.catalog.consumers_renewed,
        }

    def collect(self) -> Iterator[Metric]:
        ingest = self.ingestor
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
        freshness = GaugeMetricFamily(
            "tablecast_replica_freshness_seconds",
            "age of the newest record the replica applied, by the record's timestamp "
            "(absent before it applied one)",
            labels=labels,
        )
        now_ms = int(time.time() * 1000)
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
            age = r.freshness_ms(now_ms)
            if age is not None:
                freshness.add_metric(lv, age / 1000)
            if not r.restored:
                remaining += max(0, r.restore_target - r.position)
        yield from (lag, offset, keys, restoring, caught_up, failed, staleness, freshness)
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
        yield from counters(
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
        for consumer, count in self.renewals.items():
            renewed.add_metric([consumer], count())
        yield renewed
        left_out = GaugeMetricFamily(
            "tablecast_tables_left_out", "catalog tables not served: bad entry or topic"
        )
        left_out.add_metric([], len(ingest.left_out) + len(ingest.catalog.bad))
        yield left_out
