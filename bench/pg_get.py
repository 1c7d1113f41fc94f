"""A prepared point SELECT over the PostgreSQL protocol against the HTTP point GET of the
same node: ``python -m bench pg_get [--keys 100000] [--seconds 10] [--rounds 7]``.

One node on the server core serves a table of `--keys` keys (``0``..``N-1``, 100-byte
JSON values) over HTTP and ``--pg-port``. On the load core, alternating rounds of:

- **HTTP**: wrk, 64 connections, ``GET /v1/tables/t/keys/{random key}``;
- **SQL**: Debian's pgbench, 64 clients, ``-M prepared``, a custom script
  ``SELECT value FROM t WHERE key = :k`` with a random key (Bind/Execute/Sync per query).

Compared per CPU-second of the node (requests divided by the node's user + system time
from /proc), against the target of 0.5×.
"""

from __future__ import annotations

import logging
import re
import subprocess
import tempfile
from typing import Any

from bench import common
from bench.stack import Stack
from tablecast.kafka.broker import free_port

log = logging.getLogger("bench")
APP = "pgbench"
TABLE = "t"
PARTITIONS = 12
CONNECTIONS = 64
TARGET = 0.5


def _key(i: int) -> bytes:
    return b"%d" % i


def pgbench(port: int, keys: int, seconds: int) -> dict[str, Any]:
    """One pgbench run on the load core: transactions (= SELECTs) per second."""
    script = f"\\set k random(0, {keys - 1})\nSELECT value FROM {TABLE} WHERE key = :k;\n"
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as f:
        f.write(script)
        f.flush()
        argv = ["pgbench", "-n", "-M", "prepared", "-c", str(CONNECTIONS), "-j", "1"]
        argv += ["-T", str(seconds), "-f", f.name, "-h", "127.0.0.1", "-p", str(port)]
        argv += ["-U", "bench", "tablecast"]
        done = subprocess.run(
            common.pinned(common.LOAD_CPU, argv),
            capture_output=True,
            text=True,
            timeout=seconds + 120,
        )
    tx = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
    failed = re.search(r"number of failed transactions: (\d+)", done.stdout)
    latency = re.search(r"latency average = ([\d.]+) ms", done.stdout)
    if done.returncode != 0 or tx is None:
        raise RuntimeError(f"pgbench failed: {done.stdout}\n{done.stderr}")
    n = int(tx.group(1))
    return {
        "requests": n,
        "rps": n / seconds,
        "failed": int(failed.group(1)) if failed else 0,
        "latency_avg_ms": float(latency.group(1)) if latency else None,
    }


def main(argv: list[str]) -> None:
    args = common.rounds_args("pg_get", argv)
    common.ensure_tools({"wrk": "wrk", "pgbench": "postgresql-contrib"})
    r: dict[str, Any] = {
        "machine": common.machine(),
        "command": common.command(),
        "args": vars(args),
    }
    with Stack() as stack:
        stack.table(TABLE, args.keys, PARTITIONS, app=APP, key_of=_key)
        pg_port = free_port()
        proc, url = stack.node(stack.dir / "node", None, "--pg-port", str(pg_port), app=APP)
        common.wait_http(url + "/readyz", timeout=300, proc=proc)
        http_script = common.random_key_script(f"/v1/tables/{TABLE}/keys/", args.keys, 1, "")
        # warm: kept answers and block cache, for both
        common.wrk(url, http_script, args.seconds)
        pgbench(pg_port, args.keys, args.seconds)
        rounds = []
        for i in range(args.rounds):
            http = common.with_cpu(common.wrk, url, http_script, args.seconds, pids=(proc.pid,))
            sql = common.with_cpu(pgbench, pg_port, args.keys, args.seconds, pids=(proc.pid,))
            rounds.append({"http": http, "sql": sql})
            log.info(
                "round %d: HTTP %.0f req/s (%.1f us CPU each), SQL %.0f/s (%.1f us CPU each)",
                i,
                http["rps"],
                http["cpu_us_per_request"][0],
                sql["rps"],
                sql["cpu_us_per_request"][0],
            )
        stack.stop(proc)
    r["rounds"] = rounds
    r["per_cpu"] = common.ratio_spread(
        [x["http"]["cpu_us_per_request"][0] / x["sql"]["cpu_us_per_request"][0] for x in rounds]
    )
    r["by_rate"] = common.ratio_spread([x["sql"]["rps"] / x["http"]["rps"] for x in rounds])
    common.publish("pg_get", r, render(r))


def render(r: dict[str, Any]) -> str:
    rounds = r["rounds"]
    per, rate = r["per_cpu"], r["by_rate"]

    def med(side: str, field: str) -> float:
        values = sorted(x[side][field] if field != "cpu" else x[side]["cpu_us_per_request"][0]
                        for x in rounds)  # fmt: skip
        return values[len(values) // 2]

    a = r["args"]
    lo, hi = per["ratio_iqr"]
    return f"""## SQL point reads (PostgreSQL protocol) against HTTP

`{r["command"]}` — {common.facts_line(r["machine"])}

One node on the server core, {a["keys"]:,} keys in {PARTITIONS} partitions (100-byte JSON
values); on the load core, {a["rounds"]} alternating rounds of {a["seconds"]} s: wrk with
{CONNECTIONS} connections (`GET /v1/tables/t/keys/{{k}}`) and Debian's pgbench with
{CONNECTIONS} clients, `-M prepared`, `SELECT value FROM t WHERE key = :k` (random keys).
Warm: one round of each before.

| | req/s | node CPU µs per read |
|---|---:|---:|
| HTTP GET | {med("http", "rps"):,.0f} | {med("http", "cpu"):.1f} |
| SQL prepared SELECT | {med("sql", "rps"):,.0f} | {med("sql", "cpu"):.1f} |

SQL per node CPU-second against HTTP: **{per["ratio_median"]:.2f}×** (IQR {lo:.2f}–{hi:.2f});
target 0.5×: {common.settled(per["ratio_iqr"], TARGET)}. By req/s: {rate["ratio_median"]:.2f}×
(IQR {rate["ratio_iqr"][0]:.2f}–{rate["ratio_iqr"][1]:.2f}). What could flatter HTTP: its
point reads are kept whole answers (by path) after the first, which SQL's are not.
"""


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
