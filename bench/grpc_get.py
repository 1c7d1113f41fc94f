"""gRPC Get against HTTP GET on one node: ``python -m bench grpc_get [--seconds 10]
[--rounds 7] [--keys 100000]``.

One node (``--grpc-port``, the default HTTP engine) on core 0; its load generator on
core 1, alternated each round: wrk (HTTP/1.1, keep-alive, random keys) and ghz (gRPC
``tablecast.v1.Tables/Get``, random keys), each with the same number of connections and
calls in flight. Each round's ratio gRPC ÷ HTTP is reported twice, by requests per
second and by requests per CPU-second of the node (user + system of all its threads,
from /proc); the target (≥ 0.8× per core) is met only when the whole interquartile
range clears it. ghz comes from the Go proxy (``go install``) when it is not on PATH.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

import orjson

from bench import common
from bench.anchors import CONNECTIONS, key_script, on_load_core, rkey, tc_path
from bench.stack import Stack
from tablecast.kafka.broker import free_port

log = logging.getLogger("bench")
TARGET = 0.8
PARTITIONS = 12
APP = "grpcget"
TABLE = "points"
GHZ = "github.com/bojand/ghz/cmd/ghz@v0.121.0"
PROTO = Path(__file__).resolve().parent.parent / "tablecast" / "proto" / "tables.proto"
NAMES = ("http", "grpc")
#: `python -m bench all --quick`: a test of the harness, not figures
QUICK_ARGS = ["--seconds", "2", "--keys", "20000", "--rounds", "3"]


def ensure_ghz() -> str:
    """ghz's path: on PATH, in Go's bin directory, or built there now from the Go proxy."""
    found = shutil.which("ghz")
    if found:
        return found
    gobin = Path(
        subprocess.run(
            ["go", "env", "GOPATH"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    ghz = gobin / "bin" / "ghz"
    if not ghz.exists():
        log.info("building ghz from the Go proxy (go install %s), once ...", GHZ)
        subprocess.run(["go", "install", GHZ], check=True)
    return str(ghz)


def ghz_get(ghz: str, port: int, keys: int, seconds: int) -> dict[str, Any]:
    """One ghz run of Get for random keys: req/s and latency percentiles (µs)."""
    # a Go template in a JSON string: its own string in backquotes
    key = "key:{{printf `%%012d` (randomInt 0 %d)}}" % keys  # noqa: UP031
    data = orjson.dumps({"table": TABLE, "key": key}).decode()
    done = subprocess.run(
        common.pinned(
            common.LOAD_CPU,
            [
                ghz,
                "--insecure",
                "--proto",
                str(PROTO),
                "--call",
                "tablecast.v1.Tables/Get",
                "-d",
                data,
                "-c",
                str(CONNECTIONS),
                "--connections",
                str(CONNECTIONS),
                "-z",
                f"{seconds}s",
                "--cpus",
                "1",
                "--format",
                "json",
                f"127.0.0.1:{port}",
            ],
        ),
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ghz failed: {done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    report = orjson.loads(done.stdout)
    ok = report.get("statusCodeDistribution", {}).get("OK", 0)
    errors = sum(v for k, v in report.get("statusCodeDistribution", {}).items() if k != "OK")
    pct = {int(p["percentage"]): p["latency"] / 1000 for p in report["latencyDistribution"]}
    return {
        "requests": ok + errors,
        "ok": ok,
        "errors": errors,
        "rps": report["rps"],
        "p50_us": pct[50],
        "p99_us": pct[99],
        "error_kinds": _kinds(report.get("errorDistribution") or {}),
        "tool": "ghz",
    }


def _kinds(errors: dict[str, int]) -> dict[str, int]:
    """ghz's errors by kind: its messages with the connections' addresses left out."""
    kinds: dict[str, int] = {}
    for message, count in errors.items():
        kind = re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "ADDR", message)
        kinds[kind] = kinds.get(kind, 0) + count
    return kinds


def main(argv: list[str]) -> None:
    args = common.rounds_args("grpc_get", argv)
    common.ensure_tools({"wrk": "wrk"})
    ghz = ensure_ghz()
    r: dict[str, Any] = {
        "machine": common.machine(),
        "command": common.command(),
        "args": vars(args),
    }
    with Stack() as stack, on_load_core():
        stack.table(TABLE, args.keys, PARTITIONS, app=APP, key_of=rkey)
        grpc_port = free_port()
        proc, url = stack.node(stack.dir / "node", None, "--grpc-port", str(grpc_port), app=APP)
        common.wait_http(url + "/readyz", timeout=300, proc=proc)
        r["rounds"] = measure(ghz, url, grpc_port, proc.pid, args.keys, args.seconds, args.rounds)
        stack.stop(proc)
    common.save("grpc_get", r)
    common.write_section("grpc_get", render(r))


def measure(
    ghz: str, url: str, grpc_port: int, pid: int, keys: int, seconds: int, rounds: int
) -> dict[str, list[dict[str, Any]]]:
    script = key_script(tc_path(TABLE), keys)
    # warm-ups: every key asked for at least once over each front end (caches of both)
    common.wrk(url + "/", script, max(seconds, 10), CONNECTIONS)
    ghz_get(ghz, grpc_port, keys, max(seconds, 10))
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in NAMES}

    def run(name: str, how: Any, *args: Any) -> None:
        out = common.with_cpu(how, *args, pids=(pid,))
        out["cpu_us_per_request"] = out["cpu_us_per_request"][0]
        runs[name].append(out)

    for n in range(rounds):
        first, second = ("http", "grpc") if n % 2 == 0 else ("grpc", "http")
        for name in (first, second):
            if name == "http":
                run(name, common.wrk, url + "/", script, seconds, CONNECTIONS)
            else:
                run(name, ghz_get, ghz, grpc_port, keys, seconds)
        log.info("round %d: http %.0f/s, grpc %.0f/s", n + 1, runs["http"][-1]["rps"],
                 runs["grpc"][-1]["rps"])  # fmt: skip
    return runs


def render(r: dict[str, Any]) -> str:
    runs, args = r["rounds"], r["args"]
    by_rps = common.ratio_spread(
        [g["rps"] / h["rps"] for g, h in zip(runs["grpc"], runs["http"], strict=True)]
    )
    by_cpu = common.ratio_spread(
        [
            h["cpu_us_per_request"] / g["cpu_us_per_request"]
            for g, h in zip(runs["grpc"], runs["http"], strict=True)
        ]
    )
    rows = "\n".join(
        f"| {label} | {common.median(runs[n])['rps']:,.0f} | {common.median(runs[n])['p50_us'] / 1000:.2f} "
        f"| {common.median(runs[n])['p99_us'] / 1000:.2f} "
        f"| {statistics.median(x['cpu_us_per_request'] for x in runs[n]):.1f} |"
        for n, label in (("http", "HTTP/1.1 GET (wrk)"), ("grpc", "gRPC Get (ghz)"))
    )
    errors = sum(x.get("errors", 0) + x.get("non2xx", 0) for v in runs.values() for x in v)
    kinds: dict[str, int] = {}
    for x in runs["grpc"]:
        for kind, count in x.get("error_kinds", {}).items():
            kinds[kind] = kinds.get(kind, 0) + count
    named = "; ".join(f"{count} × `{kind}`" for kind, count in kinds.items()) or "none named"
    per_round = "; ".join(f"{n} " + ", ".join(f"{x['rps']:,.0f}" for x in runs[n]) for n in NAMES)

    def row(label: str, s: dict[str, Any], judged: bool) -> str:
        lo, hi = s["ratio_iqr"]
        verdict = f"{common.settled(s['ratio_iqr'], TARGET)} (≥ {TARGET})" if judged else ""
        return f"| {label} | {s['ratio_median']:.2f} | {lo:.2f}–{hi:.2f} | {verdict} |"

    return f"""## gRPC Get against HTTP GET, one node

