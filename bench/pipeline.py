"""Pipeline throughput and freshness on Spark local[2].

``python -m bench pipeline [--quick] [--records N] [--seconds S]`` (or
``python -m bench.pipeline``): a throwaway broker, one SparkSession, and

- throughput through a stateless table (a Column filter; and, for
  comparison, a Python callable) and through a table group_by/reduce (two
  queries chained by a repartition topic; alternated with the same job with the
  selector in a mapInArrow before the shuffle, with Spark alone copying the input
  Kafka -> Kafka (the ceiling), and with Kafka Streams doing it): N
  records are produced first, then
  the pipeline starts and drains them; records/s = N / (first batch start ..
  last batch end), from Spark's own progress reports; both sides warm first
  (the session runs a stateless table and a first group_by, each Kafka Streams
  JVM a first drain), and each side's first group_by is reported as cold;
- freshness of a stateless table, micro-batch (500 ms) and Real-time Mode,
  and of the group_by (micro-batch): a `tablecast serve` node follows
  the table while a background producer adds load; every 100 ms one marker key
  is produced and polled over HTTP until the node answers it (produce ->
  queryable), and a consumer on the table topic notes when it arrives there
  (produce -> table topic).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import common
from bench.common import (
    command,
    facts_line,
    machine,
    publish,
    ratio_spread,
    settled,
    settled_below,
    verdict,
)
from tablecast.kafka.produce import produce_waiting

log = logging.getLogger("bench.pipeline")

PARTITIONS = 4
#: a real-time query holds a task slot per input partition: local[2] has two
FRESH_PARTITIONS = 2
GROUPS = 100
#: keys of the freshness rows' background load (bg0, bg1, ...)
BACKGROUND_KEYS = 10_000
#: load before the first marker of a freshness run: a new query's first batches run code the
#: JIT has not compiled yet (two to four times slower for about 15 s)
WARM_S = 15.0


def produce(bootstrap: str, topic: str, n: int, keys: int, start: int = 0) -> None:
    from confluent_kafka import Producer

    from tablecast.contract.partitioner import PRODUCER_CONFIG

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": "lz4",
            **PRODUCER_CONFIG,
        }
    )
    for i in range(start, start + n):
        value = orjson.dumps({"g": f"g{i % GROUPS}", "n": i % 1000, "pad": "x" * 40})
        produce_waiting(p, topic, key=f"k{i % keys}".encode(), value=value)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def sums_by_group(rows: Any) -> Any:
    """The benchmark's group_by/reduce: each row's n summed per group g (the same job as
    Kafka Streams' GroupByReduce)."""
    import tablecast as tc

    return rows.group_by(lambda k, v: (v["g"], v["n"]), value=tc.serde.long()).reduce(
        lambda a, b: a + b, lambda a, b: a - b
    )


def sums_by_group_columns(rows: Any) -> Any:
    """The same group_by/reduce with Columns: Spark folds it in the JVM (transformWithState),
    so Real-time Mode can run it."""
    from pyspark.sql import functions as F

    import tablecast as tc

    g, n = F.variant_get("value", "$.g", "string"), F.variant_get("value", "$.n", "long")
    total, x = F.col("aggregate"), F.col("value")
    return rows.group_by((g, n), value=tc.serde.long()).reduce(total + x, total - x)


def _table(app: Any, topic: str) -> Any:
    import tablecast as tc

    return app.table(topic, key=tc.serde.string(), value=tc.serde.json())


def _stream(app: Any, topic: str) -> Any:
    import tablecast as tc

    return app.stream(topic, key=tc.serde.string(), value=tc.serde.json())


def _sum_columns(app: Any, topic: str) -> Any:
    """A grouped stream's n summed by Spark's own aggregation (Columns)."""
    from pyspark.sql import functions as F

    import tablecast as tc

    total = F.sum(F.variant_get("value", "$.n", "long"))
    return _stream(app, topic).group_by_key().aggregate(total, value=tc.serde.long())


def _window_count(app: Any, topic: str) -> Any:
    import tablecast as tc

    grouped = _stream(app, topic).group_by_key()
    return grouped.windowed_by(tc.windows.tumbling("1 minute")).count()


#: the table a join row's stream meets, beside its input topic
DIMENSION = "-dimension"
#: keys of that table besides the background load's: the markers' (m0, m1, ...)
MARKER_KEYS = 5000


def _with_tier(record: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    return {**record, "tier": row["tier"]}


def _joined(app: Any, topic: str) -> Any:
    """Each record with its key's row of the dimension table (filled by fill_dimension)."""
    return _stream(app, topic).join(_table(app, topic + DIMENSION), _with_tier).to_table()


def fill_dimension(bootstrap: str, topic: str, partitions: int) -> None:
    """A row for every key the markers and the background load use, before the join starts."""
    from confluent_kafka import Producer

    from tablecast.contract.partitioner import PRODUCER_CONFIG
    from tablecast.kafka.topics import ensure_topic

    ensure_topic(bootstrap, topic, partitions)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, **PRODUCER_CONFIG})
    keys = [f"m{i}" for i in range(MARKER_KEYS)] + [f"bg{i}" for i in range(BACKGROUND_KEYS)]
    for i, key in enumerate(keys):
        p.produce(topic, key=key.encode(), value=b'{"tier": "t%d"}' % (i % 3))
        p.poll(0)
    p.flush(30)


#: the freshness rows' pipelines: how each is described, its input's partitions, and what it
#: builds from its input topic (its table is materialized as "fresh")
KINDS: dict[str, tuple[str, int, Callable[[Any, str], Any]]] = {
    "table": ("table", FRESH_PARTITIONS, _table),
    "group_by": ("group_by/reduce", FRESH_PARTITIONS, lambda a, t: sums_by_group(_table(a, t))),
    "group_by_columns": (
        "group_by/reduce, Columns",
        FRESH_PARTITIONS,
        lambda a, t: sums_by_group_columns(_table(a, t)),
    ),
    "aggregate": ("stream group_by_key().aggregate(F.sum(...)), Columns", PARTITIONS, _sum_columns),
    "window": ("tumbling-window count (1 minute)", PARTITIONS, _window_count),
    "join": ("stream–table join (Python joiner), to_table()", PARTITIONS, _joined),
}


def drained_rate(queries: list[Any], records: int) -> dict[str, float]:
    """records / (first batch with data starts .. last batch with data ends), from progress."""
    starts, ends = [], []
    for q in queries:
        for p in q.recentProgress:
            if p["numInputRows"] > 0:
                t0 = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
                starts.append(t0)
                ends.append(t0 + p["durationMs"]["triggerExecution"] / 1000)
    seconds = max(ends) - min(starts)
    return {"records": records, "seconds": round(seconds, 2), "rate": round(records / seconds)}


