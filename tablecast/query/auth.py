"""Bearer JWTs on every ``/v1`` (and internal) request: HS256 with a shared secret, or a JWKS.

The JWKS is a file or an ``https://``/``http://`` URL (an identity provider's
``jwks_uri``): fetched with a timeout, cached, and fetched again when a token
names a key id it does not hold (key rotation) — at most once per
``JWKS_COOLDOWN_S`` after the last fetch ended, fetched or failed, so a flood of
made-up key ids cannot hammer the provider. A fetch runs in a worker thread,
never on the event loop: :meth:`Auth.caller` raises :class:`KeysNeeded` for a
token that must wait for it, and :meth:`Auth.caller_async` waits (at most
``JWKS_TIMEOUT_S``); concurrent tokens share the one fetch under way, and every
other request goes on meanwhile. A set older than ``JWKS_LIFESPAN_S`` still
verifies the keys it holds while a fresh one is fetched.
Tokens from a real IdP carry ``aud`` and ``iss``: ``--auth-audience`` and
``--auth-issuer`` say which to accept (a token with an ``aud`` is refused
when no audience is configured, as PyJWT does).

A forwarded request carries the caller's ``Authorization`` header to the
owner, which checks it again. Verified tokens are remembered until they
expire, so a client reusing its token pays for one signature check, not one
per request; a remembered token whose signing key has left the JWKS is
forgotten at once. With a policy (``--auth-policy``) the token's grants are
compiled at that same moment and remembered with it, so a request with a
known token costs one dict lookup for both.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from tablecast.query.errors import ApiError
from tablecast.query.policy import Grants, Policy

MAX_REMEMBERED = 10_000
JWKS_TIMEOUT_S = 5.0
JWKS_COOLDOWN_S = 5.0
JWKS_LIFESPAN_S = 300.0


@dataclass(frozen=True)
class Caller:
    """A verified token: its claims, who it is for rate limits, and (with a policy) its grants."""

    expires: float
    kid: str | None
    claims: dict[str, Any]
    #: the `sub` claim when it is a string (rate limits and waits count per subject)
    subject: str | None
    #: None without a policy: the token may read everything
    grants: Grants | None


class Auth:
    def __init__(
        self,
        secret: str | None = None,
        jwks: str | Path | None = None,
        audience: str | None = None,
        issuer: str | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.secret = secret
        self.audience = audience
        self.issuer = issuer
        self.policy = policy
        self._keys = _Jwks(str(jwks)) if jwks else None
        self._verified: dict[str, Caller] = {}

    def settings(self) -> dict[str, str | None]:
        """What builds the same Auth in another process (a node's read processes)."""
        return {
            "auth_secret": self.secret,
            "auth_jwks": self._keys.source if self._keys is not None else None,
            "auth_audience": self.audience,
            "auth_issuer": self.issuer,
            "auth_policy": self.policy.source if self.policy is not None else None,
        }

    @property
    def enabled(self) -> bool:
        return bool(self.secret or self._keys)

    def check(self, authorization: str | None) -> dict[str, Any]:
        """The verified claims of the request's bearer token; 401 without a valid one."""
        return self.caller(authorization).claims

    def remembered(self, authorization: str | None) -> Caller | None:
        """The request's token if it was verified before and still holds (no signature check).

        Remembered by the whole header value, as clients send it again byte for byte: the
        hot path is one dict lookup and a clock read, no slicing or case folding."""
        if authorization is None:
            return None
        known = self._verified.get(authorization)
        if (
            known is not None
            and known.expires > time.time()
            and (self._keys is None or self._keys.holds(known.kid))
        ):
            return known
        return None

    def caller(self, authorization: str | None, may_fetch: bool = True) -> Caller:
        """The request's verified token; 401 without a valid one.

        Never blocks an event loop running in this thread: a token whose signing key is not
        fetched yet raises :class:`KeysNeeded` once the fetch is under way (without a
        running loop, as in a script, the JWKS is fetched here). `may_fetch` False: such a
        token is refused instead."""
        if not authorization or not authorization.startswith(("Bearer ", "bearer ")):
            raise ApiError(
                "unauthorized",
                "this API needs Authorization: Bearer <JWT>",
                [("www-authenticate", 'Bearer realm="tablecast"')],
            )
        known = self.remembered(authorization)
        if known is not None:
            return known
        token = authorization[7:].strip()
        claims, kid = self._verify(token, may_fetch)
        if len(self._verified) >= MAX_REMEMBERED:
            self._verified.clear()
        sub = claims.get("sub")
        grants = self.policy.grants(claims) if self.policy is not None else None
        known = self._verified[authorization] = Caller(
            float(claims["exp"]), kid, claims, sub if isinstance(sub, str) else None, grants
        )
        return known

    async def caller_async(self, authorization: str | None) -> Caller:
        """:meth:`caller`, waiting (without blocking the loop) for a JWKS fetch the token
        needs, which concurrent callers share: at most ``JWKS_TIMEOUT_S``, then 401."""
        try:
            return self.caller(authorization)
        except KeysNeeded as e:
            await e.wait()
        # the fetch ended or timed out: a key still missing is refused, not fetched again
        return self.caller(authorization, may_fetch=False)

    def _verify(self, token: str, may_fetch: bool) -> tuple[dict[str, Any], str | None]:
        options: dict[str, Any] = {"require": ["exp"]}
        checks: dict[str, Any] = {"audience": self.audience, "issuer": self.issuer}
        try:
            if self.secret:
                claims = jwt.decode(
                    token, self.secret, algorithms=["HS256"], options=options, **checks
                )
                return claims, None
            assert self._keys is not None
            kid = jwt.get_unverified_header(token).get("kid")
            key = self._keys.key(kid, may_fetch)
            claims = jwt.decode(
                token, key.key, algorithms=[key.algorithm_name], options=options, **checks
            )
            return claims, kid
        except jwt.PyJWTError as e:
            raise ApiError(
                "unauthorized",
                f"invalid token: {e}",
                [("www-authenticate", 'Bearer error="invalid_token"')],
            ) from None


class KeysNeeded(ApiError):
    """The token names a key not fetched yet and a fetch of the JWKS is under way: await
    :meth:`wait`, then verify the token again. Left unhandled it is a 401, like any token
    that cannot be checked."""

    def __init__(self, fetch: asyncio.Future[None], deadline: float) -> None:
        super().__init__(
            "unauthorized",
            "the token's signing key is not fetched yet",
            [("www-authenticate", 'Bearer error="invalid_token"')],
        )
        self.fetch = fetch
        #: time.monotonic() when waiting for the fetch stops
        self.deadline = deadline

    async def wait(self) -> None:
        """Until the fetch ends or its time is up (then the fetch goes on alone)."""
        remaining = self.deadline - time.monotonic()
        if remaining > 0:
            await asyncio.wait((self.fetch,), timeout=remaining)


class _Jwks:
    """The signing keys of a JWKS file or URL, by key id."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._client: jwt.PyJWKClient | None = None
        self._by_kid: dict[str | None, jwt.PyJWK] = {}
        #: time.monotonic() of the last fetch that got a set, and of the last one to end
        self._fetched = self._ended = float("-inf")
        self._failure: str | None = None
        #: the fetch under way (one at a time), and when waiting for it stops
        self._pending: asyncio.Future[None] | None = None
        self._deadline = 0.0
        # the fetch's worker thread and the loop both start and end fetches
        self._lock = threading.Lock()
        if source.startswith(("https://", "http://")):
            self._client = jwt.PyJWKClient(source, cache_jwk_set=False, timeout=JWKS_TIMEOUT_S)
        else:
            for k in jwt.PyJWKSet.from_json(Path(source).read_text()).keys:
                self._by_kid.setdefault(k.key_id, k)
        self._kids: frozenset[str | None] = frozenset(self._by_kid)

    def holds(self, kid: str | None) -> bool:
        """Whether the key `kid` is still in the set as last fetched."""
        return kid in self._kids

    def key(self, kid: str | None, may_fetch: bool = True) -> jwt.PyJWK:
        found = self._by_kid.get(kid)
        if self._client is None:
            if found is None:
                raise jwt.InvalidTokenError(f"no key {kid!r} in the JWKS")
            return found
        if kid is None:
            raise jwt.InvalidTokenError("the token names no key id (kid)")
        now = time.monotonic()
        if found is not None and now - self._fetched < JWKS_LIFESPAN_S:
            return found
        if not (may_fetch and self._may_fetch(now)):
            if found is not None:
                return found
            raise jwt.InvalidTokenError(self._missing(kid))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop in this thread to stall: fetched right here
            self._download()
            return self.key(kid, may_fetch=False)
        pending = self._start(loop, now)
        if found is not None:  # an expired set: its key serves while a fresh set comes
            return found
        raise KeysNeeded(pending, self._deadline)

    def _may_fetch(self, now: float) -> bool:
        """Whether a token missing its key may wait for a fetch: the one under way until its
        time is up, else a new one once the cool-down after the last has passed."""
        if self._pending is not None:
            return now < self._deadline
        return now - self._ended >= JWKS_COOLDOWN_S

    def _missing(self, kid: str) -> str:
        if self._pending is not None:
            return f"the JWKS did not come within {JWKS_TIMEOUT_S:g} s"
        if self._failure is not None:
            return f"the JWKS could not be fetched: {self._failure}"
        return f"no key {kid!r} in the JWKS"

    def _start(self, loop: asyncio.AbstractEventLoop, now: float) -> asyncio.Future[None]:
        """The fetch under way, started in a worker thread if there is none."""
        with self._lock:
            if self._pending is None:
                self._deadline = now + JWKS_TIMEOUT_S
                self._pending = loop.run_in_executor(None, self._download)
            return self._pending

    def _download(self) -> None:
        """Fetch the set and take it (in a worker thread); a failure is kept as its reason."""
        assert self._client is not None
        by_kid: dict[str | None, jwt.PyJWK] | None = None
        failure = None
        try:
            keys = jwt.PyJWKSet.from_dict(self._client.fetch_data()).keys
        except Exception as e:  # whatever went wrong, the cool-down holds off the next try
            failure = str(e) or type(e).__name__
        else:
            by_kid = {}
            for k in keys:  # the signing keys, as PyJWKClient picks them
                if k.key_id and k.public_key_use in ("sig", None):
                    by_kid.setdefault(k.key_id, k)
        with self._lock:
            now = time.monotonic()
            if by_kid is not None:
                self._by_kid, self._kids, self._fetched = by_kid, frozenset(by_kid), now
            self._failure = failure
            self._ended = now
            self._pending = None
