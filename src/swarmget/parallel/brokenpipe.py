"""A write to a pipe or socket whose reader is gone is an error of ours, never the caller's death.

Python ignores SIGPIPE, so such a write raises ``BrokenPipeError`` and the
engine and backends handle it (a worker that died, a server that reset the
connection).  A program that restored the default (``signal.signal(SIGPIPE,
SIG_DFL)``, as command-line tools do to end quietly in ``| head``) was
killed outright instead, exit status 141, no traceback: the first row sent to
a worker that had just died ended the caller, and its stream's spill files
and workers were left behind.

The disposition is process-wide, and only the main thread may change it;
the mask is per thread.  So while our code writes, SIGPIPE is blocked in the
writing thread: the write fails with EPIPE, the signal waits pending, and it
is taken (``sigtimedwait``) before the mask is put back, so it is never
delivered.  With SIGPIPE ignored (Python's default) there is nothing to do.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

_SIGPIPE = {signal.SIGPIPE}


@contextlib.contextmanager
def broken_pipes_raise() -> Iterator[None]:
    """In the block, a write to a broken pipe raises ``BrokenPipeError`` in this
    thread whatever the program's SIGPIPE disposition; the thread's mask is as
    it was after it."""
    if signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN:
        yield  # Python's default: EPIPE raises already
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGPIPE)
    if signal.SIGPIPE in before:
        yield  # blocked by the caller: what is pending then is the caller's
        return
    try:
        yield
    finally:
        # The SIGPIPE of a write that failed in the block, taken before it
        # could be delivered (timeout 0: none pending is the usual case).
        signal.sigtimedwait(_SIGPIPE, 0)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGPIPE)
