"""The watch over WebSocket, at the same path: one JSON text message per event.

``{"event": "snapshot"|"ready"|"change"|"keep-alive"|"error", "id": TOKEN, "data": {...}}``
— the SSE stream's events with the same ids (resume with ``?since=TOKEN``, as
a browser's WebSocket cannot send ``Last-Event-ID``). A request that cannot be
served is accepted, answered with one ``error`` message and closed, so that a
browser, which cannot read a refused handshake's status, learns why.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson

from tablecast.live.events import WS
from tablecast.live.service import Live, Plan
from tablecast.live.sinks import QueueSink
from tablecast.query.errors import ApiError
from tablecast.query.request import Request

#: close codes (RFC 6455): a policy refused it; the server is going away
POLICY_VIOLATION = 1008
GOING_AWAY = 1001


async def serve(live: Live, table: str, query: str, req: Request, proto: Any) -> None:
    """Serve the watch `query` (the request's query string) spells over an accepted
    WebSocket; a watch that cannot be served is answered with one error message."""
    transport = await proto.accept()
    # what the client sends is read (and dropped) from the start: a watch being prepared
    # (a snapshot, a resume waiting for a replica) must not let it pile up meanwhile
    reader = asyncio.ensure_future(_until_closed(transport))
    preparing = asyncio.ensure_future(live.prepare_request(table, query, req))
    try:
        await asyncio.wait([preparing, reader], return_when=asyncio.FIRST_COMPLETED)
        if not preparing.done():  # the client left first: nobody to prepare it for
            preparing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await preparing
            return
        try:
            plan = preparing.result()
        except ApiError as e:
            await _refuse(proto, transport, e)
            return
        try:
            await _stream(live, plan, transport, reader)
        finally:
            plan.release()
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        with contextlib.suppress(Exception):
            proto.close(GOING_AWAY)


async def _stream(live: Live, plan: Plan, transport: Any, reader: asyncio.Future[None]) -> None:
    sink = QueueSink(live.hub.touched)
    watch = live.begin(plan, WS, sink)
    if reader.done():
        sink.close()
    reader.add_done_callback(lambda _: sink.close())
    try:
        async for event in sink.drain():
            await transport.send_str(event)
    except Exception:  # the client went away mid-write
        pass
    finally:
        sink.close()
        live.end(watch)


async def _until_closed(transport: Any) -> None:
    """Read (and drop) what the client sends, until it closes: the HTTP engine answers pings."""
    while True:
        message = await transport.receive()
        if message.kind == 0:  # closed by the client
            return


async def _refuse(proto: Any, transport: Any, error: ApiError) -> None:
    with contextlib.suppress(Exception):
        await transport.send_str(
            orjson.dumps(
                {
                    "event": "error",
                    "id": None,
                    "data": {"error": {"code": error.code, "message": error.message}},
                }
            ).decode()
        )
    with contextlib.suppress(Exception):
        proto.close(POLICY_VIOLATION)
