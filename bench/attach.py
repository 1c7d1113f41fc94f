"""A database's change stream served with no pipeline: ``python -m bench attach [--mb 1000]
[--operations 1000000] [--rounds 3]``.

Real parts throughout: PostgreSQL (Debian's), Debezium's PostgreSQL connector in a
standalone Kafka Connect worker (JSON converter, schemas on), the broker, three
``tablecast serve`` processes.

1. **Restore**: a table of about `--mb` MB of change events (Debezium's snapshot of a
   generated table, 12 partitions) is attached to an app of three nodes (one standby
   per partition); the time from starting them to ``/readyz`` 200 on all three, against
   60 s. Beside it, in alternating rounds, the same rows as a table topic in the
   pipeline's format (id -> the row's JSON): the cost of reading Debezium's events
   rather than rows.
2. **Differential**: `--operations` random inserts, updates and deletes in PostgreSQL
   (100 to a transaction) while the nodes serve; then every key's answer equals SELECT
   on the source table, and again after kill -9 of one node.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import answers_200, command, facts_line, machine, save, write_section
from bench.stack import Stack
from tablecast.kafka.attach import attach
from tablecast.kafka.topics import end_offsets
from tests.support.debezium import DebeziumConnect
from tests.support.postgres import Postgres

log = logging.getLogger("bench")
APP = "attach"
PARTITIONS = 12
NODES = 3
TARGET_S = 60.0
#: the row's filler: events of about 3.9 KB with their schema, as wide tables make them
PAD = 600
EVENT_BYTES = 3_900


def _nodes_ready(stack: Stack, app: str, work: Path) -> tuple[float, list[Any]]:
    """Start NODES nodes of `app` on both cores; seconds until every one answers /readyz."""
    started = time.monotonic()
    nodes = [
        stack.node(work / f"node-{i}", None, "--standby-replicas", "1", app=app, cpus="0,1")
        for i in range(NODES)
    ]
    pending = {url for _, url in nodes}
    while pending:
        for proc, url in nodes:
            if proc.poll() is not None:
                raise RuntimeError(f"a node of {app} exited ({url})")
            if url in pending and answers_200(url + "/readyz"):
                pending.discard(url)
        time.sleep(0.05)
    return time.monotonic() - started, nodes


def _stop(stack: Stack, nodes: list[Any], work: Path) -> None:
    for proc, _ in nodes:
        stack.stop(proc)
    shutil.rmtree(work, ignore_errors=True)


def _topic_bytes(stack: Stack, topic: str) -> int:
    logs = stack.dir / "kafka"
    return sum(f.stat().st_size for f in logs.rglob("*.log") if f.parent.name.startswith(topic))


def _rows_table(stack: Stack, topic: str, rows: int) -> str:
    """The same rows in the pipeline's format, from the change topic: id -> `after`."""
    from confluent_kafka import Consumer, TopicPartition

    target = stack.table("rows", 0, PARTITIONS, app=f"{APP}-rows")
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "bench-attach"})
    ends = end_offsets(stack.bootstrap, topic)
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    producer = stack.producer(**{"compression.type": "none"})  # as Kafka Connect's
    copied = 0
    while copied < rows:
        for m in consumer.consume(5000, 1.0):
            if m.error() is not None or m.value() is None:
                continue
            key = orjson.loads(m.key())["payload"]["id"]
            after = orjson.loads(m.value())["payload"]["after"]
            producer.produce(target, key=str(key).encode(), value=orjson.dumps(after))
            copied += 1
        producer.poll(0)
    consumer.close()
    assert producer.flush(120) == 0
    return target


