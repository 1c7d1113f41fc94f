"""Serving-node benchmarks: HTTP stacks, point GET vs constant, ingest, restart.

python -m bench serving [--seconds 10] [--keys 100000] [--ingest 1000000] [--restart 5000000]
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import (
    answers_200,
    command,
    facts_line,
    machine,
    median,
    random_key_script,
    ratio_spread,
    save,
    settled,
    verdict,
    wait_http,
    with_cpu,
    write_section,
    wrk,
)
from bench.handler import handler_cost
from bench.stack import APP, Stack, applied

log = logging.getLogger("bench")
APP_NOCACHE = APP + "-nocache"


def http_stacks(stack: Stack, seconds: int) -> dict[str, Any]:
    out = {}
    for name in ("granian-rsgi", "granian-asgi", "uvicorn"):
        proc, url = stack.baseline(name)
        wrk(url + "/", None, 2)  # warm-up
        out[name] = wrk(url + "/", None, seconds)
        log.info("constant body on %s: %.0f req/s", name, out[name]["rps"])
        stack.stop(proc)
    return out


def point_get(stack: Stack, seconds: int, keys: int, rounds: int = 7) -> dict[str, Any]:
    """Node GET (read cache on, as by default, and off) and the constant baseline.

    The three are alternated `rounds` times and the median of each counts. All
    servers stay up (an idle one costs nothing) so alternating runs see the
    same machine noise.
    """
    stack.table("points", keys)
    proc, url = stack.node(stack.dir / "node-points")
    wait_http(url + "/readyz", timeout=300, proc=proc)
    # its own app id: two nodes of one app would split the partitions and forward
    stack.table("points", keys, app=APP_NOCACHE)
    cold_proc, cold_url = stack.node(
        stack.dir / "node-points-nocache", None, "--cache-mb", "0", app=APP_NOCACHE
    )
    wait_http(cold_url + "/readyz", timeout=300, proc=cold_proc)
    base_proc, base_url = stack.baseline("granian-rsgi")
    script = random_key_script("/v1/tables/points/keys/", keys)
    wrk(url + "/", script, 3)  # warm-up: read cache, block cache, partition memo
    wrk(cold_url + "/", script, 3)
    wrk(base_url + "/", None, 2)
    gets, colds, constants = [], [], []
    for _ in range(rounds):
        gets.append(with_cpu(wrk, url + "/", script, seconds, pids=(proc.pid,)))
        colds.append(wrk(cold_url + "/", script, seconds))
        constants.append(with_cpu(wrk, base_url + "/", None, seconds, pids=(base_proc.pid,)))
        log.info(
            "GET %.0f req/s (no cache %.0f), constant %.0f req/s",
            gets[-1]["rps"],
            colds[-1]["rps"],
            constants[-1]["rps"],
        )
    for p in (proc, cold_proc, base_proc):
        stack.stop(p)
    get, cold, constant = median(gets), median(colds), median(constants)
    return {
        "get": get,
        "get_nocache": cold,
        "constant": constant,
        "ratio": get["rps"] / constant["rps"],
        "ratio_nocache": cold["rps"] / constant["rps"],
        "round_ratios": [g["rps"] / c["rps"] for g, c in zip(gets, constants, strict=True)],
        "spread": ratio_spread([g["rps"] / c["rps"] for g, c in zip(gets, constants, strict=True)]),
        # requests per CPU-second, node over constant: the cost ratio other load cannot move
        "cpu_spread": ratio_spread(
            [
                c["cpu_us_per_request"][0] / g["cpu_us_per_request"][0]
                for g, c in zip(gets, constants, strict=True)
            ]
        ),
        "rounds": {
            "get": [g["rps"] for g in gets],
            "get_nocache": [g["rps"] for g in colds],
            "constant": [c["rps"] for c in constants],
        },
    }


def ingest(stack: Stack, rows: int) -> dict[str, Any]:
    stack.table("ingest", rows)
    started = time.monotonic()
    proc, url = stack.node(stack.dir / "node-ingest")
    result = follow_ingest(proc, url, rows, started)
    stack.stop(proc)
    return result


#: how often follow_ingest reads a node's records-applied counter
SAMPLE_S = 0.5


def applied_so_far(proc: subprocess.Popen[bytes], url: str) -> float | None:
    """The node's records-applied counter; None while it does not answer yet."""
    try:
        return applied(url)
    except Exception:  # not up yet (no answer, or no counter yet)
        if proc.poll() is not None:
            raise RuntimeError(f"node {url} exited with {proc.returncode}") from None
        return None


