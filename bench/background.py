"""Threads that run for the length of a ``with`` block: load generators and probes that a
benchmark or a test runs beside the system it watches."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Self

#: how long leaving the block waits for each thread to see the stop
JOIN_S = 30.0


def paced(stop: threading.Event, per_second: float | None) -> Iterator[None]:
    """Yields until `stop` is set, at most `per_second` times a second (None: as often as the
    loop comes back); a loop late after a slow turn catches up at once, but by 1 s at most."""
    due = time.monotonic()
    while not stop.is_set():
        if per_second:
            due = max(due + 1 / per_second, time.monotonic() - 1)
            if stop.wait(max(0.0, due - time.monotonic())):
                return
        yield


class Background:
    """Starts `targets` (each a loop that ends once ``self._stop`` is set) in daemon threads
    on entering the block; on leaving it sets ``self._stop`` and joins them."""

    def __init__(self, *targets: Callable[[], None]) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=t, daemon=True) for t in targets]

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def _paced(self, per_second: float | None) -> Iterator[None]:
        """A target's loop: ``for _ in self._paced(n):`` runs until the block ends."""
        return paced(self._stop, per_second)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(JOIN_S)
