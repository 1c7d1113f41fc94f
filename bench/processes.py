"""One node's point GETs against the cores and processes it is given:
``python -m bench processes [--seconds 10] [--rounds 7] [--keys 100000]``.

Three nodes of the same data, one at a time, alternated each round (the order flips each
round): one process on core 0 (the load generator on core 1, as in every other section);
one process allowed both cores; ``--processes 2`` allowed both cores. This machine has two
cores, so with two cores given the load generator (wrk on core 1) shares a core with the
node. wrk pipelines its requests (8 per write) because unpipelined it costs about as much
CPU per request as the node (16 µs, mostly system time, measured): it would take most of a
core, and the node could not show what a second core gives it.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import httpx
import orjson

from bench import common
from bench.anchors import CONNECTIONS, on_load_core, rkey, tc_path
from bench.common import (
    SERVER_CPU,
    command,
    cpu_seconds,
    facts_line,
    machine,
    median,
    ratio_spread,
    save,
    wait_http,
    write_section,
    wrk,
)
from bench.stack import Stack
from tablecast.cli.supervisor import children

log = logging.getLogger("bench")
PARTITIONS = 12
BOTH = "0,1"
#: name -> (app id: each node its own, cores, serve options)
NODES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "one_core": ("procs-one", SERVER_CPU, ()),
    "one_process": ("procs-single", BOTH, ()),
    "two_processes": ("procs-two", BOTH, ("--processes", "2")),
}
LABELS = {
    "one_core": "1 process, core 0 (wrk on core 1)",
    "one_process": "1 process, cores 0–1 (wrk on core 1 too)",
    "two_processes": "`--processes 2`, cores 0–1 (wrk on core 1 too)",
}
#: requests wrk writes at once on a connection
DEPTH = 8
SETTLE_S = 2.0
#: read processes report what they answered once a second
REPORT_S = 1.2
QUICK_ARGS = ["--seconds", "2", "--keys", "20000", "--rounds", "3"]


def main(argv: list[str]) -> None:
    if argv == ["--render"]:
        write_section(
            "processes", render(orjson.loads((common.OUT / "processes.json").read_bytes()))
        )
        return
    args = common.rounds_args("processes", argv)
    common.ensure_tools({"wrk": "wrk"})
    r: dict[str, Any] = {"machine": machine(), "command": command(), "args": vars(args)}
    with Stack() as stack, on_load_core():
        urls, procs = {}, {}
        for name, (app, cpus, extra) in NODES.items():
            stack.table("points", args.keys, PARTITIONS, app=app, key_of=rkey)
            proc, url = stack.node(stack.dir / name, None, *extra, app=app, cpus=cpus)
            wait_http(url + "/readyz", timeout=300, proc=proc)
            urls[name], procs[name] = url, proc
        r["rounds"] = measure(urls, procs, args.keys, args.seconds, args.rounds)
        for p in procs.values():
            stack.stop(p)
    save("processes", r)
    write_section("processes", render(r))


def _cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of a node, and of its read processes."""
    return cpu_seconds(pid), sum(cpu_seconds(c) for c in children(pid))


def _by_readers(url: str) -> int:
    """Requests the node's read processes answered (they report once a second)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    found = re.search(r"^tablecast_http_requests_by_read_processes_total (\S+)$", text, re.M)
    return int(float(found[1])) if found else 0


def measure(
    urls: dict[str, str], procs: dict[str, Any], keys: int, seconds: int, rounds: int
) -> dict[str, list[dict[str, Any]]]:
    script = pipelined_script(tc_path("points"), keys)
    for name in NODES:  # warm-up: every key asked for (kept answers, caches, each process's)
        wrk(urls[name] + "/", script, max(seconds, 10), CONNECTIONS)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in NODES}
    for n in range(rounds):
        order = list(NODES) if n % 2 == 0 else list(reversed(NODES))
        for name in order:
            time.sleep(SETTLE_S)
            pid = procs[name].pid
            (node, readers), answered = _cpu(pid), _by_readers(urls[name])
            run = wrk(urls[name] + "/", script, seconds, CONNECTIONS)
            node_after, readers_after = _cpu(pid)
            run["node_cpu_s"] = node_after - node + readers_after - readers
            run["readers_cpu_s"] = readers_after - readers
            time.sleep(REPORT_S)  # the read processes' last report of the run
            run["by_readers"] = _by_readers(urls[name]) - answered
            runs[name].append(run)
        log.info(
            "round %d: %s", n + 1, ", ".join(f"{k} {v[-1]['rps']:,.0f}" for k, v in runs.items())
        )
    return runs


def pipelined_script(prefix: str, keys: int) -> str:
    """wrk's requests: DEPTH GETs of uniformly random keys (Redis' names) per write."""
    return f"""
