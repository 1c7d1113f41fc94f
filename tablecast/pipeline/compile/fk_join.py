"""Table-table foreign-key joins (Kafka Streams' KIP-213) in three per-key steps.

``left.join(right, joiner, foreign_key=f)``: each left row meets the right row whose
key is ``f(key, value)``; the result is keyed by the left key. The two tables are
keyed differently, so, as in Kafka Streams, the join crosses two internal topics:

1. ``fk_subscribe`` (per left key; state: the row's foreign key and a version).
   Each change of a left row gets the next version number and sends a
   *subscription* to ``<app>.repartition.<name>-<i>``, keyed by foreign key:
   the new left value to the new foreign key, and, when the foreign key
   changed, an unsubscribe to the old one (Kafka Streams'
   SubscriptionSendProcessor). A left row whose foreign key is None is sent
   keyed by its own key, flagged, and answered as if no right row matched.
2. ``fk_match`` (per foreign key; state: the right row and its subscribers). It
   reads the subscriptions and, beside them, the right table's topic. A
   subscription is answered with the right row it finds; a right change is
   answered to every subscriber. Answers (*responses*) go to a second topic,
   keyed by left key, carrying the left value they were computed for, the
   subscription's version and a per-foreign-key generation of the right row.
3. ``fk_resolve`` (per left key; state: the newest (version, generation)
   applied). Responses of one left key arrive from several foreign keys'
   groups, in no reliable order; Kafka Streams drops a response whose hash of
   the left value no longer matches the left row. Here a response is applied
   only when its (version, generation) is newer than every one applied, so a
   response for an older left value, or an older right value, never
   overwrites a newer one whatever order they arrive in; the copies a
   restarted query writes again are not newer, so they are dropped too.

Instructions (SubscriptionWrapper.Instruction): a left delete sends DELETE
(answered with a tombstone), a left update PROPAGATE (answered whether a right
row is there or not, so a result that no longer matches is deleted), a new
left row in an inner join IF_MATCHED (answered only if a right row is there),
and the old foreign key of a moved row UNSUBSCRIBE (not answered).
Subscriptions carry record ids: ``fk_match`` drops the copies a restarted
``fk_subscribe`` wrote again (:func:`.keyed.deduplicated`), so a subscriber's
version only grows.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.flow import Flow
from tablecast.pipeline.compile.join import (
    JK,
    LEFT,
    RIGHT,
    SIDE,
    SIDE_I,
    UNION,
    ordered,
    with_join_key,
)
from tablecast.pipeline.compile.keyed import (
    ERR,
    OFF,
    PART,
    RK,
    SEQ,
    SRC,
    TOPIC,
    TS,
    KeyState,
    V,
    by_bucket,
    deduplicated,
    later,
)
from tablecast.pipeline.plan import nodes as plan
from tablecast.pipeline.plan.wire import record_id
from tablecast.serde import Serde

if TYPE_CHECKING:
    from tablecast.pipeline.plan.queries import Step

#: what the subscription and response topics' writers add to the envelope (the headers
#: of a repartition topic; only the subscriptions' record ids are used)
OUT_EXTRA = (env.OLD, env.RID, env.SRC)
WIDTH = len(env.COLUMNS)
#: a subscribe step's rows: the envelope, a through topic's columns, the foreign key
SUBSCRIBE_IN = [*env.COLUMNS, *env.REPARTITION, JK]
FK_I = SUBSCRIBE_IN.index(JK)

# subscription instructions (Kafka Streams' SubscriptionWrapper.Instruction)
UNSUBSCRIBE = 0  # DELETE_KEY_NO_PROPAGATE: the row moved to another foreign key
DELETE = 1  # DELETE_KEY_AND_PROPAGATE: the row is gone, its result too
PROPAGATE = 2  # PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE
IF_MATCHED = 3  # PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE: a new row of an inner join
#: flag: the row's foreign key is None, the subscription is keyed by the left key
NO_FK = 4

_SUB = struct.Struct(">bq")  # instruction, version
_RESP = struct.Struct(">qq")  # version, generation
_LEN = struct.Struct(">i")  # a blob's length, -1 for None


def _blobs(*blobs: bytes | None) -> bytes:
    return b"".join(_LEN.pack(-1) if b is None else _LEN.pack(len(b)) + b for b in blobs)


def _unblobs(data: bytes, at: int, n: int) -> list[bytes | None]:
    out: list[bytes | None] = []
    for _ in range(n):
        (size,) = _LEN.unpack_from(data, at)
        at += 4
        out.append(None if size < 0 else data[at : at + size])
        at += max(size, 0)
    return out


def pack_subscription(instruction: int, version: int, left: bytes | None) -> bytes:
    return _SUB.pack(instruction, version) + _blobs(left)


def unpack_subscription(data: bytes) -> tuple[int, int, bytes | None]:
    instruction, version = _SUB.unpack_from(data)
    return instruction, version, _unblobs(data, _SUB.size, 1)[0]


def pack_response(version: int, gen: int, left: bytes | None, right: bytes | None) -> bytes:
    return _RESP.pack(version, gen) + _blobs(left, right)


def unpack_response(data: bytes) -> tuple[int, int, bytes | None, bytes | None]:
    version, gen = _RESP.unpack_from(data)
    left, right = _unblobs(data, _RESP.size, 2)
    return version, gen, left, right


def _out(
    row: tuple[Any, ...],
    key: bytes,
    value: bytes | None,
    ts: int | None,
    seq: int,
    rid: bytes | None = None,
    src: bytes | None = None,
) -> tuple[Any, ...]:
    """An output row with the coordinates of the row that made it, and the repartition
    topic's columns (no retracted value)."""
    coords = (row[TOPIC], row[PART], row[OFF], seq, ts)
    return (key, value, None, row[RK], row[RK + 1], *coords, None, rid, src)


