"""What a micro-batch of a stateful pipeline spends writing its checkpoint.

``python -m bench checkpoints [--quick] [--seconds S] [--rate R] [--rounds N]``: a
throwaway broker, one tablecast SparkSession (local[2]), and a table
``group_by``/``reduce`` (two stateful queries chained by a repartition topic) under
a steady trickle of R records/s for S seconds, once with Spark's default checkpoint
manager (Hadoop's FileContext, whose local file system runs ``readlink`` as a child
process for each name of every rename) and once with the one tablecast chooses for a
local checkpoint (FileSystem-based: a temporary file, one ``rename(2)``), alternated
N times on fresh topics after an unreported warm-up run. Per run, from Spark's progress reports of both queries'
micro-batches with data (the first 5 left out: query start, JIT): the median of the
WAL write (offsets file), the commit (commits file) and the whole micro-batch.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench import common
from bench.common import (
    command,
    facts_line,
    machine,
    publish,
    ratio_spread,
    settled,
)

log = logging.getLogger("bench.checkpoints")

PARTITIONS = 4
#: progress of the first micro-batches is left out: query start and a cold JIT
SKIP = 5
PHASES = ("walCommit", "commitOffsets", "triggerExecution")
SIDES = ("spark_default", "tablecast")


def trickle_run(
    spark: Any, bootstrap: str, root: Path, name: str, side: str, args: argparse.Namespace
) -> dict[str, Any]:
    from confluent_kafka import Producer

    import tablecast as tc
    from tablecast.contract.partitioner import PRODUCER_CONFIG
    from tablecast.kafka.topics import ensure_topic
    from tablecast.pipeline.run import checkpoints

    topic = f"bench-{name}"
    ensure_topic(bootstrap, topic, PARTITIONS)
    app = tc.App(f"bench{name.replace('-', '')}", state_dir=root / name)
    rows = app.table(topic, key=tc.serde.string(), value=tc.serde.json())
    rows.group_by(lambda k, v: (v["g"], v["n"]), value=tc.serde.long()).reduce(
        lambda a, b: a + b, lambda a, b: a - b
    ).materialize("t")
    chosen = checkpoints._fs_manager
    if side == "spark_default":  # as if the file system were not the raw one: no choice made
        checkpoints._fs_manager = lambda _spark: None  # type: ignore[assignment]
    try:
        pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    finally:
        checkpoints._fs_manager = chosen  # type: ignore[assignment]
    manager = spark.conf.get(checkpoints.MANAGER_KEY, None)
    if (manager is not None) != (side == "tablecast"):
        raise RuntimeError(f"{name}: wanted {side}, the session's manager is {manager}")
    try:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **PRODUCER_CONFIG})
        burst = max(1, args.rate // 10)  # every 100 ms
        started, i = time.monotonic(), 0
        while time.monotonic() - started < args.seconds:
            t = time.monotonic()
            for _ in range(burst):
                value = orjson.dumps({"g": f"g{i % 50}", "n": i % 7})
                p.produce(topic, key=f"k{i % 5000}".encode(), value=value)
                i += 1
            p.poll(0)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - t)))
        p.flush(30)
        pipeline.process_all_available()
        phases: dict[str, list[float]] = {k: [] for k in PHASES}
        for q in pipeline.queries.values():
            done = [x for x in q.recentProgress if x["numInputRows"] > 0][SKIP:]
            for k in PHASES:
                phases[k].extend(float(x["durationMs"].get(k, 0)) for x in done)
    finally:
        pipeline.stop()
    if not phases["triggerExecution"]:
        raise RuntimeError(f"{name}: no micro-batch with data after the first {SKIP}")
    result = {k: statistics.median(v) for k, v in phases.items()}
    result["batches"] = len(phases["triggerExecution"])
    result["records"] = i
    log.info("%s (%s): %s", name, side, result)
    return result


def render(r: dict[str, Any], cmd: str) -> str:
    runs = r["runs"]

    def med(side: str, k: str) -> float:
        return statistics.median(x[k] for x in runs[side])

    def per_round(side: str) -> str:
        return ", ".join(f"{x['triggerExecution']:,.0f}" for x in runs[side])

    spread = r["batch_ratio"]
    lo, hi = spread["ratio_iqr"]
    rows = "\n".join(
        f"| {label} | {med(side, 'walCommit'):.1f} | {med(side, 'commitOffsets'):.1f} | "
        f"{med(side, 'triggerExecution'):,.0f} | "
        f"{per_round(side)} |"
        for side, label in (
            ("spark_default", "Spark's default (FileContext)"),
            ("tablecast", "tablecast's choice (FileSystem-based, no checksums)"),
        )
    )
    a = r["args"]
    return f"""## Checkpoint writes of a stateful pipeline

