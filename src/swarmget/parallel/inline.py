"""One engine in the driver's own process: the backend of ``workers=1``.

:meth:`InlineBackend.poll` runs the engine's event loop for one turn (at most
``timeout``), then hands over what the engine reported during it.  So the
driver's loop *is* the event loop, with the driver's own work (dealing rows,
recording results, progress) between turns; nothing crosses a process or a
thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TextIO

from swarmget.engine.core import Engine
from swarmget.options import Options
from swarmget.parallel.backend import (
    Event,
    Finished,
    Partial,
    Progress,
    Stopped,
)
from swarmget.report import FileResult, Waiting
from swarmget.sinks.base import Assignment, Sink

WAITING_INTERVAL: Final = 0.1  # seconds: as often as a worker process sends Progress


class Collected:
    """Keeps what an engine reports until the backend hands it on (tests use it too)."""

    def __init__(self) -> None:
        self.results: list[FileResult] = []
        self.partials: list[Partial] = []

    def finished(self, result: FileResult) -> None:
        self.results.append(result)

    def partial(self, row: Assignment, validator: str | None, total: int | None) -> None:
        self.partials.append((row.key, validator, total))

    def flush(self) -> None:
        pass  # what was collected leaves with the backend's next poll


class InlineBackend:
    workers = 1

    def __init__(
        self, make_sink: Callable[[int], Sink], options: Options, *, warn_to: TextIO | None = None
    ) -> None:
        self._events = Collected()
        self.engine = Engine(make_sink(0), options, self._events, warn_to=warn_to)
        self._done = False  # Finished or Stopped was reported
        self._stopped = False
        # Engine.waiting, asked at most every WAITING_INTERVAL (a poll is one loop turn).
        self._last_waiting: Waiting | None = None
        self._waiting_due = 0.0

    def start(self) -> None:
        pass

    def send(self, worker: int, rows: list[Assignment]) -> bool:
        self.engine.add(rows)
        return True

    def end(self, worker: int) -> None:
        self.engine.close_input()

    def poll(self, timeout: float) -> list[Event]:
        engine = self.engine
        if not engine.finished and not self._stopped:
            engine.step(timeout)
        events: list[Event] = []
        collected = self._events
        if collected.results or collected.partials or not (engine.finished or self._stopped):
            active, in_flight = engine.active()
            waiting = self._waiting(engine, bool(collected.results))
            events.append(
                Progress(
                    0,
                    collected.results,
                    collected.partials,
                    active,
                    in_flight,
                    engine.parked(),
                    waiting,
                )
            )
            collected.results, collected.partials = [], []
        if engine.finished and not self._done:
            self._done = True
            if engine.fatal is not None:
                engine.abort(keep_parts=False)
                events.append(Stopped(0, engine.fatal))
            else:
                events.append(Finished(0))
        return events

    def _waiting(self, engine: Engine, finished_some: bool) -> Waiting | None:
        """Engine.waiting for this poll's Progress: None when rows finished (the
        display shows a wait only once none has for a while), else the last answer,
        asked again once it is WAITING_INTERVAL old."""
        if finished_some:
            self._last_waiting = None
            return None
        now = engine.loop.now
        if now >= self._waiting_due:
            self._waiting_due = now + WAITING_INTERVAL
            self._last_waiting = engine.waiting()
        return self._last_waiting

    def wake(self) -> None:
        self.engine.loop.wake()

    def release(self, worker: int, tokens: list[int]) -> None:
        for token in tokens:
            self.engine.sink.release(token)

    def replace(self, worker: int) -> bool:
        return False  # the driver's own process: nothing to replace it with

    def stop(self, keep_parts: bool = True) -> None:
        """Interrupted: the engine stops at once; poll() still hands over what it reported."""
        self.engine.abort(keep_parts=keep_parts)
        self._stopped = self._done = True

    def close(self) -> None:
        self.engine.close()

    def backlog(self) -> int:
        return self.engine.backlog()