`{r["command"]}` — {common.facts_line(r["machine"])}.

One node (the default HTTP engine, `--grpc-port`) on core 0, its load generator on core 1:
wrk (1 thread, {CONNECTIONS} keep-alive connections) for HTTP, ghz (one CPU,
{CONNECTIONS} connections, {CONNECTIONS} calls in flight) for gRPC; {args["keys"]:,}
random keys of 100-byte JSON values in a {PARTITIONS}-partition RocksDB table;
{args["rounds"]} rounds of {args["seconds"]} s, the two in alternating order, medians shown.
Errors and non-OK answers over all runs: {errors} (ghz's: {named}; a call still in
flight when ghz closes its connections at the end of a run counts as one).

| front end | req/s | p50 ms | p99 ms | node CPU µs per request |
|---|---|---|---|---|
{rows}

Ratios of each round's own runs, gRPC ÷ HTTP:

| | median | interquartile range | target |
|---|---|---|---|
{row("per CPU-second of the node", by_cpu, True)}
{row("by req/s", by_rps, False)}

Rounds (req/s): {per_round}.

Hot: every key was asked for over both front ends during a warm-up. The two load
generators differ (wrk is C, ghz Go with its own per-call costs on the load core), so
the per-CPU-second ratio, which counts only the node's work, is the one judged; by
req/s a load generator that saturates its core first would set the figure.
"""


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(__import__("sys").argv[1:])