def throughput(
    spark: Any, bootstrap: str, state: Path, name: str, records: int
) -> dict[str, float]:
    import tablecast as tc
    from tablecast.kafka.topics import ensure_topic

    topic = f"bench-{name}"
    ensure_topic(bootstrap, topic, PARTITIONS)
    started = time.monotonic()
    produce(bootstrap, topic, records, keys=records // 10)
    log.info("%s: produced %d records in %.1f s", name, records, time.monotonic() - started)
    app = tc.App(f"bench{name.replace('-', '')}", state_dir=state)
    rows = app.table(topic, key=tc.serde.string(), value=tc.serde.json())
    if name in ("stateless", "warmup"):
        from pyspark.sql import functions as F

        rows.filter(F.variant_get("value", "$.n", "int") % 2 == 0).materialize("t")
    elif name == "stateless-python":
        rows.filter(lambda k, v: v["n"] % 2 == 0).materialize("t")
    elif name.startswith("fold-columns"):
        sums_by_group_columns(rows).materialize("t")
    else:
        sums_by_group(rows).materialize("t")
    wall = time.monotonic()
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    try:
        pipeline.process_all_available()
        wall = time.monotonic() - wall
        result = drained_rate(list(pipeline.queries.values()), records)
    finally:
        pipeline.stop()
    result["wall_seconds_with_query_start"] = round(wall, 2)
    log.info("%s: %s", name, result)
    return result


def spark_copy(
    spark: Any, bootstrap: str, state: Path, name: str, records: int
) -> dict[str, float]:
    """Spark alone: the same input copied Kafka -> Kafka, no tablecast: what this machine's
    Spark, broker and cores allow a single query that reads and writes every record."""
    from tablecast.kafka.topics import ensure_topic

    topic = f"bench-{name}"
    ensure_topic(bootstrap, topic, PARTITIONS)
    ensure_topic(bootstrap, f"{topic}-out", PARTITIONS)
    produce(bootstrap, topic, records, keys=records // 10)
    wall = time.monotonic()
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        source.select("key", "value")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", f"{topic}-out")
        .option("checkpointLocation", str(state))
        .start()
    )
    try:
        query.processAllAvailable()
        wall = time.monotonic() - wall
        result = drained_rate([query], records)
    finally:
        query.stop()
    result["wall_seconds_with_query_start"] = round(wall, 2)
    log.info("%s: %s", name, result)
    return result


def kafka_streams_groupby(
    bootstrap: str, state: Path, records: int, topic: str = "bench-ks-groupby"
) -> dict[str, float]:
    """The same group_by/reduce in Kafka Streams (bench/peers, GroupByReduce): 2 stream
    threads, exactly-once, on the same 2 cores as Spark's local[2]; its drain time from the
    first record to the end of the input and repartition topics committed. Its JVM first
    drains the same job on another topic of `records` (unmeasured, as tablecast's session
    runs a group_by before the rounds): its cold drain is reported apart."""
    import subprocess

    from bench.peers import kafka_streams as ks
    from tablecast.kafka.topics import ensure_topic

    warm = f"{topic}-warm"
    for t in (topic, warm):
        ensure_topic(bootstrap, t, PARTITIONS)
        ensure_topic(bootstrap, t + "-sums", PARTITIONS)  # the broker creates no topic itself
        produce(bootstrap, t, records, keys=records // 10)
    cmd = ["java", "-Xms1g", "-Xmx1g", "-cp", str(ks.build()), "dev.tablecast.peers.GroupByReduce"]
    cmd += [bootstrap, topic, str(state), "2", warm]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    line = next((x for x in done.stdout.splitlines() if x.startswith("{")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"GroupByReduce failed ({done.returncode}): {done.stderr[-2000:]}")
    out = orjson.loads(line)
    result = {
        "records": records,
        "seconds": round(out["seconds"], 2),
        "rate": round(records / out["seconds"]),
        "wall_seconds_with_query_start": round(out["wall_seconds_with_start"], 2),
        "cold_rate": round(records / out["warmup_seconds"]),
    }
    log.info("kafka streams group_by/reduce: %s", result)
    return result


class TopicWatch:
    """When each marker key shows up in a table topic (a consumer from its end)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        from tablecast.kafka.topics import partition_count

        self.seen: dict[bytes, float] = {}
        self._stop = threading.Event()
        # a fetch returns as soon as a byte is there (the wait is for when none is); one poll
        # per record, as batch consume waits out its timeout and would blur the times
        self._c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-watch-{topic}",
                "fetch.wait.max.ms": 100,
                "enable.auto.commit": False,
            }
        )
        parts = partition_count(bootstrap, topic) or 1
        self._c.assign([TopicPartition(topic, p, OFFSET_END) for p in range(parts)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            m = self._c.poll(0.01)
            if m is not None and m.error() is None and m.key() and m.key().startswith(b"m"):
                self.seen.setdefault(m.key(), time.monotonic())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._c.close()


def marked(
    marker: Any,
    client: httpx.Client,
    topic: str,
    path: str,
    key: str,
    value: Any,
    t0: float,
    poll_s: float,
    answered: Callable[[httpx.Response], bool] | None = None,
) -> float:
    """Produce one marker record (`marker`: a producer with linger 0) and poll `path` on the
    server every `poll_s` until it answers (200, and `answered` if given): seconds from `t0`
    (taken before producing)."""
    marker.produce(topic, key=key.encode(), value=orjson.dumps(value))
    marker.flush(5)
    while not _answers(client.get(path), answered):
        if time.monotonic() - t0 > 60:
            raise TimeoutError(f"marker {key} never became queryable")
        time.sleep(poll_s)
    return time.monotonic() - t0


def markers(
    marker: Any,
    client: httpx.Client,
    topic: str,
    seconds: float,
    path_of: Callable[[str], str],
    value_of: Callable[[str, int], Any],
    answered: Callable[[httpx.Response], bool] | None = None,
) -> tuple[list[float], dict[bytes, float]]:
    """Marker records on keys of their own for `seconds`, each read at ``path_of(key)`` until
    answered (:func:`marked`): their latencies, and when each key was sent. Markers are at
    least 100 ms apart, at a random point of the next tick rather than just after the batch
    that answered the last one."""
    import random

    rng = random.Random(7)
    sent: dict[bytes, float] = {}
    queryable: list[float] = []
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        key = f"m{i}"
        i += 1
        t0 = sent[key.encode()] = time.monotonic()
        value = value_of(key, i)
        queryable.append(
            marked(marker, client, topic, path_of(key), key, value, t0, 0.005, answered)
        )
        time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)) + rng.uniform(0, 0.1))
    return queryable, sent


def _answers(r: httpx.Response, answered: Callable[[httpx.Response], bool] | None) -> bool:
    return r.status_code == 200 and (answered is None or answered(r))


def _has_windows(r: httpx.Response) -> bool:
    """A window read that found the marker's window (not an empty list)."""
    return bool(r.json()["items"])


def percentiles(latencies: list[float]) -> dict[str, int]:
    latencies = sorted(latencies)
    out = {f"p{p}_ms": round(latencies[int(len(latencies) * p / 100)] * 1000) for p in (50, 90, 99)}
    out["max_ms"] = round(latencies[-1] * 1000)
    return out


def background_load(
    bootstrap: str, topic: str, load: int, stop: threading.Event, grouped: bool = False
) -> None:
    """`load` records/s over BACKGROUND_KEYS keys, in 50 ms bursts, until `stop` is set (`grouped`:
    values a group_by selects from, in GROUPS groups)."""
    from confluent_kafka import Producer

    from tablecast.contract.partitioner import PRODUCER_CONFIG

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **PRODUCER_CONFIG})
    i = 0
    while not stop.is_set():
        t = time.monotonic()
        for _ in range(load // 20):
            value = f'{{"g": "g{i % GROUPS}", "n": 1}}'.encode() if grouped else b'{"n": 1}'
            p.produce(topic, key=f"bg{i % BACKGROUND_KEYS}".encode(), value=value)
            i += 1
        p.poll(0)
        stop.wait(max(0.0, 0.05 - (time.monotonic() - t)))
    p.flush(10)


def freshness(
    spark: Any,
    bootstrap: str,
    state: Path,
    seconds: float,
    load: int,
    trigger: str,
    kind: str = "table",
    label: str = "",
) -> dict[str, Any]:
    """Produce -> table topic and produce -> queryable, for the pipeline :data:`KINDS` names
    under `trigger`, after :data:`WARM_S` of load (the query's first batches run cold code);
    `label` tells runs of one mode apart."""
    import tablecast as tc
    from tablecast.contract.partitioner import PRODUCER_CONFIG
    from tablecast.kafka.topics import ensure_topic, table_topic
    from tests.support.procs import start_node

    grouped = kind.startswith("group_by")  # markers are new groups, from new source rows
    mode = ("rt" if trigger.startswith("realtime") else "mb") + kind.replace("_", "") + label
    topic = f"bench-fresh-{mode}"
    described, partitions, build = KINDS[kind]
    ensure_topic(bootstrap, topic, partitions)
    if kind == "join":
        fill_dimension(bootstrap, topic + DIMENSION, partitions)
    app = tc.App(f"benchfresh{mode}", state_dir=state, trigger=trigger)
    build(app, topic).materialize("fresh")
    windows = kind == "window"
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    # the query that writes the table (not a group_by's first, nor a dead-letter companion)
    final = f"{app.id}.fresh"
    chosen = pipeline.triggers[final]
    if chosen.realtime != mode.startswith("rt"):
        raise RuntimeError(f"asked for {trigger!r}, the query runs {chosen.describe()}")
    node = start_node(app.id, bootstrap, state, "--data-dir", str(state / "node"))
    watch = TopicWatch(bootstrap, table_topic(app.id, "fresh"))
    stop = threading.Event()
    try:
        node.wait_ready(180)
        from confluent_kafka import Producer

        threading.Thread(
            target=background_load, args=(bootstrap, topic, load, stop, grouped), daemon=True
        ).start()
        marker = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **PRODUCER_CONFIG})
        client = httpx.Client(base_url=node.url, timeout=5)
        time.sleep(WARM_S)  # the first batches, JIT-cold and with the load's backlog, pass
        query = pipeline.queries[final]
        first_batch = (query.lastProgress or {}).get("batchId", -1)
        queryable, sent = markers(
            marker,
            client,
            topic,
            seconds,
            lambda key: f"/v1/tables/fresh/keys/{key}" + ("/windows" if windows else ""),
            # grouped: the marker is a new group (the table's key), from a new source row
            lambda key, i: {"g": key, "n": 1} if grouped else {"i": i, "n": 1},
            _has_windows if windows else None,
        )
        # a real-time batch ends every checkpoint interval: how many the window held
        batches = (query.lastProgress or {}).get("batchId", -1) - first_batch
        # a marker is queryable only after it is in the topic: all were seen by now
        # (a window table's records are keyed by key and window: not told apart here)
        in_topic = [watch.seen[k] - t0 for k, t0 in sent.items() if k in watch.seen]
        return {
            "pipeline": described,
            "trigger": chosen.describe(),
            "partitions": partitions,
            "samples": len(queryable),
            "load_per_s": load,
            "queryable": percentiles(queryable),
            "topic": percentiles(in_topic) if in_topic else {},
            "topic_samples": len(in_topic),
            "batches": batches,
        }
    finally:
        stop.set()
        watch.close()
        node.stop()
        pipeline.stop()


