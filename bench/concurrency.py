"""10,000 keep-alive connections on one server: tablecast vs the Kafka Streams peer.

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
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench import common
from bench.anchors import (
    APP,
    PARTITIONS,
    TABLE,
    fill_data,
    key_script,
    ks_per_front,
    on_load_core,
    rkey,
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
from tablecast.http import listen
from tablecast.http.http1 import LISTEN_BACKLOG

log = logging.getLogger("bench")
#: tablecast should hold its own: ≥ the fastest peer's req/s with this many connections
TARGET = 1.0
#: the Kafka Streams peers' JVM heap here
KS_HEAP = "2g"
#: the app of the node that listens on one socket
ONE_APP = f"{APP}-one"
#: seconds between two runs
SETTLE_S = 2.0
#: seconds of reading every key in order before the warm-up (100,000 take about 5)
WALK_S = 10
#: a connection storm: this many connections keep the node busy, then the storm connects
BUSY_CONNECTIONS = 2000
BUSY_AHEAD_S = 3


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def walk_script(prefix: str, keys: int) -> str:
    """Every key in order, then again: a node keeps an answer from its first read on, and
    random keys alone leave a third of 100,000 unread after as many requests."""
    return f"""
local i = 0
request = function()
  i = i + 1
  return wrk.format("GET", "{prefix}key:" .. string.format("%012d", (i - 1) % {keys}))
end
"""


def listen_overflows() -> int:
    """The kernel's count of connections dropped because a listen queue was full (all
    sockets: the servers run one at a time, so a run's difference is its server's)."""
    with open("/proc/net/netstat") as f:
        lines = [line.split() for line in f if line.startswith("TcpExt:")]
    names, values = lines[0], lines[1]
    return int(values[names.index("ListenOverflows")])


def storm(
    nodes: dict[str, str], keys: int, connections: int, seconds: int, rounds: int
) -> dict[str, Any]:
    """`connections` clients connecting at once to a node already busy answering
    :data:`BUSY_CONNECTIONS` others (two wrk processes on the load core), for each of
    `nodes` (name -> url) in alternating rounds: the storm's req/s and errors, and the
    connections the kernel dropped meanwhile because a listen queue was full."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in nodes}
    script = key_script(tc_path(), keys)
    for n in range(rounds):
        order = list(nodes.items())
        for name, url in order if n % 2 == 0 else order[::-1]:
            time.sleep(SETTLE_S)
            with ThreadPoolExecutor(1) as pool:
                busy = pool.submit(
                    wrk, url + "/", script, BUSY_AHEAD_S + seconds + 2, BUSY_CONNECTIONS
                )
                time.sleep(BUSY_AHEAD_S)
                overflows = listen_overflows()
                run = wrk(url + "/", script, seconds, connections)
                run["listen_overflows"] = listen_overflows() - overflows
                run["busy_rps"] = busy.result()["rps"]
            runs[name].append(run)
        log.info(
            "storm round %d: %s",
            n + 1,
            ", ".join(f"{k} {v[-1]['listen_overflows']:,} overflows" for k, v in runs.items()),
        )
    return {
        name: {
            "overflows": [r["listen_overflows"] for r in v],
            "errors": [r["errors"] + r["non2xx"] for r in v],
            "rps": [r["rps"] for r in v],
            "busy_rps": [r["busy_rps"] for r in v],
        }
        for name, v in runs.items()
    }


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
        order = list(servers.items())
        for name, (url, prefix, pid) in order if n % 2 == 0 else order[::-1]:
            if name in failed:
                continue
            # the last server closing its 10,000 connections shares core 0: let it finish
            time.sleep(SETTLE_S)
            overflows = listen_overflows()
            try:
                run = wrk(url + "/", key_script(prefix, keys), seconds, connections)
                run["listen_overflows"] = listen_overflows() - overflows
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
    out["totals"] = {
        name: {
            "errors": sum(r["errors"] + r["non2xx"] for r in v),
            "listen_overflows": sum(r["listen_overflows"] for r in v),
        }
        for name, v in runs.items()
    }
    out["failed"] = failed
    peers = [name for name in servers if name.startswith("kafka") and name not in failed]
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
    r["somaxconn"] = listen.somaxconn()
    r["listeners"] = listen.listeners_for(LISTEN_BACKLOG)
    ks.build()
    with Stack() as stack, on_load_core(), contextlib.ExitStack() as peers:
        work = stack.dir
        topic, _ = fill_data(stack, args.keys)
        node_proc, node = stack.node(work / "node", None, app=APP)
        wait_http(node + "/readyz", timeout=300, proc=node_proc)
        servers: dict[str, tuple[str, str, int]] = {"tablecast": (node, tc_path(), node_proc.pid)}
        # the same node listening on one socket, as before it spread connections over several
        # (an app of its own, or the two would share the table's partitions)
        stack.table(TABLE, args.keys, PARTITIONS, app=ONE_APP, key_of=rkey)
        one_proc, one = stack.node(
            work / "one", None, app=ONE_APP, env={"TABLECAST_SERVE_LISTENERS": "1"}
        )
        wait_http(one + "/readyz", timeout=300, proc=one_proc)
        servers["tablecast_one_listener"] = (one, tc_path(), one_proc.pid)
        # 2 GiB of heap: at 512 MiB (the other benchmarks') Jetty's buffers for 10,000
        # connections left the JVM collecting garbage and answering nothing
        fronts = ks_per_front(peers, stack, topic, "concurrency", heap=KS_HEAP)
        for front, cluster in fronts.items():
            servers[f"kafka_streams_{front}"] = (cluster.urls[0], "/keys/", cluster.pids[0])
        r["rss_idle_mib"] = {name: round(rss_mib(pid), 1) for name, (_, _, pid) in servers.items()}
        # every key once on each node (its kept answers), then the JIT and caches at the
        # measured connection count
        for url in (node, one):
            wrk(url + "/", walk_script(tc_path(), args.keys), WALK_S)
        r["warm_up"], failed = {}, {}
        for name, (url, prefix, _) in servers.items():
            script = key_script(prefix, args.keys)
            try:
                r["warm_up"][name] = warm_up(url + "/", script, args.connections, seconds=3)
            except (subprocess.TimeoutExpired, RuntimeError) as e:
                failed[name] = f"warm-up: {type(e).__name__} ({str(e).splitlines()[0]})"
        r["runs"] = measure(servers, args.keys, args.connections, args.seconds, args.rounds, failed)
        r["storm"] = storm(
            {"tablecast": node, "tablecast_one_listener": one},
            args.keys,
            args.connections,
            args.seconds,
            args.rounds,
        )
        stack.stop(node_proc)
        stack.stop(one_proc)
    publish("concurrency", r, render(r))


