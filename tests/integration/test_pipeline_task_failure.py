"""A query whose task fails is started again from its checkpoint: on one machine Spark
does not retry the task, so without this one lost Python worker ends the pipeline."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

import tablecast as tc
from tablecast.kafka.topics import ensure_topic
from tests.support.procs import eventually

from .kafka_io import produce
from .test_pipeline_support import TRIGGER, read_table

pytestmark = pytest.mark.integration

STR, LONG, JSON = tc.serde.string(), tc.serde.long(), tc.serde.json()
CRASH = 7


def crash_once(marker: str) -> Callable[[str, dict[str, Any]], int]:
    """x * 10; the Python worker that first meets x == CRASH dies as the OOM killer would
    end it (no exception, no clean-up), and leaves `marker` so the replay goes through."""

    def value(key: str, v: dict[str, Any]) -> int:
        if v["x"] == CRASH and not os.path.exists(marker):
            Path(marker).touch()
            os._exit(1)
        return v["x"] * 10

    return value


def test_a_query_whose_python_worker_dies_starts_again_from_its_checkpoint(
    bootstrap: str,
    spark,  # type: ignore[no-untyped-def]
    unique: str,
    tmp_path: Path,
) -> None:
    topic = f"{unique}-in"
    ensure_topic(bootstrap, topic, 2)
    marker = tmp_path / "crashed"
    app = tc.App(unique, state_dir=tmp_path / "state", trigger=TRIGGER)
    app.table(topic, key=STR, value=JSON).map_values(crash_once(str(marker)), LONG).materialize(
        "x10"
    )
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    (name,) = pipeline.queries
    first_run = pipeline.queries[name].runId
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.await_termination(stop)
        except BaseException as e:
            failed.append(e)

    waiter = threading.Thread(target=run, daemon=True)
    waiter.start()
    try:
        produce(bootstrap, topic, [(f"k{i}".encode(), orjson.dumps({"x": i})) for i in range(10)])
        expected = {f"k{i}": i * 10 for i in range(10)}

        def complete() -> bool:
            if failed:  # the pipeline gave up: no use waiting
                pytest.fail(f"the pipeline failed: {failed}")
            return read_table(bootstrap, f"{unique}.table.x10", STR, LONG) == expected

        eventually(complete, timeout=180, interval=1)
        assert marker.exists(), "the worker never met the record that kills it"
        assert not failed, failed
        assert waiter.is_alive(), "the pipeline stopped waiting after the failure"
        assert pipeline.queries[name].runId != first_run, "the query was not started again"
        assert pipeline.queries[name].isActive
    finally:
        stop.set()
        waiter.join(30)
        pipeline.stop()
