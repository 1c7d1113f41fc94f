"""A running pipeline: topics prepared, catalog written, queries started, progress logged."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import orjson

from tablecast.contract.table_info import TableInfo
from tablecast.kafka import catalog
from tablecast.kafka.topics import (
    TABLE_TOPIC_CONFIG,
    EndOffsets,
    dlq_topic,
    ensure_topic,
    partition_count,
)
from tablecast.pipeline.plan import nodes as plan
from tablecast.pipeline.plan import queries as planner
from tablecast.pipeline.run import checkpoints as checkpoint_files
from tablecast.pipeline.run import explain as explaining
from tablecast.pipeline.run import spark as spark_setup
from tablecast.pipeline.run import status
from tablecast.pipeline.run.layout import PYTHON, SPARK, Files, local_path, settle, stored_engine
from tablecast.pipeline.run.restarts import Restarts
from tablecast.pipeline.run.status import StatusPublisher
from tablecast.pipeline.run.trigger import (
    Trigger,
    assign,
    recorded_shuffle_partitions,
    shuffling_steps,
    slots_needed,
    written_by_micro_batch,
)
from tablecast.windows import SessionWindows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0

#: task slots held by the real-time queries this process started, by query name
_REALTIME_SLOTS: dict[str, int] = {}


class App(Protocol):
    """What running needs of an App (``tablecast.pipeline.app.App`` is one): the run
    stage comes after the DSL and does not import it."""

    id: str
    trigger: str
    on_data_loss: str
    materialized: dict[str, plan.Materialize]

    def outputs(self) -> list[plan.Materialize | plan.To]: ...

    def resolve_checkpoint_dir(self) -> str: ...


class DeadLetterCounter:
    """Counts bad records per query from the observed metric of each micro-batch."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        #: query id -> name (a termination event carries only the id)
        self.names: dict[str, str] = {}
        #: called with each progress report (Spark's StreamingQueryProgress as a dict)
        self.on_progress: Callable[[dict[str, Any]], None] | None = None
        self._lock = threading.Lock()

    def listener(self) -> Any:
        """A StreamingQueryListener for ``spark.streams.addListener`` that reads each event
        as Spark's JSON. PySpark's own adapter builds a progress event field by field over
        py4j, and each Java map it walks ends in an exception whose conversion looks up a
        dozen classes by name, missing through every jar: ~6% of the JVM's CPU samples in
        a table group_by benchmark (JFR), on a core the queries need."""
        from pyspark import SparkContext
        from pyspark.sql.streaming import StreamingQueryListener

        events = _JsonEvents(self)

        class Listener(StreamingQueryListener):
            # the events reach `events`; these are the abstract methods' no-op forms
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

            # PySpark's internal hook: what addListener/removeListener register (a
            # PySpark without it fails test_pipeline_errors' dead-letter counts)
            @property
            def _jlistener(self) -> Any:
                if not hasattr(self, "_wrapped"):
                    jvm = SparkContext._jvm
                    assert jvm is not None
                    self._wrapped = jvm.PythonStreamingQueryListenerWrapper(events)
                return self._wrapped

        return Listener()

    def progressed(self, p: dict[str, Any]) -> None:
        """A query's progress report (Spark's StreamingQueryProgress as a dict)."""
        name = p.get("name") or ""
        bad = ((p.get("observedMetrics") or {}).get(f"tablecast:{name}") or {}).get("dead_letters")
        if bad:
            with self._lock:
                self.counts[name] += int(bad)
            log.warning("query %s: %d bad record(s) -> dlq", name, bad)
        if self.on_progress is not None:
            try:
                self.on_progress(p)
            except Exception as e:  # progress is advisory: never fail a batch over it
                log.debug("progress of %s not reported: %s", name, e)

    def terminated(self, query_id: str, exception: str | None) -> None:
        if exception and "failOnDataLoss" in exception:
            log.error(
                "query %s stopped: input records it had not read yet are gone from "
                "Kafka (deleted by retention while the pipeline was down). They cannot be "
                "recovered; to go on without them, start the App with "
                "tc.App(..., on_data_loss='skip') once, or raise the input topic's "
                "retention.ms so it does not happen again. Spark said: %s",
                self.names.get(query_id, query_id),
                exception.splitlines()[0],
            )

    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())


