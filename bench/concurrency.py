"""10,000 keep-alive connections on one server (issue 19): tablecast vs the Kafka Streams peer.

``python -m bench concurrency [--connections 10000] [--seconds 10] [--rounds 7] [--keys 100000]``

Seed 000 serves thousands of concurrent users. One tablecast node and the Kafka Streams
peer behind each of its HTTP servers (JDK, Jetty, Reactor Netty) are pinned to core 0 in
turn, each holding `--connections` keep-alive connections from one wrk thread on core 1
asking for random keys; the rounds alternate the servers. Reported per server: req/s,
p50/p99/p99.9 and the resident memory after the round, and tablecast ÷ the fastest peer
with the interquartile range of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import subprocess
from typing import Any

from bench import common
from bench.anchors import (
    APP,
    fill_data,
    key_script,
    ks_per_front,
    on_load_core,
    tc_path,
    warm_up,
)
from bench.common import (
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
#: tablecast should hold its own: ≥ the fastest peer's req/s with this many connections
TARGET = 1.0
#: the Kafka Streams peers' JVM heap here
KS_HEAP = "2g"


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure(
    servers: dict[str, tuple[str, str, int]],
    keys: int,
    connections: int,
    seconds: int,
    rounds: int,
    failed: dict[str, str],
) -> dict[str, Any]:
    """servers: name -> (url, path prefix, pid); alternated `rounds` times.

    A server that stops answering (wrk still waiting a minute after its run should have
    ended) is left out of the later rounds and reported as such under ``failed``."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    for n in range(rounds):
        for name, (url, prefix, pid) in servers.items():
            if name in failed:
                continue
            try:
                run = wrk(url + "/", key_script(prefix, keys), seconds, connections)
            except (subprocess.TimeoutExpired, RuntimeError) as e:
                failed[name] = f"round {n + 1}: {type(e).__name__} ({str(e).splitlines()[0]})"
                log.warning("%s stopped answering in round %d: %s", name, n + 1, e)
                continue
            run["rss_mib"] = round(rss_mib(pid), 1)
            runs[name].append(run)
        log.info(
            "round %d: %s",
            n + 1,
            ", ".join(f"{k} {v[-1]['rps']:,.0f}" for k, v in runs.items() if v and k not in failed),
        )
    if "tablecast" in failed:
        raise RuntimeError(f"tablecast stopped answering: {failed['tablecast']}")
    out: dict[str, Any] = {name: median(v) for name, v in runs.items() if v}
    out["rounds"] = {name: [r["rps"] for r in v] for name, v in runs.items()}
    out["failed"] = failed
    peers = [name for name in servers if name != "tablecast" and name not in failed]
    if not peers:
        raise RuntimeError(f"no Kafka Streams peer answered every round: {failed}")
    fastest = max(peers, key=lambda k: out[k]["rps"])
    ratios = [
        a / b for a, b in zip(out["rounds"]["tablecast"], out["rounds"][fastest], strict=True)
    ]
    out["fastest_peer"] = fastest
    out["vs_fastest"] = ratio_spread(ratios)
    return out


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench concurrency")
    p.add_argument("--connections", type=int, default=10_000)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--quick", action="store_true", help="small; writes to bench/results/quick/")
    args = p.parse_args(argv)
    if args.quick:
        common.use_scratch_output()
        args.connections, args.seconds, args.rounds, args.keys = 2000, 3, 2, 20_000
    if args.rounds < 2:
        p.error("--rounds: at least 2 (the ratio's spread needs them)")
    r: dict[str, Any] = {"machine": machine(), "command": command(), "args": dict(vars(args))}
    r["ks_heap"] = KS_HEAP
    ks.build()
    with Stack() as stack, on_load_core(), contextlib.ExitStack() as peers:
        work = stack.dir
        topic, _ = fill_data(stack, args.keys)
        node_proc, node = stack.node(work / "node", None, app=APP)
        wait_http(node + "/readyz", timeout=300, proc=node_proc)
        servers: dict[str, tuple[str, str, int]] = {"tablecast": (node, tc_path(), node_proc.pid)}
        # 2 GiB of heap: at 512 MiB (the other benchmarks') Jetty's buffers for 10,000
        # connections left the JVM collecting garbage and answering nothing
        fronts = ks_per_front(peers, stack, topic, "concurrency", heap=KS_HEAP)
        for front, cluster in fronts.items():
            servers[f"kafka_streams_{front}"] = (cluster.urls[0], "/keys/", cluster.pids[0])
        r["rss_idle_mib"] = {name: round(rss_mib(pid), 1) for name, (_, _, pid) in servers.items()}
        # the JIT and caches first, at the measured connection count
        r["warm_up"], failed = {}, {}
        for name, (url, prefix, _) in servers.items():
            script = key_script(prefix, args.keys)
            try:
                r["warm_up"][name] = warm_up(url + "/", script, args.connections, seconds=3)
            except (subprocess.TimeoutExpired, RuntimeError) as e:
                failed[name] = f"warm-up: {type(e).__name__} ({str(e).splitlines()[0]})"
        r["runs"] = measure(servers, args.keys, args.connections, args.seconds, args.rounds, failed)
        stack.stop(node_proc)
    publish("concurrency", r, render(r))


