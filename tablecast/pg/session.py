"""One PostgreSQL client connection: startup, authentication, then simple and extended
queries, each SELECT answered by the node's read core as an HTTP read would be.

The extended protocol keeps prepared statements and portals by name; a portal
read with a row limit (Execute with max_rows) is suspended and continues where
it stopped. After an error in an extended-protocol batch every message up to
Sync is skipped, as PostgreSQL does. Output is buffered per message batch and
written with back-pressure, so a slow reader never grows the node's memory
beyond one page of rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import orjson

from tablecast.contract.table_info import TableInfo
from tablecast.live.service import Live
from tablecast.pg import subscribe, wire
from tablecast.pg.kept_replies import KeptReplies, Reply
from tablecast.pg.relations import DEFAULT_SETTINGS, STARTUP_REPORTED, Rows, SqlError, Tables
from tablecast.pg.statements import (
    CatalogQuery,
    FunctionRead,
    Nothing,
    Param,
    Read,
    Setting,
    Show,
    Sleep,
    Statement,
    Subscribe,
    key_json,
    key_raw,
    key_text,
    parse,
    resolve,
    row_passes,
    sleep_seconds,
)
from tablecast.pg.transport import STOP, Messages
from tablecast.pg.types import TEXT, CastFailed, PgType, decode_parameter, encode
from tablecast.query.auth import Caller
from tablecast.query.consistency import NO_OPTIONS, bound_of
from tablecast.query.errors import ApiError
from tablecast.query.fanout import MAX_BATCH
from tablecast.query.gate import Gate
from tablecast.query.kept_answers import ReadMark, mark
from tablecast.query.local import Found
from tablecast.query.policy import Grants
from tablecast.query.queries import (
    BatchQuery,
    CountQuery,
    HistoryQuery,
    IndexQuery,
    KeyQuery,
    RangeQuery,
    WindowsQuery,
)
from tablecast.query.reads import Router, forbidden_key
from tablecast.query.request import Request

log = logging.getLogger(__name__)
T = TypeVar("T")

#: rows a read asks for at once (a page of a range; what is buffered per portal)
PAGE = 1_000
#: prepared statements and portals one connection may hold (pgJDBC caches 256 statements)
MAX_NAMED = 256
#: bytes of output gathered before they are written (and waited for)
FLUSH_BYTES = 64 * 1024
#: settings whose change a session reports back (ParameterStatus), as PostgreSQL does
REPORTED = ("application_name", "client_encoding", "datestyle", "timezone", "intervalstyle")
#: tablecast's own session settings -> the read option each one is
CONSISTENCY = {
    "tablecast.max_lag": "max_lag",
    "tablecast.max_staleness_ms": "max_staleness_ms",
    "tablecast.timeout_ms": "timeout_ms",
}

#: what a session reads with beyond PostgreSQL's own settings
SESSION_READ_SETTINGS = (*CONSISTENCY, "tablecast.after", "tablecast.as_of")
#: what ``SHOW`` gives of the last read: its answer header of the same meaning over HTTP
NOTED = {
    "tablecast.position": "x-tablecast-position",
    "tablecast.lag": "x-tablecast-lag",
    "tablecast.staleness_ms": "x-tablecast-staleness-ms",
}
_NOTED_BY_HEADER = {header: i for i, header in enumerate(NOTED.values())}
_NOTED_INDEX = {name: i for i, name in enumerate(NOTED)}

#: key reads of one `key IN (...)` waiting at a time (for peers' answers, or positions)
KEYS_AT_ONCE = 32

#: the read core's error codes as SQLSTATEs
SQLSTATE = {
    "bad_request": "22023",
    "unauthorized": "28000",
    "forbidden": "42501",
    "table_not_found": "42P01",
    "not_found": "42P01",
    "rate_limited": "53400",
    "partition_unavailable": "57P03",
    "timeout": "57014",
    "request_timeout": "57014",
    "payload_too_large": "54000",
    "internal": "XX000",
}


class Node(Protocol):
    """What a session reads with: the node's HTTP app is one."""

    router: Router
    gate: Gate
    live: Live


class _Scope:
    """The client's address, as rate limits count it."""

    __slots__ = ("client",)

    def __init__(self, client: str) -> None:
        self.client = client


@dataclass
class Prepared:
    statement: Statement | None  # None: an empty query
    #: parameter types the client gave at Parse (0: unspecified)
    oids: list[int]
    #: the SQL it was parsed from
    sql: str = ""
    #: its RowDescription (or NoData) by result formats, made once
    described: dict[tuple[bool, ...], bytes] = field(default_factory=dict)


@dataclass
class Portal:
    prepared: Prepared
    params: list[Any]
    #: per column: binary (True) or text
    binary: list[bool]
    rows: AsyncIterator[tuple[Any, ...]] | None = None
    sent: int = 0
    described: bool = False
    done: bool = False
    pending: list[tuple[Any, ...]] = field(default_factory=list)