def restore(args: argparse.Namespace, stack: Stack, pg: Postgres) -> dict[str, Any]:
    rows = args.mb * 1_000_000 // EVENT_BYTES
    with pg.connect(autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE customers (id int PRIMARY KEY, name text, email text, points int, "
            "pad text)"
        )
        conn.execute(
            "INSERT INTO customers SELECT i, 'name ' || i, 'c' || i || '@example.com', "
            f"i % 1000, repeat('x', {PAD}) FROM generate_series(1, {rows}) AS i"
        )
    connect = DebeziumConnect(stack.bootstrap, pg, "bench", ["customers"], PARTITIONS).start()
    topic = connect.topic("customers")
    started = time.monotonic()
    while (written := sum(end_offsets(stack.bootstrap, topic).values())) < rows:
        if not connect.alive():
            raise RuntimeError(f"Kafka Connect exited:\n{connect.log_tail()}")
        log.info("Debezium's snapshot: %d of %d rows", written, rows)
        time.sleep(5)
    snapshot_s = time.monotonic() - started
    size = _topic_bytes(stack, topic)
    log.info("snapshot of %d rows (%.0f MB) in %.0f s", rows, size / 1e6, snapshot_s)
    attach(
        "customers",
        app=APP,
        topic=topic,
        bootstrap_servers=stack.bootstrap,
        key="debezium",
        value="debezium",
    )
    rows_topic = _rows_table(stack, topic, rows)
    rows_size = _topic_bytes(stack, rows_topic)
    out: dict[str, Any] = {
        "rows": rows,
        "bytes": size,
        "rows_bytes": rows_size,
        "snapshot_s": snapshot_s,
        "attached": [],
        "pipeline": [],
    }
    for i in range(args.rounds):
        for kind, app in (("attached", APP), ("pipeline", f"{APP}-rows")):
            work = stack.dir / f"{kind}-{i}"
            took, nodes = _nodes_ready(stack, app, work)
            _stop(stack, nodes, work)
            out[kind].append(took)
            log.info("round %d: %s table ready on %d nodes in %.1f s", i + 1, kind, NODES, took)
    return {"restore": out, "connect": connect}


def differential(
    args: argparse.Namespace, stack: Stack, pg: Postgres, connect: DebeziumConnect
) -> dict[str, Any]:
    """Random changes while three nodes serve; every key against SELECT, then after kill -9."""
    work = stack.dir / "differential"
    _, nodes = _nodes_ready(stack, APP, work)
    rng = random.Random(51)
    with pg.connect() as conn:
        top = conn.execute("SELECT max(id) FROM customers").fetchone()[0]
    ids = range(1, top + 1000)
    started = time.monotonic()
    with pg.connect() as conn, conn.cursor() as cur:
        for n in range(0, args.operations, 100):
            upserts, updates, deletes = [], [], []
            for _ in range(100):
                i, what = rng.choice(ids), rng.random()
                if what < 0.4:
                    upserts.append((i, f"n{i}-{n}", rng.randrange(10_000)))
                elif what < 0.8:
                    updates.append((i,))
                else:
                    deletes.append((i,))
            cur.executemany(
                "INSERT INTO customers (id, name, points) VALUES (%s, %s, %s) ON CONFLICT (id) "
                "DO UPDATE SET name = excluded.name, points = excluded.points",
                upserts,
            )
            cur.executemany("UPDATE customers SET points = points + 1 WHERE id = %s", updates)
            cur.executemany("DELETE FROM customers WHERE id = %s", deletes)
            conn.commit()
            if n % 100_000 == 0 and n:
                log.info("%d of %d operations", n, args.operations)
    changed_s = time.monotonic() - started
    out: dict[str, Any] = {"operations": args.operations, "changed_s": changed_s}
    out["checks"] = [_check_all(pg, nodes[0][1], ids, "all nodes up")]
    stack.stop(nodes[1][0], signal.SIGKILL)
    out["checks"].append(_check_all(pg, nodes[2][1], ids, "after kill -9 of a node"))
    _stop(stack, nodes, work)
    return out


def _check_all(pg: Postgres, url: str, ids: range, when: str) -> dict[str, Any]:
    """Every key against SELECT, until they all agree (the stream catches up) or 300 s pass."""
    with pg.connect() as conn:
        rows = {
            i: {"id": i, "name": name, "email": email, "points": points, "pad": pad}
            for i, name, email, points, pad in conn.execute(
                "SELECT id, name, email, points, pad FROM customers"
            )
        }
    started = time.monotonic()
    wrong: list[int] = list(ids)
    with httpx.Client(base_url=url, timeout=60) as http:
        while wrong and time.monotonic() - started < 300:
            still = []
            for at in range(0, len(wrong), 1000):
                keys = wrong[at : at + 1000]
                r = http.post("/v1/tables/customers/keys:batchGet", json={"keys": keys})
                if r.status_code != 200:
                    still += keys
                    continue
                for i, result in zip(keys, r.json()["results"], strict=True):
                    got = result.get("value") if result["found"] else None
                    if got != rows.get(i):
                        still.append(i)
            log.info("%s: %d of %d keys differ from SELECT", when, len(still), len(ids))
            wrong = still
            if wrong:
                time.sleep(1.0)
    return {"when": when, "keys": len(ids), "differ": len(wrong), "s": time.monotonic() - started}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench attach")
    p.add_argument("--mb", type=int, default=1000, help="the change topic's size to restore")
    p.add_argument("--operations", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    r: dict[str, Any] = {"machine": machine(), "command": command(), "args": vars(args)}
    pg = Postgres().start()
    try:
        with Stack() as stack:
            done = restore(args, stack, pg)
            connect = done.pop("connect")
            try:
                r.update(done)
                if args.operations:
                    r["differential"] = differential(args, stack, pg, connect)
            finally:
                connect.stop()
    finally:
        pg.stop()
    save("attach", r)
    write_section("attach", render(r))


def render(r: dict[str, Any]) -> str:
    s = r["restore"]
    att, pipe = s["attached"], s["pipeline"]
    med = statistics.median(att)
    mb = s["bytes"] / 1e6
    verdict = "met" if max(att) <= TARGET_S else "**missed**" if med > TARGET_S else "not settled"
    rounds = ", ".join(f"{a:.1f} / {b:.1f}" for a, b in zip(att, pipe, strict=True))
    text = f"""## Attached Debezium topics

`{r["command"]}` — {facts_line(r["machine"])}

**Restore**: PostgreSQL's table of {s["rows"]:,} rows (a {PAD}-byte filler column), Debezium's
snapshot through Kafka Connect's JSON converter with schemas into a {PARTITIONS}-partition topic of
{mb:,.0f} MB ({s["snapshot_s"]:.0f} s), attached (`--key debezium --value debezium`) to an app of
{NODES} nodes with one standby per partition, the nodes on both cores. Start to `/readyz` 200 on
all {NODES}: median **{med:.1f} s** against {TARGET_S:.0f} s ({verdict}): {s["rows"] / med:,.0f}
records/s and {mb / med:,.0f} MB/s of the topic (each partition restored twice, by its active
and its standby). The same rows as a table topic in the pipeline's format (id -> the row's
JSON, {s["rows_bytes"] / 1e6:,.0f} MB): median {statistics.median(pipe):.1f} s. Rounds
(attached / pipeline format, alternating): {rounds} s. Cold: every round starts nodes on empty
data directories; the broker's page cache holds the topics (hot), which flatters both alike.
"""
    d = r.get("differential")
    if d:
        checks = "; ".join(
            f"{c['when']}: {c['differ']} of {c['keys']:,} keys differ ({c['s']:.0f} s)"
            for c in d["checks"]
        )
        text += f"""
**Differential**: {d["operations"]:,} random inserts, updates and deletes in PostgreSQL (100 to a
transaction, {d["changed_s"]:.0f} s) while the {NODES} nodes served, then every key's answer
against `SELECT` on the source table: {checks}.
"""
    return text
