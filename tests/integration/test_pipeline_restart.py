"""kill -9 of the Spark driver mid-stream, restart from the checkpoint: every table exact.

The pipeline runs as `python -m tablecast.cli.main run app.py` in its own
process group (the Python driver and its JVM); the test kills the group with
SIGKILL while a large batch is in flight, restarts it, and compares the
tables with the reference model. Spark's Kafka sink is at-least-once, so the
restarted queries write some records again: table topics absorb that
(upserts), and the group-by aggregation drops repartition records it has
already applied.

The large batches (6,000 to 16,000 records) are sized so that each takes the
restarted driver seconds to work through on two cores, enough for a kill to
land while a query writes it, and no more: this module was a quarter of CI's time with
batches two to three times larger. The tests marked `long` (joins, sessions, cogroup,
Real-time Mode: one to two minutes each) run in `python -m bench long`, not in `./run tests`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

import tablecast as tc
from tablecast.contract.window_keys import split_session_key, split_window_key
from tablecast.kafka.topics import ensure_topic
from tests import reference_model as ref

from ..support.procs import eventually
from .kafka_io import produce
from .test_pipeline_support import TRIGGER, end_offsets, read_table, read_topic

pytestmark = pytest.mark.integration

APP = """
from pyspark.sql import functions as F

import tablecast as tc