#: Kafka Streams as its users run it for fresh reads: exactly-once, committed every 100 ms,
#: no record cache (a store changes as each record is processed)
KS_FRESH_PROPS = {
    "processing.guarantee": "exactly_once_v2",
    "commit.interval.ms": "100",
    "statestore.cache.max.bytes": "0",
}


def ks_freshness(
    bootstrap: str, work: Path, seconds: float, load: int, group_by: bool = False
) -> dict[str, Any]:
    """The stateless table's freshness row for Kafka Streams (bench/peers/kafka-streams-iq: a
    KTable from the topic, read over its HTTP front): the same load, warm-up and markers.
    `group_by`: the group_by/reduce row's job instead (the rows' n summed per group g; the
    markers are new groups)."""
    from confluent_kafka import Producer

    from bench.peers import kafka_streams as ks
    from tablecast.contract.partitioner import PRODUCER_CONFIG
    from tablecast.kafka.topics import ensure_topic

    topic = "bench-fresh-ks" + ("-groupby" if group_by else "")
    ensure_topic(bootstrap, topic, FRESH_PARTITIONS)
    stop = threading.Event()
    peer_job = ks.start(bootstrap, topic, work_dir=work, props=KS_FRESH_PROPS, group_sums=group_by)
    with peer_job as peer:
        (inst,) = peer.instances
        try:
            threading.Thread(
                target=background_load, args=(bootstrap, topic, load, stop, group_by), daemon=True
            ).start()
            marker = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **PRODUCER_CONFIG})
            client = httpx.Client(base_url=inst.url, timeout=5)
            time.sleep(WARM_S)
            queryable, _ = markers(
                marker,
                client,
                topic,
                seconds,
                lambda key: f"/keys/{key}",
                lambda key, i: {"g": key, "n": 1} if group_by else {"i": i},
            )
        finally:
            stop.set()
    return {
        "pipeline": f"the same {'group_by/reduce' if group_by else 'table'} in Kafka Streams",
        "trigger": "exactly-once, commit every 100 ms, no record cache",
        "partitions": FRESH_PARTITIONS,
        "samples": len(queryable),
        "load_per_s": load,
        "queryable": percentiles(queryable),
    }


#: marker ticks of the demo's row, each on a symbol of its own
DEMO_MARKERS = 40
#: the rate the demo's generator is started with (its default)
DEMO_TICKS_PER_S = 200


