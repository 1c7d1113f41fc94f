"""From plan to queries: where one Spark streaming query ends and the next begins.

Each materialized table (and each ``to(topic)``) is computed by a chain of
queries, each reading one topic and writing one topic. A query holds any run of
stateless operators and at most one stateful step (or the two JVM steps of a
table group_by folded in Columns, see below); the planner cuts the chain:

- at a materialized table met on the way: its table topic is read as the source
  (it already is that table's changelog), so nothing is computed twice;
- at a table ``group_by`` with Python callables: as in Kafka Streams, one
  query keeps each source row's last (group key, group value) and writes a
  retraction of the old one and an addition of the new one to
  ``<app>.repartition.<name>-<i>``, keyed by group key; the next query
  aggregates per group key (applyInPandasWithState). When the fold's functions
  are Columns, both steps are tablecast's JVM transformWithState processors in
  one query, and Spark's shuffle takes the changes to their group key;
- before a second stateful step: the first one's changelog goes through
  ``<app>.changelog.<name>-<i>`` (compacted if it is a table's);
- at a table-table foreign-key join (KIP-213), twice: one query sends each left
  row's subscription, keyed by foreign key, to ``<app>.repartition.<name>-<i>``;
  the next meets them with the right table and sends responses, keyed by left
  key, to the next repartition topic; the third resolves them into the result;
- at a stream's ``repartition()``: the stream goes through
  ``<app>.repartition.<name>-<i>``, keyed by its key and placed by its
  partitioner (Kafka Streams' ``through``); the next query reads it back.

Grouped *stream* aggregations need no topic: Spark's shuffle re-keys them. A
grouped stream's ``count()`` read straight from a topic (no repartition or
changelog topic before it, whose copies it would count twice) is Spark's own
streaming aggregation, which Real-time Mode can run; the rows its input turns
bad are dead-lettered by a stateless companion query on the same input
(``<query>.dlq``), since Real-time Mode allows no union after an aggregation.
Joins neither: a join query reads its left input and, beside it, the other
table's topic (its source topic, its table topic if materialized, or a
changelog topic computed for it), and Spark's shuffle brings both sides of a
join key together (see :mod:`tablecast.pipeline.compile.join`).
The planner is pure Python, so ``tablecast explain`` needs no Spark
(:mod:`tablecast.pipeline.run.explain` puts its queries in words).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Literal, get_args

from tablecast import serde as serdes
from tablecast.pipeline.plan import nodes as plan
from tablecast.pipeline.plan.wire import PairSerde
from tablecast.serde import Serde


def table_topic(app_id: str, table: str) -> str:
    # imported on use: executors import this module to run an App's stateful
    # callables, and tablecast.kafka.topics needs confluent-kafka, which they lack
    from tablecast.kafka.topics import table_topic as name

    return name(app_id, table)


StepKind = Literal[
    "op",
    "select_group",
    "retract",
    "stream_aggregate",
    "spark_aggregate",
    "spark_retract",
    "table_aggregate",
    "spark_table_aggregate",
    "window_aggregate",
    "transform_values",
    "join",
    "stream_join",
    "cogroup",
    "fk_subscribe",
    "fk_match",
    "fk_resolve",
]
#: every step but the stateless ones keeps per-key state in Spark's state store
STATEFUL = tuple(k for k in get_args(StepKind) if k not in ("op", "select_group"))
#: the stateful steps Spark runs in the JVM (its aggregation, or tablecast's transformWithState
#: processors): Real-time Mode can run them
IN_SPARK = ("spark_aggregate", "spark_retract", "spark_table_aggregate")
#: "through": a stream's repartition() topic (plain records, unlike a table
#: group_by's "repartition" topic whose records carry ids for deduplication)
#: "merge": the topic a merge()'s inputs are all written to (by one query each)
Role = Literal["source", "table", "repartition", "through", "merge", "changelog", "sink"]


@dataclass(frozen=True)
class TopicRef:
    topic: str
    key: Serde
    value: Serde
    kind: plan.Kind
    role: Role
    #: a "through" topic whose records carry batch and record ids: its reader keeps
    #: per-key state and drops the copies a restarted writer wrote again
    ids: bool = False

    @property
    def external(self) -> bool:
        """Records written by others: decoded and checked before anything else."""
        return self.role == "source"


@dataclass(frozen=True)
class Step:
    what: StepKind
    node: plan.Node
    key: Serde  # serdes and kind of the rows after this step
    value: Serde
    kind: plan.Kind
    #: a join's other input, read beside the query's own
    side: TopicRef | None = None
    #: a cogroup's other inputs, read beside the query's own (in cogroup() order)
    sides: tuple[TopicRef, ...] = ()

    @property
    def beside(self) -> tuple[TopicRef, ...]:
        """Every topic this step reads beside the query's input."""
        return (self.side, *self.sides) if self.side is not None else self.sides

    @property
    def stateful(self) -> bool:
        return self.what in STATEFUL

    @property
    def python(self) -> bool:
        """A stateless step whose function is a Python callable (it runs in a Python worker)."""
        if self.stateful:
            return False
        fn = getattr(self.node, "fn", None)
        return fn is not None and not plan.is_column(fn)

    @property
    def windowed(self) -> bool:
        """A windowed aggregation (of a grouped stream or a cogroup): per task, by timestamp."""
        if self.what == "window_aggregate":
            return True
        return isinstance(self.node, plan.Cogroup) and self.node.window is not None

    def describe(self) -> str:
        if self.what == "op":
            return self.node.describe()
        if self.what == "select_group":
            return f"{self.node.describe()} [select (group key, group value) per row]"
        if self.what == "retract":
            return (
                "retract [applyInPandasWithState by source key: last selection per row; "
                "Python callables just before it run here, on each row's latest record]"
            )
        if self.what == "spark_retract":
            return "retract [transformWithState by source key: last selection per row]"
        if self.what == "spark_table_aggregate":
            return (
                f"{self.node.describe()} [transformWithState by group key, adds and retracts, "
                "the Columns folded in the JVM]"
            )
        if self.what == "stream_aggregate":
            return f"{self.node.describe()} [applyInPandasWithState by key]"
        if self.what == "spark_aggregate":
            return f"{self.node.describe()} [Spark streaming aggregation by key]"
        if self.what == "transform_values":
            return f"{self.node.describe()} [applyInPandasWithState by key: the key's state]"
        if self.what == "window_aggregate":
            assert isinstance(self.node, plan.Aggregate) and self.node.window is not None
            w = self.node.window.describe()
            return f"{w} {self.node.describe()} [applyInPandasWithState by key's partition]"
        if self.what == "join":
            return f"{self.node.describe()} [applyInPandasWithState by join key, tables in state]"
        if self.what == "fk_subscribe":
            return (
                f"{self.node.describe()} [applyInPandasWithState by key: its foreign key; "
                "subscriptions by foreign key]"
            )
        if self.what == "fk_match":
            return "fk_match [applyInPandasWithState by foreign key: right row, subscribers]"
        if self.what == "fk_resolve":
            return "fk_resolve [applyInPandasWithState by key: newest response joined]"
        if self.what == "stream_join":
            return f"{self.node.describe()} [applyInPandasWithState by key's partition: windows]"
        if self.what == "cogroup" and self.windowed:
            return f"{self.node.describe()} [applyInPandasWithState by key's partition]"
        if self.what == "cogroup":
            return f"{self.node.describe()} [applyInPandasWithState by key: every input's rows]"
        return f"{self.node.describe()} [applyInPandasWithState by group key, adds and retracts]"


