"""Cluster benchmarks: forwarded vs local GET, and the answer gap after kill -9.

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
from tablecast.contract.partitioner import partition_for

log = logging.getLogger("bench")
PARTITIONS = 12
#: forwarded reads per second at least this share of local ones (also by CPU per read)
FORWARDED_TARGET = 0.55
#: wrk's connections for the rounds that keep the forwarder's core busy (own cores)
SATURATING = 256


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


def warm_script(path_prefix: str, keys: list[str]) -> str:
    """A wrk request function that asks for these keys in turn, round and round: run on one
    thread for keys ÷ (req/s) seconds or more, it asks for every key at least once (kept
    answers, read cache, block cache), which random picks take several times longer to do."""
    listed = ",".join(f'"{k}"' for k in keys)
    return f"""
local keys = {{{listed}}}
local i = 0
request = function()
  i = i % #keys + 1
  return wrk.format("GET", "{path_prefix}" .. keys[i])
end
"""


def actives(url: str) -> tuple[dict[int, str], bool]:
    """Each partition's active node, and whether some replica is still warming (to take
    a partition over from its active)."""
    nodes = httpx.get(f"{url}/v1/cluster", timeout=5).json()["nodes"]
    replicas = [(n["url"], r) for n in nodes for r in n["replicas"]]
    owners = {r["partition"]: u for u, r in replicas if r["role"] == "active"}
    return owners, any(r["role"] == "warming" for _, r in replicas)


def wait_settled(url: str, nodes: int, timeout: float = 180.0) -> dict[int, str]:
    """The actives once every node holds some, none is warming to take over, and the
    assignment has stayed the same for 3 s (a node that joined last moves partitions)."""
    deadline = time.monotonic() + timeout
    last: dict[int, str] = {}
    since = time.monotonic()
    while time.monotonic() < deadline:
        owners, warming = actives(url)
        if owners != last or warming:
            last, since = owners, time.monotonic()
        elif (
            len(owners) == PARTITIONS
            and len(set(owners.values())) == nodes
            and time.monotonic() - since >= 3.0
        ):
            return owners
        time.sleep(0.3)
    raise TimeoutError("the cluster did not settle")


def forwarded(
    stack: Stack, seconds: int, keys: int, rounds: int = 7, b_cpu: str = SERVER_CPU
) -> dict[str, Any]:
    """Node A on core 0 takes every request; node B owns a share of the partitions, on `b_cpu`;
    node A1 (core 0 too, idle unless asked) is A with forwarded reads sent one by one
    (``--forwarding one-by-one``), node A2 (core 0 too) is A with every forwarded read taken
    the router's way, as before the short path (``--forwarding batched``).

    wrk (core 1) sends A only keys A owns (local), A only keys B owns (each forwarded A → B,
    those waiting at once as one batch), and A1 only keys B owns (each forwarded alone),
    alternated `rounds` times. With B on core 1 each node has a core of its own, as in a
    real deployment, but B then shares it with wrk: in the local runs B is idle, in the
    forwarded ones its reads take some of wrk's core (which can only lower the forwarded rate).
    With own cores each round also sends A local and forwarded reads from SATURATING
    connections: at 64 a forward's batch round trip can leave A's core idle, which then
    measures that round trip rather than what a forward costs.
    """
    tag = f"fwd{b_cpu}"
    a, url_a = stack.node(stack.dir / f"{tag}-a")
    b, url_b = stack.node(stack.dir / f"{tag}-b", cpus=b_cpu)
    alone, url_alone = stack.node(stack.dir / f"{tag}-a1", None, "--forwarding", "one-by-one")
    routed, url_routed = stack.node(stack.dir / f"{tag}-a2", None, "--forwarding", "batched")
    nodes = ((url_a, a), (url_b, b), (url_alone, alone), (url_routed, routed))
    for url, proc in nodes:
        wait_http(url + "/readyz", timeout=300, proc=proc)
    owners = wait_settled(url_a, len(nodes))
    names = [f"k{i:07d}" for i in range(keys)]
    mine = [k for k in names if owners[partition_for(k.encode(), PARTITIONS)] == url_a]
    theirs = [k for k in names if owners[partition_for(k.encode(), PARTITIONS)] == url_b]
    local_script = key_script("/v1/tables/points/keys/", mine)
    remote_script = key_script("/v1/tables/points/keys/", theirs)
    for url in (url_a, url_alone, url_routed):
        wrk(url + "/", remote_script, 2)
    wrk(url_a + "/", local_script, 2)
    pids = tuple(p.pid for _, p in nodes)
    local_runs, remote_runs, alone_runs, routed_runs = [], [], [], []
    local_full: list[dict[str, Any]] = []
    remote_full: list[dict[str, Any]] = []
    full = b_cpu != SERVER_CPU
    batches = [0.0, 0.0, 0.0]  # A's batches, the reads in them, all its forwarded reads
    for i in range(rounds):
        runs = [
            (local_runs, url_a, local_script, 64),
            (remote_runs, url_a, remote_script, 64),
            (alone_runs, url_alone, remote_script, 64),
            (routed_runs, url_routed, remote_script, 64),
        ]
        if full:
            runs += [
                (local_full, url_a, local_script, SATURATING),
                (remote_full, url_a, remote_script, SATURATING),
            ]
        for runs_, url, script, conns in runs if i % 2 == 0 else runs[::-1]:
            before = batch_counts(url_a) if runs_ is remote_runs else None
            runs_.append(with_cpu(wrk, url + "/", script, seconds, conns, pids=pids))
            if before is not None:
                after = batch_counts(url_a)
                batches[0] += after[0] - before[0]
                batches[1] += after[1] - before[1]
                batches[2] += runs_[-1]["requests"]
        log.info(
            "B on core %s: local %.0f req/s, forwarded %.0f req/s (one by one %.0f, "
            "the router's way %.0f)",
            b_cpu,
            local_runs[-1]["rps"],
            remote_runs[-1]["rps"],
            alone_runs[-1]["rps"],
            routed_runs[-1]["rps"],
        )
    moved = actives(url_a)[0] != owners  # then some "local" reads were forwarded
    if moved:
        log.warning("B on core %s: the assignment moved during the runs", b_cpu)
    for _, proc in nodes:
        stack.stop(proc)
    local, remote = median(local_runs), median(remote_runs)
    ratios = [f["rps"] / loc["rps"] for loc, f in zip(local_runs, remote_runs, strict=True)]
    batched = [f["rps"] / one["rps"] for f, one in zip(remote_runs, alone_runs, strict=True)]
    short = [f["rps"] / r["rps"] for f, r in zip(remote_runs, routed_runs, strict=True)]
    # the CPU of A's core per read (B's too when it shares that core): what a saturated
    # core 0 could serve, whatever bounded the rate here
    on_a = (0, 1) if b_cpu == SERVER_CPU else (0,)
    by_cpu = [
        sum(loc["cpu_us_per_request"][i] for i in on_a)
        / sum(f["cpu_us_per_request"][i] for i in on_a)
        for loc, f in zip(local_runs, remote_runs, strict=True)
    ]
    if full:
        saturated = [f["rps"] / loc["rps"] for loc, f in zip(local_full, remote_full, strict=True)]
        extra = {
            "saturated": {
                "local": median(local_full),
                "forwarded": median(remote_full),
                **ratio_spread(saturated),
            }
        }
    else:
        extra = {}
    return {
        **extra,
        "b_cpu": b_cpu,
        "assignment_moved": moved,
        "local": local,
        "forwarded": remote,
        "one_by_one": median(alone_runs),
        "routed": median(routed_runs),
        "short_vs_routed": ratio_spread(short),
        "by_cpu": ratio_spread(by_cpu),
        **ratio_spread(ratios),
        "ratio": statistics.median(ratios),
        "batched_vs_alone": ratio_spread(batched),
        "reads_per_batch": batches[1] / batches[0] if batches[0] else 0.0,
        "batched_share": batches[1] / batches[2] if batches[2] else 0.0,
        "rounds": {
            "local": [r["rps"] for r in local_runs],
            "forwarded": [r["rps"] for r in remote_runs],
            "one_by_one": [r["rps"] for r in alone_runs],
            "routed": [r["rps"] for r in routed_runs],
        },
    }


def batch_counts(url: str) -> tuple[float, float]:
    """Batches of forwarded reads the node at `url` sent, and the reads in them (/metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = {"tablecast_forward_batches_total": 0.0, "tablecast_forward_batched_reads_total": 0.0}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            found[name] = float(value)
    return found["tablecast_forward_batches_total"], found["tablecast_forward_batched_reads_total"]


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
    blo, bhi = x["batched_vs_alone"]["ratio_iqr"]
    slo, shi = x["short_vs_routed"]["ratio_iqr"]
    return (
        f"| {label} | {x['local']['rps']:,.0f} | {x['forwarded']['rps']:,.0f} | "
        f"{x['forwarded']['p99_us'] / 1e3:.2f} | {x['routed']['rps']:,.0f} | "
        f"{x['short_vs_routed']['ratio_median']:.2f} ({slo:.2f}–{shi:.2f}) | "
        f"{x['one_by_one']['rps']:,.0f} | "
        f"{x['batched_vs_alone']['ratio_median']:.2f} ({blo:.2f}–{bhi:.2f}) | "
        f"{x['ratio_median']:.2f} ({lo:.2f}–{hi:.2f}) | {settled(x['ratio_iqr'], FORWARDED_TARGET)} | "
        f"{_cpu_ratio(x)} |"
    )


def _cpu_ratio(x: dict[str, Any]) -> str:
    """Core 0's CPU per local read ÷ per forwarded read, and its verdict (n/a: results
    saved before it was measured)."""
    c = x.get("by_cpu")
    if c is None:
        return "n/a | n/a"
    lo, hi = c["ratio_iqr"]
    return (
        f"{c['ratio_median']:.2f} ({lo:.2f}–{hi:.2f}) | {settled(c['ratio_iqr'], FORWARDED_TARGET)}"
    )


def _rounds(x: dict[str, Any], which: str) -> str:
    return ", ".join(f"{v:,.0f}" for v in x["rounds"][which])


def own_cores_note(o: dict[str, Any], seconds: int) -> str:
    """How busy each core was in the median forwarded run with own cores (A's on core 0;
    B's and wrk's on core 1), and so what bounded that rate."""
    fwd = o["forwarded"]
    a_us, b_us = fwd["cpu_us_per_request"][0], fwd["cpu_us_per_request"][1]
    a_busy = a_us * fwd["rps"] / 1e6
    b_busy = b_us * fwd["rps"] / 1e6
    wrk_busy = fwd["load_cpu_s"] / seconds  # wrk's CPU over its run
    lead = (
        f" With own cores, in the median forwarded run A spent {a_us:.1f} µs of CPU per read "
        f"(core 0 {a_busy:.0%} busy), B {b_us:.1f} µs and wrk beside it kept core 1 "
        f"{b_busy + wrk_busy:.0%} busy"
    )
    if a_busy >= 0.9:
        return lead + ": A's core bounded the rate."
    if b_busy + wrk_busy >= 0.9:
        return lead + ": the core B shares with wrk bounded the rate."
    return lead + ": neither core was full, so the round trip of 64 connections bounded it."


def saturated_note(o: dict[str, Any]) -> str:
    """The own-cores ratio from SATURATING connections (absent from earlier results)."""
    sat = o.get("saturated")
    if sat is None:
        return ""
    lo, hi = sat["ratio_iqr"]
    return (
        f" From {SATURATING} connections in the same rounds (own cores): local "
        f"{sat['local']['rps']:,.0f} req/s, forwarded {sat['forwarded']['rps']:,.0f} req/s, "
        f"forwarded ÷ local {sat['ratio_median']:.2f} ({lo:.2f}–{hi:.2f}): "
        f"{settled(sat['ratio_iqr'], FORWARDED_TARGET)} against {FORWARDED_TARGET:.2f}; the target "
        "above stays judged at 64."
    )


def moved_note(*layouts: dict[str, Any]) -> str:
    if not any(x.get("assignment_moved") for x in layouts):
        return " The assignment did not move during the runs."
    return " **The assignment moved during the runs: these figures mix local and forwarded reads.**"


def render(r: dict[str, Any], args: argparse.Namespace) -> str:
    f, o = r["forwarding"], r["forwarding_own_cores"]

    fo = "\n".join(
        f"| {x['standbys']} | {x['queries']:,} | {x['failed']} | {x['gap_s']:.2f} s |"
        for x in r["failover"]
    )
    cpu = {k: f[k]["cpu_us_per_request"] for k in ("local", "forwarded", "one_by_one", "routed")}
    return f"""## Cluster

`{r["command"]}` — {facts_line(r["machine"])}.

**Forwarded vs local GET, measured**: four nodes, wrk (64 connections, core 1) sending node A
only keys whose active is A (local), A only keys whose active is B (every request forwarded
A → B on the short path of plain forwarded reads; forwards waiting at the same moment leave
as one batch), A2 only keys whose active is B (A2 is A with `--forwarding batched`:
every forwarded read the router's way, batched, as before the short path), or A1 only keys
whose active is B (A1 is A with `--forwarding one-by-one`: each forward alone over a pooled
keep-alive connection, the router's way, as before batches); {args.keys:,} keys, 12 partitions,
{len(o["ratios"])} alternating rounds of {args.seconds} s (the order flips each round). The
ratios are each round's; a target counts as met only when its whole interquartile range
clears it. *By A's CPU per read* divides the CPU core 0 spent per local read by what it spent
per forwarded read in the same round (all threads of A, and of B when it shares core 0, from
/proc): the rate a saturated core 0 would keep, whatever else bounded the rate in the run;
the target is judged on req/s.

| layout | local req/s | forwarded req/s | forwarded p99 ms | the router's way req/s | short ÷ router's way: median (IQR) | one by one req/s | batched ÷ one by one: median (IQR) | forwarded ÷ local: median (IQR) | target ≥ {FORWARDED_TARGET:.2f} | by A's CPU per read: median (IQR) | ≥ {FORWARDED_TARGET:.2f} |
|---|---|---|---|---|---|---|---|---|---|---|---|
{layout_row("A, A1, A2 on core 0, B on core 1 (own cores)", o)}
{layout_row("A, A1, A2 and B all on core 0", f)}

Rounds, own cores: local {_rounds(o, "local")}; forwarded {_rounds(o, "forwarded")}; the
router's way {_rounds(o, "routed")}; one by one {_rounds(o, "one_by_one")}. Shared core: local
{_rounds(f, "local")}; forwarded {_rounds(f, "forwarded")}; the router's way
{_rounds(f, "routed")}; one by one {_rounds(f, "one_by_one")}. In A's batched runs
{o["batched_share"]:.0%} (own cores) and {f["batched_share"]:.0%} (shared core) of the
forwards left in a batch, {o["reads_per_batch"]:.1f} and {f["reads_per_batch"]:.1f} reads per
batch on average; the rest went alone.{moved_note(o, f)}

What is hot and what could flatter or hurt: every key is in the nodes' read cache and kept
answers after the warm-up (hot reads): a local read and B's side of a forward are answered
from kept answers, A's side of a forward cannot be (only B knows its position). With own
cores, B shares core 1 with wrk: idle in the local runs, busy in the forwarded ones, which can
only lower the forwarded figure. On the shared core a forwarded request costs core 0 A's work
(inbound request plus the outbound hop) and B's read: CPU per request in the median runs,
local A {cpu["local"][0]:.1f} µs; forwarded in batches A {cpu["forwarded"][0]:.1f} µs + B
{cpu["forwarded"][1]:.1f} µs; the router's way A2 {cpu["routed"][3]:.1f} µs + B
{cpu["routed"][1]:.1f} µs; one by one A1 {cpu["one_by_one"][2]:.1f} µs + B
{cpu["one_by_one"][1]:.1f} µs.{own_cores_note(o, args.seconds)}{saturated_note(o)}

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
