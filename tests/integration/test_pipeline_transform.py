"""transform_values (per-key state) and repartition (a stream through an internal topic)
on the real broker and Spark, against the reference model."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Iterator
from inspect import getsource
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tablecast as tc
from tablecast.contract.partitioner import partition_for
from tablecast.kafka.topics import dlq_topic, ensure_topic
from tests import reference_model as ref

from ..support.procs import eventually
from .kafka_io import produce
from .test_pipeline_restart import kill_group, start
from .test_pipeline_support import (
    CUMULATIVE,
    Running,
    end_offsets,
    read_table,
    read_topic,
    running_app,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3
THROUGH = 4  # the custom repartition's partition count, unlike the source's
STR, JSON = tc.serde.string(), tc.serde.json()
Rec = tuple[str, dict[str, int]]


def running_total(k: str, v: dict[str, int], state: Any) -> dict[str, Any] | None:
    """Order-dependent (the last three values travel in the state); 13 raises after
    changing the state, 7 emits a None value, 0 forgets the key's state."""
    s = state.get({"total": 0, "last": []})
    x = v["x"]
    if x == 13:
        s["total"] = -1
        state.set(s)
        raise ValueError("unlucky")
    s = {"total": s["total"] + x, "last": [*s["last"], x][-3:]}
    state.set(None if x == 0 else s)
    return None if x == 7 else s


def group_sum(k: str, v: dict[str, int], state: Any) -> int:
    total = state.get(0) + v["x"]
    state.set(total)
    return total


def by_digit(k: str, v: Any, n: int) -> int:
    """The custom partitioner: a key's trailing digit (keys k0..k9)."""
    return int(k[-1]) % n


def murmur2(k: str, v: Any, n: int) -> int:
    return partition_for(k.encode(), n)


def group_of(k: str, v: dict[str, int]) -> str:
    return f"g{v['g']}"


def build(app: tc.App, topic: str) -> None:
    ev = app.stream(topic, key=STR, value=JSON)
    totals = ev.transform_values(running_total)
    totals.to_table().materialize("totals")
    totals.to(f"{app.id}-totals")
    placed = ev.repartition(partitions=THROUGH, partitioner=by_digit)
    placed.transform_values(running_total).to_table().materialize("placed")
    ev.select_key(group_of).repartition().transform_values(
        group_sum, tc.serde.long()
    ).to_table().materialize("groups")


