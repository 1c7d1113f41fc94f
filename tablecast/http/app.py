"""The node's HTTP API (docs/http-api.md) as an RSGI application, served by the loop engine
(:mod:`tablecast.http.http1`, the default) or by granian.

RSGI is granian's native interface and measured fastest there (BENCHMARKS.md);
the loop engine calls the same app through the part of RSGI it uses. There is
no framework: :meth:`HttpApp.__call__` checks auth (and rate
limits), matches the route (:mod:`tablecast.http.routes`), calls its endpoint, and
turns :class:`ApiError` into the error JSON. No client input reaches the
client as a stack trace.

What the caller may read (``--auth-policy``) travels with the request as its
verified token's grants; the router applies them wherever a store is read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any
from urllib.parse import parse_qsl, quote

import orjson
from prometheus_client import CollectorRegistry, generate_latest

from tablecast.cluster.membership import Member
from tablecast.cluster.node import Node
from tablecast.cluster.signing import Signer
from tablecast.console.api import Console
from tablecast.http import decode, openapi
from tablecast.http.decode import NO_PARAMS, HttpRequest
from tablecast.http.routes import ROUTES, Route, Routes
from tablecast.live import snapshot, sse, websocket
from tablecast.live.service import Live
from tablecast.query import node_status
from tablecast.query.auth import Auth, Caller
from tablecast.query.coalesce import (
    ANSWERS_PATH,
    Sink,
    decode_targets,
    encode_answers,
    encode_wires,
    header_pairs,
)
from tablecast.query.consistency import AFTER_HEADER
from tablecast.query.cursor import Cursors
from tablecast.query.errors import ApiError
from tablecast.query.gate import Gate, fetching
from tablecast.query.kept_answers import JSON, Answers, Entry
from tablecast.query.local import Answer, Found
from tablecast.query.peer_calls import plain_key_read
from tablecast.query.peer_pool import SIGNATURE, PeerHosts, PeerPool, received_parts
from tablecast.query.queries import KeyQuery, Query
from tablecast.query.ratelimit import (
    RateLimit,
    Refusals,
    SharedTokenBuckets,
    TokenBuckets,
    WaitSlots,
)
from tablecast.query.reads import DEFAULT_WAITS_PER_CALLER, Router
from tablecast.query.request import (
    HOP,
    ON_BEHALF,
    Request,
    Scope,
    client_host,
)
from tablecast.query.short_path import Plan
from tablecast.query.stats import HttpStats

log = logging.getLogger(__name__)

PROMETHEUS = ("content-type", "text/plain; version=0.0.4; charset=utf-8")
MAX_BODY = 1 << 20
#: a request body must arrive within this long (granian's own timeout covers headers only)
BODY_TIMEOUT_S = 10.0

Handler = Callable[[HttpRequest, Any], Answer | Awaitable[Answer]]
#: a route's path parameters, decoded
Args = dict[str, str]
Reply = Answer | Awaitable[Answer]
#: what a read route asks, from its path parameters and request (tablecast.http.decode)
Decoder = Callable[[Args, HttpRequest], Query]


class HttpApp:
    def __init__(
        self,
        node: Node,
        auth: Auth | None = None,
        rate_limit: float | None = None,
        waits_per_caller: int = DEFAULT_WAITS_PER_CALLER,
        auth_metrics: bool = False,
        rate_table: Path | None = None,
        forwarding: str = "short",
        port: int | None = None,
    ) -> None:
        """`rate_table`: the file the callers' buckets are kept in, shared with the node's
        read processes (None: kept in this process); `forwarding`: one of
        :data:`~tablecast.query.forwarding.FORWARDING`; `port`: the port it is served on."""
        self.node = node
        self.auth = auth or Auth()
        self._auth_on = self.auth.enabled
        self.signer = Signer(node.config.cluster_secret)
        context = (
            ssl.create_default_context(cafile=node.config.tls_ca) if node.config.tls_ca else None
        )
        self.peers = PeerPool(ssl_context=context, signer=self.signer)
        self._peer_hosts = PeerHosts(lambda: (m.url for m in node.view.members.values()))
        self._peer_checks = self.signer.enabled
        self.rate: RateLimit | None = None
        if rate_limit:
            self.rate = (
                SharedTokenBuckets(rate_table, rate_limit, create=True)
                if rate_table is not None
                else TokenBuckets(rate_limit)
            )
        self.gate = Gate(self.auth, self.rate)
        self.waits = WaitSlots(waits_per_caller)
        #: /metrics needs a token, and /readyz without one says only whether the node is ready
        self._auth_metrics = auth_metrics and self._auth_on
        # a token's grants or a caller's rate limit make answers differ per caller: not kept
        # (nor, as it is for the same reads, the short path of forwarded ones)
        kept = node.config.answers_bytes
        self._answers = (
            Answers(node, kept) if kept > 0 and not self._auth_on and self.rate is None else None
        )
        self.router = Router(
            node,
            Cursors(node.config.app_id.encode()),
            self.peers,
            self.waits,
            self._answers,
            forwarding,
        )
        self._forwards = self.router.forwards
        self.live = Live(node, self.router, port)
        self.stats = HttpStats()
        self.console = Console(node, self.stats, self.peers, self._answers)
        # each part of the node reports its own figures (a prometheus-client collector)
        self.metrics = CollectorRegistry(auto_describe=False)
        coalescer = self.router.rpc.coalescer
        for part in (
            self.stats,
            Refusals(self.rate, self.waits),
            node.ingest_metrics,
            self.live.hub,
            *((coalescer,) if coalescer is not None else ()),
        ):
            self.metrics.register(part)  # type: ignore[arg-type]
        self.routes = Routes(ROUTES)
        self._endpoints = {
            route: getattr(self, "_" + route.endpoint)
            if route.read is None
            else partial(self._read, route.read)
            for route in ROUTES
        }
        self._openapi_json = orjson.dumps(openapi.document(ROUTES))

    async def __call__(self, scope: Any, proto: Any) -> None:
        if not isinstance(scope, Scope):  # granian's, its path decoded
            scope = Scope.of_decoded(scope)
        if scope.proto != "http":
            if scope.proto == "ws":
                await self._websocket(scope, proto)
            return
        rest = self.begin(scope, proto)
        if isinstance(rest, asyncio.Future):  # its callback answers, a failure too
            await asyncio.wait((rest,))
        elif rest is not None:
            await rest

    def begin(self, scope: Any, proto: Any, started: float = 0.0) -> Awaitable[None] | None:
        """Answer an HTTP request now if it can be (None), or return what answers it later.

        Most reads are answered without a task of their own; the HTTP server
        awaits the rest (a read forwarded to a peer, a body to read, a wait, a
        token whose signing key is being fetched). `started`: when a request
        begun again after such a wait came in.
        """
        if scope.method == "GET" and not scope.query_string:
            kept = self.kept(scope.path, scope.headers)
            if kept is not None:
                proto.response_bytes(200, kept.headers, kept.body)
                return None
        started = started or perf_counter()
        route = "unmatched"
        try:
            path = scope.path
            headers = scope.headers
            query = scope.query_string
            from_peer = self._peer_checks and (path.startswith("/internal/") or HOP in headers)
            if from_peer and scope.method != "POST":  # a POST is checked with its body, once read
                self._check_peer(scope.method, path, query, b"", headers)
            if ON_BEHALF in headers:
                scope = self._caller_scope(scope, from_peer)
            # a signed hop was counted where the caller came in (a forged one is refused)
            limited = self.rate is not None and not from_peer and path.startswith("/v1/")
            caller = None
            authorization = None
            # a peer's POST is verified once its body's signature is (_signed_caller): a
            # forged one gets no token checked, so it costs no signature check uncharged
            if (
                self._auth_on
                and path.startswith(("/v1/", "/internal/", "/ui/api/"))
                and not (from_peer and scope.method == "POST")
            ):
                authorization = headers.get("authorization") or _query_token(path, query)
                found = self.gate.caller(authorization, scope, not from_peer)
                if fetching(found):
                    return self._begin_verified(found, scope, proto, started)
                caller = found
            if limited:
                self.gate.limit(caller, scope)
            key = None if query else plain_key_read(scope.method, path)
            if key is not None:  # the hot path: GET one key, no query string
                route = "key"
                request = Request(headers, caller, scope)
                query = KeyQuery(key[0], key[1], decode.header_bound(headers))
                answer = self.router.key(query, request, path)
            else:
                found, handler = self.match(scope.method, path)
                route = found.name
                if route == "watch":
                    # a stream: answered by the watch itself (it parses its own query, which
                    # may name many keys); an error before the stream starts is raised there
                    # the token goes on with its snapshot's peer calls, also when it came as
                    # ?access_token=
                    watch = HttpRequest(NO_PARAMS, query, headers, caller, scope, authorization)
                    return self._stream(handler(watch, proto), scope, proto, started)
                request = HttpRequest(_params(query), query, headers, caller, scope)
                if request.params:
                    self.routes.check(found, request.params)
                answer = handler(request, proto)
            if isinstance(answer, asyncio.Future):  # a forwarded read (Rpc.forward): no task
                answer.add_done_callback(
                    lambda f: self._respond(route, _outcome(f, scope), proto, started)
                )
                return answer
            if not isinstance(answer, tuple):
                return self._later(answer, route, scope, proto, started)
        except Exception as e:  # no client input may produce a stack trace or a hung request
            answer = _failed(e, scope.method, scope.path)
        self._respond(route, answer, proto, started)
        return None

    def _caller_scope(self, scope: Scope, signed: bool) -> Scope:
        """A forwarded request's scope as its caller's (rate limits and waits count the
        client that came to the forwarding node), when the hop is believed: signed with
        the cluster secret, or without one, sent from a node's address. Any other request
        is counted by its own address, whatever it says."""
        behalf = scope.headers.get(ON_BEHALF)
        if behalf is None or HOP not in scope.headers or len(behalf) > 45:
            return scope
        if not signed and (
            self._peer_checks or not self._peer_hosts.holds(client_host(scope.client))
        ):
            return scope
        try:
            host = str(ipaddress.ip_address(behalf))
        except ValueError:
            return scope
        return scope.on_behalf(host)

    async def _begin_verified(
        self, pending: Awaitable[Caller], scope: Any, proto: Any, started: float
    ) -> None:
        """Begin again a request whose token waited for the JWKS: remembered now, or refused."""
        try:
            await pending
        except Exception as e:  # as in begin(): every failure is an answer
            self._respond("unmatched", _failed(e, scope.method, scope.path), proto, started)
            return
        rest = self.begin(scope, proto, started)
        if isinstance(rest, asyncio.Future):
            await asyncio.wait((rest,))
        elif rest is not None:
            await rest

    async def _later(
        self, pending: Awaitable[Answer], route: str, scope: Any, proto: Any, started: float
    ) -> None:
        try:
            answer = await pending
        except Exception as e:  # as in begin(): every failure is an answer
            answer = _failed(e, scope.method, scope.path)
        self._respond(route, answer, proto, started)

    async def _stream(self, watch: Awaitable[None], scope: Any, proto: Any, started: float) -> None:
        try:
            await watch
        except Exception as e:  # before the stream started: an answer like any other
            self._respond("watch", _failed(e, scope.method, scope.path), proto, started)
            return
        self.stats.record("watch", 200, perf_counter() - started)

    def _respond(self, route: str, answer: Answer, proto: Any, started: float) -> None:
        code, body, extra = answer
        if isinstance(extra, bytes):  # a peer's answer, its headers as their wire lines
            write_lines = getattr(proto, "response_lines", None)  # the loop engine's
            if write_lines is not None:
                write_lines(code, extra, body)
            else:
                proto.response_bytes(code, header_pairs(extra), body)
        elif route in OWN_TYPE and code < 400:  # the console's files say their own type
            proto.response_bytes(code, extra, body)
        else:
            proto.response_bytes(code, [PROMETHEUS if route == "metrics" else JSON, *extra], body)
        self.stats.record(route, code, perf_counter() - started)

    def kept(self, path: str, headers: Any) -> Entry | None:
        """The kept answer of a GET of `path` without a query string, if one is kept and
        may be given as it is (counted as answered)."""
        answers = self._answers
        # a read after a position may have to wait; a hop's signature is checked
        if answers is None or AFTER_HEADER in headers or (self._peer_checks and HOP in headers):
            return None
        entry = answers.get(path)
        if entry is not None:
            self.stats.kept += 1
        return entry

    def kept_request(self, request: bytes) -> Entry | None:
        """The kept answer a request of these very bytes got from :meth:`kept`, if it may
        be given again as it is (counted as answered)."""
        answers = self._answers
        if answers is None:
            return None
        entry = answers.get_request(request)
        if entry is not None:
            self.stats.kept += 1
        return entry

    def keep_request(self, request: bytes, entry: Entry) -> None:
        """`request`, the whole of a plain GET that :meth:`kept` answered with `entry`
        (with keep-alive, no body and no ``expect``), gets the same answer while it is kept."""
        if self._answers is not None:
            self._answers.keep_request(request, entry)

    def forward_plan(self, path: str, headers: Any) -> Plan | None:
        """How a GET of `path` without a query string goes on the short path of plain reads
        of a peer's partition (:mod:`tablecast.query.short_path`); None when :meth:`begin`
        takes the request. The same request (its bytes) may be sent on it again."""
        forwards = self._forwards
        # a token goes on with the read (its owner may check tokens where this node does not)
        if (
            forwards is None
            or AFTER_HEADER in headers
            or HOP in headers
            or "authorization" in headers
        ):
            return None
        return forwards.plan(path)

    def forward(self, plan: Plan, sink: Sink) -> Member | None:
        """Send the read `plan` is for, its answer to `sink`: the peer it went to; None,
        and nothing sent, when :meth:`begin` must take the request after all."""
        assert self._forwards is not None  # a plan comes from them
        return self._forwards.send(plan, sink)

    def forwarded(self, status: int, started: float) -> None:
        """Count a short-path forward its peer answered (the sink wrote the answer)."""
        self.stats.record("key", status, perf_counter() - started)

    def forward_failed(
        self, scope: Any, proto: Any, failed: Member, started: float
    ) -> Awaitable[None] | None:
        """The router's way, for a short-path forward `failed` did not answer (unreachable,
        or 503)."""
        try:
            found = plain_key_read(scope.method, scope.path)
            assert found is not None  # the short path takes only these
            req = Request(scope.headers, None, scope)
            answer = self.router.forward_failed(KeyQuery.latest(*found), req, failed)
            if not isinstance(answer, tuple):
                return self._later(answer, "key", scope, proto, started)
        except Exception as e:  # as in begin(): every failure is an answer
            answer = _failed(e, scope.method, scope.path)
        self._respond("key", answer, proto, started)
        return None

    def match(self, method: str, path: str) -> tuple[Route, Handler]:
        """The route of `path` (:mod:`tablecast.http.routes`) and its handler(request, proto)."""
        route, args = self.routes.match(method, path)
        return route, partial(self._endpoints[route], args)

    # -- the endpoints: endpoint(path parameters, request, proto) --------------------------
    def _read(self, decoder: Decoder, args: Args, q: HttpRequest, proto: Any) -> Reply:
        """A read route: the read its request asks, answered by the router (rows as data
        encoded as the HTTP API answers them)."""
        answer = self.router.read(decoder(args, q), q)
        return answer if isinstance(answer, tuple) else _encoded(answer)

    def _batch_get(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return self._read_many(args["table"], q, proto)

    def _watch(self, args: Args, q: HttpRequest, proto: Any) -> Any:
        return sse.stream(self.live, args["table"], q.query, q, proto)

    def _tables(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return 200, node_status.tables(self.node, q.grants), []

    def _cluster(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return 200, node_status.cluster(self.node, q.grants), []

    def _health(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return node_status.health(self.node, q.headers)

    def _openapi(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return 200, self._openapi_json, []

    def _internal_snapshot(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return snapshot.answer_peer(self.router, decode.snapshot_share(args, q), q)

    def _internal_batch(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        if not self._peer_checks:  # an unsigned batch that came whole is answered at once
            body = _arrived_body(q, proto)
            if body is not None:
                return self._batch_of(q, q.scope.path, body)
        return self._batch(q, proto, q.scope.path)

    def _ui_index(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return self.console.page("index.html", q)

    def _ui_file(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return self.console.page(args["name"], q)

    def _console_node(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return self.console.this_node()

    def _console_nodes(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return self.console.nodes(q)

    def _console_pipeline(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return self.console.pipeline(q)

    def _console_dead_letters(self, args: Args, q: HttpRequest, proto: Any) -> Reply:
        return self.console.dead_letters(q)

    async def _websocket(self, scope: Any, proto: Any) -> None:
        """A WebSocket: only the watch route speaks it; auth as for HTTP (or ?access_token=)."""
        path, query, headers = scope.path, scope.query_string, scope.headers
        try:
            route, args = self.routes.match("GET", path)
        except ApiError:
            route = None
        if route is None or route.name != "watch":
            proto.close(404)  # before the upgrade: a plain 404
            return
        try:
            authorization = headers.get("authorization") or _query_token(path, query)
            caller = await self.gate.admit(authorization, scope)
        except ApiError as e:
            proto.close(e.status)
            return
        started = perf_counter()
        try:
            request = Request(headers, caller, scope, authorization)
            await websocket.serve(self.live, args["table"], query, request, proto)
        except Exception:  # a broken socket must not reach the HTTP engine as a stack trace
            log.exception("websocket watch failed")
        self.stats.record("watch_websocket", 101, perf_counter() - started)

    def _metrics(self, args: Args, req: HttpRequest, proto: Any) -> Reply:
        if self._auth_metrics:
            return self._verified(req.headers.get("authorization"), req.scope, self._exposition)
        return self._exposition()

    def _exposition(self) -> Answer:
        return 200, generate_latest(self.metrics), []

    def _readiness(self, args: Args, req: HttpRequest, proto: Any) -> Reply:
        if self._auth_metrics:
            authorization = req.headers.get("authorization")
            if authorization is None:
                # probes (a kubelet) cannot send an expiring token: the status code is all
                # they need, and the body (partitions, lags, errors) is for token holders
                code, _ = node_status.readiness(self.node)
                return code, b'{"ready":true}' if code == 200 else b'{"ready":false}', []
            return self._verified(authorization, req.scope, self._ready)
        return self._ready()

    def _ready(self) -> Answer:
        code, body = node_status.readiness(self.node)
        return code, body, []

    def _verified(
        self, authorization: str | None, scope: Any, answer: Callable[[], Answer]
    ) -> Answer | Awaitable[Answer]:
        """`answer()` once the request's token is verified (a status route's own check)."""
        found = self.gate.caller(authorization, scope)
        if fetching(found):
            return _once_verified(found, answer)
        return answer()

    def _check_peer(self, method: str, path: str, query: str, body: bytes, headers: Any) -> None:
        """Internal routes and forwarded requests answer only peers that sign with the secret."""
        if not self.signer.verify(
            headers.get(SIGNATURE), *received_parts(method, path, query, body)
        ):
            raise ApiError(
                "forbidden", "internal calls and forwarded requests need a peer's signature"
            )

    async def _signed_caller(self, req: Request) -> None:
        """The token of a peer's POST, verified now that its signature is."""
        if not self._auth_on:
            return
        found = self.gate.caller(req.headers.get("authorization"), req.scope, charge=False)
        req.caller = await found if fetching(found) else found

    async def _read_many(self, table: str, req: HttpRequest, proto: Any) -> Answer:
        body = await _read_body(req, proto)
        if self._peer_checks and req.forwarded:
            self._check_peer(
                "POST", f"/v1/tables/{quote(table, safe='')}/keys:batchGet", req.query, body,
                req.headers,
            )  # fmt: skip
            await self._signed_caller(req)
        self.router.table(table, req)  # an unknown or forbidden table before a bad body
        return await _encoded(self.router.read(decode.batch_query(table, body, req), req))

    async def _batch(self, req: HttpRequest, proto: Any, path: str) -> Answer:
        """Reads a peer forwarded together (:mod:`tablecast.query.coalesce`), once their
        body has arrived and, with a cluster secret, its signature is checked."""
        body = await _read_body(req, proto)
        if self._peer_checks:
            self._check_peer("POST", path, req.query, body, req.headers)
            await self._signed_caller(req)
        answer = self._batch_of(req, path, body)
        return answer if isinstance(answer, tuple) else await answer

    def _batch_of(self, req: HttpRequest, path: str, body: bytes) -> Reply:
        """The answer to a batch of reads: each answered as if it had come alone with the
        batch's headers, framed in one answer (as whole responses on ANSWERS_PATH; on
        BATCH_PATH, the version before's, headers apart). A coroutine only when one of its
        reads awaits (none of a plain key read here)."""
        if not req.forwarded:
            raise ApiError("bad_request", f"{path} takes reads a peer forwards")
        started = perf_counter()
        answers: list[Any] = []
        routes: list[str] = []
        targets = decode_targets(body)
        kept = self._kept(targets, req)
        if kept is not None and None not in kept and path == ANSWERS_PATH:
            self.stats.kept += len(kept)  # counted as kept answers given alone are
            return 200, encode_wires([e.whole() for e in kept]), [BINARY]  # type: ignore[union-attr]
        for i, target in enumerate(targets):
            route = "key"
            try:
                entry = None if kept is None else kept[i]
                if entry is not None:
                    answer: Any = entry
                else:
                    if self.rate is not None and not self._peer_checks:  # a lone unsigned hop's
                        self.rate.take(req.subject)
                    route, answer = self._hop(target, req)
            except Exception as e:
                answer = _failed(e, "GET", target)
            routes.append(route)
            answers.append(answer)
        if any(not isinstance(a, tuple | Entry) for a in answers):
            return self._batch_awaited(path, targets, routes, answers, started)
        return self._framed(path, routes, answers, started)

    async def _batch_awaited(
        self, path: str, targets: list[str], routes: list[str], answers: list[Any], started: float
    ) -> Answer:
        """A batch of which some reads await: all of them at once, then framed."""
        pending = [i for i, a in enumerate(answers) if not isinstance(a, tuple | Entry)]
        done = await asyncio.gather(*(answers[i] for i in pending), return_exceptions=True)
        for i, result in zip(pending, done, strict=True):
            is_error = isinstance(result, Exception)
            answers[i] = _failed(result, "GET", targets[i]) if is_error else result
        return self._framed(path, routes, answers, started)

    def _framed(self, path: str, routes: list[str], answers: list[Any], started: float) -> Answer:
        took = perf_counter() - started
        stats = self.stats
        for route, answer in zip(routes, answers, strict=True):
            if isinstance(answer, Entry):
                stats.kept += 1  # counted as a kept answer given alone is
            else:
                stats.record(route, answer[0], took)
        if path == ANSWERS_PATH:
            wires = [a.whole() if isinstance(a, Entry) else a for a in answers]
            return 200, encode_wires(wires), [BINARY]
        made = [(200, a.body, a.headers) if isinstance(a, Entry) else a for a in answers]
        return 200, encode_answers(made), [BINARY]

    def _kept(self, targets: list[str], req: Request) -> list[Entry | None] | None:
        """The kept answer of each of a batch's reads (None where there is none); None when
        no answers are kept, or the batch's reads may have to wait for a position (a kept
        answer is as fresh as its replica now)."""
        answers = self._answers
        if answers is None or AFTER_HEADER in req.headers:
            return None
        return answers.get_many(targets)

    def _hop(self, target: str, req: Request) -> tuple[str, Answer | Awaitable[Answer]]:
        """One read of a batch without a kept answer (:meth:`_kept`): the route's name and
        its answer, as :meth:`__call__` gives it a GET with the batch's headers (the path as
        sent, as a server receives it)."""
        path, _, query = target.partition("?")
        key = None if query else plain_key_read("GET", path)
        if key is not None:
            request = Request(req.headers, req.caller, req.scope)
            query = KeyQuery(key[0], key[1], decode.header_bound(req.headers))
            return "key", self.router.key(query, request, path)
        found, handler = self.match("GET", path)
        if found.name == "watch":  # a stream, not a read with one answer
            raise ApiError("bad_request", "a batch reads no watch")
        request = HttpRequest(_params(query), query, req.headers, req.caller, req.scope)
        if request.params:
            self.routes.check(found, request.params)
        return found.name, handler(request, None)


