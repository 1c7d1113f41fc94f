"""This build against an earlier one, point GET and forwarded GET in the same run:
``python -m bench builds [--base REV] [--seconds 6] [--keys 100000] [--rounds 7]``.

A change that must not slow the hot paths is measured here, both builds on the same broker
and table, alternated each round. The earlier build is REV's ``tablecast/`` package,
exported from git into a scratch directory and put first on its nodes' PYTHONPATH
(by default HEAD: what the uncommitted change does).

- Point GET: one node per build on core 0 (each its own app, so nothing is forwarded), wrk
  on core 1 with keys of the whole table (kept answers, the default engine).
- Forwarded GET: per build a node A on core 0 that owns no partition the load names and a
  node B on core 1 that owns them (B shares wrk's core, as in ``bench cluster``'s own-cores
  layout): every read A takes is forwarded to B.

Each round gives this build ÷ the earlier one by req/s and by the server's CPU per request
(core 0's process; for forwarded reads A's). "Within noise" when the interquartile range
of the ratio holds 1.0 or lies above it; slower only when the whole range is below.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench.cluster import key_script, wait_settled, warm_script
from bench.common import (
    LOAD_CPU,
    SERVER_CPU,
    command,
    facts_line,
    machine,
    publish,
    ratio_spread,
    wait_http,
    with_cpu,
    wrk,
)
from bench.stack import Stack, short_key
from tablecast.contract.partitioner import partition_for

log = logging.getLogger("bench")
PARTITIONS = 12
BUILDS = ("this", "base")
#: seconds of in-turn warm-up reads per target: every key at least twice at 20k req/s
WARM_S = 10
#: `python -m bench all --quick`: a test of the harness, not figures
QUICK_ARGS = ["--seconds", "2", "--keys", "20000", "--rounds", "3"]


def export(rev: str, into: Path) -> Path:
    """REV's tablecast package as files under `into` (what its nodes import)."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, "tablecast"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench builds")
    p.add_argument("--base", default="HEAD", help="the earlier build: a git revision")
    p.add_argument("--seconds", type=int, default=6)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=7)
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    p = _args(argv)
    revision = subprocess.run(
        ["git", "rev-parse", "--short", p.base], capture_output=True, text=True, check=True
    ).stdout.strip()
    old = export(p.base, Path(tempfile.mkdtemp(prefix="tablecast-base-")))
    path = os.pathsep.join(x for x in (str(old), os.environ.get("PYTHONPATH")) if x)
    env: dict[str, dict[str, str]] = {"this": {}, "base": {"PYTHONPATH": path}}
    with Stack() as stack:
        for build in BUILDS:  # each node its own app and copy of the rows
            stack.table("points", p.keys, PARTITIONS, app=f"ab-local-{build}")
            stack.table("points", p.keys, PARTITIONS, app=f"ab-fwd-{build}")
        names = [short_key(i).decode() for i in range(p.keys)]
        local = {}
        for build in BUILDS:
            app = f"ab-local-{build}"
            proc, url = stack.node(stack.dir / f"local-{build}", app=app, env=env[build])
            wait_http(url + "/readyz", timeout=300, proc=proc)
            local[build] = (proc, url)
        local_keys = {build: names for build in BUILDS}
        pairs = {}
        for build in BUILDS:
            app = f"ab-fwd-{build}"
            a, url_a = stack.node(stack.dir / f"a-{build}", app=app, env=env[build])
            b, url_b = stack.node(stack.dir / f"b-{build}", app=app, cpus=LOAD_CPU, env=env[build])
            for url, proc in ((url_a, a), (url_b, b)):
                wait_http(url + "/readyz", timeout=300, proc=proc)
            pairs[build] = (a, url_a, url_b)
        forwarded_keys = {}
        for build, (_, url_a, url_b) in pairs.items():
            fwd_owners = wait_settled(url_a, 2)
            forwarded_keys[build] = [
                k for k in names if fwd_owners[partition_for(k.encode(), PARTITIONS)] == url_b
            ]
        scripts = {
            ("local", b): key_script("/v1/tables/points/keys/", local_keys[b]) for b in BUILDS
        } | {
            ("forwarded", b): key_script("/v1/tables/points/keys/", forwarded_keys[b])
            for b in BUILDS
        }
        targets = {("local", b): (local[b][1], local[b][0].pid) for b in BUILDS} | {
            ("forwarded", b): (pairs[b][1], pairs[b][0].pid) for b in BUILDS
        }
        # warm: every key of each target asked for (kept answers, caches, pools); random picks
        # left each node warming through the rounds, the slower one warming slower
        for (kind, build), (url, _) in targets.items():
            keys = local_keys[build] if kind == "local" else forwarded_keys[build]
            wrk(url + "/", warm_script("/v1/tables/points/keys/", keys), WARM_S)
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {t: [] for t in targets}
        for r in range(p.rounds):
            order = BUILDS if r % 2 == 0 else BUILDS[::-1]
            for kind in ("local", "forwarded"):
                for build in order:
                    url, pid = targets[(kind, build)]
                    runs[(kind, build)].append(
                        with_cpu(wrk, url + "/", scripts[(kind, build)], p.seconds, pids=(pid,))
                    )
            log.info("round %d of %d done", r + 1, p.rounds)
    result: dict[str, Any] = {"machine": machine(), "base": revision, "command": command()}
    for kind in ("local", "forwarded"):
        this, before = runs[(kind, "this")], runs[(kind, "base")]
        result[kind] = {
            "rps": {b: [x["rps"] for x in runs[(kind, b)]] for b in BUILDS},
            "by_rps": ratio_spread(
                [t["rps"] / o["rps"] for t, o in zip(this, before, strict=True)]
            ),
            "by_cpu": ratio_spread(
                [
                    o["cpu_us_per_request"][0] / t["cpu_us_per_request"][0]
                    for t, o in zip(this, before, strict=True)
                ]
            ),
        }
    publish("builds", result, render(result))


def _judged(spread: dict[str, Any]) -> str:
    lo, hi = spread["ratio_iqr"]
    verdict = "within noise" if lo <= 1.0 <= hi or lo > 1.0 else "**slower**"
    return f"{spread['ratio_median']:.2f}x (IQR {lo:.2f}-{hi:.2f}: {verdict})"


def render(result: dict[str, Any]) -> str:
    lines = [
        "## This build against an earlier one (point and forwarded GET)",
        "",
        f"`{result['command']}` — this tree against `{result['base']}`, both on one broker "
        f"and table, alternated each round; server core {SERVER_CPU}, wrk on core {LOAD_CPU}. "
        f"{facts_line(result['machine'])}.",
        "",
        "| read | this ÷ base by req/s | by server CPU per request | req/s this / base (median) |",
        "|---|---|---|---|",
    ]
    for kind in ("local", "forwarded"):
        k = result[kind]
        rates = {b: sorted(k["rps"][b])[len(k["rps"][b]) // 2] for b in BUILDS}
        lines.append(
            f"| {kind} | {_judged(k['by_rps'])} | {_judged(k['by_cpu'])} | "
            f"{rates['this']:,.0f} / {rates['base']:,.0f} |"
        )
    lines += [
        "",
        "By CPU: the base's CPU per request ÷ this build's (above 1: this build is cheaper). "
        "Forwarded reads: A takes them on core 0, B answers on core 1 beside wrk. What could "
        "flatter either side: both builds' nodes run at once (the idle ones cost little), "
        f"the table is hot in both (each target first reads every key in turn for {WARM_S} s), and this machine's runs differ by up to half from hour "
        "to hour, which the alternating rounds spread over both builds.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main(__import__("sys").argv[1:])