app = tc.App({app!r}, trigger="300 milliseconds")
rows = app.table({topic!r}, key=tc.serde.string(), value=tc.serde.json())
by_group = rows.group_by(lambda k, v: (v["g"], v["n"]), value=tc.serde.long())
by_group.reduce(lambda a, b: a + b, lambda a, b: a - b).materialize("sums")
by_group.count().materialize("counts")
rows.filter(lambda k, v: v["n"] % 2 == 0).materialize("even")
rows.to_stream().group_by_key().count().materialize("changes")
# a Spark aggregate function: Spark's state, as the count's
n = F.variant_get("value", "$.n", "long")
rows.to_stream().group_by_key().aggregate(F.sum(n), value=tc.serde.long()).materialize("n_sums")
# the sums again with Columns: folded in the JVM, copies told apart by record numbers
g, total, x = F.variant_get("value", "$.g", "string"), F.col("aggregate"), F.col("value")
rows.group_by((g, n), value=tc.serde.long()).reduce(total + x, total - x).materialize("sums_col")
"""
STR, LONG, JSON = tc.serde.string(), tc.serde.long(), tc.serde.json()


def sel(k: str, v: dict[str, Any]) -> tuple[str, int]:
    return v["g"], v["n"]


def start(
    app_file: Path, bootstrap: str, state: Path, log: Path, *extra: str
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "tablecast.cli.main", "run", str(app_file)),
                *("--bootstrap-servers", bootstrap, "--state-dir", str(state), *extra),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own group: the driver and the JVM it starts
        )


def kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        # a clean stop of Spark can outlast a minute on a loaded machine: the
        # test's checks are done by then, so end the group rather than fail
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


#: the moments the driver is killed at, each after sending a batch: while a query writes
#: it to the watched topic (its restart writes those records again), then at another moment
BOTH = ("mid-write", "later")


def kill_twice(
    proc: subprocess.Popen[bytes],
    bootstrap: str,
    topic: str,
    send_batch: Callable[[], None],
    restart: Callable[[], subprocess.Popen[bytes]],
    moments: tuple[str, ...] = BOTH,
) -> subprocess.Popen[bytes]:
    """SIGKILL the driver at each of `moments` (twice by default), each time after sending
    a batch, and start it again. Returns the driver started after the last kill."""
    try:
        for moment in moments:
            written = sum(end_offsets(bootstrap, topic).values())
            send_batch()
            if moment == "mid-write":
                deadline = time.monotonic() + 120
                while sum(end_offsets(bootstrap, topic).values()) == written:
                    assert time.monotonic() < deadline, f"the batch never reached {topic}"
                    time.sleep(0.02)
            else:
                time.sleep(4.0)
            kill_group(proc, signal.SIGKILL)
            proc = restart()
    except BaseException:
        kill_group(proc, signal.SIGTERM)  # the caller's cleanup holds only the first driver
        raise
    return proc


def batch(rng: random.Random, n: int) -> list[tuple[str, dict[str, Any] | None]]:
    return [
        (
            f"r{rng.randrange(300)}",
            None if rng.random() < 0.1 else {"g": rng.choice("abcde"), "n": rng.randrange(50)},
        )
        for _ in range(n)
    ]


Row = tuple[str, dict[str, Any] | None]


def json_sender(bootstrap: str, topic: str, history: list[Row]) -> Callable[[list[Row]], None]:
    """send(records): produce JSON rows (None: a delete) to `topic`, noting them in `history`."""

    def send(records: list[Row]) -> None:
        encoded = [(k.encode(), None if v is None else orjson.dumps(v)) for k, v in records]
        produce(bootstrap, topic, encoded)
        history.extend(records)

    return send


@pytest.mark.parametrize(
    "moments",
    [
        # CI's time: the kill that makes a query write records again
        pytest.param(("mid-write",), id="once"),
        pytest.param(BOTH, id="twice", marks=pytest.mark.long),
    ],
)
def test_kill_9_of_the_driver_leaves_every_table_exact(
    bootstrap: str, unique: str, tmp_path: Path, moments: tuple[str, ...]
) -> None:
    topic = f"{unique}-rows"
    ensure_topic(bootstrap, topic, 3)
    app_file = tmp_path / "app.py"
    app_file.write_text(APP.format(app=unique, topic=topic))
    state, log = tmp_path / "state", tmp_path / "pipeline.log"
    rng = random.Random(5)
    history: list[Row] = []
    send = json_sender(bootstrap, topic, history)

    proc = start(app_file, bootstrap, state, log)
    try:
        send(batch(rng, 2000))
        sums = f"{unique}.table.sums"
        # nine queries start one after another before the first batch: minutes on a busy
        # machine (a suite's other workers starting their own brokers and Spark)
        eventually(lambda: sum(end_offsets(bootstrap, sums).values()) > 0, 300)
        # large batches, and kills at different moments while the queries work on them
        repartition = f"{unique}.repartition.sums-0"
        # the group-by's first query writes the batch to the repartition topic
        proc = kill_twice(
            proc,
            bootstrap,
            repartition,
            lambda: send(batch(rng, 16000)),
            lambda: start(app_file, bootstrap, state, log),
            moments,
        )
        send(batch(rng, 3000))
        want = {
            "sums": (
                ref.table_group_reduce(history, sel, lambda a, b: a + b, lambda a, b: a - b),
                LONG,
            ),
            "counts": (ref.table_group_count(history, sel), LONG),
            "even": (ref.latest(ref.table_filter(history, lambda k, v: v["n"] % 2 == 0)), JSON),
            "changes": (ref.stream_count(history), LONG),
            "n_sums": (ref.stream_aggregate(history, lambda: 0, lambda k, v, a: a + v["n"]), LONG),
        }
        want["sums_col"] = want["sums"]
        for name, (table, value) in want.items():

            def exact(t: str = f"{unique}.table.{name}", v: Any = value, w: Any = table) -> bool:
                return read_table(bootstrap, t, STR, v) == w

            eventually(exact, 240, 2.0)
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        kill_group(proc, signal.SIGTERM)
    # informational: how many changes the restarted upstream query wrote twice
    rids = [
        dict(m.headers())["tablecast.rid"]
        for m in read_topic(bootstrap, f"{unique}.repartition.sums-0")
    ]
    again = len(rids) - len(set(rids))
    print(f"repartition records: {len(rids)}, written again after a kill: {again}")


APP_REALTIME = """
from pyspark.sql import functions as F

import tablecast as tc