@dataclass
class Query:
    name: str
    input: TopicRef
    output: TopicRef
    steps: list[Step] = field(default_factory=list)
    partitioner: plan.Fn | None = None
    #: partitions of the output topic when it is created (None: the source's count)
    partitions: int | None = None
    #: a table's secondary indexes, whose values its records carry in a header
    indexes: tuple[tuple[str, plan.Fn], ...] = ()
    #: writes only the rows its steps mark bad, to the dead-letter topic: the companion
    #: of a query whose Spark aggregation drops them (see :func:`_dead_letters`)
    dead_letters: bool = False

    @property
    def stateful(self) -> bool:
        return any(s.stateful for s in self.steps)

    @property
    def aggregates_in_spark(self) -> bool:
        """Its stateful step is Spark's own aggregation (a grouped stream's count or Spark
        aggregate function)."""
        return any(s.what == "spark_aggregate" for s in self.steps)

    @property
    def stateful_in_spark(self) -> bool:
        """Its stateful step runs in Spark's JVM: Spark's aggregation, or a table group_by's
        Column fold (transformWithState)."""
        return any(s.what in IN_SPARK for s in self.steps)

    @property
    def windowed(self) -> bool:
        """Reads record timestamps; writes each window to its inner key's partition."""
        return any(s.windowed for s in self.steps)

    @property
    def per_task(self) -> bool:
        """Keeps its state per input partition (a task): windows and stream-stream joins,
        whose stream time is a task's, so the input's partition count must not change."""
        return any(s.windowed or s.what == "stream_join" for s in self.steps)

    @property
    def writes_batches(self) -> bool:
        """Repartition writers stamp each record with the batch id (foreachBatch)."""
        return self.output.role == "repartition" or self.output.ids

    @property
    def reorders(self) -> bool:
        """A join by a key extractor spreads one key's records over several join keys:
        its output is put back in source order per key before it is written (foreachBatch)."""
        return any(isinstance(s.node, plan.Join) and s.node.key_fn is not None for s in self.steps)

    @property
    def reads_batches(self) -> bool:
        """Records read carry batch and record ids, to drop copies a restart wrote again."""
        return self.input.role == "repartition" or self.input.ids


