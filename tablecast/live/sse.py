"""``GET /v1/tables/{t}/watch`` as ``text/event-stream`` (SSE), on granian's streamed responses."""

from __future__ import annotations

import asyncio
from typing import Any

from tablecast.live.events import SSE
from tablecast.live.service import Live
from tablecast.live.sinks import StreamSink
from tablecast.live.tcpdiag import peer_of
from tablecast.query.request import Request

HEADERS = [
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
    # a proxy (nginx) passes each event on as it comes
    ("x-accel-buffering", "no"),
]


async def stream(live: Live, table: str, query: str, req: Request, proto: Any) -> None:
    """Serve the watch `query` (the request's query string) spells until the client leaves
    or the watch ends (a slow client, a stopping node, an expired token: the client resumes
    with its last event's id)."""
    plan = await live.prepare_request(table, query, req)
    try:
        transport = proto.response_stream(200, [*HEADERS, live.router.local.node_header])
        client = getattr(req.scope, "client", "") or ""
        sink = StreamSink(transport, live.hub.touched, peer_of(client))
        watch = live.begin(plan, SSE, sink)
        gone = asyncio.ensure_future(proto.client_disconnect())
        try:
            await asyncio.wait([sink.done, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            # not awaited: granian's disconnect awaitable ignores cancellation and would hold
            # this handler (and a stopping server) until the client leaves
            gone.cancel()
            sink.close()
            live.end(watch)
    finally:
        plan.release()
