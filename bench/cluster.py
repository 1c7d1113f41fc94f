"""Cluster benchmarks (issue 4): forwarded vs local GET, and the answer gap after kill -9.

python -m bench cluster [--seconds 8] [--keys 100000]
"""

from __future__ import annotations

import argparse
import logging
import signal
import statistics
import threading
import time
from typing import Any

import httpx

from bench.common import (
    LOAD_CPU,
    SERVER_CPU,
    command,
    facts_line,
    machine,
    median,
    ratio_spread,
    save,
    settled,
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


def forwarded(
    stack: Stack, seconds: int, keys: int, rounds: int = 7, b_cpu: str = SERVER_CPU
) -> dict[str, Any]:
    """Node A on core 0 takes every request; node B owns half the partitions, on `b_cpu`.

    wrk (core 1) sends A only keys A owns (local) or only keys B owns (each forwarded A → B),
    alternated `rounds` times. With B on core 1 each node has a core of its own, as in a
    real deployment, but B then shares it with wrk: in the local runs B is idle, in the
    forwarded ones its reads take some of wrk's core (which can only lower the forwarded rate).
    """
    tag = f"fwd{b_cpu}"
    a, url_a = stack.node(stack.dir / f"{tag}-a")
    b, url_b = stack.node(stack.dir / f"{tag}-b", cpus=b_cpu)
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
            "B on core %s: local %.0f req/s, forwarded %.0f req/s",
            b_cpu,
            local_runs[-1]["rps"],
            remote_runs[-1]["rps"],
        )
    stack.stop(a)
    stack.stop(b)
    local, remote = median(local_runs), median(remote_runs)
    ratios = [f["rps"] / loc["rps"] for loc, f in zip(local_runs, remote_runs, strict=True)]
    return {
        "b_cpu": b_cpu,
        "local": local,
        "forwarded": remote,
        **ratio_spread(ratios),
        "ratio": statistics.median(ratios),
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
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    result: dict[str, Any] = {"machine": machine(), "command": command()}
    with Stack() as stack:
        stack.table("points", args.keys, PARTITIONS)
        # each node on its own core (the deployment figure), then both on core 0
        result["forwarding_own_cores"] = forwarded(
            stack, args.seconds, args.keys, args.rounds, b_cpu=LOAD_CPU
        )
        result["forwarding"] = forwarded(stack, args.seconds, args.keys, args.rounds)
        result["failover"] = [failover(stack, args.keys, s) for s in (1, 0)]
    save("cluster", result)
    write_section("cluster", render(result, args))


def layout_row(label: str, x: dict[str, Any]) -> str:
    lo, hi = x["ratio_iqr"]
    return (
        f"| {label} | {x['local']['rps']:,.0f} | {x['forwarded']['rps']:,.0f} | "
        f"{x['forwarded']['p99_us'] / 1e3:.2f} | {x['ratio_median']:.2f} ({lo:.2f}–{hi:.2f}) | "
        f"{settled(x['ratio_iqr'], 0.5)} |"
    )


def render(r: dict[str, Any], args: argparse.Namespace) -> str:
    f, o = r["forwarding"], r["forwarding_own_cores"]

    fo = "\n".join(
        f"| {x['standbys']} | {x['queries']:,} | {x['failed']} | {x['gap_s']:.2f} s |"
        for x in r["failover"]
    )
    return f"""## Cluster (issue 4)

`{r["command"]}` — {facts_line(r["machine"])}.

**Forwarded vs local GET, measured**: two nodes, wrk (64 connections, core 1) sending node A
only keys whose active is A (local) or only keys whose active is B (every request forwarded
A → B over a pooled keep-alive connection); {args.keys:,} keys, 12 partitions,
{len(o["ratios"])} alternating rounds of {args.seconds} s. The ratio is each round's forwarded ÷
local; a target counts as met only when its whole interquartile range clears it.

| layout | local req/s | forwarded req/s | forwarded p99 ms | forwarded ÷ local: median (IQR) | target ≥ 0.50 |
|---|---|---|---|---|---|
{layout_row("A on core 0, B on core 1 (own cores)", o)}
{layout_row("A and B both on core 0", f)}

Rounds, own cores: local {", ".join(f"{x:,.0f}" for x in o["rounds"]["local"])}; forwarded
{", ".join(f"{x:,.0f}" for x in o["rounds"]["forwarded"])}. Shared core: local
{", ".join(f"{x:,.0f}" for x in f["rounds"]["local"])}; forwarded
{", ".join(f"{x:,.0f}" for x in f["rounds"]["forwarded"])}.

What is hot and what could flatter or hurt: every key is in the nodes' read cache and kept
answers after the warm-up (hot reads): a local read and B's side of a forward are answered
from kept answers, A's side of a forward cannot be (only B knows its position). With own cores, B shares core 1 with wrk: idle in the local runs, busy
in the forwarded ones, which can only lower the forwarded figure. On the shared core a
forwarded request costs core 0 A's work (inbound request plus the outbound hop) and B's local
read: CPU per request in the median runs, local A {f["local"]["cpu_us_per_request"][0]:.1f} µs;
forwarded A {f["forwarded"]["cpu_us_per_request"][0]:.1f} µs + B
{f["forwarded"]["cpu_us_per_request"][1]:.1f} µs.

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
