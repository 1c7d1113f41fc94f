"""A running pipeline: topics prepared, catalog written, queries started, progress logged."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tablecast.kafka import catalog
from tablecast.kafka.topics import COMPACTED, dlq_topic, ensure_topic
from tablecast.pipeline import plan, planner
from tablecast.pipeline import spark as spark_setup

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from tablecast.pipeline.app import App

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0


class DeadLetterCounter:
    """Counts bad records per query from the observed metric of each micro-batch."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def listener(self) -> Any:
        from pyspark.sql.streaming import StreamingQueryListener

        counter = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                p = event.progress
                row = (p.observedMetrics or {}).get(f"tablecast:{p.name}")
                if row is not None and row["dead_letters"]:
                    with counter._lock:
                        counter.counts[p.name] += int(row["dead_letters"])
                    log.warning("query %s: %d bad record(s) -> dlq", p.name, row["dead_letters"])

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        return Listener()

    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())


def _ensure_topic(
    bootstrap_servers: str, topic: str, partitions: int, config: dict[str, str] | None = None
) -> int:
    # a just-created topic can be missing from metadata for a moment; creating
    # it again is a no-op, so retry until the broker lists it
    for attempt in range(20):
        try:
            return ensure_topic(bootstrap_servers, topic, partitions, config)
        except AssertionError:
            time.sleep(0.2 * (attempt + 1))
    raise RuntimeError(f"topic {topic} was created but the broker does not list it")


def _ensure_outputs(bootstrap_servers: str, queries: list[planner.Query], count: int) -> list[int]:
    """Create each query's output topic; returns their partition counts.

    Topics get the source's partition count, or what a repartition() asked for,
    which the topics after it keep (as Kafka Streams' tasks downstream of it)."""
    sizes = []
    for q in queries:
        table_like = q.output.kind == "table" and q.output.role in ("table", "changelog")
        config = COMPACTED if table_like else None
        # a to(topic) of the user's may exist already, with its own partition count
        size = _ensure_topic(bootstrap_servers, q.output.topic, q.partitions or count, config)
        if q.output.role == "through":
            count = size
        sizes.append(size)
    return sizes


@dataclass
class Pipeline:
    app: App
    spark: SparkSession
    queries: dict[str, StreamingQuery]
    owns_spark: bool
    dead_letters: DeadLetterCounter
    _listener: Any = None
    _stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(
        cls, app: App, bootstrap_servers: str, master: str | None, spark: SparkSession | None
    ) -> Pipeline:
        from tablecast.pipeline.app import wait_for_topic
        from tablecast.pipeline.compiler import Target, writer

        outputs = app.outputs()
        if not outputs:
            raise ValueError(f"App {app.id!r} materializes no table and writes no topic")
        sources = {plan.source_of(o).topic for o in outputs}
        partitions = {t: wait_for_topic(bootstrap_servers, t) for t in sorted(sources)}
        owns = spark is None
        if spark is None:
            spark = spark_setup.session(
                f"tablecast-{app.id}", master, shuffle_partitions=max(partitions.values())
            )
            spark_setup.check_master(spark, master)
        _ensure_topic(bootstrap_servers, dlq_topic(app.id), 1)
        infos, chains = [], []
        for out in outputs:
            count = partitions[plan.source_of(out).topic]
            queries = planner.plan_output(app.id, out, list(app.materialized.values()))
            sizes = _ensure_outputs(bootstrap_servers, queries, count)
            chains.append((count, sizes, queries))
            if isinstance(out, plan.Materialize):
                window = plan.window_of(out)
                infos.append(
                    catalog.TableInfo(
                        name=out.name,
                        topic=queries[-1].output.topic,
                        partitions=sizes[-1],
                        key=out.key_serde().spec(),
                        value=out.value_serde().spec(),
                        store=out.store,
                        kind="window" if window else "kv",
                        extra={"size_ms": window.windows.size_ms} if window else {},
                    )
                )
        catalog.publish(bootstrap_servers, app.id, infos)
        counter = DeadLetterCounter()
        listener = counter.listener()
        spark.streams.addListener(listener)
        checkpoints = app.resolve_state_dir() / "checkpoints"
        started: dict[str, StreamingQuery] = {}
        pipeline = cls(app, spark, started, owns, counter, listener)
        try:
            for count, sizes, queries in chains:
                for q, out in zip(queries, sizes, strict=True):
                    if q.name in started:
                        continue
                    # stateful steps shuffle into as many partitions as the topics have
                    spark.conf.set("spark.sql.shuffle.partitions", str(count))
                    target = Target(app.id, bootstrap_servers, checkpoints, app.trigger, count, out)
                    started[q.name] = writer(spark, q, target).start()
                    log.info("query %s: %s -> %s started", q.name, q.input.topic, q.output.topic)
        except BaseException:
            pipeline.stop()
            raise
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
                    "query %s: batch %d, %d rows, %.0f rows/s, %d bad records so far",
                    name,
                    p["batchId"],
                    p["numInputRows"],
                    p.get("processedRowsPerSecond") or 0.0,
                    self.dead_letters.counts.get(name, 0),
                )

    def await_termination(self) -> None:
        self.spark.streams.awaitAnyTermination()
        for q in self.queries.values():
            if q.exception() is not None:
                raise RuntimeError(f"query {q.name} failed: {q.exception()}")

    def process_all_available(self) -> None:
        """Block until every query has processed all input available now (tests, benchmarks).

        Queries are chained through topics, so passes are repeated until one
        in which no query ran a batch; within a pass queries are waited on in
        parallel, since each runs on its own thread in Spark anyway.
        """
        from concurrent.futures import ThreadPoolExecutor

        def batch_ids() -> dict[str, Any]:
            return {n: (q.lastProgress or {}).get("batchId") for n, q in self.queries.items()}

        with ThreadPoolExecutor(max(1, len(self.queries))) as pool:
            for _ in range(50):
                before = batch_ids()
                list(pool.map(lambda q: q.processAllAvailable(), self.queries.values()))
                if batch_ids() == before:
                    return

    def stop(self) -> None:
        self._stop.set()
        for q in self.queries.values():
            try:
                q.stop()
            except Exception as e:  # a query that already died must not block stopping the rest
                log.warning("stopping query %s: %s", q.name, e)
        if self._listener is not None:
            self.spark.streams.removeListener(self._listener)
            self._listener = None
        if self.owns_spark:
            self.spark.stop()
