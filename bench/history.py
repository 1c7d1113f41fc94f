"""History and secondary indexes on the serving node: an as-of read and an index
lookup next to a plain point GET, and what a history costs on disk.

python -m bench history [--keys 50000] [--versions 2] [--rounds 7] [--seconds 10]

- CPU per request inside the node's RSGI app (the approach of bench/handler.py: the real
  app, a real Node with RocksDB stores filled from the topic, granian's parsing and socket
  left out), in alternating rounds: a point GET of a random key, the same key ``?as_of=``
  an earlier time, an index lookup that finds one row (``/index/id/N``) and one that finds
  ten (``/index/bucket/N``). An index is partitioned like its table (each node indexes the
  rows it holds), so a lookup reads every partition: 12 here, all on the one node.
- One wrk figure of each on a pinned node (wrk on the other core).
- Disk: the same records applied to RocksDB stores without history, with a history that
  keeps every version, with one whose retention keeps about one, and with two indexes;
  flushed and compacted, then measured.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.common import (
    command,
    ensure_tools,
    facts_line,
    machine,
    ratio_spread,
    save,
    wait_http,
    write_section,
    wrk,
)
from bench.stack import Stack, short_key
from tablecast import serde
from tablecast.cluster.node import Node, NodeConfig
from tablecast.contract import index_codec
from tablecast.contract.table_info import TableInfo
from tablecast.http.app import HttpApp
from tablecast.kafka import catalog
from tablecast.kafka.produce import produce_waiting
from tablecast.kafka.topics import COMPACTED, catalog_topic, table_topic
from tablecast.store import Views, Write
from tablecast.store.rocksdb import RocksDBStore

log = logging.getLogger("bench")
APP = "bench-history"
TABLE = "trips"
PARTITIONS = 12
HISTORY_MS = 24 * 3_600_000
#: version v of key i is stamped BASE + v * STEP_MS + i % 1000
STEP_MS = 60_000
KINDS = ("get", "as_of", "index_1", "index_10")


def value_of(i: int, version: int, rng: random.Random) -> bytes:
    """About 100 bytes of JSON that does not compress to nothing."""
    pad = rng.randbytes(30).hex()
    return orjson.dumps({"id": i, "v": version, "train": f"IC {i % 700}", "pad": pad})


def index_values(i: int) -> dict[str, Any]:
    return {"id": i, "bucket": i // 10}


def fill(stack: Stack, keys: int, versions: int, base: int) -> None:
    info = TableInfo(
        name=TABLE,
        topic=table_topic(APP, TABLE),
        partitions=PARTITIONS,
        key=serde.string().spec(),
        value=serde.json().spec(),
        extra={"history_ms": HISTORY_MS, "indexes": ["id", "bucket"]},
    )
    stack.topic(info.topic, PARTITIONS, COMPACTED)
    stack.topic(catalog_topic(APP), 1, COMPACTED)
    catalog.publish(stack.bootstrap, APP, [info])
    p = stack.producer()
    rng = random.Random(7)
    for v in range(versions):
        for i in range(keys):
            header = [(index_codec.HEADER, index_codec.encode_header(index_values(i)))]
            produce_waiting(
                p,
                info.topic,
                key=short_key(i),
                value=value_of(i, v, rng),
                timestamp=base + v * STEP_MS + i % 1000,
                headers=header,
            )
    assert p.flush(120) == 0


class _Scope:
    proto = "http"
    method = "GET"

    def __init__(self, path: str, query: str = "") -> None:
        self.path = path
        self.query_string = query
        self.headers: dict[str, str] = {}


class _Proto:
    status = 0

    def response_bytes(self, status: int, headers: Any, body: bytes) -> None:
        self.status = status


def scopes(kind: str, keys: int, base: int, n: int) -> list[_Scope]:
    rng = random.Random(11)
    out = []
    for _ in range(n):
        i = rng.randrange(keys)
        if kind == "get":
            out.append(_Scope(f"/v1/tables/{TABLE}/keys/{short_key(i).decode()}"))
        elif kind == "as_of":  # between the first and second version: the first answers
            at = base + STEP_MS // 2
            out.append(_Scope(f"/v1/tables/{TABLE}/keys/{short_key(i).decode()}", f"as_of={at}"))
        elif kind == "index_1":
            out.append(_Scope(f"/v1/tables/{TABLE}/index/id/{i}"))
        else:
            out.append(_Scope(f"/v1/tables/{TABLE}/index/bucket/{i // 10}"))
    return out


async def _drive(app: Any, batch: list[_Scope], proto: _Proto) -> float:
    """µs of this thread's CPU per request, each awaited in turn on a running loop."""
    started = time.thread_time()
    for scope in batch:
        await app(scope, proto)
    return (time.thread_time() - started) / len(batch) * 1e6


