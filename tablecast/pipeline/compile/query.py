"""From planned queries to Spark: DataFrames, and the writers that start them.

A query reads its input topic into the envelope (see
:mod:`tablecast.pipeline.envelope`), checks records written by others (a key
or value that does not decode marks its row bad), applies its steps — Column
operators in the JVM, runs of Python callables fused into one mapInArrow,
stateful steps with applyInPandasWithState, a grouped stream's count with
Spark's own aggregation, a table group_by folded in Columns with tablecast's
transformWithState processors — and routes good rows to its output
topic and bad ones to the dead-letter topic through one Kafka sink.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from tablecast.kafka.config import spark_options
from tablecast.kafka.topics import dlq_topic
from tablecast.pipeline.compile import (
    aggregate,
    cogroup,
    fk_join,
    index,
    join,
    keyed,
    partition,
    sink,
    spark_aggregate,
    spark_table_aggregate,
    stateless,
    stream_join,
    window,
)
from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.flow import Flow
from tablecast.pipeline.compile.flow import ok as flow_ok
from tablecast.pipeline.compile.transform import transform_values
from tablecast.pipeline.plan import nodes as plan
from tablecast.pipeline.plan.queries import Query, Step, TopicRef


@dataclass(frozen=True)
class Target:
    app_id: str
    bootstrap_servers: str
    checkpoints: str  # a path or a Hadoop URI (joined with "/", which Path would mangle)
    partitions: int  # of the App's topics (a windowed aggregation's tasks)
    sink_partitions: int  # of the topic this query writes (a to() topic may differ)
    #: input records deleted by retention before they were read: "fail" stops the query,
    #: "skip" goes on without them (App(on_data_loss=...))
    on_data_loss: str = "fail"
    #: the producer interceptor that gives each record its timestamp header's time (None:
    #: not on Spark's classpath, records carry the time they were written)
    interceptor: str | None = None
    #: key buckets of its per-key steps (what its checkpoint's layout records)
    buckets: int = 1
    #: whether the query runs in Real-time Mode (its tasks poll Kafka for their whole batch)
    realtime: bool = False
    #: tasks each micro-batch reads a topic in (topic partitions merged, in order, without a
    #: shuffle); 0: one per topic partition, Spark's way
    read_tasks: int = 0


#: how long the broker may hold a micro-batch task's fetch for more data. At the topic's end a
#: task's consumer waited that long behind a held fetch (in its offset lookup), so Kafka's
#: 500 ms default was most of every small batch's time.
MICRO_BATCH_FETCH_WAIT_MS = 1


def _load(spark: SparkSession, ref: TopicRef, t: Target, headers: bool = False) -> DataFrame:
    """A topic as the envelope's columns (plus its headers if asked)."""
    # a Real-time Mode task polls at the topic's end for its whole batch: Kafka's default
    # there, or an idle task would send a fetch every 10 ms
    fetch_wait = {} if t.realtime else {"kafka.fetch.max.wait.ms": str(MICRO_BATCH_FETCH_WAIT_MS)}
    raw = (
        spark.readStream.format("kafka")
        .options(**fetch_wait)  # before the user's Kafka settings, which win
        .options(**spark_options(t.bootstrap_servers))
        .option("subscribe", ref.topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", _fail_on_data_loss(ref, t))
        .option("includeHeaders", str(headers).lower())
        .load()
    )
    if t.read_tasks:
        # merged without a shuffle, each partition whole and in order (steps downstream that
        # need order across partitions sort by partition and offset themselves); a topic
        # with fewer partitions is left as it is
        raw = raw.coalesce(t.read_tasks)
    return raw.select(
        "key",
        "value",
        F.lit(None).cast("string").alias(env.ERR),
        F.col("key").alias(env.RAW_KEY),
        F.col("value").alias(env.RAW_VALUE),
        F.col("topic").alias(env.TOPIC),
        F.col("partition").alias(env.PART),
        F.col("offset").alias(env.OFF),
        F.lit(0).cast("bigint").alias(env.SEQ),
        F.unix_millis(F.col("timestamp")).alias(env.TS),
        *(["headers"] if headers else []),
    )


def _fail_on_data_loss(ref: TopicRef, t: Target) -> str:
    """Whether the query stops when records it has not read are gone from the topic.

    Input topics (the user's) fail by default: records deleted by retention while
    the pipeline was down would otherwise vanish from every table unnoticed.
    The App's own topics (table topics, changelogs, repartition topics) are
    compacted or rewritten by the App itself: a record compacted away under a
    restarted query was superseded by a later one for its key, which the query
    still reads, so a gap there loses nothing and must not stop the pipeline.
    """
    fail = ref.role == "source" and t.on_data_loss == "fail"
    return "true" if fail else "false"


#: a table's Python callables before its group_by retraction run inside it, on each row's
#: latest record (False: in a mapInArrow over every record first; bench.pipeline compares)
SELECT_IN_RETRACT = True


def read(spark: SparkSession, q: Query, t: Target) -> tuple[Flow, tuple[str, ...]]:
    """The input topic as an envelope flow (plus the columns a repartition topic adds)."""
    df = _load(spark, q.input, t, q.reads_batches)
    ref = q.input
    flow = Flow(df, ref.key, ref.value, ref.kind)
    if q.reads_batches:
        flow = flow.with_df(sink.read_repartition_headers(df).drop("headers"))
        return flow, env.REPARTITION
    if ref.external:
        if ref.kind == "table":
            flow = flow.fail_where(F.col("key").isNull(), "null key")
        first = q.steps[0] if q.steps else None
        column_first = first is not None and not first.python
        retracting = _python_run(q.steps, 0)[1]
        # the retraction checks JSON values itself: the JVM's parse of every value was a
        # fifth of its profile samples in a table group_by (JFR)
        in_python = retracting and ref.value.format == "json"
        flow = flow.decode() if column_first else flow.validate(value=not in_python)
        if retracting:
            # the retraction takes the records as read: a good row's raw bytes are its key
            # and value and its topic is the input's, so they need not cross to Python
            # (a bad row keeps its own)
            lean = {c: F.when(flow_ok(), F.lit(None)).otherwise(F.col(c)) for c in env.LEAN}
            df = flow.df.withColumns(lean)
            flow = flow.with_df(df, lean_topic=ref.topic, json_unchecked=in_python)
    return flow, ()


def _python_run(steps: list[Step], i: int) -> tuple[list[Step], bool]:
    """The Python steps from `i` on, and whether they run inside the retraction right after
    them (a table's per-row callables and its group_by selection)."""
    run: list[Step] = []
    while i + len(run) < len(steps) and steps[i + len(run)].python:
        run.append(steps[i + len(run)])
    after = steps[i + len(run)] if i + len(run) < len(steps) else None
    fuse = SELECT_IN_RETRACT and after is not None and after.what == "retract"
    return run, fuse and stateless.selects_per_row(run)


def read_side(spark: SparkSession, ref: TopicRef, t: Target) -> Flow:
    """A join's other table, checked like any input and with its records' timestamps."""
    flow = Flow(_load(spark, ref, t), ref.key, ref.value, "table")
    flow = flow.fail_where(F.col("key").isNull(), "null key")
    return flow.validate() if ref.external else flow


def read_stream_side(spark: SparkSession, ref: TopicRef, t: Target) -> tuple[Flow, tuple[str, ...]]:
    """A stream-stream join's other stream, checked like any input (records without a key
    are the join's to ignore), with the record ids its topic carries if any."""
    df = _load(spark, ref, t, ref.ids)
    flow = Flow(df, ref.key, ref.value, "stream")
    if ref.ids:
        return flow.with_df(sink.read_repartition_headers(df).drop("headers")), env.REPARTITION
    return (flow.validate() if ref.external else flow), ()


def transform(
    flow: Flow,
    steps: list[Step],
    extra: tuple[str, ...],
    partitions: int,
    buckets: int,
    side: Callable[[TopicRef], Flow] | None = None,
    stream_side: Callable[[TopicRef], tuple[Flow, tuple[str, ...]]] | None = None,
) -> tuple[Flow, tuple[str, ...]]:
    i = 0
    while i < len(steps):
        step = steps[i]
        if step.what == "join":
            assert side is not None and step.side is not None
            flow = join.apply(flow, side(step.side), step, buckets, extra)
            extra = ()
            i += 1
        elif step.what == "fk_subscribe":
            flow = fk_join.subscribe(flow, step, buckets, extra)
            extra = fk_join.OUT_EXTRA
            i += 1
        elif step.what == "fk_match":
            assert side is not None and step.side is not None
            flow = fk_join.match(flow, side(step.side), step, buckets)
            extra = fk_join.OUT_EXTRA
            i += 1
        elif step.what == "fk_resolve":
            flow = fk_join.resolve(flow, step, buckets)
            extra = ()
            i += 1
        elif step.what == "stream_join":
            assert stream_side is not None and step.side is not None
            other, other_extra = stream_side(step.side)
            flow = stream_join.apply(flow, other, step, partitions, extra, other_extra)
            extra = ()
            i += 1
        elif step.what == "cogroup":
            assert stream_side is not None
            others = [stream_side(ref) for ref in step.sides]
            flow = cogroup.apply([(flow, extra), *others], step, buckets, partitions)
            extra = ()
            i += 1
        elif step.what == "window_aggregate":
            flow = window.apply(flow, step, partitions, extra)
            extra = ()
            i += 1
        elif step.what == "spark_aggregate":
            flow = spark_aggregate.apply(flow, step)
            i += 1
        elif step.what == "spark_retract":
            flow = spark_table_aggregate.retract(flow, step)
            extra = (env.OLD, env.SRC)
            i += 1
        elif step.what == "spark_table_aggregate":
            flow = spark_table_aggregate.aggregate(flow, step, extra)
            extra = ()
            i += 1
        elif step.stateful:
            flow = keyed_step(flow, step, buckets, extra)
            extra = (env.OLD, env.RID, env.SRC) if step.what == "retract" else ()
            i += 1
        elif step.python:
            run, fused = _python_run(steps, i)
            if fused:
                # the selection runs inside the retraction, on each row's latest record
                flow = keyed_step(flow, steps[i + len(run)], buckets, extra, run)
                extra = (env.OLD, env.RID, env.SRC)
                i += len(run) + 1
                continue
            flow = stateless.apply_python(flow, run, extra)
            i += len(run)
        else:
            flow = stateless.apply_column(flow, step)
            i += 1
    return flow, extra


def keyed_step(
    flow: Flow,
    step: Step,
    buckets: int,
    extra: tuple[str, ...] = (),
    selection: list[Step] | None = None,
) -> Flow:
    """Run the per-key `step` on `flow`, keys hashed into buckets; returns encoded rows
    (a retraction with the Python `selection` steps runs them itself: retract())."""
    # rows read from a stream's repartition topic carry (old, batch, rid): copies are
    # dropped before a per-key step (a table aggregation drops them itself)
    through = env.BATCH in extra and step.what in ("stream_aggregate", "transform_values")
    if step.what != "table_aggregate" and not through:
        extra = ()
    flow = flow.envelope(*extra)
    out_extra: tuple[str, ...] = ()
    if step.what == "retract":
        select = stateless.python_run(flow, selection).one_row if selection else None
        core = aggregate.retract(select, flow.lean_topic, flow.json_unchecked)
        out_extra = (env.OLD, env.RID, env.SRC)
    elif step.what == "transform_values":
        assert isinstance(step.node, plan.TransformValues)
        core = transform_values(step.node.fn, flow.key, flow.value, step.value)
    else:
        node = step.node
        assert isinstance(node, plan.Aggregate)
        agg = aggregate.Aggregator.of(node)
        stream = step.what == "stream_aggregate"
        make = aggregate.stream_aggregate if stream else aggregate.table_aggregate
        core = make(agg, flow.key, flow.value, step.value)
    if through:
        core = keyed.deduplicated(core)
    df = keyed.by_bucket(flow.df, core, buckets, *out_extra)
    return Flow(df, step.key, step.value, step.kind)


def writer(spark: SparkSession, q: Query, t: Target) -> DataStreamWriter:
    """The query's DataStreamWriter, ready for its trigger (the run stage picks it)."""
    flow, extra = read(spark, q, t)
    side = lambda r: read_side(spark, r, t)  # noqa: E731
    stream_side = lambda r: read_stream_side(spark, r, t)  # noqa: E731
    flow, extra = transform(flow, q.steps, extra, t.partitions, t.buckets, side, stream_side)
    flow = flow.envelope(*extra)
    if q.dead_letters:
        flow = flow.with_df(flow.df.where(~flow_ok()))
    dlq = dlq_topic(t.app_id)
    common: dict[str, Any] = spark_options(t.bootstrap_servers)
    if t.interceptor:
        common["kafka.interceptor.classes"] = t.interceptor
    placed = None
    if q.partitioner is not None:
        flow, placed = partition.assign(flow, q.partitioner, t.sink_partitions)
    elif q.windowed:
        placed = window.partition_column()
    if q.output.ids:
        flow = sink.with_record_ids(flow, extra)
    # a table's index values ride with its records (last: they are of the rows written)
    indexed = None
    if q.indexes:
        flow, indexed = index.apply(flow, q.indexes)
    if q.writes_batches or q.reorders:
        df = sink.observe(flow.df, q.name)
        headers = sink.repartition_headers() if q.writes_batches else indexed

        def write_batch(batch: DataFrame, batch_id: int) -> None:
            if q.writes_batches:  # the batch id lets the reader drop what a replay writes again
                batch = sink.with_batch_id(batch, batch_id)
            if q.reorders:
                batch = join.in_source_order(batch)
            out = sink.route(flow.with_df(batch), q, dlq, headers, placed)
            out.write.format("kafka").options(**common).save()

        w = df.writeStream.foreachBatch(write_batch)
    else:
        flow = flow.with_df(sink.observe(flow.df, q.name))
        out = sink.route(flow, q, dlq, indexed, placed)
        w = out.writeStream.format("kafka").options(**common)
    w = (
        w.queryName(q.name)
        .option("checkpointLocation", f"{t.checkpoints.rstrip('/')}/{q.name}")
        .outputMode("update")
    )
    return w