`{cmd}` — {facts_line(r["machine"])}. Spark local[2], a single-node broker on the same
machine. A table `group_by`/`reduce` (two stateful queries chained by a repartition topic;
500 ms micro-batches) under a steady trickle of {a["rate"]:,} records/s over 5,000 rows for
{a["seconds"]:.0f} s, checkpointing to a local disk, once per checkpoint manager in each of
{len(runs["tablecast"])} alternating rounds (the order flips each round), each run on a fresh
topic. Per run, the median over both queries' micro-batches with data (the first {SKIP} left
out), milliseconds. Load average (1/5/15 min) before: {r["load_before"]}, after:
{r["load_after"]}.

| checkpoint manager | WAL write | commit | micro-batch | micro-batch per round |
|---|---|---|---|---|
{rows}

A micro-batch with tablecast's choice ÷ with Spark's default, per round: median
{spread["ratio_median"]:.2f}, interquartile range {lo:.2f}–{hi:.2f} (target < 1:
{settled([1 / hi, 1 / lo], 1.0)}). Spark's default renames each checkpoint file through
Hadoop's FileContext, whose local file system runs `readlink` as a child process for each
name; tablecast's writes a temporary file and renames it with one `rename(2)`. The
state stores' change files are checkpoint files too, so a stateful micro-batch writes
several per partition. What could flatter us: both sides run in one Spark session (the
default manager's runs share the local file system without checksums that tablecast sets, so only the
manager differs); a trickle makes fixed per-batch costs the bulk of a batch, as in a
steady pipeline but not in a backlog's first large batch.
"""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench checkpoints")
    parser.add_argument("--seconds", type=float, default=40.0, help="trickle per run")
    parser.add_argument("--rate", type=int, default=400, help="records/s of the trickle")
    parser.add_argument("--rounds", type=int, default=7)
    common.add_quick(parser)
    args = parser.parse_args(argv)
    if common.quick(args):
        args.seconds, args.rounds = 25.0, 2
    from tablecast.kafka.broker import Broker, free_port
    from tablecast.pipeline.run.spark import session

    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    result: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    result["load_before"] = [round(x, 1) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="tc-bench-checkpoints-") as tmp:
        root = Path(tmp)
        broker = Broker(root / "kafka", free_port())
        broker.start()
        spark = session("tablecast-bench-checkpoints", "local[2]", shuffle_partitions=PARTITIONS)
        try:
            # the JIT and Python workers warm up on a first, unreported run
            warm = argparse.Namespace(**{**vars(args), "seconds": 20.0})
            trickle_run(spark, broker.bootstrap_servers, root, "ck-warmup", "tablecast", warm)
            for i in range(args.rounds):
                for side in SIDES if i % 2 == 0 else reversed(SIDES):
                    runs[side].append(
                        trickle_run(
                            spark, broker.bootstrap_servers, root, f"ck-{side}-{i}", side, args
                        )
                    )
                log.info("round %d of %d done", i + 1, args.rounds)
        finally:
            spark.stop()
            broker.stop()
    result["load_after"] = [round(x, 1) for x in os.getloadavg()]
    result["runs"] = runs
    result["batch_ratio"] = ratio_spread(
        [
            ours["triggerExecution"] / theirs["triggerExecution"]
            for ours, theirs in zip(runs["tablecast"], runs["spark_default"], strict=True)
        ]
    )
    publish("checkpoints", result, render(result, command()))


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(sys.argv[1:])
