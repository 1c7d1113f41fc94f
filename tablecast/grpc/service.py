"""gRPC: service ``tablecast.v1.Tables`` (tablecast/proto/tables.proto) beside HTTP.

Each call is decoded into the read it asks (:mod:`tablecast.query.queries`) and
answered by the router as an HTTP request for that read is (forwarding to the
owner included); Watch by the watch service. The caller's bearer token comes from
the ``authorization`` metadata; the rate limit and the auth policy apply exactly
as for HTTP. Calls are served on the node's event loop by :mod:`tablecast.grpc.http2`:
a Get read here is answered in the pass that parsed it, and a Watch is one more sink
of the hub, its events serialized once per change and shared like the SSE ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NoReturn, Protocol

import grpc
import orjson
from prometheus_client import CollectorRegistry

from tablecast.cluster.node import Node as ClusterNode
from tablecast.contract.table_info import TableInfo
from tablecast.grpc import reflection
from tablecast.grpc.health import NOT_SERVING, SERVING, Health
from tablecast.grpc.health import SERVICE as HEALTH_SERVICE
from tablecast.grpc.http2 import Call, GrpcError, Kind, Method, Server, Status, varint
from tablecast.live.events import ERROR, READY, Change, Encoder
from tablecast.live.service import Live
from tablecast.live.sinks import QueueSink
from tablecast.proto import tables_pb2 as pb
from tablecast.query.auth import Caller
from tablecast.query.consistency import AFTER_HEADER, ReadOptions, bound_of
from tablecast.query.errors import ApiError
from tablecast.query.fanout import limit_param
from tablecast.query.gate import Gate, fetching
from tablecast.query.local import Found
from tablecast.query.peer_pool import SIGNATURE
from tablecast.query.queries import BatchQuery, KeyQuery, RangeQuery, WatchQuery
from tablecast.query.reads import Router
from tablecast.query.request import HOP, Request
from tablecast.store import Record

log = logging.getLogger(__name__)


class NodeApp(Protocol):
    """What the service reads with: the node's HTTP app is one."""

    node: ClusterNode
    router: Router
    live: Live
    gate: Gate
    #: the node's metrics, which the gRPC server's figures join
    metrics: CollectorRegistry


SERVICE = "tablecast.v1.Tables"
#: the names grpc.health.v1 answers for: the whole server ("") and the service
HEALTH_NAMES = ("", SERVICE)
#: how often the health status is brought in line with the node's readiness
HEALTH_POLL_S = 0.5
#: the HTTP API's error codes as gRPC statuses
STATUS = {
    "bad_request": Status.INVALID_ARGUMENT,
    "unauthorized": Status.UNAUTHENTICATED,
    "forbidden": Status.PERMISSION_DENIED,
    "table_not_found": Status.NOT_FOUND,
    "key_not_found": Status.NOT_FOUND,
    "not_found": Status.NOT_FOUND,
    "rate_limited": Status.RESOURCE_EXHAUSTED,
    "payload_too_large": Status.RESOURCE_EXHAUSTED,
    "partition_unavailable": Status.UNAVAILABLE,
    "shutdown": Status.UNAVAILABLE,
    "timeout": Status.DEADLINE_EXCEEDED,
}


def key_text(key: Any) -> str:
    """A key's JSON value in its text form (a URL path's): strings as they are, else JSON."""
    return key if isinstance(key, str) else orjson.dumps(key).decode()


def json_text(value: Any) -> str:
    """A row's value as compact JSON text: a value read here comes as stored (a JSON table's
    bytes as written), one from a peer parsed, and both answer alike."""
    if isinstance(value, orjson.Fragment):
        value = orjson.loads(orjson.dumps(value))
    return orjson.dumps(value).decode()


class GrpcEncoder(Encoder):
    """Watch events as serialized ``WatchEvent`` messages (the handler passes bytes through)."""

    name = "grpc"

    def encode(self, kind: str, token: str | None, change: Change | None, extra: Any = None) -> Any:
        if kind == ERROR:
            err = (extra or {}).get("error", {})
            return (ERROR, err.get("code", "error"), err.get("message", ""))
        event = pb.WatchEvent(event=kind, id=token or "")
        if change is not None:
            r = change.renderer
            row = event.row
            row.key = key_text(r.key_object(change.key))
            row.value = change.value_json.decode()
            row.partition = change.partition
            row.offset = change.offset
            row.timestamp = change.timestamp
        elif kind == READY:
            event.rows = int((extra or {}).get("rows", 0))
        return event.SerializeToString()

    def keep_alive(self, token: str | None) -> bytes:
        return pb.WatchEvent(event="keep-alive", id=token or "").SerializeToString()


GRPC = GrpcEncoder()


