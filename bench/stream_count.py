"""A grouped stream's count: Spark's own aggregation against the Python per-key step.

``python -m bench stream_count [--quick] [--records N] [--rounds R] [--seconds S]``:
a throwaway broker, one SparkSession (local[4]: a real-time count holds a task
slot per input partition and per shuffle partition, and its dead-letter
companion one per input partition), and

- throughput of ``stream.group_by_key().count()``: N JSON records produced
  first, then the pipeline drains them (records/s from Spark's progress, as
  ``bench pipeline``), once as Spark's aggregation and once with the count kept
  by the per-key Python step (what a checkpoint of an earlier tablecast keeps;
  set up here by recording that engine in the query's checkpoint), alternated
  R times on fresh topics;
- freshness: a marker record every 100 ms on a 1-partition input under
  background load; produce -> its count in the table topic, micro-batch
  (500 ms) and Real-time Mode.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.common import command, facts_line, machine, publish, ratio_spread
from bench.pipeline import TopicWatch, background_load, drained_rate, percentiles, produce

log = logging.getLogger("bench.stream_count")

PARTITIONS = 4
MASTER = "local[4]"


def _app(name: str, state: Path, topic: str, trigger: str) -> Any:
    import tablecast as tc

    app = tc.App(name, state_dir=state, trigger=trigger)
    app.stream(
        topic, key=tc.serde.string(), value=tc.serde.json()
    ).group_by_key().count().materialize("counts")
    return app


def _keep_in_python(app: Any) -> None:
    """Record in the count query's checkpoint that Python keeps its state: the runner then
    plans the per-key Python step (as for a checkpoint an earlier tablecast wrote)."""
    from tablecast.pipeline.run.layout import Files, settle

    base = app.resolve_checkpoint_dir().rstrip("/")
    name = f"{app.id}.counts"
    settle(Files(), f"{base}/{name}", PARTITIONS, name, windowed=False)


def throughput(
    spark: Any, bootstrap: str, root: Path, name: str, n: int, engine: str
) -> dict[str, float]:
    from tablecast.kafka.topics import ensure_topic

    topic = f"bench-{name}"
    ensure_topic(bootstrap, topic, PARTITIONS)
    produce(bootstrap, topic, n, keys=n // 10)
    app = _app(f"bench{name.replace('-', '')}", root / name, topic, "500 milliseconds")
    if engine == "python":
        _keep_in_python(app)
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    try:
        # Spark's count comes with its dead-letter companion, the Python step without
        native = f"{app.id}.counts.dlq" in pipeline.queries
        if native != (engine == "spark"):
            raise RuntimeError(f"{name}: wanted {engine}, runs {sorted(pipeline.queries)}")
        pipeline.process_all_available()
        counting = [q for n_, q in pipeline.queries.items() if not n_.endswith(".dlq")]
        result = drained_rate(counting, n)
    finally:
        pipeline.stop()
    log.info("%s (%s): %s", name, engine, result)
    return result


def freshness(
    spark: Any, bootstrap: str, root: Path, seconds: float, load: int, trigger: str
) -> dict[str, Any]:
    """Produce -> the marker's count in the table topic, under `trigger`."""
    from confluent_kafka import Producer

    from tablecast.contract.partitioner import PRODUCER_CONFIG
    from tablecast.kafka.topics import ensure_topic, table_topic

    mode = "rt" if trigger.startswith("realtime") else "mb"
    topic = f"bench-count-fresh-{mode}"
    ensure_topic(bootstrap, topic, 1)
    app = _app(f"benchcount{mode}", root / mode, topic, trigger)
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    chosen = pipeline.triggers[f"{app.id}.counts"]
    if chosen.realtime != (mode == "rt"):
        raise RuntimeError(f"asked for {trigger!r}, the count runs {chosen.describe()}")
    watch = TopicWatch(bootstrap, table_topic(app.id, "counts"))
    stop = threading.Event()

    bg = threading.Thread(target=background_load, args=(bootstrap, topic, load, stop), daemon=True)
    try:
        bg.start()
        marker = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **PRODUCER_CONFIG})
        time.sleep(5)  # the first batches with background load
        sent: dict[bytes, float] = {}
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            key = f"m{i}".encode()
            i += 1
            t0 = time.monotonic()
            marker.produce(topic, key=key, value=b'{"n": 1}')
            marker.flush(5)
            sent[key] = t0
            time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))
        time.sleep(5)  # the last markers' counts
        seen = [watch.seen[k] - t0 for k, t0 in sent.items() if k in watch.seen]
        return {
            "trigger": chosen.describe(),
            "samples": len(seen),
            "sent": len(sent),
            "load_per_s": load,
            "topic": percentiles(seen),
        }
    finally:
        stop.set()
        bg.join(15)
        watch.close()
        pipeline.stop()


