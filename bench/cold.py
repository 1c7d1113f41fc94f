"""Point GETs of a table much larger than its caches: tablecast vs Kafka Streams.

``python -m bench cold [--keys 10000000] [--seconds 10] [--rounds 7] [--cache-mb 8]``

Every figure of ``bench anchors`` is hot: 100,000 keys fit the read cache and the block
cache after the warm-up. Here the same servers hold `--keys` keys (10M: about 1.5 GB of
RocksDB files per server) behind caches of a few MiB: the tablecast node with
``--cache-mb`` each of read cache, kept answers and block cache, the Kafka Streams peer
(Jetty front) with one block cache of the same size shared by its stores (its record
cache does not serve reads). Both pinned to core 0 in turn, wrk on core 1. Three key
choices, alternated within each round:

- *hot*: uniform over the first 100,000 keys (the anchors' figure, beside the others);
- *uniform*: uniform over all keys;
- *zipf*: Zipf(0.99) ranks (Apache Commons' rejection-inversion sampler, in wrk's Lua)
  spread over the key space by a multiplicative permutation, so hot keys are not
  neighbours in the sorted files.

The files stay in the operating system's page cache unless it can be dropped
(``/proc/sys/vm/drop_caches``, root outside a container): the section says which.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from bench import common
from bench.anchors import APP, fill_data, key_script, on_load_core, tc_path
from bench.common import (
    SERVER_CPU,
    command,
    facts_line,
    machine,
    median,
    publish,
    ratio_spread,
    settled,
    wait_http,
    wrk,
)
from bench.peers import kafka_streams as ks
from bench.stack import Stack

log = logging.getLogger("bench")
HOT_KEYS = 100_000
CONNECTIONS = 50
#: the anchors' target for a point GET against Kafka Streams holds cold too
TARGET = 1.0
#: an odd multiplier not divisible by 5: a permutation of any 2^a·5^b key count; small
#: enough that rank × SPREAD stays exact in a Lua double for up to 10^7 keys
SPREAD = 700_000_001


def zipf_script(prefix: str, keys: int, exponent: float = 0.99) -> str:
    """A wrk request function asking for key ``perm(rank)`` with rank ~ Zipf(exponent) on
    1..keys (rejection-inversion, Hörmann & Derflinger, as Apache Commons RNG samples it)."""
    return f"""
local n, q = {keys}, {exponent}
local function helper1(x) if math.abs(x) > 1e-8 then return math.log(1 + x) / x end
  return 1 - x * (0.5 - x * (1 / 3 - 0.25 * x)) end
local function helper2(x) if math.abs(x) > 1e-8 then return (math.exp(x) - 1) / x end
  return 1 + x * 0.5 * (1 + x / 3 * (1 + 0.25 * x)) end
local function h(x) return math.exp(-q * math.log(x)) end
local function hi(x) local l = math.log(x) return helper2((1 - q) * l) * l end
local function hinv(x) local t = x * (1 - q) if t < -1 then t = -1 end
  return math.exp(helper1(t) * x) end
local hx1 = hi(1.5) - 1
local hn = hi(n + 0.5)
local s = 2 - hinv(hi(2.5) - h(2))
local function rank()
  while true do
    local u = hn + math.random() * (hx1 - hn)
    local x = hinv(u)
    local k = math.floor(x + 0.5)
    if k < 1 then k = 1 elseif k > n then k = n end
    if k - x <= s or u >= hi(k + 0.5) - h(k) then return k end
  end
end
math.randomseed(os.time())
request = function()
  local i = ((rank() - 1) * {SPREAD}) % n
  return wrk.format("GET", "{prefix}key:" .. string.format("%012d", i))
