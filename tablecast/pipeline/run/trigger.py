"""Which trigger each query runs with: Real-time Mode where Spark runs its plan, else micro-batch.

``App(trigger="realtime")`` asks for Spark's Real-time Mode (records stream
through long-running tasks instead of waiting for the next micro-batch). Spark
4.3 runs it only for plans whose every physical operator and sink is on its
allowlist (``RealTimeModeAllowlist``): projections, filters, generators,
observed metrics, streaming aggregations (a grouped stream's count or Spark
aggregate function here) and JVM transformWithState (a table group_by folded in
Columns here), into a Kafka sink. A query of ours falls back to micro-batch
when it needs anything else — each reason below names the Spark operator that
is not on the list — or when the session has too few task slots: a real-time
batch holds one task per source partition for its whole duration, and a
stateful step in Spark one per shuffle partition, as many as the machine's cores
at most on one machine (:func:`slots_needed`).

``realtime`` takes an optional checkpoint interval (``"realtime 10 seconds"``,
at least ``spark.sql.streaming.realTimeMode.minBatchDuration``, 5 s): Spark
ends each long-running batch and checkpoints its offsets that often. It bounds
how much is replayed after a crash, not the latency.

By default (``"auto"``) every query runs micro-batches, a stateless one every
100 ms, a stateful one every 200 ms and a dead-letter companion every 2 s
(:func:`micro_batch_interval`); an interval string sets one for every query.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tablecast.pipeline.plan import nodes as plan
from tablecast.pipeline.plan.queries import IN_SPARK

if TYPE_CHECKING:
    from pyspark.sql.streaming import DataStreamWriter

    from tablecast.pipeline.plan.queries import Query

REALTIME = "realtime"
#: the App's default: each query's micro-batch interval follows what it does
#: (:func:`micro_batch_interval`)
AUTO = "auto"
#: a stateless query's interval under "auto", or when it cannot run in Real-time Mode: its
#: batch costs about a hundred milliseconds, so with a longer tick a record waited mostly
#: for the tick
STATELESS_INTERVAL = "100 milliseconds"
#: a stateful query's: its batches cost a few hundred milliseconds, so under a steady
#: trickle they run back to back and a record waits for the batch in progress rather
#: than for the tick; no shorter, as each idle tick asks Kafka for the topics' ends
STATEFUL_INTERVAL = "200 milliseconds"
#: a dead-letter companion's: it reads the same topics as its aggregation again, and
#: its CPU would lengthen the batches that make the table; a bad record may wait
DEAD_LETTER_INTERVAL = "2 seconds"
#: Real-time Mode checkpoint interval unless the App names one: each batch end
#: stalls records for a few hundred ms (measured in bench/pipeline.py), so not
#: too often; a crash replays at most this much (idempotent for tables)
CHECKPOINT_INTERVAL = "30 seconds"

_UNITS = {"millisecond": "ms", "second": "s", "minute": "min", "hour": "h"}


@dataclass(frozen=True)
class Trigger:
    realtime: bool
    interval: str  # the micro-batch interval, or the real-time checkpoint interval
    fallback: str | None = None  # why a query asked to run in real time does not

    def describe(self) -> str:
        if self.realtime:
            return f"realtime (checkpoint every {short(self.interval)})"
        why = f" (fallback: {self.fallback})" if self.fallback else ""
        return f"micro-batch {short(self.interval)}{why}"

    def apply(self, w: DataStreamWriter) -> DataStreamWriter:
        if self.realtime:
            return w.trigger(realTime=self.interval)
        return w.trigger(processingTime=self.interval)


def short(interval: str) -> str:
    """'500 milliseconds' -> '500 ms' (explain output)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]+?)s?\s*", interval)
    if m and m.group(2) in _UNITS:
        return f"{m.group(1)} {_UNITS[m.group(2)]}"
    return interval


def micro_batch_interval(q: Query) -> str:
    """The interval `q` runs micro-batches at when the App leaves it to tablecast."""
    if q.dead_letters:
        return DEAD_LETTER_INTERVAL
    return STATEFUL_INTERVAL if q.stateful else STATELESS_INTERVAL


def requested(trigger: str) -> tuple[bool, str]:
    """(real time asked for?, interval) of an App's trigger string (``AUTO`` as itself)."""
    word, _, rest = trigger.strip().partition(" ")
    if word.lower() == REALTIME:
        return True, rest.strip() or CHECKPOINT_INTERVAL
    return False, trigger


