"""The reference (the table topic, followed by the harness) and the readers checked against it.

Correctness rule for one plain-HTTP answer. Every key read carries
``X-Tablecast-Position`` (``table@partition:P``: the answer is exact with every
record of the partition below offset ``P`` applied and none above), so answers
are judged exactly, once the reference has read the partition up to ``P``:

* ``200 {value, partition, offset}`` is correct iff the record at (partition,
  offset) lies below ``P``, holds the asked key and that value, and is the key's
  last record below ``P``;
* ``404`` is correct iff the key's last record below ``P`` is a tombstone or a
  malformed record (a node keeps those out of answers, as absent), or there is
  none;
* an answer the reference cannot judge yet (it has not read up to ``P``, or to the
  answered offset, 5 s after the answer) is judged after the soak, once the
  reference has read each partition up to the end the broker reports; only then is
  an offset the topic does not hold wrong (the reference is a consumer like the
  nodes', and on this 2-core machine it can trail a node by seconds after a broker
  outage);
* the freshness the answer claims must hold: ``P >= E - lag``, where ``E`` is the
  partition end as the harness saw it ``S + GRACE_S`` before the request was sent
  and ``S`` is the answer's ``X-Tablecast-Staleness-Ms`` (a node claims to have
  been at the end the broker confirmed ``S`` ago, minus ``lag``; ``GRACE_S``
  covers how old a confirmation may be while a node still reports staleness 0,
  and a record's trip to the node). A smaller ``E`` only makes the check easier,
  so it errs on the side of accepting; the largest staleness claimed is reported.

The readers using ``tablecast.Client`` (``Client.read``: the record and the
answer's headers) are judged by the same rule, and so are the SQL readers: a
prepared ``SELECT value, partition, "offset"`` of the key over the PostgreSQL
protocol, then ``SHOW tablecast.position``, ``tablecast.lag`` and
``tablecast.staleness_ms`` in the same pipeline (one round trip), which give the
answer's position, lag and staleness (no row: the 404).

A plain-HTTP or SQL read behaves like a client behind a load balancer: a node that
refuses the connection or drops it without an answer (killed a moment ago) is
skipped for another one, and the skip is counted (``retried``). A node's 503
(no replica it could reach, with Retry-After; SQLSTATE 57P03 over SQL) is retried
on another node too, as
a load balancer told to retry 503s elsewhere does and as ``tablecast.Client``
does; those 503s are counted (``node_503``) and the first ones kept
(``node_503_samples``), so a node that gives up too soon still shows. Anything
else (5xx, timeouts, a connection lost mid-request, a 503 from every node,
every node unreachable) is a failed read, counted by status; it is not wrong,
and it counts against availability.
"""

from __future__ import annotations

import bisect
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

