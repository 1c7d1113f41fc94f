"""``tc.App``: the pipeline's entry point.

It hands out the DSL's first handles (:mod:`.dsl`), collects the outputs they
register, and on ``start``/``run``/``explain`` passes them to the later stages
(:mod:`.plan`, :mod:`.compile`, :mod:`.run`)."""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from tablecast import serde as serdes
from tablecast.pipeline.dsl.handles import (
    Cogrouped,
    CogroupedStream,
    GlobalTable,
    Stream,
    Table,
)
from tablecast.pipeline.plan import nodes as plan

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tablecast.pipeline.run.pipeline import Pipeline

log = logging.getLogger(__name__)

_APP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_TABLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class App:
    """A tablecast application: its id prefixes every topic and checkpoint it owns."""

    def __init__(
        self,
        app_id: str,
        *,
        bootstrap_servers: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        trigger: str = "auto",
        checkpoint_dir: str | None = None,
        on_data_loss: str = "fail",
    ) -> None:
        # trigger: "auto" (each query's micro-batch interval by what it does), a micro-batch
        # interval for every query, or "realtime" (see pipeline/run/trigger.py)
        if not _APP_ID.match(app_id):
            raise ValueError(f"app id {app_id!r}: use letters, digits, '-' and '_'")
        # on_data_loss: what a query does when input records it has not read were deleted
        # by retention meanwhile: "fail" (stop, and say so) or "skip" (go on without them)
        if on_data_loss not in ("fail", "skip"):
            raise ValueError(f"on_data_loss is 'fail' or 'skip', not {on_data_loss!r}")
        self.on_data_loss = on_data_loss
        self.id = app_id
        self.bootstrap_servers = bootstrap_servers
        self.state_dir = Path(state_dir) if state_dir else None
        #: a Hadoop URI or path under which the App's query checkpoints go
        #: (``<checkpoint_dir>/<app id>/<query>``); default ``<state dir>/checkpoints``
        self.checkpoint_dir = checkpoint_dir
        self.trigger = trigger
        self.materialized: dict[str, plan.Materialize] = {}
        self.sinks: list[plan.To] = []
        # App files build Column expressions as they define the App: let them, without
        # starting Spark (only start/run do), as Spark Connect Columns until it runs
        from tablecast.pipeline.run.spark import defer_columns

        defer_columns()

    # -- sources ----------------------------------------------------------
    def stream(
        self, topic: str, key: serdes.Serde | None = None, value: serdes.Serde | None = None
    ) -> Stream:
        return Stream(self, self._source(topic, key, value, "stream"))

    def table(
        self, topic: str, key: serdes.Serde | None = None, value: serdes.Serde | None = None
    ) -> Table:
        return Table(self, self._source(topic, key, value, "table"))

    def global_table(
        self, topic: str, key: serdes.Serde | None = None, value: serdes.Serde | None = None
    ) -> GlobalTable:
        """A table whole on every node: streams join it by any key (``key=`` of
        Stream.join) without co-partitioning; ``.materialize(name)`` serves it."""
        return GlobalTable(self, self._source(topic, key, value, "table", is_global=True))

    def cogroup(self, *inputs: Cogrouped) -> CogroupedStream:
        """Kafka Streams' cogroup: ``app.cogroup((grouped_a, aggregator_a), (grouped_b,
        aggregator_b), ...).aggregate(initializer)`` is one table whose aggregate per key
        every input's records update, each through its own aggregator(key, value, agg).
        Inputs are grouped streams with one key serde (their values may differ)."""
        return CogroupedStream(self, inputs)

    def _source(
        self,
        topic: str,
        key: serdes.Serde | None,
        value: serdes.Serde | None,
        kind: plan.Kind,
        is_global: bool = False,
    ) -> plan.Source:
        return plan.Source(
            None, topic, key or serdes.string(), value or serdes.json(), kind, is_global
        )

    def _register(self, node: plan.Materialize) -> None:
        if not _TABLE_NAME.match(node.name):
            raise ValueError(f"table name {node.name!r}: use letters, digits, '.', '-' and '_'")
        if node.name in self.materialized:
            raise ValueError(f"a table named {node.name!r} is already materialized")
        self.materialized[node.name] = node

    def _register_sink(self, node: plan.To) -> None:
        self.sinks.append(node)

    def outputs(self) -> list[plan.Materialize | plan.To]:
        """Everything the App writes: its materialized tables, then its to(topic) streams."""
        return [*self.materialized.values(), *self.sinks]

    # -- running ----------------------------------------------------------
    def resolve_bootstrap(self, bootstrap_servers: str | None = None) -> str:
        return (
            bootstrap_servers
            or self.bootstrap_servers
            or os.environ.get("TABLECAST_BOOTSTRAP_SERVERS")
            or "localhost:9092"
        )

    def resolve_state_dir(self) -> Path:
        base = self.state_dir or Path(os.environ.get("TABLECAST_STATE_DIR", ".tablecast"))
        return base / self.id

    def resolve_checkpoint_dir(self) -> str:
        """Where the queries' checkpoints go: a path, or a URI any executor can reach
        (``file:///shared/…``, ``hdfs://…``, ``s3a://…``) when Spark runs on a cluster."""
        base = self.checkpoint_dir or os.environ.get("TABLECAST_CHECKPOINT_DIR")
        if base:
            return f"{base.rstrip('/')}/{self.id}"
        return str(self.resolve_state_dir() / "checkpoints")

    def start(
        self,
        bootstrap_servers: str | None = None,
        master: str | None = None,
        spark: SparkSession | None = None,
    ) -> Pipeline:
        """Start every materialized table's query and return at once."""
        from tablecast.pipeline.run.pipeline import Pipeline

        return Pipeline.start(self, self.resolve_bootstrap(bootstrap_servers), master, spark)

    def run(
        self,
        bootstrap_servers: str | None = None,
        master: str | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """Run the pipeline until it fails, is interrupted (Ctrl-C), or `stop` is set."""
        pipeline = self._start_waiting_out_kafka(bootstrap_servers, master, stop)
        if pipeline is None:
            return
        try:
            pipeline.await_termination(stop)
        except KeyboardInterrupt:
            log.info("interrupted; stopping the pipeline")
        finally:
            pipeline.stop()

    def _start_waiting_out_kafka(
        self, bootstrap_servers: str | None, master: str | None, stop: threading.Event | None
    ) -> Pipeline | None:
        """`start()`, tried again while Kafka is away (a broker restarting under a driver that
        was itself restarted): a start is checked for reachable brokers first (the CLI's
        probe), so an outage after that is waited out, not a reason to exit. None: stopped."""
        from tablecast.kafka.topics import kafka_away

        stop = stop or threading.Event()
        delay = 1.0
        while True:
            try:
                return self.start(bootstrap_servers, master)
            except Exception as e:
                if not kafka_away(e):
                    raise
                log.warning(
                    "Kafka went away while the pipeline was starting (%s); trying again in %.0f s",
                    e,
                    delay,
                )
            if stop.wait(delay):
                return None
            delay = min(delay * 2, 15.0)

    def explain(self) -> str:
        """The plan: each output's operators, the Spark queries, their topics and trigger."""
        from tablecast.pipeline.run.explain import explain

        return explain(self.id, self.outputs(), self.trigger)