app = tc.App({app!r}, trigger="realtime 5 seconds")
rows = app.table({topic!r}, key=tc.serde.string(), value=tc.serde.json())
g, n = F.variant_get("value", "$.g", "string"), F.variant_get("value", "$.n", "long")
total, x = F.col("aggregate"), F.col("value")
rows.group_by((g, n), value=tc.serde.long()).reduce(total + x, total - x).materialize("sums")
"""


def test_kill_9_of_a_real_time_group_by_leaves_its_table_exact(
    bootstrap: str, unique: str, tmp_path: Path
) -> None:
    """A table group_by folded in Columns is one query of two transformWithState operators
    in Real-time Mode; a kill while it writes its table makes it run again from its last
    checkpoint (5 s apart), both operators' state from that same point, and the table ends
    exact."""
    topic = f"{unique}-rows"
    ensure_topic(bootstrap, topic, 1)
    app_file = tmp_path / "app.py"
    app_file.write_text(APP_REALTIME.format(app=unique, topic=topic))
    state, log = tmp_path / "state", tmp_path / "pipeline.log"
    rng = random.Random(11)
    history: list[Row] = []
    send = json_sender(bootstrap, topic, history)
    # a task for the partition and one for each operator's shuffle partition
    restart = lambda: start(app_file, bootstrap, state, log, "--master", "local[4]")  # noqa: E731
    proc = restart()
    try:
        send(batch(rng, 2000))
        sums = f"{unique}.table.sums"
        eventually(lambda: sum(end_offsets(bootstrap, sums).values()) > 0, 300)
        started = [line for line in log.read_text().splitlines() if " started, trigger: " in line]
        assert len(started) == 1 and "trigger: realtime" in started[0], started
        proc = kill_twice(
            proc, bootstrap, sums, lambda: send(batch(rng, 16000)), restart, ("mid-write",)
        )
        send(batch(rng, 3000))
        want = ref.table_group_reduce(history, sel, lambda a, b: a + b, lambda a, b: a - b)
        eventually(lambda: read_table(bootstrap, sums, STR, LONG) == want, 240, 2.0)
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        kill_group(proc, signal.SIGTERM)


def test_repartition_records_written_twice_are_applied_once(
    bootstrap: str,
    spark,  # type: ignore[no-untyped-def]
    unique: str,
    tmp_path: Path,
) -> None:
    """What a restarted upstream query does, done on purpose: copy every record of
    the repartition topic (same batch id and record id) back into it."""
    topic = f"{unique}-rows"
    ensure_topic(bootstrap, topic, 3)
    app = tc.App(unique, state_dir=tmp_path / "state", trigger=TRIGGER)
    rows = app.table(topic, key=STR, value=JSON)
    rows.group_by(sel, value=LONG).reduce(lambda a, b: a + b, lambda a, b: a - b).materialize(
        "sums"
    )
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    try:
        rng = random.Random(9)
        history = batch(rng, 300)
        wire = [(k.encode(), None if v is None else orjson.dumps(v)) for k, v in history]
        produce(bootstrap, topic, wire[:150])
        pipeline.process_all_available()
        produce(bootstrap, topic, wire[150:])
        pipeline.process_all_available()
        want = ref.table_group_reduce(history, sel, lambda a, b: a + b, lambda a, b: a - b)
        assert read_table(bootstrap, f"{unique}.table.sums", STR, LONG) == want

        repartition = f"{unique}.repartition.sums-0"
        copies = read_topic(bootstrap, repartition)
        assert len({dict(m.headers())["tablecast.batch"] for m in copies}) >= 2
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": bootstrap})
        for m in copies:
            p.produce(repartition, m.value(), m.key(), partition=m.partition(), headers=m.headers())
        assert p.flush(30) == 0
        pipeline.process_all_available()
        assert read_table(bootstrap, f"{unique}.table.sums", STR, LONG) == want
    finally:
        pipeline.stop()


JOIN_APP = """
import tablecast as tc

app = tc.App({app!r}, trigger="300 milliseconds")
key, value = tc.serde.string(), tc.serde.json()
left = app.stream({left!r}, key=key, value=value)
right = app.stream({right!r}, key=key, value=value)
window = tc.windows.join("1 second", grace="1 hour")
joined = left.join(right, lambda l, r: l["n"] * 100003 + (0 if r is None else r["n"]),
                   how="left", window=window, value=tc.serde.long())
