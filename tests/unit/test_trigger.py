"""Which queries run in Real-time Mode and why the others fall back (no Spark needed).

Plans here use Python callables only (Column expressions need a running
Spark); the integration test covers Column operators in Real-time Mode.
"""

from __future__ import annotations

from pathlib import Path

import tablecast as tc
from tablecast.pipeline.plan import queries as planner
from tablecast.pipeline.run.trigger import (
    AUTO,
    DEAD_LETTER_INTERVAL,
    STATEFUL_INTERVAL,
    STATELESS_INTERVAL,
    Trigger,
    assign,
    blockers,
    column_forms,
    decide,
    requested,
    short,
    slots_needed,
    written_by_micro_batch,
)

STR, LONG = tc.serde.string(), tc.serde.long()


def x_of(k: str, v: dict[str, int]) -> int:
    return v["x"]


def first_partition(k: str, v: object, n: int) -> int:
    return 0


def by_g(k: str, v: dict[str, int]) -> tuple[int, int]:
    return v["g"], 1


def queries(app: tc.App) -> dict[str, planner.Query]:
    mats = list(app.materialized.values())
    return {q.name: q for out in app.outputs() for q in planner.plan_output(app.id, out, mats)}


def shop(trigger: str = "realtime") -> tuple[tc.App, dict[str, planner.Query]]:
    app = tc.App("shop", trigger=trigger)
    ev = app.stream("ev")
    ev.to_table().materialize("latest")  # stateless, all in the JVM
    ev.to("copy")
    ev.map_values(x_of, value=LONG).to_table().materialize("py")
    ev.group_by_key().count().materialize("counts")
    ev.to("spread", partitioner=first_partition)
    app.stream("av", value=tc.serde.avro({"type": "string"})).to("av-copy")
    return app, queries(app)


def test_trigger_strings() -> None:
    assert requested("realtime") == (True, "30 seconds")
    assert requested("realtime 30 seconds") == (True, "30 seconds")
    assert requested("500 milliseconds") == (False, "500 milliseconds")
    assert (short("500 milliseconds"), short("1 second"), short("2 minutes")) == (
        "500 ms",
        "1 s",
        "2 min",
    )
    assert Trigger(True, "5 seconds").describe() == "realtime (checkpoint every 5 s)"
    assert Trigger(False, "500 milliseconds", "x").describe() == "micro-batch 500 ms (fallback: x)"


def test_stateless_jvm_queries_run_in_real_time_and_the_rest_say_why_not() -> None:
    _, qs = shop()
    assert decide("realtime", qs["shop.latest"]) == Trigger(True, "30 seconds")
    assert decide("realtime 1 second", qs["shop.to-copy"]) == Trigger(True, "1 second")
    why = {
        "shop.py": "Python callable map_values(x_of) (MapInArrowExec)",
        "shop.to-spread": "Python partitioner first_partition (ArrowEvalPythonExec)",
        "shop.to-av-copy": "Avro serde, translated in Python (ArrowEvalPythonExec)",
    }
    for name, reason in why.items():
        assert blockers(qs[name]) == [reason], name
        t = decide("realtime", qs[name])
        assert not t.realtime and t.interval == STATELESS_INTERVAL, name
        assert reason in (t.fallback or ""), name
    # without "realtime" nothing is a fallback
    assert decide("1 second", qs["shop.latest"]) == Trigger(False, "1 second")


