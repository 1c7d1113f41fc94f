"""The user-facing stream and table handles.

Each method returns a new handle on a new plan node; nothing runs until
``App.run()``. Operators take a PySpark ``Column`` over ``key``/``value`` or a
Python callable ``f(key, value)``. Where an operator returns a record, the
Column form is a pair ``(key_column, value_column)`` or a struct column with
fields ``key`` and ``value``. Optional ``key=``/``value=`` serdes say how a
changed key or value is written; by default the input's serde is kept.
A joiner is a callable ``joiner(left, right)`` or a Column over columns ``left`` and
``right`` (evaluated by Spark once the join has paired the values); the functions
folded into an aggregate are callables only (the fold runs over Python state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tablecast.pipeline.dsl import views
from tablecast.pipeline.plan import nodes as plan
from tablecast.serde import Serde
from tablecast.windows import JoinWindows, SessionWindows, Windows, to_ms

if TYPE_CHECKING:
    from pyspark.sql import Column


class App(Protocol):
    """What a handle needs of its App (``tablecast.pipeline.app.App`` is one): where
    materialize() and to() register the outputs that run() computes."""

    id: str

    def _register(self, node: plan.Materialize) -> None: ...

    def _register_sink(self, node: plan.To) -> None: ...


class ValueState(Protocol):
    """The `state` argument of a transform_values function: one key's own value."""

    def get(self, default: Any = None) -> Any: ...

    def set(self, value: Any) -> None: ...


class _Handle:
    def __init__(self, app: App, node: plan.Node) -> None:
        self._app = app
        self._node = node

    @property
    def node(self) -> plan.Node:
        return self._node

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {' -> '.join(n.describe() for n in self._node.lineage())}>"

    def _op(self, name: str, fn: plan.Fn, key: Serde | None = None, value: Serde | None = None):  # type: ignore[no-untyped-def]
        _check_fn(name, fn)
        return type(self)(self._app, plan.Op(self._node, fn, key, value, name))


