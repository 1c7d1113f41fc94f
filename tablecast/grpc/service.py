"""gRPC: service ``tablecast.v1.Tables`` (tablecast/proto/tables.proto) beside HTTP.

Each call is decoded into the read it asks (:mod:`tablecast.query.queries`) and
answered by the router as an HTTP request for that read is (forwarding to the
owner included); Watch by the watch service. The caller's bearer token comes from
the ``authorization`` metadata; the rate limit and the auth policy apply exactly
as for HTTP. The server runs
on the node's event loop (grpc.aio), so a Watch is one more sink of the hub:
its events are serialized once per change and shared like the SSE ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc
import orjson
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from tablecast.cluster.node import Node as ClusterNode
from tablecast.contract.table_info import TableInfo
from tablecast.live.events import ERROR, READY, Change, Encoder
from tablecast.live.service import Live
from tablecast.live.sinks import QueueSink
from tablecast.proto import tables_pb2 as pb
from tablecast.query.consistency import bound_of
from tablecast.query.errors import ApiError
from tablecast.query.fanout import limit_param
from tablecast.query.gate import Gate
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


SERVICE = "tablecast.v1.Tables"
HealthServicer = health_aio.HealthServicer
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
#: the names grpc.health.v1 answers for: the whole server ("") and the service
HEALTH_NAMES = ("", SERVICE)
#: how often the health status is brought in line with the node's readiness
HEALTH_POLL_S = 0.5
#: the HTTP API's error codes as gRPC statuses
STATUS = {
    "bad_request": grpc.StatusCode.INVALID_ARGUMENT,
    "unauthorized": grpc.StatusCode.UNAUTHENTICATED,
    "forbidden": grpc.StatusCode.PERMISSION_DENIED,
    "table_not_found": grpc.StatusCode.NOT_FOUND,
    "key_not_found": grpc.StatusCode.NOT_FOUND,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "rate_limited": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "payload_too_large": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "partition_unavailable": grpc.StatusCode.UNAVAILABLE,
    "shutdown": grpc.StatusCode.UNAVAILABLE,
    "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
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


def row_of(info: TableInfo, raw: bytes, partition: int, record: Record) -> pb.Row:
    """A key's record as the ``Row`` message: key and value in their JSON text (SerdeError if
    the stored value cannot be read as its format)."""
    value = info.value_serde
    if value.format == "json":  # kept as written, given compact as a forwarded answer's is
        text = orjson.dumps(orjson.loads(record.value)).decode()
    else:
        text = orjson.dumps(value.to_json(record.value)).decode()
    return pb.Row(
        key=key_text(info.key_serde.to_json(raw)),
        value=text,
        partition=partition,
        offset=record.offset,
        timestamp=record.timestamp,
    )


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

    def __init__(self, peer: str) -> None:
        # "ipv4:1.2.3.4:5678" or "ipv6:[::1]:5678"
        self.client = peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer


class Tables:
    """The handlers; each decodes its call into a read and the router's answer into its
    message."""

    def __init__(self, app: NodeApp) -> None:
        self.app = app
        self.router = app.router
        self.live = app.live

    async def _request(self, context: grpc.aio.ServicerContext) -> Request:
        """The caller of a call, as the router takes it (its token admitted by the gate)."""
        metadata = {k: v for k, v in (context.invocation_metadata() or ())}
        scope = _Scope(context.peer() or "")
        caller = None
        try:
            if HOP in metadata or SIGNATURE in metadata:
                # nodes forward to each other over HTTP, signed: a gRPC call always comes
                # from a client, which the router must never take for a hop
                raise ApiError(
                    "forbidden",
                    f"{HOP} and {SIGNATURE} are for the nodes' own calls over HTTP; "
                    "a gRPC call is never forwarded",
                )
            caller = await self.app.gate.admit(metadata.get("authorization"), scope)
        except ApiError as e:
            await _abort(context, e)
        return Request({}, "", metadata, caller, scope)

    async def _answer(self, context: grpc.aio.ServicerContext, answer: Any) -> tuple[dict, list]:  # type: ignore[type-arg]
        """The router's answer as JSON and headers; an error answer aborts the call."""
        try:
            if not isinstance(answer, tuple):
                answer = await answer
        except ApiError as e:
            await _abort(context, e)
        status, body, headers = answer
        doc = orjson.loads(body)
        if status >= 400:
            err = doc.get("error", {})
            code = err.get("code", "internal")
            await _abort(
                context, ApiError(code if code in STATUS else "bad_request", err.get("message", ""))
            )
        return doc, headers

    async def get(
        self, request: pb.GetRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetResponse:
        req = await self._request(context)
        try:
            query = KeyQuery.latest(request.table, request.key, bound_of(_max_lag(request), None))
            answer = self.router.key(query, req, encode=row_of)
            if not isinstance(answer, tuple):
                answer = await answer
        except ApiError as e:
            if e.code != "key_not_found":
                await _abort(context, e)
            return pb.GetResponse(found=False, **_freshness(e.headers))
        if isinstance(answer[1], pb.Row):  # read here: the message made of the record
            return pb.GetResponse(found=True, row=answer[1], **_freshness(answer[2]))
        # a peer's answer, which comes as its HTTP body
        if answer[0] == 404 and _error_code(answer[1]) == "key_not_found":
            return pb.GetResponse(found=False, **_freshness(answer[2]))
        doc, headers = await self._answer(context, answer)
        return pb.GetResponse(found=True, row=row_of_entry(doc), **_freshness(headers))

    async def _found(self, context: grpc.aio.ServicerContext, read: Awaitable[Any]) -> Found:
        """A read of many rows, answered as data (an error aborts the call)."""
        try:
            found = await read
        except ApiError as e:
            await _abort(context, e)
        if not isinstance(found, Found):  # a redirect: asked for by a parameter gRPC lacks
            await _abort(context, ApiError("bad_request", "a gRPC read is never redirected"))
        return found

    async def batch_get(
        self, request: pb.BatchGetRequest, context: grpc.aio.ServicerContext
    ) -> pb.BatchGetResponse:
        req = await self._request(context)
        try:
            info, _ = self.router.table(request.table, req)
            local = self.router.local
            keys = [info.key_serde.to_json(local.key_bytes(info, k)) for k in request.keys]
            query = BatchQuery.of_keys(request.table, keys, bound_of(_max_lag(request), None))
        except ApiError as e:
            await _abort(context, e)
        found = await self._found(context, self.router.fan.batch_get(query, req))
        out = pb.BatchGetResponse()
        for item in found.doc["results"]:
            result = out.results.add(key=key_text(item["key"]), found=item["found"])
            if item["found"]:
                result.value = json_text(item["value"])
            if item.get("forbidden"):
                result.forbidden = True
        return out

    async def range(
        self, request: pb.RangeRequest, context: grpc.aio.ServicerContext
    ) -> pb.RangeResponse:
        req = await self._request(context)
        try:
            query = RangeQuery.between(
                request.table,
                _optional(request, "start"),
                _optional(request, "end"),
                prefix=_optional(request, "prefix"),
                limit=limit_param({"limit": str(request.limit)} if request.limit else {}),
                cursor=request.cursor or None,
            )
        except ApiError as e:
            await _abort(context, e)
        found = await self._found(context, self.router.fan.range(query, req))
        out = pb.RangeResponse(next_cursor=found.doc["next_cursor"] or "")
        for item in found.doc["items"]:
            out.items.add(key=key_text(item["key"]), value=json_text(item["value"]))
        return out

    async def watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        req = await self._request(context)
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
            await _abort(context, e)
        try:
            sink = QueueSink(self.live.hub.touched, size=_size)
            watch = self.live.begin(plan, GRPC, sink)
            try:
                async for event in sink.drain():
                    if isinstance(event, tuple):  # the watch ended with an error
                        _, code, message = event
                        await _abort(
                            context,
                            ApiError(code if code in STATUS else "partition_unavailable", message),
                        )
                    yield event
                if sink.reason is not None:
                    await _abort(
                        context,
                        ApiError("partition_unavailable", f"the watch ended: {sink.reason}"),
                    )
            finally:
                sink.close()
                self.live.end(watch)
        finally:
            plan.release()


def _optional(request: Any, field: str) -> str | None:
    return getattr(request, field) if request.HasField(field) else None


def _max_lag(request: Any) -> dict[str, str]:
    return {"max_lag": str(request.max_lag)} if request.HasField("max_lag") else {}


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


async def _abort(context: grpc.aio.ServicerContext, error: ApiError) -> Any:
    status = STATUS.get(error.code, grpc.StatusCode.INTERNAL)
    context.set_trailing_metadata((("tablecast-error", error.code),))
    await context.abort(status, error.message)


def handler(app: NodeApp) -> grpc.GenericRpcHandler:
    t = Tables(app)
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Get": grpc.unary_unary_rpc_method_handler(
                t.get, pb.GetRequest.FromString, pb.GetResponse.SerializeToString
            ),
            "BatchGet": grpc.unary_unary_rpc_method_handler(
                t.batch_get, pb.BatchGetRequest.FromString, pb.BatchGetResponse.SerializeToString
            ),
            "Range": grpc.unary_unary_rpc_method_handler(
                t.range, pb.RangeRequest.FromString, pb.RangeResponse.SerializeToString
            ),
            # events come serialized (once per change, shared by its watchers): passed through
            "Watch": grpc.unary_stream_rpc_method_handler(
                t.watch, pb.WatchRequest.FromString, lambda b: b
            ),
        },
    )