def blockers(q: Query) -> list[str]:
    """Why Spark cannot run `q` in Real-time Mode, from its plan alone (empty: it can).

    Each reason names the Spark operator that is not on the allowlist, as
    Spark's own error (STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_IN_ALLOWLIST)
    names it when such a query is started in Real-time Mode anyway.
    """
    reasons = []
    if q.writes_batches:
        reasons.append("foreachBatch sink (ForeachBatchSink)")
    for s in q.steps:
        # a join's node describes the whole other side: its kind is enough here
        what = (
            s.what if s.what in ("retract", "join", "stream_join", "cogroup") else s.node.describe()
        )
        if s.what in IN_SPARK:
            continue  # Spark's aggregation and transformWithState: on the allowlist since 4.3
        if s.stateful:
            reasons.append(f"stateful {what} (FlatMapGroupsInPandasWithStateExec)")
        elif s.python:
            reasons.append(f"Python callable {what} (MapInArrowExec)")
    if q.partitioner is not None and not plan.is_column(q.partitioner):
        part = plan.fn_name(q.partitioner)
        reasons.append(f"Python partitioner {part} (ArrowEvalPythonExec)")
    for name, fn in q.indexes:
        if not plan.is_column(fn):  # the sink's pandas UDF (compile/index.py)
            reasons.append(f"Python index {name!r} {plan.fn_name(fn)} (ArrowEvalPythonExec)")
    serdes = [q.input.key, q.input.value, q.output.key, q.output.value]
    serdes += [sd for s in q.steps for sd in (s.key, s.value)]
    if any(sd.format == "avro" for sd in serdes):
        reasons.append("Avro serde, translated in Python (ArrowEvalPythonExec)")
    return reasons


#: each stateless operator's Python function as a Column over `key` and `value` (an example
#: of the form; a JSON value is a VARIANT), which Spark evaluates itself
COLUMN_FORMS = {
    "filter": 'filter(F.variant_get("value", "$.price", "double") > 0)',
    "map_values": 'map_values(F.variant_get("value", "$.price", "double"))',
    "map": 'map((F.variant_get("value", "$.symbol", "string"), F.col("value")))',
    "flat_map_values": 'flat_map_values(F.split(F.col("value"), ","))',
    "flat_map": (
        'flat_map(F.array(F.struct(F.col("key").alias("key"), F.col("value").alias("value"))))'
    ),
    "select_key": 'select_key(F.variant_get("value", "$.symbol", "string"))',
}
#: a table group_by's selection as a pair of Columns
GROUP_BY_FORM = (
    'group_by((F.variant_get("value", "$.g", "string"), F.variant_get("value", "$.n", "long")))'
)
#: a grouped table's Python reduce as Columns, which Spark folds in the JVM
TABLE_FOLD_FORM = 'reduce(F.col("aggregate") + F.col("value"), F.col("aggregate") - F.col("value"))'
#: a grouped stream's Python aggregate or reduce as one Spark aggregate function
AGGREGATE_FORM = 'aggregate(F.max_by(F.col("value"), F.variant_get("value", "$.time", "long")))'
PARTITIONER_FORM = 'partitioner=F.abs(F.hash(F.col("key"))) % 4'
INDEX_FORM = 'indexes={"NAME": F.variant_get("value", "$.field", "string")}'


def column_forms(q: Query) -> list[str]:
    """For each Python function that keeps `q` out of Real-time Mode and has a Column form
    Spark runs there, that form (an example to adapt): empty when none has one."""
    hints = []
    python_before = False
    for s in q.steps:
        node = s.node
        if s.python and isinstance(node, plan.Op) and node.name in COLUMN_FORMS:
            hints.append(f"{node.describe()} as a Column: {COLUMN_FORMS[node.name]}")
        elif s.python and s.what == "select_group":
            hints.append(f"{node.describe()} as a pair of Columns: {GROUP_BY_FORM}")
        elif s.what == "table_aggregate" and isinstance(node, plan.Aggregate):
            if node.agg in ("aggregate", "reduce"):
                hints.append(f"{node.describe()} as Columns, folded in the JVM: {TABLE_FOLD_FORM}")
        elif s.what == "stream_aggregate" and isinstance(node, plan.Aggregate):
            if node.agg in ("aggregate", "reduce"):
                hints.append(f"{node.describe()} as one Spark aggregate function: {AGGREGATE_FORM}")
            elif node.agg == "count" and python_before:
                hints.append("count() is Spark's own once every step before it is a Column")
        python_before = python_before or s.python
    if q.partitioner is not None and not plan.is_column(q.partitioner):
        hints.append(f"partitioner {plan.fn_name(q.partitioner)} as a Column: {PARTITIONER_FORM}")
    for name, fn in q.indexes:
        if not plan.is_column(fn):
            hints.append(f"index {name!r} {plan.fn_name(fn)} as a Column: {INDEX_FORM}")
    return hints


def shuffling_steps(q: Query) -> int:
    """`q`'s stateful steps in Spark: each shuffles its input and keeps its state per
    shuffle partition."""
    return sum(s.what in IN_SPARK for s in q.steps)


