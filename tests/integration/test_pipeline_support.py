"""Helpers for the pipeline tests: run an App on the session's broker and Spark,
and read a table topic back as the latest value per key."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from hypothesis import HealthCheck, Phase, settings

import tablecast as tc
from tablecast.contract.partitioner import partition_for
from tablecast.kafka.config import client_conf
from tablecast.kafka.topics import end_offsets, ensure_topic
from tablecast.pipeline.run.pipeline import Pipeline
from tablecast.serde import Serde

from .kafka_io import produce

STR = tc.serde.string()


def read_topic(bootstrap: str, topic: str) -> list[Any]:
    """Every record `topic` holds now, partition by partition, in offset order."""
    ends = end_offsets(bootstrap, topic)
    c = Consumer(
        client_conf(
            bootstrap,
            {
                "group.id": "tc-tests-read",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            },
        )
    )
    out: list[Any] = []
    try:
        todo = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + 60
        while todo:
            assert time.monotonic() < deadline, f"{topic}: partitions {todo} not read to the end"
            # consume() waits for its whole batch or the timeout: keep the timeout short
            for m in c.consume(1000, 0.1):
                if m.error() is not None:
                    if m.error().code() == -191:  # _PARTITION_EOF
                        todo.discard(m.partition())
                    continue
                out.append(m)
                if m.offset() >= ends[m.partition()] - 1:
                    todo.discard(m.partition())
    finally:
        c.close()
    return out


def read_table(bootstrap: str, topic: str, key: Serde, value: Serde) -> dict[Any, Any]:
    """The latest value per key of a table topic; checks each key's partition."""
    records = read_topic(bootstrap, topic)
    partitions = len(end_offsets(bootstrap, topic))
    table: dict[Any, Any] = {}
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        assert m.key() is not None, f"{topic}: a record without key"
        assert m.partition() == partition_for(m.key(), partitions), f"{topic}: misplaced key"
        k = key.deserialize(m.key())
        if m.value() is None:
            table.pop(k, None)
        else:
            table[k] = value.deserialize(m.value())
    return table


# -- one App per module, fed by hypothesis examples that build on each other ----

#: the trigger of the Apps the tests start on the shared Spark session: an idle query asks
#: Kafka for its topics' ends every trigger, and a module holds up to nine queries idle
#: between its steps; a step waits up to one tick longer for its queries to see it
TRIGGER = "1 second"

#: examples per operator test: few in CI (Spark is slow here); the full run takes
#: TABLECAST_EXAMPLES=50 (docs/user-guide.md, "Testing the operators")
EXAMPLES = int(os.environ.get("TABLECAST_EXAMPLES", "3"))

#: no shrinking: an example's records are added to everything earlier examples
#: produced, so a shrunk one means nothing
_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def CUMULATIVE(test: Callable[..., Any]) -> Callable[..., Any]:
    """Hypothesis settings of the operator tests, and time for all their examples."""
    return pytest.mark.timeout(300 + 180 * EXAMPLES)(_SETTINGS(test))


@dataclass
class Running:
    app: tc.App
    topic: str
    pipeline: Pipeline
    history: list[tuple[Any, Any]] = field(default_factory=list)

    def feed(self, bootstrap: str, records: list[tuple[str, Any]]) -> None:
        """Produce JSON records (None: a null value), remember them, wait for the pipeline."""
        produce(
            bootstrap,
            self.topic,
            [(k.encode(), None if v is None else orjson.dumps(v)) for k, v in records],
        )
        self.history.extend(records)
        self.pipeline.process_all_available()

    def check(self, bootstrap: str, expected: dict[str, tuple[dict[Any, Any], Serde]]) -> None:
        """Every table equals the reference model's answer; nothing went to the DLQ."""
        for name, (table, value) in expected.items():
            got = read_table(bootstrap, f"{self.app.id}.table.{name}", STR, value)
            assert got == table, name
        assert self.pipeline.dead_letters.total() == 0


@contextmanager
def running_app(
    bootstrap: str,
    spark: Any,
    tmp_path_factory: Any,
    kind: str,
    build: Callable[[tc.App, str], None],
    partitions: int = 3,
    trigger: str = TRIGGER,
) -> Iterator[Running]:
    """An App on a fresh input topic: `build(app, topic)` defines it; started, then stopped."""
    app_id = f"{kind}{uuid.uuid4().hex[:8]}"
    topic = f"{app_id}-input"
    ensure_topic(bootstrap, topic, partitions)
    app = tc.App(app_id, state_dir=tmp_path_factory.mktemp("state"), trigger=trigger)
    build(app, topic)
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    try:
        yield Running(app, topic, pipeline)
    finally:
        pipeline.stop()
