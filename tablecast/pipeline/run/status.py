"""Each query's progress, every micro-batch, as a point on ``<app>.status`` (the console's
pipeline page reads it) and in the run's log every ``PROGRESS_EVERY_S``.

A point is a small JSON object keyed by the query's name::

    {"query", "batch", "timestamp" (epoch ms), "trigger", "input_rows",
     "input_rows_per_s", "processed_rows_per_s", "batch_ms", "watermark",
     "state_rows", "input_lag", "dead_letters"}

``input_lag`` is how many records the query's Kafka sources were behind their
ends when the batch was planned (Spark's ``maxOffsetsBehindLatest``, summed
over the sources); ``state_rows`` the rows in its state stores;
``dead_letters`` the bad records it has sent to ``<app>.dlq`` so far.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import orjson

from tablecast.kafka.config import producer_conf
from tablecast.kafka.topics import STATUS_CONFIG, ensure_topic, status_topic

log = logging.getLogger(__name__)


def point(progress: dict[str, Any], trigger: str, dead_letters: int) -> dict[str, Any]:
    """A query's progress report (Spark's StreamingQueryProgress as JSON) as a status point."""
    lag = 0
    for source in progress.get("sources") or []:
        behind = (source.get("metrics") or {}).get("maxOffsetsBehindLatest")
        try:
            lag += int(float(behind))
        except (TypeError, ValueError):
            continue
    event_time = progress.get("eventTime") or {}
    return {
        "query": progress.get("name"),
        "batch": progress.get("batchId"),
        "timestamp": _epoch_ms(progress.get("timestamp")),
        "trigger": trigger,
        "input_rows": progress.get("numInputRows") or 0,
        "input_rows_per_s": round(progress.get("inputRowsPerSecond") or 0.0, 1),
        "processed_rows_per_s": round(progress.get("processedRowsPerSecond") or 0.0, 1),
        "batch_ms": progress.get("batchDuration")
        or (progress.get("durationMs") or {}).get("triggerExecution"),
        "watermark": event_time.get("watermark"),
        "state_rows": sum(op.get("numRowsTotal", 0) for op in progress.get("stateOperators") or []),
        "input_lag": lag,
        "dead_letters": dead_letters,
    }


def describe(p: dict[str, Any]) -> str:
    """A point as one log line."""
    return (
        f"query {p['query']}: batch {p['batch']}, {p['input_rows']} rows, "
        f"{p['processed_rows_per_s']:.0f} rows/s processed ({p['input_rows_per_s']:.0f} in), "
        f"batch {p['batch_ms']} ms, input lag {p['input_lag']}, state rows {p['state_rows']}, "
        f"watermark {p['watermark'] or '-'}, {p['dead_letters']} bad records so far"
    )


class StatusPublisher:
    """Writes points to ``<app>.status``; a Kafka that is away loses points, never the query."""

    def __init__(self, bootstrap_servers: str, app_id: str) -> None:
        from confluent_kafka import Producer

        self.topic = status_topic(app_id)
        ensure_topic(bootstrap_servers, self.topic, 1, STATUS_CONFIG)
        # progress is best effort: no retries for minutes, no idempotence to wait on
        self._producer = Producer(
            producer_conf(
                bootstrap_servers,
                {"acks": 1, "enable.idempotence": False, "linger.ms": 50, "log_level": 0},
            )
        )

    def publish(self, p: dict[str, Any]) -> None:
        try:
            self._producer.produce(self.topic, key=str(p["query"]).encode(), value=orjson.dumps(p))
            self._producer.poll(0)
        except Exception as e:  # a full queue while Kafka is away: drop the point
            log.debug("progress point not published: %s", e)

    def close(self) -> None:
        self._producer.flush(5)


def _epoch_ms(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None
