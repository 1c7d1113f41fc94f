"""Timestamp propagation: every table record carries the timestamp of the input
record that produced it, an aggregate the largest of its inputs' (Kafka Streams' rules),
through a stream's repartition topic too. Inputs carry explicit, out-of-order timestamps."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

import tablecast as tc
from tablecast.contract.partitioner import PRODUCER_CONFIG
from tablecast.contract.window_keys import split_window_key

from .test_pipeline_support import Running, read_topic, running_app

pytestmark = pytest.mark.integration

STR, JSON, LONG = tc.serde.string(), tc.serde.json(), tc.serde.long()
MIN = 60_000
# recent enough for the broker's 7-day retention
BASE = (int(time.time() * 1000) // MIN - 24 * 60) * MIN


def build(app: tc.App, topic: str) -> None:
    rows = app.table(topic, key=STR, value=JSON)
    rows.filter(lambda k, v: v["n"] % 2 == 0).materialize("even")
    rows.group_by(lambda k, v: (v["g"], v["n"]), value=LONG).reduce(
        lambda a, b: a + b, lambda a, b: a - b
    ).materialize("sums")
    events = app.stream(topic, key=STR, value=JSON)
    events.group_by_key().count().materialize("counts")
    events.group_by_key().windowed_by(
        tc.windows.tumbling("1 minute"), grace="1 hour"
    ).count().materialize("per_minute")
    events.repartition(partitions=2).transform_values(
        lambda k, v, s: v["n"], LONG
    ).to_table().materialize("through")


@pytest.fixture(scope="module")
def running(bootstrap: str, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:  # type: ignore[no-untyped-def]
    with running_app(bootstrap, spark, tmp_path_factory, "stamps", build) as r:
        yield r


def latest_stamps(bootstrap: str, topic: str) -> dict[bytes, tuple[Any, int]]:
    """Each key's last (value bytes, record timestamp) in a table topic."""
    out: dict[bytes, tuple[Any, int]] = {}
    for m in sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition(), m.offset())):
        out[m.key()] = (m.value(), m.timestamp()[1])
    return {k: v for k, v in out.items() if v[0] is not None}


def test_table_records_carry_their_inputs_timestamps(running: Running, bootstrap: str) -> None:
    rng = random.Random(3)
    history: list[tuple[str, dict[str, Any], int]] = []
    p = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
    for _micro_batch in range(2):
        for _ in range(40):
            k = f"r{rng.randrange(6)}"
            v = {"g": rng.choice("ab"), "n": rng.randrange(10)}
            ts = BASE + rng.randrange(10 * MIN)  # out of order
            p.produce(running.topic, key=k.encode(), value=orjson.dumps(v), timestamp=ts)
            history.append((k, v, ts))
        assert p.flush(30) == 0
        running.pipeline.process_all_available()
    app = running.app.id

    def table(name: str) -> dict[bytes, tuple[Any, int]]:
        return latest_stamps(bootstrap, f"{app}.table.{name}")

    last: dict[str, tuple[dict[str, Any], int]] = {}
    for k, v, ts in history:
        last[k] = (v, ts)
    even = {k.encode(): ts for k, (v, ts) in last.items() if v["n"] % 2 == 0}
    assert {k: ts for k, (_, ts) in table("even").items()} == even
    # a grouped stream's aggregate: the largest timestamp of the key's records
    counts: dict[bytes, int] = {}
    for k, _, ts in history:
        counts[k.encode()] = max(counts.get(k.encode(), 0), ts)
    assert {k: ts for k, (_, ts) in table("counts").items()} == counts
    # a table aggregate: the largest timestamp of every change it took, retractions too.
    # A row's records within one micro-batch make one change (stamped with the last of
    # them), so a group the row only passed through may not have taken its timestamp:
    # at most the largest of every group the rows passed through, at least the last
    # record of each row that ends in the group
    most: dict[bytes, int] = {}
    prev: dict[str, tuple[str, int]] = {}
    for k, v, ts in history:
        for g in {prev[k][0], v["g"]} if k in prev else {v["g"]}:
            most[g.encode()] = max(most.get(g.encode(), 0), ts)
        prev[k] = (v["g"], ts)
    least: dict[bytes, int] = {}
    for g, ts in prev.values():
        least[g.encode()] = max(least.get(g.encode(), 0), ts)
    stamps = {ts for _, _, ts in history}
    got_sums = table("sums")
    assert got_sums and all(
        least.get(g, 0) <= ts <= most[g] and ts in stamps for g, (_, ts) in got_sums.items()
    ), (got_sums, least, most)
    # a window: the largest timestamp of its records
    windows: dict[tuple[str, int], int] = {}
    for k, _, ts in history:
        w = (k, ts - ts % MIN)
        windows[w] = max(windows.get(w, 0), ts)
    got_windows = {}
    for key, (_, ts) in table("per_minute").items():
        inner, start = split_window_key(key)
        got_windows[(inner.decode(), start)] = ts
    assert got_windows == windows
    # through a repartition topic: still the input record's timestamp
    through = {k.encode(): ts for k, (_, ts) in last.items()}
    assert {k: ts for k, (_, ts) in table("through").items()} == through
    assert running.pipeline.dead_letters.total() == 0
