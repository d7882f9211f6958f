"""What an engine tells the process that feeds it: finished rows, and resumable parts.

The engine downloads planned rows (:class:`~swarmget.sinks.base.Assignment`)
and reports each one's outcome exactly once, as a
:class:`~swarmget.report.FileResult`, through :meth:`EngineEvents.finished`.
In one process the driver listens directly; in a worker process the listener
batches the events and sends them to the driver over the pipe
(``parallel/worker.py``).  Either way the driver is the one place that keeps
the run's records (``sinks/plan.py``).

A protocol, not a base class: listeners outside the compiled package (tests,
a user's own driver) implement it without inheriting from compiled code.
"""

from __future__ import annotations

from typing import Protocol

from swarmget.report import FileResult
from swarmget.sinks.base import Assignment


class EngineEvents(Protocol):
    def finished(self, result: FileResult) -> None:
        """A row is done (ok or failed); ``result.key`` identifies it."""

    def partial(self, row: Assignment, validator: str | None, total: int | None) -> None:
        """A whole body of ``row`` began: its part can be continued later if it
        came with this validator (ETag or Last-Modified) and the file still has
        ``total`` bytes (None: not known); validator None: it cannot be, and a
        validator recorded before is void."""
