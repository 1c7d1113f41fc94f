"""``tablecast explain``: an App's plan in words — operators, queries, topics, triggers.

Pure Python: the plan and the trigger each query would get are known without
Spark; a running pipeline passes the triggers it actually chose.
"""

from __future__ import annotations

from collections.abc import Callable

from tablecast.pipeline.plan import nodes as plan
from tablecast.pipeline.plan.queries import Query, plan_output
from tablecast.pipeline.run import trigger as triggers

#: task slots per shuffle partition, in words
_COUNTS = {1: "one", 2: "two"}


def explain(
    app_id: str,
    outputs: list[plan.Materialize | plan.To],
    trigger: str,
    partitions: Callable[[str], int | None] | None = None,
    chosen: dict[str, triggers.Trigger] | None = None,
    planned: Callable[[plan.Materialize | plan.To], list[Query]] | None = None,
) -> str:
    """The plan in words; each query's trigger is `chosen`'s (a running pipeline's
    decision) or else what its plan allows; an output's queries are `planned`'s (a running
    pipeline's) or else the App's plan."""
    lines = [f"App {app_id!r}: {len(outputs)} output(s); trigger {trigger!r}"]
    mats = [o for o in outputs if isinstance(o, plan.Materialize)]
    for out in outputs:
        what = f"table {out.name!r}" if isinstance(out, plan.Materialize) else f"to {out.topic!r}"
        lines.append(f"  {what}")
        lines.append("    operators: " + " -> ".join(n.describe() for n in out.lineage()))
        for q in planned(out) if planned is not None else plan_output(app_id, out, mats):
            state = "stateful, RocksDB state store" if q.stateful else "stateless"
            batches = q.writes_batches or q.reorders
            writer = "foreachBatch -> Kafka" if batches else "Kafka sink"
            lines.append(f"    query {q.name!r} ({state}; {writer}; update mode)")
            count = partitions(q.input.topic) if partitions else None
            parts = f", {count} partitions" if count else ""
            lines.append(f"      reads  {q.input.topic} [{q.input.role}{parts}]")
            for s in q.steps:
                lines.append(f"      step   {s.describe()}")
                if s.side is not None:
                    lines.append(f"      joins  {s.side.topic} [{s.side.role}]")
                for r in s.sides:
                    lines.append(f"      reads  {r.topic} [{r.role}] beside")
            placed = f", partitioner {plan.fn_name(q.partitioner)}" if q.partitioner else ""
            wanted = f", {q.partitions} partitions" if q.partitions else ""
            lines.append(f"      writes {q.output.topic} [{q.output.role}{wanted}{placed}]")
            trig = (chosen or {}).get(q.name)
            if trig is None:  # not running: the slots it will find are not known yet
                trig = triggers.decide(trigger, q)
                slots = ", given a free task slot per input partition" if trig.realtime else ""
                n = triggers.shuffling_steps(q)
                if slots and n:
                    per = _COUNTS.get(n, n)
                    slots += f" and {per} per shuffle partition (one per core, at most one per "
                    slots += "input partition)"
            else:
                slots = ""
            lines.append(f"      trigger: {trig.describe()}{slots}")
            if not trig.realtime:
                lines.extend(_real_time(q))
            lines.append(f"      bad records -> {app_id}.dlq")
    return "\n".join(lines)


def _real_time(q: Query) -> list[str]:
    """Whether `q`'s plan would let it run in Real-time Mode and, where a Python function
    keeps it in micro-batches, the Column form that would not."""
    reasons = triggers.blockers(q)
    if not reasons:
        return ['      real time: its plan allows it (App(trigger="realtime"))']
    lines = ["      real time: not with " + "; ".join(reasons)]
    lines += [f"        {hint}" for hint in triggers.column_forms(q)]
    return lines
