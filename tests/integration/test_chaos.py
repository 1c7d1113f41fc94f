"""A 3-minute chaos soak (the harness of ``python -m bench chaos``, a short schedule).

Every fault of bench/chaos/faults.py at least once over a live cluster (its
own broker, the pipeline, three nodes, a producer, readers checked against the
table topic): no read may be wrong, no acknowledged record lost, and at least
99.999 % of reads answered.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import run
from bench.chaos.faults import ALL

# Part of the default run; alone with `./run tests -m chaos`, longer with
# `python -m bench chaos --minutes N` (BENCHMARKS.md, "Chaos soak").
pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_chaos_soak_never_lies_and_never_loses(tmp_path: Path) -> None:
    r = run(minutes=3.0, seed=7, work=tmp_path / "chaos")
    assert not r["notes"], r["notes"]  # e.g. the clock-skewed node left out
    ran = {e["fault"] for e in r["faults"]}
    assert ran == set(ALL), f"faults not run: {set(ALL) - ran}"
    problems = [(e["fault"], p) for e in r["faults"] for p in e["problems"]]
    # the input kept flowing the whole time (a stalled producer would make "lost" meaningless)
    assert r["acked"] >= 0.5 * r["rate"] * r["minutes"] * 60, (r["acked"], r["produce_failed"])
    assert r["wrong"] == 0, r["wrong_samples"][:10]
    assert r["lost"] == 0 and r["converged"], r["lost_samples"][:10]
    # the failed answers' own messages and the faults' times say which fault they came with
    timeline = [(e["fault"], e["start_s"], e["end_s"]) for e in r["faults"]]
    assert r["answered_pct"] >= 99.999, (
        r["failed"],
        r["longest_unavailable_s"],
        problems,
        r["failed_samples"][:10],
        timeline,
    )
    assert not problems, problems