class _JsonEvents:
    """The py4j side of :meth:`DeadLetterCounter.listener`: Spark's listener interface,
    each event read with one or two calls (a progress report as its JSON)."""

    def __init__(self, counter: DeadLetterCounter) -> None:
        self.counter = counter

    def onQueryStarted(self, jevent: Any) -> None:
        self.counter.names[jevent.id().toString()] = jevent.name()

    def onQueryProgress(self, jevent: Any) -> None:
        self.counter.progressed(orjson.loads(jevent.progress().json()))

    def onQueryIdle(self, jevent: Any) -> None:
        pass

    def onQueryTerminated(self, jevent: Any) -> None:
        exception = jevent.exception()
        text = exception.get() if exception.isDefined() else None
        self.counter.terminated(jevent.id().toString(), text)

    class Java:
        implements: ClassVar[list[str]] = [
            "org.apache.spark.sql.streaming.PythonStreamingQueryListener"
        ]


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
        config = TABLE_TOPIC_CONFIG if table_like else None
        # a to(topic) of the user's may exist already, with its own partition count
        size = _ensure_topic(bootstrap_servers, q.output.topic, q.partitions or count, config)
        if q.output.role in ("through", "merge"):
            count = size
        sizes.append(size)
    return sizes


def table_info(out: plan.Materialize, topic: str, partitions: int) -> TableInfo:
    """The catalog entry of a materialized table: what serving nodes read to serve it."""
    window = plan.window_of(out)
    return TableInfo(
        name=out.name,
        topic=topic,
        partitions=partitions,
        key=out.key_serde().spec(),
        value=out.value_serde().spec(),
        store=out.store,
        kind="window" if window else "kv",
        is_global=plan.source_of(out).is_global,
        extra=window_extra(window) if window else out.catalog_extra(),
    )


def window_extra(window: plan.WindowedBy) -> dict[str, int]:
    """What a node needs to answer /windows: a window's size, or that keys are sessions."""
    w = window.windows
    if isinstance(w, SessionWindows):
        return {"session_gap_ms": w.gap_ms}
    return {"size_ms": w.size_ms}