import tablecast as tc
from bench.background import paced
from tablecast.contract.partitioner import partition_for
from tablecast.kafka.config import client_conf
from tablecast.kafka.deafness import DeafCheck, close_in_background, ends_from_a_fresh_client

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
        self.bootstrap = bootstrap
        self.c = self._new_consumer()
        #: when each partition's last record arrived; the consumer replaced when deaf after a
        #: broker restart, as a node's is (tablecast.kafka.deafness), and how often
        self._heard = dict.fromkeys(((topic, p) for p in range(PARTITIONS)), time.monotonic())
        self._deafness = DeafCheck(bootstrap)
        self.renewed = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="reference", daemon=True)

    def _new_consumer(self) -> Consumer:
        return Consumer(
            client_conf(
                self.bootstrap,
                {
                    "group.id": "chaos-reference",
                    "enable.auto.commit": False,
                    "reconnect.backoff.max.ms": 1000,
                    "log_level": 0,
                },
            )
        )

    def _assign(self) -> None:
        self.c.assign(
            [TopicPartition(self.topic, p, self.ends[p] or OFFSET_BEGINNING) for p in self.ends]
        )

    def start(self) -> None:
        self._assign()
        self.thread.start()

    def highs(self) -> dict[int, int]:
        """Each partition's end as the broker reports it now (through a fresh client)."""
        asked = [(self.topic, p) for p in range(PARTITIONS)]
        return {p: hi for (_, p), hi in ends_from_a_fresh_client(self.bootstrap, asked).items()}

    def _renew_if_deaf(self, now: float) -> None:
        ends = self._deafness.confirmed(now, self._heard)
        with self.lock:
            if all(self.ends[p] >= hi for (_, p), hi in ends.items()):
                return  # nothing silent, or nothing to read: silence is right
            old, self.c = self.c, self._new_consumer()
            self._assign()
        self.renewed += 1
        self._deafness.replaced(now)
        close_in_background(old)

    def _run(self) -> None:
        while not self.stopping.is_set():
            msgs = self.c.consume(500, 0.2)
            now = time.monotonic()
            with self.lock:
                for m in msgs:
                    if m.error() is not None:
                        continue
                    self._heard[(self.topic, m.partition())] = now
                    if m.key() is None:
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
            # after the batch is taken in: a new consumer starts past it
            self._renew_if_deaf(now)

    def end_before(self, p: int, t: float) -> int:
        """The partition end the harness had seen at monotonic time `t`."""
        times, ends = self.arrivals[p]
        i = bisect.bisect_right(times, t)
        return ends[i - 1] if i else 0

    def catch_up(self, timeout: float) -> bool:
        """Wait until the reference has read every partition up to the end the broker
        reports now; False if it has not within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                highs: dict[int, int] | None = self.highs()
            except Exception:  # the broker does not answer (yet): ask again
                highs = None
            if highs is not None:
                with self.lock:
                    if all(self.ends[p] >= h for p, h in highs.items()):
                        return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        self._deafness.close()
        self.c.close()

    # judging ---------------------------------------------------------------
    def judge_value(self, key: str, body: dict[str, Any], position: int | None) -> str:
        """'ok', 'pending' (the reference has not read that far) or 'wrong:<why>'."""
        p, o = body.get("partition"), body.get("offset")
        if not isinstance(p, int) or not isinstance(o, int):
            return f"wrong:answer without partition and offset: {body!r}"
        with self.lock:
            if self.ends.get(p, 0) < max(o + 1, position or 0):
                return "pending"
            rec = self.at.get((p, o))
            if rec is None:
                return f"wrong:no record at {p}/{o}"
            k, v = rec
            if k != key:
                return f"wrong:offset {p}/{o} holds key {k!r}"
            if v is MALFORMED:
                return f"wrong:answered the malformed record at {p}/{o}"
            if v != body.get("value"):
                return f"wrong:value {body.get('value')!r} != record {v!r} at {p}/{o}"
            if position is None:
                return "ok"
            if o >= position:
                return f"wrong:record {p}/{o} answered at position {position}"
            last = self._last_below(key, position)
        if last is not None and last.offset != o:
            return (
                f"wrong:stale, {p}/{o} answered but {p}/{last.offset} is below position {position}"
            )
        return "ok"

    def judge_absent(self, key: str, p: int, position: int) -> str:
        with self.lock:
            if self.ends.get(p, 0) < position:
                return "pending"
            last = self._last_below(key, position)
        if last is None or last.value is None or last.value is MALFORMED:
            return "ok"
        return f"wrong:404 at position {position} but {p}/{last.offset} gave it a value"

    def _last_below(self, key: str, position: int) -> Rec | None:
        """The key's last record below `position` (the lock held)."""
        recs = self.by_key.get(key, ())
        i = bisect.bisect_left([r.offset for r in recs], position)
        return recs[i - 1] if i else None


@dataclass
class Deferred:
    """An answer the reference could not judge yet, judged again after the soak."""

    judge: Callable[[], str]
    key: str = ""
    t0: float = 0.0
    who: str = ""


def _number(text: str | None) -> int | None:
    """A SHOWn lag or staleness as a number (None when the read gave none: judged wrong)."""
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


@dataclass
class Tally:
    queries: int = 0
    #: reads made, by the kind of reader: plain HTTP, tablecast.Client, SQL
    by_kind: Counter[str] = field(default_factory=Counter)
    ok: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    #: plain-HTTP reads that met a node they could not connect to and went to the next one
    retried: int = 0
    #: plain-HTTP reads a node answered 503 and another node was asked
    node_503: int = 0
    node_503_samples: list[str] = field(default_factory=list)
    #: the largest staleness an answer judged by it claimed (ms)
    max_staleness_ms: int = 0
    wrong: list[str] = field(default_factory=list)
    #: answers judged only after the soak: the reference had not read that far in 5 s
    deferred: int = 0
    #: the failed reads, each with when, where and what the node said
    failures: list[str] = field(default_factory=list)
    #: (monotonic time, partition, answered)
    timeline: list[tuple[float, int, bool]] = field(default_factory=list)


#: an SQL reader's read of a key, prepared, then what its answer's headers say over HTTP
SQL_READ = f'SELECT value, partition, "offset" FROM {TABLE} WHERE key = %s'
SQL_NOTED = ("tablecast.position", "tablecast.lag", "tablecast.staleness_ms")
#: a node's "no replica it could reach" over SQL (HTTP's 503)
SQL_UNAVAILABLE = "57P03"


