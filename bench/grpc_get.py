"""gRPC Get against HTTP GET on one node: ``python -m bench grpc_get [--seconds 10]
[--rounds 7] [--keys 100000]``.

One node (``--grpc-port``, the default HTTP engine) on core 0; its load generator on
core 1. Three pairs of runs each round, each pair in alternating order:

- h2load for both (nghttp2's, in C): HTTP/1.1 GETs and gRPC ``tablecast.v1.Tables/Get``
  calls of one key, :data:`IN_FLIGHT` per connection (pipelined, multiplexed), which
  keeps the node busy. This is the pair judged: the node's requests per CPU-second,
  gRPC ÷ HTTP (target ≥ 0.8), met only when the whole interquartile range clears it.
  h2load cannot vary a request body, hence one key.
- the same with one request in flight per connection, reported.
- wrk and ghz with random keys, reported beside it: ghz (Go, from the Go proxy with
  ``go install`` when not on PATH) makes about a tenth of the calls wrk makes on one
  core, so the node is far from busy under it and pays a wake-up per call.

h2load comes with Debian's nghttp2-client. Its answers are checked by their DATA bytes:
a call that fails has none.
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
from tablecast.grpc.http2 import message
from tablecast.kafka.broker import free_port
from tablecast.proto import tables_pb2 as pb

log = logging.getLogger("bench")
TARGET = 0.8
PARTITIONS = 12
APP = "grpcget"
TABLE = "points"
GHZ = "github.com/bojand/ghz/cmd/ghz@v0.121.0"
PROTO = Path(__file__).resolve().parent.parent / "tablecast" / "proto" / "tables.proto"
NAMES = ("http", "grpc", "http_h2load", "grpc_h2load", "http_m4", "grpc_m4")
#: requests in flight per connection in the pair judged: HTTP/1.1 pipelined, gRPC
#: multiplexed (with one in flight neither server is busy: each waits for round trips)
IN_FLIGHT = 4
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
    for text, count in errors.items():
        kind = re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "ADDR", text)
        kinds[kind] = kinds.get(kind, 0) + count
    return kinds


def main(argv: list[str]) -> None:
    args = common.rounds_args("grpc_get", argv)
    common.ensure_tools({"wrk": "wrk", "h2load": "nghttp2-client"})
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
        r["rounds"] = measure(
            ghz, url, grpc_port, proc.pid, args.keys, args.seconds, args.rounds, stack.dir
        )
        stack.stop(proc)
    common.save("grpc_get", r)
    common.write_section("grpc_get", render(r))


def h2load(
    args: list[str], seconds: int, data_per_request: int | None = None, in_flight: int = 1
) -> dict[str, Any]:
    """One h2load run (50 clients, `in_flight` requests each) on the load core: req/s and
    latency (µs); an answer without the DATA bytes a found row has is an error."""
    done = subprocess.run(
        common.pinned(
            common.LOAD_CPU,
            [
                "h2load",
                "-c",
                str(CONNECTIONS),
                "-m",
                str(in_flight),
                "-t",
                "1",
                "-D",
                str(seconds),
                *args,
            ],
        ),
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    out = done.stdout
    counts = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded", out)
    rps = re.search(r"finished in [^,]+, ([\d.]+) req/s", out)
    data = re.search(r"\((\d+)\) data", out)
    latency = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out)
    if done.returncode != 0 or counts is None or rps is None or data is None:
        raise RuntimeError(f"h2load failed: {out[-2000:]}\n{done.stderr[-2000:]}")
    requests, succeeded = int(counts.group(3)), int(counts.group(4))
    errors = requests - succeeded
    if data_per_request is not None:  # gRPC's statuses are in trailers h2load does not read
        errors = max(errors, requests - int(data.group(1)) // data_per_request)
    mean = _us(latency.group(3)) if latency else 0.0
    return {
        "requests": requests,
        "errors": errors,
        "rps": float(rps.group(1)),
        "p50_us": mean,  # h2load gives min, max and mean: the mean stands in
        "p99_us": _us(latency.group(2)) if latency else 0.0,
        "tool": "h2load",
    }


def _us(text: str) -> float:
    for unit, scale in (("us", 1.0), ("ms", 1000.0), ("s", 1e6)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


def measure(
    ghz: str, url: str, grpc_port: int, pid: int, keys: int, seconds: int, rounds: int, work: Path
) -> dict[str, list[dict[str, Any]]]:
    script = key_script(tc_path(TABLE), keys)
    key = rkey(keys // 2).decode()
    body = work / "get.bin"
    body.write_bytes(message(pb.GetRequest(table=TABLE, key=key).SerializeToString()))
    found = len(message(_found(grpc_port, key)))
    one_key_http = ["--h1", f"{url}{tc_path(TABLE)}{key}"]
    one_key_grpc = [
        "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers",
        f"http://127.0.0.1:{grpc_port}/tablecast.v1.Tables/Get",
    ]  # fmt: skip
    # warm-ups: every key asked for at least once over each front end (caches of both)
    common.wrk(url + "/", script, max(seconds, 10), CONNECTIONS)
    ghz_get(ghz, grpc_port, keys, max(seconds, 10))
    h2load(one_key_grpc, 2, found)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in NAMES}

    def run(name: str, how: Any, *args: Any) -> None:
        out = common.with_cpu(how, *args, pids=(pid,))
        out["cpu_us_per_request"] = out["cpu_us_per_request"][0]
        runs[name].append(out)

    for n in range(rounds):
        pairs = (
            (("http_m4", h2load, one_key_http, seconds, None, IN_FLIGHT), ("grpc_m4", h2load, one_key_grpc, seconds, found, IN_FLIGHT)),
            (("http_h2load", h2load, one_key_http, seconds), ("grpc_h2load", h2load, one_key_grpc, seconds, found)),
            (("http", common.wrk, url + "/", script, seconds, CONNECTIONS), ("grpc", ghz_get, ghz, grpc_port, keys, seconds)),
        )  # fmt: skip
        for pair in pairs:
            for name, how, *args in pair if n % 2 == 0 else reversed(pair):
                run(name, how, *args)
        log.info(
            "round %d: h2load x%d http %.0f/s, grpc %.0f/s; x1 http %.0f/s, grpc %.0f/s; "
            "wrk %.0f/s, ghz %.0f/s", n + 1, IN_FLIGHT,
            *(runs[k][-1]["rps"] for k in ("http_m4", "grpc_m4", "http_h2load", "grpc_h2load", "http", "grpc")),
        )  # fmt: skip
    return runs


def _found(port: int, key: str) -> bytes:
    """The serialized answer of a Get of `key`, which must be found (what h2load's answers
    are checked against)."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = TablesSyncStub(channel).Get(pb.GetRequest(table=TABLE, key=key), timeout=30)
    if not answer.found:
        raise RuntimeError(f"{key} is not found over gRPC")
    return answer.SerializeToString()


