"""Liveness bookkeeping: receipt times and direct answers, never the sender's clock."""

from __future__ import annotations

import pytest

from tablecast.cluster.liveness import (
    CANDIDATE_TTL_S,
    DEAD_AFTER_S,
    Answer,
    Heartbeat,
    Liveness,
    parse_health,
    signed_health,
)
from tablecast.cluster.signing import Signer


def beat(node: str = "b", inc: str = "i1", seq: int = 1, url: str = "http://b") -> Heartbeat:
    return Heartbeat(node, url, inc, seq, member=object())


def admitted(live: Liveness, node: str = "b", inc: str = "i1", now: float = 0.0) -> None:
    live.heard(beat(node, inc, 1, f"http://{node}"), now)
    assert live.answered(node, f"http://{node}", Answer(node, inc), now)


def test_a_record_admits_nobody_until_the_node_answers_directly() -> None:
    live = Liveness("a")
    live.heard(beat(), 0.0)
    assert live.alive(0.1) == set() and "b" in live.candidates
    assert not live.answered("b", "http://b", None, 0.2)  # no answer
    assert not live.answered("b", "http://b", Answer("c", "i1"), 0.2)  # someone else there
    assert not live.answered("b", "http://b", Answer("b", "i0"), 0.2)  # another life of b
    assert live.answered("b", "http://b", Answer("b", "i1"), 0.3)
    assert live.alive(0.3) == {"b"}


def test_dead_only_when_kafka_is_silent_and_the_node_does_not_answer() -> None:
    live = Liveness("a")
    admitted(live)
    # Kafka silent for long, but the node keeps answering: alive
    for t in range(1, 30):
        live.answered("b", "http://b", Answer("b", "i1"), float(t))
        assert live.alive(t + 0.5) == {"b"}
    # no answers, but heartbeats keep arriving through Kafka: alive
    for seq, t in enumerate(range(30, 40), start=2):
        live.heard(beat(seq=seq), float(t))
        assert live.alive(t + 0.5) == {"b"}
    # both silent: dead after DEAD_AFTER_S, and forgotten by prune
    assert live.alive(39 + DEAD_AFTER_S - 0.1) == {"b"}
    assert live.alive(39 + DEAD_AFTER_S + 0.1) == set()
    assert live.prune(39 + DEAD_AFTER_S + 0.1) == ["b"]
    assert "b" not in live.peers


def test_history_records_are_not_fresh_heartbeats() -> None:
    live = Liveness("a")
    live.heard(beat(), 0.0, live=False)  # read from history at start
    live.answered("b", "http://b", Answer("b", "i1"), 0.5)
    assert live.peers["b"].heard is None  # only the direct answer counts
    assert live.alive(0.5 + DEAD_AFTER_S + 0.1) == set()


def test_unconfirmed_candidates_expire() -> None:
    live = Liveness("a")
    live.heard(beat(), 0.0)
    live.prune(CANDIDATE_TTL_S + 0.1)
    assert live.candidates == {}
    assert not live.answered("b", "http://b", Answer("b", "i1"), CANDIDATE_TTL_S + 0.2)


def test_replays_and_old_sequence_numbers_are_ignored() -> None:
    live = Liveness("a")
    admitted(live)
    live.heard(beat(seq=5), 1.0)
    member = live.peers["b"].beat
    assert not live.heard(beat(seq=5), 2.0)  # the same record again
    assert not live.heard(beat(seq=3), 2.0)  # an older one
    assert live.peers["b"].beat is member and live.peers["b"].heard == 1.0


def test_a_tombstone_ends_the_incarnation_for_good() -> None:
    live = Liveness("a")
    admitted(live)
    assert live.left("b", "i1")
    assert live.alive(0.1) == set()
    # a replayed record of that life, even with a higher sequence, and even if
    # something at its address still answered, brings nothing back
    live.heard(beat(seq=99), 0.2)
    assert "b" not in live.candidates
    assert not live.answered("b", "http://b", Answer("b", "i1"), 0.3)
    # a new life of the same node id joins as usual
    admitted(live, inc="i2", now=1.0)
    assert live.alive(1.0) == {"b"}


def test_a_stopped_node_replayed_stays_dead() -> None:
    live = Liveness("a")
    admitted(live)
    live.heard(beat(seq=7), 1.0)
    assert live.prune(10.0) == ["b"]  # killed: silent and not answering
    live.heard(beat(seq=8), 11.0)  # a replay (or a forgery with a higher number)
    assert live.alive(11.0) == set()
    live.answered("b", "http://b", None, 11.2)  # nobody answers there
    assert live.alive(11.3) == set()
    assert live.prune(11.0 + CANDIDATE_TTL_S + 0.1) == [] and live.candidates == {}


def test_restart_during_an_outage_keeps_the_node_alive() -> None:
    live = Liveness("a")
    admitted(live)
    # b restarted while Kafka was down: it answers with a new incarnation
    live.answered("b", "http://b", Answer("b", "i2"), 5.0)
    assert live.alive(5.5) == {"b"}
    # its new heartbeats then replace the old life once confirmed
    live.heard(beat(inc="i2", seq=1), 6.0)
    assert live.answered("b", "http://b", Answer("b", "i2"), 6.1)
    assert live.peers["b"].beat.incarnation == "i2"


def test_no_clock_of_the_sender_is_read() -> None:
    # a heartbeat carries no timestamp here at all: freshness is receipt time only
    live = Liveness("a")
    admitted(live, now=1000.0)
    live.heard(beat(seq=2), 1001.0)
    assert live.alive(1001.0 + DEAD_AFTER_S - 0.01) == {"b"}


def test_signed_health_answers() -> None:
    signer, stranger = Signer("s3cret"), Signer("other")
    body, headers = signed_health(signer, "b", "i1", "reachable", "c0ffee")
    sig = dict(headers)["x-tablecast-signature"]
    assert parse_health(Signer("s3cret"), "c0ffee", body, sig) == Answer("b", "i1", "reachable")
    with pytest.raises(ValueError):
        parse_health(Signer("s3cret"), "other-challenge", body, sig)  # not for this check
    with pytest.raises(ValueError):
        parse_health(Signer("s3cret"), "c0ffee", body, None)  # unsigned
    forged_body, forged = signed_health(stranger, "b", "i1", "reachable", "c0ffee")
    with pytest.raises(ValueError):
        parse_health(Signer("s3cret"), "c0ffee", forged_body, dict(forged)["x-tablecast-signature"])
    # without a secret, the node id is all there is to check
    plain, none = signed_health(Signer(None), "b", "i1", "unreachable", "c0ffee")
    assert none == [] and parse_health(Signer(None), "x", plain, None).kafka == "unreachable"
