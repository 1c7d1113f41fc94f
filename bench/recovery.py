"""Recovery for real: kill -9 during ingest with millions of records left to
replay, then a restart on the same data: ``python -m bench recovery [--rows 3000000]
[--kill-at 0.4] [--rounds 7]``.

Each round on core 0, alternating: a fresh node restores the whole table, start → ready
by the wall clock (the ingest headline); then another fresh node is killed with -9 once
it has applied `--kill-at` of the rows, and is started again on its data directory. The
restarted node's records-applied counter is what it replayed; its count of the table is
checked against the rows written (nothing lost).

Beside it, the same on Kafka Streams (the IQ peer, core 0, the same rows in an input topic
that is its store's changelog): one instance of the application processes the topic once
and stops cleanly, so its group holds the end; each round then starts a new instance of it
on an empty state directory, which restores the store from the topic (start → caught up),
and another that is killed with -9 at `--kill-at` of its restore and started again on its
state directory (static membership: the restart takes its partitions back at once instead
of after the session timeout). Its restore listener says where each restore began (what
the store kept) and how far it got. ``--no-kafka-streams`` leaves the peer out.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import common
from bench.anchors import on_load_core, rkey
from bench.common import (
    SERVER_CPU,
    command,
    facts_line,
    machine,
    ratio_spread,
    save,
    settled,
    wait_http,
    write_section,
)
from bench.peers import kafka_streams as ks
from bench.serving import applied_so_far, follow_ingest
from bench.stack import Stack, applied

log = logging.getLogger("bench")
APP = "recovery"
TABLE = "points"
PARTITIONS = 12
#: the ingest goal, start → ready on one core
INGEST_TARGET = 200_000
#: `python -m bench all --quick`: a test of the harness, not figures
QUICK_ARGS = ["--rows", "200000", "--rounds", "2"]  # two: the ratios need a spread


def fresh(stack: Stack, data: Path, rows: int) -> dict[str, Any]:
    """A new node restoring all `rows`: start → ready, wall clock."""
    started = time.monotonic()
    proc, url = stack.node(data, None, app=APP)
    out = follow_ingest(proc, url, rows, started)
    stack.stop(proc)
    shutil.rmtree(data, ignore_errors=True)
    return out


def killed(stack: Stack, data: Path, rows: int, kill_at: float) -> dict[str, Any]:
    """A new node killed with -9 at `kill_at` of the rows applied, then started again."""
    proc, url = stack.node(data, None, app=APP)
    before = 0.0
    while before < kill_at * rows:
        before = applied_so_far(proc, url) or 0.0
        time.sleep(0.02)
    stack.stop(proc, signal.SIGKILL)
    port = int(url.rsplit(":", 1)[1])
    started = time.monotonic()
    proc, url = stack.node(data, port, app=APP)
    wait_http(url + "/readyz", timeout=600, proc=proc)
    ready = time.monotonic() - started
    replayed = applied(url)
    count = httpx.get(f"{url}/v1/tables/{TABLE}/count", timeout=60).json()["count"]
    stack.stop(proc)
    shutil.rmtree(data, ignore_errors=True)
    if count != rows:
        raise AssertionError(f"after recovery the table counts {count} keys, not {rows}")
    return {
        "applied_before_kill": before,
        "replayed": replayed,
        "ready_s": ready,
        "replay_rps": replayed / ready,
        "count": count,
    }


def ks_seed(stack: Stack, topic: str, work: Path, rows: int) -> str:
    """Fill the peer's input topic and run its application over it once, stopped cleanly:
    the group then holds the topic's end, so a new instance restores rather than processes."""
    stack.topic(topic, PARTITIONS)
    stack.fill(topic, rows, rkey)
    app_id = f"{APP}-ks-{os.getpid()}"
    with ks.start(
        stack.bootstrap, topic, 1, work_dir=work, application_id=app_id, cpus=SERVER_CPU
    ) as cluster:
        cluster.wait_caught_up(stack.bootstrap, timeout=3600)
    shutil.rmtree(work, ignore_errors=True)
    return app_id


def _restores(inst: ks.Instance) -> dict[str, dict[int, int]]:
    body = inst.get("/restores", timeout=2).json()
    return {k: {int(p): int(o) for p, o in v.items()} for k, v in body.items()}


def ks_fresh(stack: Stack, topic: str, app_id: str, work: Path, rows: int) -> dict[str, Any]:
    """A new instance restoring the whole store: start → caught up, wall clock."""
    started = time.monotonic()
    props = {"group.instance.id": work.name}
    with ks.start(
        stack.bootstrap,
        topic,
        1,
        work_dir=work,
        application_id=app_id,
        cpus=SERVER_CPU,
        wait=False,
        props=props,
    ) as cluster:
        cluster.wait_caught_up(stack.bootstrap, timeout=3600)
        wall = time.monotonic() - started
    shutil.rmtree(work, ignore_errors=True)
    return {"wall_s": wall, "rps_wall": rows / wall}


