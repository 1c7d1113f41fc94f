"""Who asks, and whether they may ask now: the two steps every front end takes before a read
(HTTP, the watch streams, the console's API and gRPC alike).

First the caller: none with auth off; a token verified before, at once (one dict
lookup); a token not seen before after its signature check, which the client's address
pays a rate-limit token for first, so a flood of made-up tokens is cut short on every
front end; or, when the token names a signing key not fetched yet, what waits for the
fetch. Then the limit: one token of the caller's (its subject, else its address). A read
process answers only what it can without waiting, and so keeps its own variant of the
first step (:mod:`tablecast.http.readers.key_reads`).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeGuard

from tablecast.query.auth import Auth, Caller, KeysNeeded
from tablecast.query.ratelimit import RateLimit
from tablecast.query.request import subject_of


def fetching(found: Caller | Awaitable[Caller] | None) -> TypeGuard[Awaitable[Caller]]:
    """Whether :meth:`Gate.caller` gave what waits for a signing key being fetched (rather
    than the caller, or None with auth off)."""
    return found is not None and not isinstance(found, Caller)


class Gate:
    def __init__(self, auth: Auth, rate: RateLimit | None) -> None:
        self.auth = auth
        self.rate = rate

    def caller(
        self, authorization: str | None, scope: Any, charge: bool = True
    ) -> Caller | Awaitable[Caller] | None:
        """The request's caller, or what waits for the JWKS fetch its token needs (401 for a
        bad token). `charge` False: a signed hop, whose client was charged where it came in."""
        if not self.auth.enabled:
            return None
        caller = self.auth.remembered(authorization)
        if caller is not None:
            return caller
        if charge and self.rate is not None:
            self.rate.take(subject_of(None, scope))
        try:
            return self.auth.caller(authorization)
        except KeysNeeded:
            return self.auth.caller_async(authorization)

    def limit(self, caller: Caller | None, scope: Any) -> None:
        """Spend one of the caller's tokens (429 with none left)."""
        if self.rate is not None:
            self.rate.take(subject_of(caller, scope))

    async def admit(self, authorization: str | None, scope: Any) -> Caller | None:
        """Both steps, waiting for a JWKS fetch if the token needs one (a stream's start, a
        gRPC call)."""
        found = self.caller(authorization, scope)
        caller = await found if fetching(found) else found
        self.limit(caller, scope)
        return caller