def _passed(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A bad row on its way to the dead-letter topic, in the output's width."""
    return (*row[:WIDTH], None, None, None)


def _subscription(
    row: tuple[Any, ...],
    lk: bytes,
    fk: bytes | None,
    instruction: int,
    version: int,
    left: bytes | None,
    slot: int,
) -> tuple[Any, ...]:
    """A subscription of left key `lk` to `fk`, with a record id per (left row, slot)."""
    if fk is None:  # keyed by the left key instead, and answered without a right row
        fk, instruction = lk, instruction | NO_FK
    rid = record_id(row[PART], row[OFF], row[SEQ], slot)
    sub = pack_subscription(instruction, version, left)
    return _out(row, fk, sub, row[TS], row[SEQ], rid, lk)


@dataclass(frozen=True)
class Subscribe:
    """Step 1, per left key. State: (foreign key bytes or None, version, row exists). It is
    kept after a delete: versions must keep growing for the resolve step to order them."""

    how: str

    def __call__(self, kb: bytes | None, rows: list[Any], state: KeyState) -> list[Any]:
        fk, version, live = state.get if state.exists else (None, 0, False)
        out: list[tuple[Any, ...]] = []
        for row in rows:
            if row[ERR] is not None:
                out.append(_passed(row))
                continue
            if kb is None:
                continue  # a table source's null key is dead-lettered on read
            value, new_fk = row[V], row[FK_I]
            if value is None and not live:
                continue  # deleting a row that is not there changes nothing
            version += 1
            if value is None:
                out.append(_subscription(row, kb, fk, DELETE, version, None, 1))
                fk, live = None, False
                continue
            if live and fk is not None and fk != new_fk:
                out.append(_subscription(row, kb, fk, UNSUBSCRIBE, version, None, 0))
            # an update must also delete a result its new foreign key no longer matches
            instruction = PROPAGATE if live or self.how == "left" else IF_MATCHED
            out.append(_subscription(row, kb, new_fk, instruction, version, value, 1))
            fk, live = new_fk, True
        if version:
            state.update((fk, version, live))
        return out


@dataclass(frozen=True)
class Match:
    """Step 2, per foreign key, over subscriptions (LEFT) and right table rows (RIGHT).
    State: (right value, its timestamp, generation, {left key: (version, left value,
    left timestamp)}); the generation counts the right row's changes, so responses of
    one subscription are ordered."""

    def __call__(self, jk: bytes | None, rows: list[Any], state: KeyState) -> list[Any]:
        right, rts, gen, subs = state.get if state.exists else (None, None, 0, {})
        subs = dict(subs)
        out: list[tuple[Any, ...]] = []

        def respond(row: tuple[Any, ...], lk: bytes, sub: tuple[int, Any, Any], g: int) -> None:
            """Answer `sub` with the right row (generation 0: a row without foreign key,
            answered without one)."""
            v, left, lts = sub
            r, ts = (right, later(lts, rts)) if g else (None, lts)
            out.append(_out(row, lk, pack_response(v, g, left, r), ts, len(out)))

        for row in ordered(rows, table_first=False):
            if row[ERR] is not None:
                out.append(_passed(row))
                continue
            if row[SIDE_I] == RIGHT:
                right, rts, gen = row[V], row[TS], gen + 1
                for lk in sorted(subs):  # as Kafka Streams' prefix scan: by left key bytes
                    respond(row, lk, subs[lk], gen)
                continue
            instruction, version, left = unpack_subscription(row[V])
            lk = bytes(row[SRC])
            if instruction & NO_FK:  # generation 0: no right row, and nothing stored
                if instruction & ~NO_FK in (PROPAGATE, DELETE):
                    respond(row, lk, (version, left, row[TS]), 0)
                continue
            held = subs.get(lk)
            if held is not None and held[0] >= version:
                continue  # an older subscription than the one held (never, with ids)
            if instruction in (UNSUBSCRIBE, DELETE):
                subs.pop(lk, None)
                if instruction == DELETE:
                    respond(row, lk, (version, None, row[TS]), gen)
                continue
            subs[lk] = (version, left, row[TS])
            if instruction == PROPAGATE or right is not None:
                respond(row, lk, subs[lk], gen)
        if jk is not None:
            if right is None and not subs:
                state.remove()
            else:
                state.update((right, rts, gen, subs))
        return out


@dataclass(frozen=True)
class Resolve:
    """Step 3, per left key: the join result of the newest response. State: (version,
    generation) of the newest response applied, and whether the key has a result (a
    tombstone is written only for a result that exists)."""

    joiner: Callable[[Any, Any], Any]
    how: str
    left_value: Serde
    right_value: Serde
    result: Serde

    def __call__(self, kb: bytes | None, rows: list[Any], state: KeyState) -> list[Any]:
        newest, has_result = state.get if state.exists else ((-1, -1), False)
        out: list[tuple[Any, ...]] = []
        responses = []
        for row in rows:
            if row[ERR] is not None:
                out.append(row[:WIDTH])
            elif kb is not None and row[V] is not None:
                responses.append((unpack_response(row[V]), row))
        # stable: equal (version, generation) are copies, kept in arrival order
        responses.sort(key=lambda r: r[0][:2])
        for (version, gen, left, right), row in responses:
            if (version, gen) <= newest:
                continue  # for an older left or right value than one applied, or a copy
            newest = (version, gen)
            try:
                enc = self.joined(left, right)
            except Exception as e:  # dead-lettered; the result keeps its last value
                why = f"join: {type(e).__name__}: {e}"[:1000]
                out.append((kb, left, why, kb, left, *row[TOPIC : TS + 1]))
                continue
            if enc is None and not has_result:
                continue
            has_result = enc is not None
            out.append((kb, enc, None, *row[RK : TS + 1]))
        if kb is not None and newest[0] >= 0:
            state.update((newest, has_result))
        return out

    def joined(self, left: bytes | None, right: bytes | None) -> bytes | None:
        if left is None or (right is None and self.how == "inner"):
            return None
        rv = None if right is None else self.right_value.deserialize(right)
        value = self.joiner(self.left_value.deserialize(left), rv)
        return None if value is None else self.result.serialize(value)


# -- Spark ---------------------------------------------------------------------
def subscribe(flow: Flow, step: Step, buckets: int, extra: tuple[str, ...]) -> Flow:
    """Step 1 on `flow` (the left table): subscriptions keyed by foreign key (in the right
    table's key serde, so they meet its rows byte for byte)."""
    node = step.node
    assert isinstance(node, plan.Join) and node.foreign_key is not None
    through = env.BATCH in extra
    fk = with_join_key(flow, node.foreign_key, node.other.key_serde(), extra if through else ())
    df = fk.df
    if not through:
        df = df.withColumns(_nulls())
    core: Any = Subscribe(node.how)
    if through:  # a repartition() before: drop the copies a restarted writer wrote
        core = deduplicated(core, keep_width=True)
    out = by_bucket(df.select(*SUBSCRIBE_IN), core, buckets, *OUT_EXTRA)
    return Flow(out, step.key, step.value, step.kind)


def match(flow: Flow, table: Flow, step: Step, buckets: int) -> Flow:
    """Step 2: `flow` is the subscriptions (read with their record ids), `table` the right
    table; responses keyed by left key."""
    subs = flow.envelope(*env.REPARTITION).df.withColumns({JK: F.col("key"), SIDE: F.lit(LEFT)})
    right = table.envelope().df.withColumns({**_nulls(), JK: F.col("key"), SIDE: F.lit(RIGHT)})
    union = subs.select(*UNION).unionByName(right.select(*UNION))
    core = deduplicated(Match(), keep_width=True)
    out = by_bucket(union, core, buckets, *OUT_EXTRA, key=JK)
    return Flow(out, step.key, step.value, step.kind)


def resolve(flow: Flow, step: Step, buckets: int) -> Flow:
    """Step 3: `flow` is the responses; the join's result table, keyed by left key."""
    node = step.node
    assert isinstance(node, plan.Join) and node.parent is not None
    left, right = node.parent.value_serde(), node.other.value_serde()
    core = Resolve(node.joiner, node.how, left, right, step.value)
    out = by_bucket(flow.envelope().df, core, buckets)
    return Flow(out, step.key, step.value, step.kind)


def _nulls() -> dict[str, Any]:
    """A repartition topic's columns, null (rows not read from one)."""
    return {c: F.lit(None).cast(env.schema(c)[c].dataType) for c in env.REPARTITION}
