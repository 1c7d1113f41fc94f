"""Input deleted by retention before the pipeline read it: the query stops and says how to go on,
unless the App was told to skip the loss."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

import tablecast as tc
from tablecast.kafka.topics import end_offsets, ensure_topic

from ..support.procs import eventually
from .kafka_io import produce
from .test_pipeline_support import read_table

pytestmark = pytest.mark.integration

STR, JSON = tc.serde.string(), tc.serde.json()


def build(app_id: str, topic: str, state: Path, **options: str) -> tc.App:
    app = tc.App(app_id, state_dir=state, **options)  # type: ignore[arg-type]
    app.stream(topic, key=STR, value=JSON).to_table().materialize("t")
    return app


def feed(bootstrap: str, topic: str, keys: range) -> None:
    produce(bootstrap, topic, [(f"k{i}".encode(), orjson.dumps({"i": i})) for i in keys])


def test_input_lost_to_retention_stops_the_query_unless_skipped(
    bootstrap: str,
    spark,
    unique: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,  # type: ignore[no-untyped-def]
) -> None:
    topic = f"{unique}-in"
    ensure_topic(bootstrap, topic, 1)
    feed(bootstrap, topic, range(0, 5))
    table = f"{unique}.table.t"
    pipeline = build(unique, topic, tmp_path).start(bootstrap, spark=spark)
    try:
        pipeline.process_all_available()
    finally:
        pipeline.stop()
    assert sorted(read_table(bootstrap, table, STR, JSON)) == [f"k{i}" for i in range(5)]

    # while the pipeline is down, records it never read are deleted (as retention would)
    feed(bootstrap, topic, range(5, 10))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    end = end_offsets(bootstrap, topic)[0]
    admin.delete_records([TopicPartition(topic, 0, end)])[TopicPartition(topic, 0, end)].result(30)

    caplog.set_level(logging.ERROR, logger="tablecast.pipeline.run.pipeline")
    pipeline = build(unique, topic, tmp_path).start(bootstrap, spark=spark)
    try:
        (query,) = pipeline.queries.values()
        with pytest.raises(Exception, match="failOnDataLoss"):
            query.awaitTermination(120)
        # the listener bus reports the termination a moment later
        eventually(lambda: any("on_data_loss='skip'" in r.getMessage() for r in caplog.records), 30)
    finally:
        pipeline.stop()
    # nothing past the loss was written
    assert sorted(read_table(bootstrap, table, STR, JSON)) == [f"k{i}" for i in range(5)]

    # told to skip, it goes on without the lost records
    feed(bootstrap, topic, range(10, 12))
    pipeline = build(unique, topic, tmp_path, on_data_loss="skip").start(bootstrap, spark=spark)
    try:
        pipeline.process_all_available()
        (query,) = pipeline.queries.values()
        assert query.exception() is None
    finally:
        pipeline.stop()
    got = sorted(read_table(bootstrap, table, STR, JSON))
    assert got == sorted([f"k{i}" for i in range(5)] + ["k10", "k11"])


def test_on_data_loss_takes_fail_or_skip() -> None:
    with pytest.raises(ValueError, match="on_data_loss"):
        tc.App("x", on_data_loss="ignore")