class RowBytes(bytes):
    """A ``Row`` message, serialized: a key's record read here (a peer's answer is its HTTP
    body)."""


def row_of(info: TableInfo, raw: bytes, partition: int, record: Record) -> RowBytes:
    """A key's record as the ``Row`` message: key and value in their JSON text (SerdeError if
    the stored value cannot be read as its format)."""
    value = info.value_serde
    if value.format == "json":  # kept as written, given compact as a forwarded answer's is
        text = orjson.dumps(orjson.loads(record.value)).decode()
    else:
        text = orjson.dumps(value.to_json(record.value)).decode()
    row = pb.Row(
        key=key_text(info.key_serde.to_json(raw)),
        value=text,
        partition=partition,
        offset=record.offset,
        timestamp=record.timestamp,
    )
    return RowBytes(row.SerializeToString())


def found_response(row: bytes, headers: list[tuple[str, str]]) -> bytes:
    """The ``GetResponse`` of a row read here, serialized: the row appended as its field 2
    (a message's fields may come in any order), so a kept row is not parsed again."""
    head = pb.GetResponse(found=True, **_freshness(headers)).SerializeToString()
    return head + b"\x12" + varint(len(row)) + row


def kept_name(table: str, key: str) -> str:
    """The name a Get's answer is kept under (never an HTTP path's)."""
    return f"grpc\0{table}\0{key}"


def row_of_entry(doc: dict[str, Any]) -> pb.Row:
    """A key read's HTTP body, parsed (a peer's answer), as the ``Row`` message."""
    return pb.Row(
        key=key_text(doc["key"]),
        value=orjson.dumps(doc["value"]).decode(),
        partition=doc["partition"],
        offset=doc["offset"],
        timestamp=doc["timestamp"],
    )


class _Scope:
    """What the router reads of a request's scope: the client's address (rate limits)."""

    __slots__ = ("client",)

    def __init__(self, client: str) -> None:
        self.client = client


