"""Listening: whether a node can listen on its address, and on how many sockets.

granian binds its socket only once the node has joined the group and started
ingesting, and reports a busy port as a Rust panic with a backtrace; asking first
turns that into one line before anything else has happened.

How many connections a node serves at once is bounded by its open files (see
:func:`connection_cap`), and HTTPS listens with TLS 1.2 at least.

The kernel queues connections not yet accepted per listening socket, at most
``net.core.somaxconn`` of them (4,096 by default); a connection beyond that is
dropped and its client waits out TCP's SYN retries (a second or more). 10,000
clients connecting at once overflowed one queue while the event loop was busy
answering, so the loop engine listens on several sockets sharing the port
(SO_REUSEPORT): the kernel spreads new connections over their queues.
"""

from __future__ import annotations

import resource
import socket
import ssl
from pathlib import Path


def cannot_listen(host: str, port: int) -> str | None:
    """Why nothing could listen on `host`:`port` right now, or None when it can."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"cannot listen on {host}:{port}: {e.strerror}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        # as the server will: a port whose last connections are in TIME_WAIT is free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            return f"cannot listen on {host}:{port}: {e.strerror or e}"
    return None


#: connections that may wait to be accepted at once, over all of a node's listening sockets:
#: 10,000 clients connecting at once must fit while the event loop is busy answering
PENDING_WANTED = 16_384
#: listening sockets at most: chosen for a small somaxconn, and asked for with --listeners
MOST_CHOSEN = 8
MOST_ASKED = 64


def somaxconn() -> int:
    """The kernel's cap on one listening socket's queue of connections not yet accepted."""
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        return 4096  # Linux's default since 5.4


def listeners_wanted(queue_cap: int) -> int:
    """Listening sockets needed for :data:`PENDING_WANTED` waiting connections when each
    queue holds at most `queue_cap` (the kernel spreads new connections over them)."""
    return max(1, min(MOST_CHOSEN, -(-PENDING_WANTED // max(1, queue_cap))))


def listeners_for(backlog: int) -> int:
    """The loop engine's listening sockets when not asked for a count: those
    :func:`listeners_wanted` for queues of `backlog`, as this kernel clamps it."""
    return listeners_wanted(min(backlog, somaxconn()))


def others_listening(port: int, ours: set[int]) -> bool:
    """Whether a listening TCP socket that is not one of `ours` (socket inodes) is bound to
    the address and `port` one of ours is bound to.

    Sockets sharing a port with SO_REUSEPORT share its connections with any process
    of the same user that binds it the same way: two nodes started on one port at the
    same moment would both get past :func:`cannot_listen` and split the traffic.
    """
    listening: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local address as ADDR:PORT in hex, state 0A is LISTEN, the inode is field 9
            if len(fields) > 9 and fields[3] == "0A":
                address, _, hex_port = fields[1].rpartition(":")
                if int(hex_port, 16) == port:
                    listening[int(fields[9])] = address
    mine = {address for inode, address in listening.items() if inode in ours}
    return any(a in mine for inode, a in listening.items() if inode not in ours)


#: granian serves at most this many connections at once and leaves the rest in the
#: listen backlog: a client holding many slow or idle connections must not reach it.
#: A watch holds its connection for as long as it lasts, so the cap is set by open
#: files, not by this: 20,000 watchers need 20,000 sockets (docs/operations.md)
MAX_CONNECTIONS = 100_000
#: open files the node keeps for itself whatever the connections: RocksDB's files,
#: Kafka's sockets, peers, logs (and an eighth of the limit when that is more)
RESERVED_FILES = 2_048
#: the soft limit is raised towards the hard one up to this
FILE_CEILING = 262_144


def connection_cap() -> int:
    """How many connections to serve at once, the soft file limit raised to the hard one first.

    granian's default (the backlog, 1024) is reached by one client holding 1024
    idle connections, after which nobody is served (measured). Open files bound
    it: RocksDB, Kafka and peers keep what they need, the rest is for clients.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = FILE_CEILING if hard == resource.RLIM_INFINITY else min(hard, FILE_CEILING)
    if soft < ceiling:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
            soft = ceiling
        except (ValueError, OSError):
            pass  # keep the soft limit we were given
    return max(128, min(MAX_CONNECTIONS, soft - max(RESERVED_FILES, soft // 8)))


def tls_context(tls: tuple[str, str] | list[str]) -> ssl.SSLContext:
    """The server side of HTTPS: this certificate and key, TLS 1.2 at least."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls[0], tls[1])
    return context