def in_process(stack: Stack, keys: int, base: int, rounds: int, n: int) -> dict[str, Any]:
    config = NodeConfig(
        APP, stack.bootstrap, "http://127.0.0.1:1", "bench-inproc", stack.dir / "inproc"
    )
    node = Node(config)
    node.start()
    try:
        deadline = time.monotonic() + 600
        while not node.ready:
            if time.monotonic() > deadline:
                raise TimeoutError("in-process node not ready")
            time.sleep(0.2)
        app, proto = HttpApp(node), _Proto()
        batches = {kind: scopes(kind, keys, base, n) for kind in KINDS}
        loop = asyncio.new_event_loop()
        try:
            for kind in KINDS:  # warm-up: caches, partition memo, RocksDB blocks
                loop.run_until_complete(_drive(app, batches[kind], proto))
                assert proto.status == 200, (kind, proto.status)
            runs: dict[str, list[float]] = {kind: [] for kind in KINDS}
            for r in range(rounds):
                for kind in KINDS:
                    runs[kind].append(loop.run_until_complete(_drive(app, batches[kind], proto)))
                log.info(
                    "round %d: %s",
                    r,
                    ", ".join(f"{k} {runs[k][-1]:.1f} µs" for k in KINDS),
                )
        finally:
            loop.close()
    finally:
        node.stop()
    out: dict[str, Any] = {
        "us": runs,
        "median_us": {k: statistics.median(v) for k, v in runs.items()},
    }
    for kind in KINDS[1:]:
        out[kind] = ratio_spread([x / g for x, g in zip(runs[kind], runs["get"], strict=True)])
    return out


def wrk_script(kind: str, keys: int, base: int) -> str:
    key = 'string.format("k%07d", i)'
    path = {
        "get": f'"/v1/tables/{TABLE}/keys/" .. {key}',
        "as_of": f'"/v1/tables/{TABLE}/keys/" .. {key} .. "?as_of={base + STEP_MS // 2}"',
        "index_1": f'"/v1/tables/{TABLE}/index/id/" .. i',
        "index_10": f'"/v1/tables/{TABLE}/index/bucket/" .. math.floor(i / 10)',
    }[kind]
    return f"""
math.randomseed(os.time())
request = function()
  local i = math.random(0, {keys - 1})
  return wrk.format("GET", {path})
end
"""


def over_http(stack: Stack, keys: int, base: int, seconds: int) -> dict[str, Any]:
    proc, url = stack.node(stack.dir / "node-http", app=APP)
    wait_http(url + "/readyz", timeout=600, proc=proc)
    out = {}
    for kind in KINDS:
        script = wrk_script(kind, keys, base)
        wrk(url + "/", script, 3)  # warm-up
        out[kind] = wrk(url + "/", script, seconds)
        log.info("wrk %s: %.0f req/s", kind, out[kind]["rps"])
        if out[kind]["non2xx"] or out[kind]["errors"]:
            raise RuntimeError(f"{kind}: non-2xx answers or errors: {out[kind]}")
    stack.stop(proc)
    return out