NAMES = {
    "tablecast": "tablecast, 1 node",
    "tablecast_one_listener": "tablecast, 1 node on one listening socket (as before)",
    "kafka_streams_jdk": "Kafka Streams IQ, JDK httpserver (200 threads)",
    "kafka_streams_jetty": "Kafka Streams IQ, Jetty 12",
    "kafka_streams_netty": "Kafka Streams IQ, Reactor Netty",
}


def _overflows(x: dict[str, Any], name: str) -> str:
    """The median round's listen overflows ("-" in results from before they were counted)."""
    n = x[name].get("listen_overflows")
    return "-" if n is None else f"{n:,}"


def _totals(x: dict[str, Any]) -> str:
    totals = x.get("totals")
    if not totals:
        return ""
    own = x["rounds"].get("tablecast_one_listener")
    versus = ""
    if own:
        spread = ratio_spread([a / b for a, b in zip(x["rounds"]["tablecast"], own, strict=True)])
        lo, hi = spread["ratio_iqr"]
        versus = (
            f"The node on its sockets ÷ on one, each round's own req/s ratio: median "
            f"{spread['ratio_median']:.2f}, interquartile range {lo:.2f}–{hi:.2f}. "
        )
    each = "; ".join(
        f"{NAMES.get(k, k)} {t['errors']:,} errors, {t['listen_overflows']:,} overflows"
        for k, t in totals.items()
    )
    return f"{versus}Over all rounds: {each}."


