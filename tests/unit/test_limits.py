"""Per-caller limits and offset waits: the token bucket, the wait slots, and waiters woken
by the applying thread instead of polling."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tablecast.cluster.offsetwait import AppliedWaiters
from tablecast.server import ratelimit
from tablecast.server.errors import ApiError
from tablecast.server.ratelimit import TokenBuckets, WaitSlots


def test_token_bucket_allows_the_rate_and_says_when_to_retry() -> None:
    b = TokenBuckets(rate=2, burst=2)
    b.take("a", now=0.0)
    b.take("a", now=0.0)
    with pytest.raises(ApiError) as e:
        b.take("a", now=0.1)
    assert e.value.status == 429 and e.value.code == "rate_limited"
    assert dict(e.value.headers)["retry-after"] == "1"
    b.take("b", now=0.1)  # another caller has its own bucket
    b.take("a", now=0.6)  # half a second refills one token at 2/s
    slow = TokenBuckets(rate=0.2)
    slow.take("c", now=0.0)
    with pytest.raises(ApiError) as e:
        slow.take("c", now=0.0)
    assert dict(e.value.headers)["retry-after"] == "5"
    assert b.refused == 1


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
    assert w._waiting == {}


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