def slots_needed(q: Query, partitions: int, shuffle: int | None = None) -> int:
    """Task slots a real-time batch of `q` holds: one per input partition, and one per
    partition each stateful step in Spark shuffles into (`shuffle` of them; as many as
    the input's partitions when not known)."""
    return partitions + shuffling_steps(q) * (partitions if shuffle is None else shuffle)


def recorded_shuffle_partitions(checkpoint: Path) -> int | None:
    """The shuffle partitions a query's checkpoint keeps (None before its first batch):
    Spark records the setting with each batch's offsets and continues with it."""
    offsets = _last_batch(checkpoint / "offsets")
    if offsets is None:
        return None
    with open(offsets) as f:
        for line in f:
            if line.startswith("{") and '"conf"' in line:
                value = json.loads(line).get("conf", {}).get("spark.sql.shuffle.partitions")
                return int(value) if value else None
    return None


def written_by_micro_batch(checkpoint: Path) -> bool:
    """Whether a query's checkpoint was last committed by a micro-batch run.

    Micro-batch runs write checkpoint format v1 (commit log "v1"), real-time
    runs v2; Spark does not continue a v1 checkpoint in Real-time Mode, even a
    stateless query's (STREAMING_REAL_TIME_MODE.CHECKPOINT_FORMAT_V1_NOT_SUPPORTED).
    """
    commit = _last_batch(checkpoint / "commits")
    if commit is None:
        return False
    with open(commit) as f:
        return f.readline().strip() == "v1"


def _last_batch(log: Path) -> Path | None:
    """The newest batch's file of a checkpoint's log (``offsets``, ``commits``), if any."""
    batches = [int(p.name) for p in log.glob("[0-9]*") if p.name.isdigit()]
    return log / str(max(batches)) if batches else None


def decide(
    trigger: str,
    q: Query,
    partitions: int | None = None,
    free_slots: int | None = None,
    micro_batch_checkpoint: Path | None = None,
) -> Trigger:
    """The trigger `q` runs with under the App's `trigger`.

    `partitions` (of the query's input topic) and `free_slots` (task slots it
    may hold) are checked when both are known: the runner knows them, ``explain``
    without a running Spark does not; nor does it know `micro_batch_checkpoint`,
    the query's checkpoint if an earlier micro-batch run wrote it.
    """
    realtime, interval = requested(trigger)
    if not realtime:
        auto = interval.strip().lower() == AUTO
        return Trigger(False, micro_batch_interval(q) if auto else interval)
    fallback = micro_batch_interval(q)
    reasons = blockers(q)
    if reasons:
        why = "not in Spark's Real-time Mode allowlist: " + "; ".join(reasons)
        return Trigger(False, fallback, why)
    if micro_batch_checkpoint is not None:
        why = (
            f"its checkpoint {micro_batch_checkpoint} was written by a micro-batch run, which "
            "Spark does not continue in Real-time Mode; deleting it switches (the query then "
            "reads its input again from the start)"
        )
        return Trigger(False, fallback, why)
    if partitions is not None and free_slots is not None and partitions > free_slots:
        per = "one per source partition"
        if shuffling_steps(q):
            per += " and one per partition each of its stateful steps shuffles into"
        why = f"needs {partitions} task slots at once ({per}), {max(free_slots, 0)} free"
        return Trigger(False, fallback, why)
    return Trigger(True, interval)


def assign(
    trigger: str,
    queries: list[tuple[Query, int]],
    slots: int,
    others_micro_batch: bool = False,
    micro_batch_checkpoints: dict[str, Path] | None = None,
) -> list[Trigger]:
    """Triggers for a pipeline's queries (each with its input's partition count;
    `micro_batch_checkpoints` by query name: see :func:`decide`).

    Real-time queries hold their slots for whole checkpoint intervals, so
    together they get at most `slots` (the session's task slots not held by
    real-time queries already running), less one kept for micro-batch queries
    when there are any (here or, per `others_micro_batch`, elsewhere in the
    session): without it those would wait for a real-time batch to end.
    """
    old = micro_batch_checkpoints or {}
    planned = [decide(trigger, q, micro_batch_checkpoint=old.get(q.name)) for q, _ in queries]

    def fit(reserve: int) -> list[Trigger]:
        free = slots - reserve
        out = []
        for (q, n), t in zip(queries, planned, strict=True):
            if t.realtime:
                t = decide(trigger, q, n, free)
                free -= n if t.realtime else 0
            out.append(t)
        return out

    micro = others_micro_batch or not all(t.realtime for t in planned)
    out = fit(1 if micro else 0)
    if not micro and not all(t.realtime for t in out):
        out = fit(1)  # a query that did not fit runs micro-batch: it needs its slot too
    return out
