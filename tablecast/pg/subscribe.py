"""``COPY (SUBSCRIBE TO t [WHERE …] [SINCE …]) TO STDOUT``: a table's watch over the PostgreSQL
protocol, as COPY rows (text format) of three columns — the event (``snapshot``,
``ready``, ``change``, ``keep-alive``), its resume position, and its data (the watch
event's JSON: key, value, partition, offset, timestamp) — until the client cancels or
goes, or the watch ends (a client too far behind, a stopping node).
"""

from __future__ import annotations

from typing import Any

from tablecast.live.events import Change, Encoder
from tablecast.live.service import Live
from tablecast.live.sinks import QueueSink
from tablecast.pg import wire
from tablecast.pg.relations import SqlError
from tablecast.pg.statements import Subscribe, key_json, resolve
from tablecast.query.queries import WatchQuery
from tablecast.query.request import Request

#: COPY's text-format NULL
NULL = b"\\N"
COLUMNS = 3


class CopyEncoder(Encoder):
    """Each event as one CopyData message: event, position, data, tab-separated."""

    name = "pg"

    def encode(
        self, kind: str, token: str | None, change: Change | None, extra: Any = None
    ) -> bytes:
        import orjson

        data = change.data if change is not None else orjson.dumps(extra or {})
        return _line(kind, token, data)

    def keep_alive(self, token: str | None) -> bytes:
        return _line("keep-alive", token, None)


def _line(kind: str, token: str | None, data: bytes | None) -> bytes:
    # JSON text holds no tab or newline of its own; its backslashes are COPY's escape
    fields = [
        kind.encode(),
        NULL if token is None else token.encode(),
        NULL if data is None else data.replace(b"\\", b"\\\\"),
    ]
    return wire.message(b"d", b"\t".join(fields) + b"\n")


COPY = CopyEncoder()


def query_of(st: Subscribe, params: list[Any], info: Any) -> WatchQuery:
    """The watch a SUBSCRIBE statement spells."""
    since = None if st.since is None else resolve(st.since, params)
    if since is not None and not isinstance(since, str):
        raise SqlError("22023", "SINCE takes a position: a row's second column")
    if st.keys is not None:
        keys = [_text(info, resolve(v, params)) for v in st.keys]
        return WatchQuery.of_keys(st.table, keys, snapshot=st.snapshot, since=since)
    start = None if st.start is None else _text(info, resolve(st.start, params))
    end = None if st.end is None else _text(info, resolve(st.end, params))
    return WatchQuery.span(
        st.table, start, end, prefix=st.prefix, snapshot=st.snapshot, since=since
    )


def _json(v: Any) -> str:
    import orjson

    return orjson.dumps(v).decode()


def _text(info: Any, v: Any) -> str:
    j = key_json(info, v)
    return j if isinstance(j, str) and info.key["format"] == "string" else _json(j)


def copy_out_response() -> bytes:
    """CopyOutResponse: text format, three text columns."""
    return wire.message(b"H", b"\x00" + COLUMNS.to_bytes(2, "big") + b"\x00\x00" * COLUMNS)


COPY_DONE = wire.message(b"c")


async def stream(session: Any, live: Live, st: Subscribe, params: list[Any], req: Request) -> int:
    """Stream the subscription through `session` until it ends; the rows sent."""
    info = session.router.local.table(st.table)
    plan = await session._waited(live.prepare(query_of(st, params, info), req))
    sent = 0
    try:
        session.send(copy_out_response())
        await session.flush()
        sink = QueueSink(live.hub.touched)
        watch = live.begin(plan, COPY, sink)
        try:
            while True:
                events = await session._waited(sink.take())
                if not events:
                    break
                for event in events:
                    session.send(event)
                sent += len(events)
                await session.flush()
        finally:
            sink.close()
            live.end(watch)
    finally:
        plan.release()
    session.send(COPY_DONE)
    return sent