def disk(keys: int, versions: int, base: int) -> dict[str, Any]:
    """Bytes on disk of one store fed the same records, by what it keeps."""
    setups = {
        "rows only": Views(),
        "history, every version kept": Views(HISTORY_MS),
        "history, retention of one version step": Views(STEP_MS),
        "rows + 2 indexes": Views(None, ("id", "bucket")),
    }
    rng = random.Random(7)
    records = [
        Write(
            short_key(i),
            value_of(i, v, rng),
            v * keys + i,
            base + v * STEP_MS + i % 1000,
            index_codec.entries(index_codec.encode_header(index_values(i)), ["id", "bucket"]),
        )
        for v in range(versions)
        for i in range(keys)
    ]
    out = {}
    with tempfile.TemporaryDirectory(prefix="tablecast-bench-disk-") as tmp:
        for name, views in setups.items():
            path = Path(tmp) / name.replace(" ", "-").replace(",", "")
            store = RocksDBStore(path, views)
            for at in range(0, len(records), 10_000):
                store.apply(records[at : at + 10_000])
            store._db.flush()
            store._db.compact_range(None, None)
            store.close()
            out[name] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            log.info("%s: %.1f MB", name, out[name] / 1e6)
    return {"records": len(records), "bytes": out}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench history")
    p.add_argument("--keys", type=int, default=50_000)
    p.add_argument("--versions", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--requests", type=int, default=20_000, help="per kind and round")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--disk-versions", type=int, default=10)
    args = p.parse_args(argv)
    ensure_tools({"wrk": "wrk"})
    result: dict[str, Any] = {"machine": machine(), "command": command()}
    load_before = os.getloadavg()
    base = int(time.time() * 1000) - 3_600_000
    with Stack() as stack:
        fill(stack, args.keys, args.versions, base)
        result["in_process"] = in_process(stack, args.keys, base, args.rounds, args.requests)
        result["wrk"] = over_http(stack, args.keys, base, args.seconds)
    result["disk"] = disk(args.keys, args.disk_versions, base)
    result["load_average"] = {"before": load_before, "after": os.getloadavg()}
    save("history", result)
    write_section("history", render(result, args))


QUICK_ARGS = ["--keys", "5000", "--rounds", "3", "--requests", "2000", "--seconds", "2"]

NAMES = {
    "get": "point GET",
    "as_of": "point GET `?as_of=`",
    "index_1": "index lookup, 1 row",
    "index_10": "index lookup, 10 rows",
}


def render(r: dict[str, Any], args: argparse.Namespace) -> str:
    inproc, http, d = r["in_process"], r["wrk"], r["disk"]

    def ratio(kind: str) -> str:
        x = inproc[kind]
        lo, hi = x["ratio_iqr"]
        return f"{x['ratio_median']:.2f} (IQR {lo:.2f}–{hi:.2f})"

    rows = "\n".join(
        f"| {NAMES[k]} | {inproc['median_us'][k]:.1f} | "
        f"{ratio(k) if k != 'get' else '1'} | {http[k]['rps']:,.0f} | "
        f"{http[k]['p50_us'] / 1000:.2f} | {http[k]['p99_us'] / 1000:.2f} |"
        for k in KINDS
    )
    plain = d["bytes"]["rows only"]
    sizes = "\n".join(
        f"| {name} | {b / 1e6:.1f} | {b / plain:.2f} |" for name, b in d["bytes"].items()
    )
    before, after = r["load_average"]["before"], r["load_average"]["after"]
    return f"""## History and secondary indexes

`{r["command"]}` — {facts_line(r["machine"])}. A table of {args.keys:,} keys × {args.versions}
versions (12 partitions, RocksDB, `history_ms` one day, indexes `id` — one row per value — and
`bucket` — ten rows per value), all held by one node. CPU per request: the node's RSGI app
in-process, {args.requests:,} random requests per kind and round, {args.rounds} rounds
alternating the kinds; the ratio to the point GET is per round (median and interquartile
range). wrk: the node pinned to core 0, wrk (1 thread, 64 connections) on core 1,
{args.seconds} s per kind after a 3 s warm-up, one run each.

| request | CPU µs per request (median) | × point GET | wrk req/s | p50 ms | p99 ms |
|---|---|---|---|---|---|
{rows}

An index is partitioned like its table — each node indexes the rows it holds, in the same
write — so a lookup reads every partition (12 stores here) and merges them, where a point
GET reads one: its cost grows with the partitions a node holds, not with the table. An
as-of read is one RocksDB seek on the key's versions.

**On disk**: {d["records"]:,} records ({args.keys:,} keys × {args.disk_versions} versions, one
version step apart, ~100-byte values) applied to one RocksDB store, flushed and compacted:

| store keeps | MB | × rows only |
|---|---|---|
{sizes}

With a retention shorter than the input's time span, purging keeps the history at about
one version per key beside the rows. Load average (1, 5, 15 min) before:
{", ".join(f"{x:.1f}" for x in before)}; after: {", ".join(f"{x:.1f}" for x in after)}; on
{r["machine"]["cores"]} cores.
"""


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO)
    main(sys.argv[1:])
