"""Ctrl-C (and the CLI's SIGTERM, SIGHUP) in the driver, delivered where the engine stops cleanly.

Python raises ``KeyboardInterrupt`` at whatever bytecode the main thread is
running when SIGINT arrives.  In the driver's own code that is fine (rows and
results are bookkeeping that the journal commits atomically, as long as none
is let go of before the journal has it: ``FilePlanner._flush``), but with
``workers=1`` the engine runs there too, inside the backend's ``poll``: an
interrupt landing between creating a part file and handing it to its transfer
left a part that no one would remove (about 1 Ctrl-C in 2, pure build).

:class:`TurnInterrupts` puts a handler of its own in front of the stopping
handlers it knows (Python's own for SIGINT; :func:`terminate_like_interrupt`,
which the CLI installs for SIGTERM and SIGHUP) for the length of a run.  While an engine
turn is running it only notes the signal and wakes the backend; the supervisor
calls :meth:`TurnInterrupts.check` after the turn, which runs the handler it
stood in front of (raising ``KeyboardInterrupt``).  Outside a turn it runs that
handler at once, as before, so a driver blocked reading its input still stops.
Worker processes do the same with their own signals (``worker.py``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

# The signal that last stopped a run through terminate_like_interrupt (the CLI
# reports 128 + it as its exit status); None for Ctrl-C.
stopped_by: int | None = None


def terminate_like_interrupt(signum: int, frame: FrameType | None) -> None:
    """A handler that makes a signal stop the run as Ctrl-C does (the CLI's SIGTERM:
    a scheduler preempting a job gets the manifest written and the parts kept)."""
    global stopped_by
    stopped_by = signum
    raise KeyboardInterrupt


# The signals a command's run stops on as on Ctrl-C: SIGTERM (a scheduler
# preempting the job, `kill`) and SIGHUP (the terminal closed, an ssh session
# dropped): either way the manifest is written and the parts are kept.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class StopSignalsLikeInterrupt:
    """For a command's run (``with StopSignalsLikeInterrupt():``): SIGTERM and
    SIGHUP stop it as Ctrl-C does, and :data:`stopped_by` says which it was.
    Only the main thread may set a handler, and a signal the parent made us
    ignore (``nohup``) stays ignored."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignalsLikeInterrupt:
        global stopped_by
        stopped_by = None
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) == signal.SIG_DFL:
                    self._previous[signum] = signal.signal(signum, terminate_like_interrupt)
        return self

    def __exit__(self, *exc_info: object) -> None:
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_SIGNALS = (signal.SIGINT, *STOP_SIGNALS)
_DEFERRABLE = (signal.default_int_handler, terminate_like_interrupt)


class TurnInterrupts:
    """``with TurnInterrupts(wake) as interrupts:`` around a run; ``in_turn`` is set
    around each engine turn, and ``check()`` runs a deferred handler after it."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._previous: dict[int, Any] = {}
        self.in_turn = False
        # Set while the run's end is written (the journal's last commit, the
        # manifest): a signal then waits for it, a second one does not.
        self.finishing = False
        self.pending: int | None = None  # a signal that came during the turn

    def __enter__(self) -> TurnInterrupts:
        # Only the main thread may set handlers, and only the stopping handlers
        # we know are deferred: a caller's own handler is the caller's business.
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                handler = signal.getsignal(signum)
                if any(handler is known for known in _DEFERRABLE):
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def check(self) -> None:
        """After an engine turn: run the stopping handler of a signal that came during it."""
        signum = self.pending
        if signum is not None:
            self.pending = None
            self._previous[signum](signum, None)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.finishing:
            if self.pending is None:
                self.pending = signum  # stopping anyway: the manifest first
                return
            self._previous[signum](signum, frame)  # asked twice: now
            return
        if not self.in_turn:
            self._previous[signum](signum, frame)  # driver code: as without us
            return
        self.pending = signum
        self._wake()  # only writes a byte: safe here
