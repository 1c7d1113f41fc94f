"""Pipeline throughput and freshness on Spark local[2] (issue 5).

``python -m bench pipeline [--records N] [--seconds S]`` (or
``python -m bench.pipeline``): a throwaway broker, one SparkSession, and

- throughput through a stateless table (a Column filter; and, for
  comparison, a Python callable) and through a table group_by/reduce (two
  queries chained by a repartition topic): N records are produced first, then
  the pipeline starts and drains them; records/s = N / (first batch start ..
  last batch end), from Spark's own progress reports;
- freshness, produce to queryable: a `tablecast serve` node follows the
  stateless table while a background producer adds load; every 100 ms one
  marker key is produced and polled over HTTP until the node answers it.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import command, facts_line, machine, save, verdict, write_section

log = logging.getLogger("bench.pipeline")

PARTITIONS = 4
GROUPS = 100
QUICK_ARGS = ["--records", "100000", "--seconds", "10"]


def produce(bootstrap: str, topic: str, n: int, keys: int, start: int = 0) -> None:
    from confluent_kafka import Producer

    from tablecast.kafka.partitioner import PRODUCER_CONFIG

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
        while True:
            try:
                p.produce(topic, key=f"k{i % keys}".encode(), value=value)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


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
    else:
        rows.group_by(lambda k, v: (v["g"], v["n"]), value=tc.serde.long()).reduce(
            lambda a, b: a + b, lambda a, b: a - b
        ).materialize("t")
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


def freshness(spark: Any, bootstrap: str, state: Path, seconds: float, load: int) -> dict[str, Any]:
    import tablecast as tc
    from tablecast.kafka.partitioner import PRODUCER_CONFIG
    from tablecast.kafka.topics import ensure_topic
    from tests.support.procs import start_node

    topic = "bench-fresh"
    ensure_topic(bootstrap, topic, PARTITIONS)
    app = tc.App("benchfresh", state_dir=state)  # the default trigger (500 ms)
    app.table(topic, key=tc.serde.string(), value=tc.serde.json()).materialize("fresh")
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    node = start_node(app.id, bootstrap, state, "--data-dir", str(state / "node"))
    stop = threading.Event()
    try:
        node.wait_ready(180)
        from confluent_kafka import Producer

        def background() -> None:
            p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **PRODUCER_CONFIG})
            i = 0
            while not stop.is_set():
                t = time.monotonic()
                for _ in range(load // 20):
                    p.produce(topic, key=f"bg{i % 10000}".encode(), value=b'{"n": 1}')
                    i += 1
                p.poll(0)
                stop.wait(max(0.0, 0.05 - (time.monotonic() - t)))
            p.flush(10)

        bg = threading.Thread(target=background, daemon=True)
        bg.start()
        marker = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **PRODUCER_CONFIG})
        client = httpx.Client(base_url=node.url, timeout=5)
        latencies: list[float] = []
        deadline = time.monotonic() + seconds
        i = 0
        time.sleep(2)  # let the first batches with background load pass
        while time.monotonic() < deadline:
            key = f"m{i}"
            i += 1
            t0 = time.monotonic()
            marker.produce(topic, key=key.encode(), value=orjson.dumps({"i": i}))
            marker.flush(5)
            while client.get(f"/v1/tables/fresh/keys/{key}").status_code != 200:
                if time.monotonic() - t0 > 30:
                    raise TimeoutError(f"marker {key} never became queryable")
                time.sleep(0.005)
            latencies.append(time.monotonic() - t0)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))
        latencies.sort()
        pct = {p: round(latencies[int(len(latencies) * p / 100)] * 1000) for p in (50, 90, 99)}
        return {
            "samples": len(latencies),
            "load_per_s": load,
            "p50_ms": pct[50],
            "p90_ms": pct[90],
            "p99_ms": pct[99],
            "max_ms": round(latencies[-1] * 1000),
        }
    finally:
        stop.set()
        node.stop()
        pipeline.stop()


def render(r: dict[str, Any], argv: str) -> str:
    s, py, g, f = r["stateless"], r["stateless-python"], r["groupby-reduce"], r["freshness"]
    return f"""
## Pipeline (issue 5)

`{argv}` — {facts_line(r["machine"])}. Spark local[2]
(PySpark 4.3, Kafka connector 4.2), a single-node KRaft broker on the same machine,
{PARTITIONS}-partition input of {s["records"]:,} JSON records (~70 bytes, {s["records"] // 10:,}
keys) produced before the pipeline starts, after an unreported warm-up run. Rate = records / (first micro-batch start .. last
micro-batch end) from Spark's progress reports; wall time includes starting the queries.
Load average (1/5/15 min) before: {r["load_before"]}, after: {r["load_after"]} — this
machine is shared, and Spark, the broker and the node all run on its 2 cores.

| pipeline | records/s | drain s | wall s | target |
|---|---|---|---|---|
| stateless table: `filter(Column)` | {s["rate"]:,} | {s["seconds"]} | {s["wall_seconds_with_query_start"]} | ≥ 100,000: {verdict(s["rate"] >= 100_000)} |
| stateless table: `filter(python callable)` | {py["rate"]:,} | {py["seconds"]} | {py["wall_seconds_with_query_start"]} | (for comparison) |
| table `group_by` / `reduce` (2 queries, repartition topic) | {g["rate"]:,} | {g["seconds"]} | {g["wall_seconds_with_query_start"]} | ≥ 30,000: {verdict(g["rate"] >= 30_000)} |

**Freshness, produce to queryable**: a marker record every 100 ms, polled over HTTP on a
`tablecast serve` node until it answers, while {f["load_per_s"]:,} records/s of background
load flow through the same table (default trigger, 500 ms): {f["samples"]} samples,
p50 {f["p50_ms"]} ms, p90 {f["p90_ms"]} ms, p99 {f["p99_ms"]} ms (max {f["max_ms"]} ms) —
target p99 ≤ 2 s: {verdict(f["p99_ms"] <= 2000)}.
"""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench pipeline")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=30.0, help="freshness run length")
    parser.add_argument("--load", type=int, default=2000, help="background records/s")
    args = parser.parse_args(argv)
    from tablecast.kafka.broker import Broker, free_port
    from tablecast.pipeline.spark import session

    with tempfile.TemporaryDirectory(prefix="tc-bench-pipeline-") as tmp:
        root = Path(tmp)
        broker = Broker(root / "kafka", free_port())
        broker.start()
        spark = session("tablecast-bench", "local[2]", shuffle_partitions=PARTITIONS)
        try:
            result: dict[str, Any] = {"machine": machine(), "args": vars(args)}
            result["load_before"] = [round(x, 1) for x in os.getloadavg()]
            # JIT and Python workers warm up on a first, unreported run
            throughput(spark, broker.bootstrap_servers, root / "warm", "warmup", 200_000)
            for name in ("stateless", "stateless-python", "groupby-reduce"):
                result[name] = throughput(
                    spark, broker.bootstrap_servers, root / name, name, args.records
                )
            result["freshness"] = freshness(
                spark, broker.bootstrap_servers, root / "fresh", args.seconds, args.load
            )
        finally:
            spark.stop()
            broker.stop()
    result["load_after"] = [round(x, 1) for x in os.getloadavg()]
    save("pipeline", result)
    write_section("pipeline", render(result, command()))
    print(render(result, command()))


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(sys.argv[1:])