class Stream(_Handle):
    """A record stream: each record is an event."""

    def filter(self, predicate: plan.Fn) -> Stream:
        return self._op("filter", predicate)

    def map_values(self, fn: plan.Fn, value: Serde | None = None) -> Stream:
        return self._op("map_values", fn, value=value)

    def map(self, fn: plan.Fn, key: Serde | None = None, value: Serde | None = None) -> Stream:
        """fn(key, value) -> (new_key, new_value)."""
        return self._op("map", fn, key, value)

    def flat_map_values(self, fn: plan.Fn, value: Serde | None = None) -> Stream:
        """fn(key, value) -> an iterable of new values (a Column: an array)."""
        return self._op("flat_map_values", fn, value=value)

    def flat_map(self, fn: plan.Fn, key: Serde | None = None, value: Serde | None = None) -> Stream:
        """fn(key, value) -> an iterable of (key, value) (a Column: array of struct key, value)."""
        return self._op("flat_map", fn, key, value)

    def select_key(self, fn: plan.Fn, key: Serde | None = None) -> Stream:
        return self._op("select_key", fn, key=key)

    def peek(self, fn: Callable[[Any, Any], Any]) -> Stream:
        """Call fn(key, value) for its side effect (in a Python worker); records pass unchanged."""
        if plan.is_column(fn):
            raise TypeError("peek: a Column has no side effect; pass a Python callable")
        return self._op("peek", fn)

    def to(
        self,
        topic: str,
        key: Serde | None = None,
        value: Serde | None = None,
        partitioner: plan.Fn | None = None,
    ) -> None:
        """Write the stream to `topic` (at-least-once). `partitioner(key, value, partitions)`
        returns a partition number; by default murmur2 of the key, as Kafka's Java producer."""
        if partitioner is not None:
            _check_fn("to", partitioner)
        self._app._register_sink(plan.To(self._node, topic, key, value, partitioner))

    def transform_values(
        self, fn: Callable[[Any, Any, ValueState], Any], value: Serde | None = None
    ) -> Stream:
        """fn(key, value, state) -> the new value (None: a record with a None value).

        `state.get(default=None)` / `state.set(v)` read and write the key's own state,
        kept in Spark's state store across micro-batches and restarts. States are
        stored as JSON, so they must be JSON-able; `state.set(None)` forgets the key's
        state. A record whose fn raises goes to the dead-letter topic and leaves the
        state as it was; a record without a key has no state and goes there too."""
        if plan.is_column(fn):
            # a Column has no per-key state: the stateless form of this is map_values
            raise TypeError(
                "transform_values: a Column cannot keep per-key state; for a stateless "
                "Column over key/value use map_values(col)"
            )
        _check_callable("transform_values", fn)
        return Stream(self._app, plan.TransformValues(self._node, fn, value))

    def repartition(
        self, partitions: int | None = None, partitioner: plan.Fn | None = None
    ) -> Stream:
        """Send the stream through the internal topic `<app>.repartition.<output>-<i>`,
        keyed by its current key, with `partitions` partitions (default: the source's).
        `partitioner(key, value, partitions)` places each record, as in to(); by default
        murmur2 of the key. Operators after it read the topic back; its records carry ids, so
        a per-key step after it drops the copies a restarted query wrote again."""
        if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
            raise ValueError(f"repartition: partitions must be a positive int, not {partitions!r}")
        if partitioner is not None:
            _check_fn("repartition", partitioner)
        return Stream(self._app, plan.Repartition(self._node, partitions, partitioner))

    def join(
        self,
        other: Table | GlobalTable | Stream,
        joiner: Callable[[Any, Any], Any],
        key: plan.Fn | None = None,
        how: Literal["inner", "left", "outer"] = "inner",
        value: Serde | None = None,
        window: JoinWindows | None = None,
    ) -> Stream:
        """With a table: each record meets the table's latest value for its key at
        processing time: `joiner(stream_value, table_value)` is the new value (JSON unless
        `value=`). `key(k, v)` picks the table key (default: the record's key). An inner
        join drops records without a match; a left join calls joiner(value, None) for
        them. Records with a None value are ignored, as in Kafka Streams.

        With a stream and `window=tc.windows.join(before, after, grace)` (Kafka Streams'
        KStream-KStream join): records with the same key meet when
        ``this.ts - before <= other.ts <= this.ts + after``, each pair once, as
        `joiner(this_value, other_value)` with the later timestamp of the two. A left
        join also writes `joiner(value, None)` once for a record of this stream that met
        nothing by the time its window closed (stream time past ts + after + grace); an
        outer join does so for both sides (`joiner(None, other_value)`). Records without
        key or value are ignored; a record later than its window's grace goes to the
        dead-letter topic.

        `joiner` may be a Column over columns `left` and `right` (each side's value,
        decoded: JSON is a VARIANT; a missing side is null), which Spark evaluates after
        the join step has paired the values."""
        if isinstance(other, Stream):
            return self._join_stream(other, joiner, key, how, value, window)
        if not isinstance(other, Table | GlobalTable):
            raise TypeError("Stream.join: expected a Table, a GlobalTable or a Stream")
        if window is not None:
            raise ValueError("Stream.join: window= is for stream-stream joins, not a table")
        if how not in ("inner", "left"):
            raise ValueError(f"Stream.join: how must be 'inner' or 'left', not {how!r}")
        _check_joiner(joiner)
        if key is not None:
            _check_fn("join", key)
        node = plan.Join(self._node, other.node, joiner, key, how, value)
        return Stream(self._app, node)

    def _join_stream(
        self,
        other: Stream,
        joiner: Callable[[Any, Any], Any],
        key: plan.Fn | None,
        how: str,
        value: Serde | None,
        window: JoinWindows | None,
    ) -> Stream:
        if window is None:
            raise ValueError(
                "Stream.join: joining a stream needs window=tc.windows.join(before, after, grace)"
            )
        if not isinstance(window, JoinWindows):
            raise TypeError("Stream.join: window= takes tc.windows.join(...)")
        if key is not None:
            # Kafka Streams joins streams on their keys: select_key() first to re-key one
            raise ValueError("Stream.join: key= is for table joins; select_key() a stream first")
        if how not in ("inner", "left", "outer"):
            raise ValueError(f"Stream.join: how must be 'inner', 'left' or 'outer', not {how!r}")
        if other.node.key_serde().spec() != self._node.key_serde().spec():
            raise TypeError(
                "Stream.join: both streams need the same key serde "
                f"({self._node.key_serde()!r} vs {other.node.key_serde()!r})"
            )
        _check_joiner(joiner)
        node = plan.Join(self._node, other.node, joiner, None, how, value, window)  # type: ignore[arg-type]
        return Stream(self._app, node)

    def split(
        self,
        by: Mapping[str, plan.Fn] | plan.Fn,
        names: Iterable[str] | None = None,
        default: str | None = None,
    ) -> dict[str, Stream]:
        """Named branches of the stream (Kafka Streams' split().branch(...)).

        `by` is either a dict {name: predicate}, each record going to the first branch
        whose predicate it matches, or a function f(key, value) -> the name of the
        record's branch, among `names`. Records of no branch go to the `default` branch
        if one is named, else nowhere. Predicates (or f) are all Columns or all Python
        callables; each branch evaluates them itself (a raising one dead-letters the
        record once per branch)."""
        if isinstance(by, Mapping):
            preds = list(by.items())
            if not preds:
                raise ValueError("split: no branch")
            for name, pred in preds:
                _check_fn(f"split branch {name!r}", pred)
            columns = {plan.is_column(p) for _, p in preds}
            if len(columns) > 1:
                raise TypeError("split: predicates are all Columns or all Python callables")
            picks = [(name, _first_match(preds, i)) for i, (name, _) in enumerate(preds)]
            if default is not None:
                picks.append((default, _first_match(preds, len(preds))))
        else:
            _check_fn("split", by)
            if names is None:
                raise ValueError("split(by=f): name the branches f returns (names=[...])")
            declared = list(names)
            picks = [(n, _named(by, [n], inside=True)) for n in declared]
            if default is not None:
                picks.append((default, _named(by, declared, inside=False)))
        out = {name: self.filter(pred) for name, pred in picks}
        if len(out) != len(picks):
            raise ValueError("split: branch names must differ")
        return out

    def merge(self, *others: Stream) -> Stream:
        """One stream of this one's records and the others' (Kafka Streams' merge): they
        meet in the internal topic ``<app>.merge.<output>-<i>``, each input keeping its own
        order per key. All need the same key and value serdes."""
        if not others:
            return self
        for other in others:
            if not isinstance(other, Stream):
                raise TypeError("Stream.merge: expected Streams")
            if (other.node.key_serde().spec(), other.node.value_serde().spec()) != (
                self._node.key_serde().spec(),
                self._node.value_serde().spec(),
            ):
                raise TypeError("Stream.merge: every stream needs the same key and value serdes")
        return Stream(self._app, plan.Merge(self._node, tuple(o.node for o in others)))

    def group_by_key(self) -> GroupedStream:
        return GroupedStream(self._app, plan.GroupBy(self._node))

    def group_by(self, fn: plan.Fn, key: Serde | None = None) -> GroupedStream:
        """Group by a new key fn(key, value); the aggregation re-keys through a Spark shuffle."""
        _check_fn("group_by", fn)
        return GroupedStream(self._app, plan.GroupBy(self._node, fn, key))

    def to_table(self) -> Table:
        """The latest value per key; a None value deletes the key."""
        return Table(self._app, plan.ToTable(self._node))


