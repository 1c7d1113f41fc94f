"""Request figures every front end records: requests by route and status, and their
latency in fixed buckets. The hot path only bumps plain Python counters (a dict
increment and a bisect); ``/metrics`` reads them at scrape time (:meth:`HttpStats.collect`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator

import orjson
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class HttpStats:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        # per route: a count per bucket (+Inf last) and the sum of seconds
        self.buckets: dict[str, list[int]] = {}
        self.seconds: dict[str, float] = defaultdict(float)
        #: of the requests, those the node's read processes answered (serve --processes)
        self.by_readers = 0
        #: kept answers given since the figures were last read (:meth:`fold`): each a "key"
        #: read answered 200 within the first bucket, its microseconds (a dict lookup) not
        #: summed, so the hot path counts it with one increment
        self.kept = 0

    def record(self, route: str, status: int, seconds: float) -> None:
        self.requests[(route, status)] += 1
        counts = self.buckets.get(route)
        if counts is None:
            counts = self.buckets[route] = [0] * (len(BUCKETS) + 1)
        counts[bisect_left(BUCKETS, seconds)] += 1
        self.seconds[route] += seconds

    def fold(self) -> HttpStats:
        """The kept answers counted since the last fold, added to the figures; `self`."""
        n, self.kept = self.kept, 0
        if n:
            self.requests[("key", 200)] += n
            counts = self.buckets.get("key")
            if counts is None:
                counts = self.buckets["key"] = [0] * (len(BUCKETS) + 1)
            counts[0] += n
        return self

    def delta(self) -> bytes:
        """What was recorded since the last delta, as JSON (a read process's report to its
        node, which :meth:`merge` s it), and start counting again."""
        self.fold()
        out = orjson.dumps(
            {
                "requests": [[r, s, n] for (r, s), n in self.requests.items()],
                "buckets": self.buckets,
                "seconds": self.seconds,
            }
        )
        self.requests.clear()
        self.buckets = {}
        self.seconds.clear()
        return out

    def merge(self, delta: bytes) -> None:
        got = orjson.loads(delta)
        for route, status, n in got["requests"]:
            self.requests[(route, status)] += n
            self.by_readers += n
        for route, counts in got["buckets"].items():
            mine = self.buckets.setdefault(route, [0] * (len(BUCKETS) + 1))
            for i, n in enumerate(counts[: len(mine)]):
                mine[i] += n
        for route, seconds in got["seconds"].items():
            self.seconds[route] += seconds

    def collect(self) -> Iterator[Metric]:
        """The figures as Prometheus metrics (a prometheus-client collector)."""
        self.fold()
        requests = CounterMetricFamily(
            "tablecast_http_requests",
            "HTTP requests by route and status",
            labels=["route", "status"],
        )
        for (route, status), n in sorted(self.requests.items()):
            requests.add_metric([route, str(status)], n)
        yield requests
        yield CounterMetricFamily(
            "tablecast_http_requests_by_read_processes",
            "of tablecast_http_requests, those the node's read processes answered",
            value=self.by_readers,
        )
        latency = HistogramMetricFamily(
            "tablecast_http_request_duration_seconds", "time to answer, by route", labels=["route"]
        )
        for route, counts in sorted(self.buckets.items()):
            cumulative, running = [], 0
            for bound, n in zip((*map(str, BUCKETS), "+Inf"), counts, strict=True):
                running += n
                cumulative.append((bound, running))
            latency.add_metric([route], cumulative, self.seconds[route])
        yield latency
