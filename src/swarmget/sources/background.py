"""Rows from a slow producer, read on a thread so the run never waits for them.

A list on stdin may come from a pipe whose writer is slow (a crawler, ``tail
-f``): the supervisor used to take a batch of 256 rows with blocking
``next()`` calls, so the first downloads waited for 256 lines (or the end of
the input), and a producer that waits for our output never got it.

:class:`BackgroundRows` reads the rows on a daemon thread into a bounded
queue (memory stays bounded: a fast producer waits for the run), and
:meth:`~BackgroundRows.take` hands the supervisor whatever has arrived.

Forking with this thread alive: the worker processes are forked before the
thread starts (the first :meth:`take` reads its row in the caller's thread,
before the backend starts; the thread starts with the second), but a worker
that dies is replaced by a fork later.  That child inherits a copy of the
lock of whatever the thread was blocked reading, so the thread never reads
``sys.stdin`` (which a forked child closes, taking its lock): it reads a
reader of its own on a duplicate of the descriptor (:func:`private_stdin`),
which no child touches.

A stream's run starts its worker processes before its own thread, so it need
not read the first row itself: it waits for it with :meth:`~BackgroundRows.wait`,
a while at a time, and so hears its caller stop it (a Ctrl-C) even while the
caller's generator gives nothing.  Inside that generator, it could not: the
call may never return.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import queue
import stat
import sys
import threading
from collections.abc import Iterator
from typing import BinaryIO, Final

from swarmget.errors import SwarmgetError, UsageError
from swarmget.sources.rows import Row

# Rows read ahead of the run, at most: from stdin, many (the lines are read
# anyway, and a big queue amortises the thread's wake-ups); from the caller's
# iterator, a batch (rows read ahead and never used are taken from the caller:
# a generator fed by a queue of its own loses them when the run stops early).
QUEUE_ROWS: Final = 4096
ITERATOR_ROWS: Final = 256


class _End:
    """The input is over (with ``error``, if reading it failed)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error


class BackgroundRows(Iterator[Row]):
    """``rows``, read on a thread of their own (see the module docstring)."""

    def __init__(
        self, rows: Iterator[Row], owned: BinaryIO | None = None, ahead: int = QUEUE_ROWS
    ) -> None:
        self._rows = rows
        self._owned = owned  # closed when the rows are read
        self._queue: queue.Queue[Row | _End] = queue.Queue(ahead)
        self._thread: threading.Thread | None = None
        self._over: _End | None = None
        self._arrived: Row | _End | None = None  # taken from the queue by wait()
        self._closed = False

    def close(self) -> None:
        """The run is over: the thread takes no more rows (after the one it may
        be waiting for), lets go of the iterator, and ends.  Safe to repeat."""
        self._closed = True
        if self._thread is None:  # never started (or could not be): let go here
            self._let_go()
            return
        with contextlib.suppress(queue.Empty):
            while True:  # room for a put the thread may be blocked in
                self._queue.get_nowait()

    def take(self, count: int, *, wait: bool) -> list[Row]:
        """Up to ``count`` rows that have arrived.  ``wait``: block for the first
        one (read here, in the caller's thread, while it is the only one).
        Raises StopIteration at the end, or the input's error."""
        if self._thread is None and wait:
            return [next(self._rows)]
        self._start()
        rows: list[Row] = []
        while len(rows) < count:
            try:
                item = self._next_item() if self._over is None else self._over
            except queue.Empty:
                break
            if isinstance(item, _End):
                self._over = item
                if rows:
                    break  # the end (or the error) comes with the next take
                if item.error is not None:
                    raise item.error
                raise StopIteration
            rows.append(item)
        return rows

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a row (or the end) to arrive, reading
        on the thread (see the module docstring); ``take`` then has it."""
        self._start()
        if self._over is None and self._arrived is None:
            with contextlib.suppress(queue.Empty):
                self._arrived = self._queue.get(timeout=timeout)

    def _next_item(self, block: bool = False) -> Row | _End:
        """What arrived next (queue.Empty if nothing has, unless ``block``)."""
        item, self._arrived = self._arrived, None
        return item if item is not None else self._queue.get(block)

    def __next__(self) -> Row:
        self._start()
        item = self._over or self._next_item(block=True)
        if isinstance(item, _End):
            self._over = item
            if item.error is not None:
                raise item.error
            raise StopIteration
        return item

    def _start(self) -> None:
        if self._thread is None:
            thread = threading.Thread(target=self._pump, name="swarmget-input", daemon=True)
            try:
                thread.start()
            except RuntimeError:
                # The limit of processes (ulimit -u counts threads) or no
                # memory for a stack: a traceback from threading said neither.
                raise SwarmgetError(
                    "cannot start a thread to read the input: too many processes or "
                    "threads already (ulimit -u), or too little memory"
                ) from None
            self._thread = thread

    def _pump(self) -> None:
        end = _End()
        try:
            while not self._closed:  # checked again after each put: close() may come then
                row = next(self._rows, None)
                if row is None or self._closed:
                    break
                self._queue.put(row)
        except Exception as exc:  # bad input: raised where the rows are taken
            end = _End(exc)
        finally:
            if self._closed:
                # Closed here, in the thread that runs it (a generator cannot be
                # closed from another while it runs): the caller's generator is
                # let go, and its own `finally` runs.
                self._let_go()
            elif self._owned is not None:
                self._owned.close()
            if not self._closed:
                self._queue.put(end)

    def _let_go(self) -> None:
        """Close the rows' iterator (its `finally` runs), then what it read."""
        close = getattr(self._rows, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()
        if self._owned is not None:
            self._owned.close()


def private_stdin() -> BinaryIO | None:
    """A reader of our own on a duplicate of descriptor 0, when stdin is a pipe,
    a terminal or a socket (something that may be slow to write); None for a
    regular file (read at once) or no stdin at all."""
    stdin = sys.stdin
    if stdin is None:
        return None
    try:
        fd = stdin.fileno()
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return open(os.dup(fd), "rb")
    except (ValueError, io.UnsupportedOperation):  # closed object, or no descriptor
        return None
    except OSError as exc:
        if exc.errno == errno.EBADF:
            # Descriptor 0 closed under sys.stdin: whatever we open next (the
            # journal, a socket) would get that number and be read as the input.
            raise UsageError("cannot read input '-': stdin is closed") from None
        return None
