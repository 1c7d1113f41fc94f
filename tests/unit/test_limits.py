"""Per-caller limits and offset waits: the token bucket, the wait slots, and waiters woken
by the applying thread instead of polling."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tablecast.cluster.offsetwait import AppliedWaiters
from tablecast.query import ratelimit
from tablecast.query.errors import ApiError
from tablecast.query.ratelimit import SharedTokenBuckets, TokenBuckets, WaitSlots


def views(kind: str, tmp_path: Path, rate: float, burst: float | None = None) -> list[Any]:
    """Two views of one set of buckets: the same TokenBuckets twice, or two mappings of one
    shared table (a node's and its read process's)."""
    if kind == "local":
        return [TokenBuckets(rate, burst)] * 2
    path = tmp_path / f"rates-{rate}"
    return [
        SharedTokenBuckets(path, rate, burst, create=True),
        SharedTokenBuckets(path, rate, burst),
    ]


@pytest.mark.parametrize("kind", ["local", "shared"])
def test_token_bucket_allows_the_rate_and_says_when_to_retry(kind: str, tmp_path: Path) -> None:
    b, other = views(kind, tmp_path, rate=2, burst=2)
    b.take("a", now=100.0)
    other.take("a", now=100.0)
    with pytest.raises(ApiError) as e:
        b.take("a", now=100.1)
    assert e.value.status == 429 and e.value.code == "rate_limited"
    assert dict(e.value.headers)["retry-after"] == "1"
    other.take("b", now=100.1)  # another caller has its own bucket
    b.take("a", now=100.6)  # half a second refills one token at 2/s
    slow, _ = views(kind, tmp_path, rate=0.2)
    slow.take("c", now=100.0)
    with pytest.raises(ApiError) as e:
        slow.take("c", now=100.0)
    assert dict(e.value.headers)["retry-after"] == "5"
    assert b.refused == 1
    if kind == "shared":  # a node started again counts afresh
        views(kind, tmp_path, rate=2, burst=2)[0].take("a", now=100.6)


def test_token_buckets_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ratelimit, "MAX_CALLERS", 100)
    b = TokenBuckets(rate=10)
    for i in range(100):
        b.take(f"old{i}", now=0.0)
    b.take("new", now=5.0)  # the idle ones refilled: dropped, nothing forgotten that mattered
    assert len(b) == 1
    for i in range(99):
        b.take(f"busy{i}", now=5.0)
    b.take("flood", now=5.0)  # all still draining: start over rather than grow
    assert len(b) <= 100


def test_shared_buckets_reuse_refilled_slots_and_never_refuse_wrongly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ratelimit, "SLOTS", 8)
    monkeypatch.setattr(ratelimit, "PROBES", 8)
    b = SharedTokenBuckets(tmp_path / "rates", rate=1, burst=1, create=True)
    for i in range(8):
        b.take(f"old{i}", now=0.0)  # every slot held by a caller with an empty bucket
    for _ in range(3):
        b.take("new", now=0.5)  # nowhere to count it: let through, never refused wrongly
    with pytest.raises(ApiError):
        b.take("old3", now=0.5)  # the ones counted still are
    b.take("newer", now=5.0)  # the old buckets refilled: a slot is free again
    with pytest.raises(ApiError):
        b.take("newer", now=5.0)
    b.close()


COUNTER = """
import sys
from tablecast.query.errors import ApiError
from tablecast.query.ratelimit import SharedTokenBuckets
b = SharedTokenBuckets(sys.argv[1], rate=0.001, burst=30000)
sys.stdin.readline()  # all start together
got = 0
for _ in range(20000):
    try:
        b.take("one caller", now=1000.0)
        got += 1
    except ApiError:
        pass
print(got)
"""


def test_shared_buckets_spend_each_token_once_across_processes(tmp_path: Path) -> None:
    """Processes taking from one caller's bucket at once get exactly its burst between them:
    the lock on the file keeps two from spending the same token."""
    SharedTokenBuckets(tmp_path / "rates", rate=0.001, burst=30000, create=True).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", COUNTER, str(tmp_path / "rates")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in range(3)
    ]
    time.sleep(1.0)  # imported, waiting on their input
    for p in procs:
        p.stdin.write(b"go\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
    got = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert sum(got) == 30000, got
    assert all(g > 0 for g in got), got


def test_wait_slots_count_per_caller_and_forget_idle_callers() -> None:
    w = WaitSlots(2)
    w.enter("a")
    w.enter("a")
    with pytest.raises(ApiError) as e:
        w.enter("a")
    assert e.value.status == 429
    w.enter("b")
    w.leave("a")
    w.enter("a")
    for caller in ("a", "a", "b"):
        w.leave(caller)
    assert w._held == {}


def test_waiters_are_woken_by_the_applying_thread() -> None:
    waiters = AppliedWaiters()

    async def main() -> tuple[float, float]:
        early = waiters.wait(5)
        late = waiters.wait(9)
        started = time.monotonic()

        def apply() -> None:
            time.sleep(0.05)
            waiters.advanced(4)  # not far enough: nobody wakes
            time.sleep(0.05)
            waiters.advanced(6)

        t = threading.Thread(target=apply)
        t.start()
        await early
        woke = time.monotonic() - started
        assert not late.done() and len(waiters) == 1
        waiters.wake_all()  # released: the rest look again
        await late
        t.join()
        return woke, time.monotonic() - started

    woke, _ = asyncio.run(main())
    assert 0.09 <= woke < 0.5
    assert len(waiters) == 0


def test_a_forgotten_waiter_is_not_kept() -> None:
    waiters = AppliedWaiters()

    async def main() -> None:
        f = waiters.wait(3)
        waiters.forget(f)
        waiters.advanced(3)
        await asyncio.sleep(0)
        assert not f.done() and len(waiters) == 0

    asyncio.run(main())