class Served:
    """A running gRPC server, and the task that keeps its health status the node's."""

    def __init__(
        self, server: grpc.aio.Server, health: HealthServicer, ready: Callable[[], bool]
    ) -> None:
        self.server = server
        self.health = health
        self._following = asyncio.get_running_loop().create_task(self._follow(ready))

    async def _follow(self, ready: Callable[[], bool]) -> None:
        """SERVING while the node is ready (as /readyz says), NOT_SERVING while not."""
        last = None
        while True:
            now = ready()
            if now != last:
                status = SERVING if now else NOT_SERVING
                for name in HEALTH_NAMES:
                    await self.health.set(name, status)
                last = now
            await asyncio.sleep(HEALTH_POLL_S)

    async def stop(self, grace: float) -> None:
        self._following.cancel()
        await self.health.enter_graceful_shutdown()  # watchers see NOT_SERVING first
        await self.server.stop(grace)


async def serve_grpc(
    app: NodeApp, host: str, port: int, tls: tuple[str, str] | None = None
) -> Served:
    """Start the gRPC server on this event loop, with server reflection (grpcurl, grpcui and
    Postman list and call the service without the proto file) and the standard health
    service (Kubernetes' gRPC probes); the caller stops it."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler(app),))
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (
            SERVICE,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    address = f"{host}:{port}"
    if tls is not None:
        with open(tls[0], "rb") as cert, open(tls[1], "rb") as key:
            creds = grpc.ssl_server_credentials([(key.read(), cert.read())])
        server.add_secure_port(address, creds)
    else:
        server.add_insecure_port(address)
    await server.start()
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
