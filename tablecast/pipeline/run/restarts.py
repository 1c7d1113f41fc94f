"""Whether a failed query is started again from its checkpoint, and after how long.

On one machine (``local[N]``) Spark does not retry a failed task: a task that
fails once — its Kafka producer timing out while a broker is away, a Python
worker killed by the OOM killer — ends the whole query. Kafka Streams replaces
a thread that died the same way; here the pipeline starts the query again from
its checkpoint, which replays the batch that failed (a table's records are
upserts, so a replay leaves each key at its latest value).

A failure that will happen again at once is not worth retrying forever: each
query gets ``budget`` restarts within ``window_s``, after waits that double from
``first_delay_s`` to ``max_delay_s``, and a failure Spark reports as lost input
(``failOnDataLoss``) ends the pipeline at once, since only the user can decide
to go on without those records.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

#: what Spark's message says when input records were deleted before they were read
PERMANENT = ("failOnDataLoss",)


@dataclass
class Restarts:
    budget: int = 5
    window_s: float = 600.0
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _times: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque))

    def delay(self, query: str, error: str) -> float | None:
        """How long to wait before starting `query` again after it failed with `error`, or
        None when it must not be started again (the pipeline then fails)."""
        if any(marker in error for marker in PERMANENT):
            return None
        now = self.clock()
        recent = self._times[query]
        while recent and now - recent[0] > self.window_s:
            recent.popleft()
        if len(recent) >= self.budget:
            return None
        recent.append(now)
        return min(self.first_delay_s * 2 ** (len(recent) - 1), self.max_delay_s)
