"""Identity-provider-ready JWT checks: audience, issuer, a JWKS served over HTTP with key
rotation, the refresh cooldown, and remembered tokens forgotten when their key leaves; a
JWKS fetch that never holds up the event loop; made-up tokens rate limited on every route."""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import threading
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from time import perf_counter
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tablecast.cluster.node import Node, NodeConfig
from tablecast.grpc.service import TablesStub, serve_grpc
from tablecast.http.app import HttpApp
from tablecast.http.readers.key_reads import Answerer
from tablecast.kafka.broker import free_port
from tablecast.proto import tables_pb2 as pb
from tablecast.query import auth as auth_module
from tablecast.query.auth import Auth
from tablecast.query.errors import ApiError

SECRET = "unit-test-secret-0123456789abcdef0123"


def _hs(claims: dict[str, Any], secret: str = SECRET) -> str:
    return "Bearer " + jwt.encode({"exp": int(time.time() + 60), **claims}, secret, "HS256")


def test_audience_and_issuer_are_checked() -> None:
    a = Auth(SECRET, audience="tablecast", issuer="https://idp.example")
    claims = a.check(_hs({"sub": "u1", "aud": "tablecast", "iss": "https://idp.example"}))
    assert claims["sub"] == "u1"
    for bad in (
        {"sub": "u1", "aud": "other", "iss": "https://idp.example"},
        {"sub": "u1", "aud": "tablecast", "iss": "https://evil.example"},
        {"sub": "u1", "iss": "https://idp.example"},
    ):
        with pytest.raises(ApiError) as e:
            a.check(_hs(bad))
        assert e.value.status == 401


def test_a_token_with_an_audience_needs_one_configured() -> None:
    with pytest.raises(ApiError):
        Auth(SECRET).check(_hs({"sub": "u1", "aud": "tablecast"}))
    assert Auth(SECRET).check(_hs({"sub": "u1"}))["sub"] == "u1"


class _JwksServer:
    """A JWKS endpoint on loopback whose key set the test can change; it can answer late
    (`delay`), or take requests and never answer them (`silent`, until the test ends)."""

    def __init__(self) -> None:
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.fetches = 0
        self.connections = 0
        self.delay = 0.0
        self.silent = False
        self.released = threading.Event()
        #: keys it holds but does not serve yet (made ahead: making one takes a while)
        self.withheld: set[str] = set()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def setup(self) -> None:
                owner.connections += 1
                super().setup()

            def do_GET(self) -> None:
                owner.fetches += 1
                if owner.silent:
                    owner.released.wait()
                    return
                time.sleep(owner.delay)
                body = json.dumps({"keys": owner.jwks()}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, kid: str) -> None:
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self) -> list[dict[str, Any]]:
        out = []
        for kid, key in self.keys.items():
            if kid in self.withheld:
                continue
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
            out.append({**jwk, "kid": kid, "alg": "RS256", "use": "sig"})
        return out

    def token(self, kid: str, claims: dict[str, Any]) -> str:
        body = {"exp": int(time.time() + 60), **claims}
        return "Bearer " + jwt.encode(body, self.keys[kid], "RS256", headers={"kid": kid})


@pytest.fixture
def idp(monkeypatch: pytest.MonkeyPatch) -> Iterator[_JwksServer]:
    monkeypatch.setattr(auth_module, "JWKS_COOLDOWN_S", 0.5)
    s = _JwksServer()
    try:
        yield s
    finally:
        s.released.set()
        s.server.shutdown()
        s.server.server_close()


def test_jwks_url_with_key_rotation(idp: _JwksServer) -> None:
    idp.add("k1")
    a = Auth(jwks=idp.url, audience="tablecast")
    first = idp.token("k1", {"sub": "u1", "aud": "tablecast"})
    assert a.check(first)["sub"] == "u1"
    fetches = idp.fetches
    assert a.check(first)["sub"] == "u1"  # remembered: no fetch
    assert idp.fetches == fetches

    idp.add("k2")  # the provider rotates in a new key
    time.sleep(0.6)  # past the refresh cooldown
    assert a.check(idp.token("k2", {"sub": "u2", "aud": "tablecast"}))["sub"] == "u2"
    assert idp.fetches == fetches + 1

    del idp.keys["k1"]  # ... and retires the old one
    time.sleep(0.6)
    idp.add("k3")
    assert a.check(idp.token("k3", {"sub": "u3", "aud": "tablecast"}))["sub"] == "u3"
    with pytest.raises(ApiError):
        a.check(first)  # remembered, but its key is gone: forgotten, and refused