def demo_freshness(
    spark: Any,
    bootstrap: str,
    state: Path,
    markers: int,
    python_board: bool = False,
    run: str = "",
) -> dict[str, Any]:
    """The demo as shipped (examples/stock_prices.py: 30 partitions, the App's default
    trigger, a board per symbol by Spark's aggregate functions, or with `python_board` by
    the Python function it was before) under its generator's load: a marker
    tick for a symbol of its own every 0.3-0.7 s (linger 0), polled every 10 ms over HTTP
    on a node until the node answers it (produce -> queryable). Beside each marker, one
    background symbol's board is read and aged by its newest tick (what a user sees).
    `run` names a run's topics apart from another's in the same broker."""
    import random

    from confluent_kafka import Producer

    from tablecast.cli.appfile import load_module
    from tablecast.contract.partitioner import PRODUCER_CONFIG
    from tablecast.kafka.topics import ensure_topic, table_topic
    from tests.support.procs import start_node

    ex = load_module(Path(__file__).resolve().parents[1] / "examples" / "stock_prices.py")
    topic = ("bench-demo-ticks-py" if python_board else "bench-demo-ticks") + run
    ensure_topic(bootstrap, topic, ex["PARTITIONS"])
    app_id = ("benchdemopy" if python_board else "benchdemo") + run
    app = ex["build"](app_id, topic, python_board)
    app.state_dir = state
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    node = start_node(app.id, bootstrap, state, "--data-dir", str(state / "node"))
    watch = TopicWatch(bootstrap, table_topic(app.id, "prices"))
    stop = threading.Event()
    symbols = list(ex["SYMBOLS"])
    try:
        node.wait_ready(180)
        # the demo's own generator, into this run's topic
        threading.Thread(
            target=ex["generate"],
            args=(bootstrap, float(DEMO_TICKS_PER_S), topic, stop),
            daemon=True,
        ).start()
        marker = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **PRODUCER_CONFIG})
        client = httpx.Client(base_url=node.url, timeout=5)
        time.sleep(10)  # the first batches, with the load's backlog, pass
        rng = random.Random(7)
        sent: dict[bytes, float] = {}
        queryable: list[float] = []
        board_age: list[float] = []
        for i in range(markers):
            key = f"m{i:03d}"
            t0 = time.monotonic()
            tick = {"exchange": "NYSE", "price": 1.0, "time": int(time.time() * 1000)}
            sent[key.encode()] = t0
            path = f"/v1/tables/prices/keys/{key}"
            queryable.append(marked(marker, client, topic, path, key, tick, t0, 0.01))
            board = client.get(f"/v1/tables/prices/keys/{rng.choice(symbols)}").json()["value"]
            newest = max(q["time"] for q in board.values())
            board_age.append(time.time() - newest / 1000)
            time.sleep(max(0.0, rng.uniform(0.3, 0.7) - (time.monotonic() - t0)))
        in_topic = [watch.seen[k] - t0 for k, t0 in sent.items() if k in watch.seen]
        progress = [
            p if isinstance(p, dict) else orjson.loads(p.json)
            for q in pipeline.queries.values()
            for p in q.recentProgress
        ]
        # where a batch's time goes: Spark's own phases, medians over the batches with input
        with_input = [p["durationMs"] for p in progress if p.get("numInputRows", 0) > 0]
        batches = [d.get("triggerExecution", 0) for d in with_input]
        phases = {
            name: statistics.median(d.get(name, 0) for d in with_input)
            for name in sorted({n for d in with_input for n in d})
        }
        final = f"{app.id}.prices"  # the query that writes the board
        return {
            "pipeline": "the board as a Python function"
            if python_board
            else "the demo as shipped (the board in Columns)",
            "target_ms": 1000 if python_board else 500,
            "trigger": pipeline.triggers[final].describe(),
            "partitions": ex["PARTITIONS"],
            "samples": len(queryable),
            "load_per_s": DEMO_TICKS_PER_S,
            "queryable": percentiles(queryable),
            "queryable_ms": [round(x * 1000) for x in queryable],
            "topic": percentiles(in_topic),
            "topic_samples": len(in_topic),
            "board_age": percentiles(board_age),
            "batch_ms": percentiles([b / 1000 for b in batches]) if batches else {},
            "batches": len(batches),
            "phases_ms": phases,
        }
    finally:
        stop.set()
        watch.close()
        node.stop()
        pipeline.stop()


def render_demo(runs: list[dict[str, Any]], argv: str, m: dict[str, Any]) -> str:
    rows = []
    for f in runs:
        q, t, b, mb = f["queryable"], f["topic"], f["board_age"], f["batch_ms"]
        name, target = f["pipeline"], f.get("target_ms", 500)
        rows += [
            f"| {name}: produce → queryable | {q['p50_ms']} | {q['p90_ms']} | {q['p99_ms']} "
            f"| {q['max_ms']} | p99 ≤ {target}: {verdict(q['p99_ms'] <= target)} |",
            f"| {name}: produce → table topic | {t['p50_ms']} | {t['p90_ms']} | {t['p99_ms']} "
            f"| {t['max_ms']} | |",
            f"| {name}: board age | {b['p50_ms']} | {b['p90_ms']} | {b['p99_ms']} "
            f"| {b['max_ms']} | |",
            f"| {name}: micro-batch (trigger to end, {f['batches']} batches with input) "
            f"| {mb.get('p50_ms', '–')} | {mb.get('p90_ms', '–')} | {mb.get('p99_ms', '–')} "
            f"| {mb.get('max_ms', '–')} | |",
        ]
    table = "\n".join(rows)
    phases = "; ".join(
        f"{f['pipeline']}: "
        + ", ".join(f"{k} {v:.0f}" for k, v in f.get("phases_ms", {}).items() if v)
        for f in runs
    )
    f = runs[0]
    return f"""
## The demo's freshness: produce to answer

`{argv}` — {facts_line(m)}. The demo's pipeline (`examples/stock_prices.py`:
{f["partitions"]} partitions, a board per symbol, trigger
{f["trigger"]}) on Spark local[2] in the benchmark's session, one `tablecast serve` node, a
single-node broker (the JVMs with the C1 JIT alone and the serial collector, as
`tablecast demo` starts them), all on this machine's 2 cores, under the generator's
{f["load_per_s"]} ticks/s; as shipped its board is one Spark aggregate (`max_by` per
exchange), and again with the board as the Python function it was before
(`build(python_board=True)`), one after the other. {f["samples"]} marker ticks each, each for
a symbol of its own, 0.3-0.7 s apart, produced with linger 0; *queryable* is produce → the
first node answer carrying it (polled every 10 ms), *topic* is produce → the record in the
table topic; *board age* is how old the newest tick in a background symbol's board is when
a node returns it. Milliseconds:

| measure | p50 | p90 | p99 | max | target |
|---|---|---|---|---|---|
{table}

One run each; the node, the load and the pipeline share the cores, as in `./run demo`. The
markers begin 10 s after the node is ready, so the first minute of a fresh session is in
them. A marker waits for the next batch to start (a tick away, or the batch in progress when
batches take longer than the tick) and then a whole batch. Where a batch with input spends its
time (Spark's progress reports, medians, ms):
{phases}.
"""


def render_freshness(r: dict[str, Any], argv: str) -> str:
    """The freshness rows of one run, with the stateless table on the old common tick first."""
    before, fm = r["freshness-500ms"], r["freshness"]
    fr, fg = r["freshness-realtime"], r["freshness-groupby"]
    k = r.get("freshness-ks")
    ks_row = (
        f"| {k['pipeline']} | {k['trigger']} | {k['samples']} | | | {k['queryable']['p50_ms']} "
        f"| {k['queryable']['p90_ms']} | {k['queryable']['p99_ms']} ({k['queryable']['max_ms']}) "
        "| (the peer) |"
        if k
        else ""
    )
    return f"""
## Pipeline freshness

`{argv}` — {facts_line(r["machine"])}. Spark local[2], one session for every row, a
single-node KRaft broker and one `tablecast serve` node on the same 2 cores. A stateless
table (`app.table(topic).materialize(...)`, {fm["partitions"]}-partition input) and the
throughput runs' table `group_by`/`reduce` (markers are new groups), each under
{fm["load_per_s"]:,} records/s of background load. After {WARM_S:.0f} s of that load (a new
query's first batches run code the JIT has not compiled yet), a marker record is produced
(linger 0) at least 100 ms after the previous one was answered, plus a random 0-100 ms so
that markers do not follow the batch ends, and the node is polled every 5 ms until it
answers it: *topic* is produce → the record in the table topic, *queryable* is produce →
the node's answer. Milliseconds:

| pipeline | trigger | samples (batches ended) | topic p50 | topic p99 | queryable p50 | queryable p90 | queryable p99 (max) | target |
|---|---|---|---|---|---|---|---|---|
{fresh_row(before, "(the old default, for comparison)")}
{fresh_row(fm, "p99 ≤ 300 ms", 300)}
{fresh_row(fr, "p99 ≤ 25 ms", 25, 100)}
{fresh_row(fg, "p99 ≤ 1 s", 1000)}
{fresh_row(r["freshness-aggregate"], "p99 ≤ 500 ms", 500)}
{fresh_row(r["freshness-window"], "p99 ≤ 1 s", 1000)}
{fresh_row(r["freshness-join"], "p99 ≤ 1 s", 1000) if "freshness-join" in r else ""}
{ks_row}

The App's default trigger (`"auto"`) runs a stateless query every 100 ms, a stateful one
every 200 ms and a dead-letter companion every 2 s; the first row is the same stateless
table on 500 ms, which every query had before. The grouped stream's sum (Spark's own aggregation, Columns, markers new keys) and
the tumbling-window count (a Python state step; read at `/keys/{{key}}/windows`, so its
*topic* columns are empty) read a {PARTITIONS}-partition input, as does the stream–table
join (each record meets its key's row of a table filled before the run: every marker's and
background key has one; the joiner a Python function, its result `to_table()`). A `group_by` is two queries in series (a repartition topic between them), each with
its own micro-batch, and its stateful one runs applyInPandasWithState (not on Real-time
Mode's list). The Kafka Streams row is `bench/peers/kafka-streams-iq` (a KTable
materialized from the same kind of topic into RocksDB, read over its HTTP front) with
exactly-once, a 100 ms commit interval and no record cache, as its users run it for fresh
reads: interactive queries read the store as each record is processed, before the commit.
Each row's samples are the markers its {r["args"]["seconds"]:.0f} s window
held: a slow row has fewer. One run of each row, measured one after the other in one session: what the
host did meanwhile moves them, and nothing here is an alternating comparison. Warm: what
could flatter these rows is the warm-up, which a pipeline that has just started has not had.
"""


