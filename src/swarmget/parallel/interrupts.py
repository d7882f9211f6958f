"""Ctrl-C in the driver, delivered where the engine can stop cleanly.

Python raises ``KeyboardInterrupt`` at whatever bytecode the main thread is
running when SIGINT arrives.  In the driver's own code that is fine (rows and
results are bookkeeping that the journal commits atomically), but with
``workers=1`` the engine runs there too, inside the backend's ``poll``: an
interrupt landing between creating a part file and handing it to its transfer
left a part that no one would remove (about 1 Ctrl-C in 2, pure build).

:class:`TurnInterrupts` installs a SIGINT handler for the run that only sets a
flag and wakes the backend while an engine turn is running, and raises as
before everywhere else (so a driver blocked reading its input still stops).
The supervisor calls :meth:`TurnInterrupts.check` after each turn, where the
engine is between transfers' steps.  Worker processes do the same with their
own signals (``worker.py``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any


class TurnInterrupts:
    """``with TurnInterrupts(wake) as interrupts:`` around a run; ``turn()`` brackets
    each engine turn, ``check()`` raises a deferred Ctrl-C after it."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._previous: Any = None
        self._installed = False
        self.in_turn = False
        self.requested = False

    def __enter__(self) -> TurnInterrupts:
        # Only where Python's own handler is in place: a caller's handler is the
        # caller's business, and only the main thread may set handlers.
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def check(self) -> None:
        """After an engine turn: raise the Ctrl-C that came during it."""
        if self.requested:
            self.requested = False
            raise KeyboardInterrupt

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.in_turn:
            raise KeyboardInterrupt  # driver code: as Python's own handler would
        self.requested = True
        self._wake()  # only writes a byte: safe here
