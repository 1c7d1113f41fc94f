"""Point GET per core against Redis: ``python -m bench redis_get [--seconds 6]
[--rounds 7] [--keys 100000]``.

One server at a time on core 0, its load generator on core 1, alternated each round:
a tablecast node with kept answers on ``--http-engine granian``, the same with
``--http-engine loop`` (the default: HTTP/1.1 parsed on the event loop's thread), a granian
node with ``--answers-mb 0`` (every GET routed and read from the read cache), Redis (redis-benchmark's GET, 50 clients) and the
node's granian stack returning a constant body, and the loop engine answering every GET with
one kept answer (wrk, 50 connections for the HTTP servers).
The servers not being measured are stopped (SIGSTOP) for each run, so each has core 0 to
itself as when a user measures it alone; each round also measures the loop engine and
Redis with the others idle beside them, which is how this benchmark ran before.
Each round's own ratios are reported with their median and interquartile range; the target
(≥ 0.6× Redis per CPU-second) is met only when the whole range clears it.
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from bench import common
from bench.anchors import CONNECTIONS, key_script, on_load_core, redis_get, rkey, tc_path
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
    wait_http,
    with_cpu,
    write_section,
    wrk,
)
from bench.peers import redis as rp
from bench.stack import Stack, value_of

log = logging.getLogger("bench")
TARGET = 0.6
PARTITIONS = 12
#: each node its own app id: two nodes of one app would split the partitions and forward
APPS = {
    "tablecast": "redisget",
    "tablecast_loop": "redisget-loop",
    "tablecast_routed": "redisget-routed",
}
EXTRA = {
    "tablecast": ("--http-engine", "granian"),
    "tablecast_loop": ("--http-engine", "loop"),
    "tablecast_routed": ("--http-engine", "granian", "--answers-mb", "0"),
}
NAMES = ("tablecast", "tablecast_loop", "tablecast_routed", "redis", "constant", "one_kept")
#: measured again with the other servers left running idle on the server core
BESIDE = ("tablecast_loop_beside", "redis_beside")
#: `python -m bench all --quick`: a test of the harness, not figures
QUICK_ARGS = ["--seconds", "2", "--keys", "20000", "--rounds", "3"]


def main(argv: list[str]) -> None:
    if argv == ["--render"]:  # measure nothing: redraw the section from the saved results
        write_section(
            "redis_get", render(orjson.loads((common.OUT / "redis_get.json").read_bytes()))
        )
        return
    args = common.rounds_args("redis_get", argv)
    rp.ensure_installed()
    common.ensure_tools({"wrk": "wrk"})
    r: dict[str, Any] = {"machine": machine(), "command": command(), "args": vars(args)}
    with Stack() as stack, on_load_core():
        urls, procs = {}, {}
        for name, app in APPS.items():
            stack.table("points", args.keys, PARTITIONS, app=app, key_of=rkey)
            proc, url = stack.node(stack.dir / name, None, *EXTRA.get(name, ()), app=app)
            wait_http(url + "/readyz", timeout=300, proc=proc)
            urls[name] = url
            procs[name] = proc
        procs["constant"], urls["constant"] = stack.baseline("granian-rsgi")
        procs["one_kept"], urls["one_kept"] = stack.baseline("loop-kept")
        pids = {name: p.pid for name, p in procs.items()}
        with rp.start(stack.dir / "redis", cpus=SERVER_CPU) as redis:
            rp.load_numbered(redis, args.keys, value_of)
            r["rounds"] = measure(urls, pids, redis, args.keys, args.seconds, args.rounds)
        for p in procs.values():
            stack.stop(p)
    save("redis_get", r)
    write_section("redis_get", render(r))


def measure(
    urls: dict[str, str],
    pids: dict[str, int],
    redis: rp.RedisServer,
    keys: int,
    seconds: int,
    rounds: int,
) -> dict[str, list[dict[str, Any]]]:
    """Each round every server in turn; each run with the server's CPU per request (µs),
    which no time slice taken by another process on its core can move much."""
    script = key_script(tc_path("points"), keys)
    # warm-ups: every key asked for at least once (kept answers, read cache, block cache)
    for name in APPS:
        wrk(urls[name] + "/", script, max(seconds, 10), CONNECTIONS)
    wrk(urls["constant"] + "/", None, 2, CONNECTIONS)
    wrk(urls["one_kept"] + "/", script, 2, CONNECTIONS)
    guess = rp.benchmark(redis, keys, 200_000, clients=CONNECTIONS, cpus=LOAD_CPU).rps
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in (*NAMES, *BESIDE)}

    everyone = [*pids.values(), redis.pid]

    def run(name: str, pid: int, how: Any, *args: Any, beside: bool = False) -> None:
        """One measured run; the others on the server core stopped for it (a user measuring
        one server has nothing else there), or left running idle beside it (`beside`)."""
        others = [p for p in everyone if p != pid]
        if beside:
            out = with_cpu(how, *args, pids=(pid, *others))
            spent = out["cpu_us_per_request"]
            out["cpu_us_per_request"] = spent[0]
            # what the idle servers beside it took of the core: their CPU per request × req/s
            out["beside_cpu_share"] = sum(spent[1:]) * out["rps"] / 1e6
            runs[f"{name}_beside"].append(out)
            return
        with stopped(others):
            if name in APPS:  # stopped meanwhile: ready and hot again before it is measured
                wait_http(urls[name] + "/readyz", timeout=60)
                wrk(urls[name] + "/", script, 2, CONNECTIONS)
            out = with_cpu(how, *args, pids=(pid,))
        out["cpu_us_per_request"] = out["cpu_us_per_request"][0]
        runs[name].append(out)

    def http(name: str, lua: str | None, beside: bool = False) -> None:
        run(name, pids[name], wrk, urls[name] + "/", lua, seconds, CONNECTIONS, beside=beside)

    for n in range(rounds):
        http("tablecast", script)
        run("redis", redis.pid, redis_get, redis, keys, seconds, guess)
        http("tablecast_loop", script)
        http("tablecast_routed", script)
        http("constant", None)
        http("one_kept", script)  # the same random paths as the node's, one answer for all
        http("tablecast_loop", script, beside=True)
        run("redis", redis.pid, redis_get, redis, keys, seconds, guess, beside=True)
        log.info(
            "round %d: %s", n + 1, ", ".join(f"{k} {v[-1]['rps']:,.0f}" for k, v in runs.items())
        )
    return runs


@contextmanager
def stopped(pids: list[int]) -> Iterator[None]:
    """These processes stopped (SIGSTOP) for the block, continued after it."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def ratios(runs: dict[str, list[dict[str, Any]]], ours: str, theirs: str) -> dict[str, Any]:
    return ratio_spread(
        [a["rps"] / b["rps"] for a, b in zip(runs[ours], runs[theirs], strict=True)]
    )


