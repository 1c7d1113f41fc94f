"""A rolling restart at scale: N nodes of one app, reads from a load balancer, no read lost.

python -m bench rolling [--nodes 30] [--partitions 30] [--keys 30000] [--restart 3]

N serving nodes (one standby per partition) on this machine; clients read
random keys through a load balancer that polls every node's ``/readyz`` every
0.2 s and sends reads only to nodes that answered 200 (a stopping node
included, until it says it is not ready; with none ready, it fails open to the
nodes that answer, as Envoy's panic mode does). Nothing is retried: a read not
answered 200 with the right value counts as failed, whatever the cause (a
503, a refused connection). Then `--restart` nodes are restarted one after
the other: SIGTERM, wait until it has exited, start it again 2 s later on the
same port and data, wait until it is ready.
"""

from __future__ import annotations

import argparse
import logging
import random
import resource
import signal
import time
from typing import Any

from bench.balancer import POLL_S, Balancer
from bench.common import answers_200, command, facts_line, machine, publish, rss_bytes
from bench.stack import Stack, short_key, value_of
from tablecast.kafka.broker import free_port

log = logging.getLogger("bench")
TABLE = "rolling"
CLIENTS = 3


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench rolling")
    p.add_argument("--nodes", type=int, default=30)
    p.add_argument("--partitions", type=int, default=30)
    p.add_argument("--keys", type=int, default=30_000)
    p.add_argument("--restart", type=int, default=3, help="nodes restarted one after another")
    args = p.parse_args(argv)
    # 30 nodes and their clients keep more sockets open than a default shell allows
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    with Stack() as stack:
        stack.table(TABLE, args.keys, args.partitions)
        ports = [free_port() for _ in range(args.nodes)]
        procs: dict[int, Any] = {}

        def start(i: int) -> None:
            procs[i], _ = stack.node(
                stack.dir / f"data-{i}",
                ports[i],
                "--standby-replicas",
                "1",
                "--cache-mb",
                "8",
                "--answers-mb",
                "8",
                "--block-cache-mb",
                "16",
                cpus=None,  # type: ignore[arg-type]
            )

        urls = [f"http://127.0.0.1:{port}" for port in ports]
        started = time.monotonic()
        for i in range(args.nodes):
            start(i)
        ready_s = _all_ready(urls, 600)
        log.info("%d nodes ready in %.0f s", args.nodes, ready_s)
        rss_mib = sorted(rss_bytes(procs[i].pid) / 2**20 for i in range(args.nodes))
        restarts: list[dict[str, float]] = []
        keys = [short_key(i).decode() for i in range(args.keys)]
        with Balancer(
            lambda: urls, TABLE, keys, lambda key, r: value_of(int(key[1:])) in r.content, CLIENTS
        ) as load:
            time.sleep(5)
            for i in random.Random(7).sample(range(args.nodes), args.restart):
                t0 = time.monotonic()
                procs[i].send_signal(signal.SIGTERM)
                procs[i].wait(60)
                stopped = time.monotonic() - t0
                stack.procs.remove(procs[i])
                time.sleep(2)
                start(i)
                back = _all_ready([urls[i]], 300)
                log.info(
                    "node %d: stopped in %.1f s, ready %.1f s after its start", i, stopped, back
                )
                restarts.append({"node": i, "stop_s": round(stopped, 2), "ready_s": round(back, 2)})
            time.sleep(5)
        # all at once, as a cluster is shut down: one after another, each would hand its
        # partitions over to the rest first
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(60)
        result = {
            "command": command(),
            "machine": machine(),
            "nodes": args.nodes,
            "partitions": args.partitions,
            "keys": args.keys,
            "ready_s": round(ready_s, 1),
            "started_to_ready_s": round(time.monotonic() - started, 1),
            "rss_mib_median": round(rss_mib[len(rss_mib) // 2], 1),
            "restarts": restarts,
            "reads": load.ok + sum(load.failed.values()),
            "ok": load.ok,
            "failed": dict(load.failed),
            "failed_open": load.failed_open,
            "samples": load.samples,
        }
    publish("rolling", result, render(result))


def _all_ready(urls: list[str], timeout: float) -> float:
    started = time.monotonic()
    waiting = list(urls)
    while waiting:
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{len(waiting)} node(s) not ready: {waiting[:3]}")
        waiting = [u for u in waiting if not answers_200(f"{u}/readyz")]
        if waiting:
            time.sleep(0.5)
    return time.monotonic() - started


def render(r: dict[str, Any]) -> str:
    failed = sum(r["failed"].values())
    stops = ", ".join(f"{x['stop_s']:.1f}" for x in r["restarts"])
    lines = [
        "## Rolling restart at scale",
        "",
        f"`{r['command']}` — {facts_line(r['machine'])}.",
        "",
        f"{r['nodes']} nodes of one app on this machine, {r['partitions']} partitions with "
        f"one standby each, {r['keys']:,} keys; ready {r['ready_s']} s after the last start, "
        f"median RSS {r['rss_mib_median']} MiB a node. Readers (3 threads) go through a load "
        f"balancer that polls every node's /readyz every {POLL_S} s and retries nothing "
        f"(it failed open for {r.get('failed_open', 0)} reads, sent while no node said it "
        "was ready). "
        f"{len(r['restarts'])} nodes restarted one after another (SIGTERM, wait for the exit, "
        f"start again 2 s later, wait until ready); each took {stops} s from SIGTERM to exit "
        "(it hands its partitions over first).",
        "",
        "| reads | answered 200, right value | failed | of them 503 | target |",
        "|---|---|---|---|---|",
        f"| {r['reads']:,} | {r['ok']:,} | {failed} | {r['failed'].get('503', 0)} | "
        f"0 failed: {'met' if failed == 0 else '**missed**'} |",
    ]
    if r["failed"]:
        lines += ["", f"Failed by kind: {r['failed']}; first: {r['samples'][:5]}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