def fresh_row(
    f: dict[str, Any], target: str, limit_ms: int | None = None, max_ms: int | None = None
) -> str:
    t, q = f["topic"], f["queryable"]
    met = "" if limit_ms is None else f": {verdict(q['p99_ms'] <= limit_ms)}"
    if max_ms is not None:
        met += f"; max ≤ {max_ms} ms: {verdict(q['max_ms'] <= max_ms)}"
    return (
        f"| {f.get('pipeline', 'table')} | {f['trigger']} | {f['samples']} ({f['batches']}) "
        f"| {t.get('p50_ms', '–')} | {t.get('p99_ms', '–')} | {q['p50_ms']} "
        f"| {q['p90_ms']} | {q['p99_ms']} ({q['max_ms']}) | {target}{met} |"
    )


def one_run(rate: float, target: float) -> str:
    """A single run's verdict: below the target it missed; above it, one run settles nothing."""
    return "one run, not settled" if rate >= target else "**missed**"


def _row(label: str, run: dict[str, Any], compared: str) -> str:
    """One pipeline's row of the throughput table."""
    return (
        f"| {label} | {run['rate']:,} | {run['seconds']} | "
        f"{run['wall_seconds_with_query_start']} | {compared} |"
    )


def _spread(ratios: dict[str, Any]) -> str:
    """A ratio's median over the rounds with its interquartile range."""
    lo, hi = ratios["ratio_iqr"]
    return f"{ratios['ratio_median']:.2f} (IQR {lo:.2f}–{hi:.2f})"


#: runs shown beside the group_by when the rounds ran them: (result, row label, ratio of the
#: rounds, what the ratio compares, rates per round, the text after the rounds)
_RUNS_BESIDE = (
    (
        "groupby-apart",
        "the same, selector in a mapInArrow before the shuffle (as before)",
        "fused",
        "selector inside ÷ apart",
        "selector_apart",
        " Selector apart (the table's Python callables in a mapInArrow over every record "
        "before the shuffle, as tablecast did before they ran inside the retraction on each "
        "row's latest record): {rounds}. Here every row changes 10 times within the first "
        "micro-batch, so inside the retraction the selector runs once per row instead of 10 "
        "times: under a steady trickle (one change per row and batch) only the saved crossing "
        "into Python remains.",
    ),
    (
        "spark-copy",
        "Spark alone: the same input copied Kafka → Kafka, no tablecast (one query)",
        "of_copy",
        "group_by ÷ copy",
        "spark_copy",
        " Spark alone (a bare `readStream` Kafka → `writeStream` Kafka copy of key and value, "
        "no tablecast, no parsing, the same input): {rounds}. The group_by is two such queries "
        "(input → repartition topic → table topic) plus the shuffle and the state in between, "
        "so the copy is a ceiling it cannot pass on this machine.",
    ),
)


