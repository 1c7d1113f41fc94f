"""One serving node as a process: the node's ingestion thread plus its HTTP server (the loop
engine, or granian) on its event loop."""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tablecast.cluster.node import Node, NodeConfig
from tablecast.http.app import HttpApp
from tablecast.http.http1 import LISTEN_BACKLOG, LoopServer
from tablecast.http.listen import connection_cap, tls_context
from tablecast.node import gc
from tablecast.query.auth import Auth
from tablecast.query.ratelimit import SharedTokenBuckets
from tablecast.query.reads import DEFAULT_WAITS_PER_CALLER

if TYPE_CHECKING:
    from tablecast.node.read_processes import ReadProcesses

log = logging.getLogger(__name__)

#: a request's headers must arrive within this long; granian runs the same timer on an idle
#: keep-alive connection, so this is also how long one may sit idle (peers reuse theirs
#: only well within it: see peers.MAX_IDLE_S)
HEADER_TIMEOUT_MS = 10_000


async def serve_rsgi(
    app: Any,
    host: str,
    port: int,
    tls: tuple[str, str] | None = None,
    on_stop: Callable[[], None] | None = None,
    leaving: Leaving | None = None,
) -> None:
    """Serve an RSGI app on this event loop until SIGINT/SIGTERM (after `leaving`, if given;
    `on_stop` runs next: open streams end, or granian would wait for them).

    The benchmarks serve their constant-body baseline through this same
    function, so "the same HTTP stack" means the same settings too.
    """
    # granian is the [granian] extra: only nodes that serve with it import it
    from granian.constants import Interfaces, SSLProtocols
    from granian.http import HTTP1Settings
    from granian.server.embed import Server

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
        backlog=LISTEN_BACKLOG,
        backpressure=connection_cap(),
        http1_settings=HTTP1Settings(header_read_timeout=HEADER_TIMEOUT_MS),
        **ssl_files,  # type: ignore[arg-type]
    )

    async def stop() -> None:
        if leaving is not None:
            await leaving.leave()
        if on_stop is not None:
            on_stop()
        server.stop()

    stopping: list[asyncio.Task[None]] = []  # the loop keeps only weak references to tasks
    loop = asyncio.get_running_loop()
    _on_stop_signals(lambda: stopping.append(loop.create_task(stop())), leaving)
    await server.serve()


@dataclass
class Leaving:
    """How a node leaves on SIGINT/SIGTERM: `leave` hands its partitions over while it still
    answers (:meth:`tablecast.cluster.node.Node.leave`); a second signal calls `hurry`."""

    leave: Callable[[], Awaitable[None]]
    hurry: Callable[[], None]


def _on_stop_signals(stop: Callable[[], None], leaving: Leaving | None = None) -> None:
    loop = asyncio.get_running_loop()
    signalled = False

    def on_signal() -> None:
        nonlocal signalled
        if signalled:
            if leaving is not None:
                leaving.hurry()
            return
        signalled = True
        stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)


async def serve_loop(
    app: HttpApp,
    host: str,
    port: int,
    tls: tuple[str, str] | None = None,
    on_stop: Callable[[], None] | None = None,
    listeners: int | None = None,
    readers: ReadProcesses | None = None,
    leaving: Leaving | None = None,
) -> None:
    """Serve `app` with :mod:`tablecast.http.http1` until SIGINT/SIGTERM (and, if given,
    `leaving`), with `readers` beside it on the same port."""
    context = tls_context(tls) if tls else None
    server = LoopServer(app, context, connection_cap())
    try:
        await server.start(host, port, listeners=listeners, share=readers is not None)
    except OSError as e:  # as granian reports it: the CLI's one line (cli/main.py)
        if e.errno != errno.EADDRINUSE:
            raise
        raise RuntimeError(f"Address already in use: {host}:{port}") from None
    log.info(
        "HTTP/1.1 served on the event loop's thread (--http-engine loop), %d listening socket(s)",
        server.listeners,
    )
    try:
        if readers is not None:
            await server.start_relay(readers.relay_path)
            await readers.start(server.port, server.listeners)
        stopping = asyncio.Event()
        _on_stop_signals(stopping.set, leaving)
        await stopping.wait()
        if leaving is not None:
            await leaving.leave()
    finally:
        if readers is not None:  # first: connections they hold are piped to this server
            await readers.stop()
    if on_stop is not None:
        on_stop()
    await server.stop()