@pytest.fixture(scope="module")
def running(bootstrap: str, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:  # type: ignore[no-untyped-def]
    with running_app(bootstrap, spark, tmp_path_factory, "transform", build, PARTITIONS) as r:
        yield r


RECORDS = st.lists(
    st.tuples(
        st.sampled_from([f"k{i}" for i in range(10)]),
        st.fixed_dictionaries({"g": st.integers(0, 4), "x": st.integers(0, 15)}),
    ),
    min_size=1,
    max_size=40,
)


def per_key(records: list[tuple[Any, Any]]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for k, v in records:
        out.setdefault(k, []).append(v)
    return out


@CUMULATIVE
@given(records=RECORDS)
def test_transform_values_and_repartition_match_kafka_streams(
    running: Running, bootstrap: str, records: list[Rec]
) -> None:
    # every example has a record that raises, one that emits None and one that forgets
    edge = [("k1", {"g": 0, "x": 13}), ("k1", {"g": 1, "x": 7}), ("k2", {"g": 2, "x": 0})]
    running.feed(bootstrap, [*records, *edge])
    app, h = running.app.id, running.history
    out, failed = ref.transform_values(h, running_total)
    assert read_table(bootstrap, f"{app}.table.totals", STR, JSON) == ref.latest(out)
    # the stream itself: every record (None values too) in order per key
    stream = read_topic(bootstrap, f"{app}-totals")
    got = [
        (m.key().decode(), None if m.value() is None else JSON.deserialize(m.value()))
        for m in stream
    ]
    assert per_key(got) == per_key(out)
    for m in stream:
        assert m.partition() == partition_for(m.key(), PARTITIONS)

    # repartition(partitioner=...): each record in the partition the partitioner chose,
    # in order per key, and the state downstream as if the stream had not moved
    placed = ref.repartition(h, THROUGH, by_digit)
    through = read_topic(bootstrap, f"{app}.repartition.placed-0")
    got_placed: dict[int, list[Rec]] = {}
    for m in sorted(through, key=lambda m: (m.partition(), m.offset())):
        got_placed.setdefault(m.partition(), []).append(
            (m.key().decode(), JSON.deserialize(m.value()))
        )
    assert {p: per_key(rs) for p, rs in got_placed.items()} == {
        p: per_key(rs) for p, rs in placed.items()
    }
    moved = [r for p in sorted(placed) for r in placed[p]]
    assert read_table(bootstrap, f"{app}.table.placed", STR, JSON) == ref.latest(
        ref.transform_values(moved, running_total)[0]
    )

    # repartition() after a re-key: murmur2 over the source's partition count
    regrouped = ref.select_key(h, group_of)
    through = read_topic(bootstrap, f"{app}.repartition.groups-0")
    assert sorted((m.partition(), m.key().decode()) for m in through) == sorted(
        (p, k) for p, rs in ref.repartition(regrouped, PARTITIONS, murmur2).items() for k, _ in rs
    )
    sums = {g: sum(v["x"] for v in vs) for g, vs in per_key(regrouped).items()}
    assert read_table(bootstrap, f"{app}.table.groups", STR, tc.serde.long()) == sums

    # a raising f: its record in the DLQ (once per query that runs it), state untouched
    dead = [dict(m.headers()) for m in read_topic(bootstrap, dlq_topic(app))]
    reasons = [h["tablecast.error"].decode() for h in dead]
    assert all(r.startswith("transform_values: ValueError: unlucky") for r in reasons)
    from_source = [h for h in dead if h["tablecast.source.topic"].decode() == running.topic]
    assert len(from_source) == 2 * len(failed)  # the table's and the to()'s query
    assert len(dead) - len(from_source) == len(failed)  # the placed stream's, after the topic


RESTART_APP = """
from __future__ import annotations

import tablecast as tc

{running_total}

app = tc.App({app!r}, trigger="300 milliseconds")
ev = app.stream({topic!r}, key=tc.serde.string(), value=tc.serde.json())
ev.transform_values(running_total).to_table().materialize("totals")
(
    ev.repartition(partitions=2, partitioner=lambda k, v, n: int(k[1:]) % n)
    .transform_values(running_total)
    .to_table()
    .materialize("placed")
)
"""


@pytest.mark.long
def test_transform_values_state_survives_kill_9_of_the_driver(
    bootstrap: str, unique: str, tmp_path: Path
) -> None:
    topic = f"{unique}-ev"
    ensure_topic(bootstrap, topic, PARTITIONS)
    app_file = tmp_path / "app.py"
    app_file.write_text(
        RESTART_APP.format(app=unique, topic=topic, running_total=getsource(running_total))
    )
    state, log = tmp_path / "state", tmp_path / "pipeline.log"
    rng = random.Random(11)
    history: list[Rec] = []

    def send(n: int) -> None:
        records = [(f"k{rng.randrange(200)}", {"g": 0, "x": rng.randrange(16)}) for _ in range(n)]
        produce(bootstrap, topic, [(k.encode(), orjson.dumps(v)) for k, v in records])
        history.extend(records)

    table = f"{unique}.table.totals"
    proc = start(app_file, bootstrap, state, log)
    try:
        send(2000)
        eventually(lambda: sum(end_offsets(bootstrap, table).values()) > 0, 180)
        # kill while a batch is being written: to the repartition topic (its restart
        # writes copies there), then to the table topic; restart each time
        for topic_written in (f"{unique}.repartition.placed-0", table):
            written = sum(end_offsets(bootstrap, topic_written).values())
            send(20000)
            deadline = time.monotonic() + 120
            while sum(end_offsets(bootstrap, topic_written).values()) == written:
                assert time.monotonic() < deadline, f"the batch never reached {topic_written}"
                time.sleep(0.02)
            kill_group(proc, signal.SIGKILL)
            proc = start(app_file, bootstrap, state, log)
        send(2000)
        want = ref.latest(ref.transform_values(history, running_total)[0])
        eventually(lambda: read_table(bootstrap, table, STR, JSON) == want, 240, 2.0)
        # through the repartition topic too: the copies a restart wrote are applied once
        # (a key's records stay in one partition, so it sees them in the same order)
        placed = f"{unique}.table.placed"
        eventually(lambda: read_table(bootstrap, placed, STR, JSON) == want, 240, 2.0)
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        kill_group(proc, signal.SIGTERM)
    # informational: how many records the restarted queries wrote again
    outputs = len(ref.transform_values(history, running_total)[0])
    through = read_topic(bootstrap, f"{unique}.repartition.placed-0")
    print(
        f"table records: {len(read_topic(bootstrap, table))}, transform outputs: {outputs}; "
        f"repartition records: {len(through)}, input records: {len(history)}"
    )
