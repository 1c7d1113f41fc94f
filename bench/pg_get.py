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
import statistics
import subprocess
import tempfile
from pathlib import Path
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


def pgbench(port: int, keys: int, seconds: int, rate: float | None = None) -> dict[str, Any]:
    """One pgbench run on the load core: transactions (= SELECTs) per second; at `rate`
    (pgbench's Poisson schedule) also the latency percentiles of every transaction (µs,
    from its actual start: its schedule lag left out, as wrk measures from its send)."""
    script = f"\\set k random(0, {keys - 1})\nSELECT value FROM {TABLE} WHERE key = :k;\n"
    with (
        tempfile.TemporaryDirectory() as logs,
        tempfile.NamedTemporaryFile("w", suffix=".sql") as f,
    ):
        f.write(script)
        f.flush()
        argv = ["pgbench", "-n", "-M", "prepared", "-c", str(CONNECTIONS), "-j", "1"]
        argv += ["-T", str(seconds), "-f", f.name, "-h", "127.0.0.1", "-p", str(port)]
        if rate is not None:
            argv += ["-R", str(int(rate)), "-l", "--log-prefix", f"{logs}/tx"]
        argv += ["-U", "bench", "tablecast"]
        done = subprocess.run(
            common.pinned(common.LOAD_CPU, argv),
            capture_output=True,
            text=True,
            timeout=seconds + 120,
            cwd=logs,
        )
        latencies = _logged_latencies(Path(logs)) if rate is not None else []
    tx = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
    failed = re.search(r"number of failed transactions: (\d+)", done.stdout)
    latency = re.search(r"latency average = ([\d.]+) ms", done.stdout)
    if done.returncode != 0 or tx is None:
        raise RuntimeError(f"pgbench failed: {done.stdout}\n{done.stderr}")
    n = int(tx.group(1))
    out: dict[str, Any] = {
        "requests": n,
        "rps": n / seconds,
        "failed": int(failed.group(1)) if failed else 0,
        "latency_avg_ms": float(latency.group(1)) if latency else None,
    }
    if latencies:
        latencies.sort()
        for q in (50, 90, 99):
            out[f"p{q}_us"] = latencies[min(len(latencies) - 1, len(latencies) * q // 100)]
    return out


def _logged_latencies(logs: Path) -> list[int]:
    """Each logged transaction's time less its schedule lag (µs)."""
    out = []
    for path in logs.glob("tx*"):
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 7 and fields[2] != "skipped":
                out.append(int(fields[2]) - int(fields[6]))
    return out


def paced_script(keys: int, delay_ms: int) -> str:
    """The HTTP random-key script, each connection waiting `delay_ms` between its requests
    (wrk's ``delay``), so the connections' count sets the rate."""
    script = common.random_key_script(f"/v1/tables/{TABLE}/keys/", keys, 1, "")
    return script + f"\ndelay = function()\n  return {delay_ms}\nend\n"


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
        # at half of each one's peak: the latency a user sees below saturation
        http_peak = statistics.median(x["http"]["rps"] for x in rounds)
        sql_peak = statistics.median(x["sql"]["rps"] for x in rounds)
        # one request per connection per ms and its answer: connections for half the peak
        paced = paced_script(args.keys, 1)
        conns = max(1, round(http_peak / 2 / 1000))
        trial = common.wrk(url, paced, 3, conns)  # each answer's own time slows a connection
        conns = max(1, round(conns * http_peak / 2 / trial["rps"]))
        half = []
        for i in range(args.rounds):
            http = common.wrk(url, paced, args.seconds, conns)
            sql = pgbench(pg_port, args.keys, args.seconds, rate=sql_peak / 2)
            half.append({"http": http, "sql": sql})
            log.info(
                "half-peak round %d: HTTP %.0f req/s p99 %.0f us, SQL %.0f/s p99 %.0f us",
                i, http["rps"], http["p99_us"], sql["rps"], sql["p99_us"],
            )  # fmt: skip
        r["half_peak"] = {"rounds": half, "http_connections": conns}
        r["p99_ratio"] = common.ratio_spread(
            [x["sql"]["p99_us"] / x["http"]["p99_us"] for x in half]
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
(IQR {rate["ratio_iqr"][0]:.2f}–{rate["ratio_iqr"][1]:.2f}).
{_half_peak(r)}
What is hot and what could flatter: after the warm-up both are answered whole from what the
node kept (HTTP by path and request bytes, SQL by the bytes of the Bind/Describe/Execute/Sync
packet pgbench sends for a key), so this compares the front ends' cost per request, not a
store read. pgbench runs one thread for 64 clients; its wake-ups are charged to whichever
process writes to it.
"""


def _half_peak(r: dict[str, Any]) -> str:
    """The latency paragraph at half of each one's peak (absent from earlier results)."""
    half = r.get("half_peak")
    if half is None:
        return ""
    rounds, ratio = half["rounds"], r["p99_ratio"]

    def med(side: str, field: str) -> float:
        return statistics.median(x[side][field] for x in rounds)

    lo, hi = ratio["ratio_iqr"]
    return f"""
**At half of each one's peak** ({len(rounds)} alternating rounds): HTTP by wrk over
{half["http_connections"]} connections each sending a request 1 ms after its last answer
({med("http", "rps"):,.0f} req/s, p50 {med("http", "p50_us"):,.0f} µs, p99
{med("http", "p99_us"):,.0f} µs); SQL by pgbench's Poisson schedule at half its peak over 64
clients ({med("sql", "rps"):,.0f}/s, p50 {med("sql", "p50_us"):,.0f} µs, p99
{med("sql", "p99_us"):,.0f} µs, each transaction from its actual start). SQL p99 ÷ HTTP p99:
**{ratio["ratio_median"]:.2f}** (IQR {lo:.2f}–{hi:.2f}); target ≤ 2:
{common.settled_below(ratio["ratio_iqr"], 2.0)}.
"""


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