def test_auto_gives_stateless_queries_a_shorter_tick_than_stateful_ones() -> None:
    _, qs = shop()
    assert tc.App("x").trigger == AUTO
    got = {name: decide(AUTO, q).interval for name, q in qs.items()}
    assert got == {
        "shop.latest": STATELESS_INTERVAL,
        "shop.to-copy": STATELESS_INTERVAL,
        "shop.py": STATELESS_INTERVAL,  # a Python callable: still stateless
        "shop.to-spread": STATELESS_INTERVAL,
        "shop.to-av-copy": STATELESS_INTERVAL,
        "shop.counts": STATEFUL_INTERVAL,
        "shop.counts.dlq": DEAD_LETTER_INTERVAL,  # slower: it reads its aggregation's input
    }
    assert not any(decide(AUTO, q).realtime or decide(AUTO, q).fallback for q in qs.values())
    assert decide(" Auto ", qs["shop.latest"]).interval == STATELESS_INTERVAL
    # a stateful query that cannot run in real time falls back to the stateful tick
    app = tc.App("s", trigger="realtime")
    app.stream("ev").group_by_key().aggregate(dict, board).materialize("boards")
    (boards,) = queries(app).values()
    assert decide("realtime", boards).interval == STATEFUL_INTERVAL
    # an interval the App names is every query's
    assert {decide("2 seconds", q).interval for q in qs.values()} == {"2 seconds"}


def test_a_grouped_stream_count_is_sparks_aggregation_and_runs_in_real_time() -> None:
    _, qs = shop()
    counts, dlq = qs["shop.counts"], qs["shop.counts.dlq"]
    assert [s.what for s in counts.steps] == ["spark_aggregate"]
    assert blockers(counts) == [] and decide("realtime", counts).realtime
    # its companion writes the bad input rows the aggregation drops
    assert dlq.dead_letters and dlq.input == counts.input and dlq.output.topic == "shop.dlq"
    assert decide("realtime", dlq).realtime
    # a real-time batch holds a slot per input partition and one per shuffle partition
    assert (slots_needed(counts, 3), slots_needed(dlq, 3)) == (6, 3)
    assert slots_needed(counts, 30, shuffle=2) == 32  # a shuffle of one partition per core
    needs = [(counts, slots_needed(counts, 1)), (dlq, slots_needed(dlq, 1))]
    assert [t.realtime for t in assign("realtime", needs, 3)] == [True, True]
    got = assign("realtime", needs, 2)  # one micro-batch query keeps a slot for itself
    assert [t.realtime for t in got] == [False, True]
    assert "needs 2 task slots" in (got[0].fallback or "")


def keep_all(k: str, v: object) -> bool:
    return True


def test_a_count_after_a_python_step_or_a_repartition_keeps_its_state_in_python() -> None:
    app = tc.App("a", trigger="realtime")
    ev = app.stream("ev")
    ev.filter(keep_all).group_by_key().count().materialize("kept")
    ev.repartition(4).group_by_key().count().materialize("placed")
    qs = queries(app)
    assert "a.kept.dlq" not in qs  # the Python filter would run twice
    assert blockers(qs["a.kept"]) == [
        "Python callable filter(keep_all) (MapInArrowExec)",
        "stateful count() (FlatMapGroupsInPandasWithStateExec)",
    ]
    # a repartition topic's copies are dropped by the per-key step only
    assert [s.what for s in qs["a.placed"].steps] == ["stream_aggregate"]
    assert qs["a.placed"].input.ids


def test_table_group_by_names_every_blocker_of_its_repartition_writer() -> None:
    app = tc.App("a", trigger="realtime")
    app.table("rows").group_by(by_g, value=LONG).count().materialize("c")
    first = queries(app)["a.c.0"]
    assert blockers(first) == [
        "foreachBatch sink (ForeachBatchSink)",
        "Python callable group_by(by_g) (MapInArrowExec)",
        "stateful retract (FlatMapGroupsInPandasWithStateExec)",
    ]


def remember(k: str, v: object, state: object) -> object:
    return v