class GroupedStream(_Handle):
    def windowed_by(
        self, windows: Windows | SessionWindows, grace: timedelta | str = timedelta(0)
    ) -> WindowedGroupedStream:
        """Aggregate per (key, window) on the records' Kafka timestamps (tc.windows.tumbling,
        hopping or session). A window takes records while stream time (the highest timestamp
        seen in its key's partition) is before its end + `grace`; later records go to the
        DLQ. A session takes them while stream time <= its end + `grace`."""
        if not isinstance(windows, Windows | SessionWindows):
            raise TypeError(
                "windowed_by: expected tc.windows.tumbling(...), hopping(...) or session(...)"
            )
        grace_ms = to_ms(grace)
        if grace_ms < 0:
            raise ValueError("windowed_by: grace must not be negative")
        return WindowedGroupedStream(self._app, plan.WindowedBy(self._node, windows, grace_ms))

    def count(self) -> Table:
        return Table(self._app, plan.Aggregate(self._node, "count"))

    def reduce(self, reducer: Callable[[Any, Any], Any], value: Serde | None = None) -> Table:
        """reducer(aggregate, value) -> new aggregate; the first value starts it."""
        _check_callable("reduce", reducer)
        return Table(self._app, plan.Aggregate(self._node, "reduce", None, reducer, value=value))

    def aggregate(
        self,
        initializer: Callable[[], Any] | Column,
        aggregator: Callable[[Any, Any, Any], Any] | None = None,
        value: Serde | None = None,
    ) -> Table:
        """aggregator(key, value, aggregate) -> new aggregate, starting from initializer().

        Or one Spark aggregate function over the decoded `key` and `value` columns, e.g.
        ``aggregate(F.sum(F.variant_get("value", "$.n", "long")), value=tc.serde.long())``:
        Spark computes it (as a count), records without key or value skipped; a null
        result deletes the key. Its input must be read from a topic as is, or through
        Column steps only (a Python step or a repartition before it is refused)."""
        if plan.is_column(initializer) and not isinstance(initializer, tuple):
            if aggregator is not None:
                raise TypeError("aggregate(Column): a Spark aggregate function takes no aggregator")
            node = plan.Aggregate(self._node, "column", value=value, column=initializer)
            return Table(self._app, node)
        if aggregator is None:
            raise TypeError(
                "aggregate: pass initializer and aggregator callables, or one Spark aggregate "
                "function (a Column such as F.sum(...))"
            )
        _check_callable("aggregate", initializer, aggregator)
        node = plan.Aggregate(self._node, "aggregate", initializer, aggregator, value=value)
        return Table(self._app, node)


