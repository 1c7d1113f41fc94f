"""Child processes that must not outlive the process that started them."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A ``preexec_fn``: the child gets SIGKILL when the thread that started it dies.

    So a SIGKILLed ``tablecast dev`` (nothing of it can run to clean up) takes
    its broker, pipeline and nodes with it. Linux only; elsewhere a no-op.
    Start children from the main thread: the signal follows the starting thread.
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
