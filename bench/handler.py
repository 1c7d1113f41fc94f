"""CPU per request inside the node's RSGI app, measured in-process (part of ``bench serving``).

wrk's req/s moves with everything else the machine runs; the CPU time the
serving thread spends in :class:`HttpApp` per GET (``time.thread_time``) barely
does. Requests go through the real app, a real :class:`Node` with RocksDB
stores filled from the topic, and a stand-in for granian's scope and protocol
objects; only granian's own work (HTTP parsing, the socket) is left out, the
same for the GET and the constant body.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.baselines import ConstantRSGI
from tablecast.cluster.node import Node, NodeConfig
from tablecast.http.app import HttpApp


class _Scope:
    proto = "http"
    method = "GET"
    query_string = ""

    def __init__(self, path: str) -> None:
        self.path = path
        self.headers: dict[str, str] = {}


class _Proto:
    status = 0

    def response_bytes(self, status: int, headers: Any, body: bytes) -> None:
        self.status = status


def _per_request_us(app: Any, scopes: Sequence[_Scope], proto: _Proto) -> float:
    started = time.thread_time()
    for scope in scopes:
        coro = app(scope, proto)
        try:  # noqa: SIM105 - a with-block per request would be timed too
            coro.send(None)
        except StopIteration:
            pass
    return (time.thread_time() - started) / len(scopes) * 1e6


def handler_cost(
    bootstrap: str, app_id: str, table: str, keys: int, data_dir: Path, cache_bytes: int
) -> dict[str, float]:
    """µs of serving-thread CPU per random-key GET, and per constant-body request."""
    config = NodeConfig(
        app_id, bootstrap, "http://127.0.0.1:1", "bench-inproc", data_dir, cache_bytes=cache_bytes
    )
    node = Node(config)
    node.start()
    try:
        deadline = time.monotonic() + 300
        while not node.ready:
            if time.monotonic() > deadline:
                raise TimeoutError("in-process node not ready")
            time.sleep(0.2)
        app, proto = HttpApp(node), _Proto()
        rng = random.Random(11)
        scopes = [
            _Scope(f"/v1/tables/{table}/keys/k{rng.randrange(keys):07d}") for _ in range(200_000)
        ]
        _per_request_us(app, scopes, proto)  # warm-up: caches, partition memo
        assert proto.status == 200, proto.status
        gets, constants = [], []
        for _ in range(3):
            gets.append(_per_request_us(app, scopes, proto))
            constants.append(_per_request_us(ConstantRSGI(), scopes, proto))
        return {"get_us": sorted(gets)[1], "constant_us": sorted(constants)[1]}
    finally:
        node.stop()