Cogrouped = tuple[GroupedStream, Callable[[Any, Any, Any], Any]]


class CogroupedStream:
    """Grouped streams cogrouped (Kafka Streams' CogroupedKStream): each keeps its own
    aggregator(key, value, aggregate), all share one aggregate per key.

    Built by ``app.cogroup((grouped_a, aggregator_a), (grouped_b, aggregator_b), ...)``;
    ``.cogroup(grouped_c, aggregator_c)`` adds another input, ``.aggregate(initializer)``
    makes the table."""

    def __init__(self, app: App, inputs: tuple[Cogrouped, ...]) -> None:
        self._app = app
        self._inputs = _checked_cogroup(app, inputs)

    def __repr__(self) -> str:
        shown = ", ".join(f"({g!r}, {plan.fn_name(f)})" for g, f in self._inputs)
        return f"<CogroupedStream {shown}>"

    def cogroup(
        self, grouped: GroupedStream, aggregator: Callable[[Any, Any, Any], Any]
    ) -> CogroupedStream:
        """These inputs and `grouped` with its own aggregator (Kafka Streams' chained form)."""
        return CogroupedStream(self._app, (*self._inputs, (grouped, aggregator)))

    def aggregate(self, initializer: Callable[[], Any], value: Serde | None = None) -> Table:
        """The table of one aggregate per key: a record of input i (key and value not None)
        makes it ``aggregator_i(key, value, aggregate)``, from initializer() when the key
        has none; a None result deletes the key, and its next record starts over from
        initializer(). Values are JSON unless `value=`. Records of all inputs are taken in
        the order described in the user guide ("Cogrouping")."""
        _check_callable("cogroup aggregate", initializer)
        first, *rest = self._inputs
        node = plan.Cogroup(
            first[0].node,
            others=tuple(g.node for g, _ in rest),  # type: ignore[misc]
            aggregators=tuple(f for _, f in self._inputs),
            initializer=initializer,
            value=value,
        )
        return Table(self._app, node)

    def windowed_by(
        self, windows: Windows | SessionWindows, grace: timedelta | str = timedelta(0)
    ) -> WindowedCogroupedStream:
        """Aggregate per (key, window) on the records' Kafka timestamps
        (tc.windows.tumbling, hopping or session), as grouped_stream.windowed_by; stream
        time is the task's over all inputs, and all inputs share one store of windows or
        sessions (a session's aggregate then needs merger=)."""
        if not isinstance(windows, Windows | SessionWindows):
            raise TypeError(
                "windowed_by: expected tc.windows.tumbling(...), hopping(...) or session(...)"
            )
        grace_ms = to_ms(grace)
        if grace_ms < 0:
            raise ValueError("windowed_by: grace must not be negative")
        return WindowedCogroupedStream(self._app, self._inputs, windows, grace_ms)


