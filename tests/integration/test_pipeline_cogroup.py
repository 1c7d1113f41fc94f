"""Cogrouped aggregations against the reference model, on the real broker and Spark.

Three inputs share one aggregate per key: `a` (JSON, grouped by key), `b` (JSON,
filtered and re-keyed by group_by: computed by a query of its own into a changelog
topic with record ids) and `c` (longs: each input decodes its own values). Each step
writes to one input and waits for the pipeline, so the order in which the cogroup
takes records is the steps' order; every `b` record goes to partition 0, so its
re-keyed records reach the changelog in the order they were fed. The table (values
and each key's record timestamp) is compared with Kafka Streams' answer, and so is a
window table of `a` and `c` cogrouped in tumbling windows, and a session table of `a`
and `b` (one session store for both inputs, sessions merged by a merger), whose late
records are dead-lettered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from hypothesis import given
from hypothesis import strategies as st

import tablecast as tc
from tablecast.contract.partitioner import partition_for
from tablecast.contract.window_keys import split_session_key, split_window_key
from tablecast.kafka.topics import ensure_topic
from tests import reference_model as ref

from .test_pipeline_support import CUMULATIVE, Running, read_table, read_topic, running_app

pytestmark = pytest.mark.integration

PARTITIONS = 3
STR, JSON, LONG = tc.serde.string(), tc.serde.json(), tc.serde.long()
SEC = 1000
BASE = (int(time.time() * 1000) // SEC - 24 * 3600) * SEC  # within the broker's retention
KEYS = [f"k{i}" for i in range(4)]
INPUTS = ("a", "b", "c")
WINDOW = tc.windows.tumbling("10 seconds")
SESSION, SESSION_GRACE = tc.windows.session("3 seconds"), 4 * SEC


def add_a(k: str, v: dict[str, Any], agg: list[Any]) -> list[Any]:
    return [*agg[-3:], ["a", v["n"]]]


def add_b(k: str, v: dict[str, Any], agg: list[Any]) -> list[Any] | None:
    return None if v["n"] % 5 == 0 else [*agg[-3:], ["b", v["n"]]]  # None: deletes the key


def add_c(k: str, v: int, agg: list[Any]) -> list[Any]:
    return [*agg[-3:], ["c", v]]


def merge(k: str, one: list[Any], two: list[Any]) -> list[Any]:
    return [*one[-2:], "|", *two[-2:]]  # not commutative: a merge in the wrong order shows


def kept(k: str, v: dict[str, Any]) -> bool:
    return v["n"] % 3 != 0


def to(k: str, v: dict[str, Any]) -> str:
    return v["to"]


class Cogrouped(Running):
    topics: dict[str, str]
    #: (input, partition, key, value, timestamp) as the cogroup sees them, in order
    fed: list[ref.CogroupEvent]

    def send(self, bootstrap: str, side: str, records: list[tuple[str | None, Any, int]]) -> None:
        p = Producer({"bootstrap.servers": bootstrap})
        for k, v, at in records:
            kb = None if k is None else k.encode()
            part = 0 if kb is None or side == "b" else partition_for(kb, PARTITIONS)
            vb = None if v is None else (LONG.serialize(v) if side == "c" else orjson.dumps(v))
            ts = BASE + at
            p.produce(self.topics[side], vb, kb, partition=part, timestamp=ts)
            if side == "b":  # what the cogroup sees of b: filtered and re-keyed
                if kept(k, v):  # type: ignore[arg-type]
                    self.fed.append((1, 0, to(k, v), v, ts))  # type: ignore[arg-type]
            else:
                self.fed.append((INPUTS.index(side), part, k, v, ts))
        assert p.flush(30) == 0
        self.pipeline.process_all_available()


@pytest.fixture(scope="module")
def cogrouped(
    bootstrap: str,
    spark,  # type: ignore[no-untyped-def]
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cogrouped]:
    topics: dict[str, str] = {}

    def build(app: tc.App, topic: str) -> None:
        topics.update({"a": topic, "b": f"{app.id}-b", "c": f"{app.id}-c"})
        for side in ("b", "c"):
            ensure_topic(bootstrap, topics[side], PARTITIONS)
        a = app.stream(topics["a"], key=STR, value=JSON).group_by_key()
        b = app.stream(topics["b"], key=STR, value=JSON).filter(kept).group_by(to)
        c = app.stream(topics["c"], key=STR, value=LONG).group_by_key()
        app.cogroup((a, add_a), (b, add_b), (c, add_c)).aggregate(list).materialize("all")
        # a and c in tumbling windows (the task: the key's partition, one stream time)
        windows = app.cogroup((a, add_a), (c, add_c)).windowed_by(WINDOW, grace="5 seconds")
        windows.aggregate(list).materialize("win")
        # a and the derived b in session windows: one session store, b's copies dropped
        sessions = app.cogroup((a, add_a), (b, add_b)).windowed_by(SESSION, "4 seconds")
        sessions.aggregate(list, merger=merge).materialize("sessions")

    with running_app(bootstrap, spark, tmp_path_factory, "cogroup", build, PARTITIONS) as r:
        s = Cogrouped(r.app, r.topic, r.pipeline)
        s.topics, s.fed = topics, []
        yield s


def check(cg: Cogrouped, bootstrap: str) -> None:
    want = ref.cogroup_aggregate(cg.fed, list, [add_a, add_b, add_c])
    topic = f"{cg.app.id}.table.all"
    assert read_table(bootstrap, topic, STR, JSON) == {k: v for k, (v, _) in want.items()}
    last: dict[str, int] = {}
    for m in sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition(), m.offset())):
        last[m.key().decode()] = m.timestamp()[1]
    assert {k: last[k] for k in want} == {k: ts for k, (_, ts) in want.items()}
    # the windows: a and c only, each task's records in the order fed (one input and one
    # partition per step and task)
    fed = [(p, 0 if i == 0 else 1, k, v, ts) for i, p, k, v, ts in cg.fed if i != 1]
    windows, late = ref.cogroup_window_aggregate(
        fed, WINDOW.size_ms, WINDOW.advance_ms, 5 * SEC, list, [add_a, add_c]
    )
    table: dict[tuple[str, int], tuple[Any, int]] = {}
    records = read_topic(bootstrap, f"{cg.app.id}.table.win")
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        inner, start = split_window_key(m.key())
        assert m.partition() == partition_for(inner, PARTITIONS), "misplaced window"
        table[(inner.decode(), start)] = (JSON.deserialize(m.value()), m.timestamp()[1])
    assert table == windows

    # the sessions: a and b, the task the key's partition (b's records were re-keyed)
    def task(k: str | None) -> int:
        return 0 if k is None else partition_for(k.encode(), PARTITIONS)

    fed = [(task(k), i, k, v, ts) for i, _, k, v, ts in cg.fed if i != 2]
    changelog, late_sessions = ref.cogroup_session_changelog(
        fed, SESSION.gap_ms, SESSION_GRACE, list, [add_a, add_b], merge
    )
    sessions: dict[tuple[str, int, int], Any] = {}
    records = read_topic(bootstrap, f"{cg.app.id}.table.sessions")
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        inner, start, end = split_session_key(m.key())
        assert m.partition() == partition_for(inner, PARTITIONS), "misplaced session"
        assert m.timestamp()[1] == end  # a session's record time is its end
        value = None if m.value() is None else JSON.deserialize(m.value())
        ref._put(sessions, (inner.decode(), start, end), value)
    assert sessions == ref.session_table(changelog)
    dead = read_topic(bootstrap, f"{cg.app.id}.dlq")
    whys = [dict(m.headers() or [])["tablecast.error"].decode() for m in dead]
    assert all(w.startswith("late record") for w in whys)
    assert len(whys) == len(late) + len(late_sessions)


def test_cogroup_matches_kafka_streams(cogrouped: Cogrouped, bootstrap: str) -> None:
    cg = cogrouped
    cg.send(bootstrap, "a", [("k0", {"n": 1}, 0), ("k1", {"n": 2}, SEC), (None, {"n": 9}, 0)])
    # 3 is filtered out; 4 goes to k0 through the changelog; 10 deletes k1
    cg.send(bootstrap, "b", [("x", {"n": 3, "to": "k0"}, 0), ("y", {"n": 4, "to": "k0"}, 500)])
    cg.send(bootstrap, "b", [("z", {"n": 10, "to": "k1"}, 2 * SEC)])
    cg.send(bootstrap, "c", [("k1", 7, 3 * SEC), ("k0", 8, 100), ("k2", None, 0)])
    check(cg, bootstrap)
    want = ref.cogroup_aggregate(cg.fed, list, [add_a, add_b, add_c])
    assert want == {
        "k0": ([["a", 1], ["b", 4], ["c", 8]], BASE + 500),
        "k1": ([["c", 7]], BASE + 3 * SEC),  # started over after the delete, at its own time
    }


STEP = st.tuples(
    st.sampled_from(INPUTS),
    st.lists(
        st.tuples(st.sampled_from([*KEYS, None]), st.integers(0, 30), st.integers(-10, 20)),
        min_size=1,
        max_size=8,
    ),
)


@pytest.mark.long
@CUMULATIVE
@given(steps=st.lists(STEP, min_size=1, max_size=4))
def test_cogroup_matches_kafka_streams_on_generated_records(
    cogrouped: Cogrouped, bootstrap: str, steps: list[tuple[str, list[tuple[str | None, int, int]]]]
) -> None:
    cg = cogrouped
    clock = max((e[4] - BASE for e in cg.fed), default=0)
    for side, records in steps:
        batch: list[tuple[str | None, Any, int]] = []
        for k, n, step in records:
            clock = max(0, clock + step * SEC // 4)
            if side == "b":  # b's records are re-keyed by "to": its own key may be anything
                batch.append((k or "none", {"n": n, "to": KEYS[n % len(KEYS)]}, clock))
            elif side == "a":
                batch.append((k, {"n": n}, clock))
            else:
                batch.append((k, n, clock))
        cg.send(bootstrap, side, batch)
    check(cg, bootstrap)
