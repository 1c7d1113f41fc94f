"""The reference (the table topic, followed by the harness) and the readers checked against it.

Correctness rule for one read answer, made conservative so that it is sound:

* An answer ``{value, partition, offset}`` is correct iff the table-topic record
  at (partition, offset) exists, has the asked key, a well-formed value equal to
  the answer's value, and no newer record for that key lies at an offset below
  the position ``A`` the replica must have applied. ``A`` is derived from the
  answer's own claims, ``X-Tablecast-Lag`` and ``X-Tablecast-Staleness-Ms``
  (``S``): ``A = E - lag``, where ``E`` is the partition end as the harness saw
  it ``S + GRACE_S`` before the request was sent. A node claims to have been at
  the end the broker confirmed ``S`` ago, minus ``lag``; ``GRACE_S`` covers how
  old a confirmation may be while the node still reports staleness 0 (its
  ``FRESH_S``) and the trip of a record to the node's view of the topic end. A
  smaller ``E`` only makes ``A`` smaller, so the rule errs on the side of
  calling answers correct; the staleness a node claims is reported in the run's
  figures, so a node cannot hide behind large claims unseen.
* A 404 is correct iff the key had no value (never written, or tombstoned) at
  some position ``x >= A`` (x = "after applying every record below offset x").
* Keys whose latest record at or before the answered position is malformed
  (injected straight into the table topic) are *unchecked* until a later valid
  record: the node may answer the previous value or 404, but an answer carrying
  a malformed record's offset is always wrong.
* ``tablecast.Client`` answers carry no lag header: they are checked for the
  record match only (a fabricated or misplaced value is wrong; staleness is not
  judged). Its ``None`` answers are not judged.

A plain-HTTP read behaves like a client behind a load balancer: a node that
refuses the connection or drops it without an answer (killed a moment ago) is
skipped for another one, and the skip is counted (``retried``). Anything else (5xx, 503, timeouts, a
connection lost mid-request, every node unreachable) is a failed read, counted
by status; it is not wrong, and it counts against availability.
"""

from __future__ import annotations

import bisect
import itertools
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

import tablecast as tc
from tablecast.kafka.config import client_conf
from tablecast.kafka.partitioner import partition_for

from .cluster import KEYS, PARTITIONS, TABLE

GRACE_S = 3.0
MALFORMED = object()


@dataclass
class Rec:
    offset: int
    value: Any  # decoded JSON, None (tombstone) or MALFORMED


