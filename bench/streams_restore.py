"""A Kafka Streams store's changelog restored by Kafka Streams itself and by a tablecast node
that serves it attached: ``python -m bench streams_restore [--rows 5000000] [--rounds 7]``.

The store is the IQ peer's (bench/peers/kafka-streams-iq: a KTable over its input topic
in RocksDB, Kafka Streams 4.2, one stream thread), whose changelog is its input topic
(Kafka Streams reuses a table's source topic as its changelog), compacted, 12 partitions,
string keys and 100-byte JSON values. The peer processes it once and stops cleanly, so
its group holds the end; the topic is attached to a tablecast app (``tablecast.attach``,
no pipeline). Then, alternating, on core 0 each: a new tablecast node with an empty data
directory, start → ``/readyz`` 200 with every record applied; a new instance of the
Kafka Streams app with an empty state directory, start → its store caught up with the
topic (what its interactive queries then answer). The ratio per round is Kafka Streams'
seconds ÷ tablecast's (≥ 1: tablecast ready no later).
"""

from __future__ import annotations

import argparse
import logging
import statistics
from typing import Any

from bench.anchors import on_load_core
from bench.common import (
    command,
    facts_line,
    machine,
    ratio_spread,
    save,
    settled,
    write_section,
)
from bench.peers import kafka_streams as ks
from bench.recovery import fresh, ks_fresh, ks_seed
from bench.stack import Stack

log = logging.getLogger("bench")
APP = "recovery"  # the node's app: bench.recovery's fresh() starts nodes of this app
TABLE = "points"
PARTITIONS = 12
#: `python -m bench all --quick`: a test of the harness, not figures
QUICK_ARGS = ["--rows", "200000", "--rounds", "2"]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench streams_restore")
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    from tablecast.kafka.attach import attach
    from tablecast.kafka.topics import COMPACTED

    r: dict[str, Any] = {"machine": machine(), "command": command(), "args": vars(args)}
    ks.build()
    with Stack() as stack, on_load_core():
        topic = "streams-restore-input"
        stack.topic(topic, PARTITIONS, COMPACTED)
        app_id = ks_seed(stack, topic, stack.dir / "ks-seed", args.rows)
        attach(TABLE, app=APP, topic=topic, bootstrap_servers=stack.bootstrap)
        r["tablecast"], r["kafka_streams"] = [], []
        for i in range(args.rounds):
            r["tablecast"].append(fresh(stack, stack.dir / f"node-{i}", args.rows))
            r["kafka_streams"].append(
                ks_fresh(stack, topic, app_id, stack.dir / f"ks-{i}", args.rows)
            )
            log.info(
                "round %d: tablecast %.1f s, kafka streams %.1f s",
                i + 1,
                r["tablecast"][-1]["wall_s"],
                r["kafka_streams"][-1]["wall_s"],
            )
    r["ratios"] = ratio_spread(
        [k["wall_s"] / t["wall_s"] for t, k in zip(r["tablecast"], r["kafka_streams"], strict=True)]
    )
    save("streams_restore", r)
    write_section("streams_restore", render(r))


def render(r: dict[str, Any]) -> str:
    rows = r["args"]["rows"]
    ours = [t["wall_s"] for t in r["tablecast"]]
    theirs = [k["wall_s"] for k in r["kafka_streams"]]
    sp = r["ratios"]
    lo, hi = sp["ratio_iqr"]
    per_round = "; ".join(f"{a:.1f} / {b:.1f}" for a, b in zip(ours, theirs, strict=True))
    return f"""## A Kafka Streams changelog restored: tablecast against Kafka Streams

`{r["command"]}` — {facts_line(r["machine"])}.

The IQ peer's store (a KTable in RocksDB, Kafka Streams 4.2, one stream thread), whose
changelog is its source topic: {rows:,} records, 12 partitions, compacted, string keys,
100-byte JSON values. Attached to a tablecast app with `tablecast.attach` (no pipeline).
Alternating rounds on core 0, each from an empty state: a tablecast node, start →
`/readyz` 200 with every record applied; a new Kafka Streams instance, start → its store
caught up with the topic.

| | median seconds | records/s |
|---|---|---|
| tablecast node | {statistics.median(ours):.1f} | {rows / statistics.median(ours):,.0f} |
| Kafka Streams | {statistics.median(theirs):.1f} | {rows / statistics.median(theirs):,.0f} |

Kafka Streams' seconds ÷ tablecast's per round: median **{sp["ratio_median"]:.2f}** (IQR
{lo:.2f}–{hi:.2f}); target ≥ 1 (tablecast ready no later): {settled(sp["ratio_iqr"], 1.0)}.
Each round, tablecast / Kafka Streams seconds: {per_round}. Both read from the same broker
on this machine's other core; both JVM and Python processes start cold each round, so
start-up is in both figures (the JVM's is in Kafka Streams').
"""