def render(r: dict[str, Any], argv: str) -> str:
    s, py, g = r["stateless"], r["stateless-python"], r["groupby-reduce"]
    ks = r["ks-groupby"]
    rounds = r.get("groupby-rounds")
    if rounds:  # alternating rounds: medians, and the spread of each round's ratio
        rlo, rhi = rounds["rate_iqr"]
        g_target = settled([rlo, rhi], 100_000)
        ratio = _spread(rounds)
        g_rate = f"{g['rate']:,} (IQR {rlo:,.0f}–{rhi:,.0f})"
        spread = (
            f"Medians of {len(rounds['tablecast'])} alternating rounds (tablecast, the same "
            f"with the selector apart, Spark alone copying it, then Kafka Streams, each on a "
            f"fresh topic); records/s "
            f"per round, tablecast: "
            f"{', '.join(f'{x:,}' for x in rounds['tablecast'])}; Kafka Streams: "
            f"{', '.join(f'{x:,}' for x in rounds['kafka_streams'])}."
        )
    else:  # results written before the rounds
        g_target = one_run(g["rate"], 100_000)
        ratio, g_rate, spread = f"{g['rate'] / ks['rate']:.2f}", f"{g['rate']:,}", ""
    ks_row = _row(
        "the same in Kafka Streams (2 threads, exactly-once)",
        ks,
        f"tablecast ÷ Kafka Streams: {ratio}",
    )
    for run, label, ratios, compared, per_round, text in _RUNS_BESIDE:
        if rounds and r.get(run):
            ks_row += "\n" + _row(label, r[run], f"{compared}: {_spread(rounds[ratios])}")
            spread += text.format(rounds=", ".join(f"{x:,}" for x in rounds[per_round]))
    cold = r.get("groupby-cold")
    if cold and rounds and rounds.get("kafka_streams_cold"):
        ks_cold = sorted(rounds["kafka_streams_cold"])[len(rounds["kafka_streams_cold"]) // 2]
        ks_row += "\n" + _row(
            "the group_by cold: a fresh session's first (one run)",
            cold,
            f"÷ Kafka Streams' first drain in a fresh JVM (median {ks_cold:,}/s): "
            f"{cold['rate'] / ks_cold:.2f}",
        )
        spread += (
            " Cold: tablecast's first group_by in a fresh session (Spark compiling its code, the "
            "JIT warming: one run, before the rounds), Kafka Streams' unmeasured first drain in "
            f"each round's new JVM: {', '.join(f'{x:,}' for x in rounds['kafka_streams_cold'])}."
        )
    fm, fr = r["freshness"], r["freshness-realtime"]
    fg = r.get("freshness-groupby")
    grouped_row = "\n" + fresh_row(fg, "p99 ≤ 1 s", 1000) if fg else ""
    grouped_text = (
        " The group_by/reduce row is the throughput runs' job, its markers new groups (a new "
        "source row each, whose group is the marker's key), its background load over "
        f"{GROUPS} groups; it runs as two micro-batch queries chained by a repartition topic "
        "(applyInPandasWithState is not on Real-time Mode's list), so a marker waits for a "
        "batch of each."
        if fg
        else ""
    )
    return f"""
## Pipeline

`{argv}` — {facts_line(r["machine"])}. Spark local[2]
(PySpark 4.3, Kafka connector 4.2), a single-node KRaft broker on the same machine,
{PARTITIONS}-partition input of {s["records"]:,} JSON records (~70 bytes, {s["records"] // 10:,}
keys) produced before the pipeline starts, after the warm-up runs below. Rate = records / (first micro-batch start .. last
micro-batch end) from Spark's progress reports; wall time includes starting the queries.
Load average (1/5/15 min) before: {r["load_before"]}, after: {r["load_after"]} — this
machine is shared, and Spark, the broker and the node all run on its 2 cores.

| pipeline | records/s | drain s | wall s | target |
|---|---|---|---|---|
{_row("stateless table: `filter(Column)`", s, f"≥ 100,000: {one_run(s['rate'], 100_000)}")}
{_row("stateless table: `filter(python callable)`", py, "(for comparison)")}
| table `group_by` / `reduce` (2 queries, repartition topic) | {g_rate} | {g["seconds"]} | {g["wall_seconds_with_query_start"]} | ≥ 100,000: {g_target} |
{ks_row}

{spread} A source row's records within one micro-batch make one change downstream (as Kafka
Streams' record cache forwards a table's latest value per key at each commit), and the whole
input is there when the pipeline starts, so its first micro-batch is large: that collapse
flatters tablecast here more than it would under a steady trickle. Both sides run warm, as a
pipeline that has been running does: before the rounds tablecast's session runs a stateless
table (unreported) and a first group_by (the *cold* row), and each round's Kafka Streams JVM
first drains the same job on another topic of the same size. tablecast's session then stays
up across the rounds while Kafka Streams starts a new JVM each round after one warm-up drain,
so tablecast's later rounds run warmer than Kafka Streams' do: that flatters tablecast.

The Kafka Streams row is the same job (`bench/peers/kafka-streams-iq`, `GroupByReduce`: a
KTable re-grouped with an adder and a subtractor, Jackson for the JSON, RocksDB, exactly-once
v2), on the same input and the same machine; its drain time runs from the first record through
its selector until its group has committed the end of the input and the repartition topic.

**Freshness** of a stateless table (`app.table(topic).materialize(...)`,
{fm["partitions"]}-partition input): a marker record every 100 ms, polled over HTTP on a
`tablecast serve` node until it answers, while {fm["load_per_s"]:,} records/s of background
load flow through the same table; *topic* is produce → the record in the table topic (a
consumer on it), *queryable* is produce → the node answers it.{grouped_text} Milliseconds:

| pipeline | trigger | samples (batches ended) | topic p50 | topic p99 | queryable p50 | queryable p90 | queryable p99 (max) | target |
|---|---|---|---|---|---|---|---|---|
{fresh_row(fm, "p99 ≤ 300 ms", 300)}
{fresh_row(fr, "p99 ≤ 25 ms", 25)}{grouped_row}

Real-time Mode (`App(trigger="realtime")`, Spark 4.3's `trigger(realTime=...)`, with the
4.2.0 Kafka connector) runs the query as long-running tasks, one per input partition, that
hold both task slots of local[2]. Every checkpoint interval the batch ends and the next
one starts; records produced in between wait for it (the max column: tens of ms on a quiet
machine, a few hundred ms under load; a 5 s interval put it into p90/p99, hence 30 s).
"""


def groupby_rounds(
    spark: Any, bootstrap: str, root: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The table group_by/reduce in tablecast and in Kafka Streams, alternated `args.rounds`
    times on fresh topics: the median run of each, and each round's tablecast ÷ Kafka
    Streams with its median and interquartile range."""
    from tablecast.pipeline.compile import query

    ours: list[dict[str, float]] = []
    apart: list[dict[str, float]] = []
    copies: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for i in range(args.rounds):
        name = f"groupby-reduce-{i}"
        ours.append(throughput(spark, bootstrap, root / name, name, args.records))
        # the same with the selector in a mapInArrow over every record, before the shuffle
        query.SELECT_IN_RETRACT = False
        try:
            name = f"groupby-reduce-apart-{i}"
            apart.append(throughput(spark, bootstrap, root / name, name, args.records))
        finally:
            query.SELECT_IN_RETRACT = True
        name = f"spark-copy-{i}"
        copies.append(spark_copy(spark, bootstrap, root / name, name, args.records))
        theirs.append(
            kafka_streams_groupby(bootstrap, root / f"ks{i}", args.records, f"bench-ks-groupby-{i}")
        )
        log.info(
            "round %d: tablecast %s, selector apart %s, spark copy %s, kafka streams %s",
            i + 1,
            ours[-1],
            apart[-1],
            copies[-1],
            theirs[-1],
        )
    rates = [r["rate"] for r in ours]
    return {
        "groupby-reduce": median_run(ours),
        "groupby-apart": median_run(apart),
        "spark-copy": median_run(copies),
        "ks-groupby": median_run(theirs),
        "groupby-rounds": {
            "tablecast": rates,
            "selector_apart": [r["rate"] for r in apart],
            "kafka_streams": [r["rate"] for r in theirs],
            "kafka_streams_cold": [r["cold_rate"] for r in theirs],
            "rate_iqr": ratio_spread([float(x) for x in rates])["ratio_iqr"],
            **ratio_spread([a / b["rate"] for a, b in zip(rates, theirs, strict=True)]),
            "fused": ratio_spread([a / b["rate"] for a, b in zip(rates, apart, strict=True)]),
            "spark_copy": [r["rate"] for r in copies],
            "of_copy": ratio_spread([a / b["rate"] for a, b in zip(rates, copies, strict=True)]),
        },
    }


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    return sorted(runs, key=lambda r: r["rate"])[len(runs) // 2]


#: the session of the real-time group_by row: task slots, not cores (a real-time task mostly
#: waits for records)
REALTIME_MASTER = "local[10]"


#: the --groupby-columns rows, run in this order each round: (key, the App's trigger, kind)
GROUPBY_COLUMNS_ROWS = (
    ("callables", "auto", "group_by"),
    ("columns", "auto", "group_by_columns"),
    ("columns-realtime", "realtime", "group_by_columns"),
)


#: the --realtime rows, run in this order each round: (key, the App's trigger, kind)
REALTIME_ROWS = (
    ("table", "auto", "table"),
    ("table-realtime", "realtime", "table"),
    ("aggregate", "auto", "aggregate"),
    ("aggregate-realtime", "realtime", "aggregate"),
)
#: their targets: (key, what, a percentile's key, ceiling in ms)
REALTIME_TARGETS = (
    ("table", "micro-batch p99", "p99_ms", 300),
    ("table-realtime", "Real-time Mode p99", "p99_ms", 25),
    ("table-realtime", "Real-time Mode max", "max_ms", 100),
    ("aggregate", "micro-batch p99", "p99_ms", 500),
    ("aggregate-realtime", "Real-time Mode p99", "p99_ms", 150),
)
#: their session: a real-time aggregation holds a slot per input partition and one per
#: shuffle partition, and its dead-letter companion one per input partition
REALTIME_ROWS_MASTER = "local[14]"


def freshness_rounds(
    spark: Any,
    bootstrap: str,
    root: Path,
    args: argparse.Namespace,
    rows: tuple[tuple[str, str, str], ...],
) -> list[dict[str, Any]]:
    """`args.rounds` alternating rounds of the freshness runs `rows` (key, trigger, kind)."""
    return [
        {
            key: freshness(
                spark,
                bootstrap,
                root / f"{key}{i}",
                args.seconds,
                args.load,
                trigger,
                kind,
                f"{key.replace('-', '')}{i}",
            )
            for key, trigger, kind in rows
        }
        for i in range(args.rounds)
    ]


def iqr(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [values[0], values[0]]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [q1, q3]


def freshness_table(rounds: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """A table row per run key: medians over the rounds, each round's p99 and markers."""

    def med(key: str, pct: str) -> int:
        return round(statistics.median(x[key]["queryable"][pct] for x in rounds))

    lines = []
    for key in keys:
        row = rounds[0][key]
        p99s = ", ".join(str(x[key]["queryable"]["p99_ms"]) for x in rounds)
        samples = ", ".join(str(x[key]["samples"]) for x in rounds)
        lines.append(
            f"| {row['pipeline']} | {row['trigger']} | {med(key, 'p50_ms')} | "
            f"{med(key, 'p90_ms')} | {med(key, 'p99_ms')} | {med(key, 'max_ms')} | {p99s} | "
            f"{samples} |"
        )
    return lines


def ks_line(ks: dict[str, Any]) -> str:
    """The Kafka Streams peer's row in a table of rounds: one run, after them."""
    k = ks["queryable"]
    return (
        f"| {ks['pipeline']} | {ks['trigger']} | {k['p50_ms']} | {k['p90_ms']} | "
        f"{k['p99_ms']} | {k['max_ms']} | {k['p99_ms']} (one run, after the rounds) | "
        f"{ks['samples']} |"
    )


def render_realtime(r: dict[str, Any], argv: str) -> str:
    rounds = r["rounds"]
    lines = freshness_table(rounds, [key for key, _, _ in REALTIME_ROWS])
    lines.append(ks_line(r["ks"]))
    verdicts = []
    for key, what, pct, ceiling in REALTIME_TARGETS:
        lo, hi = iqr([x[key]["queryable"][pct] for x in rounds])
        name = rounds[0][key]["pipeline"]
        verdicts.append(
            f"{name}, {what} ≤ {ceiling} ms: IQR {lo:.0f}–{hi:.0f}, "
            f"{settled_below([lo, hi], ceiling)}"
        )
    table, agg = rounds[0]["table-realtime"], rounds[0]["aggregate-realtime"]
    return f"""## Stateless table and grouped stream aggregate: micro-batch and Real-time Mode

`{argv}` — {facts_line(r["machine"])}. Two of the freshness rows, each in
micro-batches (the App's default trigger) and in Real-time Mode (checkpoint every 30 s), in
{len(rounds)} alternating rounds of {r["args"]["seconds"]:.0f} s each: the stateless table
(`app.table(topic).materialize(...)`, {table["partitions"]}-partition input) and a grouped
stream's `group_by_key().aggregate(F.sum(...))` (Spark's own streaming aggregation,
{agg["partitions"]}-partition input; markers are new keys). Spark {r["master"]} (task slots,
not cores: in real time the aggregation holds one per input partition and one per shuffle
partition, its dead-letter companion one per input partition), a single-node broker and one
`tablecast serve` node on the same 2 cores, under {table["load_per_s"]:,} records/s of
background load after {WARM_S:.0f} s of it; after the rounds, one run of the same table in
Kafka Streams (`bench/peers/kafka-streams-iq`: exactly-once, commits every 100 ms, no record
cache, read over its HTTP front). Produce → queryable, milliseconds, medians over the rounds:

| pipeline | trigger | p50 | p90 | p99 | max | p99 per round | markers per round |
|---|---|---|---|---|---|---|---|
{chr(10).join(lines)}

Targets, over the rounds: {"; ".join(verdicts)}.

Warm (after the load's first seconds). A marker is produced only once the previous one was
answered, so a stall (a real-time batch ending at its checkpoint interval, a long
micro-batch) holds one marker, which shows in the max, not in the p99. Each round's 30 s
of markers start 15 s after its query, so each real-time round holds one checkpoint end.
"""


def render_fold_throughput(r: dict[str, Any], argv: str) -> str:
    rounds = r["rounds"]
    rates = {k: [x[k]["rate"] for x in rounds] for k in ("callables", "columns")}
    ratio = ratio_spread([c / p for c, p in zip(rates["columns"], rates["callables"], strict=True)])
    lo, hi = ratio["ratio_iqr"]
    col_lo, col_hi = iqr([float(x) for x in rates["columns"]])

    def row(key: str, what: str) -> str:
        per = ", ".join(f"{v:,}" for v in rates[key])
        return f"| {what} | {round(statistics.median(rates[key])):,} | {per} |"

    return f"""## A table group_by's throughput: callables against Columns

`{argv}` — {facts_line(r["machine"])}. The table `group_by`/`reduce` of the
throughput runs (each row's n summed per group g) over {r["args"]["records"]:,} JSON records
on a {PARTITIONS}-partition input produced before the pipeline starts, Spark local[2],
micro-batches; records/s = records / (first micro-batch with input starts .. last one ends),
over the group_by's queries (the callable form's two, the Columns form's one).
{len(rounds)} alternating rounds on fresh topics:

| the fold | records/s (median) | per round |
|---|---|---|
{row("callables", "Python callables (two applyInPandasWithState queries)")}
{row("columns", "Columns (two JVM transformWithState operators, one query)")}

Columns ÷ callables per round: {ratio["ratio_median"]:.2f} (IQR {lo:.2f}–{hi:.2f}). Target:
≥ 100,000 records/s in micro-batches: Columns IQR {col_lo:,.0f}–{col_hi:,.0f},
{settled([col_lo, col_hi], 100_000)}.
The whole input is there when the pipeline starts, so the first micro-batches are large;
Spark, the broker and the producer share the 2 cores.
"""


def render_groupby_columns(r: dict[str, Any], argv: str) -> str:
    rounds = r["rounds"]
    first = rounds[0]["columns-realtime"]
    lines = freshness_table(rounds, [key for key, _, _ in GROUPBY_COLUMNS_ROWS])
    speed = {
        pct: ratio_spread(
            [x["callables"]["queryable"][pct] / x["columns"]["queryable"][pct] for x in rounds]
        )
        for pct in ("p50_ms", "p99_ms")
    }
    rt_p99 = [x["columns-realtime"]["queryable"]["p99_ms"] for x in rounds]
    mb_p99 = [x["columns"]["queryable"]["p99_ms"] for x in rounds]

    def spread(d: dict[str, Any]) -> str:
        lo, hi = d["ratio_iqr"]
        return f"{d['ratio_median']:.2f} (IQR {lo:.2f}–{hi:.2f})"

    if r.get("ks") is not None:
        lines.append(ks_line(r["ks"]))
    rt_lo, rt_hi = iqr(rt_p99)
    mb_lo, mb_hi = iqr(mb_p99)
    return f"""## A table group_by with Columns: micro-batch and Real-time Mode

`{argv}` — {facts_line(r["machine"])}. The freshness rows' table
`group_by`/`reduce` (markers are new groups) written twice: with Python callables (two
applyInPandasWithState queries, a repartition topic between them) and with Columns, which
Spark folds in the JVM (tablecast's two transformWithState operators in one query), in
micro-batches and in Real-time Mode; Spark {r["master"]} (task slots, not cores: a
real-time query holds one per input partition and one per shuffle partition of each
operator), a single-node broker and one `tablecast serve` node on the
same 2 cores, under {first["load_per_s"]:,} records/s of background load after {WARM_S:.0f} s
of it, {len(rounds)} alternating rounds of {r["args"]["seconds"]:.0f} s each. Produce →
queryable, milliseconds, medians over the rounds:

| pipeline | trigger | p50 | p90 | p99 | max | p99 per round | markers per round |
|---|---|---|---|---|---|---|---|
{chr(10).join(lines)}

Callables ÷ Columns in micro-batches, per round: p50 {spread(speed["p50_ms"])}, p99
{spread(speed["p99_ms"])}. Targets: micro-batch p99 ≤ 1,000 ms with Columns: IQR
{mb_lo:.0f}–{mb_hi:.0f}, {settled_below([mb_lo, mb_hi], 1000)}; Real-time Mode p99 ≤ 150 ms:
IQR {rt_lo:.0f}–{rt_hi:.0f}, {settled_below([rt_lo, rt_hi], 150)}.

Warm (after the load's first seconds). A marker is produced only once the previous one was
answered, so a stall (a real-time batch ending at its checkpoint interval, a long
micro-batch) holds one marker, which shows in the max, not in the p99. The micro-batch
rows run on {r["master"]} here, not local[2]: with 2-partition inputs their tasks and shuffle
partitions are the same, but the callables' two queries may run tasks at once.
"""


@contextmanager
def stack(prefix: str, master: str = "local[2]") -> Iterator[tuple[Path, str, Any]]:
    """A throwaway broker and one SparkSession (local[2] unless `master` says otherwise):
    (work dir, bootstrap, session)."""
    from tablecast.kafka.broker import Broker, free_port
    from tablecast.pipeline.run.spark import session

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(tmp)
        broker = Broker(root / "kafka", free_port())
        broker.start()
        try:
            spark = session("tablecast-bench", master, shuffle_partitions=PARTITIONS)
            try:
                yield root, broker.bootstrap_servers, spark
            finally:
                spark.stop()
        finally:
            broker.stop()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench pipeline")
    parser.add_argument("--records", type=int, default=1_000_000)
    # two real-time checkpoints (30 s) fall in the default window
    parser.add_argument("--seconds", type=float, default=70.0, help="freshness run length")
    parser.add_argument("--load", type=int, default=2000, help="background records/s")
    parser.add_argument("--rounds", type=int, default=7, help="group_by rounds (each side)")
    parser.add_argument(
        "--demo", action="store_true", help="only the demo's produce-to-answer latency"
    )
    parser.add_argument("--markers", type=int, default=DEMO_MARKERS, help="the demo's markers")
    parser.add_argument(
        "--freshness", action="store_true", help="only the freshness rows (stateless, group_by)"
    )
    parser.add_argument(
        "--groupby-columns",
        action="store_true",
        help="only the table group_by with callables against Columns, micro-batch and real "
        f"time, in alternating rounds ({REALTIME_MASTER})",
    )
    parser.add_argument(
        "--realtime",
        action="store_true",
        help="only the stateless table and the grouped stream's Spark aggregate, micro-batch "
        f"and real time, in alternating rounds ({REALTIME_ROWS_MASTER})",
    )
    parser.add_argument(
        "--fold-throughput",
        action="store_true",
        help="only the table group_by's records/s, callables against Columns, alternating",
    )
    common.add_quick(parser)
    args = parser.parse_args(argv)
    if common.quick(args):
        args.records, args.seconds, args.rounds, args.markers = 100_000, 10.0, 2, 10
    if args.groupby_columns:
        # a real-time group_by holds a task slot per input partition and one per shuffle
        # partition of each of its operators, for its whole batches: more than local[2] has
        with stack("tc-bench-gbcol-", REALTIME_MASTER) as (root, bootstrap, spark):
            result = {"machine": machine(), "args": vars(args), "master": REALTIME_MASTER}
            result["rounds"] = freshness_rounds(spark, bootstrap, root, args, GROUPBY_COLUMNS_ROWS)
            result["ks"] = ks_freshness(
                bootstrap, root / "ks", args.seconds, args.load, group_by=True
            )
        publish("pipeline-groupby-columns", result, render_groupby_columns(result, command()))
        return
    if args.realtime:
        with stack("tc-bench-realtime-", REALTIME_ROWS_MASTER) as (root, bootstrap, spark):
            result = {"machine": machine(), "args": vars(args), "master": REALTIME_ROWS_MASTER}
            result["rounds"] = freshness_rounds(spark, bootstrap, root, args, REALTIME_ROWS)
            result["ks"] = ks_freshness(bootstrap, root / "ks", args.seconds, args.load)
        publish("pipeline-realtime", result, render_realtime(result, command()))
        return
    if args.fold_throughput:
        with stack("tc-bench-foldrate-") as (root, bootstrap, spark):
            result = {"machine": machine(), "args": vars(args)}
            # JIT and Python workers warm up on a first, unreported run of each form
            for name in ("fold-warm", "fold-columns-warm"):
                throughput(spark, bootstrap, root / name, name, 200_000)
            result["rounds"] = [
                {
                    "callables": throughput(
                        spark, bootstrap, root / f"fold-py-{i}", f"fold-py-{i}", args.records
                    ),
                    "columns": throughput(
                        spark, bootstrap, root / f"fold-col-{i}", f"fold-columns-{i}", args.records
                    ),
                }
                for i in range(args.rounds)
            ]
        publish("pipeline-fold-throughput", result, render_fold_throughput(result, command()))
        return
    if args.freshness:
        with stack("tc-bench-fresh-") as (root, bootstrap, spark):
            result = {"machine": machine(), "args": vars(args)}
            result.update(freshness_rows(spark, bootstrap, root, args, before=True))
            result["freshness-ks"] = ks_freshness(bootstrap, root / "ks", args.seconds, args.load)
        publish("pipeline-freshness", result, render_freshness(result, command()))
        return
    if args.demo:
        from tablecast import jvm

        jvm.use_quick_jvm()  # the broker's and Spark's JVM options as `tablecast demo` has them
        with stack("tc-bench-demo-") as (root, bootstrap, spark):
            runs = [
                demo_freshness(spark, bootstrap, root / "demo", args.markers),
                demo_freshness(spark, bootstrap, root / "demo-py", args.markers, True),
            ]
        m = machine()
        publish("pipeline-demo", {"machine": m, "runs": runs}, render_demo(runs, command(), m))
        return

    with stack("tc-bench-pipeline-") as (root, bootstrap, spark):
        result: dict[str, Any] = {"machine": machine(), "args": vars(args)}
        result["load_before"] = [round(x, 1) for x in os.getloadavg()]
        # JIT and Python workers warm up on a first, unreported run
        throughput(spark, bootstrap, root / "warm", "warmup", 200_000)
        # and on a first group_by, reported apart: the cold figure of a fresh session
        result["groupby-cold"] = throughput(
            spark, bootstrap, root / "gb-warm", "groupby-cold", args.records
        )
        for name in ("stateless", "stateless-python"):
            result[name] = throughput(spark, bootstrap, root / name, name, args.records)
        result.update(groupby_rounds(spark, bootstrap, root, args))
        result.update(freshness_rows(spark, bootstrap, root, args))
    result["load_after"] = [round(x, 1) for x in os.getloadavg()]
    publish("pipeline", result, render(result, command()))


#: the freshness rows: (result key, the App's trigger, the pipeline's kind in KINDS)
FRESHNESS = (
    ("freshness", "auto", "table"),
    ("freshness-realtime", "realtime", "table"),
    ("freshness-groupby", "auto", "group_by"),
)
#: rows of --freshness alone: the other stateful pipelines
MORE_FRESHNESS = (
    ("freshness-aggregate", "auto", "aggregate"),
    ("freshness-window", "auto", "window"),
    ("freshness-join", "auto", "join"),
)


def freshness_rows(
    spark: Any, bootstrap: str, root: Path, args: argparse.Namespace, before: bool = False
) -> dict[str, Any]:
    """Every freshness row (`before`: first the stateless table on the tick every query had
    until the App's default chose per query, for a same-run comparison)."""
    rows = (
        (("freshness-500ms", "500 milliseconds", "table"), *FRESHNESS, *MORE_FRESHNESS)
        if before
        else FRESHNESS
    )
    return {
        key: freshness(spark, bootstrap, root / key, args.seconds, args.load, trigger, kind, key)
        for key, trigger, kind in rows
    }


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(sys.argv[1:])
