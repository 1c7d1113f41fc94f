"""Bearer JWTs on every ``/v1`` (and internal) request: HS256 with a shared secret, or a JWKS file.

A forwarded request carries the caller's ``Authorization`` header to the
owner, which checks it again. Verified tokens are remembered until they
expire, so a client reusing its token pays for one signature check, not one
per request.
"""

from __future__ import annotations

import time
from pathlib import Path

import jwt

from tablecast.server.errors import ApiError

MAX_REMEMBERED = 10_000


class Auth:
    def __init__(self, secret: str | None = None, jwks_file: str | Path | None = None) -> None:
        self.secret = secret
        self.jwks = jwt.PyJWKSet.from_json(Path(jwks_file).read_text()) if jwks_file else None
        self._verified: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.secret or self.jwks)

    def check(self, authorization: str | None) -> None:
        if not authorization or not authorization.startswith(("Bearer ", "bearer ")):
            raise ApiError(
                "unauthorized",
                "this API needs Authorization: Bearer <JWT>",
                [("www-authenticate", 'Bearer realm="tablecast"')],
            )
        token = authorization[7:].strip()
        expires = self._verified.get(token)
        if expires is not None and expires > time.time():
            return
        claims = self._verify(token)
        if len(self._verified) >= MAX_REMEMBERED:
            self._verified.clear()
        self._verified[token] = float(claims["exp"])

    def _verify(self, token: str) -> dict:  # type: ignore[type-arg]
        try:
            if self.secret:
                return jwt.decode(
                    token, self.secret, algorithms=["HS256"], options={"require": ["exp"]}
                )
            assert self.jwks is not None
            kid = jwt.get_unverified_header(token).get("kid")
            key = next((k for k in self.jwks.keys if k.key_id == kid), None)
            if key is None:
                raise jwt.InvalidTokenError(f"no key {kid!r} in the JWKS")
            return jwt.decode(
                token, key.key, algorithms=[key.algorithm_name], options={"require": ["exp"]}
            )
        except jwt.PyJWTError as e:
            raise ApiError(
                "unauthorized",
                f"invalid token: {e}",
                [("www-authenticate", 'Bearer error="invalid_token"')],
            ) from None
