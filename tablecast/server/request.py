"""What the read routes need of an HTTP request: its parameters and headers, the
verified caller, the read options parsed once, and the headers a hop onward carries."""

from __future__ import annotations

from typing import Any

from tablecast.kafka.catalog import TableInfo
from tablecast.server.auth import Caller
from tablecast.server.consistency import AFTER_HEADER, NO_OPTIONS, ReadOptions, read_options
from tablecast.server.policy import Grants

#: marks a request one node sent another (answered where it lands, never sent on)
HOP = "x-tablecast-hop"


class Request:
    """What handlers need of an HTTP request."""

    __slots__ = ("_options", "authorization", "caller", "headers", "params", "query", "scope")

    def __init__(
        self,
        params: dict[str, str],
        query: str,
        headers: Any,
        caller: Caller | None = None,
        scope: Any = None,
        authorization: str | None = None,
    ) -> None:
        self.params = params
        self.query = query
        self.headers = headers
        #: the verified token (None when auth is off)
        self.caller = caller
        #: the server's scope of the request (its client address)
        self.scope = scope
        #: the bearer token when it came otherwise than as a header (a watch's ?access_token=)
        self.authorization = authorization
        self._options: ReadOptions | None = None

    def options(self, info: TableInfo) -> ReadOptions:
        """The request's read options (parsed once; none at all costs one header lookup)."""
        opts = self._options
        if opts is None:
            if not self.params and self.headers.get(AFTER_HEADER) is None:
                opts = NO_OPTIONS
            else:
                opts = read_options(self.params, self.headers, info)
            self._options = opts
        return opts

    @property
    def forwarded(self) -> bool:
        return HOP in self.headers

    @property
    def grants(self) -> Grants | None:
        """What the caller may read; None when everything (no policy)."""
        caller = self.caller
        return None if caller is None else caller.grants

    @property
    def subject(self) -> str:
        """Who limits count against: the token's subject, else the client's address."""
        return subject_of(self.caller, self.scope)

    def onward_headers(self) -> list[tuple[str, str]]:
        headers = [(HOP, "1")]
        auth = self.headers.get("authorization") or self.authorization
        if auth:
            headers.append(("authorization", auth))
        after = self.headers.get(AFTER_HEADER)
        if after:
            headers.append((AFTER_HEADER, after))
        return headers


def subject_of(caller: Caller | None, scope: Any) -> str:
    return caller_key(caller, getattr(scope, "client", None) or "")


def caller_key(caller: Caller | None, client: str) -> str:
    """Who a request counts against in rate limits and waits: the token's subject, else
    the client's address ("host:port") without the port."""
    if caller is not None and caller.subject is not None:
        return "sub:" + caller.subject
    return "addr:" + client.rsplit(":", 1)[0]