def follow_ingest(
    proc: subprocess.Popen[bytes], url: str, rows: int, started: float
) -> dict[str, Any]:
    """Watch a node started at `started` apply `rows` records; its rates, and when it was ready.

    The applying rate counts from the last sample with nothing applied to readiness
    with everything applied, so it leaves out the process start and the catalog read
    that come before, and never divides by less than one sample interval (a small
    table can be applied between two samples).
    """
    samples: list[tuple[float, float]] = []
    next_sample = 0.0
    while True:
        # readiness is asked every 50 ms (a few µs of the node's core), the counter only
        # every SAMPLE_S: a /metrics answer costs the node about 5 ms, and asked every
        # 50 ms it took a tenth of the core the node restores with (py-spy)
        now = time.monotonic()
        if now >= next_sample:
            n = applied_so_far(proc, url)
            if n is not None:
                samples.append((time.monotonic(), n))
            next_sample = now + SAMPLE_S
        if samples and answers_200(url + "/readyz"):
            n = applied_so_far(proc, url)  # ready before its first assignment is not ready
            if n is not None and n >= rows:
                samples.append((time.monotonic(), n))
                break
        time.sleep(0.05)
    wall = samples[-1][0] - started
    first = max((t for t, n in samples if n == 0), default=started)
    last = samples[-1][0]
    return {
        "rows": rows,
        "wall_s": wall,
        "rps_wall": rows / wall,
        "rps_applying": rows / max(last - first, 1e-3),
    }


def restart(stack: Stack, rows: int) -> dict[str, Any]:
    stack.table("restart", rows)
    data = stack.dir / "node-restart"
    proc, url = stack.node(data)
    wait_http(url + "/readyz", timeout=600, proc=proc)
    return {"rows": rows, **restart_killed(stack, proc, url, data)}


def recovery(stack: Stack, rows: int) -> dict[str, Any]:
    """kill -9 a node a quarter of the way through ingesting `rows`, start it again: how many
    records it replays and how long until it is ready (recovery, not just reopening)."""
    app = APP + "-recovery"
    stack.table("recovery", rows, app=app)
    data = stack.dir / "node-recovery"
    proc, url = stack.node(data, app=app)
    while True:
        try:
            done = applied(url)
        except Exception:  # not up yet
            done = 0.0
        if done >= rows / 4:
            break
        if proc.poll() is not None:
            raise RuntimeError(f"node {url} exited with {proc.returncode}")
        time.sleep(0.05)
    log.info("recovery: kill -9 after %.0f of %d records applied", done, rows)
    return {
        "rows": rows,
        "applied_before_kill": done,
        **restart_killed(stack, proc, url, data, app),
    }


def restart_killed(
    stack: Stack, proc: subprocess.Popen[bytes], url: str, data: Path, app: str = APP
) -> dict[str, Any]:
    """kill -9 a ready node, start it again on its data and port: seconds until it is ready."""
    port = int(url.rsplit(":", 1)[1])
    stack.stop(proc, signal.SIGKILL)
    started = time.monotonic()
    proc, url = stack.node(data, port, app=app)
    ready = wait_http(url + "/readyz", timeout=300, proc=proc)
    replayed = applied(url)
    stack.stop(proc)
    return {"ready_s": ready, "wall_s": time.monotonic() - started, "replayed": replayed}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench serving")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--ingest", type=int, default=1_000_000)
    p.add_argument("--restart", type=int, default=5_000_000)
    args = p.parse_args(argv)
    m = machine()
    result: dict[str, Any] = {"machine": m, "command": command()}
    with Stack() as stack:
        result["stacks"] = http_stacks(stack, args.seconds)
        result["point_get"] = point_get(stack, args.seconds, args.keys)
        result["handler"] = {
            name: handler_cost(
                stack.bootstrap, APP, "points", args.keys, stack.dir / f"inproc-{name}", cache
            )
            for name, cache in (("cache", 64 << 20), ("nocache", 0))
        }
        result["ingest"] = ingest(stack, args.ingest)
        result["restart"] = restart(stack, args.restart)
        result["recovery"] = recovery(stack, args.restart)
    save("serving", result)
    write_section("serving", render(result, args))