joined.group_by_key().count().materialize("results")
joined.group_by_key().reduce(lambda a, b: a + b).materialize("checksums")
"""


@pytest.mark.long
def test_kill_9_of_the_driver_leaves_stream_join_results_exact(
    bootstrap: str, unique: str, tmp_path: Path
) -> None:
    """A left stream-stream join, counted and summed per key: a result lost or written
    twice (the join's state or its changelog's copies after a kill) changes a count or a
    checksum. The grace (an hour) is far wider than any reordering of the two topics'
    records across micro-batches, so the answer does not depend on where batches are cut;
    records an hour later close every window, writing the left records that met nothing."""
    from confluent_kafka import Producer

    from tablecast.contract.partitioner import PRODUCER_CONFIG, partition_for

    topics = {side: f"{unique}-{side}" for side in ("left", "right")}
    for topic in topics.values():
        ensure_topic(bootstrap, topic, 3)
    app_file = tmp_path / "app.py"
    app_file.write_text(JOIN_APP.format(app=unique, **topics))
    state, log = tmp_path / "state", tmp_path / "pipeline.log"
    rng = random.Random(7)
    base = (int(time.time() * 1000) // 1000 - 24 * 3600) * 1000  # within retention
    events: list[ref.StreamEvent] = []
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})

    def send(records: list[tuple[str, str]], later: int = 0) -> None:
        for side, k in records:
            n, ts = len(events), base + 2 * len(events) + later
            producer.produce(topics[side], orjson.dumps({"n": n}), k.encode(), timestamp=ts)
            producer.poll(0)
            events.append((partition_for(k.encode(), 3), side, k, {"n": n}, ts))
        assert producer.flush(30) == 0

    def batch(n: int) -> list[tuple[str, str]]:
        return [(rng.choice(["left", "right"]), f"j{rng.randrange(200)}") for _ in range(n)]

    proc = start(app_file, bootstrap, state, log)
    try:
        send(batch(2000))
        results = f"{unique}.table.results"
        eventually(lambda: sum(end_offsets(bootstrap, results).values()) > 0, 180)
        changelog = f"{unique}.changelog.results-0"
        # the join query writes the batch's results (again after a restart, which the
        # count must drop)
        proc = kill_twice(
            proc,
            bootstrap,
            changelog,
            lambda: send(batch(6000)),
            lambda: start(app_file, bootstrap, state, log),
        )
        send(batch(2000))
        # a left record in every task, 3 hours on: every window closes
        closers = {partition_for(f"close{i}".encode(), 3): f"close{i}" for i in range(20)}
        assert len(closers) == 3
        send([("left", k) for k in closers.values()], later=3 * 3600 * 1000)
        joined, late = ref.stream_stream_join(
            sorted(events, key=lambda e: e[4]),
            1000,
            1000,
            3600 * 1000,
            lambda left, right: left["n"] * 100003 + (0 if right is None else right["n"]),
            "left",
        )
        assert not late
        counts = ref.stream_count((k, v) for k, v, _ in joined)
        sums = ref.stream_reduce(((k, v) for k, v, _ in joined), lambda a, b: a + b)
        alone = sum(1 for _, v, _ in joined if v % 100003 == 0)
        assert alone > 0 and len(joined) > alone  # both kinds of result are in the answer
        for name, want in (("results", counts), ("checksums", sums)):

            def exact(t: str = f"{unique}.table.{name}", w: Any = want) -> bool:
                return read_table(bootstrap, t, STR, LONG) == w

            eventually(exact, 240, 2.0)
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        kill_group(proc, signal.SIGTERM)


# -- session windows: kill -9 mid-stream, the session tables exact ---------------
SESSION_APP = """
import tablecast as tc