NAMES = {
    "tablecast": "tablecast, 1 node",
    "kafka_streams_jdk": "Kafka Streams IQ, JDK httpserver (200 threads)",
    "kafka_streams_jetty": "Kafka Streams IQ, Jetty 12",
    "kafka_streams_netty": "Kafka Streams IQ, Reactor Netty",
}


def render(r: dict[str, Any]) -> str:
    a, x = r["args"], r["runs"]
    v = x["vs_fastest"]
    lo, hi = v["ratio_iqr"]
    failed = x.get("failed", {})
    rows = "\n".join(
        f"| {NAMES.get(name, name)} | {x[name]['rps']:,.0f} | {x[name]['p50_us'] / 1e3:.2f} | "
        f"{x[name]['p99_us'] / 1e3:.2f} | {x[name]['p999_us'] / 1e3:.2f} | "
        f"{x[name]['errors'] + x[name]['non2xx']} | {r['rss_idle_mib'][name]:,.0f} → "
        f"{x[name]['rss_mib']:,.0f} |"
        for name in x["rounds"]
        if name in x and name not in failed
    )
    rows += "".join(
        f"\n| {NAMES.get(name, name)} | stopped answering, {why} | | | | | |"
        for name, why in failed.items()
    )
    rounds = "; ".join(
        f"{NAMES.get(k, k)} {', '.join(f'{n:,.0f}' for n in ns)}" for k, ns in x["rounds"].items()
    )
    return f"""## {a["connections"]:,} concurrent connections (issue 19)

`{r["command"]}` — {facts_line(r["machine"])}.

Each server in turn on core 0 holds {a["connections"]:,} keep-alive connections from one wrk
thread on core 1, asking for uniformly random keys of {a["keys"]:,} (100-byte JSON values, all in
the servers' caches after the warm-up: hot reads); {a["rounds"]} alternating rounds of
{a["seconds"]} s, medians shown. Resident memory: before the warm-up → after the median round.
The Kafka Streams peers run with {r.get("ks_heap", "512m")} of JVM heap.

| server | req/s | p50 ms | p99 ms | p99.9 ms | errors + non-2xx | RSS MiB |
|---|---|---|---|---|---|---|
{rows}

tablecast ÷ the fastest peer ({NAMES.get(x["fastest_peer"], x["fastest_peer"])}): median
{v["ratio_median"]:.2f}, interquartile range {lo:.2f}–{hi:.2f} of the rounds' own ratios
(target ≥ {TARGET:g}: {settled([lo, hi], TARGET)}). Rounds: {rounds}.

What could flatter or hurt: one wrk thread opens every connection and drives them all, so at
this count the load generator's own core may limit the faster servers (a server's figure is
then a floor); every request is a hot read. wrk counts a request unanswered after 2 s as a
socket error (timeout): tablecast's come from its connections' start, when 10,000 clients
connecting at once overflow the kernel's listen queue (net.core.somaxconn, 4,096 here) while
the node's event loop, which also accepts, is busy answering; the clients dropped wait out
TCP's SYN retries.
"""


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(sys.argv[1:])
