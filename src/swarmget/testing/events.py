"""An :class:`~swarmget.engine.events.EngineEvents` that keeps what it is told, for tests
that drive an :class:`~swarmget.engine.core.Engine` directly."""

from __future__ import annotations

from swarmget.report import FileResult
from swarmget.sinks.base import Assignment


class RecordedEvents:
    def __init__(self) -> None:
        self.results: list[FileResult] = []
        self.partials: list[tuple[Assignment, str]] = []

    def finished(self, result: FileResult) -> None:
        self.results.append(result)

    def partial(self, row: Assignment, validator: str) -> None:
        self.partials.append((row, validator))
