"""A small single-threaded event loop over ``selectors`` (epoll on Linux).

Theory of operation
-------------------
The loop knows three things: file descriptors with a handler each, a heap of
timers, and a wake-up pipe that other threads (the DNS resolver) may poke.  One
turn of :meth:`EventLoop.run_once` is:

1. compute how long we may sleep: until the earliest timer, or not at all if
   callbacks are waiting;
2. ask the selector for ready descriptors for at most that long;
3. call ``handler.handle_io(mask)`` for each ready one;
4. run the timers that are due, then the callbacks queued with ``call_soon``.

``loop.now`` is the monotonic clock read once per turn: handlers use it for
bookkeeping (last activity, start times) without a clock call per event.

Handlers are plain objects with a ``handle_io(mask)`` method rather than
closures: a connection registers itself once and stays registered for its whole
life, so the hot path costs one dict lookup inside ``selectors`` and one method
call.  Timers are cancelled lazily (flagged, dropped when they reach the top of
the heap), which keeps cancel O(1); users of the loop should therefore avoid
creating a long-lived timer per transfer (the engine uses one periodic sweep).

The selector is injectable and the clock is a callable, so tests can drive the
loop with socketpairs and a fake clock.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

EVENT_READ = selectors.EVENT_READ
EVENT_WRITE = selectors.EVENT_WRITE


class IOHandler(Protocol):
    def handle_io(self, mask: int) -> None: ...


class Timer:
    """A scheduled callback; :meth:`cancel` makes it a no-op."""

    __slots__ = ("args", "callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        # The entry stays in the heap until its time; what it refers to need not
        # (a connect race's deadline holds the race, its pool and its transfer).
        self.callback = _nothing
        self.args = ()


def _nothing(*args: Any) -> None:
    pass


class _Waker:
    """A socketpair whose read end wakes the selector from another thread."""

    def __init__(self, loop: EventLoop) -> None:
        self._loop = loop
        self._rsock, self._wsock = socket.socketpair()
        self._rsock.setblocking(False)
        self._wsock.setblocking(False)
        self.fd = self._rsock.fileno()

    def wake(self) -> None:
        # BlockingIOError: a byte is already waiting, so the loop wakes anyway.
        with contextlib.suppress(OSError):
            self._wsock.send(b"\0")

    def handle_io(self, mask: int) -> None:
        try:
            while self._rsock.recv(4096):
                pass
        except BlockingIOError:
            pass
        self._loop._drain_threadsafe()

    def close(self) -> None:
        self._rsock.close()
        self._wsock.close()


class EventLoop:
    def __init__(
        self,
        selector: selectors.BaseSelector | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._selector = selector or selectors.DefaultSelector()
        self._clock = clock
        self.now = clock()
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._ready: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._threadsafe: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._lock = threading.Lock()
        self._waker = _Waker(self)
        self._selector.register(self._waker.fd, EVENT_READ, self._waker)
        self._closed = False

    # -- descriptors ------------------------------------------------------------

    def add(self, fd: int, events: int, handler: IOHandler) -> None:
        self._selector.register(fd, events, handler)

    def modify(self, fd: int, events: int, handler: IOHandler) -> None:
        self._selector.modify(fd, events, handler)

    def remove(self, fd: int) -> None:
        self._selector.unregister(fd)

    # -- callbacks and timers ---------------------------------------------------

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        self._ready.append((callback, args))

    def wake(self) -> None:
        """End the current (or next) wait at once.  Safe in a signal handler: it
        only writes a byte (no lock, unlike :meth:`call_soon_threadsafe`)."""
        self._waker.wake()

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> None:
        """The only method that may be called from another thread."""
        with self._lock:
            self._threadsafe.append((callback, args))
        self._waker.wake()

    def _drain_threadsafe(self) -> None:
        with self._lock:
            items, self._threadsafe = self._threadsafe, deque()
        self._ready.extend(items)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Timer:
        return self.call_at(self.now + max(0.0, delay), callback, *args)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Timer:
        timer = Timer(when, callback, args)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def time(self) -> float:
        """Read the clock now (``loop.now`` is the value at the start of this turn)."""
        return self._clock()

    # -- running ----------------------------------------------------------------

    def run_once(self, max_wait: float = 1.0) -> None:
        timeout = max_wait
        if self._ready:
            timeout = 0.0
        elif self._timers:
            timeout = min(timeout, max(0.0, self._timers[0][0] - self._clock()))
        events = self._selector.select(timeout)
        self.now = self._clock()
        for key, mask in events:
            key.data.handle_io(mask)
        timers = self._timers
        now = self.now
        while timers and timers[0][0] <= now:
            timer = heapq.heappop(timers)[2]
            if not timer.cancelled:
                timer.callback(*timer.args)
        ready = self._ready
        for _ in range(len(ready)):
            callback, args = ready.popleft()
            callback(*args)

    def run_until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.run_once()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._selector.unregister(self._waker.fd)
        self._waker.close()
        self._selector.close()


def raise_nofile_limit(wanted: int | None = None) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit; returns the new soft limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if wanted is None else min(hard, max(soft, wanted))
    if hard == resource.RLIM_INFINITY:
        target = max(soft, wanted or 1 << 16)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return soft
