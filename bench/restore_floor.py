"""The least a restore costs in Python: a changelog's records consumed, checked and written
to RocksDB with a node's store options, by a bare loop with nothing of the node around it:
``python -m bench restore_floor [--rows 2000000] [--rounds 3]``.

The records are those of ``bench streams_restore`` (string keys, 100-byte JSON values,
12 partitions, compacted), on a broker free to use either core, as there. On the server
core, alternating each round, a loop takes them from confluent-kafka 1,000 at a time, as a node does, and

- *consume*: reads each record's key, value, offset and time, and nothing more;
- *write*: also puts each into a RocksDB write batch (the node's options, its record
  header before the value) and writes the batch;
- *check and write*: also checks each value is JSON, as a node does;
- *check and write without the WAL*: the same with RocksDB's write-ahead log off (Kafka
  Streams restores with it off; a node writes it).

Each measure is the process's CPU per record (librdkafka's and RocksDB's threads
included) and records per second. Whatever a node does beyond this loop (a batch per
partition, the key count, positions, freshness, readers) only adds to it, so the last
rows bound how close a Python node can come to Kafka Streams' own restore.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from typing import Any

from bench.anchors import rkey
from bench.common import LOAD_CPU, SERVER_CPU, command, facts_line, machine, save, write_section
from bench.stack import Stack

PARTITIONS = 12
MODES = ("consume", "write", "check and write", "check and write without the WAL")
#: `python -m bench all --quick`: a test of the harness, not figures
QUICK_ARGS = ["--rows", "100000", "--rounds", "1"]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench restore_floor")
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from tablecast.kafka.topics import COMPACTED

    r: dict[str, Any] = {"machine": machine(), "command": command(), "args": vars(args)}
    before = os.sched_getaffinity(0)
    # the broker on any core, as in `bench streams_restore`
    with Stack() as stack:
        try:
            os.sched_setaffinity(0, {int(LOAD_CPU)})  # producing on the load core
            topic = "restore-floor"
            stack.topic(topic, PARTITIONS, COMPACTED)
            stack.fill(topic, args.rows, rkey)  # as `bench streams_restore`'s input
            os.sched_setaffinity(0, {int(SERVER_CPU)})  # the loop and the threads it starts
            runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
            for i in range(args.rounds):
                for mode in MODES if i % 2 == 0 else MODES[::-1]:
                    runs[mode].append(_restore(stack.bootstrap, topic, mode, args.rows))
        finally:
            os.sched_setaffinity(0, before)
    r["runs"] = runs
    save("restore_floor", r)
    write_section("restore_floor", render(r))


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def _restore(bootstrap: str, topic: str, mode: str, rows: int) -> dict[str, float]:
    """One restore of `topic` from its start by the bare loop, its CPU and rate."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    from rocksdict import Rdict, WriteBatch, WriteOptions

    from tablecast.kafka.config import client_conf
    from tablecast.serde import json_check
    from tablecast.store.rocksdb import _HEADER, DATA, _options

    consumer = Consumer(
        client_conf(
            bootstrap,
            {
                "group.id": f"floor-{time.time_ns()}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 50,
                "queued.max.messages.kbytes": 262144,
            },
        )
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    path = tempfile.mkdtemp(prefix="tablecast-floor-")
    db = None if mode == "consume" else Rdict(path, _options())
    if db is not None and mode.endswith("without the WAL"):
        no_wal = WriteOptions()
        no_wal.disable_wal = True
        db.set_write_options(no_wal)
    check = json_check() if mode.startswith("check") else None
    header = _HEADER.pack
    ends = taken = 0
    started, cpu = time.monotonic(), _cpu()
    while ends < PARTITIONS:
        batch = WriteBatch(raw_mode=True) if db is not None else None
        for m in consumer.consume(1000, 1.0):
            if m.error() is not None:
                ends += 1
                continue
            key, value, offset, ts = m.key(), m.value(), m.offset(), m.timestamp()[1]
            taken += 1
            if check is not None and check(value) is not None:
                continue
            if batch is not None:
                batch.put(DATA + key, header(offset, ts) + value)
        if db is not None and batch is not None:
            db.write(batch)
    seconds, cpu = time.monotonic() - started, _cpu() - cpu
    consumer.close()
    if db is not None:
        db.close()
    shutil.rmtree(path, ignore_errors=True)
    assert taken == rows, f"{mode}: {taken} of {rows} records"
    return {"seconds": seconds, "cpu_us": cpu / rows * 1e6, "rate": rows / seconds}


def render(r: dict[str, Any]) -> str:
    a = r["args"]
    rows = "\n".join(
        f"| {mode} | {statistics.median(x['cpu_us'] for x in runs):.2f} | "
        f"{statistics.median(x['rate'] for x in runs):,.0f} |"
        for mode, runs in r["runs"].items()
    )
    return f"""## The least a restore costs in Python

`{r["command"]}` — {facts_line(r["machine"])}

{a["rows"]:,} records of the `streams_restore` kind (string keys, 100-byte JSON values, 12
partitions, compacted, written as that benchmark writes them) on a broker free to use
either core, as there; on the server core a bare loop, not a node, takes them from
confluent-kafka 1,000 at a time and does only what the row says (the node's RocksDB
options; {a["rounds"]} alternating rounds, medians). CPU is the process's, librdkafka's
and RocksDB's threads included.

| loop | CPU µs per record | records/s |
|---|---|---|
{rows}

What a node does beyond this loop only adds to it, so these rows bound what a Python
node can reach with confluent-kafka and rocksdict: Kafka Streams' own restore of the same
kind of changelog ran at 308,170 records/s here (`bench streams_restore`, above, its JVM's
start included).
"""
