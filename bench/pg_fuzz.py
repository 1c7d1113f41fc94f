"""Random and malformed PostgreSQL protocol traffic at a node: ``python -m bench pg_fuzz
[--cases 10000] [--seed 1]``.

The cases of ``tests/support/pg_fuzz.py`` (garbage, lying lengths, random message types,
mutated Parse/Bind/Describe/Execute, SQL of random fragments), 16 connections at a time,
against one node with a table; then a valid query on a new connection. Passes when no
answer is torn or an internal error, every closed connection said why, and the node
still answers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import Any

import psycopg

from bench import common
from bench.stack import Stack
from tablecast.kafka.broker import free_port
from tests.support import pg_fuzz

log = logging.getLogger("bench")
APP = "pgfuzz"


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench pg_fuzz")
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    r: dict[str, Any] = {
        "machine": common.machine(),
        "command": common.command(),
        "args": vars(args),
    }
    with Stack() as stack:
        stack.table("t", 100, 4, app=APP)
        pg_port = free_port()
        proc, url = stack.node(stack.dir / "node", None, "--pg-port", str(pg_port), app=APP)
        common.wait_http(url + "/readyz", timeout=300, proc=proc)
        started = time.monotonic()
        report = asyncio.run(pg_fuzz.fuzz("127.0.0.1", pg_port, args.cases, args.seed))
        r["seconds"] = time.monotonic() - started
        dsn = f"host=127.0.0.1 port={pg_port} dbname=tablecast user=bench sslmode=disable"
        with psycopg.connect(dsn, autocommit=True) as conn:
            after = conn.execute("SELECT count(*) FROM t").fetchone()
        r["alive"] = proc.poll() is None and after == (100,)
        stack.stop(proc)
    r["report"] = {k: v for k, v in vars(report).items() if k != "problems"}
    r["problems"] = report.problems[:20]
    common.publish("pg_fuzz", r, render(r))
    if report.problems or not r["alive"]:
        raise SystemExit(1)


def render(r: dict[str, Any]) -> str:
    rep = r["report"]
    verdict = "passed" if not r["problems"] and r["alive"] else "**failed**"
    problems = "".join(f"\n- `{p[:200]}`" for p in r["problems"])
    return f"""## PostgreSQL protocol fuzzing

`{r["command"]}` — {common.facts_line(r["machine"])}

{rep["cases"]:,} connections of random and malformed traffic (seed {r["args"]["seed"]}) at one
node in {r["seconds"]:.0f} s: {rep["answered"]:,} got answers, {rep["closed_with_error"]:,} were
closed after an ErrorResponse, {rep["quiet"]:,} were left waiting for the rest of a message (the
client then hung up). Problems (a torn answer, an internal error, a close without a word):
{len(r["problems"])}; the node answered a valid query afterwards: {r["alive"]}. **{verdict}**{problems}
"""


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
