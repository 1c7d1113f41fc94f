"""One read process of a node (``python -m tablecast.http.readers``, started by the node).

Its standard input carries the node's settings (the first line) and then the
feed (:mod:`tablecast.node.read_bulletin`); its standard output the word
``ready`` once it listens, then once a second what it answered, which the node
adds to its own ``/metrics``. It listens on the node's port beside the node's
own sockets (SO_REUSEPORT), so the kernel spreads connections over both.
When its input ends (the node stopped, or was killed) it stops too; and the kernel kills
it when the node dies (:func:`tablecast.lifetime.die_with_parent`).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import orjson

from tablecast.http.http1 import LISTEN_BACKLOG
from tablecast.http.listen import connection_cap, tls_context
from tablecast.http.readers.key_reads import Answerer
from tablecast.http.readers.relay import ClientConnection, Clients
from tablecast.query.auth import Auth
from tablecast.query.policy import Policy
from tablecast.query.ratelimit import SharedTokenBuckets
from tablecast.store import rocksdb

log = logging.getLogger(__name__)

#: how often what it answered is reported to the node
STATS_S = 1.0


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = orjson.loads(sys.stdin.buffer.readline() or b"null")
    if settings is None:
        return
    import uvloop

    uvloop.run(serve(settings))


def auth_of(settings: dict[str, Any]) -> Auth:
    policy = settings.get("auth_policy")
    return Auth(
        settings.get("auth_secret"),
        settings.get("auth_jwks"),
        settings.get("auth_audience"),
        settings.get("auth_issuer"),
        Policy.load(policy) if policy else None,
    )


async def serve(settings: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    rocksdb.set_block_cache_bytes(settings["block_cache_bytes"])
    own_dir = Path(settings["own_dir"])
    shutil.rmtree(own_dir, ignore_errors=True)
    rate = settings.get("rate")
    answerer = Answerer(
        settings["node_id"],
        settings["max_key_bytes"],
        own_dir,
        auth_of(settings),
        settings["answers_bytes"],
        SharedTokenBuckets(rate["table"], rate["limit"]) if rate else None,
    )
    tls = settings.get("tls")
    context = tls_context(tls) if tls else None
    clients = Clients(answerer, settings["relay"], "https" if tls else "http", connection_cap())
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    feed = asyncio.StreamReader(limit=64 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(feed), sys.stdin)
    out_transport, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout)
    servers = [
        await loop.create_server(
            lambda: ClientConnection(clients),
            settings["host"],
            settings["port"],
            ssl=context,
            backlog=LISTEN_BACKLOG,
            reuse_port=True,
        )
        for _ in range(settings["listeners"])
    ]
    out_transport.write(b"ready\n")
    tasks = [
        loop.create_task(_follow(feed, answerer, stopping)),
        loop.create_task(_report(answerer, out_transport)),
    ]
    try:
        await stopping.wait()
    finally:
        for server in servers:
            server.close()
        clients.close()
        for task in tasks:
            task.cancel()
        answerer.close()
        shutil.rmtree(own_dir, ignore_errors=True)


async def _follow(feed: asyncio.StreamReader, answerer: Answerer, stopping: asyncio.Event) -> None:
    """Take the node's feed until it ends: then the node is gone, and so is this process."""
    try:
        while line := await feed.readline():
            try:
                answerer.update(orjson.loads(line))
            except Exception:  # one bad line must not stop the reads; the next one fixes it
                log.exception("the node's feed line could not be taken")
    finally:
        stopping.set()


async def _report(answerer: Answerer, out: asyncio.WriteTransport) -> None:
    while True:
        await asyncio.sleep(STATS_S)
        stats = answerer.stats
        if stats.requests or stats.kept:
            out.write(stats.delta() + b"\n")
