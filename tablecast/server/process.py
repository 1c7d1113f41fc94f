"""One serving node as a process: the node's ingestion thread plus granian on its event loop."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

from granian.constants import Interfaces, SSLProtocols
from granian.server.embed import Server

from tablecast.cluster.node import Node, NodeConfig
from tablecast.server.app import HttpApp
from tablecast.server.auth import Auth

log = logging.getLogger(__name__)


async def serve_rsgi(app: Any, host: str, port: int, tls: tuple[str, str] | None = None) -> None:
    """Serve an RSGI app on this event loop until SIGINT/SIGTERM.

    The benchmarks serve their constant-body baseline through this same
    function, so "the same HTTP stack" means the same settings too.
    """
    # TLS 1.2 at least (granian's default is 1.3 only, which older Java clients lack)
    ssl_files = (
        {"ssl_cert": Path(tls[0]), "ssl_key": Path(tls[1]), "ssl_protocol_min": SSLProtocols.tls12}
        if tls
        else {}
    )
    server = Server(
        app,
        address=host,
        port=port,
        interface=Interfaces.RSGI,
        log_enabled=False,
        backlog=1024,
        **ssl_files,  # type: ignore[arg-type]
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.stop)
    await server.serve()


async def serve(
    config: NodeConfig, host: str, port: int, auth: Auth, tls: tuple[str, str] | None = None
) -> None:
    node = Node(config)
    node.start()
    scheme = "https" if tls else "http"
    log.info(
        "node %s serving app %r on %s://%s:%d", config.node_id, config.app_id, scheme, host, port
    )
    app = HttpApp(node, auth)
    try:
        await serve_rsgi(app, host, port, tls)
    finally:
        app.peers.close()
        node.stop()
        log.info("node %s stopped", config.node_id)


def run(
    config: NodeConfig,
    host: str,
    port: int,
    auth: Auth | None = None,
    tls: tuple[str, str] | None = None,
) -> None:
    import uvloop

    uvloop.run(serve(config, host, port, auth or Auth(), tls))