app = tc.App({app!r}, trigger="300 milliseconds")
grouped = app.stream({topic!r}, key=tc.serde.string(), value=tc.serde.json()).group_by_key()
sessions = grouped.windowed_by(tc.windows.session("2 seconds"), grace="3 seconds")
sessions.count().materialize("visits")
sessions.count(emit="final").materialize("visits_final")
sessions.aggregate(list, lambda k, v, a: [*a, v["n"]], merger=lambda k, a, b: a + b).materialize(
    "ns"
)
"""


@pytest.mark.long
def test_kill_9_mid_stream_leaves_session_tables_exact(
    bootstrap: str, unique: str, tmp_path: Path
) -> None:
    """Sessions merge across micro-batches and some records are late: after SIGKILL the
    restarted queries replay from their checkpoints, and every session table (the final
    results' too) equals the reference model's; late records are dead-lettered."""
    from confluent_kafka import Producer

    from tablecast.contract.partitioner import partition_for
    from tablecast.contract.window_keys import split_session_key

    topic = f"{unique}-clicks"
    ensure_topic(bootstrap, topic, 3)
    app_file = tmp_path / "app.py"
    app_file.write_text(SESSION_APP.format(app=unique, topic=topic))
    state, log = tmp_path / "state", tmp_path / "pipeline.log"
    rng = random.Random(11)
    base = (int(time.time()) - 86_400) * 1000  # a day ago: within the broker's retention
    history: list[tuple[int, str, dict[str, int], int]] = []

    def send(n: int) -> None:
        p = Producer({"bootstrap.servers": bootstrap})
        for _ in range(n):
            # time moves 20 ms a record; some records arrive up to 6 s late (grace: 3 s)
            at = base + len(history) * 20 - (rng.randrange(6000) if rng.random() < 0.1 else 0)
            k = f"u{rng.randrange(200)}"
            v = {"n": len(history)}
            part = partition_for(k.encode(), 3)
            p.produce(topic, key=k.encode(), value=orjson.dumps(v), partition=part, timestamp=at)
            history.append((part, k, v, at))
            p.poll(0)
        assert p.flush(30) == 0

    def sessions(name: str, value: tc.serde.Serde) -> dict[tuple[str, int, int], Any]:
        table: dict[tuple[str, int, int], Any] = {}
        for m in sorted(
            read_topic(bootstrap, f"{unique}.table.{name}"),
            key=lambda m: (m.partition(), m.offset()),
        ):
            inner, s, e = split_session_key(m.key())
            table.pop((inner.decode(), s, e), None)
            if m.value() is not None:
                table[(inner.decode(), s, e)] = value.deserialize(m.value())
        return table

    proc = start(app_file, bootstrap, state, log)
    try:
        send(2000)
        eventually(lambda: sum(end_offsets(bootstrap, f"{unique}.table.visits").values()) > 0, 180)
        for pause in (1.5, 4.0):  # kills at different moments of a large batch
            written = sum(end_offsets(bootstrap, f"{unique}.table.ns").values())
            send(8000)
            # a restarted driver's first batch replays the last one too: slow on 2 cores
            deadline = time.monotonic() + 240
            while sum(end_offsets(bootstrap, f"{unique}.table.ns").values()) == written:
                assert time.monotonic() < deadline, "the batch never reached the table"
                time.sleep(0.05)
            time.sleep(pause)
            kill_group(proc, signal.SIGKILL)
            proc = start(app_file, bootstrap, state, log)
        send(2000)
        counts, late = ref.session_count(history, 2000, 3000)
        ns, _ = ref.session_changelog(
            history, 2000, 3000, list, lambda k, v, a: [*a, v["n"]], lambda k, a, b: a + b
        )
        final: dict[Any, Any] = {}
        for sk, c in ref.suppress_final(counts, 3000):
            final[sk] = c
        assert late and any(c is None for _, _, c, _ in counts), "late records and merges"
        want = {
            "visits": (ref.session_table(counts), LONG),
            "ns": (ref.session_table(ns), JSON),
            "visits_final": (final, LONG),
        }
        for name, (table, value) in want.items():

            def exact(n: str = name, w: Any = table, v: Any = value) -> bool:
                return sessions(n, v) == w

            eventually(exact, 240, 2.0)
        # each of the three queries dead-letters every late record (a replay may repeat one)
        dlq = {orjson.loads(m.value())["n"] for m in read_topic(bootstrap, f"{unique}.dlq")}
        assert dlq == {v["n"] for _, _, v, _ in late}
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        kill_group(proc, signal.SIGTERM)


# -- cogroup: kill -9 while a derived input's changelog is written ---------------
COGROUP_APP = """
import tablecast as tc

app = tc.App({app!r}, trigger="300 milliseconds")
key, value = tc.serde.string(), tc.serde.json()
a = app.stream({a!r}, key=key, value=value).group_by_key()
b = app.stream({b!r}, key=key, value=value).filter(lambda k, v: v["n"] % 3 != 0)
b = b.group_by(lambda k, v: v["to"])
add_a = lambda k, v, agg: [agg[0] + 1, agg[1] + v["n"], agg[2], agg[3]]
add_b = lambda k, v, agg: [agg[0], agg[1], agg[2] + 1, agg[3] + v["n"]]
app.cogroup((a, add_a), (b, add_b)).aggregate(lambda: [0, 0, 0, 0]).materialize("sums")
# the same in tumbling windows (grace long enough that no record of the test is late)
hourly = app.cogroup((a, add_a), (b, add_b)).windowed_by(tc.windows.tumbling("1 hour"), "1 hour")
hourly.aggregate(lambda: [0, 0, 0, 0]).materialize("hourly")
# and in sessions (a gap of an hour: each key's records make one session, merged as they come)
merge = lambda k, x, y: [i + j for i, j in zip(x, y)]
visits = app.cogroup((a, add_a), (b, add_b)).windowed_by(tc.windows.session("1 hour"), "1 hour")
visits.aggregate(lambda: [0, 0, 0, 0], merger=merge).materialize("visits")
"""
HOUR_MS = 3_600_000


def window_totals(bootstrap: str, topic: str, sessions: bool = False) -> dict[str, list[int]]:
    """A windowed (or session) table of [count, sum, count, sum] added up over each key's
    windows (sessions)."""
    table: dict[tuple[bytes, int, int], list[int] | None] = {}
    for m in sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition(), m.offset())):
        if sessions:
            inner, start, end = split_session_key(m.key())
        else:
            (inner, start), end = split_window_key(m.key()), 0
            assert start % HOUR_MS == 0, f"window start {start} is not on the hour"
        table[(inner, start, end)] = None if m.value() is None else orjson.loads(m.value())
    totals: dict[str, list[int]] = {}
    for (inner, _, _), agg in table.items():
        if agg is not None:
            t = totals.setdefault(inner.decode(), [0, 0, 0, 0])
            totals[inner.decode()] = [x + y for x, y in zip(t, agg, strict=True)]
    return totals


@pytest.mark.long
def test_kill_9_of_the_driver_leaves_cogroup_tables_exact(
    bootstrap: str, unique: str, tmp_path: Path
) -> None:
    """Two inputs cogrouped, one derived (filtered and re-keyed: written by a query of its
    own to a changelog with record ids): per key, each input's count and sum, and the same
    in tumbling windows and in sessions. A record applied twice (a copy the restarted side
    query wrote again, or a replayed batch) or lost changes a count or a sum (of a window:
    their sum over the key's windows). The aggregators commute, so the answer does not depend
    on where micro-batches are cut."""
    topics = {side: f"{unique}-{side}" for side in ("a", "b")}
    for topic in topics.values():
        ensure_topic(bootstrap, topic, 3)
    app_file = tmp_path / "app.py"
    app_file.write_text(COGROUP_APP.format(app=unique, **topics))
    state, log = tmp_path / "state", tmp_path / "pipeline.log"
    rng = random.Random(13)
    events: list[ref.CogroupEvent] = []

    def send(n: int) -> None:
        wire: dict[str, list[tuple[bytes, bytes]]] = {"a": [], "b": []}
        for _ in range(n):
            side, k, v = rng.choice("ab"), f"s{rng.randrange(300)}", rng.randrange(1000)
            value = {"n": v, "to": f"s{rng.randrange(300)}"}
            wire[side].append((k.encode(), orjson.dumps(value)))
            if side == "a":
                events.append((0, 0, k, value, 0))
            elif v % 3 != 0:
                events.append((1, 0, value["to"], value, 0))
        for side, records in wire.items():
            produce(bootstrap, topics[side], records)

    def add_a(k: Any, v: Any, agg: list[int]) -> list[int]:
        return [agg[0] + 1, agg[1] + v["n"], agg[2], agg[3]]

    def add_b(k: Any, v: Any, agg: list[int]) -> list[int]:
        return [agg[0], agg[1], agg[2] + 1, agg[3] + v["n"]]

    proc = start(app_file, bootstrap, state, log)
    try:
        send(2000)
        sums = f"{unique}.table.sums"
        eventually(lambda: sum(end_offsets(bootstrap, sums).values()) > 0, 180)
        # the side query writes b's batch to the changelog (again after a restart: the
        # cogroup must drop those copies)
        proc = kill_twice(
            proc,
            bootstrap,
            f"{unique}.changelog.sums-cogroup0",
            lambda: send(12000),
            lambda: start(app_file, bootstrap, state, log),
        )
        send(2000)
        store = ref.cogroup_aggregate(events, lambda: [0, 0, 0, 0], [add_a, add_b])
        want = {k: v for k, (v, _) in store.items()}
        assert any(v[0] and v[2] for v in want.values())  # keys both inputs updated

        def exact() -> bool:
            return read_table(bootstrap, sums, STR, JSON) == want

        eventually(exact, 240, 2.0)
        hourly = f"{unique}.table.hourly"
        eventually(lambda: window_totals(bootstrap, hourly) == want, 120, 2.0)
        visits = f"{unique}.table.visits"
        eventually(lambda: window_totals(bootstrap, visits, sessions=True) == want, 120, 2.0)
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        kill_group(proc, signal.SIGTERM)


# -- foreign-key table joins: kill -9 mid-stream, the result tables exact ---------
FK_APP = """
import tablecast as tc

app = tc.App({app!r}, trigger="300 milliseconds")
key, value = tc.serde.string(), tc.serde.json()
orders = app.table({orders!r}, key=key, value=value)
customers = app.table({customers!r}, key=key, value=value)
joiner = lambda o, c: [o["n"], None if c is None else c["name"]]
fk = lambda k, o: o.get("c")
orders.join(customers, joiner, foreign_key=fk).materialize("matched")
orders.join(customers, joiner, foreign_key=fk, how="left").materialize("enriched")
"""


def fk_batch(rng: random.Random, n: int) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Mostly order changes (a tenth deletes, some without a customer), some customers."""
    out: list[tuple[str, str, dict[str, Any] | None]] = []
    for i in range(n):
        if rng.random() < 0.2:
            name = None if rng.random() < 0.2 else {"name": f"n{i}"}
            out.append(("customers", f"c{rng.randrange(40)}", name))
        elif rng.random() < 0.1:
            out.append(("orders", f"o{rng.randrange(400)}", None))
        else:
            c = None if rng.random() < 0.1 else f"c{rng.randrange(40)}"
            out.append(("orders", f"o{rng.randrange(400)}", {"c": c, "n": i}))
    return out


@pytest.mark.long
def test_kill_9_of_the_driver_leaves_foreign_key_join_results_exact(
    bootstrap: str, unique: str, tmp_path: Path
) -> None:
    """Kills while the subscribing query writes its subscriptions (its restart writes them
    again, which the matching query drops) and at another moment: both result tables are
    Kafka Streams' final tables (they depend only on both tables' final rows)."""
    topics = {name: f"{unique}-{name}" for name in ("orders", "customers")}
    for topic in topics.values():
        ensure_topic(bootstrap, topic, 3)
    app_file = tmp_path / "app.py"
    app_file.write_text(FK_APP.format(app=unique, **topics))
    state, log = tmp_path / "state", tmp_path / "pipeline.log"
    rng = random.Random(13)
    events: list[ref.Event] = []

    def send(records: list[tuple[str, str, dict[str, Any] | None]]) -> None:
        for name in topics:
            produce(
                bootstrap,
                topics[name],
                [
                    (k.encode(), None if v is None else orjson.dumps(v))
                    for n, k, v in records
                    if n == name
                ],
            )
        events.extend(("right" if n == "customers" else "left", k, v) for n, k, v in records)

    def joiner(o: dict[str, Any], c: dict[str, Any] | None) -> list[Any]:
        return [o["n"], None if c is None else c["name"]]

    def fk(k: str, o: dict[str, Any]) -> str | None:
        return o.get("c")

    proc = start(app_file, bootstrap, state, log)
    try:
        send(fk_batch(rng, 2000))
        enriched = f"{unique}.table.enriched"
        eventually(lambda: sum(end_offsets(bootstrap, enriched).values()) > 0, 180)
        proc = kill_twice(
            proc,
            bootstrap,
            f"{unique}.repartition.enriched-0",  # the subscriptions
            lambda: send(fk_batch(rng, 8000)),
            lambda: start(app_file, bootstrap, state, log),
        )
        send(fk_batch(rng, 2000))
        for name, how in (("matched", "inner"), ("enriched", "left")):
            want = ref.latest(ref.table_table_fk_join(events, joiner, fk, how))
            assert want

            def exact(t: str = f"{unique}.table.{name}", w: Any = want) -> bool:
                return read_table(bootstrap, t, STR, JSON) == w

            eventually(exact, 300, 2.0)
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        kill_group(proc, signal.SIGTERM)


# -- a grouped stream's count in Real-time Mode: kill -9 mid-batch, the count exact -----
REALTIME_COUNT_APP = """
from pyspark.sql import functions as F

import tablecast as tc

app = tc.App({app!r}, trigger="realtime 5 seconds")
ev = app.stream({topic!r}, key=tc.serde.string(), value=tc.serde.json())
ev.group_by_key().count().materialize("counts")
i = F.variant_get("value", "$.i", "long")
ev.group_by_key().aggregate(F.sum(i), value=tc.serde.long()).materialize("sums")
"""


@pytest.mark.long
def test_kill_9_of_a_real_time_count_leaves_it_exact(
    bootstrap: str, unique: str, tmp_path: Path
) -> None:
    """group_by_key().count() and .aggregate(F.sum(...)) are Spark's own aggregations, run
    in Real-time Mode (local[12]: per aggregation a slot per source partition and per
    shuffle partition, and two for its companion query that dead-letters bad input).
    Counted records are never read again after a kill -9 (Spark's checkpointed offsets
    and state) nor lost; a real-time batch killed before its checkpoint is replayed into
    the same counts and sums."""
    topic = f"{unique}-ev"
    ensure_topic(bootstrap, topic, 2)
    app_file = tmp_path / "app.py"
    app_file.write_text(REALTIME_COUNT_APP.format(app=unique, topic=topic))
    state, log = tmp_path / "state", tmp_path / "pipeline.log"
    rng = random.Random(21)
    history: list[tuple[str, Any]] = []
    bad: list[bytes] = []

    def send(n: int) -> None:
        wire = []
        for i in range(n):
            k = f"c{rng.randrange(200)}"
            if rng.random() < 0.01:
                junk = f"{{not json {len(bad)}".encode()
                bad.append(junk)
                wire.append((k.encode(), junk))
                continue
            v = None if rng.random() < 0.05 else {"i": i}
            history.append((k, v))
            wire.append((k.encode(), None if v is None else orjson.dumps(v)))
        produce(bootstrap, topic, wire)

    def launch() -> subprocess.Popen[bytes]:
        return start(app_file, bootstrap, state, log, "--master", "local[12]")

    proc = launch()
    try:
        send(2000)
        counts = f"{unique}.table.counts"
        eventually(lambda: sum(end_offsets(bootstrap, counts).values()) > 0, 180)
        started = [line for line in log.read_text().splitlines() if "started, trigger:" in line]
        assert len(started) == 4 and all("trigger: realtime" in line for line in started), started
        proc = kill_twice(proc, bootstrap, counts, lambda: send(8000), launch)
        send(2000)
        want = ref.stream_count(history)
        sums = ref.stream_aggregate(history, lambda: 0, lambda k, v, a: a + v["i"])

        def exact() -> bool:
            return read_table(bootstrap, counts, STR, LONG) == want

        eventually(exact, 240, 2.0)
        eventually(lambda: read_table(bootstrap, f"{unique}.table.sums", STR, LONG) == sums, 60)

        # every bad record dead-lettered (a replayed real-time batch may write one again)
        def dead() -> set[bytes]:
            return {m.value() for m in read_topic(bootstrap, f"{unique}.dlq")}

        eventually(lambda: dead() == set(bad), 60, 1.0)
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        kill_group(proc, signal.SIGTERM)
