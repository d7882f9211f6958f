"""Linux's parent-death signal: a child is told when the process that started it dies.

A worker process (``parallel/worker.py``) and a test daemon such as nginx
(``testing/daemons.py``) must not outlive the process that started them, even
when that one is killed outright and none of its clean-up runs.  Linux can
send the child a signal then (``prctl(PR_SET_PDEATHSIG)``); elsewhere the
callers fall back on what they have (a worker notices its pipe's EOF).
"""

from __future__ import annotations

import ctypes
import signal
from collections.abc import Callable
from typing import Final

PR_SET_PDEATHSIG: Final = 1


def parent_death_signal() -> Callable[[], None] | None:
    """A function that asks for SIGTERM to the calling process when its parent
    dies; None where the system has no ``prctl`` (not Linux).

    The C function is looked up here, before any fork, so that a child may call
    the result between fork and exec (a ``preexec_fn``), where loading a
    library is not safe.  The request is tied to the parent *thread*: a child
    forked by a thread that then ends gets the signal at once.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def ask() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    return ask