def cpu_ratios(runs: dict[str, list[dict[str, Any]]], ours: str, theirs: str) -> dict[str, Any]:
    """Requests per CPU-second of the server, ours ÷ theirs: the per-core ratio even where a
    load generator, not the server, sets the rate."""
    return ratio_spread(
        [
            b["cpu_us_per_request"] / a["cpu_us_per_request"]
            for a, b in zip(runs[ours], runs[theirs], strict=True)
        ]
    )


LABELS = {
    "tablecast": "tablecast node, kept answers, `--http-engine granian`",
    "tablecast_loop": "tablecast node, kept answers, `--http-engine loop` (default)",
    "tablecast_routed": "tablecast node, granian, `--answers-mb 0` (routed, read cache)",
    "redis": "Redis GET (redis-benchmark)",
    "constant": "constant body, the node's granian stack (RSGI)",
    "one_kept": "one kept answer for every key, the node's loop engine",
}

SHORT = {
    "tablecast": "kept answers on granian",
    "tablecast_loop": "kept answers on the loop engine",
    "tablecast_routed": "routed on granian",
    "redis": "Redis",
    "constant": "constant body",
    "one_kept": "one kept answer",
}


def render(r: dict[str, Any]) -> str:
    runs, args = r["rounds"], r["args"]
    rows = "\n".join(
        f"| {LABELS[n]} | {median(runs[n])['rps']:,.0f} | {median(runs[n])['p50_us'] / 1000:.2f} "
        f"| {median(runs[n])['p99_us'] / 1000:.2f} |"
        for n in NAMES
    )
    pairs = [
        ("tablecast", "redis", "kept answers, granian ÷ Redis", True),
        ("tablecast_loop", "redis", "kept answers, loop engine (default) ÷ Redis", True),
        ("tablecast_loop", "tablecast", "loop engine ÷ granian (kept answers)", False),
        ("tablecast_routed", "redis", "routed ÷ Redis", False),
        ("tablecast", "tablecast_routed", "kept answers ÷ routed", False),
        ("tablecast", "constant", "kept answers ÷ constant body", False),
        ("constant", "redis", "constant body ÷ Redis", False),
        ("tablecast_loop", "one_kept", "kept answers ÷ one kept answer (loop engine)", False),
        ("one_kept", "redis", "one kept answer ÷ Redis", False),
    ]
    ratio_rows = []
    for ours, theirs, label, target in pairs:
        s = ratios(runs, ours, theirs)
        lo, hi = s["ratio_iqr"]
        verdict = f"{settled(s['ratio_iqr'], TARGET)} (≥ {TARGET})" if target else ""
        ratio_rows.append(f"| {label} | {s['ratio_median']:.2f} | {lo:.2f}–{hi:.2f} | {verdict} |")
    ratio_table = "\n".join(ratio_rows)
    cpu_table = _cpu_table(runs)
    per_round = "; ".join(f"{n} " + ", ".join(f"{x['rps']:,.0f}" for x in runs[n]) for n in NAMES)
    return f"""## Point GET per core against Redis

`{r["command"]}` — {facts_line(r["machine"])}.

Each server in turn on core 0, its load generator on core 1: wrk (1 thread,
{CONNECTIONS} keep-alive connections, random keys) for the HTTP servers,
redis-benchmark ({CONNECTIONS} clients, random keys) for Redis; {args["keys"]:,} keys
named as redis-benchmark names them with 100-byte JSON values, a {PARTITIONS}-partition
RocksDB table; {args["rounds"]} rounds of {args["seconds"]} s alternating the six servers,
medians shown. While one server is measured the others on core 0 are stopped (SIGSTOP), as
a user measuring one server has it alone; a node stopped meanwhile is waited ready and
asked 2 s of reads before it is measured.

| server | req/s | p50 ms | p99 ms |
|---|---|---|---|
{rows}

Ratios of each round's own runs:

| | median | interquartile range | target |
|---|---|---|---|
{ratio_table}

Rounds (req/s): {per_round}.
{cpu_table}
Hot: every key was asked for during a warm-up, so the kept answers and the read cache
hold all of them, and no write moves a partition during the runs (a write to a partition
ends its kept answers until they are read again; BENCHMARKS' cold section has reads that go
to disk). Redis answers RESP from its own C client; the HTTP servers answer HTTP/1.1 to
wrk, so the protocols differ, as they do for a user choosing between them. The
constant-body row is granian's stack when Python does nothing; the one-kept-answer row is
the loop engine's hot path when every lookup finds the same entry in cache, so what the
node costs beyond it is finding one of {args["keys"]:,} answers spread over its heap.

{_beside(runs)}{_flatter(runs, cpu_table != "")} granian's rows are bounded by
its HTTP stack (each request handed to the Python event loop from granian's own thread); the
loop engine, the default, parses HTTP/1.1 on the event loop and writes a kept answer as the
bytes it last wrote, for a request it has seen byte for byte before without parsing it (it
serves no HTTP/2: docs/operations.md). A read path that answers
without Python is not built.
"""


