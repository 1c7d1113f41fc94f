"""``App(trigger="realtime")``: stateless JVM queries run in Spark's Real-time Mode,
the rest fall back to micro-batch, and both produce the reference model's tables.

The topic has one partition: the session is local[2], a real-time query holds a
task slot per source partition, and the App's micro-batch queries keep one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

import tablecast as tc
from tablecast.kafka.topics import dlq_topic
from tablecast.pipeline.run.spark import read_tasks, shuffle_partitions
from tablecast.pipeline.run.trigger import recorded_shuffle_partitions
from tests import reference_model as ref

from .kafka_io import produce
from .test_pipeline_support import Running, read_table, read_topic, running_app

pytestmark = pytest.mark.integration

LONG, STR, JSON = tc.serde.long(), tc.serde.string(), tc.serde.json()


def build(app: tc.App, topic: str) -> None:
    ev = app.stream(topic, key=STR, value=JSON)
    X = F.variant_get("value", "$.x", "int")
    ev.filter(X % 2 == 0).map_values(X * 10, value=LONG).to_table().materialize("fresh")
    # eligible too, but the one free slot is taken: the fallback says so
    ev.select_key(F.upper("key")).map_values(X, value=LONG).to_table().materialize("upper")
    ev.group_by_key().count().materialize("counts")


@pytest.fixture(scope="module")
def running(bootstrap: str, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:  # type: ignore[no-untyped-def]
    with running_app(
        bootstrap, spark, tmp_path_factory, "rt", build, partitions=1, trigger="realtime 5 seconds"
    ) as r:
        yield r


def test_realtime_for_stateless_tables_and_micro_batch_with_a_reason_otherwise(
    running: Running,
) -> None:
    app = running.app.id
    triggers = running.pipeline.triggers
    assert triggers[f"{app}.fresh"].realtime
    assert triggers[f"{app}.fresh"].interval == "5 seconds"
    upper, counts = triggers[f"{app}.upper"], triggers[f"{app}.counts"]
    assert not upper.realtime and not counts.realtime
    assert upper.fallback == "needs 1 task slots at once (one per source partition), 0 free"
    # Spark's own aggregation could run in real time, with a slot for its shuffle too
    assert counts.fallback == (
        "needs 2 task slots at once (one per source partition and one per partition each of "
        "its stateful steps shuffles into), 0 free"
    )
    # what Spark itself runs them with
    spark_triggers = {
        n: q._jsq.streamingQuery().trigger().getClass().getSimpleName()
        for n, q in running.pipeline.queries.items()
    }
    assert spark_triggers == {
        f"{app}.fresh": "RealTimeTrigger",
        f"{app}.upper": "ProcessingTimeTrigger",
        f"{app}.counts": "ProcessingTimeTrigger",
        f"{app}.counts.dlq": "ProcessingTimeTrigger",  # the input rows counts drops
    }
    text = running.pipeline.explain()
    assert "trigger: realtime (checkpoint every 5 s)" in text
    # a stateless query falls back to a shorter tick than a stateful one
    assert "trigger: micro-batch 100 ms (fallback: needs 1 task slots" in text
    assert "trigger: micro-batch 200 ms (fallback: needs 2 task slots" in text


def test_realtime_and_fallback_queries_match_the_reference_model(
    running: Running, bootstrap: str
) -> None:
    records: list[tuple[str, Any]] = [
        (f"k{i % 5}", {"x": x, "g": i % 3}) for i, x in enumerate([4, -7, 12, 0, 3, 8, 9, 2, 6, 1])
    ]
    for batch in (records[:6], records[6:]):
        running.feed(bootstrap, batch)
        history = running.history
        fresh = ref.map_values(
            ref.filter_(history, lambda k, v: v["x"] % 2 == 0), lambda k, v: v["x"] * 10
        )
        upper = ref.map_values(ref.select_key(history, lambda k, v: k.upper()), lambda k, v: v["x"])
        running.check(
            bootstrap,
            {
                "fresh": (ref.latest(fresh), LONG),
                "upper": (ref.latest(upper), LONG),
                "counts": (ref.stream_count(history), LONG),
            },
        )


def test_bad_records_of_a_realtime_query_go_to_the_dlq(running: Running, bootstrap: str) -> None:
    before = len(read_topic(bootstrap, dlq_topic(running.app.id)))
    produce(bootstrap, running.topic, [(b"bad", b"{not json")])
    running.pipeline.process_all_available()
    bad = read_topic(bootstrap, dlq_topic(running.app.id))[before:]
    # one per query: each reads the source and checks its records itself (counts' through
    # its companion query)
    assert sorted(m.value() for m in bad) == [b"{not json"] * 3
    assert all(m.key() == b"bad" for m in bad)
    fresh = {m.key().decode() for m in read_topic(bootstrap, f"{running.app.id}.table.fresh")}
    assert "bad" not in fresh
    # counted from each query's progress: a real-time one reports when its batch ends
    counts = running.pipeline.dead_letters.counts
    deadline = time.monotonic() + 30
    while len(counts) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    # counts' bad rows are its companion's (the aggregation drops them)
    dropping = f"{running.app.id}.counts"
    assert dict(counts) == {q: 1 for q in running.pipeline.queries if q != dropping}


def test_restart_continues_real_time_checkpoints_and_keeps_micro_batch_ones(
    running: Running,
    bootstrap: str,
    spark,  # type: ignore[no-untyped-def]
) -> None:
    """Spark refuses a micro-batch checkpoint in Real-time Mode: that query stays micro-batch."""
    running.pipeline.stop()
    pipeline = running.app.start(bootstrap_servers=bootstrap, spark=spark)
    running.pipeline = pipeline
    try:
        app = running.app.id
        assert pipeline.triggers[f"{app}.fresh"].realtime
        upper = pipeline.triggers[f"{app}.upper"].fallback or ""
        assert upper.startswith("its checkpoint ") and "written by a micro-batch run" in upper
        produce(bootstrap, running.topic, [(b"k9", b'{"x": 40}'), (b"k1", b'{"x": 41}')])
        running.history.extend([("k9", {"x": 40}), ("k1", {"x": 41})])
        pipeline.process_all_available()
        history = running.history
        fresh = ref.map_values(
            ref.filter_(history, lambda k, v: v["x"] % 2 == 0), lambda k, v: v["x"] * 10
        )
        upper_t = ref.map_values(
            ref.select_key(history, lambda k, v: k.upper()), lambda k, v: v["x"]
        )
        for name, table in (("fresh", ref.latest(fresh)), ("upper", ref.latest(upper_t))):
            assert read_table(bootstrap, f"{app}.table.{name}", STR, LONG) == table, name
        # the shuffle partitions Spark continues the count's checkpoint with, as it recorded
        checkpoints = Path(running.app.resolve_checkpoint_dir())
        assert recorded_shuffle_partitions(checkpoints / f"{app}.counts") == 1
        assert recorded_shuffle_partitions(checkpoints / f"{app}.fresh") is not None
        assert recorded_shuffle_partitions(checkpoints / "never-started") is None
    finally:
        pipeline.stop()


def test_a_shuffle_has_a_partition_per_core_at_most(spark) -> None:  # type: ignore[no-untyped-def]
    """A session's slots (local[N]) may exceed its cores for Real-time Mode; a stateful step
    still shuffles into no more partitions than the cores, in either mode, and a micro-batch
    reads a topic in as many tasks."""
    cores = len(os.sched_getaffinity(0))
    slots = spark.sparkContext.defaultParallelism
    at_once = min(cores, slots)
    for realtime in (False, True):
        assert shuffle_partitions(spark, 30, realtime) == min(30, at_once)
        assert shuffle_partitions(spark, 1, realtime) == 1
    assert read_tasks(spark, False) == at_once
    assert read_tasks(spark, True) == 0  # a real-time query polls each partition in a task
