"""Cluster benchmarks (issue 4): forwarded vs local GET, and the answer gap after kill -9.

python -m bench cluster [--seconds 8] [--keys 100000]
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from typing import Any

import httpx

from bench.common import (
    command,
    facts_line,
    machine,
    median,
    rps_row,
    save,
    verdict,
    wait_http,
    with_cpu,
    write_section,
    wrk,
)
from bench.stack import Stack
from tablecast.kafka.partitioner import partition_for

log = logging.getLogger("bench")
PARTITIONS = 12


def key_script(path_prefix: str, keys: list[str]) -> str:
    """A wrk request function over exactly these keys."""
    listed = ",".join(f'"{k}"' for k in keys)
    return f"""
local keys = {{{listed}}}
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "{path_prefix}" .. keys[math.random(1, #keys)])
end
"""


def actives(url: str) -> dict[int, str]:
    nodes = httpx.get(f"{url}/v1/cluster", timeout=5).json()["nodes"]
    return {r["partition"]: n["url"] for n in nodes for r in n["replicas"] if r["role"] == "active"}


def wait_settled(url: str, nodes: int, timeout: float = 120.0) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owners = actives(url)
        if len(owners) == PARTITIONS and len(set(owners.values())) == nodes:
            return owners
        time.sleep(0.3)
    raise TimeoutError("the cluster did not settle")


def forwarded(stack: Stack, seconds: int, keys: int, rounds: int = 3) -> dict[str, Any]:
    (a, url_a), (b, url_b) = (stack.node(stack.dir / f"fwd-{n}") for n in "ab")
    for url, proc in ((url_a, a), (url_b, b)):
        wait_http(url + "/readyz", timeout=300, proc=proc)
    owners = wait_settled(url_a, 2)
    names = [f"k{i:07d}" for i in range(keys)]
    mine = [k for k in names if owners[partition_for(k.encode(), PARTITIONS)] == url_a]
    theirs = [k for k in names if owners[partition_for(k.encode(), PARTITIONS)] == url_b]
    local_script = key_script("/v1/tables/points/keys/", mine)
    remote_script = key_script("/v1/tables/points/keys/", theirs)
    wrk(url_a + "/", local_script, 2)
    wrk(url_a + "/", remote_script, 2)
    local_runs, remote_runs = [], []
    for _ in range(rounds):
        local_runs.append(with_cpu(wrk, url_a + "/", local_script, seconds, pids=(a.pid, b.pid)))
        remote_runs.append(with_cpu(wrk, url_a + "/", remote_script, seconds, pids=(a.pid, b.pid)))
        log.info(
            "local %.0f req/s, forwarded %.0f req/s", local_runs[-1]["rps"], remote_runs[-1]["rps"]
        )
    stack.stop(a)
    stack.stop(b)
    local, remote = median(local_runs), median(remote_runs)
    return {
        "local": local,
        "forwarded": remote,
        "ratio": remote["rps"] / local["rps"],
        "rounds": {
            "local": [r["rps"] for r in local_runs],
            "forwarded": [r["rps"] for r in remote_runs],
        },
    }


def failover(stack: Stack, keys: int, standbys: int, seconds: float = 12.0) -> dict[str, Any]:
    """Three nodes; clients query the two that survive while the third is killed with -9."""
    procs = [
        stack.node(stack.dir / f"fo{standbys}-{n}", None, "--standby-replicas", str(standbys))
        for n in "abc"
    ]
    for proc, url in procs:
        wait_http(url + "/readyz", timeout=300, proc=proc)
    wait_settled(procs[0][1], 3)
    victim, survivors = procs[2], [u for _, u in procs[:2]]
    results: list[tuple[float, bool]] = []
    stop = threading.Event()

    def load(seed: int) -> None:
        import random

        rng = random.Random(seed)
        with httpx.Client(timeout=10) as http:
            while not stop.is_set():
                key = f"k{rng.randrange(keys):07d}"
                t = time.monotonic()
                try:
                    ok = (
                        http.get(f"{rng.choice(survivors)}/v1/tables/points/keys/{key}").status_code
                        == 200
                    )
                except httpx.HTTPError:
                    ok = False
                results.append((t, ok))

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(seconds / 3)
    killed_at = time.monotonic()
    stack.stop(victim[0], signal.SIGKILL)
    time.sleep(seconds * 2 / 3)
    stop.set()
    for t in threads:
        t.join()
    for proc, _ in procs[:2]:
        stack.stop(proc)
    failures = [t for t, ok in results if not ok]
    gap = (max(failures) - min(failures)) if failures else 0.0
    after = [ok for t, ok in results if t >= killed_at]
    return {
        "standbys": standbys,
        "queries": len(results),
        "failed": len(failures),
        "failed_after_kill": after.count(False),
        "gap_s": gap,
    }


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench cluster")
    p.add_argument("--seconds", type=int, default=8)
    p.add_argument("--keys", type=int, default=100_000)
    args = p.parse_args(argv)
    result: dict[str, Any] = {"machine": machine(), "command": command()}
    with Stack() as stack:
        stack.table("points", args.keys, PARTITIONS)
        result["forwarding"] = forwarded(stack, args.seconds, args.keys)
        result["failover"] = [failover(stack, args.keys, s) for s in (1, 0)]
    save("cluster", result)
    write_section("cluster", render(result, args))


def render(r: dict[str, Any], args: argparse.Namespace) -> str:
    f = r["forwarding"]

    fo = "\n".join(
        f"| {x['standbys']} | {x['queries']:,} | {x['failed']} | {x['gap_s']:.2f} s |"
        for x in r["failover"]
    )
    return f"""## Cluster (issue 4)

`{r["command"]}` — {facts_line(r["machine"])}.

**Forwarded vs local GET**: two nodes, both pinned to core 0, wrk on core 1 (64 connections)
sending to node A only keys whose active is A (local) or only keys whose active is B (every
request forwarded A → B over a pooled keep-alive connection). {args.keys:,} keys, 12 partitions.

| | req/s | p50 ms | p99 ms |
|---|---|---|---|
{rps_row("local GET", f["local"])}
{rps_row("forwarded GET", f["forwarded"])}
| ratio (target ≥ 0.50) | {f["ratio"]:.2f} — {verdict(f["ratio"] >= 0.5)} | | |

Medians of 3 alternating runs; local {", ".join(f"{x:,.0f}" for x in f["rounds"]["local"])};
forwarded {", ".join(f"{x:,.0f}" for x in f["rounds"]["forwarded"])}.

Why the ratio is bounded here: both nodes share core 0, so a forwarded request costs the core
A's work (the inbound request plus the outbound hop) and B's local read. CPU per request in the
median runs: local, A {f["local"]["cpu_us_per_request"][0]:.1f} µs; forwarded, A
{f["forwarded"]["cpu_us_per_request"][0]:.1f} µs + B {f["forwarded"]["cpu_us_per_request"][1]:.1f} µs. With
each node on its own core (a real deployment) the forwarded rate is set by A alone: about
{f["local"]["cpu_us_per_request"][0] / max(f["forwarded"]["cpu_us_per_request"][0], 1e-9):.2f}× local.

**Answer gap after kill -9**: three nodes, four client threads querying random keys on the two
survivors without pause; one node is killed with -9 a third of the way through.

| standby replicas | queries | failed | first to last failure |
|---|---|---|---|
{fo}

Target with a standby: 0 failed queries — {verdict(r["failover"][0]["failed"] == 0)}. Without a
standby the killed node's partitions are unavailable (503) until a survivor has restored them.
"""


if __name__ == "__main__":
    main(__import__("sys").argv[1:])
