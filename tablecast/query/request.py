"""What the read routes need of an HTTP request: its parameters and headers, the
verified caller, the read options parsed once, and the headers a hop onward carries."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

from tablecast.query.auth import Caller
from tablecast.query.consistency import AFTER_HEADER
from tablecast.query.policy import Grants

#: marks a request one node sent another (answered where it lands, never sent on)
HOP = "x-tablecast-hop"
#: on a hop, the host of the client it came from (when no token subject names the caller):
#: rate limits and waits count the caller, not the node that forwarded it
ON_BEHALF = "x-tablecast-client"


class Scope:
    """A request as the node's routes see it, whichever HTTP engine parsed it.

    `path` keeps the client's percent-encoding: routes split it on "/" and then decode
    each part (:func:`path_segment`), so a key's ``%2F`` is part of the key, never a
    separator that could make it name another route.
    """

    __slots__ = ("client", "headers", "method", "path", "query_string", "scheme")
    proto = "http"
    http_version = "1.1"

    def __init__(
        self, method: str, path: str, query: str, headers: Any, client: str, scheme: str
    ) -> None:
        self.method, self.path, self.query_string = method, path, query
        self.headers, self.client, self.scheme = headers, client, scheme

    @classmethod
    def of_decoded(cls, scope: Any) -> Scope:
        """The scope of an engine that hands over the path decoded (granian's RSGI): its
        path encoded again. What the decoding lost stays lost: a "/" the client sent as
        ``%2F`` is a separator there (``?key=`` carries any key on every engine)."""
        kind = WebSocketScope if scope.proto == "ws" else cls
        path = scope.path
        if not _PLAIN_PATH(path):  # most paths need no quoting, and the check is cheaper
            path = quote(path, safe=_SAFE_IN_PATH)
        return kind(
            scope.method, path, scope.query_string, scope.headers, scope.client, scope.scheme
        )

    def on_behalf(self, host: str) -> Scope:
        """This request counted as from `host` (a hop's client), not from its sender."""
        # no port: callers are counted by host (caller_key)
        return type(self)(
            self.method, self.path, self.query_string, self.headers, f"{host}:0", self.scheme
        )


class WebSocketScope(Scope):
    __slots__ = ()
    proto = "ws"


#: what a path may hold unencoded (RFC 3986's pchar less "%", and "/")
_SAFE_IN_PATH = "/:@!$&'()*+,;=-._~"
_PLAIN_PATH = re.compile(r"[A-Za-z0-9/:@!$&'()*+,;=._~-]*").fullmatch


def path_segment(text: str) -> str:
    """One part of a request's path, percent-decoded (undecodable bytes replaced)."""
    return unquote(text, errors="replace") if "%" in text else text


class Request:
    """Who asks a read and how it came, as every front end gives it to the read core: the
    caller, the client's address, and the request's headers (gRPC's metadata), which say
    whether it is a peer's hop and carry what goes on with it to a peer. How a front end
    spells the read itself is its own (:mod:`tablecast.http.decode`, the gRPC messages)."""

    __slots__ = ("authorization", "caller", "headers", "scope")

    def __init__(
        self,
        headers: Any,
        caller: Caller | None = None,
        scope: Any = None,
        authorization: str | None = None,
    ) -> None:
        self.headers = headers
        #: the verified token (None when auth is off)
        self.caller = caller
        #: the server's scope of the request (its client address)
        self.scope = scope
        #: the bearer token when it came otherwise than as a header (a watch's ?access_token=)
        self.authorization = authorization

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
        caller = self.caller
        if caller is None or caller.subject is None:
            client = getattr(self.scope, "client", None)
            if client:
                headers.append((ON_BEHALF, client_host(client)))
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
    return "addr:" + client_host(client)


def client_host(client: str) -> str:
    """A client's address ("host:port") without the port."""
    return client.rsplit(":", 1)[0]
