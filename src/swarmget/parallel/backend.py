"""The backend seam: how the driver reaches the engines that download.

Theory of operation
-------------------
The driver (``swarmget/driver.py``) reads and plans rows, keeps the journal
and the report; engines download.  Between them is a :class:`Backend` with
four verbs -- :meth:`~Backend.start`, :meth:`~Backend.send` rows to a worker,
:meth:`~Backend.poll` for events, :meth:`~Backend.stop` -- and a handful of
messages, plain dataclasses that pickle:

* driver -> worker: :class:`Rows` (a batch of planned rows), :class:`NoMoreRows`;
* worker -> driver: :class:`Progress` (finished rows, resumable parts, what is
  in flight), :class:`Finished` (it has done every row it was sent),
  :class:`Stopped` (it stopped early: interrupted, or a run-stopping error),
  and, made up by the backend itself, :class:`Died` (the worker went away
  without a word: a crash, a kill).

Backends: :class:`~swarmget.parallel.inline.InlineBackend` runs one engine in
the driver's own process; :class:`~swarmget.parallel.fork.ForkBackend` runs
one engine per worker process, fed over pipes.  A cluster backend (Ray) is the
same four verbs over actors.

Rows cross as tuples inside the dataclasses (a batch of 256 rows is one
message, and a tuple pickles several times faster than an object); results
are FileResults, which pickle as tuples too (``FileResult.__reduce__``).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from swarmget.errors import SwarmgetError
from swarmget.report import FileResult
from swarmget.sinks.base import Assignment, AssignmentTuple

# -- driver -> worker ---------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Rows:
    rows: list[AssignmentTuple]


@dataclasses.dataclass(slots=True)
class NoMoreRows:
    pass


@dataclasses.dataclass(slots=True)
class Release:
    """The driver has taken payloads the worker's sink handed on: their tokens."""

    tokens: list[int]


# -- worker -> driver ---------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Progress:
    worker: int
    results: list[FileResult]  # rows finished since the last message (they pickle as tuples)
    partials: list[tuple[int, str | None]]  # (key, validator) of bodies that began
    active: int  # transfers receiving now
    in_flight: int  # body bytes they have received so far
    parked: int = 0  # rows waiting for a host that pushed back (Engine.parked)


@dataclasses.dataclass(slots=True)
class Finished:
    worker: int


@dataclasses.dataclass(slots=True)
class Stopped:
    """The worker stopped before its rows were done: interrupted, or ``error``."""

    worker: int
    error: SwarmgetError | None = None


@dataclasses.dataclass(slots=True)
class Died:
    worker: int
    exitcode: int | None
    why: str = ""  # what the driver knows beyond the exit code


Event = Progress | Finished | Stopped | Died


class Backend(Protocol):
    """See the module docstring (a protocol: backends need not be compiled)."""

    workers: int

    def start(self) -> None: ...

    def send(self, worker: int, rows: list[Assignment]) -> bool:
        """Give ``worker`` more rows; False when it has gone (a Died event says why)."""
        ...

    def end(self, worker: int) -> None:
        """``worker`` gets no more rows: it finishes what it has, then reports Finished."""
        ...

    def poll(self, timeout: float) -> list[Event]:
        """Wait at most ``timeout`` seconds for events; return those that came."""
        ...

    def wake(self) -> None:
        """End a ``poll`` under way at once.  Called from a signal handler: it may
        only do what is safe there (write a byte)."""
        ...

    def release(self, worker: int, tokens: list[int]) -> None:
        """Tell ``worker``'s sink the driver is done with these payloads (Sink.release)."""
        ...

    def replace(self, worker: int) -> bool:
        """Start a new worker in the place of ``worker`` (which died); False if it cannot."""
        ...

    def stop(self, keep_parts: bool = True) -> None:
        """Interrupt every worker and wait for it to stop (its last events stay pollable).

        ``keep_parts``: interrupted (Ctrl-C), every part stays for the rerun;
        False after a run-stopping error (a full disk), only the parts worth
        resuming stay, as in the worker that hit it (``Engine.abort``)."""
        ...

    def close(self) -> None: ...
