"""A running pipeline: topics prepared, catalog written, one query per table, progress logged."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tablecast.kafka import catalog
from tablecast.kafka.topics import COMPACTED, dlq_topic, ensure_topic, table_topic
from tablecast.pipeline import plan
from tablecast.pipeline import spark as spark_setup
from tablecast.pipeline.compiler import compile_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from tablecast.pipeline.app import App

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0


@dataclass
class Pipeline:
    app: App
    spark: SparkSession
    queries: dict[str, StreamingQuery]
    owns_spark: bool
    _stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(
        cls, app: App, bootstrap_servers: str, master: str | None, spark: SparkSession | None
    ) -> Pipeline:
        from tablecast.pipeline.app import wait_for_topic

        if not app.materialized:
            raise ValueError(f"App {app.id!r} materializes no table: nothing to run")
        sources = {plan.source_of(m).topic for m in app.materialized.values()}
        partitions = {t: wait_for_topic(bootstrap_servers, t) for t in sorted(sources)}
        owns = spark is None
        if spark is None:
            spark = spark_setup.session(
                f"tablecast-{app.id}", master, shuffle_partitions=max(partitions.values())
            )
        ensure_topic(bootstrap_servers, dlq_topic(app.id), 1)
        infos = []
        for name, mat in app.materialized.items():
            src = plan.source_of(mat)
            count = partitions[src.topic]
            info = catalog.TableInfo(
                name=name,
                topic=table_topic(app.id, name),
                partitions=count,
                key=src.key.spec(),
                value=plan.value_serde(mat).spec(),
                store=mat.store,
            )
            ensure_topic(bootstrap_servers, info.topic, count, COMPACTED)
            infos.append(info)
        catalog.publish(bootstrap_servers, app.id, infos)
        checkpoints = app.resolve_state_dir() / "checkpoints"
        queries: dict[str, StreamingQuery] = {}
        for name, mat in app.materialized.items():
            compiled = compile_table(spark, app.id, bootstrap_servers, mat)
            query = (
                compiled.frame.writeStream.format("kafka")
                .queryName(f"{app.id}.{name}")
                .option("kafka.bootstrap.servers", bootstrap_servers)
                .option("checkpointLocation", str(checkpoints / name))
                .trigger(processingTime=app.trigger)
                .start()
            )
            log.info("table %r: %s -> %s started", name, compiled.source_topic, compiled.topic)
            queries[name] = query
        pipeline = cls(app, spark, queries, owns)
        threading.Thread(target=pipeline._report, name="tablecast-progress", daemon=True).start()
        return pipeline

    def _report(self) -> None:
        last: dict[str, int] = {}
        while not self._stop.wait(PROGRESS_EVERY_S):
            for name, q in list(self.queries.items()):
                p = q.lastProgress
                if not p or last.get(name) == p["batchId"]:
                    continue
                last[name] = p["batchId"]
                log.info(
                    "table %r: batch %d, %d rows, %.0f rows/s",
                    name,
                    p["batchId"],
                    p["numInputRows"],
                    p.get("processedRowsPerSecond") or 0.0,
                )

    def await_termination(self) -> None:
        self.spark.streams.awaitAnyTermination()
        for q in self.queries.values():
            if q.exception() is not None:
                raise RuntimeError(f"query {q.name} failed: {q.exception()}")

    def process_all_available(self) -> None:
        """Block until every query has processed all input available now (tests, benchmarks)."""
        for q in self.queries.values():
            q.processAllAvailable()

    def stop(self) -> None:
        self._stop.set()
        for q in self.queries.values():
            try:
                q.stop()
            except Exception as e:  # a query that already died must not block stopping the rest
                log.warning("stopping query %s: %s", q.name, e)
        if self.owns_spark:
            self.spark.stop()
