"""The chaos soak's judge: an answer the reference has not read up to yet is judged
after the soak, not called wrong after a fixed wait.

The reference is a consumer like the nodes'; after a broker outage on a 2-core machine it
trailed a node by more than the 5 s a reader waits, and the soak reported the node's
correct answers as 'offset not in the table topic' (bench/chaos/verifier.py)."""

from __future__ import annotations

import threading

from bench.chaos.verifier import Deferred, Readers, Rec, Reference
from tablecast.contract.partitioner import partition_for

PARTITIONS = 6


def reference() -> Reference:
    ref = Reference.__new__(Reference)  # no consumer: records are added by hand below
    ref.lock = threading.Lock()
    ref.by_key = {}
    ref.at = {}
    ref.ends = dict.fromkeys(range(PARTITIONS), 0)
    ref.arrivals = {p: ([], []) for p in range(PARTITIONS)}
    return ref


def add(ref: Reference, key: str, offset: int, value: object) -> int:
    p = partition_for(key.encode(), PARTITIONS)
    ref.by_key.setdefault(key, []).append(Rec(offset, value))
    ref.at[(p, offset)] = (key, value)
    ref.ends[p] = offset + 1
    return p


def deferred_answer(readers: Readers, ref: Reference, key: str, offset: int, value: object) -> None:
    p = partition_for(key.encode(), PARTITIONS)
    body = {"value": value, "partition": p, "offset": offset}
    d = Deferred(lambda: ref.judge_value(key, body, offset + 1), key, 0.0, "node0")
    assert d.judge() == "pending"  # the reference has not read that far
    readers.deferred.append(d)


def test_an_answer_ahead_of_the_reference_is_judged_once_it_has_read_that_far() -> None:
    ref = reference()
    readers = Readers(ref, lambda: [], 0, 1, 0.0)
    add(ref, "k1", 0, {"n": 1})
    deferred_answer(readers, ref, "k1", 1, {"n": 2})
    add(ref, "k1", 1, {"n": 2})  # the reference reads the record after the soak
    readers.judge_deferred(caught_up=True)
    assert readers.tally.ok == 1 and readers.tally.wrong == []


def test_an_offset_the_topic_never_held_is_wrong() -> None:
    ref = reference()
    readers = Readers(ref, lambda: [], 0, 1, 0.0)
    add(ref, "k1", 0, {"n": 1})
    deferred_answer(readers, ref, "k1", 5, {"n": 2})
    readers.judge_deferred(caught_up=True)
    assert readers.tally.ok == 0
    [wrong] = readers.tally.wrong
    assert "offset not in the table topic" in wrong and "node0" in wrong


def test_a_deferred_answer_with_another_value_is_wrong() -> None:
    ref = reference()
    readers = Readers(ref, lambda: [], 0, 1, 0.0)
    deferred_answer(readers, ref, "k1", 0, {"n": 2})
    add(ref, "k1", 0, {"n": 3})
    readers.judge_deferred(caught_up=True)
    [wrong] = readers.tally.wrong
    assert "value" in wrong