class Session:
    def __init__(
        self,
        node: Node,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        tls: ssl.SSLContext | None,
        allow_cleartext: bool,
        cancels: dict[tuple[int, int], Session],
        replies: KeptReplies | None = None,
    ) -> None:
        self.router = node.router
        self.gate = node.gate
        self.live = node.live
        #: replies kept for packets sent again, shared by the node's sessions (None: none)
        self.replies = replies
        self.reader, self.writer = reader, writer
        self.tls, self.allow_cleartext = tls, allow_cleartext
        self.cancels = cancels
        peer = writer.get_extra_info("peername") or ("", 0)
        self.scope = _Scope(f"{peer[0]}:{peer[1]}")
        self.loopback = str(peer[0]) in ("127.0.0.1", "::1") or str(peer[0]).startswith("127.")
        self.secure = False
        self.authorization: str | None = None
        self.settings = dict(DEFAULT_SETTINGS)
        #: the last read's position, lag and staleness (NOTED), as its answer's headers said
        self.noted: list[str | None] = [None] * len(NOTED)
        self.tx = b"I"
        self.out: list[bytes] = []
        self.size = 0
        self.prepared: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}
        self.key = (os.getpid() & 0x7FFFFFFF, int.from_bytes(os.urandom(4), "big") & 0x7FFFFFFF)
        self.running: asyncio.Task[Any] | None = None
        self._bound_kept: Any = None
        #: the connection after its startup (None before)
        self._messages: Messages | None = None
        #: after an error in an extended-protocol batch: messages are skipped until Sync
        self.skipping = False
        #: what the connection's token may read (None: everything), as of its last check
        self._grants: Grants | None = None
        self.tables = Tables(self._table, self._listing)
        #: while a packet's messages are handled: their kinds, if its reply may be kept
        self._chunk: list[bytes] | None = None
        #: the portal and statement names of the packet's Bind
        self._chunk_bound: tuple[str, str] | None = None
        #: the packet's one-key read, stamped (table, replica, position, end)
        self._chunk_read: tuple[Any, Any, int, int] | None = None

    # -- output ----------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.out.append(data)
        self.size += len(data)

    async def flush(self) -> None:
        if self._messages is not None:
            await self._messages.drain()
            return
        if self.out:
            self.writer.write(b"".join(self.out))
            self.out.clear()
            self.size = 0
        await self.writer.drain()

    async def _maybe_flush(self) -> None:
        if self.size >= FLUSH_BYTES:
            await self.flush()

    def _error(self, code: str, message: str, severity: str = "ERROR") -> None:
        self._chunk = None  # an error is never given again
        self.send(wire.error_response(code, message, severity))
        if self.tx == b"T":
            self.tx = b"E"

    # -- the connection --------------------------------------------------------------------
    async def run(self) -> None:
        try:
            if not await self._startup():
                return
            self.cancels[self.key] = self
            await self._serve()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass  # the client went away
        except wire.ProtocolViolation as e:
            self.send(wire.error_response("08P01", f"protocol violation: {e}", "FATAL"))
            await self._close_flush()
        finally:
            self.cancels.pop(self.key, None)
            self.writer.close()

    async def _close_flush(self) -> None:
        with contextlib.suppress(Exception):  # the client is gone or stuck: nothing to tell
            await asyncio.wait_for(self.flush(), 5)

    async def _startup(self) -> bool:
        """Protocol negotiation and authentication; False when the connection ends."""
        for _ in range(3):  # an SSL and a GSS request may come before the startup message
            code, payload = await wire.read_startup(self.reader)
            if code == wire.SSL_REQUEST:
                if self.tls is None or self.secure:
                    self.writer.write(b"N")
                    continue
                self.writer.write(b"S")
                await self.writer.drain()
                await self.writer.start_tls(self.tls)
                self.secure = True
                continue
            if code == wire.GSSENC_REQUEST:
                self.writer.write(b"N")
                continue
            if code == wire.CANCEL_REQUEST:
                target = (payload.int32(), payload.int32())
                victim = self.cancels.get(target)
                if victim is not None:
                    victim.cancel()
                return False
            if code >> 16 != 3:
                self.send(
                    wire.error_response(
                        "0A000",
                        f"protocol version {code >> 16}.{code & 0xFFFF} is not 3.0",
                        "FATAL",
                    )
                )
                await self._close_flush()
                return False
            params = wire.startup_parameters(payload)
            return await self._authenticate(params)
        raise wire.ProtocolViolation("no startup message")

    async def _authenticate(self, params: dict[str, str]) -> bool:
        if self.gate.auth.enabled:
            if not (self.secure or (self.loopback and self.allow_cleartext)):
                self.send(
                    wire.error_response(
                        "28000",
                        "the password (a JWT) is accepted only over TLS: connect with "
                        "sslmode=require",
                        "FATAL",
                    )
                )
                await self._close_flush()
                return False
            self.writer.write(wire.AUTH_CLEARTEXT)
            await self.writer.drain()
            kind, payload = await wire.read_message(self.reader)
            if kind != b"p":
                raise wire.ProtocolViolation("expected a password message")
            token = payload.cstring()
            self.authorization = f"Bearer {token}"
            try:
                caller = await self.gate.admit(self.authorization, self.scope)
                self._grants = None if caller is None else caller.grants
            except ApiError as e:
                self.send(
                    wire.error_response("28P01", f"the token was refused: {e.message}", "FATAL")
                )
                await self._close_flush()
                return False
        self.send(wire.AUTH_OK)
        for name in ("application_name", "client_encoding"):
            if name in params:
                self.settings[name] = params[name]
        for name in STARTUP_REPORTED:
            self.send(wire.parameter_status(name, self.settings.get(name.lower(), "")))
        self.send(wire.backend_key_data(*self.key))
        self.send(wire.ready_for_query(self.tx))
        await self.flush()
        return True

    def cancel(self) -> None:
        """A CancelRequest named this session: stop what it runs now."""
        if self.running is not None and not self.running.done():
            self.running.cancel()

    async def _serve(self) -> None:
        """Hand the connection to :class:`~tablecast.pg.transport.Messages` (with what the
        stream read ahead of the startup) and wait until it is over."""
        messages = Messages(self, self.writer.transport)  # type: ignore[arg-type]
        # the stream's read-ahead: bytes the client sent right after its startup packet
        pending = bytes(self.reader._buffer)
        self.reader._buffer.clear()
        self._messages = messages
        messages.start(pending)
        await messages.finished

    def violated(self, error: wire.ProtocolViolation) -> None:
        self.send(wire.error_response("08P01", f"protocol violation: {error}", "FATAL"))

    def handle(self, kind: bytes, payload: wire.Payload) -> object:
        """One message: None when handled, STOP for Terminate, else what to wait for."""
        if self._chunk is not None:
            self._chunk.append(kind)
        if kind == b"X":
            return STOP
        if kind == b"Q":
            return self._query(payload.cstring())
        if kind == b"S":
            self.skipping = False
            self.send(wire.ready_for_query(self.tx))
            return None
        if kind == b"H" or self.skipping:
            return None
        if kind == b"E":  # the one that reads, and may wait
            return self._execute_now(payload)
        handler = self._handlers.get(kind)
        if handler is None:
            raise wire.ProtocolViolation(f"unknown message type {kind!r}")
        if not self._guarded_now(handler, payload):
            self.skipping = True
        return None

    async def _query(self, sql: str) -> None:
        await self._guarded(self._simple(sql))
        self.send(wire.ready_for_query(self.tx))

    def _execute_now(self, payload: wire.Payload) -> Awaitable[None] | None:
        """Execute: a read of one key answered here at once; anything else, what does it."""
        try:
            name = payload.cstring()
            limit = payload.int32()
            portal = self.portals.get(name)
            if portal is None:
                raise SqlError("34000", f'portal "{name}" does not exist')
            st = portal.prepared.statement
            if (
                portal.rows is None
                and not portal.done
                and isinstance(st, Read)
                and self.authorization is None
                and _one_row(st, portal.params)
            ):
                self.gate.limit(None, self.scope)
                req = Request({}, None, self.scope)
                value = resolve(st.filter.keys[0], portal.params)
                before = self._before_read(st, value) if self._chunk is not None else None
                doc = self._key_now(st, value, req, self._bound())
                if isinstance(doc, Awaitable):
                    return self._one_later(st, portal, doc)
                self._send_one(st, portal, doc)
                if before is not None and name == "":
                    self._stamp_read(*before)
                return None
            return self._execute_later(portal, limit)
        except wire.ProtocolViolation:
            raise
        except Exception as e:
            self._failed(e)
            self.skipping = True
            return None

    # -- replies kept for packets sent again ------------------------------------------------
    def kept_reply(self, request: bytes) -> bytes | None:
        """The whole reply kept for a packet of these bytes (:mod:`tablecast.pg.kept_replies`),
        if this session would answer it so: the packet's statement the same SQL with the same
        parameter types, no read option, no transaction or error under way. The unnamed
        portal is left as the packet leaves it."""
        replies = self.replies
        if (
            replies is None
            or self.skipping
            or self.tx != b"I"
            or self.authorization
            or self._bound() is not NO_OPTIONS
            or self._as_of() is not None
        ):
            return None
        kept = replies.get(request)
        if kept is None:
            return None
        prepared = self.prepared.get(kept.name)
        if (
            prepared is None
            or prepared.sql != kept.sql
            or prepared.oids != kept.oids
            or not isinstance(prepared.statement, Read)
            or prepared.statement.info is not kept.info
        ):
            return None
        replies.hits += 1
        self.portals[""] = Portal(
            prepared, kept.params, kept.binary, sent=kept.sent, described=kept.described, done=True
        )
        if kept.noted is not None:
            self.noted = list(kept.noted)
        return kept.reply

    def chunk_begin(self) -> None:
        """A packet's messages come, with nothing written since the last: its reply may be
        kept (:meth:`chunk_end`)."""
        if self.replies is not None and not self.out and not self.authorization:
            self._chunk = []
            self._chunk_bound = self._chunk_read = None

    def chunk_end(self, request: bytes | None) -> None:
        """The packet `request` is handled, all of it at once (None: it was not): its reply,
        what the session is about to write, is kept if it was a Bind, Execute and Sync
        (Describes among them) of one key read here, and nothing went wrong."""
        kinds, self._chunk = self._chunk, None
        read, bound = self._chunk_read, self._chunk_bound
        if (
            request is None
            or kinds is None
            or read is None
            or bound is None
            or bound[0] != ""
            or self.skipping
            or self.tx != b"I"
            or kinds[0] != b"B"
            or kinds[-1] != b"S"
            or kinds.count(b"B") != 1
            or kinds.count(b"E") != 1
            or any(k not in (b"B", b"D", b"E", b"S") for k in kinds)
        ):
            return
        prepared = self.prepared.get(bound[1])
        portal = self.portals.get("")
        if prepared is None or portal is None or portal.prepared is not prepared or not portal.done:
            return
        info, replica, position, end = read
        reply = b"".join(self.out)
        kept = Reply(bound[1], prepared.sql, prepared.oids, info, replica, position, end, reply)
        kept.params, kept.binary = portal.params, portal.binary
        kept.described, kept.sent = portal.described, portal.sent
        kept.noted = tuple(self.noted)
        self.replies.keep(request, kept)  # type: ignore[union-attr]

    def _before_read(self, st: Read, value: Any) -> tuple[TableInfo, Any, ReadMark] | None:
        """The replica a plain read of key `value` is answered from here, with where it
        stood before the read (:meth:`Answers.stamp`); None when its reply is not kept."""
        if self.tx != b"I" or self._bound() is not NO_OPTIONS or self._as_of() is not None:
            return None
        info = st.info
        if not info.placed:
            return None
        local = self.router.local
        try:
            raw = local.key_bytes(info, key_text(info, value))
        except Exception:  # the read itself answers why
            return None
        replica = local.readable(info, info.partition_of(raw), NO_OPTIONS)
        if replica is None:
            return None
        return info, replica, mark(replica)

    def _stamp_read(self, info: TableInfo, replica: Any, before: ReadMark) -> None:
        """The packet's read was answered: the position it is exact at, if it may be kept."""
        position = self.replies.stamp(info, replica, before)  # type: ignore[union-attr]
        if position is None:
            self._chunk = None
        else:
            self._chunk_read = (info, replica, position, before.end)

    async def _one_later(
        self, st: Read, portal: Portal, pending: Awaitable[dict[str, Any] | None]
    ) -> None:
        """The end of a read of one key that waits (a peer's answer, a position)."""

        async def finish() -> None:
            self._send_one(st, portal, await pending)

        if not await self._guarded(finish()):
            self.skipping = True

    async def _execute_later(self, portal: Portal, limit: int) -> None:
        if not await self._guarded(self._execute(portal, limit)):
            self.skipping = True

    async def _settle(self, result: T | Awaitable[T]) -> T:
        """A read's answer: at once when it was answered here, else once it comes."""
        if isinstance(result, Awaitable):
            return await self._waited(result)
        return result

    async def _waited(self, pending: Awaitable[T]) -> T:
        """What a read that waits (a peer's answer, a position) gives, as the statement
        under way: a CancelRequest cancels it. A read answered here never gets this far."""
        self.running = asyncio.ensure_future(pending)
        try:
            return await self.running
        finally:
            self.running = None

    async def _guarded(self, work: Awaitable[Any]) -> bool:
        """Run `work`; an error it ends in is answered. False when it failed."""
        try:
            await work
            return True
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the node is stopping, not the client cancelling
            self._error("57014", "canceling statement due to user request")
        except wire.ProtocolViolation:
            raise
        except Exception as e:
            self._failed(e)
        return False

    def _guarded_now(
        self, handler: Callable[[Session, wire.Payload], None], payload: wire.Payload
    ) -> bool:
        """:meth:`_guarded` of a message handled without waiting (all but Execute)."""
        try:
            handler(self, payload)
            return True
        except wire.ProtocolViolation:
            raise
        except Exception as e:
            self._failed(e)
        return False

    def _failed(self, e: Exception) -> None:
        """The ErrorResponse of what a statement ended in."""
        if isinstance(e, SqlError):
            self._error(e.code, e.message)
        elif isinstance(e, CastFailed):
            self._error("22P02", str(e))
        elif isinstance(e, ApiError):
            self._error(SQLSTATE.get(e.code, "XX000"), e.message)
        else:  # a bug must cost one statement, never the connection
            log.error("a SQL statement failed", exc_info=e)
            self._error("XX000", f"internal error: {type(e).__name__}")

    # -- simple query ----------------------------------------------------------------------
    async def _simple(self, sql: str) -> None:
        statements = parse(sql, self.tables)
        if not statements:
            self.send(wire.EMPTY_QUERY)
            return
        for st in statements:
            self._check_tx(st)
            portal = Portal(Prepared(st, []), [], [])
            self._describe_rows(portal, simple=True)
            await self._execute(portal, 0)

    def _check_tx(self, st: Statement | None) -> None:
        if self.tx == b"E" and not (isinstance(st, Nothing) and st.tag in ("ROLLBACK", "COMMIT")):
            raise SqlError(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block",
            )

    # -- extended query --------------------------------------------------------------------
    def _parse(self, payload: wire.Payload) -> None:
        name = payload.cstring()
        sql = payload.cstring()
        oids = [payload.int32() for _ in range(payload.int16())]
        if name and name in self.prepared:
            raise SqlError("42P05", f'prepared statement "{name}" already exists')
        statements = parse(sql, self.tables)
        if len(statements) > 1:
            raise SqlError("42601", "cannot insert multiple commands into a prepared statement")
        if name and len(self.prepared) >= MAX_NAMED:
            raise SqlError("53400", f"at most {MAX_NAMED} prepared statements per connection")
        self.prepared[name] = Prepared(statements[0] if statements else None, oids, sql)
        self.send(wire.PARSE_COMPLETE)

    def _bind(self, payload: wire.Payload) -> None:
        portal_name = payload.cstring()
        name = payload.cstring()
        prepared = self.prepared.get(name)
        if prepared is None:
            raise SqlError("26000", f'prepared statement "{name}" does not exist')
        formats = [payload.int16() for _ in range(payload.int16())]
        count = payload.int16()
        raw = []
        for _ in range(count):
            n = payload.int32()
            raw.append(None if n == -1 else payload.bytes(n))
        result_formats = [payload.int16() for _ in range(payload.int16())]
        st = prepared.statement
        takes = Read | Sleep | FunctionRead | CatalogQuery | Subscribe
        wanted = st.params if isinstance(st, takes) else 0
        if count != wanted:
            raise SqlError("08P01", f"the statement takes {wanted} parameters, {count} were bound")
        values = []
        for i, data in enumerate(raw):
            fmt = formats[i] if len(formats) > 1 else (formats[0] if formats else 0)
            oid = prepared.oids[i] if i < len(prepared.oids) else 0
            if not oid and isinstance(st, Read | FunctionRead):
                oid = st.param_types.get(i + 1, TEXT).oid
            values.append(decode_parameter(data, oid, fmt == 1))
        columns = len(_outputs(st))
        if len(result_formats) > 1 and len(result_formats) != columns:
            raise SqlError("08P01", "result formats do not match the columns")
        binary = [
            (result_formats[i] if len(result_formats) > 1 else result_formats[0]) == 1
            if result_formats
            else False
            for i in range(columns)
        ]
        if portal_name and len(self.portals) >= MAX_NAMED:
            raise SqlError("53400", f"at most {MAX_NAMED} portals per connection")
        self._check_tx(st)
        if isinstance(st, CatalogQuery):  # answered now that its parameters are known
            rows = st.bound(values, self.tables)
            prepared = Prepared(rows, [])
            binary = binary[: len(rows.outputs)] + [False] * (len(rows.outputs) - len(binary))
        self.portals[portal_name] = Portal(prepared, values, binary)
        if self._chunk is not None:
            self._chunk_bound = (portal_name, name)
        self.send(wire.BIND_COMPLETE)

    def _describe(self, payload: wire.Payload) -> None:
        what = payload.bytes(1)
        name = payload.cstring()
        if what == b"S":
            prepared = self.prepared.get(name)
            if prepared is None:
                raise SqlError("26000", f'prepared statement "{name}" does not exist')
            st = prepared.statement
            oids = []
            if isinstance(st, Read | FunctionRead):
                for i in range(st.params):
                    given = prepared.oids[i] if i < len(prepared.oids) else 0
                    oids.append(given or st.param_types.get(i + 1, TEXT).oid)
            elif isinstance(st, CatalogQuery | Subscribe):
                oids = [
                    prepared.oids[i] if i < len(prepared.oids) else 25 for i in range(st.params)
                ]
            elif isinstance(st, Sleep) and st.params:
                oids = [prepared.oids[0] if prepared.oids else 701]  # double precision
            self.send(wire.parameter_description(oids))
            self._describe_rows(Portal(prepared, [], []))
        elif what == b"P":
            portal = self.portals.get(name)
            if portal is None:
                raise SqlError("34000", f'portal "{name}" does not exist')
            self._describe_rows(portal)
            portal.described = True
        else:
            raise wire.ProtocolViolation("Describe of neither S nor P")

    def _describe_rows(self, portal: Portal, simple: bool = False) -> None:
        """RowDescription of what `portal` returns; for a statement without rows, NoData
        (a simple query sends nothing then)."""
        prepared = portal.prepared
        formats = tuple(portal.binary)
        described = prepared.described.get(formats)
        if described is None:
            outputs = _outputs(prepared.statement)
            if not outputs:
                described = b"" if simple else wire.NO_DATA
            else:
                fields = []
                for i, (name, t) in enumerate(outputs):
                    binary = portal.binary[i] if i < len(portal.binary) else False
                    fields.append((name, t.oid, t.size, 1 if binary else 0))
                described = wire.row_description(fields)
            if len(prepared.described) < 8 and not (simple and not described):
                prepared.described[formats] = described
        if described:
            self.send(described)

    async def _execute_message(self, payload: wire.Payload) -> None:
        name = payload.cstring()
        limit = payload.int32()
        portal = self.portals.get(name)
        if portal is None:
            raise SqlError("34000", f'portal "{name}" does not exist')
        await self._execute(portal, limit)

    def _close(self, payload: wire.Payload) -> None:
        what = payload.bytes(1)
        name = payload.cstring()
        if what == b"S":
            self.prepared.pop(name, None)
        elif what == b"P":
            self.portals.pop(name, None)  # a row iterator left unfinished is dropped
        else:
            raise wire.ProtocolViolation("Close of neither S nor P")
        self.send(wire.CLOSE_COMPLETE)

    _handlers: ClassVar[dict[bytes, Callable[[Session, wire.Payload], None]]] = {
        b"P": _parse,
        b"B": _bind,
        b"D": _describe,
        b"C": _close,
    }

    # -- running a statement ---------------------------------------------------------------
    async def _execute(self, portal: Portal, limit: int) -> None:
        st = portal.prepared.statement
        if st is None:
            self.send(wire.EMPTY_QUERY)
            return
        if isinstance(st, Setting):
            self._set(st, portal.params)
            self.send(wire.command_complete("SET"))
            return
        if isinstance(st, Nothing):
            self._transaction(st.tag)
            self.send(wire.command_complete(st.tag))
            return
        if portal.done:
            self.send(wire.command_complete(f"SELECT {portal.sent}"))
            return
        if portal.rows is None and not isinstance(st, (Read, FunctionRead, Subscribe)):
            # the catalogs, SHOW and constants read no table, but the token is checked and
            # charged for them as for a read (a read does both in its own request)
            await self._request()
        if isinstance(st, Subscribe):
            sent = await subscribe.stream(self, self.live, st, portal.params, await self._request())
            portal.done = True
            self.send(wire.command_complete(f"COPY {sent}"))
            return
        types = [t for _, t in _outputs(st)]
        binary = portal.binary or [False] * len(types)
        if portal.rows is None and isinstance(st, Read) and _one_row(st, portal.params):
            # a read of one key (the prepared point SELECT): no row iterator
            value = resolve(st.filter.keys[0], portal.params)
            doc = await self._one_key(st, value, await self._request(), self._bound())
            self._send_one(st, portal, doc)
            return
        if portal.rows is None:
            portal.rows = self._rows(st, portal.params)
        rows = portal.rows
        while limit <= 0 or portal.sent < limit:
            try:
                row = await anext(rows)
            except StopAsyncIteration:
                portal.done = True
                self.send(wire.command_complete(_tag(st, portal.sent)))
                return
            self.send(wire.data_row([encode(v, types[i], binary[i]) for i, v in enumerate(row)]))
            portal.sent += 1
            await self._maybe_flush()
        self.send(wire.PORTAL_SUSPENDED)

    def _transaction(self, tag: str) -> None:
        if tag == "BEGIN":
            self.tx = b"T" if self.tx == b"I" else self.tx
        elif tag in ("COMMIT", "ROLLBACK"):
            self.tx = b"I"

    def _set(self, st: Setting, params: Sequence[Any]) -> None:
        self._bound_kept = None
        self._chunk = None
        value = resolve(st.value, params)
        name = st.name
        if name in SESSION_READ_SETTINGS:
            if value is not None and name == "tablecast.as_of":
                try:
                    int(value)
                except (TypeError, ValueError):
                    raise SqlError(
                        "22023", f"{name} is a time in epoch ms, not {value!r}"
                    ) from None
            elif value is not None and name != "tablecast.after":
                try:
                    if int(value) < 0:
                        raise ValueError
                except (TypeError, ValueError):
                    raise SqlError(
                        "22023", f"{name} is a non-negative integer, not {value!r}"
                    ) from None
            if value is not None and name == "tablecast.after":
                bound_of({}, str(value))  # 400 -> 22023 now, not at the next read
        elif name.startswith("tablecast."):
            # tablecast's prefix is reserved, as an extension's is: a misspelt setting
            # is refused rather than kept and never read
            raise SqlError("42704", f'unrecognized configuration parameter "{name}"')
        elif (
            name == "client_encoding"
            and value is not None
            and str(value).upper().replace("-", "") not in ("UTF8", "UNICODE")
        ):
            raise SqlError("22023", "tablecast speaks UTF8 only")
        if value is None:
            self.settings.pop(name, None)
            if name in DEFAULT_SETTINGS:
                self.settings[name] = DEFAULT_SETTINGS[name]
        else:
            self.settings[name] = str(value)
        if name in REPORTED:
            self.send(wire.parameter_status(name, self.settings.get(name, "")))

    def _show(self, name: str) -> tuple[Any, ...]:
        if name in NOTED:
            return (self.noted[_NOTED_INDEX[name]],)
        if name == "all":
            raise SqlError("0A000", "not supported: SHOW ALL")
        if name in SESSION_READ_SETTINGS:
            return (self.settings.get(name, ""),)  # unset: empty, as PostgreSQL's own
        if name not in self.settings:
            raise SqlError("42704", f'unrecognized configuration parameter "{name}"')
        return (self.settings[name],)

    # -- reads -----------------------------------------------------------------------------
    def _table(self, name: str) -> Any:
        if self._grants is not None:  # before the lookup: no answer tells which tables exist
            self._grants.require_table(name)
        try:
            return self.router.local.table(name)
        except ApiError as e:
            if e.code == "table_not_found":
                raise SqlError("42P01", f'relation "{name}" does not exist') from None
            raise

    def _listing(self) -> list[TableInfo]:
        """The tables the catalogs show: those the token may read some of."""
        tables = list(self.router.local.node.tables.values())
        grants = self._grants
        return tables if grants is None else [t for t in tables if grants.allows_table(t.name)]

    async def _request(self) -> Request:
        """The caller of the statement under way: its token checked again (it may have
        expired since the connection began) and one of its rate-limit tokens spent."""
        caller: Caller | None = None
        if self.authorization is not None:
            try:
                found = self.gate.caller(self.authorization, self.scope)
                caller = await found if isinstance(found, Awaitable) else found  # type: ignore[assignment]
            except ApiError:
                self._grants = Grants({})  # a refused token shows no table from now on
                raise
            self._grants = None if caller is None else caller.grants  # the next plan's too
        self.gate.limit(caller, self.scope)
        headers = {"authorization": self.authorization} if self.authorization else {}
        return Request(headers, caller, self.scope)

    def _as_of(self) -> int | None:
        """The time reads are answered as of (``SET tablecast.as_of``), None: the latest."""
        text = self.settings.get("tablecast.as_of")
        return None if text is None else int(text)

    def _bound(self) -> Any:
        """The read options the session's settings spell (kept until a SET)."""
        if self._bound_kept is None:
            self._bound_kept = self._bound_of_settings()
        return self._bound_kept

    def _bound_of_settings(self) -> Any:
        params = {
            option: self.settings[name]
            for name, option in CONSISTENCY.items()
            if self.settings.get(name) is not None
        }
        return bound_of(params, self.settings.get("tablecast.after"))

    async def _rows(self, st: Statement, params: Sequence[Any]) -> AsyncIterator[tuple[Any, ...]]:
        """The statement's rows, each as its output columns' values."""
        if isinstance(st, Rows):
            for r in st.rows:
                yield r
            return
        if isinstance(st, Sleep):
            await self._waited(asyncio.sleep(sleep_seconds(resolve(st.seconds, params))))
            yield ("",)
            return
        if isinstance(st, FunctionRead):
            skip = _count_value(st.offset, params) or 0
            limit = _count_value(st.limit, params)
            n = 0
            async for row in self._function_rows(st, params, await self._request(), limit, skip):
                if skip:
                    skip -= 1
                    continue
                if limit is not None and n >= limit:
                    return
                yield tuple(o.of(row) for o in st.outputs)
                n += 1
            return
        if isinstance(st, Show):
            yield self._show(st.name)
            return
        assert isinstance(st, Read)
        req = await self._request()
        skip = _count_value(st.offset, params) or 0
        limit = _count_value(st.limit, params)
        if st.count:
            yield (await self._count(st, params, req),)
            return
        if limit == 0:
            return
        n = 0
        async for row in self._read(st, params, req, None if limit is None else limit + skip):
            if skip:
                skip -= 1
                continue
            yield tuple(o.of(row) for o in st.outputs)
            n += 1
            if limit is not None and n >= limit:
                return

    async def _function_rows(
        self,
        st: FunctionRead,
        params: Sequence[Any],
        req: Request,
        limit: int | None,
        skip: int,
    ) -> AsyncIterator[dict[str, Any]]:
        """The rows of a table function (tablecast.history(...) and the others), page by
        page, as the read core gives them."""
        info = st.info
        if self._as_of() is not None:  # HTTP's index, history and windows take no as_of
            raise SqlError(
                "0A000", f"not supported: tablecast.{st.kind}(...) with tablecast.as_of set"
            )
        args = [resolve(a, params) for a in st.args]
        time_from, time_to = st.times.resolve(params)
        if time_from is not None and time_to is not None and time_from > time_to:
            return
        cursor = None
        while True:
            page = PAGE if limit is None else max(1, min(PAGE, limit + skip))
            q: Any
            if st.kind == "history":
                # a history's end is exclusive, as HTTP's ?to=
                end = None if time_to is None else time_to + 1
                q = HistoryQuery.versions(
                    info.name, key_text(info, args[0]), time_from, end, limit=page,
                    newest_first=st.newest_first, cursor=cursor, bound=self._bound(),
                )  # fmt: skip
            elif st.kind == "windows":
                q = WindowsQuery.between(
                    info.name, key_text(info, args[0]), time_from, time_to, self._bound()
                )
            elif st.kind == "index":
                index, value = args
                if not isinstance(index, str) or value is None:
                    raise SqlError("22023", "tablecast.index takes a table, an index and a value")
                q = IndexQuery.equal(info.name, index, _index_text(value), limit=page,
                                     cursor=cursor, bound=self._bound())  # fmt: skip
            else:
                index, low, high = args
                if not isinstance(index, str):
                    raise SqlError("22023", "tablecast.index_range's second argument is an index")
                q = IndexQuery.between(
                    info.name, index, None if low is None else _index_text(low),
                    None if high is None else _index_text(high), limit=page, cursor=cursor,
                    bound=self._bound(),
                )  # fmt: skip
            doc = await self._doc(q, req)
            key_value = key_json(info, args[0]) if st.kind in ("history", "windows") else None
            for item in doc["items"]:
                if st.kind == "history":
                    yield {"key": key_value, **item}
                elif st.kind == "windows":
                    yield {"key": key_value, "window_start": item["start"],
                           "window_end": item["end"], "value": item["value"]}  # fmt: skip
                elif st.kind == "index_range":
                    yield {"index_value": item.get("index"), **item}
                else:
                    yield item
            cursor = doc.get("next_cursor")
            if not cursor:
                return

    async def _doc(self, q: Any, req: Request) -> dict[str, Any]:
        """What the read core answers `q` with, as data; its error raised as the API's."""
        found = await self._settle(self.router.read(q, req))
        if isinstance(found, Found):
            self._noted_found(found)
            return found.doc
        if not isinstance(found, tuple):
            raise ApiError("bad_request", "a SQL read is never redirected")
        status, body, headers = found
        self._note(headers)
        doc = orjson.loads(body)
        if status != 200:
            err = doc.get("error", {})
            raise ApiError(err.get("code", "internal"), err.get("message", ""))
        return doc  # type: ignore[no-any-return]

    async def _count(self, st: Read, params: Sequence[Any], req: Request) -> int:
        if st.filter.path == "all" and st.filter.where is None and self._as_of() is None:
            found = await self._settle(self.router.read(CountQuery(st.table, self._bound()), req))
            self._noted_found(found)
            return int(found.doc["count"])  # type: ignore[union-attr]
        return sum([1 async for _ in self._read(st, params, req, None)])

    def _noted_found(self, found: Any) -> None:
        """:meth:`_note` of a read of several partitions: one of none (an empty span) names
        no position, and says no lag or staleness."""
        if not isinstance(found, Found):
            raise ApiError("bad_request", "a SQL read is never redirected")
        self._note(found.headers, position="")

    def _note(self, headers: Sequence[tuple[str, str]], position: str | None = None) -> None:
        """What a read's answer headers say, for ``SHOW``: each read replaces all of the
        last one's (a header it lacks is NULL, `position` for the position)."""
        noted: list[str | None] = [position, None, None]
        for name, value in headers:
            i = _NOTED_BY_HEADER.get(name)
            if i is not None:
                noted[i] = value
        self.noted = noted

    async def _one_key(
        self, st: Read, value: Any, req: Request, bound: Any
    ) -> dict[str, Any] | None:
        """The row of key `value` (None: not there)."""
        doc = self._key_now(st, value, req, bound)
        return await doc if isinstance(doc, Awaitable) else doc

    def _key_now(
        self, st: Read, value: Any, req: Request, bound: Any, running: bool = True
    ) -> dict[str, Any] | Awaitable[dict[str, Any] | None] | None:
        """The row of key `value` (None: not there) when this node answered it at once;
        else what gives it once a peer answers or a position is reached (`running`: see
        :meth:`_key_later`)."""
        query = KeyQuery(st.table, key_text(st.info, value), bound, self._as_of())
        try:
            answer = self.router.key(query, req, encode=row_doc)
        except ApiError as e:
            return self._not_there(e)
        if isinstance(answer, tuple):
            return self._key_doc(answer)
        return self._key_later(answer, running)

    async def _key_later(
        self, pending: Awaitable[Any], running: bool = True
    ) -> dict[str, Any] | None:
        """`pending`'s row; `running`: it is the statement under way (a CancelRequest
        cancels it), not one of several reads of one (:meth:`_each_key`)."""
        try:
            answer = await (self._waited(pending) if running else pending)
        except ApiError as e:
            return self._not_there(e)
        return self._key_doc(answer)

    async def _each_key(
        self, st: Read, values: Sequence[Any], req: Request, bound: Any
    ) -> list[dict[str, Any] | None]:
        """The row of each key of `values` (None: not there), read one by one, at most
        KEYS_AT_ONCE waiting at a time; cancelled as one statement."""
        out: list[dict[str, Any] | None] = []
        for i in range(0, len(values), KEYS_AT_ONCE):
            docs = [
                self._key_now(st, v, req, bound, running=False)
                for v in values[i : i + KEYS_AT_ONCE]
            ]
            later = [j for j, d in enumerate(docs) if isinstance(d, Awaitable)]
            got = await asyncio.gather(*(docs[j] for j in later))
            for j, doc in zip(later, got, strict=True):
                docs[j] = doc
            out.extend(docs)
        return out

    def _not_there(self, error: ApiError) -> None:
        """A key read's error: a key not found is no row (at the position it names)."""
        if error.code != "key_not_found":
            raise error
        self._note(error.headers)

    def _key_doc(self, answer: tuple[int, bytes, Any]) -> dict[str, Any] | None:
        """The row of a key read's answer (None: not there); a peer's error raised."""
        status, body, headers = answer
        self._note(headers)
        if isinstance(body, RowDoc):
            return body
        if status == 404:
            return None
        doc = orjson.loads(body)
        if status != 200:
            err = doc.get("error", {}) if isinstance(doc, dict) else {}
            raise ApiError(err.get("code", "internal"), err.get("message", "a peer failed"))
        return doc  # type: ignore[no-any-return]

    def _send_one(self, st: Read, portal: Portal, doc: dict[str, Any] | None) -> None:
        """The answer of a read of one key: its row, if any, and the command's end."""
        if doc is not None:
            binary = portal.binary or [False] * len(st.outputs)
            values = [encode(o.of(doc), o.type, b) for o, b in zip(st.outputs, binary, strict=True)]
            self.send(wire.data_row(values))
        portal.done = True
        portal.sent = 0 if doc is None else 1
        self.send(wire.command_complete(f"SELECT {portal.sent}"))

    async def _read(
        self, st: Read, params: Sequence[Any], req: Request, most: int | None
    ) -> AsyncIterator[dict[str, Any]]:
        """The rows the WHERE selects, by key, as {key, value[, partition, offset,
        timestamp]}."""
        info, f = st.info, st.filter
        bound = self._bound()
        if f.path == "key":
            doc = await self._one_key(st, resolve(f.keys[0], params), req, bound)
            if doc is not None:
                yield doc
            return
        if f.path == "keys" and (st.metadata or self._as_of() is not None):
            # a batch read gives neither as_of nor a record's partition, offset and time:
            # each key is read on its own, KEYS_AT_ONCE at a time
            raws = sorted({key_raw(info, resolve(v, params)): v for v in f.keys}.items())
            if len(raws) > MAX_BATCH:
                raise ApiError("bad_request", f"at most {MAX_BATCH} keys per batch")
            values = [resolve(v, params) for _, v in raws]
            for one in await self._waited(self._each_key(st, values, req, bound)):
                if one is not None:
                    yield one
            return
        if f.path == "keys":
            values = [resolve(v, params) for v in f.keys]
            keys = [key_json(info, v) for v in values]
            found = await self._settle(
                self.router.read(BatchQuery.of_keys(st.table, keys, bound), req)
            )
            self._noted_found(found)
            results = found.doc["results"]  # type: ignore[union-attr]
            refused = next((r for r in results if r.get("forbidden")), None)
            if refused is not None:  # as a read of that key alone is refused
                raise forbidden_key(st.table, key_text(info, refused["key"]))
            rows = [(key_raw(info, r["key"]), r) for r in results if r.get("found")]
            seen = set()
            for raw, r in sorted(rows, key=lambda x: x[0]):
                if raw not in seen:  # a key named twice is one row
                    seen.add(raw)
                    yield {"key": r["key"], "value": r["value"]}
            return
        start = end = prefix = None
        high_raw = None
        if f.path == "prefix":
            pattern = resolve(f.prefix, params)
            if not isinstance(pattern, str):
                raise SqlError("42804", "LIKE takes a text pattern")
            prefix = pattern[:-1] or None
        numbers = info.key["format"] == "long"
        if numbers:
            # bigint keys compare as numbers, but are stored big-endian, negatives last:
            # a span of non-negative numbers is a span of bytes, anything else reads all
            start, end = _non_negative_span(f.low, f.high, params)
        else:
            if f.low is not None:
                start = key_text(info, resolve(f.low[0], params))
            if f.high is not None:
                high = resolve(f.high[0], params)
                if f.high[1]:
                    high_raw = key_raw(info, high)  # inclusive: read on, stop past it
                else:
                    end = key_text(info, high)
        cursor = None
        while True:
            page = PAGE if most is None else max(1, min(PAGE, most))
            q = RangeQuery.between(
                st.table,
                start,
                end,
                prefix=prefix,
                as_of=self._as_of(),
                limit=page,
                cursor=cursor,
                bound=bound,
                record_fields=st.metadata,
            )
            found = await self._settle(self.router.read(q, req))
            self._noted_found(found)
            doc = found.doc  # type: ignore[union-attr]
            for item in doc["items"]:
                raw = key_raw(info, item["key"])
                if high_raw is not None and raw > high_raw:
                    return
                if numbers and start is not None and raw[0] & 0x80:
                    return  # past the non-negative keys
                if row_passes(f.where, raw, info, params):
                    yield item
            cursor = doc.get("next_cursor")
            if not cursor:
                return