@dataclass
class Pipeline:
    app: App
    spark: SparkSession
    queries: dict[str, StreamingQuery]
    owns_spark: bool
    dead_letters: DeadLetterCounter
    #: the trigger each query runs with (Real-time Mode or micro-batch, and why)
    triggers: dict[str, Trigger] = field(default_factory=dict)
    bootstrap_servers: str = ""
    #: the topics each query reads: its input, and a join's other side
    inputs: dict[str, list[str]] = field(default_factory=dict)
    _listener: Any = None
    #: input end offsets each real-time query has processed all of
    _synced: dict[str, list[dict[int, int]]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _status: status.StatusPublisher | None = None
    #: each query's latest progress point
    _latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the queries each output runs, by the output's id (a checkpoint may have kept a
    #: plan the App alone would not give)
    _planned: dict[int, list[planner.Query]] = field(default_factory=dict)
    #: starts each query (again, from its checkpoint, after it failed)
    _starters: dict[str, Callable[[], StreamingQuery]] = field(default_factory=dict)
    _restarts: Restarts = field(default_factory=Restarts)
    _starting: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(
        cls, app: App, bootstrap_servers: str, master: str | None, spark: SparkSession | None
    ) -> Pipeline:
        from tablecast.pipeline.compile.query import Target, writer

        outputs = app.outputs()
        if not outputs:
            raise ValueError(f"App {app.id!r} materializes no table and writes no topic")
        # a join reads its other table's source too: every source must exist
        sources = {s.topic for o in outputs for s in plan.sources(o)}
        partitions = {t: wait_for_topic(bootstrap_servers, t) for t in sorted(sources)}
        owns = spark is None
        spark_setup.end_deferred_columns()
        if spark is None:
            spark = spark_setup.session(
                f"tablecast-{app.id}", master, shuffle_partitions=max(partitions.values())
            )
            spark_setup.check_master(spark, master)
        interceptor = spark_setup.timestamp_interceptor(spark)
        _ensure_topic(bootstrap_servers, dlq_topic(app.id), 1)
        infos, chains = [], []
        checkpoints = app.resolve_checkpoint_dir()
        checkpoint_files.choose_manager(spark, checkpoints)
        files, base = Files(spark), checkpoints.rstrip("/")
        for out in outputs:
            count = partitions[plan.source_of(out).topic]
            queries = _plan(app, out, files, base)
            sizes = _ensure_outputs(bootstrap_servers, queries, count)
            chains.append((count, sizes, queries))
            if isinstance(out, plan.Materialize):
                infos.append(table_info(out, queries[-1].output.topic, sizes[-1]))
        catalog.publish(bootstrap_servers, app.id, infos)
        counter = DeadLetterCounter()
        publisher = StatusPublisher(bootstrap_servers, app.id)
        listener = counter.listener()
        spark.streams.addListener(listener)
        started: dict[str, StreamingQuery] = {}
        every = [q for _, _, qs in chains for q in qs]
        chosen, needs = _choose_triggers(spark, bootstrap_servers, app.trigger, every, checkpoints)
        inputs = {
            q.name: [q.input.topic, *(r.topic for s in q.steps for r in s.beside)] for q in every
        }
        # each stateful query keeps the state layout its checkpoint was started with
        buckets = {
            q.name: settle(files, f"{base}/{q.name}", count, q.name, q.per_task, _engine(q)).buckets
            for count, _, queries in chains
            for q in queries
            if q.stateful
        }
        pipeline = cls(
            app, spark, started, owns, counter, chosen, bootstrap_servers, inputs, listener
        )
        pipeline._status = publisher
        pipeline._planned = {id(o): qs for o, (_, _, qs) in zip(outputs, chains, strict=True)}
        counter.on_progress = pipeline._progressed
        try:
            for count, sizes, queries in chains:
                for q, out in zip(queries, sizes, strict=True):
                    if q.name in started:
                        continue
                    trig = chosen[q.name]
                    shuffle = spark_setup.shuffle_partitions(spark, count, trig.realtime)
                    target = Target(
                        app.id,
                        bootstrap_servers,
                        checkpoints,
                        count,
                        out,
                        app.on_data_loss,
                        interceptor,
                        buckets.get(q.name, 1),
                        trig.realtime,
                        spark_setup.read_tasks(spark, trig.realtime),
                    )
                    pipeline._starters[q.name] = _starter(spark, q, target, trig, shuffle, writer)
                    started[q.name] = pipeline._starters[q.name]()
                    if trig.realtime:
                        _REALTIME_SLOTS[q.name] = needs[q.name]
                    log.info(
                        "query %s: %s -> %s started, trigger: %s",
                        q.name,
                        q.input.topic,
                        q.output.topic,
                        trig.describe(),
                    )
        except BaseException:
            pipeline.stop()
            raise
        threading.Thread(target=pipeline._report, name="tablecast-progress", daemon=True).start()
        return pipeline

    def explain(self) -> str:
        """The App's plan with the triggers its queries actually run with."""
        return explaining.explain(
            self.app.id,
            self.app.outputs(),
            self.app.trigger,
            chosen=self.triggers,
            planned=lambda out: self._planned[id(out)],
        )

    def _progressed(self, progress: dict[str, Any]) -> None:
        """A batch ended: its point goes to ``<app>.status`` (the console's pipeline page)."""
        name = progress.get("name") or ""
        trig = self.triggers.get(name)
        p = status.point(
            progress, trig.describe() if trig else "", self.dead_letters.counts.get(name, 0)
        )
        self._latest[name] = p
        if self._status is not None:
            self._status.publish(p)

    def _report(self) -> None:
        """The same points in the log, every PROGRESS_EVERY_S, for queries that moved."""
        last: dict[str, int] = {}
        while not self._stop.wait(PROGRESS_EVERY_S):
            for name, p in list(self._latest.items()):
                if last.get(name) == p["batch"]:
                    continue
                last[name] = p["batch"]
                log.info("%s", status.describe(p))

    def await_termination(self, stop: threading.Event | None = None) -> None:
        """Block until a query is stopped, one fails for good (raise), or `stop` (or
        :meth:`stop`) ends the wait.

        A query that failed is started again from its checkpoint while its
        :class:`Restarts` allow. This pipeline's own queries are looked at every second
        (the session's termination calls would answer for every App sharing it), and
        the waits are Python's: a signal handler that sets `stop` never has to interrupt
        a call into the JVM (which py4j reports as an error).
        """

        def stopped(wait_s: float) -> bool:
            deadline = time.monotonic() + wait_s
            while not (stop is not None and stop.is_set()) and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._stop.wait(min(left, 0.2))
            return True

        while not stopped(1.0):
            ended = [(n, q) for n, q in list(self.queries.items()) if not q.isActive]
            failed = [(n, e) for n, q in ended if (e := q.exception()) is not None]
            if ended and not failed:
                return  # stopped on purpose
            for name, error in failed:
                text = str(error)
                delay = self._restarts.delay(name, text)
                if delay is None:
                    raise RuntimeError(f"query {name} failed: {text}")
                log.warning(
                    "query %s failed; it starts again from its checkpoint in %.0f s (%s)",
                    name,
                    delay,
                    (text.splitlines() or [""])[0][:500],
                )
                if stopped(delay):
                    return
                with self._starting:
                    if self._stop.is_set():
                        return
                    self.queries[name] = self._starters[name]()

    def process_all_available(self) -> None:
        """Block until every query has processed all input available now (tests, benchmarks).

        Queries are chained through topics, so passes are repeated until one
        in which no topic any query reads grew: then all that was there when
        the pass began has been processed, and no query wrote more for another.
        (A query's batch id is no such sign: Spark updates ``lastProgress``
        after ``processAllAvailable`` has returned, so a pass could look still
        while a batch was just written downstream.) Within a pass queries are
        waited on in parallel, since each runs on its own thread in Spark
        anyway. A real-time query ends a batch every checkpoint interval, input
        or not, and processAllAvailable waits for up to two of them: it is
        waited on only when its inputs grew since it was last.
        """
        from concurrent.futures import ThreadPoolExecutor

        offsets = EndOffsets(self.bootstrap_servers)
        topics = [t for name in self.queries for t in self.inputs[name]]

        def ends() -> dict[str, list[dict[int, int]]]:
            now = offsets.of(topics)
            return {name: [now.get(t, {}) for t in self.inputs[name]] for name in self.queries}

        def wait(name: str, before: list[dict[int, int]]) -> None:
            if not self.triggers[name].realtime:
                self.queries[name].processAllAvailable()
            elif self._synced.get(name) != before:
                self.queries[name].processAllAvailable()
                self._synced[name] = before

        names = list(self.queries)
        with ThreadPoolExecutor(max(1, len(names))) as pool:
            for _ in range(50):
                before = ends()
                list(pool.map(wait, names, [before[n] for n in names]))
                if ends() == before:
                    return

    def stop(self) -> None:
        self._stop.set()
        with self._starting:  # a failed query being started again is stopped with the rest
            queries = list(self.queries.values())
        for q in queries:
            try:
                q.stop()
            except Exception as e:  # a query that already died must not block stopping the rest
                log.warning("stopping query %s: %s", q.name, e)
            _REALTIME_SLOTS.pop(q.name, None)
        if self._listener is not None:
            self.spark.streams.removeListener(self._listener)
            self._listener = None
        if self._status is not None:
            self._status.close()
            self._status = None
        if self.owns_spark:
            # every query has stopped: what Spark logs while its executors wind
            # down (rejected task results, closed channels) is noise, not news
            self.spark.sparkContext.setLogLevel("OFF")
            self.spark.stop()


def _starter(
    spark: SparkSession,
    q: planner.Query,
    target: Any,
    trig: Trigger,
    shuffle: int,
    writer: Callable[..., Any],
) -> Callable[[], StreamingQuery]:
    """What starts `q`: the session's shuffle partitions are shared by every App in it, so
    each start sets its own first (a restart from a checkpoint keeps the checkpoint's)."""

    def start() -> StreamingQuery:
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle))
        return trig.apply(writer(spark, q, target)).start()

    return start


