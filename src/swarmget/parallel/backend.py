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
message, and a tuple pickles several times faster than an object).  Results
are FileResults (which pickle as tuples: ``FileResult.__reduce__``), except
the common one, a plain ``ok`` row, which crosses as five integers
(:data:`Done`): the driver has its URL, path and index in the row it dealt
(:func:`plain_result`).  That took ~4,000 instructions a row off the driver,
which does every row's planning and journal work on its own.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from swarmget.engine.urls import redact
from swarmget.errors import SwarmgetError
from swarmget.report import FileResult, Waiting
from swarmget.sinks.base import Assignment, AssignmentTuple

# A body that began (Engine events' partial): the row's key, the validator its
# part may be continued with (None: none), and the file's length then.
Partial = tuple[int, str | None, int | None]

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
    partials: list[Partial]  # bodies that began (see Partial)
    active: int  # transfers receiving now
    in_flight: int  # body bytes they have received so far
    parked: int = 0  # rows waiting for a host that pushed back (Engine.parked)
    # What the worker has waited on longest (Engine.waiting), in a message without
    # results only: a display shows it when no row has finished for a while.
    waiting: Waiting | None = None
    done: list[Done] = dataclasses.field(default_factory=list)  # plain ok rows, see is_plain


# A plain ok row's report from a worker: (key, http_status, bytes, attempts, elapsed_ms).
Done = tuple[int, int, int, int, int]


def is_plain(result: FileResult) -> bool:
    """Can ``result`` cross as a :data:`Done`: is everything else in it what the
    driver's row says (the engine's ``_succeeded`` with nothing to add)?"""
    return (
        result.status == "ok"
        and result.http_status is not None
        and result.error is None
        and result.message is None
        and result.digests is None
        and result.final_url is None
        and result.payload is None
        and result.reused == 0
    )


def done_of(result: FileResult) -> Done:
    http_status = result.http_status
    assert http_status is not None  # is_plain
    return (result.key, http_status, result.bytes, result.attempts, result.elapsed_ms)


def plain_result(row: Assignment, done: Done) -> FileResult:
    """The FileResult a worker sent as ``done`` for ``row``: what the engine made of
    it (``Engine._succeeded``: the URL redacted, the row's own path and index)."""
    key, http_status, size, attempts, elapsed_ms = done
    return FileResult(
        redact(row.url), row.path, "ok", http_status, size, None, attempts, elapsed_ms,
        index=row.index, key=key,
    )  # fmt: skip


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
