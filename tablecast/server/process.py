"""One serving node as a process: the node's ingestion thread plus granian on its event loop."""

from __future__ import annotations

import asyncio
import logging
import signal

from granian.constants import Interfaces
from granian.server.embed import Server

from tablecast.cluster.node import Node, NodeConfig
from tablecast.server.app import HttpApp

log = logging.getLogger(__name__)


async def serve(config: NodeConfig, host: str, port: int) -> None:
    node = Node(config)
    node.start()
    server = Server(
        HttpApp(node),
        address=host,
        port=port,
        interface=Interfaces.RSGI,
        log_enabled=False,
        backlog=1024,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.stop)
    log.info("node %s serving app %r on http://%s:%d", config.node_id, config.app_id, host, port)
    try:
        await server.serve()
    finally:
        node.stop()
        log.info("node %s stopped", config.node_id)


def run(config: NodeConfig, host: str, port: int) -> None:
    import uvloop

    uvloop.run(serve(config, host, port))