async def _once_verified(pending: Awaitable[Caller], answer: Callable[[], Answer]) -> Answer:
    await pending
    return answer()


def _outcome(done: asyncio.Future[Answer], scope: Any) -> Answer:
    """The answer a finished future holds, or the one its failure makes."""
    if done.cancelled():  # the node is stopping
        return _failed(ApiError("internal", "the node stopped this read"), scope.method, scope.path)
    e = done.exception()
    return done.result() if e is None else _failed(e, scope.method, scope.path)  # type: ignore[arg-type]


def _failed(e: Exception, method: str, target: str) -> Answer:
    """The answer to a request that raised `e`: the error JSON, a 500 for a bug."""
    if isinstance(e, ApiError):
        return e.status, e.body(), e.headers
    log.error("unhandled error on %s %s", method, target, exc_info=e)
    return 500, ApiError("internal", "internal error").body(), []


BINARY = ("content-type", "application/octet-stream")
#: routes whose answers carry their own content type
OWN_TYPE = ("ui", "internal_batch")


async def _encoded(read: Awaitable[Found | Answer]) -> Answer:
    """A read of many rows as the HTTP API answers it (a redirect comes as it is)."""
    found = await read
    return found.answer() if isinstance(found, Found) else found


def _too_large() -> ApiError:
    return ApiError("payload_too_large", f"the body is larger than {MAX_BODY} bytes")