end
"""


def drop_page_cache() -> bool:
    """Drop the OS page cache if this process may (root outside a container)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        return False
    return True


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench cold")
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--cache-mb", type=int, default=8, help="each cache of each server (MiB)")
    p.add_argument("--quick", action="store_true", help="small; writes to bench/results/quick/")
    args = p.parse_args(argv)
    if args.quick:
        common.use_scratch_output()
        args.keys, args.seconds, args.rounds = 200_000, 3, 2
    if args.rounds < 2:
        p.error("--rounds: at least 2 (the ratio's spread needs them)")
    r: dict[str, Any] = {"machine": machine(), "command": command(), "args": dict(vars(args))}
    ks.build()
    mb = str(args.cache_mb)
    with Stack() as stack, on_load_core(), contextlib.ExitStack() as peers:
        work = stack.dir
        topic, _ = fill_data(stack, args.keys)
        node_proc, node = stack.node(
            work / "node",
            None,
            "--cache-mb",
            mb,
            "--answers-mb",
            mb,
            "--block-cache-mb",
            mb,
            app=APP,
        )
        wait_http(node + "/readyz", timeout=1800, proc=node_proc)
        cluster = peers.enter_context(
            ks.start(
                stack.bootstrap,
                topic,
                1,
                work_dir=work / "ks",
                application_id=f"cold-{os.getpid()}",
                cpus=SERVER_CPU,
                http="jetty",
                props={"rocksdb.config.setter": "dev.tablecast.peers.BoundedBlockCache"},
                jvm_opts=[f"-Diq.block.cache.mb={mb}"],
                ready_timeout=3600,
            )
        )
        cluster.wait_caught_up(stack.bootstrap, timeout=3600)
        servers = {"tablecast": (node, tc_path()), "kafka_streams": (cluster.urls[0], "/keys/")}
        scripts = {
            "hot": lambda prefix: key_script(prefix, min(HOT_KEYS, args.keys)),
            "uniform": lambda prefix: key_script(prefix, args.keys),
            "zipf": lambda prefix: zipf_script(prefix, args.keys),
        }
        r["disk_mib"] = {
            "tablecast": common.du_mib(work / "node"),
            "kafka_streams": common.du_mib(work / "ks"),
        }
        runs: dict[str, list[dict[str, Any]]] = {
            f"{name}/{dist}": [] for dist in scripts for name in servers
        }
        # a first pass of every run, unreported: the JIT, connection pools, the files' index
        for script in scripts.values():
            for url, prefix in servers.values():
                wrk(url + "/", script(prefix), 3, CONNECTIONS)
        dropped = []
        for n in range(args.rounds):
            for dist, script in scripts.items():
                for name, (url, prefix) in servers.items():
                    dropped.append(dist != "hot" and drop_page_cache())
                    runs[f"{name}/{dist}"].append(
                        wrk(url + "/", script(prefix), args.seconds, CONNECTIONS)
                    )
            log.info(
                "round %d: %s",
                n + 1,
                ", ".join(f"{k} {v[-1]['rps']:,.0f}" for k, v in runs.items()),
            )
        r["page_cache_dropped"] = any(dropped)
        r["runs"] = {k: median(v) for k, v in runs.items()}
        r["rounds"] = {k: [x["rps"] for x in v] for k, v in runs.items()}
        r["vs_kafka_streams"] = {
            dist: ratio_spread(
                [
                    a / b
                    for a, b in zip(
                        r["rounds"][f"tablecast/{dist}"],
                        r["rounds"][f"kafka_streams/{dist}"],
                        strict=True,
                    )
                ]
            )
            for dist in scripts
        }
        stack.stop(node_proc)
    publish("cold", r, render(r))


def render(r: dict[str, Any]) -> str:
    a = r["args"]
    rows = []
    for dist, label in (
        ("hot", f"hot: uniform over the first {min(HOT_KEYS, a['keys']):,} keys"),
        ("uniform", f"uniform over all {a['keys']:,} keys"),
        ("zipf", "Zipf(0.99) over all keys"),
    ):
        t, k = r["runs"][f"tablecast/{dist}"], r["runs"][f"kafka_streams/{dist}"]
        v = r["vs_kafka_streams"][dist]
        lo, hi = v["ratio_iqr"]
        rows.append(
            f"| {label} | {t['rps']:,.0f} | {t['p99_us'] / 1e3:.2f} | {k['rps']:,.0f} | "
            f"{k['p99_us'] / 1e3:.2f} | {v['ratio_median']:.2f} ({lo:.2f}–{hi:.2f}) | "
            f"{settled([lo, hi], TARGET)} |"
        )
    table = "\n".join(rows)
    rounds = "; ".join(f"{k} {', '.join(f'{x:,.0f}' for x in v)}" for k, v in r["rounds"].items())
    page = (
        "The OS page cache was dropped before every cold run, so reads go to the disk."
        if r["page_cache_dropped"]
        else "The OS page cache could not be dropped here (no permission in this container), "
        "so the files are read from memory after the first pass: these runs measure RocksDB "
        "with small caches (block reads, decompression, bloom and index lookups), not the disk."
    )
    return f"""## Larger than the caches

`{r["command"]}` — {facts_line(r["machine"])}.

{a["keys"]:,} keys (100-byte JSON values) in a tablecast node (read cache {a["cache_mb"]} MiB per
table, kept answers and block cache {a["cache_mb"]} MiB each; {r["disk_mib"]["tablecast"]:,.0f} MiB on disk) and in the
Kafka Streams peer behind Jetty (one {a["cache_mb"]} MiB block cache shared by its stores, as its
bounded-memory config setter does; {r["disk_mib"]["kafka_streams"]:,.0f} MiB on disk), each pinned to
core 0 in turn, wrk (50 connections) on core 1; {a["rounds"]} rounds of {a["seconds"]} s alternating
servers and key choices; medians shown, the ratio is each round's tablecast ÷ Kafka Streams
(median and interquartile range; a target is met only when the whole range clears it).

| keys asked for | tablecast req/s | p99 ms | Kafka Streams req/s | p99 ms | tablecast ÷ Kafka Streams | ≥ {TARGET:g} |
|---|---|---|---|---|---|---|
{table}

{page} Rounds (req/s): {rounds}.
"""


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(sys.argv[1:])
