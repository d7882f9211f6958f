"""A worker process: one Engine fed with rows over a pipe, reporting back over it.

The pipe is registered with the engine's own event loop, so waiting for rows
never blocks transfers in flight: when the worker has no row the source yields
None, and the batch that arrives later wakes the loop and refills the engine.
If the parent goes away (the pipe reaches EOF) the worker stops as on Ctrl-C:
in-flight ``.part`` files are kept for resuming and the journal stays valid.
"""

from __future__ import annotations

import ctypes
import io
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Iterator
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from swarmget.engine.core import Engine
from swarmget.errors import SwarmgetError
from swarmget.loop import EVENT_READ
from swarmget.options import Options
from swarmget.report import Report, Snapshot
from swarmget.sources.rows import Row

# Messages, worker -> parent:
#   ("progress", done, failed, bytes, active)   a few times a second
#   ("report", Report, needs_compaction)        at the end
#   ("error", SwarmgetError)                    a run-stopping error
#   ("interrupted",)                            stopped by the parent or its death
# Parent -> worker: a list of Row.as_tuple() tuples, or None for "no more rows".


class PipeFeed(Iterator[Row | None]):
    """The engine's row source: rows from the parent, None while none are here."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._rows: deque[Row] = deque()
        self._ended = False
        self.engine: Engine | None = None

    def __next__(self) -> Row | None:
        if self._rows:
            return self._rows.popleft()
        if self._ended:
            raise StopIteration
        return None

    def handle_io(self, mask: int) -> None:
        try:
            while self._conn.poll():
                batch = self._conn.recv()
                if batch is None:
                    # No more rows; the pipe stays registered, so that the
                    # parent's death is still noticed (EOF) until we finish.
                    self._ended = True
                    break
                self._rows.extend([Row(*fields) for fields in batch])
        except (EOFError, OSError):
            # The parent is gone: stop the way Ctrl-C does.
            raise KeyboardInterrupt from None
        if self.engine is not None:
            self.engine.refill()


class PipeProgress:
    """Sends the engine's progress to the parent (which sums all workers)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def start(self) -> None:
        pass

    def update(self, snapshot: Snapshot) -> None:
        self._conn.send(
            ("progress", snapshot.done, snapshot.failed, snapshot.bytes, snapshot.active)
        )

    def finish(self, report: Report) -> None:
        pass


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _terminate_with_parent() -> None:
    """Ask Linux for SIGTERM when the parent dies (even by SIGKILL, even mid-transfer).

    The pipe's EOF tells us too, but only when the loop looks at it; a worker
    that outlived its parent would race the user's next run in the same dir.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the pipe's EOF still stops us
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before we asked
        raise KeyboardInterrupt


_PR_SET_PDEATHSIG = 1


def worker_main(
    conn: Connection,
    inherited: list[Connection],
    dest: str,
    options: Options,
    fresh_dir: bool,
) -> None:
    # A forked worker holds copies of the parent's pipe ends (its own and its
    # elder siblings'); while any copy is open, no pipe reports EOF when the
    # parent dies.  Close them first.
    for other in inherited:
        other.close()
    # Ctrl-C reaches the whole process group; the parent decides, and tells us
    # with SIGTERM, so a worker never dies halfway through its own cleanup.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)
    feed = PipeFeed(conn)
    message: tuple[Any, ...]
    try:
        _terminate_with_parent()
        engine = Engine(
            feed, dest, options, progress=PipeProgress(conn), names_allocated=True,
            fresh_dir=fresh_dir, warn_to=io.StringIO(),  # the parent warns, once
            compact_journal=False,  # siblings still append; the parent compacts
        )  # fmt: skip
        feed.engine = engine
        engine.loop.add(conn.fileno(), EVENT_READ, feed)
        report = engine.run()
        message = ("report", report, engine.resume.needs_compaction)
    except KeyboardInterrupt:
        message = ("interrupted",)
    except SwarmgetError as exc:
        message = ("error", exc)
    try:
        conn.send(message)
    except OSError:
        pass  # the parent is gone; the journal already says what happened
    finally:
        conn.close()
