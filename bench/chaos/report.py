"""Figures of a soak and its BENCHMARKS.md section."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .verifier import Tally


def longest_gaps(tally: Tally) -> dict[str, float]:
    """Per partition, the longest time from a failed read to the next answered one."""
    worst: dict[int, float] = defaultdict(float)
    down_since: dict[int, float] = {}
    for t, p, ok in sorted(tally.timeline):
        if not ok:
            down_since.setdefault(p, t)
        elif p in down_since:
            worst[p] = max(worst[p], t - down_since.pop(p))
    return {f"p{p}": round(worst.get(p, 0.0), 2) for p in range(6)}


def markdown(r: dict[str, Any]) -> str:
    lines = [
        "## Chaos soak",
        "",
        f"`{r['command']}` — {r['minutes']} min, seed {r['seed']}, {r['machine']['date']}, "
        f"{r['machine']['cores']} cores. Three nodes (--standby-replicas 1, node0 with a read "
        "process beside it (--processes 2), node2 under "
        "libfaketime +20 s), the pipeline (filter + map_values over a 6-partition input), "
        f"a producer at {r['rate']} records/s over {r['keys']} keys, {r['readers']} reader threads "
        "(plain HTTP, tablecast.Client and SQL over the PostgreSQL protocol) on random nodes, "
        "each answer checked against the "
        "table topic (rule: bench/chaos/verifier.py).",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| queries | {r['queries']:,} | |",
        f"| of them by plain HTTP, tablecast.Client and SQL readers "
        f"| {_by_kind(r.get('queries_by_kind'))} | |",
        f"| of them answered by node0's read process | {r.get('by_read_process')} | |",
        f"| answered | {r['answered_pct']:.4f} % | ≥ 99.999 % |",
        f"| failed (by status) | {r['failed_total']:,} {r['failed']} | |",
        f"| plain-HTTP and SQL reads sent on to another node (one refused or dropped the "
        "connection) "
        f"| {r['retried']:,} | |",
        f"| plain-HTTP and SQL reads a node answered 503 (57P03), sent on to another node "
        f"| {r.get('node_503', 0):,} | |",
        f"| largest staleness an answer claimed | {r['max_staleness_ms']:,} ms | |",
        f"| wrong | {r['wrong']} | 0 |",
        f"| answers judged after the soak (the reference had not read that far in 5 s) "
        f"| {r.get('deferred', 0):,} | |",
        f"| the reference's consumer replaced (deaf after a broker restart) "
        f"| {r.get('reference_renewed', 0)} | |",
        f"| records lost after recovery | {r['lost']} | 0 |",
        f"| nodes converged | {r['converged']} | all |",
        f"| acknowledged input records | {r['acked']:,} | |",
        "",
        "Longest unavailability per partition (s): "
        + ", ".join(f"{p} {s}" for p, s in r["longest_unavailable_s"].items()),
        "",
        "| t (s) | fault | took (s) | detail | problems |",
        "|---|---|---|---|---|",
    ]
    for e in r["faults"]:
        probs = "; ".join(p.replace("\n", " ")[:300] for p in e["problems"]) or "-"
        lines.append(
            f"| {e['start_s']} | {e['fault']} | {e['end_s'] - e['start_s']:.1f} | "
            f"{e['detail'] or '-'} | {probs.replace('|', '/')} |"
        )
    if r.get("node_503_samples"):
        lines += ["", "503s of a node that another node then answered (first 10):", ""]
        lines += [f"- `{w}`" for w in r["node_503_samples"][:10]]
    if r.get("failed_samples"):
        lines += ["", "Failed reads (first 10):", ""]
        lines += [f"- `{w}`" for w in r["failed_samples"][:10]]
    if r["wrong_samples"]:
        lines += ["", "First wrong answers:", ""]
        lines += [f"- `{w}`" for w in r["wrong_samples"][:10]]
    if r["lost_samples"]:
        lines += ["", "First lost keys (key: expected / answered):", ""]
        lines += [f"- `{w}`" for w in r["lost_samples"][:10]]
    if r["notes"]:
        lines += ["", "Notes: " + "; ".join(r["notes"])]
    return "\n".join(lines)


def _by_kind(kinds: dict[str, int] | None) -> str:
    if not kinds:
        return "–"
    return ", ".join(f"{kinds.get(k, 0):,}" for k in ("http", "client", "sql"))