def test_repartition_and_transform_values() -> None:
    app = tc.App("a", trigger="realtime")
    ev = app.stream("ev")
    ev.repartition(4, partitioner=first_partition).to_table().materialize("placed")
    ev.repartition(4).transform_values(remember).to("seen")
    qs = queries(app)
    # a repartition topic read by a per-key step carries batch ids (foreachBatch, so copies
    # are dropped); one read by stateless steps is a plain Kafka sink's; the readers are free
    assert blockers(qs["a.placed.0"]) == [
        "Python partitioner first_partition (ArrowEvalPythonExec)"
    ]
    assert blockers(qs["a.to-seen.0"]) == ["foreachBatch sink (ForeachBatchSink)"]
    assert decide("realtime", qs["a.placed"]).realtime
    assert blockers(qs["a.to-seen"]) == [
        "stateful transform_values(remember) (FlatMapGroupsInPandasWithStateExec)"
    ]


def pair(left: object, right: object) -> object:
    return [left, right]


def test_a_join_is_stateful() -> None:
    app = tc.App("a", trigger="realtime")
    app.stream("ev").join(app.table("customers"), pair).to("joined")
    reasons = [r for q in queries(app).values() for r in blockers(q)]
    assert "stateful join (FlatMapGroupsInPandasWithStateExec)" in reasons


def test_real_time_queries_share_the_task_slots() -> None:
    _, qs = shop()
    latest, copy, counts = qs["shop.latest"], qs["shop.to-copy"], qs["shop.py"]
    # alone in the session: both fit into 2 slots with 1 partition each
    assert [t.realtime for t in assign("realtime", [(latest, 1), (copy, 1)], 2)] == [True, True]
    # a micro-batch query keeps one slot for itself
    got = assign("realtime", [(latest, 1), (copy, 1), (counts, 1)], 2)
    assert [t.realtime for t in got] == [True, False, False]
    assert got[1].fallback == "needs 1 task slots at once (one per source partition), 0 free"
    # one query that does not fit becomes micro-batch, so the others leave it a slot
    got = assign("realtime", [(latest, 2), (copy, 1)], 2)
    assert [t.realtime for t in got] == [False, True]
    assert "needs 2 task slots" in (got[0].fallback or "")
    # micro-batch queries elsewhere in the session count too
    assert not assign("realtime", [(latest, 2)], 2, others_micro_batch=True)[0].realtime
    assert assign("realtime", [(latest, 2)], 2)[0].realtime
    assert assign("1 second", [(latest, 1)], 2) == [Trigger(False, "1 second")]


def test_explain_prints_each_querys_trigger() -> None:
    app, _ = shop()
    text = app.explain()
    assert "App 'shop': 6 output(s); trigger 'realtime'" in text
    # latest, copy, counts and the companion writing counts' bad input to the DLQ
    assert text.count("trigger: realtime (checkpoint every 30 s)") == 4
    assert "given a free task slot per input partition and one per shuffle" in text  # counts'
    assert (
        "trigger: micro-batch 100 ms (fallback: not in Spark's Real-time Mode allowlist: "
        "Python callable map_values(x_of) (MapInArrowExec))"
    ) in text
    plain, _ = shop("1 second")
    assert "trigger: micro-batch 1 s\n" in plain.explain()


def board(k: str, tick: dict[str, int], agg: dict[str, int]) -> dict[str, int]:
    return {**agg, "last": tick["x"]}


def add(a: int, b: int) -> int:
    return a + b