def _arrived_body(req: Request, proto: Any) -> bytes | None:
    """The request body if all of it came with its head (the loop engine knows; most do),
    None if it is still to be read; refused with 413 once it is over MAX_BODY."""
    declared = req.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise _too_large()
    arrived = getattr(proto, "arrived_body", None)
    body = None if arrived is None else arrived()
    if body is not None and len(body) > MAX_BODY:
        raise _too_large()
    return body


async def _read_body(req: Request, proto: Any) -> bytes:
    """The request body, refused with 413 once it is over MAX_BODY (never read whole), and
    with 408 if it does not arrive within BODY_TIMEOUT_S (a slow sender holds no reader)."""
    body = _arrived_body(req, proto)
    if body is not None:
        return body
    chunks, size = [], 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in proto:
                size += len(chunk)
                if size > MAX_BODY:
                    raise _too_large()
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            "request_timeout", f"the body did not arrive within {BODY_TIMEOUT_S:g} s"
        ) from None
    return b"".join(chunks)


#: what a bearer token may hold (RFC 6750's b64token, "=" only at its end)
_B64TOKEN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/")


def _query_token(path: str, query: str) -> str | None:
    """``?access_token=`` of a watch (RFC 6750 §2.3): browsers' EventSource and WebSocket
    cannot send an Authorization header. 401 for a value that is no bearer token: it goes on
    in the Authorization header of peer calls, where a CR, LF or non-Latin-1 character would
    break the request's head (a JWT verifier may not catch them: base64 decoders skip them)."""
    if not query or "access_token=" not in query or not path.endswith("/watch"):
        return None
    for name, value in parse_qsl(query, max_num_fields=2048):
        if name == "access_token":
            token = value.rstrip("=")
            if not token or not _B64TOKEN.issuperset(token):
                raise ApiError(
                    "unauthorized",
                    "?access_token= holds characters a bearer token cannot have",
                    [("www-authenticate", 'Bearer error="invalid_token"')],
                )
            return "Bearer " + value
    return None


def _params(query: str) -> dict[str, str]:
    if not query:
        return {}
    try:
        return dict(parse_qsl(query, keep_blank_values=True, max_num_fields=64))
    except ValueError as e:
        raise ApiError("bad_request", f"bad query string: {e}") from None