def test_unknown_key_ids_do_not_hammer_the_provider(idp: _JwksServer) -> None:
    idp.add("k1")
    a = Auth(jwks=idp.url)
    a.check(idp.token("k1", {"sub": "u1"}))
    fetches = idp.fetches
    forged = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for i in range(50):
        token = jwt.encode(
            {"sub": "x", "exp": int(time.time() + 60)}, forged, "RS256", headers={"kid": f"f{i}"}
        )
        with pytest.raises(ApiError):
            a.check("Bearer " + token)
    assert idp.fetches - fetches <= 2  # the cooldown, not one fetch per made-up key id


def test_unreachable_jwks_is_a_401_not_a_hang() -> None:
    a = Auth(jwks="http://127.0.0.1:9/jwks.json")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jwt.encode({"exp": int(time.time() + 60)}, key, "RS256", headers={"kid": "k"})
    started = time.monotonic()
    with pytest.raises(ApiError) as e:
        a.check("Bearer " + token)
    assert e.value.status == 401
    assert time.monotonic() - started < auth_module.JWKS_TIMEOUT_S + 1


# -- on a running event loop: a JWKS fetch in a worker thread, shared, with a cool-down ----


class _Scope:
    """What an HTTP engine hands :meth:`HttpApp.begin` of a GET (or a WebSocket upgrade)."""

    method = "GET"
    query_string = ""
    scheme = "http"
    http_version = "1.1"

    def __init__(
        self, path: str, token: str | None, client: str = "127.0.0.1:40000", proto: str = "http"
    ) -> None:
        self.path = path
        self.headers = {"authorization": token} if token else {}
        self.client = client
        self.proto = proto


class _Proto:
    """The answer an HTTP engine would send: its status and body."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.body = b""

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status, self.body = status, body

    def close(self, status: int) -> None:  # a WebSocket refused before its upgrade
        self.status = status


class _Ticker:
    """How long the event loop went without turning: a blocking call shows as a long gap."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        last = perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = perf_counter()
            self.longest, last = max(self.longest, now - last), now

    async def stop(self) -> float:
        await asyncio.sleep(0.02)  # one more turn, to see a gap that has just ended
        self._task.cancel()
        return self.longest


def _app(tmp_path: Path, auth: Auth, **options: Any) -> HttpApp:
    config = NodeConfig("unit", "127.0.0.1:9", "http://127.0.0.1:9", "node-1", tmp_path / "node")
    return HttpApp(Node(config), auth, **options)


def _begin(
    app: HttpApp, path: str, token: str | None, client: str = "127.0.0.1:40000"
) -> tuple[_Proto, Awaitable[None] | None]:
    proto = _Proto()
    return proto, app.begin(_Scope(path, token, client), proto)


async def _status(app: HttpApp, path: str, token: str | None, client: str = "127.0.0.1:1") -> int:
    proto, rest = _begin(app, path, token, client)
    if rest is not None:
        await asyncio.wait_for(rest, 5.0)
    assert proto.status is not None
    return proto.status


@functools.cache
def _forger() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _made_up(kid: str) -> str:
    """A token naming a key id the provider never had, signed by a key of its own."""
    body = {"sub": "x", "exp": int(time.time() + 60)}
    return "Bearer " + jwt.encode(body, _forger(), "RS256", headers={"kid": kid})