#: the largest bigint
_INT64_MAX = 2**63 - 1


def _non_negative_span(
    low: tuple[Any, bool] | None, high: tuple[Any, bool] | None, params: Sequence[Any]
) -> tuple[str | None, str | None]:
    """The (start, end) texts of a bigint range whose low bound is not negative (its keys are
    contiguous bytes); (None, None), every key, otherwise."""
    if low is None:
        return None, None
    lo = _integer(resolve(low[0], params)) + (0 if low[1] else 1)
    if lo < 0:
        return None, None
    lo = min(lo, _INT64_MAX)
    end = None
    if high is not None:
        hi = _integer(resolve(high[0], params)) + (1 if high[1] else 0)
        end = str(max(hi, lo)) if hi <= _INT64_MAX else None
    return str(lo), end


def _index_text(v: Any) -> str:
    """An index value as the HTTP API takes it: a string as it is, else its JSON."""
    return v if isinstance(v, str) else orjson.dumps(v).decode()


def _integer(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise SqlError("22P02", f"invalid input syntax for type bigint: {v!r}") from None


class RowDoc(dict):  # type: ignore[type-arg]
    """A key's row as this node read it (a peer's answer comes as its JSON body)."""


def row_doc(info: Any, raw: bytes, partition: int, record: Any) -> RowDoc:
    """The row of a record read here, its JSON value left unparsed (an ``orjson.Fragment``
    for a JSON table) until a column needs a field of it."""
    return RowDoc(
        key=info.key_serde.to_json(raw),
        value=info.value_serde.to_json(record.value),
        partition=partition,
        offset=record.offset,
        timestamp=record.timestamp,
    )


def _one_row(st: Read, params: Sequence[Any]) -> bool:
    """Whether `st` reads one key and gives its row as it is (no count, nothing skipped)."""
    return (
        st.filter.path == "key"
        and not st.count
        and st.offset is None
        and (st.limit is None or _count_value(st.limit, params) != 0)
    )


def _count_value(v: Any, params: Sequence[Any]) -> int | None:
    if v is None:
        return None
    n = resolve(v, params) if isinstance(v, Param) else v
    try:
        n = int(n)
    except (TypeError, ValueError):
        raise SqlError("22P02", f"LIMIT and OFFSET take an integer, not {n!r}") from None
    if n < 0:
        raise SqlError("2201W", "LIMIT and OFFSET must not be negative")
    return n


def _outputs(st: Statement | None) -> list[tuple[str, PgType]]:
    if isinstance(st, Read | FunctionRead):
        return [(o.name, o.type) for o in st.outputs]
    if isinstance(st, Rows):
        return list(st.outputs)
    if isinstance(st, CatalogQuery):
        return [(n, TEXT) for n in st.names]
    if isinstance(st, Show):
        return [(st.name, TEXT)]
    if isinstance(st, Sleep):
        return [("pg_sleep", TEXT)]
    return []


def _tag(st: Statement, rows: int) -> str:
    if isinstance(st, Show):
        return "SHOW"
    return f"SELECT {rows}"
