"""HTTP baselines: a constant JSON body on candidate stacks (``python -m bench.baselines STACK PORT``).

``granian-rsgi`` is the node's granian stack (same serve function, same settings);
``loop-kept`` the default engine's (same serve function) answering every GET with one
kept answer, which leaves out only the lookup among many; the others are the
alternatives they were chosen over.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

BODY = (
    b'{"key":"k0012345","value":{"symbol":"k0012345","price":123.45,"exchange":"NASDAQ",'
    b'"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"},"partition":3,"offset":1234,"timestamp":1700000000000}'
)
HEADERS = [("content-type", "application/json")]


class ConstantRSGI:
    async def __call__(self, scope: Any, proto: Any) -> None:
        proto.response_bytes(200, HEADERS, BODY)


class OneKept:
    """The loop engine's app with one kept answer for every plain GET (and the constant
    body for any other request)."""

    def __init__(self) -> None:
        from tablecast.query.answer_bytes import kept_alive

        wire = kept_alive(200, HEADERS, BODY)
        self.entry = SimpleNamespace(wire=wire, whole=lambda: wire)
        self.requests: set[bytes] = set()

    def kept(self, path: str, headers: Any) -> Any:
        return self.entry

    def kept_request(self, request: bytes) -> Any:
        return self.entry if request in self.requests else None

    def keep_request(self, request: bytes, entry: Any) -> None:
        self.requests.add(request)

    def forward_plan(self, path: str, headers: Any) -> None:
        return None

    def begin(self, scope: Any, proto: Any) -> None:
        proto.response_bytes(200, HEADERS, BODY)


async def constant_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": BODY})


def main() -> None:
    stack, port = sys.argv[1], int(sys.argv[2])
    if stack == "granian-rsgi":
        import uvloop

        from tablecast.node.serve import serve_rsgi

        uvloop.run(serve_rsgi(ConstantRSGI(), "127.0.0.1", port))
    elif stack == "loop-kept":
        import uvloop

        from tablecast.node.serve import serve_loop

        uvloop.run(serve_loop(OneKept(), "127.0.0.1", port))  # type: ignore[arg-type]
    elif stack == "granian-asgi":
        import asyncio

        import uvloop
        from granian.constants import Interfaces
        from granian.server.embed import Server

        async def go() -> None:
            await Server(
                constant_asgi,
                address="127.0.0.1",
                port=port,
                interface=Interfaces.ASGINL,
                log_enabled=False,
                backlog=1024,
            ).serve()

        uvloop.install()
        asyncio.run(go())
    elif stack == "uvicorn":
        import uvicorn

        uvicorn.run(
            constant_asgi,
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http="httptools",
            log_level="warning",
            access_log=False,
            lifespan="off",
            backlog=1024,
        )
    else:
        raise SystemExit(f"unknown stack {stack}")


if __name__ == "__main__":
    main()
