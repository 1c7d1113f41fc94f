"""What a key costs when no node can compute its partition: ``python -m bench
unknown_partitioner [--keys 50000] [--seconds 3] [--rounds 7]``.

Two attached topics of one app hold the same rows (``k0000000``.., 100-byte JSON
values, 12 partitions): one written by a Java-like producer (``--partitioner
murmur2``), one with each record's partition picked by hand, a placement no
function here knows (``--partitioner unknown``). Three nodes serve the app, all on
the server core; wrk with 64 connections asks node A only (load core), so two
thirds of the keys live on another node. Alternating rounds of four kinds of read:

- **murmur2**: random keys of the placed table (a third answered by A, the rest
  forwarded once to their owner);
- **learned**: random keys of the unknown-partitioner table that A has read once
  before (it remembers their partitions: the same hops as murmur2);
- **first read**: keys of that table A never read, each once (A looks in its own
  stores, asks each of the two other nodes once, then reads the key where it is);
- **absent**: keys in no partition (looked for everywhere on every read, 404).
"""

from __future__ import annotations

import logging
import shutil
import statistics
import time
from typing import Any

import httpx

from bench.common import (
    answers_200,
    command,
    facts_line,
    machine,
    publish,
    random_key_script,
    ratio_spread,
    rounds_args,
    wrk,
)
from bench.stack import Stack, short_key, value_of
from tablecast.kafka.attach import attach

log = logging.getLogger("bench")
APP = "lookup"
PARTITIONS = 12
NODES = 3
#: keys each first-read round may use up (it must not run out within its seconds)
FIRST_READS_PER_ROUND = 60_000