def ks_killed(
    stack: Stack, topic: str, app_id: str, work: Path, rows: int, kill_at: float
) -> dict[str, Any]:
    """A new instance killed with -9 at `kill_at` of its restore, started again on its state."""
    props = {"group.instance.id": work.name}  # the restart is the same member: no wait
    options: dict[str, Any] = {"application_id": app_id, "work_dir": work, "cpus": SERVER_CPU}
    inst = ks.start_instance(stack.bootstrap, topic, props=props, **options)
    cluster = ks.Cluster(topic, app_id, [inst])
    with cluster:
        before = 0
        while before < kill_at * rows:
            if not inst.alive():
                raise RuntimeError(f"kafka-streams-iq exited:\n{inst.log_tail()}")
            with contextlib.suppress(httpx.HTTPError, ValueError):  # not listening yet
                before = sum(o + 1 for o in _restores(inst)["restored"].values())
            time.sleep(0.02)
        inst.kill()
        started = time.monotonic()
        cluster.instances[0] = again = ks.start_instance(
            stack.bootstrap, topic, port=inst.port, props=props, **options
        )
        cluster.wait_caught_up(stack.bootstrap, timeout=3600)
        ready = time.monotonic() - started
        began = _restores(again)["started"]
    shutil.rmtree(work, ignore_errors=True)
    # a partition whose checkpoint was its end needed no restore: all of it was kept
    kept = sum(began.get(p, end) for p, end in ks.end_offsets(stack.bootstrap, topic).items())
    return {
        "applied_before_kill": before,
        "replayed": rows - kept,
        "ready_s": ready,
        "replay_rps": (rows - kept) / ready,
    }


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench recovery")
    p.add_argument("--rows", type=int, default=3_000_000)
    p.add_argument("--kill-at", type=float, default=0.4, help="share applied when killed")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--no-kafka-streams", action="store_true", help="leave the peer out")
    p.add_argument("--render", action="store_true", help="redraw from the saved results")
    args = p.parse_args(argv)
    if args.render:
        write_section("recovery", render(orjson.loads((common.OUT / "recovery.json").read_bytes())))
        return
    r: dict[str, Any] = {"machine": machine(), "command": command(), "args": vars(args)}
    peer = not args.no_kafka_streams
    if peer:
        ks.build()
    with Stack() as stack, on_load_core():
        stack.table(TABLE, args.rows, PARTITIONS, app=APP, key_of=rkey)
        topic = f"{APP}-ks-input"
        app_id = ks_seed(stack, topic, stack.dir / "ks-seed", args.rows) if peer else ""
        r["fresh"], r["killed"], r["ks_fresh"], r["ks_killed"] = [], [], [], []
        for i in range(args.rounds):
            r["fresh"].append(fresh(stack, stack.dir / f"fresh-{i}", args.rows))
            r["killed"].append(killed(stack, stack.dir / f"killed-{i}", args.rows, args.kill_at))
            log.info("round %d: fresh %s; killed %s", i + 1, r["fresh"][-1], r["killed"][-1])
            if peer:
                work = stack.dir
                r["ks_fresh"].append(
                    ks_fresh(stack, topic, app_id, work / f"ks-fresh-{i}", args.rows)
                )
                r["ks_killed"].append(
                    ks_killed(
                        stack, topic, app_id, work / f"ks-killed-{i}", args.rows, args.kill_at
                    )
                )
                log.info(
                    "kafka streams: fresh %s; killed %s", r["ks_fresh"][-1], r["ks_killed"][-1]
                )
    save("recovery", r)
    write_section("recovery", render(r))


def _per_round(fresh: list[dict[str, Any]], killed: list[dict[str, Any]]) -> str:
    """Each round's fresh wall time and what its restart replayed, in how long."""
    return "; ".join(
        f"{f['wall_s']:.1f} s / {k['replayed']:,.0f} replayed in {k['ready_s']:.1f} s"
        for f, k in zip(fresh, killed, strict=True)
    )


def _med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(x[key] for x in runs)


