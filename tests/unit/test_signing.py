"""Peer signatures (cluster/signing.py): a malformed signature is refused, never an error,
and no signature is accepted twice however many arrive, with memory kept bounded."""

from __future__ import annotations

import pytest

from tablecast.cluster import signing
from tablecast.cluster.signing import Signer

BODY = b"GET /internal/x"


@pytest.mark.parametrize(
    "forge",
    [
        lambda tok: tok[:-1] + "é",  # a non-ASCII last digit of the MAC
        lambda tok: tok[:-2] + "\u20ac\u20ac",
        lambda tok: tok.replace("n=", "n=\udcff"),  # a lone surrogate in the nonce
        lambda tok: tok.replace("t=", "t=\u0661"),  # an Arabic-Indic digit int() would read
        lambda tok: "t=1,n=2,s=\xff" * 3,
        lambda tok: tok + ",s",
        lambda tok: "garbage",
        lambda tok: "",
    ],
)
def test_a_malformed_signature_is_invalid_not_an_error(forge: object) -> None:
    signer = Signer("s3cret")
    token = signer.sign(BODY)
    assert signer.verify(forge(token), BODY) is False  # type: ignore[operator]
    assert signer.verify(token, BODY) is True  # the genuine one still passes, once


def test_a_replay_is_refused() -> None:
    signer = Signer("s3cret")
    token = signer.sign(BODY)
    assert signer.verify(token, BODY)
    assert not signer.verify(token, BODY)


def test_a_replay_of_an_evicted_nonce_is_refused_and_memory_stays_at_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cap = 5
    monkeypatch.setattr(signing, "MAX_NONCES", cap)
    signer, sender = Signer("s3cret"), Signer("s3cret")
    tokens = []
    for i in range(4 * cap):
        # distinct signing times, as a busy peer's would be, all within the window
        monkeypatch.setattr(signing.time, "time", lambda i=i: 1_700_000_000.0 + i / 1000)
        tokens.append(sender.sign(BODY))
        assert signer.verify(tokens[-1], BODY)
    # every token is replayed, the ones forgotten to make room among them
    for token in tokens:
        assert not signer.verify(token, BODY), token
    assert len(signer._nonces) == cap
    # a token signed after the ones forgotten is still welcome
    monkeypatch.setattr(signing.time, "time", lambda: 1_700_000_001.0)
    assert signer.verify(sender.sign(BODY), BODY)


def test_nonces_are_forgotten_once_the_window_refuses_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signer = Signer("s3cret")
    monkeypatch.setattr(signing.time, "time", lambda: 1_700_000_000.0)
    old = signer.sign(BODY)
    assert signer.verify(old, BODY)
    later = 1_700_000_000.0 + signing.TOLERANCE_S + 1
    monkeypatch.setattr(signing.time, "time", lambda: later)
    assert signer.verify(signer.sign(BODY), BODY)
    assert len(signer._nonces) == 1  # the old one is out of the window: not kept
    assert not signer.verify(old, BODY)
    # even with the clock set back into the old token's window, it is not taken again
    monkeypatch.setattr(signing.time, "time", lambda: 1_700_000_000.0)
    assert not signer.verify(old, BODY)
