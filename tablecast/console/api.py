"""The console's routes: the page and its files, node details from every node, the pipeline.

``GET /ui`` and ``/ui/static/<file>`` need no token (the page asks for one and
keeps it in session storage); ``/ui/api/*`` needs one like ``/v1`` when auth
is on. The pipeline's progress and dead letters show input records, so with
``--auth-policy`` only a token granted every table (``"*": "*"``) sees them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from tablecast.cluster.node import Node
from tablecast.console.assets import Asset, load
from tablecast.console.pipeline_feed import ConsoleFeed
from tablecast.query.errors import ApiError
from tablecast.query.kept_answers import Answers
from tablecast.query.peer_pool import PeerPool, PeerUnavailable
from tablecast.query.request import Request
from tablecast.query.stats import BUCKETS, HttpStats
from tablecast.version import __version__

Answer = tuple[int, bytes, list[tuple[str, str]]]

NODE_ROUTE = "/internal/console/node"
PEER_TIMEOUT_S = 1.0


class Console:
    def __init__(
        self, node: Node, stats: HttpStats, peers: PeerPool, answers: Answers | None = None
    ) -> None:
        self.node = node
        self.stats = stats
        self.peers = peers
        #: whole answers kept in front of the stores: a hit there is a cache hit too
        self.answers = answers
        self.assets = load()
        self.feed = ConsoleFeed(node.config.bootstrap_servers, node.config.app_id)
        self.started_ms = int(time.time() * 1000)
        self._started = time.monotonic()

    def close(self) -> None:
        self.feed.close()

    # -- files ---------------------------------------------------------------------
    def page(self, name: str, req: Request) -> Answer:
        asset: Asset | None = self.assets.get(name)
        if asset is None:
            raise ApiError("not_found", f"no console file {name!r}")
        # a reload asks again with the ETag it holds: the file is not sent twice
        headers = [("content-type", asset.content_type), ("etag", asset.etag)]
        headers.append(("cache-control", "no-cache"))
        if req.headers.get("if-none-match") == asset.etag:
            return 304, b"", headers
        return 200, asset.body, headers

    # -- nodes ---------------------------------------------------------------------
    def node_detail(self) -> dict[str, Any]:
        """This node as its detail panel shows it."""
        node = self.node
        hits = self.answers.hits if self.answers is not None else 0
        misses = 0
        for replica in list(node.ingestor.replicas.values()):
            hits += getattr(replica.store, "hits", 0)
            misses += getattr(replica.store, "misses", 0)
        requests = dict(self.stats.fold().requests)
        total = sum(requests.values())
        counts = [0] * (len(BUCKETS) + 1)
        for route, buckets in list(self.stats.buckets.items()):
            if route.startswith(("key", "range", "count", "batch", "windows")):
                counts = [a + b for a, b in zip(counts, buckets, strict=True)]
        return {
            "id": node.id,
            "url": node.config.url,
            "version": __version__,
            "started_ms": self.started_ms,
            "uptime_s": round(time.monotonic() - self._started, 1),
            "ready": node.ready,
            "kafka": "reachable" if node.membership.kafka_reachable else "unreachable",
            "requests": total,
            "errors": sum(n for (_, status), n in requests.items() if status >= 500),
            "read_latency_ms": {"p50": _quantile(counts, 0.5), "p99": _quantile(counts, 0.99)},
            "reads": sum(counts),
            "cache": {
                "hits": hits,
                "misses": misses,
                "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
            },
            "replicas": len(node.ingestor.replicas),
            "records_applied": node.ingestor.records_applied,
        }

    def this_node(self) -> Answer:
        return 200, orjson.dumps(self.node_detail()), []

    async def nodes(self, req: Request) -> Answer:
        """Every live node's detail: this one's, and each peer's asked over the internal route
        (signed like any internal call; a peer that does not answer is listed as such)."""
        onward = [("authorization", a)] if (a := req.headers.get("authorization")) else []

        async def ask(member: Any) -> dict[str, Any]:
            try:
                status, _, body = await self.peers.request(
                    member.url, "GET", NODE_ROUTE, onward, b"", PEER_TIMEOUT_S
                )
                if status == 200:
                    return orjson.loads(body)
                return {"id": member.id, "url": member.url, "unreachable": f"status {status}"}
            except (PeerUnavailable, orjson.JSONDecodeError, OSError) as e:
                return {"id": member.id, "url": member.url, "unreachable": str(e) or "no answer"}

        members = [m for m in self.node.view.members.values() if m.id != self.node.id]
        details = [self.node_detail(), *await asyncio.gather(*(ask(m) for m in members))]
        return 200, orjson.dumps({"nodes": sorted(details, key=lambda d: d["id"])}), []

    # -- the pipeline ------------------------------------------------------------------
    def pipeline(self, req: Request) -> Answer:
        _require_everything(req)
        self.feed.ensure_started()
        return 200, orjson.dumps(self.feed.progress()), []

    def dead_letters(self, req: Request) -> Answer:
        _require_everything(req)
        self.feed.ensure_started()
        return 200, orjson.dumps(self.feed.dead_letters()), []


def _require_everything(req: Request) -> None:
    grants = req.grants
    if grants is not None and not grants.reads_everything():
        raise ApiError(
            "forbidden", "the pipeline's progress and dead letters need a grant of every table"
        )


def _quantile(counts: list[int], q: float) -> float | None:
    """The upper bound (ms) of the histogram bucket holding quantile `q` (None: no reads)."""
    total = sum(counts)
    if not total:
        return None
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= q * total:
            return BUCKETS[i] * 1000 if i < len(BUCKETS) else None
    return None
