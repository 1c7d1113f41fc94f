"""Identity-provider-ready JWT checks: audience, issuer, a JWKS served over HTTP with key
rotation, the refresh cooldown, and remembered tokens forgotten when their key leaves."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tablecast.server import auth as auth_module
from tablecast.server.auth import Auth
from tablecast.server.errors import ApiError

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
    """A JWKS endpoint on loopback whose key set the test can change."""

    def __init__(self) -> None:
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.fetches = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.fetches += 1
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