class TablesSyncStub:
    def __init__(self, channel: Any) -> None:
        self.Get = channel.unary_unary(
            "/tablecast.v1.Tables/Get",
            pb.GetRequest.SerializeToString,
            pb.GetResponse.FromString,
        )


def _ratios(runs: dict[str, list[dict[str, Any]]], grpc: str, http: str) -> tuple[dict, dict]:  # type: ignore[type-arg]
    pairs = list(zip(runs[grpc], runs[http], strict=True))
    by_rps = common.ratio_spread([g["rps"] / h["rps"] for g, h in pairs])
    by_cpu = common.ratio_spread(
        [h["cpu_us_per_request"] / g["cpu_us_per_request"] for g, h in pairs]
    )
    return by_cpu, by_rps


def render(r: dict[str, Any]) -> str:
    runs, args = r["rounds"], r["args"]
    rows = "\n".join(
        f"| {label} | {common.median(runs[n])['rps']:,.0f} "
        f"| {statistics.median(x['cpu_us_per_request'] for x in runs[n]):.1f} |"
        for n, label in (
            ("http_m4", f"HTTP/1.1 GET, one key, {IN_FLIGHT} pipelined per connection (h2load)"),
            ("grpc_m4", f"gRPC Get, one key, {IN_FLIGHT} streams per connection (h2load)"),
            ("http_h2load", "HTTP/1.1 GET, one key, one at a time (h2load)"),
            ("grpc_h2load", "gRPC Get, one key, one at a time (h2load)"),
            ("http", "HTTP/1.1 GET, random keys (wrk)"),
            ("grpc", "gRPC Get, random keys (ghz)"),
        )
    )
    errors = {n: sum(x.get("errors", 0) + x.get("non2xx", 0) for x in runs[n]) for n in NAMES}
    h2_errors = sum(errors[n] for n in ("http_m4", "grpc_m4", "http_h2load", "grpc_h2load"))
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

    m4_cpu, m4_rps = _ratios(runs, "grpc_m4", "http_m4")
    h2_cpu, h2_rps = _ratios(runs, "grpc_h2load", "http_h2load")
    rk_cpu, rk_rps = _ratios(runs, "grpc", "http")
    return f"""## gRPC Get against HTTP GET, one node

`{r["command"]}` — {common.facts_line(r["machine"])}.

One node (the default HTTP engine, `--grpc-port`) on core 0, its load generator on core 1,
{CONNECTIONS} connections; {args["keys"]:,} keys of 100-byte JSON values in a
{PARTITIONS}-partition RocksDB table; {args["rounds"]} rounds of {args["seconds"]} s. Each
round runs three pairs, each pair's two runs in alternating order: h2load (C) for both
front ends asking for one key with {IN_FLIGHT} requests in flight per connection (HTTP/1.1
pipelined, gRPC multiplexed), the pair judged; h2load with one request in flight per
connection; and wrk (HTTP) beside ghz (gRPC) asking for random keys. Medians:

| front end | req/s | node CPU µs per request |
|---|---|---|
{rows}

Ratios of each round's own runs, gRPC ÷ HTTP:

| | median | interquartile range | target |
|---|---|---|---|
{row(f"h2load, {IN_FLIGHT} in flight, per CPU-second of the node", m4_cpu, True)}
{row(f"h2load, {IN_FLIGHT} in flight, by req/s", m4_rps, False)}
{row("h2load, one in flight, per CPU-second of the node", h2_cpu, False)}
{row("h2load, one in flight, by req/s", h2_rps, False)}
{row("wrk/ghz, per CPU-second of the node", rk_cpu, False)}
{row("wrk/ghz, by req/s", rk_rps, False)}

Errors over all runs: h2load {h2_errors} (a gRPC call whose answer lacks the found row's
DATA bytes counts as one), wrk {errors["http"]}, ghz {errors["grpc"]} ({named}; a call
still in flight when ghz closes its connections at the end of a run counts as one).

Rounds (req/s): {per_round}.

Hot: every key was asked for over both front ends during a warm-up; both front ends keep
whole answers the same way (the one key's always). Why the pair judged has {IN_FLIGHT}
requests in flight per connection: with one, neither server is busy (measured
2026-11-30: the node at 86-88 % of its core, h2load at about half of its own), as each
connection waits for its round trip, and a busy server's CPU per request is what a
per-core comparison is about; gRPC clients multiplex calls on a connection, and HTTP/1.1
gets the same shape by pipelining, which lowers its own cost per request too. ghz spends
about ten times wrk's CPU per call on the load core, so under it the node is far from
busy and each call pays a wake-up of the node's loop: the wrk/ghz ratios say what a Go
gRPC client with one call in flight per connection sees. h2load asks for one key because
it cannot vary a request body. The wrk runs move from round to round; a likely cause, not
checked: Gets of every key over both front ends keep answers in one budget of the node's
(`--answers-mb`), which twice the keys overflow, so each front end's runs evict the
other's entries.
"""


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(__import__("sys").argv[1:])