class WindowedCogroupedStream:
    """Cogrouped streams cut into time windows or sessions: the aggregate is a window
    table (Kafka Streams' TimeWindowedCogroupedKStream / SessionWindowedCogroupedKStream)."""

    def __init__(
        self,
        app: App,
        inputs: tuple[Cogrouped, ...],
        windows: Windows | SessionWindows,
        grace_ms: int,
    ) -> None:
        self._app = app
        self._inputs = inputs
        self._windows = windows
        self._grace_ms = grace_ms

    def aggregate(
        self,
        initializer: Callable[[], Any],
        value: Serde | None = None,
        emit: Emit = "changes",
        merger: Callable[[Any, Any, Any], Any] | None = None,
    ) -> WindowedTable:
        """Each window's aggregate, from initializer(), updated by every input's records
        through its aggregator; `emit` as for a grouped stream's windows. Session windows
        need merger(key, agg1, agg2) -> the aggregate of two sessions a record bridges."""
        _check_callable("cogroup aggregate", initializer)
        _check_merger("cogroup aggregate", isinstance(self._windows, SessionWindows), merger)
        first, *rest = self._inputs
        window = plan.WindowedBy(first[0].node, self._windows, self._grace_ms)
        node = plan.Cogroup(
            first[0].node,
            others=tuple(g.node for g, _ in rest),  # type: ignore[misc]
            aggregators=tuple(f for _, f in self._inputs),
            initializer=initializer,
            value=value,
            window=window,
            emit=_emit(emit),
            merger=merger,
        )
        return WindowedTable(self._app, node)


def _checked_cogroup(app: App, inputs: tuple[Any, ...]) -> tuple[Cogrouped, ...]:
    """Kafka Streams' rules: grouped streams (not tables, not windowed: windows come after
    cogroup), each once, one key serde for all, an aggregator each."""
    if not inputs:
        raise TypeError("cogroup: pass (grouped_stream, aggregator) pairs, at least one")
    out: list[Cogrouped] = []
    for pair in inputs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise TypeError(
                "cogroup: each input is a pair (grouped_stream, aggregator(key, value, agg)), "
                f"not {type(pair).__name__}"
            )
        grouped, aggregator = pair
        if isinstance(grouped, GroupedTable):
            raise TypeError(
                "cogroup: a grouped table cannot be cogrouped (Kafka Streams cogroups "
                "KGroupedStreams only: a table's changes need subtractors); use "
                "table.to_stream().group_by_key() to aggregate its changes as events"
            )
        if isinstance(grouped, WindowedGroupedStream):
            raise TypeError(
                "cogroup: cogroup grouped streams, not windowed ones (Kafka Streams windows "
                "the cogrouped stream: cogroup(...).windowed_by(...))"
            )
        if not isinstance(grouped, GroupedStream):
            raise TypeError(
                "cogroup: expected a grouped stream (stream.group_by_key() or group_by(f)), "
                f"not {type(grouped).__name__}"
            )
        if grouped._app is not app:
            raise ValueError("cogroup: every grouped stream must come from this App")
        if any(g.node is grouped.node for g, _ in out):
            raise ValueError("cogroup: a grouped stream is cogrouped once (one aggregator each)")
        _check_callable("cogroup aggregator", aggregator)
        out.append((grouped, aggregator))
    first = out[0][0].node.key_serde().spec()
    if any(g.node.key_serde().spec() != first for g, _ in out):
        shown = ", ".join(repr(g.node.key_serde()) for g, _ in out)
        raise TypeError(f"cogroup: every grouped stream needs the same key serde ({shown})")
    return tuple(out)


class WindowedGroupedStream(_Handle):
    """A grouped stream cut into time windows: its aggregations are window tables.

    ``emit="changes"`` (the default) writes a window's aggregate on every change;
    ``emit="final"`` writes it once, when the window closes (stream time past its end +
    grace), as Kafka Streams' ``suppress(untilWindowCloses(...))`` does."""

    def count(self, emit: Emit = "changes") -> WindowedTable:
        return WindowedTable(self._app, plan.Aggregate(self._node, "count", emit=_emit(emit)))

    def reduce(
        self,
        reducer: Callable[[Any, Any], Any],
        value: Serde | None = None,
        emit: Emit = "changes",
    ) -> WindowedTable:
        """reducer(aggregate, value) -> new aggregate; a window's first value starts it."""
        _check_callable("reduce", reducer)
        node = plan.Aggregate(self._node, "reduce", None, reducer, value=value, emit=_emit(emit))
        return WindowedTable(self._app, node)

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        value: Serde | None = None,
        emit: Emit = "changes",
        merger: Callable[[Any, Any, Any], Any] | None = None,
    ) -> WindowedTable:
        """aggregator(key, value, aggregate) -> new aggregate, each window from initializer().
        Session windows need merger(key, agg1, agg2) -> the aggregate of two sessions that a
        record bridges (Kafka Streams' Merger); time windows refuse one."""
        _check_callable("aggregate", initializer, aggregator)
        _check_merger("aggregate", self._sessions(), merger)
        node = plan.Aggregate(
            self._node,
            "aggregate",
            initializer,
            aggregator,
            value=value,
            emit=_emit(emit),
            merger=merger,
        )
        return WindowedTable(self._app, node)

    def _sessions(self) -> bool:
        assert isinstance(self._node, plan.WindowedBy)
        return isinstance(self._node.windows, SessionWindows)


