"""The PostgreSQL front end of a node (``serve --pg-port``): a listener on the node's event
loop, one :class:`~tablecast.pg.session.Session` per connection."""

from __future__ import annotations

import asyncio
import logging
import ssl

from prometheus_client import CollectorRegistry

from tablecast.pg import wire
from tablecast.pg.kept_replies import KeptReplies
from tablecast.pg.session import Node, Session

log = logging.getLogger(__name__)

#: connections one node serves at once; one more is told so and closed
MAX_CONNECTIONS = 1_000


class PgServer:
    def __init__(
        self,
        node: Node,
        tls: tuple[str, str] | None = None,
        allow_cleartext: bool = False,
        max_connections: int = MAX_CONNECTIONS,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        self.node = node
        self.allow_cleartext = allow_cleartext
        self.max_connections = max_connections
        self.tls: ssl.SSLContext | None = None
        if tls is not None:
            self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.tls.load_cert_chain(*tls)
        self.cancels: dict[tuple[int, int], Session] = {}
        answers = node.router.answers
        #: as much again as the node's kept answers, where it keeps them (no auth, no rate limit)
        self.replies = None if answers is None else KeptReplies(answers, answers.max_bytes)
        if metrics is not None and self.replies is not None:
            metrics.register(self.replies)  # type: ignore[arg-type]
        self.sessions: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._connected, host, port, limit=1 << 16)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.sessions) >= self.max_connections:
            writer.write(
                wire.error_response(
                    "53300", f"sorry, too many clients already ({self.max_connections})", "FATAL"
                )
            )
            writer.close()
            return
        session = Session(
            self.node, reader, writer, self.tls, self.allow_cleartext, self.cancels, self.replies
        )
        task = asyncio.current_task()
        assert task is not None
        self.sessions.add(task)
        try:
            await session.run()
        finally:
            self.sessions.discard(task)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.sessions):
            task.cancel()
        if self.sessions:
            await asyncio.wait(list(self.sessions), timeout=2)
