"""Stream-stream windowed joins against the reference model, on the real broker and Spark.

Left and right streams (3 partitions each, every key on its murmur2 partition, so a
task's records of each side come from one partition) are joined inner, left (with a
filtered right stream: computed by a query of its own into a changelog topic) and
outer, within an asymmetric window with grace, on records with explicit Kafka
timestamps. Each step writes to one side and waits for the pipeline, so the order in
which a task takes records is the steps' order. Output streams are compared per key,
values and timestamps in order; the outer join's latest value per key is a
materialized table; late records are in the dead-letter topic, once per join query
that saw them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from hypothesis import given
from hypothesis import strategies as st

import tablecast as tc
from tablecast.contract.partitioner import partition_for
from tablecast.kafka.topics import ensure_topic
from tests import reference_model as ref

from .test_pipeline_support import CUMULATIVE, Running, read_table, read_topic, running_app

pytestmark = pytest.mark.integration

PARTITIONS = 3
STR, JSON = tc.serde.string(), tc.serde.json()
SEC = 1000
# whole seconds a day ago: within the broker's retention (see test_pipeline_windows)
BASE = (int(time.time() * 1000) // SEC - 24 * 3600) * SEC
BEFORE, AFTER, GRACE = 10 * SEC, 20 * SEC, 5 * SEC
WINDOW = tc.windows.join(before="10 seconds", after="20 seconds", grace="5 seconds")
KEYS = [f"k{i}" for i in range(5)]
OUTPUTS = ("inner", "left", "outer")


def pair(left: dict[str, Any] | None, right: dict[str, Any] | None) -> list[Any]:
    return [None if left is None else left["id"], None if right is None else right["id"]]


def kept(k: str, v: dict[str, Any]) -> bool:
    return v["id"] % 4 != 0


class Streams(Running):
    """The running App, and every record fed as (task, side, key, value, timestamp)."""

    right: str = ""
    out: dict[str, str]
    fed: list[ref.StreamEvent]

    def topic_of(self, side: str) -> str:
        return self.topic if side == "left" else self.right

    def send(self, bootstrap: str, side: str, records: list[tuple[str | None, int, int]]) -> None:
        """(key, id, timestamp offset) records to one side, each key to its murmur2
        partition (a keyless one to partition 0), then wait for the pipeline."""
        p = Producer({"bootstrap.servers": bootstrap})
        for k, ident, at in records:
            kb = None if k is None else k.encode()
            part = 0 if kb is None else partition_for(kb, PARTITIONS)
            value = {"id": ident}
            ts = BASE + at
            p.produce(self.topic_of(side), orjson.dumps(value), kb, partition=part, timestamp=ts)
            self.fed.append((part, side, k, value, ts))
        assert p.flush(30) == 0
        self.pipeline.process_all_available()

    def expected(self, name: str) -> tuple[list[ref.TimedOut], list[ref.StreamEvent]]:
        events = self.fed
        how = name
        if name == "left":  # its right side is filtered first
            events = [e for e in events if e[1] == "left" or kept(e[2], e[3])]
        return ref.stream_stream_join(events, BEFORE, AFTER, GRACE, pair, how)


@pytest.fixture(scope="module")
def streams(bootstrap: str, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Streams]:  # type: ignore[no-untyped-def]
    out: dict[str, str] = {}
    names: dict[str, str] = {}

    def build(app: tc.App, topic: str) -> None:
        names["right"] = f"{app.id}-right"
        ensure_topic(bootstrap, names["right"], PARTITIONS)
        out.update({n: f"{app.id}-out-{n}" for n in OUTPUTS})
        left = app.stream(topic, key=STR, value=JSON)
        right = app.stream(names["right"], key=STR, value=JSON)
        left.join(right, pair, window=WINDOW).to(out["inner"])
        left.join(right.filter(kept), pair, how="left", window=WINDOW).to(out["left"])
        outer = left.join(right, pair, how="outer", window=WINDOW)
        outer.to(out["outer"])
        outer.to_table().materialize("outer_latest")

    with running_app(bootstrap, spark, tmp_path_factory, "ssjoin", build, PARTITIONS) as r:
        s = Streams(r.app, r.topic, r.pipeline)
        s.right, s.out, s.fed = names["right"], out, []
        yield s


def check(streams: Streams, bootstrap: str) -> None:
    late: Counter[tuple[str, int]] = Counter()
    for name in OUTPUTS:
        want, dropped = streams.expected(name)
        got: dict[Any, list[Any]] = {}
        records = read_topic(bootstrap, streams.out[name])
        for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
            key = m.key().decode()
            assert m.partition() == partition_for(m.key(), PARTITIONS), "misplaced result"
            got.setdefault(key, []).append((orjson.loads(m.value()), m.timestamp()[1]))
        expected: dict[Any, list[Any]] = {}
        for k, v, ts in want:
            expected.setdefault(k, []).append((v, ts))
        assert got == expected, name
        # the outer join runs twice: for its topic and for its table
        late.update((e[2], e[3]["id"]) for e in dropped for _ in range(1 + (name == "outer")))
        if name == "outer":
            latest = ref.latest((k, v) for k, v, _ in want)
            table = read_table(bootstrap, f"{streams.app.id}.table.outer_latest", STR, JSON)
            assert table == latest
    dead: Counter[tuple[str, int]] = Counter()
    keyless: Counter[int] = Counter()
    for m in read_topic(bootstrap, f"{streams.app.id}.dlq"):
        headers = dict(m.headers() or [])
        why = headers["tablecast.error"].decode()
        if why == "null key":
            # the filtered right stream goes through an internal topic, which takes no
            # record without a key: dead-lettered there, where Kafka Streams drops it at
            # the join; either way it joins nothing (the outputs above match the model)
            assert headers["tablecast.source.topic"].decode() == streams.right, headers
            keyless[orjson.loads(m.value())["id"]] += 1
            continue
        assert why.startswith("late record"), headers
        dead[(m.key().decode(), orjson.loads(m.value())["id"])] += 1
    assert dead == late
    fed = streams.fed
    fed_keyless = Counter(v["id"] for _, side, k, v, _ in fed if side == "right" and k is None)
    assert not keyless - fed_keyless  # only keyless right records, each at most as often as fed


def test_stream_joins_match_kafka_streams(streams: Streams, bootstrap: str) -> None:
    # k0 and k1 share task 2, k2 is task 0. A left record at t meets right ones in
    # [t - 0:10, t + 0:20]; it is late past t + 0:25, a right one past t + 0:15
    streams.send(bootstrap, "left", [("k0", 1, 0), ("k1", 3, 0), (None, 99, 0)])
    streams.send(bootstrap, "right", [("k0", 2, 15 * SEC), ("k2", 4, 1 * SEC)])  # 2 meets 1
    # out of order within grace (task 2 is at 0:15): 5 meets 1; 8 at 0:25 is too late for 1
    streams.send(bootstrap, "right", [("k0", 5, 5 * SEC), ("k0", 8, 25 * SEC)])
    check(streams, bootstrap)
    # stream time jumps to 2:00 in every task: every window closes, the unmatched
    # left records (left, outer) and right ones (outer) are written alone, once
    streams.send(bootstrap, "left", [(k, 10 + i, 120 * SEC) for i, k in enumerate(KEYS)])
    # 20 (k0, 1:40) is late; 21 (k1, 1:50) is not and meets 11 (k1, 2:00)
    streams.send(bootstrap, "right", [("k0", 20, 100 * SEC), ("k1", 21, 110 * SEC)])
    streams.send(bootstrap, "left", [("k0", 22, 90 * SEC), ("k2", 23, 90 * SEC)])  # both late
    check(streams, bootstrap)
    want, late = streams.expected("outer")
    values = [v for _, v, _ in want]
    for v in ([1, 2], [1, 5], [3, None], [None, 4], [None, 8], [11, 21]):
        assert values.count(v) == 1, v  # the test exercises what it claims
    assert [1, None] not in values and sorted(e[3]["id"] for e in late) == [20, 22, 23]
    inner, _ = streams.expected("inner")
    assert not any(None in v for _, v, _ in inner)


STEP = st.tuples(
    st.sampled_from(["left", "right"]),
    st.lists(
        st.tuples(st.sampled_from([*KEYS, None]), st.integers(-40, 40)), min_size=1, max_size=10
    ),
)


@pytest.mark.long
@CUMULATIVE
@given(steps=st.lists(STEP, min_size=1, max_size=4))
def test_stream_joins_match_kafka_streams_on_generated_records(
    streams: Streams, bootstrap: str, steps: list[tuple[str, list[tuple[str | None, int]]]]
) -> None:
    # a clock that mostly moves forward a few seconds, sometimes back past the grace
    clock = max((e[4] - BASE for e in streams.fed), default=0)
    ids = len(streams.fed) + 1000
    for side, records in steps:
        batch = []
        for k, step in records:
            clock = max(0, clock + step * SEC // 4)
            batch.append((k, ids, clock))
            ids += 1
        streams.send(bootstrap, side, batch)
    check(streams, bootstrap)