Emit = Literal["changes", "final"]


def _emit(emit: str) -> Emit:
    if emit not in ("changes", "final"):
        raise ValueError(f"emit is 'changes' or 'final', not {emit!r}")
    return emit  # type: ignore[return-value]


class WindowedTable(_Handle):
    """A table keyed by (key, window start): its records' keys are the key's bytes and the
    window start as 8 bytes big-endian (Kafka Streams' windowed key format); a session
    table's keys carry the session's start, then its end (8 bytes each)."""

    def materialize(
        self,
        name: str,
        store: Literal["rocksdb", "memory"] = "rocksdb",
        history: timedelta | None = None,
        indexes: views.Indexes | None = None,
    ) -> WindowedTable:
        """Make this window table queryable under `name` (GET .../keys/{key}/windows).
        `history` and `indexes` are refused: they are for key-value tables."""
        if store not in ("rocksdb", "memory"):
            raise ValueError(f"store must be 'rocksdb' or 'memory', not {store!r}")
        views.refuse_on_windows(history, indexes)
        node = plan.Materialize(self._node, name, store)
        self._app._register(node)
        return WindowedTable(self._app, node)


class Table(_Handle):
    """A changelog: each record is an upsert of its key; a None value deletes it."""

    def filter(self, predicate: plan.Fn) -> Table:
        """Rows that do not match (or stop matching) are deleted downstream."""
        return self._op("filter", predicate)

    def map_values(self, fn: plan.Fn, value: Serde | None = None) -> Table:
        return self._op("map_values", fn, value=value)

    def group_by(
        self, fn: plan.Fn, key: Serde | None = None, value: Serde | None = None
    ) -> GroupedTable:
        """fn(key, value) -> (new_key, new_value); a None result (or key) contributes nothing."""
        _check_fn("group_by", fn)
        return GroupedTable(self._app, plan.GroupBy(self._node, fn, key, value))

    def join(
        self,
        other: Table,
        joiner: Callable[[Any, Any], Any],
        how: Literal["inner", "left", "outer"] = "inner",
        value: Serde | None = None,
        foreign_key: plan.Fn | None = None,
    ) -> Table:
        """Join on the key: `joiner(left, right)` is the key's value (JSON unless `value=`)
        while both tables hold the key (inner), while this one does (left: right may be
        None), or while either does (outer: either may be None). An update on either side
        re-emits; a key that stops matching is deleted (KTable-KTable joins). `joiner` may
        be a Column over `left` and `right`, as for Stream.join.

        With `foreign_key=f` (Kafka Streams' foreign-key join, KIP-213), each row of this
        table meets the row of `other` whose key is ``f(key, value)`` (a Python callable
        or a Column over key/value), and the result is keyed by this table's key. Inner:
        a result while that row exists; left: also ``joiner(value, None)`` without one,
        a None foreign key included. A change of this row (its foreign key too) or of the
        matching row re-emits; a result that stops matching is deleted. Internally the
        join crosses two repartition topics. Promised: once both tables stop changing and
        the queries catch up, the result table is Kafka Streams' (kill -9 included);
        every result is joiner(a value this row had, the other row's value when it was
        matched); a result is never overtaken by one for an older value of either row
        (a version per change of this row, a generation per change of the other, where
        Kafka Streams compares a hash of the left value). In between, a result for a
        just-replaced value may be written before the newer one (Kafka Streams drops it
        if its left store already changed), and keys without a result get no tombstone
        (docs/user-guide.md, "Foreign-key table joins")."""
        if not isinstance(other, Table):
            raise TypeError("Table.join: expected a Table (a global table joins streams only)")
        if foreign_key is not None:
            return self._join_foreign_key(other, joiner, how, value, foreign_key)
        if how not in ("inner", "left", "outer"):
            raise ValueError(f"Table.join: how must be 'inner', 'left' or 'outer', not {how!r}")
        if other.node.key_serde().spec() != self._node.key_serde().spec():
            raise TypeError(
                "Table.join: both tables need the same key serde "
                f"({self._node.key_serde()!r} vs {other.node.key_serde()!r})"
            )
        _check_joiner(joiner)
        node = plan.Join(self._node, other.node, joiner, how=how, value=value)
        return Table(self._app, node)

    def _join_foreign_key(
        self,
        other: Table,
        joiner: Callable[[Any, Any], Any],
        how: str,
        value: Serde | None,
        foreign_key: plan.Fn,
    ) -> Table:
        if how not in ("inner", "left"):
            raise ValueError(
                "Table.join: a foreign-key join is 'inner' or 'left' (as Kafka Streams' "
                f"KIP-213 join), not {how!r}"
            )
        if isinstance(foreign_key, tuple) or not (
            plan.is_column(foreign_key) or callable(foreign_key)
        ):
            raise TypeError("Table.join: foreign_key is a Column or a callable f(key, value)")
        if plan.is_column(joiner):
            # the result is computed where the answer meets the left row, in Python state
            raise TypeError(
                "Table.join: a foreign-key join's joiner is a Python callable (a Column "
                "joiner works for joins on the key); a map_values(col) after the join can "
                "reshape the result"
            )
        _check_callable("join", joiner)
        node = plan.Join(
            self._node, other.node, joiner, how=how, value=value, foreign_key=foreign_key
        )  # type: ignore[arg-type]
        return Table(self._app, node)

    def to_stream(self) -> Stream:
        return Stream(self._app, plan.ToStream(self._node))

    def materialize(
        self,
        name: str,
        store: Literal["rocksdb", "memory"] = "rocksdb",
        history: timedelta | None = None,
        indexes: views.Indexes | None = None,
    ) -> Table:
        """Make this table queryable under `name` and return it.

        `history` keeps every version of a key for that long, by record timestamp (the
        event time), for ``?as_of=`` and ``/history`` reads. `indexes` ({name: f}) gives
        each row values to be found by (``/index/{name}/{value}``): f is a Python
        callable f(key, value) or a Column over key/value, returning a string, an int,
        a finite float, a list of them, or None (no value). A callable that raises or a
        value the contract refuses (a bool, NaN, a dict, ...) sends the record to the
        dead-letter topic, as any failing operator does."""
        if store not in ("rocksdb", "memory"):
            raise ValueError(f"store must be 'rocksdb' or 'memory', not {store!r}")
        history_ms, idx = views.checked(history, indexes)
        node = plan.Materialize(self._node, name, store, history_ms=history_ms, indexes=idx)
        self._app._register(node)
        return Table(self._app, node)