def _placed(i: int) -> int:
    """The hand-picked partition of the i-th key: no hash of its bytes."""
    return (i * 7 + i // 12) % PARTITIONS


def _fill(stack: Stack, keys: int) -> tuple[str, str]:
    java, hand = f"{APP}.java", f"{APP}.hand"
    for topic in (java, hand):
        stack.topic(topic, PARTITIONS, {"cleanup.policy": "compact"})
    stack.fill(java, keys)
    producer = stack.producer()
    for i in range(keys):
        producer.produce(hand, key=short_key(i), value=value_of(i), partition=_placed(i))
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    return java, hand


def _sequential_script(path: str, first: int, last: int) -> str:
    """Keys first, first + 1, .. (each once while they last), one wrk thread."""
    return f"""
local i = {first - 1}
request = function()
  i = i + 1
  if i > {last} then i = {first} end
  return wrk.format("GET", "{path}" .. string.format("k%07d", i))
end
"""


def main(argv: list[str]) -> None:
    args = rounds_args("unknown_partitioner", argv)
    keys, seconds = args.keys, args.seconds
    total = keys + args.rounds * FIRST_READS_PER_ROUND
    r: dict[str, Any] = {"machine": machine(), "command": command(), "args": vars(args)}
    with Stack() as stack:
        java, hand = _fill(stack, total)
        attach("java", app=APP, topic=java, bootstrap_servers=stack.bootstrap)
        attach(
            "hand", app=APP, topic=hand, bootstrap_servers=stack.bootstrap, partitioner="unknown"
        )
        nodes = [stack.node(stack.dir / f"node-{i}", app=APP) for i in range(NODES)]
        for proc, url in nodes:
            deadline = time.monotonic() + 300
            while not answers_200(url + "/readyz"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"node {url} did not get ready")
                time.sleep(0.2)
        url = nodes[0][1]
        log.info("every node ready; node A learns the first %d keys", keys)
        with httpx.Client(base_url=url, timeout=60) as http:
            for start in range(0, keys, 1000):
                batch = [short_key(i).decode() for i in range(start, min(start + 1000, keys))]
                got = http.post("/v1/tables/hand/keys:batchGet", json={"keys": batch})
                assert got.status_code == 200 and all(x["found"] for x in got.json()["results"])
        # warm: a read answered once is kept (by its path) until its partition changes, so
        # random reads of either table run faster until most keys were asked once
        log.info("warming both tables' kept answers")
        for _ in range(2):
            for table in ("java", "hand"):
                wrk(url, random_key_script(f"/v1/tables/{table}/keys/", keys), seconds * 4)
        runs: dict[str, list[dict[str, Any]]] = {
            k: [] for k in ("murmur2", "learned", "first", "absent")
        }
        for rnd in range(args.rounds):
            first = keys + rnd * FIRST_READS_PER_ROUND
            scripts = {
                "murmur2": random_key_script("/v1/tables/java/keys/", keys),
                "learned": random_key_script("/v1/tables/hand/keys/", keys),
                "first": _sequential_script(
                    "/v1/tables/hand/keys/", first, first + FIRST_READS_PER_ROUND - 1
                ),
                "absent": random_key_script("/v1/tables/hand/keys/", keys, key_prefix="none-"),
            }
            for kind, script in scripts.items():
                run = wrk(url, script, seconds)
                runs[kind].append(run)
                log.info(
                    "round %d %s: %.0f req/s, p50 %.2f ms",
                    rnd,
                    kind,
                    run["rps"],
                    run["p50_us"] / 1000,
                )
            if runs["first"][-1]["requests"] > FIRST_READS_PER_ROUND:
                log.warning("round %d: the first reads ran out of new keys", rnd)
        for proc, _ in nodes:
            stack.stop(proc)
        shutil.rmtree(stack.dir / "node-0", ignore_errors=True)
    r["runs"] = runs
    r["ratios"] = {
        kind: ratio_spread(
            [a["rps"] / b["rps"] for a, b in zip(runs[kind], runs["murmur2"], strict=True)]
        )
        for kind in ("learned", "first", "absent")
    }
    publish("unknown_partitioner", r, render(r))


def render(r: dict[str, Any]) -> str:
    runs, ratios = r["runs"], r["ratios"]
    names = {
        "murmur2": "murmur2 (computed)",
        "learned": "unknown, learned keys",
        "first": "unknown, first read of a key",
        "absent": "unknown, absent keys (404)",
    }
    rows = []
    for kind, name in names.items():
        rps = statistics.median(x["rps"] for x in runs[kind])
        p50 = statistics.median(x["p50_us"] for x in runs[kind]) / 1000
        p99 = statistics.median(x["p99_us"] for x in runs[kind]) / 1000
        if kind == "murmur2":
            ratio = "1"
        else:
            s = ratios[kind]
            lo, hi = s["ratio_iqr"]
            ratio = f"{s['ratio_median']:.2f} ({lo:.2f}-{hi:.2f})"
        rows.append(f"| {name} | {rps:,.0f} | {ratio} | {p50:.2f} | {p99:.2f} |")
    a = r["args"]
    table = "\n".join(rows)
    return f"""## Keys of a topic whose partitioner is unknown

`{r["command"]}` — {facts_line(r["machine"])}

The same {a["keys"]:,} rows (plus {a["rounds"]} × {FIRST_READS_PER_ROUND:,} keys for first
reads) in two attached {PARTITIONS}-partition topics: one written with murmur2, one with each
record's partition picked by hand (`--partitioner unknown`). {NODES} nodes on the server core
(no standbys), wrk with 64 connections on the load core asking node A only: two thirds of the
keys live on the other nodes. {a["rounds"]} alternating rounds of {a["seconds"]} s per kind,
medians, after {8 * a["seconds"]} s of random reads of each table (kept answers warm); the
ratio is req/s against murmur2 in the same round (median and interquartile range).

| read | req/s | × murmur2 | p50 ms | p99 ms |
|---|---:|---:|---:|---:|
{table}

A first read asks each other node once (which looks in its own stores), then reads the key
where it is; a learned key goes straight to its owner as a murmur2 key does. An absent key
is looked for on every read: nothing is learned from an absence. Hot: the keys' rows are in
the nodes' block caches after restore; the three nodes share one core, so the peers' share
of a look-up is in the figures. What could flatter us: every node answers from memory,
over loopback.
"""


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