def render(r: dict[str, Any], argv: str) -> str:
    rounds = r["rounds"]
    spark_rates, py_rates = rounds["spark"], rounds["python"]
    lo, hi = rounds["ratio_iqr"]

    def med(xs: list[int]) -> int:
        return sorted(xs)[len(xs) // 2]

    rows = []
    for f in (r["freshness"], r["freshness-realtime"]):
        t = f["topic"]
        rows.append(
            f"| {f['trigger']} | {f['samples']} of {f['sent']} | {t['p50_ms']} | {t['p90_ms']} "
            f"| {t['p99_ms']} | {t['max_ms']} |"
        )
    fresh_rows = "\n".join(rows)
    return f"""
## Grouped stream count: Spark's aggregation

`{argv}` — {facts_line(r["machine"])}. Spark {MASTER} (task slots, not cores: a
real-time count holds one per input partition and one per shuffle partition, its
dead-letter companion one per input partition), a single-node broker on the same machine.
Load average (1/5/15 min) before: {r["load_before"]}, after: {r["load_after"]}.

**Throughput** of `app.stream(t).group_by_key().count()` on a {PARTITIONS}-partition input
of {r["args"]["records"]:,} JSON records ({r["args"]["records"] // 10:,} keys) produced before
the pipeline starts; records/s = records / (first micro-batch start .. last micro-batch end)
of the count query (its dead-letter companion reads the same input beside it, on the same
cores). {len(spark_rates)} alternating rounds on fresh topics, each path once per round:

| count kept by | records/s (median) | per round |
|---|---|---|
| Spark's streaming aggregation (this change) | {med(spark_rates):,} | {", ".join(f"{x:,}" for x in spark_rates)} |
| the per-key Python step (applyInPandasWithState) | {med(py_rates):,} | {", ".join(f"{x:,}" for x in py_rates)} |

Spark ÷ Python per round: median {rounds["ratio_median"]:.2f}, interquartile range
{lo:.2f}–{hi:.2f}. The whole input is there when the pipeline starts, so the first
micro-batch is large: both paths see the same batches.

**Freshness**: a marker record (a new key) every 100 ms on a 1-partition input, under
{r["freshness"]["load_per_s"]:,} records/s of background load; produce → the marker's count
in the table topic (a consumer on it), milliseconds:

| trigger | samples | p50 | p90 | p99 | max |
|---|---|---|---|---|---|
{fresh_rows}

What could flatter or hurt: the Spark path's rate is its count query's alone, while its
dead-letter companion reads the same input on the same cores (its drain is not waited
for); the first round of each path ran colder than the rest; the micro-batch interval is 500 ms; Real-time Mode's batch ends
every 30 s (records produced in that gap wait for the next batch: the max column); one
machine runs Spark, the broker, the producers and the consumer.
"""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench stream_count")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=40.0, help="freshness run length")
    parser.add_argument("--load", type=int, default=2000, help="background records/s")
    parser.add_argument("--quick", action="store_true", help="small; not into BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.quick:
        common.use_scratch_output()
        args.records, args.rounds, args.seconds = 100_000, 2, 10.0
    from tablecast.kafka.broker import Broker, free_port
    from tablecast.pipeline.run.spark import session

    with tempfile.TemporaryDirectory(prefix="tc-bench-count-") as tmp:
        root = Path(tmp)
        broker = Broker(root / "kafka", free_port())
        broker.start()
        spark = session("tablecast-bench-count", MASTER, shuffle_partitions=PARTITIONS)
        bootstrap = broker.bootstrap_servers
        try:
            result: dict[str, Any] = {"machine": machine(), "args": vars(args)}
            result["load_before"] = [round(x, 1) for x in os.getloadavg()]
            throughput(spark, bootstrap, root, "count-warmup", 100_000, "spark")
            rates: dict[str, list[int]] = {"spark": [], "python": []}
            for i in range(args.rounds):
                for engine in ("spark", "python"):
                    name = f"count-{engine}-{i}"
                    r = throughput(spark, bootstrap, root, name, args.records, engine)
                    rates[engine].append(int(r["rate"]))
            ratios = [a / b for a, b in zip(rates["spark"], rates["python"], strict=True)]
            result["rounds"] = {**rates, **ratio_spread(ratios)}
            for key, trigger in (
                ("freshness", "500 milliseconds"),
                ("freshness-realtime", "realtime"),
            ):
                result[key] = freshness(spark, bootstrap, root, args.seconds, args.load, trigger)
        finally:
            spark.stop()
            broker.stop()
    result["load_after"] = [round(x, 1) for x in os.getloadavg()]
    publish("stream_count", result, render(result, command()))


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(sys.argv[1:])
