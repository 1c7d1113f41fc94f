"""One serving node as a process: the node's ingestion thread plus granian on its event loop."""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from granian.constants import Interfaces, SSLProtocols
from granian.http import HTTP1Settings
from granian.server.embed import Server

from tablecast.cluster.node import Node, NodeConfig
from tablecast.server.app import HttpApp
from tablecast.server.auth import Auth
from tablecast.server.router import DEFAULT_WAITS_PER_CALLER

log = logging.getLogger(__name__)

#: a request's headers must arrive within this long; granian runs the same timer on an idle
#: keep-alive connection, so this is also how long one may sit idle (peers reuse theirs
#: only well within it: see peers.MAX_IDLE_S)
HEADER_TIMEOUT_MS = 10_000
#: granian serves at most this many connections at once and leaves the rest in the
#: listen backlog: a client holding many slow or idle connections must not reach it
MAX_CONNECTIONS = 16_384


def connection_cap() -> int:
    """How many connections to serve at once, the soft file limit raised to the hard one first.

    granian's default (the backlog, 1024) is reached by one client holding 1024
    idle connections, after which nobody is served (measured). Open files bound
    it: RocksDB, Kafka and peers need the other half.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = 65_536 if hard == resource.RLIM_INFINITY else min(hard, 65_536)
    if soft < ceiling:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
            soft = ceiling
        except (ValueError, OSError):
            pass  # keep the soft limit we were given
    return max(128, min(MAX_CONNECTIONS, soft // 2))


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
        backpressure=connection_cap(),
        http1_settings=HTTP1Settings(header_read_timeout=HEADER_TIMEOUT_MS),
        **ssl_files,  # type: ignore[arg-type]
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.stop)
    await server.serve()


async def serve(
    config: NodeConfig,
    host: str,
    port: int,
    auth: Auth,
    tls: tuple[str, str] | None = None,
    limits: Limits | None = None,
) -> None:
    node = Node(config)
    node.start()
    scheme = "https" if tls else "http"
    log.info(
        "node %s serving app %r on %s://%s:%d", config.node_id, config.app_id, scheme, host, port
    )
    limits = limits or Limits()
    app = HttpApp(node, auth, limits.rate, limits.waits_per_caller, limits.auth_metrics)
    try:
        await serve_rsgi(app, host, port, tls)
    finally:
        app.console.close()
        app.peers.close()
        node.stop()
        log.info("node %s stopped", config.node_id)


@dataclass(frozen=True)
class Limits:
    """Limits per caller and on the status routes (--rate-limit, --max-waits, --auth-metrics)."""

    #: requests per second per caller (None: no limit)
    rate: float | None = None
    waits_per_caller: int = DEFAULT_WAITS_PER_CALLER
    #: /metrics needs a token; /readyz without one answers only its status
    auth_metrics: bool = False


def run(
    config: NodeConfig,
    host: str,
    port: int,
    auth: Auth | None = None,
    tls: tuple[str, str] | None = None,
    limits: Limits | None = None,
) -> None:
    import uvloop

    uvloop.run(serve(config, host, port, auth or Auth(), tls, limits))
