"""The pipeline's progress points (``<app>.status``), from Spark's progress report as JSON."""

from __future__ import annotations

from tablecast.pipeline.run.status import describe, point

PROGRESS = {
    "id": "q-id",
    "name": "shop.revenue",
    "timestamp": "2026-11-22T10:00:01.500Z",
    "batchId": 42,
    "batchDuration": 310,
    "numInputRows": 1200,
    "inputRowsPerSecond": 400.0,
    "processedRowsPerSecond": 3870.9677,
    "durationMs": {"triggerExecution": 310},
    "eventTime": {"watermark": "2026-11-22T09:59:00.000Z"},
    "stateOperators": [{"numRowsTotal": 700}, {"numRowsTotal": 5}],
    "sources": [
        {"metrics": {"maxOffsetsBehindLatest": "12", "avgOffsetsBehindLatest": "3.0"}},
        {"metrics": {"maxOffsetsBehindLatest": "3"}},
        {"metrics": {}},
    ],
}


def test_a_point_carries_what_the_console_plots() -> None:
    p = point(PROGRESS, "micro-batch 300 ms", 2)
    assert p == {
        "query": "shop.revenue",
        "batch": 42,
        "timestamp": 1795341601500,
        "trigger": "micro-batch 300 ms",
        "input_rows": 1200,
        "input_rows_per_s": 400.0,
        "processed_rows_per_s": 3871.0,
        "batch_ms": 310,
        "watermark": "2026-11-22T09:59:00.000Z",
        "state_rows": 705,
        "input_lag": 15,
        "dead_letters": 2,
    }
    line = describe(p)
    assert "shop.revenue" in line and "input lag 15" in line and "2 bad records" in line


def test_a_sparse_report_still_makes_a_point() -> None:
    p = point({"name": "q", "batchId": 0}, "", 0)
    assert p["input_lag"] == 0 and p["state_rows"] == 0 and p["timestamp"] is None
    assert p["batch_ms"] is None and describe(p)
