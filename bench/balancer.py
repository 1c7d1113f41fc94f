"""Readers behind a load balancer that routes by ``/readyz`` and retries nothing: the rolling
restart's judge, in ``python -m bench rolling`` and in the suite's rolling-restart test.

It polls every node's ``/readyz`` every ``POLL_S`` and sends reads only to nodes
that answered 200 (a stopping node included, until it says it is not ready); a
probe that times out changes nothing, as a load balancer counts several failed
probes before it drops a target; with no node ready it fails open to the nodes
that answer, as Envoy's panic mode or an ALB does, and counts those reads. A
read not answered 200 with the right value counts as failed, whatever the cause
(a 503, a refused connection).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from urllib.parse import quote

import httpx

from bench.background import Background

POLL_S = 0.2


class Balancer(Background):
    def __init__(
        self,
        urls: Callable[[], list[str]],
        table: str,
        keys: Sequence[str],
        right: Callable[[str, httpx.Response], bool],
        clients: int = 2,
        per_second: float | None = None,
    ) -> None:
        """`urls`: the nodes it knows now; `right(key, answer)`: whether a 200 holds the
        key's value; `per_second`: each client's reads a second (None: without pause)."""
        self.per_second = per_second
        self.urls, self.table, self.keys, self.right = urls, table, keys, right
        self.routable = urls()
        #: each node's last probe: its /readyz status, "timeout", or the connection's error
        self.probed: dict[str, str] = {}
        #: reads sent while no node said it was ready
        self.failed_open = 0
        self.ok = 0
        #: failed reads by kind (a status, an error's name, "wrong"), and the first ones
        self.failed: Counter[str] = Counter()
        self.samples: list[str] = []
        super().__init__(self._probe, *(partial(self._read, i) for i in range(clients)))

    def _probe(self) -> None:
        with httpx.Client(timeout=1) as http:
            while not self._stop.wait(POLL_S):
                ready = []
                for url in self.urls():
                    try:
                        outcome = str(http.get(f"{url}/readyz").status_code)
                    except httpx.TimeoutException:
                        outcome = "timeout"
                    except httpx.HTTPError as e:
                        outcome = type(e).__name__
                    self.probed[url] = outcome
                    if outcome == "200" or (outcome == "timeout" and url in self.routable):
                        ready.append(url)
                self.routable = ready

    def _fail(self, kind: str, text: str) -> None:
        self.failed[kind] += 1
        if len(self.samples) < 20:
            self.samples.append(text)

    def _read(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=10) as http:
            for _ in self._paced(self.per_second):
                key = rng.choice(self.keys)
                urls = self.routable
                if not urls:  # fail open: to the nodes that answered their last probe at all
                    urls = [u for u, got in self.probed.items() if got.isdigit()]
                    self.failed_open += 1
                if not urls:
                    self._fail("no node answers", f"no node answers: {self.probed}")
                    time.sleep(POLL_S)
                    continue
                url = rng.choice(urls)
                try:
                    r = http.get(f"{url}/v1/tables/{self.table}/keys/{quote(key, safe='')}")
                except httpx.TransportError as e:
                    self._fail(type(e).__name__, f"{url} {key}: {e!r}")
                    continue
                if r.status_code != 200:
                    self._fail(str(r.status_code), f"{url} {key}: {r.status_code} {r.text[:200]}")
                elif not self.right(key, r):
                    self._fail("wrong", f"{url} {key}: {r.text[:200]}")
                else:
                    self.ok += 1