def test_a_jwks_fetch_that_hangs_holds_up_no_other_request(
    idp: _JwksServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider takes the fetch's connection and never answers: the token that needs the
    fetch waits for it (until the fetch timeout, then 401), and the loop answers the rest."""
    monkeypatch.setattr(auth_module, "JWKS_TIMEOUT_S", 1.0)
    idp.add("k1")
    app = _app(tmp_path, Auth(jwks=idp.url))
    known = idp.token("k1", {"sub": "known"})
    held = idp.token("k1", {"sub": "held"})  # not seen yet; its key is held
    unknown = _made_up("rotated-in")

    async def scenario() -> None:
        assert await _status(app, "/v1/tables", known) == 200
        await asyncio.sleep(0.6)  # past the cool-down after that fetch
        idp.silent = True
        connections = idp.connections
        ticker = _Ticker()
        started = perf_counter()
        waiting, rest = _begin(app, "/v1/tables", unknown)
        took = perf_counter() - started
        assert took < 0.2, f"the JWKS fetch held the event loop for {took:.2f} s"
        assert rest is not None and waiting.status is None
        task = asyncio.ensure_future(rest)
        for _ in range(80):  # the fetch's worker thread connects (later on a busy machine)
            await asyncio.sleep(0.01)
            if idp.connections > connections:
                break
        assert idp.connections == connections + 1 and not task.done()  # under way
        for path, token, status in (
            ("/healthz", None, 200),
            ("/v1/tables", known, 200),  # remembered
            ("/v1/tables", held, 200),
            ("/v1/tables", None, 401),
        ):
            proto, later = _begin(app, path, token)
            assert later is None and proto.status == status, path
        await asyncio.wait_for(task, 3.0)
        assert waiting.status == 401
        assert perf_counter() - started < auth_module.JWKS_TIMEOUT_S + 0.5
        assert await ticker.stop() < 0.25

    asyncio.run(scenario())


def test_after_a_failed_fetch_unknown_key_ids_are_refused_at_once(
    idp: _JwksServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth_module, "JWKS_TIMEOUT_S", 0.5)
    monkeypatch.setattr(auth_module, "JWKS_COOLDOWN_S", 1.5)
    idp.silent = True
    app = _app(tmp_path, Auth(jwks=idp.url))

    async def scenario() -> None:
        assert await _status(app, "/v1/tables", _made_up("a")) == 401  # the fetch timed out
        assert idp.connections == 1
        # within the cool-down: refused without a wait, the provider not asked again
        started = perf_counter()
        for kid in ("b", "c", "d"):
            proto, rest = _begin(app, "/v1/tables", _made_up(kid))
            assert rest is None and proto.status == 401
            assert b"unauthorized" in proto.body
        assert perf_counter() - started < 0.2
        assert idp.connections == 1
        # the cool-down over and the provider back: the key it rotated in is fetched once
        idp.silent = False
        idp.add("k2")
        await asyncio.sleep(1.6)
        assert await _status(app, "/v1/tables", idp.token("k2", {"sub": "u2"})) == 200
        assert idp.connections == 2

    asyncio.run(scenario())


def test_concurrent_unknown_key_ids_share_one_fetch(
    idp: _JwksServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth_module, "JWKS_TIMEOUT_S", 0.5)
    idp.silent = True
    app = _app(tmp_path, Auth(jwks=idp.url))

    async def scenario() -> None:
        begun = [_begin(app, "/v1/tables", _made_up(f"kid-{i}"), f"10.0.0.{i}:1") for i in range(5)]
        pending = [rest for _, rest in begun if rest is not None]
        await asyncio.wait_for(asyncio.gather(*pending), 3.0)
        assert idp.connections == 1
        assert [proto.status for proto, _ in begun] == [401] * 5
        assert len(pending) == 5  # each waited for the one fetch, none held the loop

    asyncio.run(scenario())


def test_key_rotation_is_fetched_off_the_loop(idp: _JwksServer, tmp_path: Path) -> None:
    idp.delay = 0.5  # a slow provider: its answer comes after a few turns of the loop
    for kid in ("k1", "k2", "k3"):
        idp.add(kid)
    idp.withheld = {"k2", "k3"}
    app = _app(tmp_path, Auth(jwks=idp.url, audience="tablecast"))
    first = idp.token("k1", {"sub": "u1", "aud": "tablecast"})
    # made before the loop runs: signing is the test's work, not the node's
    tokens = [
        idp.token("k2", {"sub": "u2", "aud": "tablecast"}),
        idp.token("k2", {"sub": "u3", "aud": "tablecast"}),
        _made_up("k9"),
    ]
    third = idp.token("k3", {"sub": "u4", "aud": "tablecast"})

    async def scenario() -> None:
        ticker = _Ticker()
        assert await _status(app, "/v1/tables", first) == 200
        assert await _status(app, "/v1/tables", first) == 200  # remembered: no fetch
        assert idp.connections == 1

        idp.withheld.discard("k2")  # the provider rotates in a new key
        await asyncio.sleep(0.6)  # past the cool-down
        begun = [_begin(app, "/v1/tables", token) for token in tokens]
        await asyncio.gather(*(rest for _, rest in begun if rest is not None))
        assert [proto.status for proto, _ in begun] == [200, 200, 401]
        assert idp.connections == 2  # one fetch for all three

        idp.withheld = {"k1"}  # ... and retires the old one, serving a third
        await asyncio.sleep(0.6)
        assert await _status(app, "/v1/tables", third) == 200
        assert idp.connections == 3
        assert await _status(app, "/v1/tables", first) == 401  # its key left the set
        assert await ticker.stop() < 0.25

    asyncio.run(scenario())


def test_a_read_process_hands_a_token_that_needs_a_fetch_to_the_node(
    idp: _JwksServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth_module, "JWKS_TIMEOUT_S", 1.0)
    idp.silent = True
    answerer = Answerer("node-1", 4096, tmp_path / "own", Auth(jwks=idp.url))
    head = f"GET /v1/tables/kv/keys/a HTTP/1.1\r\nhost: x\r\nauthorization: {_made_up('k')}"

    async def scenario() -> None:
        answerer.update({"slots": []})
        started = perf_counter()
        assert answerer.answer(head.encode(), "127.0.0.1:1") is None  # the node's to answer
        took = perf_counter() - started
        assert took < 0.2, f"the JWKS fetch held the read process for {took:.2f} s"
        await asyncio.sleep(0.1)
        assert idp.connections == 1  # its own fetch, for the tokens after this one

    try:
        asyncio.run(scenario())
    finally:
        answerer.close()


# -- a token not seen before is charged to the client's address on every route ------------

_FORGED = _hs({"sub": "x"}, secret="a-secret-the-node-does-not-have-0123456789")


@pytest.mark.parametrize(
    "path", ["/v1/tables", "/internal/tables/t/scan", "/ui/api/nodes", "/metrics", "/readyz"]
)
def test_made_up_tokens_are_rate_limited_on_every_route(tmp_path: Path, path: str) -> None:
    app = _app(tmp_path, Auth(SECRET), rate_limit=1.0, auth_metrics=True)

    async def scenario() -> list[int]:
        return [await _status(app, path, _FORGED) for _ in range(2)]

    assert asyncio.run(scenario()) == [401, 429]


def test_made_up_tokens_are_rate_limited_on_websocket_upgrades(tmp_path: Path) -> None:
    app = _app(tmp_path, Auth(SECRET), rate_limit=1.0)

    async def scenario() -> list[int | None]:
        statuses = []
        for _ in range(2):
            proto = _Proto()
            await app(_Scope("/v1/tables/t/watch", _FORGED, proto="ws"), proto)
            statuses.append(proto.status)
        return statuses

    assert asyncio.run(scenario()) == [401, 429]


async def _grpc_codes(app: HttpApp, tokens: list[str]) -> list[grpc.StatusCode]:
    """The status of a Get on a node that serves no table, per token."""
    port = free_port()
    server = await serve_grpc(app, "127.0.0.1", port)
    codes = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = TablesStub(channel)
            for token in tokens:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Get(
                        pb.GetRequest(table="t", key="k"), metadata=(("authorization", token),)
                    )
                codes.append(e.value.code())
    finally:
        await server.stop(None)
    return codes


def test_made_up_tokens_are_rate_limited_over_grpc(tmp_path: Path) -> None:
    app = _app(tmp_path, Auth(SECRET), rate_limit=1.0)
    codes = asyncio.run(_grpc_codes(app, [_FORGED, _FORGED]))
    assert codes == [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED]


def test_grpc_waits_for_the_key_a_new_token_needs(idp: _JwksServer, tmp_path: Path) -> None:
    idp.delay = 0.3
    idp.add("k1")
    app = _app(tmp_path, Auth(jwks=idp.url))
    codes = asyncio.run(_grpc_codes(app, [idp.token("k1", {"sub": "u1"}), _made_up("k9")]))
    # the first verified once fetched (what follows is the router's: this node serves no
    # table); the second refused
    assert codes[0] != grpc.StatusCode.UNAUTHENTICATED
    assert codes[1] == grpc.StatusCode.UNAUTHENTICATED
    assert idp.connections == 1
