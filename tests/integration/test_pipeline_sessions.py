"""Session windows and emit="final" on the real pipeline (broker and Spark) against the
reference model of Kafka Streams: count, reduce and aggregate (with a merger) over
sessions that grow and merge, records out of order within grace, late records in the
DLQ, and emit="final" for session and tumbling windows; a node serves the sessions.

Hypothesis examples build on each other (one App per module): each example's records
land around a clock that moves on by a few gaps, some of them before stream time -
grace (late), some bridging sessions of earlier examples."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from hypothesis import given
from hypothesis import strategies as st

import tablecast as tc
from tablecast.contract.partitioner import partition_for
from tablecast.contract.window_keys import split_session_key, split_window_key
from tests import reference_model as ref
from tests.support.procs import start_node

from .test_pipeline_support import CUMULATIVE, Running, read_topic, running_app

pytestmark = pytest.mark.integration

PARTITIONS = 3
LONG, STR, JSON = tc.serde.long(), tc.serde.string(), tc.serde.json()
SEC = 1_000
GAP, GRACE = 60 * SEC, 20 * SEC
MINUTE = 60 * SEC
# whole minutes a day ago: the broker's 7-day retention keeps the records
BASE = (int(time.time() * 1000) // MINUTE - 24 * 60) * MINUTE
Value = dict[str, int]


def higher(a: Value, b: Value) -> Value:
    return b if b["x"] >= a["x"] else a


def collect(k: str, v: Value, agg: list[int]) -> list[int]:
    return [*agg, v["id"]]  # in arrival order: a merge in the wrong order shows


def concat(k: str, a: list[int], b: list[int]) -> list[int]:
    return a + b


def build(app: tc.App, topic: str) -> None:
    grouped = app.stream(topic, key=STR, value=JSON).group_by_key()
    sessions = grouped.windowed_by(tc.windows.session("1 minute"), grace="20 seconds")
    sessions.count().materialize("visits")
    sessions.count(emit="final").materialize("visits_final")
    sessions.reduce(higher).materialize("best", store="memory")
    sessions.aggregate(list, collect, merger=concat).materialize("ids")
    minute = grouped.windowed_by(tc.windows.tumbling("1 minute"), grace="20 seconds")
    minute.count(emit="final").materialize("per_minute_final")


@pytest.fixture(scope="module")
def running(bootstrap: str, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:  # type: ignore[no-untyped-def]
    with running_app(bootstrap, spark, tmp_path_factory, "sessions", build, PARTITIONS) as r:
        r.clock = BASE  # type: ignore[attr-defined]
        yield r


def task(k: str) -> int:
    return partition_for(k.encode(), PARTITIONS)


def feed(bootstrap: str, running: Running, records: list[tuple[str, Value, int]]) -> None:
    """Produce (key, value, timestamp) records, each key to its murmur2 partition, in order:
    a partition's order is its task's processing order, as the model takes it."""
    p = Producer({"bootstrap.servers": bootstrap})
    for k, v, ts in records:
        p.produce(
            running.topic,
            key=k.encode(),
            value=orjson.dumps(v),
            partition=task(k),
            timestamp=ts,
        )
        running.history.append((task(k), k, v, ts))
    assert p.flush(30) == 0
    running.pipeline.process_all_available()


def session_records(bootstrap: str, topic: str, value: tc.serde.Serde) -> list[Any]:
    """Every (session, value or None) the topic holds, in offset order per partition."""
    out = []
    for m in sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition(), m.offset())):
        inner, start, end = split_session_key(m.key())
        assert m.partition() == partition_for(inner, PARTITIONS), f"{topic}: misplaced session"
        assert m.timestamp()[1] == end, "a session's record time is its end"
        sk = (STR.deserialize(inner), start, end)
        out.append((sk, None if m.value() is None else value.deserialize(m.value())))
    return out


def latest(records: list[Any]) -> dict[Any, Any]:
    table: dict[Any, Any] = {}
    for sk, v in records:
        ref._put(table, sk, v)
    return table


def late_in_dlq(bootstrap: str, app_id: str) -> Counter[int]:
    out: Counter[int] = Counter()
    for m in read_topic(bootstrap, f"{app_id}.dlq"):
        why = dict(m.headers() or [])["tablecast.error"].decode()
        assert why.startswith("late record"), why
        out[orjson.loads(m.value())["id"]] += 1
    return out


def check(bootstrap: str, running: Running) -> dict[str, int]:
    h = running.history
    app_id = running.app.id

    def topic(name: str) -> str:
        return f"{app_id}.table.{name}"

    counts, late = ref.session_count(h, GAP, GRACE)
    assert latest(session_records(bootstrap, topic("visits"), LONG)) == ref.session_table(counts)
    best, late_r = ref.session_reduce(h, GAP, GRACE, higher)
    assert latest(session_records(bootstrap, topic("best"), JSON)) == ref.session_table(best)
    ids, late_a = ref.session_changelog(h, GAP, GRACE, list, collect, concat)
    assert latest(session_records(bootstrap, topic("ids"), JSON)) == ref.session_table(ids)
    assert late == late_r == late_a
    # emit="final": what suppress lets through, each record once (never a tombstone)
    final = session_records(bootstrap, topic("visits_final"), LONG)
    assert Counter(final) == Counter(ref.suppress_final(counts, GRACE))
    minute, late_t = ref.window_count(h, MINUTE, MINUTE, GRACE)
    want_min = ref.window_final(minute, h, MINUTE, GRACE, task)
    got_min = read_topic(bootstrap, topic("per_minute_final"))
    assert len(got_min) == len(want_min), "each closed window written once"
    table = {}
    for m in got_min:
        inner, start = split_window_key(m.key())
        table[(STR.deserialize(inner), start)] = LONG.deserialize(m.value())
    assert table == want_min
    # every session query dead-letters the late records, and the tumbling one its own
    want_dlq = Counter(v["id"] for _, _, v, _ in late * 4 + late_t)
    assert late_in_dlq(bootstrap, app_id) == want_dlq
    merged = sum(1 for _, _, agg, _ in counts if agg is None)
    return {"late": len(late), "merged": merged, "final": len(final), "records": len(h)}


#: per example: (key, ms from the clock) records; the clock then moves on by 2 gaps, so
#: offsets before -GRACE are late unless they bridge into a session still open
BATCHES = st.lists(
    st.tuples(st.sampled_from(["k0", "k1", "k2", "k3"]), st.integers(-150 * SEC, 150 * SEC)),
    min_size=1,
    max_size=20,
)


@CUMULATIVE
@given(batch=BATCHES)
def test_session_windows_match_kafka_streams(
    running: Running, bootstrap: str, batch: list[tuple[str, int]]
) -> None:
    clock: int = running.clock  # type: ignore[attr-defined]
    start = len(running.history)
    records = [
        (k, {"x": (start + i) * 7 % 11, "id": start + i}, clock + off)
        for i, (k, off) in enumerate(batch)
    ]
    feed(bootstrap, running, records)
    check(bootstrap, running)
    running.clock = clock + 2 * GAP  # type: ignore[attr-defined]


def test_merges_late_records_and_final_results_are_exercised(
    running: Running, bootstrap: str
) -> None:
    """Fixed records that show each behaviour (and that the checks above can fail):
    a bridging record merges two sessions, one in grace joins its session, one past grace
    is late, and emit="final" writes closed sessions only."""
    base = running.clock + 10 * GAP  # type: ignore[attr-defined]
    start = len(running.history)
    plan = [
        ("k1", 0),
        ("k1", 30 * SEC),  # same session: [0, 30 s]
        ("k1", 100 * SEC),  # more than a gap later: a second session
        # bridges both (within a gap of 30 s and of 100 s); [0, 30 s] is still in the
        # store, whose retention is gap + grace = 80 s past the largest time, 100 s
        ("k1", 65 * SEC),
        ("k1", 400 * SEC),  # stream time 400 s: [0, 100 s] closed at 120 s
        ("k1", 385 * SEC),  # out of order, within grace: joins [400 s]
        ("k1", 150 * SEC),  # late: within the gap of [0, 100 s], which is closed
    ]
    records = [(k, {"x": i, "id": start + i}, base + off) for i, (k, off) in enumerate(plan)]
    feed(bootstrap, running, records)
    stats = check(bootstrap, running)
    assert stats["late"] >= 1 and stats["merged"] >= 2 and stats["final"] >= 1
    got = latest(session_records(bootstrap, f"{running.app.id}.table.visits", LONG))
    assert got[("k1", base, base + 100 * SEC)] == 4
    assert got[("k1", base + 385 * SEC, base + 400 * SEC)] == 2
    running.clock = base + 10 * GAP  # type: ignore[attr-defined]


def test_node_serves_sessions_with_start_and_end(
    running: Running, bootstrap: str, logs: Path
) -> None:
    if not any(k == "k1" for _, k, _, _ in running.history):
        test_merges_late_records_and_final_results_are_exercised(running, bootstrap)
    counts, _ = ref.session_count(running.history, GAP, GRACE)
    want = sorted((s, e, c) for (k, s, e), c in ref.session_table(counts).items() if k == "k1")
    assert len(want) >= 2, "the test data has k1 sessions"
    lo, hi = want[0][0], want[-1][0]
    node = start_node(running.app.id, bootstrap, logs)
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "visits", f"{running.app.id}.table.visits")
        r = node.get("/v1/tables/visits/keys/k1/windows", params={"from": lo, "to": hi})
        assert r.status_code == 200, r.text
        assert r.json()["items"] == [{"start": s, "end": e, "value": c} for s, e, c in want]
        # from/to select by start: the first session alone
        r = node.get("/v1/tables/visits/keys/k1/windows", params={"from": lo, "to": lo})
        assert r.json()["items"] == [{"start": lo, "end": want[0][1], "value": want[0][2]}]
    finally:
        node.stop()