class Reference:
    """Follows the table topic: per key its records, per partition when each offset arrived."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.lock = threading.Lock()
        self.by_key: dict[str, list[Rec]] = defaultdict(list)
        self.at: dict[tuple[int, int], tuple[str, Any]] = {}
        self.arrivals: dict[int, tuple[list[float], list[int]]] = {
            p: ([], []) for p in range(PARTITIONS)
        }
        self.ends = dict.fromkeys(range(PARTITIONS), 0)
        self.c = Consumer(
            client_conf(
                bootstrap,
                {
                    "group.id": "chaos-reference",
                    "enable.auto.commit": False,
                    "reconnect.backoff.max.ms": 1000,
                },
            )
        )
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="reference", daemon=True)

    def start(self) -> None:
        self.c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            msgs = self.c.consume(500, 0.2)
            now = time.monotonic()
            with self.lock:
                for m in msgs:
                    if m.error() is not None or m.key() is None:
                        continue
                    p, o = m.partition(), m.offset()
                    k = m.key().decode(errors="replace")
                    raw = m.value()
                    if raw is None:
                        v: Any = None
                    else:
                        try:
                            v = orjson.loads(raw)
                        except orjson.JSONDecodeError:
                            v = MALFORMED
                    self.by_key[k].append(Rec(o, v))
                    self.at[(p, o)] = (k, v)
                    times, ends = self.arrivals[p]
                    times.append(now)
                    ends.append(o + 1)
                    self.ends[p] = o + 1

    def end_before(self, p: int, t: float) -> int:
        """The partition end the harness had seen at monotonic time `t`."""
        times, ends = self.arrivals[p]
        i = bisect.bisect_right(times, t)
        return ends[i - 1] if i else 0

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.c.close()

    # judging ---------------------------------------------------------------
    def judge_value(self, key: str, body: dict[str, Any], applied: int | None) -> str:
        """'ok', 'wrong:<why>' or 'unchecked'."""
        p, o = body.get("partition"), body.get("offset")
        with self.lock:
            rec = self.at.get((p, o))
            if rec is None:
                # the reference has not read that far yet; wait a little below
                return "pending"
            k, v = rec
            if k != key:
                return f"wrong:offset {p}/{o} holds key {k!r}"
            if v is MALFORMED:
                return f"wrong:answered the malformed record at {p}/{o}"
            if v != body.get("value"):
                return f"wrong:value {body.get('value')!r} != record {v!r} at {p}/{o}"
            if applied is None:
                return "ok"
            newer = [r for r in self.by_key[key] if o < r.offset < applied]
        if not newer:
            return "ok"
        if all(r.value is MALFORMED for r in newer):
            return "unchecked"
        return f"wrong:stale, {p}/{o} answered but {newer[-1].offset} < applied {applied}"

    def judge_absent(self, key: str, applied: int) -> str:
        with self.lock:
            recs = list(self.by_key.get(key, ()))
        if not recs or recs[-1].value is None:
            return "ok"
        # the highest position x (records below x applied) at which the key had no value
        last_absent = recs[0].offset
        for prev, cur in itertools.pairwise(recs):
            if prev.value is None:
                last_absent = cur.offset
        if last_absent >= applied:
            return "ok"
        if any(r.value is MALFORMED for r in recs):
            return "unchecked"
        return f"wrong:404 but valued since {last_absent} < applied {applied}"


@dataclass
class Tally:
    queries: int = 0
    ok: int = 0
    unchecked: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    #: plain-HTTP reads that met a node they could not connect to and went to the next one
    retried: int = 0
    #: the largest staleness an answer judged by it claimed (ms)
    max_staleness_ms: int = 0
    wrong: list[str] = field(default_factory=list)
    #: (monotonic time, partition, answered)
    timeline: list[tuple[float, int, bool]] = field(default_factory=list)


class Readers:
    """Threads reading random keys through random nodes, half plain HTTP, half tablecast.Client."""

    def __init__(self, ref: Reference, urls: Any, threads: int, seed: int) -> None:
        self.ref, self.urls = ref, urls  # urls: a callable returning the node URLs now
        self.n, self.seed = threads, seed
        self.tally = Tally()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.n):
            t = threading.Thread(target=self._run, args=(i,), name=f"reader-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(30)

    def _record(self, key: str, t: float, verdict: str) -> None:
        p = partition_for(key.encode(), PARTITIONS)
        with self.lock:
            tl = self.tally
            tl.queries += 1
            answered = not verdict.startswith("failed:")
            tl.timeline.append((t, p, answered))
            if verdict == "ok":
                tl.ok += 1
            elif verdict == "unchecked":
                tl.unchecked += 1
            elif verdict.startswith("failed:"):
                tl.failed[verdict[7:]] += 1
            else:
                tl.wrong.append(f"{time.strftime('%H:%M:%S')} {key}: {verdict}")

    def _settle(self, judge: Any) -> str:
        # the reference may trail the node by a moment: give it 5 s to read that far
        deadline = time.monotonic() + 5
        while True:
            v = judge()
            if v != "pending" or time.monotonic() > deadline:
                return "wrong:offset not in the table topic" if v == "pending" else v
            time.sleep(0.1)

    def _run(self, i: int) -> None:
        rng = random.Random(self.seed * 100 + i)
        use_client = i % 2 == 1
        http = httpx.Client(timeout=5.0)
        client: tc.Client | None = None
        while not self.stopping.is_set():
            key = f"k{rng.randrange(KEYS):05d}"
            urls = self.urls()
            t0 = time.monotonic()
            try:
                if use_client:
                    if client is None:
                        client = tc.Client(urls, timeout=5.0)
                    body = client.get(TABLE, key)
                    if body is None:
                        verdict = "unchecked"
                    else:
                        verdict = self._settle(
                            lambda b=body, k=key: self.ref.judge_value(k, b, None)
                        )
                else:
                    url, r = self._get_any(http, rng, urls, key)
                    verdict = self._judge_http(key, r, t0)
                    if verdict.startswith("wrong:"):
                        lag = r.headers.get("x-tablecast-lag")
                        verdict += f" (asked {url}, answered by "
                        verdict += f"{r.headers.get('x-tablecast-node')}, lag {lag})"
            except tc.QueryError as e:
                verdict = f"failed:{e.status}"
            except (httpx.HTTPError, ConnectionError, OSError) as e:
                verdict = f"failed:{type(e).__name__}"
            except ValueError:
                # tablecast.Client.get raises the JSON error itself on a non-JSON error body
                verdict = "failed:client-non-json-body"
            except Exception as e:  # a reader must outlive any answer
                verdict = f"failed:{type(e).__name__}"
            self._record(key, t0, verdict)
        http.close()
        if client is not None:
            client.close()

    def _get_any(
        self, http: httpx.Client, rng: random.Random, urls: list[str], key: str
    ) -> tuple[str, httpx.Response]:
        """GET the key from a random node, the next one while a node refuses connections."""
        order = rng.sample(urls, len(urls))
        for n, url in enumerate(order):
            try:
                return url, http.get(f"{url}/v1/tables/{TABLE}/keys/{quote(key, safe='')}")
            # refused, or the connection dropped without an answer (a node killed under
            # the request): a GET may go to the next node, as a load balancer retries it
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                if n == len(order) - 1:
                    raise
                with self.lock:
                    self.tally.retried += 1
        raise AssertionError("unreachable")

    def _judge_http(self, key: str, r: httpx.Response, t0: float) -> str:
        if r.status_code not in (200, 404):
            return f"failed:{r.status_code}"
        lag_h = r.headers.get("x-tablecast-lag")
        stale_h = r.headers.get("x-tablecast-staleness-ms")
        if stale_h is None:
            return f"wrong:{r.status_code} without X-Tablecast-Staleness-Ms"
        stale_ms = int(stale_h)
        with self.lock:
            self.tally.max_staleness_ms = max(self.tally.max_staleness_ms, stale_ms)
        seen = t0 - GRACE_S - stale_ms / 1000
        p = partition_for(key.encode(), PARTITIONS)
        if r.status_code == 404:
            try:
                code = r.json().get("error", {}).get("code")
            except ValueError:
                code = None
            if code != "key_not_found":
                return "failed:404-" + str(code)
            if lag_h is None:
                return "wrong:404 without X-Tablecast-Lag"
            applied = max(0, self.ref.end_before(p, seen) - int(lag_h))
            return self.ref.judge_absent(key, applied)
        try:
            body = r.json()
        except ValueError:
            return "wrong:200 with a body that is not JSON"
        if lag_h is None:
            return "wrong:200 without X-Tablecast-Lag"
        applied = self.ref.end_before(p, seen) - int(lag_h)
        return self._settle(lambda: self.ref.judge_value(key, body, applied))
