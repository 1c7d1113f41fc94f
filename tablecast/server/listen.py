"""Whether a node can listen on its address, asked before it joins its cluster.

granian binds its socket only once the node has joined the group and started
ingesting, and reports a busy port as a Rust panic with a backtrace; asking first
turns that into one line before anything else has happened.
"""

from __future__ import annotations

import socket


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