def plan_output(
    app_id: str,
    out: plan.Materialize | plan.To,
    materialized: list[plan.Materialize] | None = None,
    name: str | None = None,
    native: bool = True,
) -> list[Query]:
    """The queries that compute `out`, in the order data flows through them.

    A node on the way that is itself `materialized` (a table handle used both
    for materialize() and for more operators) is read from its table topic.
    `native`: a grouped stream's count may be Spark's own aggregation (False: every
    aggregation keeps its state in Python, as a checkpoint written so may need).
    """
    chain = out.lineage()
    at = {id(m.parent): m for m in materialized or () if m is not out}
    chain = [at.get(id(n), n) if i < len(chain) - 1 else n for i, n in enumerate(chain)]
    starts = plan.Source | plan.Materialize
    start = max(i for i, n in enumerate(chain[:-1]) if isinstance(n, starts))
    first = chain[start]
    base = name or (out.name if isinstance(out, plan.Materialize) else f"to-{out.topic}")
    if isinstance(first, plan.Source):
        ref = TopicRef(first.topic, first.key, first.value, first.kind, "source")
    else:
        assert isinstance(first, plan.Materialize)
        topic = table_topic(app_id, first.name)
        ref = TopicRef(topic, first.key_serde(), first.value_serde(), "table", "table")
    queries: list[Query] = []
    sides: list[Query] = []  # what joins' other inputs and merges' need computed first
    merge_topic: str | None = None
    current = Query(f"{app_id}.{base}", ref, ref)
    key, value, kind = ref.key, ref.value, ref.kind

    def cut(role: Role) -> None:
        nonlocal current
        current.name = f"{app_id}.{base}.{len(queries)}"
        prefix = "repartition" if role == "through" else role
        topic = merge_topic or f"{app_id}.{prefix}.{base}-{len(queries)}"
        current.output = TopicRef(topic, key, value, kind, role)
        queries.append(current)
        current = Query(f"{app_id}.{base}", current.output, current.output)

    def add(
        what: StepKind,
        node: plan.Node,
        k: Serde,
        v: Serde,
        kd: plan.Kind,
        side: TopicRef | None = None,
        more: tuple[TopicRef, ...] = (),
    ) -> None:
        nonlocal key, value, kind
        after_retract = bool(current.steps) and current.steps[-1].what == "spark_retract"
        if what in STATEFUL and current.stateful and not after_retract:
            cut("changelog")
        if what == "spark_aggregate" and current.input.role not in ("source", "table"):
            # a repartition or changelog topic's copies need the per-key step's dedup
            what = _in_python(node, "it reads a repartition or changelog topic")
        key, value, kind = k, v, kd
        current.steps.append(Step(what, node, k, v, kd, side, more))

    for node in chain[start + 1 :]:
        if isinstance(node, plan.Op | plan.ToTable | plan.ToStream):
            add("op", node, node.key_serde(), node.value_serde(), node.kind)
        elif isinstance(node, plan.Aggregate):
            grouped = node.grouped
            if node.of_table:
                gk, gv = grouped.key_serde(), grouped.value_serde()
                ak, av = node.key_serde(), node.value_serde()
                add("select_group", grouped, key, PairSerde(gk, gv), "table")
                if node.folds_columns:
                    # both steps in one query: Spark shuffles the changes to their group key
                    # between its two transformWithState operators, no topic in between
                    add("spark_retract", grouped, gk, gv, "stream")
                    add("spark_table_aggregate", node, ak, av, "table")
                else:
                    add("retract", grouped, gk, gv, "stream")
                    cut("repartition")
                    add("table_aggregate", node, ak, av, "table")
            else:
                if grouped.fn is not None:
                    rekey = plan.Op(grouped.parent, grouped.fn, grouped.key, None, "select_key")
                    add("op", rekey, rekey.key_serde(), value, "stream")
                what: StepKind = "stream_aggregate"
                if node.window is not None:
                    what = "window_aggregate"
                elif node.agg == "column" or (node.agg == "count" and native):
                    what = "spark_aggregate"
                add(what, node, node.key_serde(), node.value_serde(), "table")
        elif isinstance(node, plan.Cogroup):
            # the first input is this chain: re-keyed here as a grouped stream's aggregation
            # is; every other one is read beside it (computed first if it is derived)
            first = node.inputs[0]
            if first.fn is not None:
                rekey = plan.Op(first.parent, first.fn, first.key, None, "select_key")
                add("op", rekey, rekey.key_serde(), value, "stream")
            refs = []
            for other in node.others:
                stream = _grouped_stream(other)
                name = f"{base}-cogroup{len(sides)}"
                side_queries, ref = _stream_side(app_id, stream, name, materialized or [], native)
                sides.extend(side_queries)
                refs.append(ref)
            add("cogroup", node, node.key_serde(), node.value_serde(), "table", None, tuple(refs))
        elif isinstance(node, plan.TransformValues):
            add("transform_values", node, key, node.value_serde(), "stream")
        elif isinstance(node, plan.Repartition):
            current.partitioner, current.partitions = node.partitioner, node.partitions
            cut("through")
        elif isinstance(node, plan.Merge):
            # every input is written to one topic, by a query of its own; the rest of the
            # chain reads it back
            merge_topic = f"{app_id}.merge.{base}-{len(queries)}"
            for i, other in enumerate(node.others):
                sink = plan.To(other, merge_topic)
                side_queries = plan_output(app_id, sink, materialized, f"{base}-merge{i}", native)
                last = side_queries[-1]
                last.output = replace(last.output, role="merge")
                sides.extend(side_queries)
            cut("merge")
            merge_topic = None
        elif isinstance(node, plan.Join) and node.window is not None:
            name = f"{base}-join{len(sides)}"
            side_queries, side = _stream_side(app_id, node.other, name, materialized or [], native)
            sides.extend(side_queries)
            add("stream_join", node, node.key_serde(), node.value_serde(), "stream", side)
        elif isinstance(node, plan.Join) and node.foreign_key is not None:
            # KIP-213: subscriptions keyed by foreign key meet the right table, and the
            # responses come back keyed by the left key (see compile.fk_join)
            name = f"{base}-join{len(sides)}"
            side_queries, side = _join_side(app_id, node, name, materialized or [], native)
            sides.extend(side_queries)
            raw = serdes.bytes_()
            add("fk_subscribe", node, node.other.key_serde(), raw, "stream")
            cut("repartition")
            add("fk_match", node, node.key_serde(), raw, "stream", side)
            cut("repartition")
            add("fk_resolve", node, node.key_serde(), node.value_serde(), "table")
        elif isinstance(node, plan.Join):
            name = f"{base}-join{len(sides)}"
            side_queries, side = _join_side(app_id, node, name, materialized or [], native)
            sides.extend(side_queries)
            add("join", node, node.key_serde(), node.value_serde(), node.kind, side)
        elif isinstance(node, plan.GroupBy | plan.WindowedBy | plan.Materialize | plan.To):
            pass  # a GroupBy is compiled with its Aggregate; the sinks end the chain
        else:
            raise NotImplementedError(f"{node.describe()} is not supported by the planner yet")
    if isinstance(out, plan.Materialize):
        current.output = TopicRef(table_topic(app_id, out.name), key, value, "table", "table")
        current.indexes = out.indexes
    else:
        current.output = TopicRef(out.topic, out.key_serde(), out.value_serde(), kind, "sink")
        current.partitioner = out.partitioner
    queries.append(current)
    for q in queries:
        if any(s.python for s in q.steps):
            # a Python step before the count would run twice (there and in the dead-letter
            # companion), and one after it would put a Python worker behind the aggregation
            q.steps = [
                replace(s, what=_in_python(s.node, "a Python step comes before it"))
                if s.what == "spark_aggregate"
                else s
                for s in q.steps
            ]
    return sides + _dead_letters(app_id, queries) + _with_ids(queries)