def _beside(runs: dict[str, list[dict[str, Any]]]) -> str:
    """The loop engine and Redis measured again with the other servers idle beside them."""
    if not all(runs.get(n) for n in BESIDE):
        return ""  # results saved before this was measured
    alone = cpu_ratios(runs, "tablecast_loop", "redis")
    beside = cpu_ratios(runs, "tablecast_loop_beside", "redis_beside")

    def us(name: str) -> str:
        return f"{statistics.median(x['cpu_us_per_request'] for x in runs[name]):.1f} µs"

    share = statistics.median(x["beside_cpu_share"] for v in BESIDE for x in runs[v])
    return f"""Each round also measured the loop engine and Redis with the five other servers left
running idle on core 0 beside them (as this benchmark ran until 2026-11-29): they took
{share:.1%} of the core (median), and per CPU-second the loop engine ÷ Redis was
{beside["ratio_median"]:.2f} ({beside["ratio_iqr"][0]:.2f}–{beside["ratio_iqr"][1]:.2f}) against
{alone["ratio_median"]:.2f} ({alone["ratio_iqr"][0]:.2f}–{alone["ratio_iqr"][1]:.2f}) alone; CPU
per GET alone and beside: Redis {us("redis")} and {us("redis_beside")}, the node
{us("tablecast_loop")} and {us("tablecast_loop_beside")}.

"""