def _storm(r: dict[str, Any]) -> str:
    st = r.get("storm")
    if not st:
        return ""
    a = r["args"]
    sockets = {"tablecast": r["listeners"], "tablecast_one_listener": 1}
    rows = "\n".join(
        f"| {NAMES.get(name, name)} | {sockets.get(name, '?')} | "
        f"{statistics.median(x['overflows']):,.0f} ({', '.join(f'{n:,}' for n in x['overflows'])}) | "
        f"{sum(1 for n in x['overflows'] if n)} of {len(x['overflows'])} | "
        f"{statistics.median(x['errors']):,.0f} | {statistics.median(x['rps']):,.0f} | "
        f"{statistics.median(x['busy_rps']):,.0f} |"
        for name, x in st.items()
    )
    return f"""
**Connection storm**: each node in turn answers {BUSY_CONNECTIONS:,} keep-alive connections
(wrk on core 1) and, {BUSY_AHEAD_S} s later, {a["connections"]:,} more clients connect at once (a
second wrk on core 1) and ask for {a["seconds"]} s; {a["rounds"]} alternating rounds, medians.
*Listen overflows* as above, during the storm's run.

| node | listening sockets | listen overflows: median (per round) | rounds with any | storm errors | storm req/s | busy clients' req/s |
|---|---|---|---|---|---|---|
{rows}
"""


def render(r: dict[str, Any]) -> str:
    a, x = r["args"], r["runs"]
    v = x["vs_fastest"]
    lo, hi = v["ratio_iqr"]
    failed = x.get("failed", {})
    rows = "\n".join(
        f"| {NAMES.get(name, name)} | {x[name]['rps']:,.0f} | {x[name]['p50_us'] / 1e3:.2f} | "
        f"{x[name]['p99_us'] / 1e3:.2f} | {x[name]['p999_us'] / 1e3:.2f} | "
        f"{x[name]['errors'] + x[name]['non2xx']} | {_overflows(x, name)} | "
        f"{r['rss_idle_mib'][name]:,.0f} → "
        f"{x[name]['rss_mib']:,.0f} |"
        for name in x["rounds"]
        if name in x and name not in failed
    )
    rows += "".join(
        f"\n| {NAMES.get(name, name)} | stopped answering, {why} | | | | | | |"
        for name, why in failed.items()
    )
    rounds = "; ".join(
        f"{NAMES.get(k, k)} {', '.join(f'{n:,.0f}' for n in ns)}" for k, ns in x["rounds"].items()
    )
    return f"""## {a["connections"]:,} concurrent connections

`{r["command"]}` — {facts_line(r["machine"])}.

Each server in turn on core 0 holds {a["connections"]:,} keep-alive connections from one wrk
thread on core 1, asking for uniformly random keys of {a["keys"]:,} (100-byte JSON values, all in
the servers' caches after the warm-up: hot reads); {a["rounds"]} alternating rounds of
{a["seconds"]} s, medians shown. Resident memory: before the warm-up → after the median round.
The Kafka Streams peers run with {r.get("ks_heap", "512m")} of JVM heap.

| server | req/s | p50 ms | p99 ms | p99.9 ms | errors + non-2xx | listen overflows | RSS MiB |
|---|---|---|---|---|---|---|---|
{rows}

tablecast ÷ the fastest peer ({NAMES.get(x["fastest_peer"], x["fastest_peer"])}): median
{v["ratio_median"]:.2f}, interquartile range {lo:.2f}–{hi:.2f} of the rounds' own ratios
(target ≥ {TARGET:g}: {settled([lo, hi], TARGET)}). Rounds: {rounds}.

What could flatter or hurt: one wrk thread opens every connection and drives them all, so at
this count the load generator's own core may limit the faster servers (a server's figure is
then a floor); every request is a hot read. wrk counts a request unanswered after 2 s as a
socket error (timeout). *Listen overflows* are the connection attempts the kernel dropped
during the median round because a listen queue was full (`TcpExtListenOverflows`; a dropped
client waits out TCP's SYN retries, 1 s and more). A queue holds at most net.core.somaxconn
({r.get("somaxconn", 4096):,} here) connections not yet accepted, and a server's event loop
accepts between the requests it answers. The node on the default engine listens on
{r.get("listeners", 1)} sockets sharing its port (SO_REUSEPORT), over whose queues the kernel
spreads new connections; the row "on one listening socket" is the same node with
`--listeners 1` (`TABLECAST_SERVE_LISTENERS=1`), as it listened before. The runs alternate their
order each round, {SETTLE_S:g} s apart (the server before shares core 0 while it closes its
connections).
{_totals(x)}
{_storm(r)}"""


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(sys.argv[1:])