class Readers:
    """Threads reading random keys through random nodes: a third plain HTTP, a third
    tablecast.Client, a third SQL (when `sql_ports` is given; else HTTP)."""

    def __init__(
        self,
        ref: Reference,
        urls: Any,
        threads: int,
        seed: int,
        t0: float,
        per_second: float | None = None,
        sql_ports: Callable[[], list[int]] | None = None,
    ) -> None:
        self.ref, self.urls = ref, urls  # urls: a callable returning the node URLs now
        self.sql_ports = sql_ports
        #: each thread's reads a second (None: as fast as answers come)
        self.per_second = per_second
        # failures are stamped in seconds since t0, the clock the faults' start_s/end_s use
        self.t0 = t0
        self.n, self.seed = threads, seed
        self.tally = Tally()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.deferred: list[Deferred] = []

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
            elif verdict.startswith("failed:"):
                status = verdict[7:].split(" ", 1)[0]
                tl.failed[status] += 1
                tl.failures.append(f"{t - self.t0:.1f}s {key}: {verdict[7:]}")
            else:
                # stamped with when it was asked, in wall clock and soak time (a deferred
                # answer is recorded after the soak)
                wall = time.localtime(time.time() - (time.monotonic() - t))
                tl.wrong.append(
                    f"{time.strftime('%H:%M:%S', wall)} {t - self.t0:.1f}s {key}: {verdict}"
                )

    def _settle(self, judge: Callable[[], str]) -> str | Deferred:
        # the reference may trail the node by a moment: give it 5 s to read that far,
        # then judge the answer after the soak (judge_deferred)
        deadline = time.monotonic() + 5
        while True:
            v = judge()
            if v != "pending":
                return v
            if time.monotonic() > deadline:
                return Deferred(judge)
            time.sleep(0.1)

    def judge_deferred(self, caught_up: bool) -> None:
        """Judge the answers the reference could not judge during the soak; call it once
        the reference has read the table topic to its end (`caught_up`)."""
        with self.lock:
            deferred, self.deferred = self.deferred, []
        for d in deferred:
            v = d.judge()
            if v == "pending":
                v = "wrong:offset not in the table topic" + (
                    "" if caught_up else " (the reference never caught up with the broker)"
                )
            if v.startswith("wrong:"):
                v += f" ({d.who})"
            self._record(d.key, d.t0, v)

    def _run(self, i: int) -> None:
        rng = random.Random(self.seed * 100 + i)
        kind = ("http", "client", "sql")[i % 3]
        if kind == "sql" and self.sql_ports is None:
            kind = "http"
        http = httpx.Client(timeout=5.0)
        client: tc.Client | None = None
        sql: dict[int, psycopg.Connection[Any]] = {}
        for _ in paced(self.stopping, self.per_second):
            key = f"k{rng.randrange(KEYS):05d}"
            urls = self.urls()
            t0 = time.monotonic()
            try:
                if kind == "sql":
                    port, body, (token, lag, stale) = self._sql_any(sql, rng, key)
                    verdict = self._judge(key, body, _number(lag), _number(stale), token, t0)
                    who = f"SQL on port {port}"
                elif kind == "client":
                    if client is None:
                        client = tc.Client(urls, timeout=5.0)
                    read = client.read(TABLE, key)
                    verdict = self._judge(
                        key, read.record, read.lag, read.staleness_ms, read.position, t0
                    )
                    who = f"tablecast.Client, answered by {read.node}"
                else:
                    url, r = self._get_any(http, rng, urls, key)
                    verdict = self._judge_http(key, r, t0)
                    who = f"asked {url}, answered by {r.headers.get('x-tablecast-node')}"
                if isinstance(verdict, Deferred):
                    verdict.key, verdict.t0, verdict.who = key, t0, who
                    with self.lock:
                        self.deferred.append(verdict)
                        self.tally.deferred += 1
                        self.tally.by_kind[kind] += 1
                    continue
                if verdict.startswith(("wrong:", "failed:")):
                    verdict += f" ({who})"
            except tc.QueryError as e:
                verdict = f"failed:{e.status} {e.message[:200]}"
            except psycopg.Error as e:
                verdict = f"failed:sql-{e.sqlstate or type(e).__name__} {str(e)[:200]}"
            except (httpx.HTTPError, ConnectionError, OSError) as e:
                verdict = f"failed:{type(e).__name__} {str(e)[:200]}"
            except ValueError:
                # tablecast.Client.get raises the JSON error itself on a non-JSON error body
                verdict = "failed:client-non-json-body"
            except Exception as e:  # a reader must outlive any answer
                verdict = f"failed:{type(e).__name__}"
            self._record(key, t0, verdict)
            with self.lock:
                self.tally.by_kind[kind] += 1
        http.close()
        if client is not None:
            client.close()
        for conn in sql.values():
            conn.close()

    def _sql_any(
        self, conns: dict[int, psycopg.Connection[Any]], rng: random.Random, key: str
    ) -> tuple[int, dict[str, Any] | None, list[str]]:
        """Read the key over SQL from a random node (a connection to each kept), the next one
        while a node refuses connections or answers 57P03, as :meth:`_get_any` does."""
        ports = self.sql_ports()  # type: ignore[misc]
        order = rng.sample(ports, len(ports))
        for n, port in enumerate(order):
            last = n == len(order) - 1
            try:
                conn = conns.get(port)
                if conn is None:
                    conn = conns[port] = psycopg.connect(
                        f"host=127.0.0.1 port={port} dbname=tablecast user=chaos "
                        "sslmode=disable connect_timeout=5",
                        autocommit=True,
                    )
                    conn.execute("SET tablecast.timeout_ms = 5000")
                with conn.pipeline():
                    read = conn.execute(SQL_READ, (key,), prepare=True)
                    shows = [conn.execute(f"SHOW {name}") for name in SQL_NOTED]
                row = read.fetchone()
                noted = [c.fetchone()[0] for c in shows]  # type: ignore[index]
            except psycopg.Error as e:
                unavailable = e.sqlstate == SQL_UNAVAILABLE
                # refused, or lost with the node (no SQLSTATE): connect again next time
                lost = e.sqlstate is None and isinstance(e, psycopg.OperationalError)
                gone = conns.get(port)
                if gone is not None and (lost or gone.broken):
                    del conns[port]
                    gone.close()
                if last or not (unavailable or lost):
                    raise
                with self.lock:
                    t = self.tally
                    if unavailable:
                        t.node_503 += 1
                        if len(t.node_503_samples) < 50:
                            at = time.monotonic() - self.t0
                            t.node_503_samples.append(f"{at:.1f}s {key} SQL {port}: {e}")
                    else:
                        t.retried += 1
                continue
            body = None if row is None else {"value": row[0], "partition": row[1], "offset": row[2]}
            return port, body, noted
        raise AssertionError("unreachable")

    def _get_any(
        self, http: httpx.Client, rng: random.Random, urls: list[str], key: str
    ) -> tuple[str, httpx.Response]:
        """GET the key from a random node, the next one while a node refuses connections."""
        order = rng.sample(urls, len(urls))
        for n, url in enumerate(order):
            last = n == len(order) - 1
            try:
                r = http.get(f"{url}/v1/tables/{TABLE}/keys/{quote(key, safe='')}")
            # refused, or the connection dropped without an answer (a node killed under
            # the request): a GET may go to the next node, as a load balancer retries it
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                if last:
                    raise
                with self.lock:
                    self.tally.retried += 1
                continue
            if r.status_code == 503 and not last:
                with self.lock:
                    t = self.tally
                    t.node_503 += 1
                    if len(t.node_503_samples) < 50:
                        at = time.monotonic() - self.t0
                        t.node_503_samples.append(f"{at:.1f}s {key} {url}: {r.text[:200]}")
                continue
            return url, r
        raise AssertionError("unreachable")

    def _judge_http(self, key: str, r: httpx.Response, t0: float) -> str | Deferred:
        if r.status_code not in (200, 404):
            return f"failed:{r.status_code} {r.text[:200]}"
        try:
            body = r.json()
        except ValueError:
            return f"wrong:{r.status_code} with a body that is not JSON"
        if r.status_code == 404:
            code = body.get("error", {}).get("code") if isinstance(body, dict) else None
            if code != "key_not_found":
                return "failed:404-" + str(code)
            body = None
        h = r.headers
        try:
            lag = int(h["x-tablecast-lag"])
            stale_ms = int(h["x-tablecast-staleness-ms"])
        except (KeyError, ValueError) as e:
            return f"wrong:{r.status_code} without a readable lag or staleness: {e!r}"
        return self._judge(key, body, lag, stale_ms, h.get("x-tablecast-position"), t0)

    def _judge(
        self,
        key: str,
        body: dict[str, Any] | None,
        lag: int | None,
        stale_ms: int | None,
        token: str | None,
        t0: float,
    ) -> str | Deferred:
        """One answer (`body` None: 404) by the rule at the top of this module."""
        if lag is None or stale_ms is None or token is None:
            return f"wrong:answer without lag {lag}, staleness {stale_ms} or position {token}"
        try:
            where, _, at = token.rpartition(":")
            position, p = int(at), int(where.rpartition("@")[2])
        except ValueError:
            return f"wrong:unreadable position {token!r}"
        if p != partition_for(key.encode(), PARTITIONS):
            return f"wrong:position {token} of another partition"
        with self.lock:
            self.tally.max_staleness_ms = max(self.tally.max_staleness_ms, stale_ms)
        end = self.ref.end_before(p, t0 - GRACE_S - stale_ms / 1000)
        if position < end - lag:
            return (
                f"wrong:claims lag {lag} and staleness {stale_ms} ms at position {position}, "
                f"but the partition held {end} records by then"
            )
        if body is None:
            return self._settle(lambda: self.ref.judge_absent(key, p, position))
        return self._settle(lambda: self.ref.judge_value(key, body, position))