def _flatter(runs: dict[str, list[dict[str, Any]]], cpu_measured: bool) -> str:
    """What could flatter the ratios to Redis in this run."""
    redis = median(runs["redis"])["rps"]
    if cpu_measured:
        return (
            f"What could flatter us: by req/s, the load generator holding Redis ({redis:,.0f} "
            "GET/s here) below its core's capacity, which the per-CPU-second ratios leave out; "
            "both move with the machine's hour. And wrk sends the same bytes whenever it asks "
            "for a key, so after the warm-up the loop engine answers each GET from the "
            "request's bytes without parsing it; a client whose requests differ every time "
            "(a changing header such as a trace id) has each one parsed, which cost about 11.5 "
            "µs of node CPU per GET here before requests were kept by their bytes."
        )
    const_redis = ratios(runs, "constant", "redis")["ratio_median"]
    kept_const = ratios(runs, "tablecast", "constant")["ratio_median"]
    loop_const = ratios(runs, "tablecast_loop", "constant")["ratio_median"]
    return (
        "What could flatter us: the ratio to Redis moves with the machine, and here by more "
        f"than the margin. Redis answered {redis:,.0f} GET/s in this run, with the constant "
        f"body at {const_redis:.2f}× of it; on other days this machine's Redis answered "
        "137,000–165,000/s with the same constant body at 0.55–0.61× (the anchors section), "
        f"where kept answers at this run's {kept_const:.2f}× of the constant body would be "
        f"about {kept_const * 0.55:.2f}–{kept_const * 0.61:.2f}× Redis, and the loop engine at "
        f"its {loop_const:.2f}× about {loop_const * 0.55:.2f}–{loop_const * 0.61:.2f}× "
        "(derived, not measured: a faster Redis hour may not move the others alike)."
    )


def _cpu_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """The servers' CPU per request and the per-core ratios to Redis, when the run took them."""
    if any("cpu_us_per_request" not in x for v in runs.values() for x in v):
        return ""  # results saved before the servers' CPU was measured
    cpu = "; ".join(
        f"{SHORT[n]} {statistics.median(x['cpu_us_per_request'] for x in runs[n]):.1f} µs"
        for n in NAMES
    )
    rows = []
    for ours, label in (
        ("tablecast", "kept answers, granian"),
        ("tablecast_loop", "kept answers, loop engine (default)"),
        ("constant", "constant body"),
        ("one_kept", "one kept answer for every key, loop engine"),
    ):
        s = cpu_ratios(runs, ours, "redis")
        lo, hi = s["ratio_iqr"]
        verdict = (
            f"{settled(s['ratio_iqr'], TARGET)} (≥ {TARGET})"
            if ours.startswith("tablecast")
            else ""
        )
        rows.append(
            f"| {label} ÷ Redis, per server CPU-second | {s['ratio_median']:.2f} "
            f"| {lo:.2f}–{hi:.2f} | {verdict} |"
        )
    table = "\n".join(rows)
    return f"""
A load generator on one core can bound a fast server below its core's capacity, so each
run also measured the server's own CPU (user + system, all its threads, from /proc) per
request, medians: {cpu}. Requests per CPU-second of the server, each round's
ratio (the per-core comparison whichever side the load generator held back; what it
leaves out is kernel work not charged to the server's threads, such as loopback traffic
handled in softirq on behalf of whichever process held the core, on both sides alike):

| | median | interquartile range | target |
|---|---|---|---|
{table}
"""


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    main(__import__("sys").argv[1:])