def _in_python(node: plan.Node, why: str) -> StepKind:
    """A count Spark cannot run exactly here is kept in Python; a Spark aggregate function
    has no Python form, so its App is refused."""
    assert isinstance(node, plan.Aggregate)
    if node.agg == "column":
        raise ValueError(
            f"{node.describe()}: a Spark aggregate function needs its input as read from a "
            f"topic or through Column steps only, but {why}; aggregate with Python callables "
            "instead, or compute the values with Columns"
        )
    return "stream_aggregate"


def _dead_letters(app_id: str, queries: list[Query]) -> list[Query]:
    """For each query with a Spark aggregation, which drops the rows its input marks bad
    (undecodable, or failed in a step before it), a stateless query that reads the same
    input through the same steps and writes only those rows, to the dead-letter topic."""
    from tablecast.kafka.topics import dlq_topic  # imported on use, as in table_topic()

    out = []
    for q in queries:
        if not q.aggregates_in_spark:
            continue
        at = next(i for i, s in enumerate(q.steps) if s.what == "spark_aggregate")
        if not (q.input.external or q.steps[:at]):
            continue  # no row that could be bad: the App's own topic as read
        dlq = TopicRef(dlq_topic(app_id), q.input.key, q.input.value, "stream", "sink")
        out.append(Query(f"{q.name}.dlq", q.input, dlq, q.steps[:at], dead_letters=True))
    return out


