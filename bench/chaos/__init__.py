"""``python -m bench chaos --minutes N [--seed S]``: a seeded chaos soak of the serving tier.

Its own broker, the pipeline and three nodes under a steady producer, while
reader threads query random nodes and every answer is checked against the table
topic (see :mod:`bench.chaos.verifier` for the rule). A seeded schedule of
faults (:mod:`bench.chaos.faults`) runs, each followed by recovery; at the end,
with input and faults stopped, every node must converge and every key equal what
the App makes of the last acknowledged input record (records lost otherwise).
Cluster control is :mod:`bench.chaos.cluster`, the report :mod:`bench.chaos.report`.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from bench import common
from tablecast.query.fanout import MAX_BATCH

from .cluster import KEYS, TABLE, Cluster, Producer, expected_value
from .faults import ALL, Injector, as_dict, inject, is_short, schedule
from .report import longest_gaps, markdown
from .verifier import MALFORMED, Readers, Reference

log = logging.getLogger("bench.chaos")
RATE = 300
READERS = 6
#: a short soak's reads a second per reader thread; a long one reads as fast as nodes answer
SHORT_READS_PER_S = 40.0
#: input flowing before the readers start, and the least rest after each fault's recovery
#: (reads on the healed cluster); a short soak (is_short: the one in
#: ./run tests) takes half of each, as it holds the outages a third as long
WARMUP_S = 20.0
REST_S = 5.0


def converge(
    cluster: Cluster, expected: dict[str, Any], skip: set[str], stall_s: float, cap_s: float
) -> tuple[bool, list[str]]:
    """Wait until every node answers every key as expected; the keys still differing.

    A pass over every key of every node is long (thousands of keys): each node is asked
    for them in batches (``keys:batchGet``, the node's own read path for many keys), and
    after the first pass only the keys still differing are asked again; a clean recheck
    is confirmed by a last pass over everything, so the verdict always comes from the
    latest answers. It waits as long as reads keep coming right, giving up after
    `stall_s` without one more right (or `cap_s` in all): a pipeline restarted on a
    loaded machine may take minutes to catch up with the input, which is slow, not lost."""
    started = progressed = time.monotonic()
    every = [(n.url, f"k{i:05d}") for n in cluster.nodes for i in range(KEYS)]
    # a malformed table record no valid one followed
    every = [(url, k) for url, k in every if k not in skip]
    with httpx.Client(timeout=10) as http:

        def answers(url: str, keys: list[str]) -> dict[str, Any]:
            """The node's answer for each key: its value, None (not found) or why not."""
            got: dict[str, Any] = {}
            for i in range(0, len(keys), MAX_BATCH):
                chunk = keys[i : i + MAX_BATCH]
                try:
                    r = http.post(f"{url}/v1/tables/{TABLE}/keys:batchGet", json={"keys": chunk})
                    if r.status_code != 200:
                        got.update(dict.fromkeys(chunk, f"status {r.status_code}"))
                        continue
                    for item in r.json()["results"]:
                        got[item["key"]] = item.get("value") if item["found"] else None
                except (httpx.HTTPError, ValueError, KeyError) as e:
                    got.update(dict.fromkeys(chunk, type(e).__name__))
            return got

        def differing(reads: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
            by_node: dict[str, list[str]] = {}
            for url, k in reads:
                by_node.setdefault(url, []).append(k)
            out = []
            for url, keys in by_node.items():
                got = answers(url, keys)
                for k in keys:
                    want, have = expected.get(k), got.get(k, "no answer")
                    if have != want:
                        out.append((url, k, f"{url} {k}: {want!r} / {have!r}"))
            return out

        diffs = differing(every)
        fewest = len(diffs)
        while True:
            if not diffs:
                diffs = differing(every)  # confirmed over everything
                if not diffs:
                    return True, []
            now = time.monotonic()
            if now - progressed > stall_s or now - started > cap_s:
                return False, [d for _, _, d in diffs]
            time.sleep(5)
            diffs = differing([(url, k) for url, k, _ in diffs])
            if len(diffs) < fewest:
                fewest, progressed = len(diffs), time.monotonic()
                log.info("converging: %d of %d reads still differ", fewest, len(every))


def pipeline_progress(cluster: Cluster, lines: int = 3) -> list[str]:
    """The pipeline's last batch lines: whether it was still catching up with the input."""
    try:
        text = (cluster.work / "pipeline.log").read_text(errors="replace")
    except OSError as e:
        return [f"pipeline log: {e}"]
    batches = [ln for ln in text.splitlines() if "rows/s processed" in ln or "started," in ln]
    return [f"pipeline: {ln}" for ln in batches[-lines:]]


def diagnose(cluster: Cluster, diffs: list[str], limit: int = 10) -> list[str]:
    """For keys a node still answers wrong after the soak: what its plain read says it is
    exact at (a read process may have answered it), what the node itself answers (a
    ``Connection: close`` request, which read processes hand to the node), and the
    replicas the node reports for the key's partition."""
    out: list[str] = []
    with httpx.Client(timeout=10) as http:
        for d in diffs[:limit]:
            url, key = d.split()[:2]
            key = key.rstrip(":")
            path = f"{url}/v1/tables/{TABLE}/keys/{quote(key)}"
            try:
                plain = http.get(path)
                own = http.get(path, headers={"connection": "close"})
                partition = own.json().get("partition") if own.status_code == 200 else None
                cluster_view = http.get(f"{url}/v1/cluster").json()
            except (httpx.HTTPError, ValueError) as e:
                out.append(f"{url} {key}: {e!r}")
                continue
            replicas = [
                (n["id"], n["state"], r)
                for n in cluster_view.get("nodes", [])
                for r in n.get("replicas", [])
                if partition is None or r.get("partition") == partition
            ]
            out.append(
                f"{url} {key}: plain {_said(plain)}; node's own {_said(own)}; "
                f"replicas of partition {partition}: {replicas}"
            )
    return out


def _said(r: httpx.Response) -> str:
    """An answer's status, the start of its body, and the position, lag and node it names."""
    h = r.headers
    return (
        f"{r.status_code} {r.text[:80]} position={h.get('x-tablecast-position')} "
        f"lag={h.get('x-tablecast-lag')} node={h.get('x-tablecast-node')}"
    )


def run(minutes: float, seed: int, work: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    cluster = Cluster(work)
    ref: Reference | None = None
    readers: Readers | None = None
    producer: Producer | None = None
    events = []
    #: seconds each phase took (a slow soak says where its time went)
    phases: dict[str, float] = {}
    began = time.monotonic()
    try:
        cluster.start()
        phases["start"] = round(time.monotonic() - began, 1)
        producer = Producer(cluster.bootstrap, cluster.input_topic, RATE, seed)
        producer.start()
        ref = Reference(cluster.bootstrap, cluster.table_topic)
        ref.start()
        short = is_short(minutes)
        scale = 0.5 if short else 1.0
        time.sleep(WARMUP_S * scale)
        t0 = time.monotonic()
        readers = Readers(
            ref,
            cluster.urls,
            READERS,
            seed,
            t0,
            SHORT_READS_PER_S if short else None,
            sql_ports=cluster.sql_ports,
        )
        readers.start()
        injector = Injector(cluster, producer, rng, minutes)
        budget = minutes * 60
        faults = schedule(rng, minutes)
        for i, fault in enumerate(faults):
            # every kind of fault runs once whatever the budget; repeats only within it
            if i >= len(ALL) and time.monotonic() - t0 > budget - 30:
                break
            events.append(inject(injector, fault, t0))
            # the rest of the slot after recovery, so reads see the healed cluster too
            slot_end = t0 + budget * (i + 1) / len(faults)
            time.sleep(max(REST_S * scale, slot_end - time.monotonic()))
        producer.stop()
        readers.stop()
        phases["faults"] = round(time.monotonic() - t0, 1)
        by_read_process = cluster.answered_by_read_processes()
        expected = {k: expected_value(v) for k, v in producer.acked.items()}
        expected = {k: v for k, v in expected.items() if v is not None}
        # malformed table records are only healed by a later valid record for the key
        malformed_unhealed = {
            k for k in injector.malformed_keys if ref.by_key[k][-1].value is MALFORMED
        }
        mark = time.monotonic()
        converged, diffs = converge(cluster, expected, malformed_unhealed, 180, 480)
        phases["converge"] = round(time.monotonic() - mark, 1)
        diagnosis = [] if converged else pipeline_progress(cluster) + diagnose(cluster, diffs)
        mark = time.monotonic()
        readers.judge_deferred(ref.catch_up(60))
        phases["catch_up"] = round(time.monotonic() - mark, 1)
        lost_keys = sorted({d.split()[1].rstrip(":") for d in diffs})
        t = readers.tally
        answered = t.queries - sum(t.failed.values())
        return {
            "command": common.command(),
            "machine": common.machine(),
            "minutes": minutes,
            "seed": seed,
            "rate": RATE,
            "keys": KEYS,
            "readers": READERS,
            "queries": t.queries,
            "queries_by_kind": dict(t.by_kind),
            "answered_pct": 100.0 * answered / max(1, t.queries),
            "failed": dict(t.failed),
            "failed_total": sum(t.failed.values()),
            "retried": t.retried,
            "node_503": t.node_503,
            "node_503_samples": t.node_503_samples,
            "max_staleness_ms": t.max_staleness_ms,
            "wrong": len(t.wrong),
            "deferred": t.deferred,
            "reference_renewed": ref.renewed,
            "wrong_samples": t.wrong[:50],
            "failed_samples": t.failures[:50],
            "lost": len(lost_keys),
            "lost_samples": diffs[:50],
            "converged": converged,
            "diagnosis": diagnosis,
            "acked": producer.acked_n,
            "produce_failed": producer.failed,
            "longest_unavailable_s": longest_gaps(t),
            "faults": [as_dict(e) for e in events],
            "notes": cluster.notes,
            "by_read_process": by_read_process,
            "phases_s": phases,
        }
    finally:
        if producer is not None and not producer.stopping.is_set():
            producer.stop()
        if readers is not None:
            readers.stop()
        if ref is not None:
            ref.stop()
        cluster.stop()


def main(argv: list[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench chaos")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs) afterwards")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tablecast-chaos-"))
    log.info("work dir %s", work)
    try:
        result = run(a.minutes, a.seed, work)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    common.save("chaos", result)
    common.write_section("chaos", markdown(result))
    log.info(
        "queries %d failed %d wrong %d lost %d answered %.4f%%",
        result["queries"],
        result["failed_total"],
        result["wrong"],
        result["lost"],
        result["answered_pct"],
    )
    return result