def render(r: dict[str, Any]) -> str:
    a, fr, kl = r["args"], r["fresh"], r["killed"]
    rows = a["rows"]
    per_round = _per_round(fr, kl)
    none_again = all(k["replayed"] <= rows - k["applied_before_kill"] for k in kl)
    reread = (
        "In every round the node replayed no more than the rows it had not applied at that "
        "sample: nothing it had applied by then was read again."
        if none_again
        else "In some rounds the node replayed rows it had applied before the kill."
    )
    return f"""## Recovery after kill -9 during ingest

`{r["command"]}` — {facts_line(r["machine"])}.

A 12-partition table of {rows:,} keys (100-byte JSON values, RocksDB store). Each round on
core 0: a fresh node restores it all (start → ready, wall clock: the ingest headline), then
another fresh node is killed with -9 once it has applied {a["kill_at"]:.0%} of the rows and is
started again on its data. *Replayed* is what the restarted node applied (its
`tablecast_records_applied_total`) before it was ready; after every recovery the table
counted exactly {rows:,} keys. Medians of {len(fr)} rounds:

| run | records | seconds to ready | records/s |
|---|---|---|---|
| fresh node, start → ready | {rows:,} | {_med(fr, "wall_s"):.1f} | {_med(fr, "rps_wall"):,.0f} |
| restart after kill -9 at {a["kill_at"]:.0%} | {_med(kl, "replayed"):,.0f} replayed | \
{_med(kl, "ready_s"):.1f} | {_med(kl, "replay_rps"):,.0f} |

{_target(fr, bool(r.get("ks_fresh")))}

Applied at the last sample before the kill (every 20 ms): {_med(kl, "applied_before_kill"):,.0f}
(median); kept through the kill (rows − replayed): {rows - _med(kl, "replayed"):,.0f}.
{reread} Per round (fresh wall / replayed in): {per_round}.

What could flatter or hurt: the table topic is local (one broker on the same machine), and
the restart reads what the killed node had written to its page cache; the seconds to ready
include the process start (Python imports, about a second). One node, one core.{_peer(r)}"""


def _target(fresh: list[dict[str, Any]], peer: bool) -> str:
    """The ingest goal judged on the fresh rounds' rates: met only if their whole
    interquartile range clears it (a rate is a ratio to 1 record/s here)."""
    rates = [f["rps_wall"] for f in fresh]
    spread = ratio_spread(rates)
    lo, hi = spread["ratio_iqr"]
    return (
        f"Start → ready per round (records/s): {', '.join(f'{x:,.0f}' for x in rates)}; "
        f"interquartile range {lo:,.0f}–{hi:,.0f}: the goal of ≥ {INGEST_TARGET:,} records/s "
        f"is {settled(spread['ratio_iqr'], INGEST_TARGET).replace('**', '')} in this run. "
        "The rate moves with the machine's hour"
        + (
            ": the Kafka Streams rows below, from the same rounds, say how fast it ran."
            if peer
            else "."
        )
    )


def _peer(r: dict[str, Any]) -> str:
    """The Kafka Streams rows and the ratios, when the peer ran."""
    fr, kl, kf, kk = r["fresh"], r["killed"], r.get("ks_fresh"), r.get("ks_killed")
    if not kf or not kk:
        return ""
    a = r["args"]
    rows = a["rows"]
    # per round: how many times as fast tablecast was (the peer's seconds over tablecast's)
    fresh = ratio_spread([k["wall_s"] / f["wall_s"] for f, k in zip(fr, kf, strict=True)])
    again = ratio_spread([k["ready_s"] / t["ready_s"] for t, k in zip(kl, kk, strict=True)])
    per_round = _per_round(kf, kk)

    kept = [rows - k["replayed"] for k in kk]
    if not any(kept):
        kept_line = (
            "In every round its restores after the restart began at offset 0 of every "
            "partition: nothing it had restored before the kill was kept. "
        )
    else:
        kept_line = (
            f"Kept through the kill (rows − replayed), median: {statistics.median(kept):,.0f}. "
        )

    def spread(x: dict[str, Any]) -> str:
        lo, hi = x["ratio_iqr"]
        return f"{x['ratio_median']:.2f} ({lo:.2f}–{hi:.2f}; {settled(x['ratio_iqr'], 1.0)} ≥ 1)"

    return f"""

**Kafka Streams** (the IQ peer, Kafka Streams 4.2, RocksDB, one stream thread, on core 0 in
the same rounds, after tablecast's): the same {rows:,} rows in an input topic that is its
store's changelog. A new instance of an application whose group holds the topic's end
restores the store from it; another, killed with -9 at {a["kill_at"]:.0%} of its restore, is
started again on its state directory as the same static member (so it takes its partitions
back at once, not after the 45-s session timeout a dynamic member waits out). *Replayed* is
what its restore read after the restart (rows less the offsets its restores began at:
what its checkpoints kept). Medians of {len(kf)} rounds:

| run | records | seconds to caught up | records/s |
|---|---|---|---|
| new instance, start → caught up | {rows:,} | {_med(kf, "wall_s"):.1f} | {_med(kf, "rps_wall"):,.0f} |
| restart after kill -9 at {a["kill_at"]:.0%} | {_med(kk, "replayed"):,.0f} replayed | {_med(kk, "ready_s"):.1f} | {_med(kk, "replay_rps"):,.0f} |

{kept_line}Kafka Streams' seconds ÷ tablecast's, each round's own ratio (median, interquartile range):
a full restore {spread(fresh)}; the restart after kill -9 {spread(again)}. Per round (fresh
wall / replayed in): {per_round}. Its seconds include the JVM's start. Kafka Streams writes
its RocksDB stores with the write-ahead log off (its checkpoints and the changelog recover
them); a tablecast node writes its with the log on."""
