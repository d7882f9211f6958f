"""What tests give an :class:`~swarmget.engine.core.Engine` to report to: the inline
backend's own collector (``results``: FileResults; ``partials``: (key, validator))."""

from swarmget.parallel.inline import Collected as RecordedEvents

__all__ = ["RecordedEvents"]
