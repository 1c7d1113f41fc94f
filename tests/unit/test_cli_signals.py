"""`tablecast dev` and `demo` stop cleanly (as on Ctrl-C) on SIGTERM and on SIGINT, even
when started as a shell starts a background job, with SIGINT ignored."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from tablecast.cli import main as cli


@pytest.fixture
def handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_either_signal_interrupts_as_ctrl_c_does(handlers: None, sig: signal.Signals) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell's background job inherits it
    cli._stop_on_signals()
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), sig)
        for _ in range(500):  # Python runs the handler between two bytecodes of this thread
            time.sleep(0.01)