def test_explain_shows_the_column_form_of_python_functions_kept_in_micro_batch() -> None:
    app = tc.App("py")
    ev = app.stream("ev")
    ev.filter(keep_all).map_values(x_of, value=LONG).to("kept")
    ev.group_by_key().aggregate(dict, board).materialize("boards")
    ev.filter(keep_all).group_by_key().count().materialize("counted")
    ev.to("spread", partitioner=first_partition)
    ev.to_table().materialize("by_x", indexes={"x": x_of})
    app.table("t").group_by(by_g).reduce(add, add).materialize("sums")
    ev.to_table().materialize("plain")
    qs = queries(app)
    assert column_forms(qs["py.to-kept"]) == [
        'filter(keep_all) as a Column: filter(F.variant_get("value", "$.price", "double") > 0)',
        'map_values(x_of) as a Column: map_values(F.variant_get("value", "$.price", "double"))',
    ]
    assert column_forms(qs["py.boards"]) == [
        "aggregate(dict, board) as one Spark aggregate function: "
        'aggregate(F.max_by(F.col("value"), F.variant_get("value", "$.time", "long")))'
    ]
    assert column_forms(qs["py.counted"])[-1] == (
        "count() is Spark's own once every step before it is a Column"
    )
    assert column_forms(qs["py.to-spread"]) == [
        'partitioner first_partition as a Column: partitioner=F.abs(F.hash(F.col("key"))) % 4'
    ]
    assert column_forms(qs["py.by_x"]) == [
        "index 'x' x_of as a Column: "
        'indexes={"NAME": F.variant_get("value", "$.field", "string")}'
    ]
    # a table's group_by with callables: its selection and fold have Column forms, which
    # Spark runs in the JVM
    first, second = qs["py.sums.0"], qs["py.sums"]
    assert blockers(first) and blockers(second)
    assert column_forms(first) == [
        "group_by(by_g) as a pair of Columns: "
        'group_by((F.variant_get("value", "$.g", "string"), F.variant_get("value", "$.n", "long")))'
    ]
    assert column_forms(second) == [
        "reduce(add, add) as Columns, folded in the JVM: "
        'reduce(F.col("aggregate") + F.col("value"), F.col("aggregate") - F.col("value"))'
    ]
    assert column_forms(qs["py.plain"]) == [] and blockers(qs["py.plain"]) == []

    text = app.explain()
    assert (
        "      real time: not with Python callable filter(keep_all) (MapInArrowExec); "
        "Python callable map_values(x_of) (MapInArrowExec)\n"
        "        filter(keep_all) as a Column: "
        'filter(F.variant_get("value", "$.price", "double") > 0)\n'
    ) in text
    assert "        aggregate(dict, board) as one Spark aggregate function: " in text
    plain = text[text.index("query 'py.plain'") :]
    assert plain.index('real time: its plan allows it (App(trigger="realtime"))') < plain.index(
        "bad records"
    )
    # a query running in real time says nothing more
    rt, _ = shop()
    latest = rt.explain()
    latest = latest[latest.index("query 'shop.latest'") : latest.index("table 'py'")]
    assert "real time" not in latest


def commit(checkpoint: Path, batch: int, version: str) -> None:
    # Spark's commit log: a version line, then the batch's JSON
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits" / str(batch)).write_text(f'{version}\n{{"nextBatchWatermarkMs":0}}')


def test_a_micro_batch_checkpoint_keeps_its_query_micro_batch(tmp_path: Path) -> None:
    _, qs = shop()
    latest = qs["shop.latest"]
    ck = tmp_path / "shop.latest"
    assert not written_by_micro_batch(ck)  # no checkpoint yet
    commit(ck, 0, "v2")
    commit(ck, 1, "v1")
    assert written_by_micro_batch(ck)
    # the newest commit counts: a real-time run after a micro-batch one writes v2 again
    commit(ck, 10, "v2")
    assert not written_by_micro_batch(ck)
    t = decide("realtime", latest, micro_batch_checkpoint=ck)
    assert not t.realtime and (t.fallback or "").startswith(f"its checkpoint {ck} was written")
    got = assign("realtime", [(latest, 1), (qs["shop.to-copy"], 1)], 2, False, {"shop.latest": ck})
    assert [t.realtime for t in got] == [False, True]


def test_a_python_step_after_the_count_keeps_it_in_python_too() -> None:
    app = tc.App("a", trigger="realtime")
    app.stream("ev").group_by_key().count().to_stream().map_values(x_of).to("out")
    qs = queries(app)
    assert "a.to-out.dlq" not in qs
    assert [s.what for s in qs["a.to-out"].steps] == ["stream_aggregate", "op", "op"]