class Tables:
    """The handlers; each decodes its call into a read and the router's answer into its
    message."""

    def __init__(self, app: NodeApp) -> None:
        self.app = app
        self.router = app.router
        self.live = app.live
        self.gate = app.gate
        #: whole answers of plain Gets, kept beside HTTP's (None: not kept, as for HTTP)
        self.answers = app.router.answers

    def _request(self, call: Call) -> Request | Awaitable[Request]:
        """The caller of a call, as the router takes it (its token admitted by the gate); what
        waits for the signing key a new token needs."""
        metadata = call.metadata
        if HOP in metadata or SIGNATURE in metadata:
            # nodes forward to each other over HTTP, signed: a gRPC call always comes
            # from a client, which the router must never take for a hop
            _abort(
                ApiError(
                    "forbidden",
                    f"{HOP} and {SIGNATURE} are for the nodes' own calls over HTTP; "
                    "a gRPC call is never forwarded",
                )
            )
        scope = _Scope(call.client)
        try:
            found = self.gate.caller(metadata.get("authorization"), scope)
            if fetching(found):
                return self._verified(found, metadata, scope)
            self.gate.limit(found, scope)
        except ApiError as e:
            _abort(e)
        return Request(metadata, found, scope)

    async def _verified(
        self, found: Awaitable[Caller], metadata: dict[str, str], scope: _Scope
    ) -> Request:
        try:
            caller = await found
            self.gate.limit(caller, scope)
        except ApiError as e:
            _abort(e)
        return Request(metadata, caller, scope)

    async def _admitted(self, call: Call) -> Request:
        req = self._request(call)
        return req if isinstance(req, Request) else await req

    def _answer(self, answer: tuple[int, bytes, list[tuple[str, str]]]) -> tuple[dict, list]:  # type: ignore[type-arg]
        """A peer's answer as JSON and headers; an error answer fails the call."""
        status, body, headers = answer
        doc = orjson.loads(body)
        if status >= 400:
            err = doc.get("error", {})
            code = err.get("code", "internal")
            _abort(ApiError(code if code in STATUS else "bad_request", err.get("message", "")))
        return doc, headers

    def get(self, request: pb.GetRequest, call: Call) -> Any:
        answers = self.answers
        keep_as = None
        metadata = call.metadata
        # a kept answer is as fresh as the replica now: a read after a position may have to wait
        if answers is not None and not request.HasField("max_lag") and AFTER_HEADER not in metadata:
            keep_as = kept_name(request.table, request.key)
            entry = (
                answers.get(keep_as) if HOP not in metadata and SIGNATURE not in metadata else None
            )
            if entry is not None:  # kept: answered as a read here would be, from its bytes
                wire = entry.wire
                if wire is None:
                    wire = entry.wire = found_response(entry.body, entry.headers)
                return wire
        req = self._request(call)
        if not isinstance(req, Request):
            return self._get_later(request, req)
        try:
            query = KeyQuery.latest(request.table, request.key, _bound(request, metadata))
            answer = self.router.key(query, req, keep_as, row_of)
        except ApiError as e:
            return _not_found(e)
        if not isinstance(answer, tuple):
            return self._get_forwarded(answer)
        return self._got(answer)

    async def _get_later(
        self, request: pb.GetRequest, pending: Awaitable[Request]
    ) -> pb.GetResponse:
        req = await pending
        try:
            query = KeyQuery.latest(request.table, request.key, _bound(request, req.headers))
            answer = self.router.key(query, req, encode=row_of)
            if not isinstance(answer, tuple):
                answer = await answer
        except ApiError as e:
            return _not_found(e)
        return self._got(answer)

    async def _get_forwarded(self, pending: Awaitable[Any]) -> Any:
        try:
            answer = await pending
        except ApiError as e:
            return _not_found(e)
        return self._got(answer)

    def _got(self, answer: tuple[int, Any, list[tuple[str, str]]]) -> pb.GetResponse | bytes:
        if isinstance(answer[1], RowBytes):  # read here: the message made of the record
            return found_response(answer[1], answer[2])
        # a peer's answer, which comes as its HTTP body
        if answer[0] == 404 and _error_code(answer[1]) == "key_not_found":
            return pb.GetResponse(found=False, **_freshness(answer[2]))
        doc, headers = self._answer(answer)
        return pb.GetResponse(found=True, row=row_of_entry(doc), **_freshness(headers))

    async def _found(self, read: Awaitable[Any]) -> Found:
        """A read of many rows, answered as data (an error fails the call)."""
        try:
            found = await read
        except ApiError as e:
            _abort(e)
        if not isinstance(found, Found):  # a redirect: asked for by a parameter gRPC lacks
            _abort(ApiError("bad_request", "a gRPC read is never redirected"))
        return found

    async def batch_get(self, request: pb.BatchGetRequest, call: Call) -> pb.BatchGetResponse:
        req = await self._admitted(call)
        try:
            info, _ = self.router.table(request.table, req)
            local = self.router.local
            keys = [info.key_serde.to_json(local.key_bytes(info, k)) for k in request.keys]
            query = BatchQuery.of_keys(request.table, keys, _bound(request, req.headers))
        except ApiError as e:
            _abort(e)
        found = await self._found(self.router.fan.batch_get(query, req))
        out = pb.BatchGetResponse(**_freshness(found.headers))
        for item in found.doc["results"]:
            result = out.results.add(key=key_text(item["key"]), found=item["found"])
            if item["found"]:
                result.value = json_text(item["value"])
            if item.get("forbidden"):
                result.forbidden = True
        return out

    async def range(self, request: pb.RangeRequest, call: Call) -> pb.RangeResponse:
        req = await self._admitted(call)
        try:
            query = RangeQuery.between(
                request.table,
                _optional(request, "start"),
                _optional(request, "end"),
                prefix=_optional(request, "prefix"),
                limit=limit_param({"limit": str(request.limit)} if request.limit else {}),
                cursor=request.cursor or None,
                bound=_bound(request, req.headers),
                record_fields=True,  # a Row names its record
            )
        except ApiError as e:
            _abort(e)
        found = await self._found(self.router.fan.range(query, req))
        out = pb.RangeResponse(
            next_cursor=found.doc["next_cursor"] or "", **_freshness(found.headers)
        )
        for item in found.doc["items"]:
            out.items.add(
                key=key_text(item["key"]),
                value=json_text(item["value"]),
                # a peer of an earlier version gives its rows without them
                partition=item.get("partition", 0),
                offset=item.get("offset", 0),
                timestamp=item.get("timestamp", 0),
            )
        return out

    async def watch(self, request: pb.WatchRequest, call: Call) -> AsyncIterator[bytes]:
        req = await self._admitted(call)
        query = WatchQuery(
            request.table,
            tuple(request.keys),
            _optional(request, "prefix"),
            _optional(request, "start"),
            _optional(request, "end"),
            snapshot=not request.no_snapshot,
            since=request.since or None,
        )
        try:
            plan = await self.live.prepare(query, req)
        except ApiError as e:
            _abort(e)
        try:
            sink = QueueSink(self.live.hub.touched, size=_size)
            watch = self.live.begin(plan, GRPC, sink)
            try:
                async for event in sink.drain():
                    if isinstance(event, tuple):  # the watch ended with an error
                        _, code, message = event
                        _abort(
                            ApiError(code if code in STATUS else "partition_unavailable", message)
                        )
                    yield event
                if sink.reason is not None:
                    _abort(ApiError("partition_unavailable", f"the watch ended: {sink.reason}"))
            finally:
                sink.close()
                self.live.end(watch)
        finally:
            plan.release()

    def methods(self) -> dict[str, Method]:
        path = f"/{SERVICE}/"
        return {
            path + "Get": Method(Kind.UNARY, pb.GetRequest.FromString, self.get),
            path + "BatchGet": Method(Kind.UNARY, pb.BatchGetRequest.FromString, self.batch_get),
            path + "Range": Method(Kind.UNARY, pb.RangeRequest.FromString, self.range),
            # events come serialized (once per change, shared by its watchers)
            path + "Watch": Method(Kind.STREAM, pb.WatchRequest.FromString, self.watch),
        }