async def serve(settings: ServeSettings, auth: Auth) -> None:
    """Run a node with these `settings` and `auth` until SIGINT/SIGTERM."""
    config = settings.node
    node = Node(config)
    node.start()
    host, port, tls = settings.host, settings.port, settings.tls
    scheme = "https" if tls else "http"
    log.info(
        "node %s serving app %r on %s://%s:%d", config.node_id, config.app_id, scheme, host, port
    )
    # read processes spend a caller's tokens from the same table as the node
    rate_table = (
        rate_table_in(config.data_dir) if settings.processes > 1 and settings.rate else None
    )
    app = HttpApp(
        node,
        auth,
        settings.rate,
        settings.waits_per_caller,
        settings.auth_metrics,
        rate_table,
        settings.forwarding,
        port,
    )
    grpc = None
    if settings.grpc_port is not None:
        from tablecast.grpc.service import serve_grpc

        grpc = await serve_grpc(app, host, settings.grpc_port, tls)
        log.info("gRPC (tablecast.v1.Tables) on %s:%d", host, settings.grpc_port)
    pg = None
    if settings.pg_port is not None:
        from tablecast.pg.server import PgServer

        pg = PgServer(app, tls, settings.pg_allow_cleartext, metrics=app.metrics)
        await pg.start(host, settings.pg_port)
        log.info("PostgreSQL protocol on %s:%d", host, settings.pg_port)
    gc.tune()
    collecting = asyncio.get_running_loop().create_task(gc.collect_periodically())
    leaving = Leaving(lambda: asyncio.to_thread(node.leave), node.hurry)
    try:
        if settings.http_engine == "loop":
            await serve_loop(
                app,
                host,
                port,
                tls,
                on_stop=app.live.hub.close_all,
                listeners=settings.listeners,
                readers=_readers(settings.processes, app, auth, tls, host),
                leaving=leaving,
            )
        else:
            await serve_rsgi(app, host, port, tls, app.live.hub.close_all, leaving)
    finally:
        collecting.cancel()
        app.console.close()
        if grpc is not None:
            await grpc.stop(1.0)
        if pg is not None:
            await pg.stop()
        app.live.hub.stop()
        app.peers.close()
        node.stop()
        log.info("node %s stopped", config.node_id)


def rate_table_in(data_dir: Path) -> Path:
    """Where a node with read processes keeps its callers' token buckets."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return data_dir / "rate-buckets"


def _readers(
    processes: int, app: HttpApp, auth: Auth, tls: tuple[str, str] | None, host: str
) -> ReadProcesses | None:
    """The node's read processes besides itself (``--processes``), not started yet."""
    if processes <= 1:
        return None
    from tablecast.node.read_bulletin import Feed
    from tablecast.node.read_processes import ReadProcesses
    from tablecast.store import rocksdb

    node = app.node
    settings = {
        "host": host,
        "tls": list(tls) if tls else None,
        "node_id": node.id,
        "max_key_bytes": node.config.max_key_bytes,
        "answers_bytes": node.config.answers_bytes,
        "block_cache_bytes": rocksdb.block_cache_bytes(),
        **auth.settings(),
    }
    if isinstance(app.rate, SharedTokenBuckets):
        settings["rate"] = {"limit": app.rate.rate, "table": str(app.rate.path)}
    feed = Feed(node, app.router.local, app.router.routing)
    home = node.config.data_dir / "readers"
    return ReadProcesses(processes - 1, settings, feed, app.stats, home)


@dataclass(frozen=True)
class ServeSettings:
    """Everything ``tablecast serve`` starts a node with, read once from its flags, its
    ``TABLECAST_SERVE_*`` variables and ``--config`` file (:mod:`tablecast.cli.main`)."""

    #: what the node's cluster side needs: its app, Kafka, its URL and id, its data, caches
    node: NodeConfig
    host: str = "127.0.0.1"
    port: int = 8080
    #: certificate and key files: HTTPS (and TLS gRPC) instead of plain
    tls: tuple[str, str] | None = None
    #: requests per second per caller (--rate-limit; None: no limit)
    rate: float | None = None
    #: reads of one caller that may wait for an offset at once (--max-waits)
    waits_per_caller: int = DEFAULT_WAITS_PER_CALLER
    #: /metrics needs a token; /readyz without one answers only its status (--auth-metrics)
    auth_metrics: bool = False
    #: serve gRPC (tablecast.v1.Tables) on this port too (--grpc-port)
    grpc_port: int | None = None
    #: serve the PostgreSQL protocol on this port too (--pg-port)
    pg_port: int | None = None
    #: with auth on, a PostgreSQL password without TLS from loopback (--pg-allow-cleartext)
    pg_allow_cleartext: bool = False
    #: "loop": HTTP/1.1 on the event loop's thread (http/http1.py), or "granian" (HTTP/2 too)
    http_engine: str = "loop"
    #: the loop engine's listening sockets (None: as many as this kernel needs, see listen.py)
    listeners: int | None = None
    #: processes serving plain key reads, the node's own included (--processes)
    processes: int = 1
    #: how forwarded reads leave (--forwarding): one of tablecast.query.forwarding.FORWARDING
    forwarding: str = "short"


def run(settings: ServeSettings, auth: Auth | None = None) -> None:
    import uvloop

    uvloop.run(serve(settings, auth or Auth()))