def _with_ids(queries: list[Query]) -> list[Query]:
    """A through topic, or a stream's changelog (a join's or transform_values' output on
    its way to an aggregation), carries record ids when the query reading it keeps
    state (an aggregation, windowed or not, a join, transform_values): it drops the copies
    a restarted writer wrote again. Otherwise a plain Kafka sink writes it, which
    Real-time Mode can run."""
    for q, nxt in pairwise(queries):
        out = q.output
        stream_topic = out.role == "through" or (out.role == "changelog" and out.kind == "stream")
        if stream_topic and nxt.stateful:
            q.output = nxt.input = replace(q.output, ids=True)
    return queries


def _grouped_stream(grouped: plan.GroupBy) -> plan.Node:
    """The stream a grouped stream aggregates: its parent, re-keyed by group_by(f) if any."""
    assert grouped.parent is not None
    if grouped.fn is None:
        return grouped.parent
    return plan.Op(grouped.parent, grouped.fn, grouped.key, None, "select_key")


def _stream_side(
    app_id: str,
    other: plan.Node,
    name: str,
    materialized: list[plan.Materialize],
    native: bool = True,
) -> tuple[list[Query], TopicRef]:
    """The topic holding a stream-stream join's other stream (or a cogroup's other input),
    and the queries that compute it if it is derived: they write
    ``<app>.changelog.<name>`` with record ids, so the join drops the copies a restarted
    writer wrote again (as after a repartition())."""
    if isinstance(other, plan.Source):
        return [], TopicRef(other.topic, other.key, other.value, "stream", "source")
    topic = f"{app_id}.changelog.{name}"
    queries = plan_output(app_id, plan.To(other, topic), materialized, name, native)
    last = queries[-1].output
    ref = TopicRef(topic, last.key, last.value, "stream", "changelog", ids=True)
    queries[-1].output = ref
    queries[-1].partitioner = None
    return queries, ref


def _join_side(
    app_id: str,
    join: plan.Join,
    name: str,
    materialized: list[plan.Materialize],
    native: bool = True,
) -> tuple[list[Query], TopicRef]:
    """The topic holding a join's other table, and the queries that compute it if any."""
    other = join.other
    for m in materialized:
        if m.parent is other:  # a handle that was also materialized: its table topic
            other = m
    if isinstance(other, plan.Materialize):
        topic = table_topic(app_id, other.name)
        return [], TopicRef(topic, other.key_serde(), other.value_serde(), "table", "table")
    if isinstance(other, plan.Source):
        return [], TopicRef(other.topic, other.key, other.value, "table", "source")
    # a derived table nobody materialized: computed into a changelog topic of its own
    queries = plan_output(app_id, plan.Materialize(other, name), materialized, None, native)
    last = queries[-1].output
    ref = TopicRef(f"{app_id}.changelog.{name}", last.key, last.value, "table", "changelog")
    queries[-1].output = ref
    return queries, ref
