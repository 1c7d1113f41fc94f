"""Bearer JWTs on every ``/v1`` (and internal) request: HS256 with a shared secret, or a JWKS.

The JWKS is a file or an ``https://``/``http://`` URL (an identity provider's
``jwks_uri``): fetched with a timeout, cached, and fetched again when a token
names a key id it does not hold (key rotation) — at most once per
``JWKS_COOLDOWN_S``, so a flood of made-up key ids cannot hammer the provider.
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

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from tablecast.server.errors import ApiError
from tablecast.server.policy import Grants, Policy

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

    def caller(self, authorization: str | None) -> Caller:
        """The request's verified token; 401 without a valid one."""
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
        claims, kid = self._verify(token)
        if len(self._verified) >= MAX_REMEMBERED:
            self._verified.clear()
        sub = claims.get("sub")
        grants = self.policy.grants(claims) if self.policy is not None else None
        known = self._verified[authorization] = Caller(
            float(claims["exp"]), kid, claims, sub if isinstance(sub, str) else None, grants
        )
        return known

    def _verify(self, token: str) -> tuple[dict[str, Any], str | None]:
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
            key = self._keys.key(kid)
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


class _Jwks:
    """The signing keys of a JWKS file or URL, by key id."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._client: jwt.PyJWKClient | None = None
        if source.startswith(("https://", "http://")):
            self._client = jwt.PyJWKClient(
                source,
                lifespan=JWKS_LIFESPAN_S,
                timeout=JWKS_TIMEOUT_S,
                cooldown_duration=JWKS_COOLDOWN_S,
            )
            self._kids: frozenset[str | None] = frozenset()
        else:
            self._set = jwt.PyJWKSet.from_json(Path(source).read_text())
            self._kids = frozenset(k.key_id for k in self._set.keys)

    def holds(self, kid: str | None) -> bool:
        """Whether the key `kid` is still in the set as last fetched."""
        return kid in self._kids

    def key(self, kid: str | None) -> jwt.PyJWK:
        if self._client is None:
            found = next((k for k in self._set.keys if k.key_id == kid), None)
            if found is None:
                raise jwt.InvalidTokenError(f"no key {kid!r} in the JWKS")
            return found
        try:
            # fetches the set when it is cold, expired, or lacks `kid` (within the cooldown)
            found = self._client.get_signing_key(kid) if kid else None
            keys = self._client.get_jwk_set().keys
        except jwt.PyJWKClientError as e:
            raise jwt.InvalidTokenError(str(e)) from None
        self._kids = frozenset(k.key_id for k in keys)
        if found is None:
            raise jwt.InvalidTokenError("the token names no key id (kid)")
        return found
