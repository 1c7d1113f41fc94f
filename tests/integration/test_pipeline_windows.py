"""Windowed aggregations (tumbling count, hopping aggregate) against the reference model,
on records with explicit Kafka timestamps: out-of-order records within grace update
their windows, records later than grace go to the DLQ; a node serves the windows."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

import tablecast as tc
from tablecast.contract.partitioner import partition_for
from tablecast.contract.window_keys import split_window_key
from tests import reference_model as ref
from tests.support.procs import start_node

from .test_pipeline_support import Running, read_topic, running_app

pytestmark = pytest.mark.integration

PARTITIONS = 3
LONG, STR, JSON = tc.serde.long(), tc.serde.string(), tc.serde.json()
MIN = 60_000
# a whole minute a day ago: recent enough that the broker's 7-day retention
# keeps the input records (older timestamps were deleted before Spark read them)
BASE = (int(time.time() * 1000) // MIN - 24 * 60) * MIN
TUMBLING = (MIN, MIN, 30_000)  # size, advance, grace (ms)
HOPPING = (2 * MIN, MIN, 30_000)


def plus(k: str, v: dict[str, int], agg: int) -> int:
    return agg + v["x"]


def parity(k: str, v: dict[str, int]) -> str:
    return "even" if v["x"] % 2 == 0 else "odd"


def higher(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    # ties broken by id: a re-keyed task's order across source partitions is Spark's
    return b if (b["x"], b["id"]) >= (a["x"], a["id"]) else a


def reduce_higher(k: str, v: dict[str, int], a: dict[str, int] | None) -> dict[str, int]:
    return v if a is None else higher(a, v)


@pytest.fixture(scope="module")
def running(bootstrap: str, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:  # type: ignore[no-untyped-def]
    def build(app: tc.App, topic: str) -> None:
        grouped = app.stream(topic, key=STR, value=JSON).group_by_key()
        per_minute = grouped.windowed_by(tc.windows.tumbling("1 minute"), grace="30 seconds")
        per_minute.count().materialize("per_minute")
        per_minute.count(emit="final").materialize("per_minute_final")
        hopping = tc.windows.hopping(timedelta(minutes=2), timedelta(minutes=1))
        grouped.windowed_by(hopping, grace=timedelta(seconds=30)).aggregate(
            lambda: 0, plus, LONG
        ).materialize("sum_2m", store="memory")
        # re-keyed by a Python function (the timestamps travel through the Python worker)
        by_parity = app.stream(topic, key=STR, value=JSON).group_by(parity)
        by_parity.windowed_by(tc.windows.tumbling("1 minute"), grace="1 hour").reduce(
            higher
        ).materialize("max_by_parity")

    with running_app(bootstrap, spark, tmp_path_factory, "windows", build, PARTITIONS) as r:
        yield r


def feed(bootstrap: str, running: Running, records: list[tuple[str, dict[str, int], int]]) -> None:
    """Produce (key, value, timestamp) records, each key to its murmur2 partition, in order."""
    p = Producer({"bootstrap.servers": bootstrap})
    for k, v, ts in records:
        kb = k.encode()
        part = partition_for(kb, PARTITIONS)
        p.produce(running.topic, key=kb, value=orjson.dumps(v), partition=part, timestamp=ts)
        running.history.append((part, k, v, ts))
    assert p.flush(30) == 0
    running.pipeline.process_all_available()


def window_table(bootstrap: str, topic: str, value: tc.serde.Serde) -> dict[tuple[str, int], Any]:
    """The latest value per (key, window start) of a window table topic; checks partitions."""
    table: dict[tuple[str, int], Any] = {}
    for m in sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition(), m.offset())):
        inner, start = split_window_key(m.key())
        assert m.partition() == partition_for(inner, PARTITIONS), f"{topic}: misplaced window"
        k = STR.deserialize(inner)
        if m.value() is None:
            table.pop((k, start), None)
        else:
            table[(k, start)] = value.deserialize(m.value())
    return table


def late_in_dlq(bootstrap: str, app_id: str) -> Counter[tuple[str, int]]:
    out: Counter[tuple[str, int]] = Counter()
    for m in read_topic(bootstrap, f"{app_id}.dlq"):
        headers = dict(m.headers() or [])
        assert headers["tablecast.error"].decode().startswith("late record"), headers
        out[(m.key().decode(), orjson.loads(m.value())["id"])] += 1
    return out


def check(bootstrap: str, running: Running) -> dict[tuple[str, int], int]:
    h = running.history
    counts, late_t = ref.window_count(h, *TUMBLING)
    sums, late_h = ref.window_aggregate(h, *HOPPING, lambda: 0, plus)
    app_id = running.app.id
    assert window_table(bootstrap, f"{app_id}.table.per_minute", LONG) == counts
    # emit="final": each closed window once, open ones not yet
    final = ref.window_final(counts, h, MIN, 30_000, lambda k: partition_for(k.encode(), 3))
    final_topic = f"{app_id}.table.per_minute_final"
    assert window_table(bootstrap, final_topic, LONG) == final
    written = [m.key() for m in read_topic(bootstrap, final_topic)]
    assert len(written) == len(set(written)) == len(final)
    assert window_table(bootstrap, f"{app_id}.table.sum_2m", LONG) == sums
    # nothing is late within an hour's grace, so each task's order does not matter here
    rekeyed = [(0, parity(k, v), v, ts) for _, k, v, ts in h]
    maxes, none_late = ref.window_aggregate(
        rekeyed, MIN, MIN, 3_600_000, lambda: None, reduce_higher
    )
    assert not none_late
    assert window_table(bootstrap, f"{app_id}.table.max_by_parity", JSON) == maxes
    # the emit="final" count dead-letters the tumbling window's late records too
    late = Counter((k, v["id"]) for _, k, v, _ in late_t + late_t + late_h)
    assert late_in_dlq(bootstrap, app_id) == late
    return counts


def test_windowed_aggregations_match_kafka_streams(running: Running, bootstrap: str) -> None:
    ids = iter(range(1000))

    def rec(k: str, x: int, at: int) -> tuple[str, dict[str, int], int]:
        return (k, {"x": x, "id": next(ids)}, BASE + at)

    keys = [f"k{i}" for i in range(6)]
    first = [rec(k, i + j, j * 25_000) for j in range(8) for i, k in enumerate(keys)]
    # out of order, within grace: stream time of k1's task is 3:00, window [2:00, 3:00) +30s
    first += [rec("k1", 100, 3 * MIN), rec("k1", 7, 2 * MIN + 50_000)]
    feed(bootstrap, running, first)
    check(bootstrap, running)

    # a later micro-batch: stream time 10:00 for k0's task
    second = [
        rec("k0", 1, 10 * MIN),
        rec("k0", 2, 9 * MIN + 50_000),  # [9:00, 10:00) closes at 10:30: counted
        rec("k0", 3, 8 * MIN + 10_000),  # tumbling [8, 9) closed; hopping [8, 10) still open
        rec("k0", 4, 5 * MIN),  # closed everywhere: to the DLQ twice
    ]
    feed(bootstrap, running, second)
    counts = check(bootstrap, running)
    _, late_t = ref.window_count(running.history, *TUMBLING)
    _, late_h = ref.window_aggregate(running.history, *HOPPING, lambda: 0, plus)
    assert len(late_t) >= 2 and len(late_h) >= 1  # the test exercises what it claims
    assert counts[("k0", BASE + 9 * MIN)] == 1 and counts[("k1", BASE + 2 * MIN)] >= 2


def test_node_serves_the_windows(running: Running, bootstrap: str, logs: Path) -> None:
    if not running.history:
        test_windowed_aggregations_match_kafka_streams(running, bootstrap)
    counts, _ = ref.window_count(running.history, *TUMBLING)
    topic = f"{running.app.id}.table.per_minute"
    node = start_node(running.app.id, bootstrap, logs)
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "per_minute", topic)
        r = node.get(
            "/v1/tables/per_minute/keys/k2/windows",
            params={"from": BASE + MIN, "to": BASE + 3 * MIN},
        )
        assert r.status_code == 200, r.text
        want = sorted(
            (s, c)
            for (k, s), c in counts.items()
            if k == "k2" and BASE + MIN <= s <= BASE + 3 * MIN
        )
        assert want, "the test data has k2 windows in that range"
        assert r.json()["items"] == [{"start": s, "end": s + MIN, "value": c} for s, c in want]
    finally:
        node.stop()