class GlobalTable(_Handle):
    """A table every serving node holds whole, joined by streams without co-partitioning
    (Kafka Streams' GlobalKTable). It has no operators; ``materialize(name)`` makes it
    queryable, with every node answering every key locally."""

    def materialize(
        self,
        name: str,
        store: Literal["rocksdb", "memory"] = "rocksdb",
        history: timedelta | None = None,
        indexes: views.Indexes | None = None,
    ) -> GlobalTable:
        """As Table.materialize (history and indexes too), every node holding all of it."""
        if store not in ("rocksdb", "memory"):
            raise ValueError(f"store must be 'rocksdb' or 'memory', not {store!r}")
        history_ms, idx = views.checked(history, indexes)
        node = plan.Materialize(self._node, name, store, history_ms=history_ms, indexes=idx)
        self._app._register(node)
        return GlobalTable(self._app, node)


class GroupedTable(_Handle):
    """A table re-keyed by group_by: aggregations retract a row's old contribution."""

    def count(self) -> Table:
        return Table(self._app, plan.Aggregate(self._node, "count"))

    def reduce(
        self,
        adder: Callable[[Any, Any], Any] | Column,
        subtractor: Callable[[Any, Any], Any] | Column,
        value: Serde | None = None,
    ) -> Table:
        """adder(aggregate, value) / subtractor(aggregate, value) -> new aggregate.

        Or two Columns over columns ``aggregate`` and ``value`` (and ``key``, the group key),
        e.g. ``reduce(F.col("aggregate") + F.col("value"), F.col("aggregate") - F.col("value"))``:
        Spark folds them in the JVM (transformWithState), so with a Column selection in
        ``group_by`` the whole aggregation runs without Python, and in Real-time Mode."""
        if not _columns("reduce", adder, subtractor):
            _check_callable("reduce", adder, subtractor)
        node = plan.Aggregate(self._node, "reduce", None, adder, subtractor, value)
        return Table(self._app, node)

    def aggregate(
        self,
        initializer: Callable[[], Any] | Column,
        adder: Callable[[Any, Any, Any], Any] | Column,
        subtractor: Callable[[Any, Any, Any], Any] | Column,
        value: Serde | None = None,
    ) -> Table:
        """adder/subtractor(key, value, aggregate) -> new aggregate.

        Or three Columns: the initializer (``F.lit(0)``), then adder and subtractor over
        columns ``key``, ``value`` and ``aggregate``, folded by Spark in the JVM (see
        :meth:`reduce`); the aggregate has the initializer's type."""
        if not _columns("aggregate", initializer, adder, subtractor):
            _check_callable("aggregate", initializer, adder, subtractor)
        node = plan.Aggregate(self._node, "aggregate", initializer, adder, subtractor, value)
        return Table(self._app, node)