def render(r: dict[str, Any], args: argparse.Namespace) -> str:
    s, g, i, rs, h = r["stacks"], r["point_get"], r["ingest"], r["restart"], r["handler"]
    rc = r["recovery"]
    rows = "\n".join(
        f"| {name} | {x['rps']:,.0f} | {x['p50_us'] / 1000:.2f} | {x['p99_us'] / 1000:.2f} |"
        for name, x in s.items()
    )
    return f"""## Serving node

`{r["command"]}` — {facts_line(r["machine"])}. Server pinned to core 0, wrk
(1 thread, 64 keep-alive connections) on core 1, {args.seconds} s per run after a 2 s warm-up.

**HTTP stack, constant JSON body** (why the node runs on granian RSGI):

| stack | req/s | p50 ms | p99 ms |
|---|---|---|---|
{rows}

**Point GET**, random keys over a {args.keys:,}-key RocksDB table (12 partitions), against the
same stack returning a constant body in the same run:

| | req/s | p50 ms | p99 ms |
|---|---|---|---|
| GET /v1/tables/points/keys/{{k}} | {g["get"]["rps"]:,.0f} | {g["get"]["p50_us"] / 1000:.2f} | {g["get"]["p99_us"] / 1000:.2f} |
| same, read cache off (`--cache-mb 0`) | {g["get_nocache"]["rps"]:,.0f} | {g["get_nocache"]["p50_us"] / 1000:.2f} | {g["get_nocache"]["p99_us"] / 1000:.2f} |
| constant body (granian RSGI) | {g["constant"]["rps"]:,.0f} | {g["constant"]["p50_us"] / 1000:.2f} | {g["constant"]["p99_us"] / 1000:.2f} |
| ratio, default node (median run) | {g["ratio"]:.2f} | | |
| ratio, read cache off (median run) | {g["ratio_nocache"]:.2f} | | |

The default node's ratio to the constant body per round (alternating, {len(g["round_ratios"])}
rounds): {", ".join(f"{x:.2f}" for x in g["round_ratios"])}; median
{g["spread"]["ratio_median"]:.2f}, interquartile range {g["spread"]["ratio_iqr"][0]:.2f}–{g["spread"]["ratio_iqr"][1]:.2f}.
Requests per CPU-second of the node over the constant server's, per round:
{", ".join(f"{x:.2f}" for x in g["cpu_spread"]["ratios"])}; median
{g["cpu_spread"]["ratio_median"]:.2f}, interquartile range {g["cpu_spread"]["ratio_iqr"][0]:.2f}–{g["cpu_spread"]["ratio_iqr"][1]:.2f}.
Target ≥ 0.60: by req/s {settled(g["spread"]["ratio_iqr"], 0.6)}, by CPU per request
{settled(g["cpu_spread"]["ratio_iqr"], 0.6)} ("met" only when the whole interquartile range
clears it). Hot: the {args.keys:,} keys fit the default read
cache (64 MB per table), so the default node answers from it after the warm-up; the cache-off
node reads RocksDB (block cache) on every request.
Errors: {g["get"]["errors"]} socket, {g["get"]["non2xx"]} non-2xx.

CPU per request on the serving thread inside the app, in-process (`bench/handler.py`,
thread CPU time, which other load on the machine barely moves): GET
{h["cache"]["get_us"]:.2f} µs ({h["nocache"]["get_us"]:.2f} µs with the read cache off), constant
body {h["cache"]["constant_us"]:.2f} µs. The rest of a request's cost is granian's and the event
loop's, the same for both.

**Ingest** into RocksDB, {i["rows"]:,} records of 100-byte JSON, one node pinned to one core,
from process start to ready (wall clock): {i["rps_wall"]:,.0f} records/s ({i["wall_s"]:.1f} s) —
target ≥ 200,000/s: {verdict(i["rps_wall"] >= 200_000)}. While applying (the process start and
the catalog read left out): {i["rps_applying"]:,.0f} records/s.

**Restart after kill -9** of a ready node holding {rs["rows"]:,} keys (RocksDB): ready again in
{rs["ready_s"]:.2f} s, records replayed: {rs["replayed"]:,.0f} — target ≤ 5 s:
{verdict(rs["ready_s"] <= 5)}; this measures reopening the store, not recovery.
**Recovery**: kill -9 of a node after {rc["applied_before_kill"]:,.0f} of
{rc["rows"]:,} records were applied (still restoring); started again, it applied
{rc["replayed"]:,.0f} records (what was left: {rc["rows"] - rc["applied_before_kill"]:,.0f}) and
was ready in {rc["ready_s"]:.2f} s ({rc["replayed"] / max(rc["ready_s"], 1e-3):,.0f} records/s).
"""


if __name__ == "__main__":
    main(__import__("sys").argv[1:])