def _engine(q: planner.Query) -> str:
    return SPARK if q.stateful_in_spark else PYTHON


def _plan(
    app: App, out: plan.Materialize | plan.To, files: Files, base: str
) -> list[planner.Query]:
    """`out`'s queries, with Spark's own aggregation for a grouped stream's count unless a
    checkpoint of the chain holds such a count kept by Python (a tablecast before it)."""
    materialized = list(app.materialized.values())
    queries = planner.plan_output(app.id, out, materialized)
    natives = [q for q in queries if q.aggregates_in_spark]
    if any(stored_engine(files, f"{base}/{q.name}") == PYTHON for q in natives):
        log.info("%s: its checkpoint's count is kept by Python; it stays so", out.describe())
        queries = planner.plan_output(app.id, out, materialized, native=False)
    return queries


def _choose_triggers(
    spark: SparkSession,
    bootstrap_servers: str,
    trigger: str,
    queries: list[planner.Query],
    checkpoints: str,
) -> tuple[dict[str, Trigger], dict[str, int]]:
    """Each query's trigger, given the task slots real-time queries already hold
    and the checkpoints earlier runs left, and the slots each query needs (its
    input topic's partitions)."""
    unique = {q.name: q for q in queries}
    local = local_path(checkpoints)
    old = (
        {n: local / n for n in unique if written_by_micro_batch(local / n)}
        if local is not None
        else {}  # a remote checkpoint: Spark itself refuses a v1 one in Real-time Mode
    )

    def needs_of(q: planner.Query) -> int:
        partitions = partition_count(bootstrap_servers, q.input.topic) or 1
        if not shuffling_steps(q):
            return slots_needed(q, partitions)
        kept = None if local is None else recorded_shuffle_partitions(local / q.name)
        shuffle = spark_setup.shuffle_partitions(spark, partitions, True) if kept is None else kept
        return slots_needed(q, partitions, shuffle)

    needs = {n: needs_of(q) for n, q in unique.items()}
    active = {q.name for q in spark.streams.active}
    held = sum(n for name, n in _REALTIME_SLOTS.items() if name in active)
    slots = spark.sparkContext.defaultParallelism - held
    others = any(name not in _REALTIME_SLOTS for name in active)
    chosen = assign(trigger, [(q, needs[n]) for n, q in unique.items()], slots, others, old)
    return dict(zip(unique, chosen, strict=True)), needs


def wait_for_topic(bootstrap_servers: str, topic: str, timeout: float = 300.0) -> int:
    """The partition count of `topic`, waiting (with progress) until it exists."""
    from tablecast.kafka.topics import kafka_away, partition_count

    deadline = time.monotonic() + timeout
    while True:
        try:
            count = partition_count(bootstrap_servers, topic)
        except Exception as e:
            if not kafka_away(e) or time.monotonic() > deadline:
                raise
            log.warning("Kafka unreachable while looking for topic %r (%s); waiting", topic, e)
            time.sleep(2)
            continue
        if count is not None:
            return count
        if time.monotonic() > deadline:
            raise TimeoutError(f"source topic {topic!r} does not exist on {bootstrap_servers}")
        log.info("waiting for source topic %r to exist on %s ...", topic, bootstrap_servers)
        time.sleep(2)