def _first_match(preds: list[tuple[str, plan.Fn]], i: int) -> plan.Fn:
    """Matches records whose first matching predicate is the `i`-th (i = len: none)."""
    earlier = [p for _, p in preds[:i]]
    mine = preds[i][1] if i < len(preds) else None
    if plan.is_column(preds[0][1]):
        from pyspark.sql import functions as F

        cond = F.lit(True) if mine is None else F.coalesce(mine, F.lit(False))
        for p in earlier:
            cond = cond & ~F.coalesce(p, F.lit(False))
        return cond

    def first(k: Any, v: Any) -> bool:
        if any(p(k, v) for p in earlier):  # type: ignore[operator]
            return False
        return True if mine is None else bool(mine(k, v))  # type: ignore[operator]

    # what explain shows for the branch's filter
    first.__qualname__ = f"split branch {preds[i][0] if mine is not None else 'default'}"
    return first


def _named(by: plan.Fn, names: list[str], inside: bool) -> plan.Fn:
    """Matches records whose branch name `by` gives is (`inside`) or is not among `names`."""
    if plan.is_column(by):
        from pyspark.sql import functions as F

        col = by if not isinstance(by, tuple) else by[0]
        hit = F.coalesce(col.isin(*names), F.lit(False))
        return hit if inside else ~hit

    def named(k: Any, v: Any) -> bool:
        return (by(k, v) in names) == inside  # type: ignore[operator]

    what = names[0] if inside and len(names) == 1 else f"{'' if inside else 'not '}in {names}"
    named.__qualname__ = f"split branch {plan.fn_name(by)} {what}"
    return named


def _check_fn(op: str, fn: Any) -> None:
    if not (plan.is_column(fn) or callable(fn)):
        raise TypeError(f"{op}: expected a pyspark Column or a callable, not {type(fn).__name__}")


def _check_callable(op: str, *fns: Any) -> None:
    for fn in fns:
        if plan.is_column(fn):
            # the aggregate lives in Python state, folded record by record in a Python
            # worker: a JVM expression cannot run inside that fold
            raise TypeError(
                f"{op}: a Column cannot be evaluated inside the fold over Python state; pass "
                "Python callables (a Column may prepare each value first: map_values(col))"
            )
        if not callable(fn):
            raise TypeError(f"{op}: expected Python callables, not {type(fn).__name__}")


def _columns(op: str, *fns: Any) -> bool:
    """Whether a grouped table's functions are all single Columns (none: all callables)."""
    single = [plan.is_column(fn) and not isinstance(fn, tuple) for fn in fns]
    if any(single) and not all(single):
        raise TypeError(f"{op}: pass only Python callables, or only Columns (one each)")
    return all(single)


def _check_merger(op: str, sessions: bool, merger: Any) -> None:
    """Session windows need a merger (Kafka Streams' Merger); time windows never merge."""
    if sessions and merger is None:
        raise TypeError("aggregate over session windows needs merger=f(key, agg1, agg2)")
    if not sessions and merger is not None:
        raise TypeError("merger= is for session windows: time windows never merge")
    if merger is not None:
        _check_callable(f"{op} merger", merger)


def _check_joiner(joiner: Any) -> None:
    """A joiner is a Python callable joiner(left, right) or one Column over columns
    `left` and `right` (each side's value decoded as `value` is for other operators),
    which Spark evaluates once the join has paired the values."""
    if plan.is_column(joiner) and not isinstance(joiner, tuple):
        return
    if plan.is_column(joiner):  # a pair of Columns: a joiner returns a value, not a record
        raise TypeError("join: a Column joiner is one Column over `left` and `right`")
    if not callable(joiner):
        raise TypeError(
            "join: expected a Python callable joiner(left, right) or a Column over "
            f"`left` and `right`, not {type(joiner).__name__}"
        )
