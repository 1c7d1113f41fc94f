"""Threads that run for the length of a ``with`` block: load generators and probes that a
benchmark or a test runs beside the system it watches."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Self

#: how long leaving the block waits for each thread to see the stop
JOIN_S = 30.0


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

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(JOIN_S)