math.randomseed(os.time())
request = function()
  local r = {{}}
  for i = 1, {DEPTH} do
    r[i] = wrk.format("GET", "{prefix}key:" .. string.format("%012d", math.random(0, {keys - 1})))
  end
  return table.concat(r)
end
"""


def _ratio(runs: dict[str, list[dict[str, Any]]], ours: str, theirs: str) -> dict[str, Any]:
    return ratio_spread(
        [a["rps"] / b["rps"] for a, b in zip(runs[ours], runs[theirs], strict=True)]
    )


def _mid(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def render(r: dict[str, Any]) -> str:
    runs, args = r["rounds"], r["args"]
    rows = []
    for n in NODES:
        m = median(runs[n])
        node_cpu = _mid([x["node_cpu_s"] / x["duration_us"] * 1e6 for x in runs[n]])
        load_cpu = _mid([x["load_cpu_s"] / x["duration_us"] * 1e6 for x in runs[n]])
        rows.append(
            f"| {LABELS[n]} | {m['rps']:,.0f} | {m['p50_us'] / 1000:.2f} | "
            f"{m['p99_us'] / 1000:.2f} | {node_cpu:.2f} | {load_cpu:.2f} | "
            f"{m['errors'] + m['non2xx']} |"
        )
    pairs = [
        ("two_processes", "one_core", "2 processes on 2 cores ÷ 1 process on 1 core"),
        ("two_processes", "one_process", "2 processes ÷ 1 process, both on 2 cores"),
        ("one_process", "one_core", "1 process on 2 cores ÷ on 1 core"),
    ]
    ratio_rows = []
    for ours, theirs, label in pairs:
        s = _ratio(runs, ours, theirs)
        lo, hi = s["ratio_iqr"]
        ratio_rows.append(f"| {label} | {s['ratio_median']:.2f} | {lo:.2f}–{hi:.2f} |")
    split = [
        (
            x["by_readers"] / x["requests"],
            x["readers_cpu_s"] / x["node_cpu_s"],
            (x["node_cpu_s"] - x["readers_cpu_s"]) / max(1, x["requests"] - x["by_readers"]),
            x["readers_cpu_s"] / max(1, x["by_readers"]),
        )
        for x in runs["two_processes"]
        if "by_readers" in x
    ]
    share, cpu_share, node_us, reader_us = (
        _mid([t[i] for t in split]) if split else float("nan") for i in range(4)
    )
    per_round = "; ".join(
        f"{LABELS[n]}: " + ", ".join(f"{x['rps']:,.0f}" for x in runs[n]) for n in NODES
    )
    table_rows = "\n".join(rows)
    ratio_table = "\n".join(ratio_rows)
    return f"""## One node on more than one core: read processes

`{r["command"]}` — {facts_line(r["machine"])}.

Three nodes, each its own copy of {args["keys"]:,} keys (100-byte JSON values, a
{PARTITIONS}-partition RocksDB table), one at a time: wrk (1 thread, {CONNECTIONS}
keep-alive connections, {DEPTH} requests of random keys per write) on core 1 against each
for {args["seconds"]} s, in {args["rounds"]} rounds whose order flips each round, medians
shown. *node CPU* is the CPU seconds per second of the node and its read processes during
the run, *wrk CPU* the load generator's.

| node | req/s | p50 ms | p99 ms | node CPU (cores) | wrk CPU (cores) | errors |
|---|---|---|---|---|---|---|
{table_rows}

Ratios of each round's own runs:

| | median | interquartile range |
|---|---|---|
{ratio_table}

Rounds (req/s): {per_round}.

With `--processes 2` a read process listens on the node's port beside the node
(SO_REUSEPORT): the kernel hands each new connection to one of their sockets, and the read
process answers its connections from a RocksDB secondary instance of the node's stores
(and its own kept answers), the node its own from its kept answers. Medians over the
rounds: the read process answered {share:.0%} of the requests with {cpu_share:.0%} of the
two processes' CPU; per request the node spent {node_us * 1e6:.1f} µs of CPU and the read
process {reader_us * 1e6:.1f} µs (it looks a request's whole head up among the answers it
kept, where the node parses each head with httptools first), so part of the gain is that
cheaper path, not only the second core. Hot: every
key was asked for in a warm-up, no write moves a partition during the runs. What could
hurt or flatter: this machine has two cores and the load generator needs one of them
(wrk's share of core 1 is taken from the node's second core); the single process on two
cores gets the second core only for its other threads (ingest, RocksDB, the collector),
its event loop being one thread. Pipelined requests flatter both sides alike: the node
reads several requests with one system call (it still writes each answer on its own).
The read process answers a request whose head it answered before from the answer it
kept, as the node does from its kept answers; a client whose every request differs in
more than the key (a tracing header) gets none of that from either.
"""


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    main(__import__("sys").argv[1:])