def _optional(request: Any, field: str) -> str | None:
    return getattr(request, field) if request.HasField(field) else None


def _bound(request: Any, metadata: Mapping[str, str]) -> ReadOptions:
    """A read's bound: its ``max_lag`` field, and an ``x-tablecast-after`` position in its
    metadata (as HTTP's header of that name)."""
    lagged = "max_lag" in request.DESCRIPTOR.fields_by_name and request.HasField("max_lag")
    params = {"max_lag": str(request.max_lag)} if lagged else {}
    return bound_of(params, metadata.get(AFTER_HEADER))


def _error_code(body: bytes) -> str | None:
    """The code of an HTTP error answer's JSON, None for a body that is not one."""
    try:
        return str(orjson.loads(body)["error"]["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


def _size(event: Any) -> int:
    return len(event) if isinstance(event, bytes) else 64


def _freshness(headers: list[tuple[str, str]]) -> dict[str, Any]:
    h = dict(headers)
    out: dict[str, Any] = {}
    if "x-tablecast-position" in h:
        out["position"] = h["x-tablecast-position"]
    if "x-tablecast-node" in h:
        out["node"] = h["x-tablecast-node"]
    if "x-tablecast-lag" in h:
        out["lag"] = int(h["x-tablecast-lag"])
    return out


def _abort(error: ApiError) -> NoReturn:
    raise GrpcError(
        STATUS.get(error.code, Status.INTERNAL), error.message, (("tablecast-error", error.code),)
    )


def _not_found(error: ApiError) -> pb.GetResponse:
    """A key read's error: an absent key is an answer (found false), the rest fail the call."""
    if error.code != "key_not_found":
        _abort(error)
    return pb.GetResponse(found=False, **_freshness(error.headers))


class Served:
    """A running gRPC server, and the task that keeps its health status the node's."""

    def __init__(self, server: Server, health: Health, ready: Callable[[], bool]) -> None:
        self.server = server
        self.health = health
        self._following = asyncio.get_running_loop().create_task(self._follow(ready))

    async def _follow(self, ready: Callable[[], bool]) -> None:
        """SERVING while the node is ready (as /readyz says), NOT_SERVING while not."""
        while True:
            status = SERVING if ready() else NOT_SERVING
            for name in HEALTH_NAMES:
                self.health.set(name, status)
            await asyncio.sleep(HEALTH_POLL_S)

    async def stop(self, grace: float | None) -> None:
        self._following.cancel()
        self.health.stopping()  # watchers see NOT_SERVING first
        await asyncio.sleep(0)
        await self.server.stop(grace)


def methods(app: NodeApp, health: Health) -> dict[str, Method]:
    """Every method the node serves: the tables, health and reflection."""
    return {
        **Tables(app).methods(),
        **health.methods(),
        **reflection.methods((SERVICE, HEALTH_SERVICE)),
    }


async def serve_grpc(
    app: NodeApp, host: str, port: int, tls: tuple[str, str] | None = None
) -> Served:
    """Start the gRPC server on this event loop, with server reflection (grpcurl, grpcui and
    Postman list and call the service without the proto file) and the standard health
    service (Kubernetes' gRPC probes); the caller stops it."""
    health = Health()
    server = Server(methods(app, health))
    await server.start(host, port, tls)
    app.metrics.register(server)  # type: ignore[arg-type]
    return Served(server, health, lambda: app.node.ready)


class TablesStub:
    """A client stub for ``tablecast.v1.Tables`` on a grpc.aio channel (tests, and users who
    do not generate their own from tables.proto)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        path = f"/{SERVICE}/"
        self.Get = channel.unary_unary(
            path + "Get", pb.GetRequest.SerializeToString, pb.GetResponse.FromString
        )
        self.BatchGet = channel.unary_unary(
            path + "BatchGet", pb.BatchGetRequest.SerializeToString, pb.BatchGetResponse.FromString
        )
        self.Range = channel.unary_unary(
            path + "Range", pb.RangeRequest.SerializeToString, pb.RangeResponse.FromString
        )
        self.Watch = channel.unary_stream(
            path + "Watch", pb.WatchRequest.SerializeToString, pb.WatchEvent.FromString
        )
