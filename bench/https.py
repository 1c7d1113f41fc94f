"""HTTPS against HTTP for a point GET on one core.

python -m bench https [--seconds 10] [--keys 100000] [--rounds 7]

Two nodes serve the same table (each its own app id, so neither forwards):
one plain HTTP, one HTTPS with a throwaway CA's certificate. Both pinned to
the server core, wrk (keep-alive, so handshakes are amortised as clients do)
on the load core; the two are alternated, and the ratio of each round counts.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import time
from typing import Any

import httpx

from bench.common import (
    command,
    facts_line,
    machine,
    median,
    random_key_script,
    ratio_spread,
    rounds_args,
    rps_row,
    save,
    settled,
    wait_http,
    write_section,
    wrk,
)
from bench.stack import APP, Stack

log = logging.getLogger("bench")
APP_TLS = APP + "-tls"
TARGET = 0.8


def _wait_https(url: str, ca: str, timeout: float = 300.0) -> None:
    ctx = ssl.create_default_context(cafile=ca)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2, verify=ctx).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def compare(stack: Stack, seconds: int, keys: int, rounds: int) -> dict[str, Any]:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_file, cert_file, key_file = (stack.dir / n for n in ("ca.pem", "node.pem", "node.key"))
    ca.cert_pem.write_to_path(str(ca_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))

    stack.table("points", keys)
    proc, url = stack.node(stack.dir / "node-http")
    wait_http(url + "/readyz", timeout=300, proc=proc)
    stack.table("points", keys, app=APP_TLS)
    tls_proc, tls_url = stack.node(
        stack.dir / "node-https",
        None,
        *("--tls-cert", str(cert_file), "--tls-key", str(key_file)),
        app=APP_TLS,
    )
    tls_url = tls_url.replace("http://", "https://")
    _wait_https(tls_url + "/readyz", str(ca_file))
    script = random_key_script("/v1/tables/points/keys/", keys)
    wrk(url + "/", script, 3)  # warm-up: read cache, partition memo
    wrk(tls_url + "/", script, 3)
    plain, tls = [], []
    for _ in range(rounds):
        plain.append(wrk(url + "/", script, seconds))
        tls.append(wrk(tls_url + "/", script, seconds))
        log.info("GET http %.0f req/s, https %.0f req/s", plain[-1]["rps"], tls[-1]["rps"])
    for p in (proc, tls_proc):
        stack.stop(p)
    ratios = [t["rps"] / p["rps"] for t, p in zip(tls, plain, strict=True)]
    return {
        "http": median(plain),
        "https": median(tls),
        **ratio_spread(ratios),
        "rounds": {"http": [p["rps"] for p in plain], "https": [t["rps"] for t in tls]},
    }


def main(argv: list[str]) -> None:
    args = rounds_args("https", argv)
    result: dict[str, Any] = {"machine": machine(), "command": command()}
    with Stack() as stack:
        result["point_get"] = compare(stack, args.seconds, args.keys, args.rounds)
    # other work on the machine moves both sides; the load says how much to trust the spread
    result["load_average"] = os.getloadavg()[1]
    save("https", result)
    write_section("https", render(result, args))


def render(r: dict[str, Any], args: argparse.Namespace) -> str:
    g = r["point_get"]
    lo, hi = g["ratio_iqr"]
    state = settled(g["ratio_iqr"], TARGET)

    return f"""## HTTPS against HTTP

`{r["command"]}` — {facts_line(r["machine"])}. Each node pinned to core 0, wrk (1 thread,
64 keep-alive connections; TLS 1.3, the handshake once per connection) on core 1,
{args.seconds} s per run after a 3 s warm-up, {len(g["ratios"])} alternating rounds; random
keys over a {args.keys:,}-key RocksDB table (12 partitions), default read cache.

| point GET | req/s (median run) | p50 ms | p99 ms |
|---|---|---|---|
{rps_row("HTTP", g["http"])}
{rps_row("HTTPS (`--tls-cert/--tls-key`)", g["https"])}

HTTPS/HTTP ratio per round: {", ".join(f"{x:.2f}" for x in g["ratios"])}; median
{g["ratio_median"]:.2f}, interquartile range {lo:.2f}–{hi:.2f}. Target ≥ {TARGET}: {state}
("met" only when the whole interquartile range clears it). Load average over the run
(5 min): {r.get("load_average", float("nan")):.1f} on {r["machine"]["cores"]} cores.
"""


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO)
    main(sys.argv[1:])
