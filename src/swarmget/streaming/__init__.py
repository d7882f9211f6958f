"""Stream downloads into the caller's pipeline: :func:`stream`, :func:`astream`, :class:`Item`.

See :mod:`swarmget.streaming.core` for how it works.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar

from swarmget.sources.rows import Row
from swarmget.streaming.core import Stream
from swarmget.streaming.delivery import NOT_YET
from swarmget.streaming.items import Item

__all__ = ["AsyncStream", "Item", "Stream", "astream", "stream"]

T = TypeVar("T")


# The function users call is the class itself: one signature, documented once
# (Stream's docstring).
stream = Stream


class AsyncStream(AsyncIterator[Item]):
    """:func:`stream` for asyncio: ``async with`` / ``async for``; never blocks the loop.

    The downloading runs on the stream's own thread and processes; an item that
    is ready is returned at once, and waiting for one happens on the stream's
    waiting thread (closing, on a thread of its own), so the event loop keeps
    running.  Not on asyncio's default executor: a wait a caller's timeout gave
    up on still holds its thread until an item comes, and eight such streams
    took all of that pool (six threads here) -- closing them waited a minute,
    and every ``getaddrinfo`` and ``to_thread`` of the program with them.  Not
    a new thread per wait either: ``Thread.start()`` waits until the new thread
    holds the GIL, and with ``map`` running in this process (one worker) that
    stalled the loop for up to 0.7 s.
    """

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._waiter = _Waiter()
        # The thread waiting for the next item.  A caller's timeout or cancel
        # stops the await, not the thread: what it takes is the next item, kept
        # here for the next __anext__ (it was lost).  A future of no event loop:
        # the next __anext__ may run in another one (a second asyncio.run), and
        # a future of the first loop could not be awaited there.
        self._waiting: concurrent.futures.Future[Item | None] | None = None
        # One __anext__ at a time: two tasks iterating one stream awaited the
        # same thread's future, and both got its item.  One lock per event loop
        # (an asyncio.Lock belongs to the loop it first waited in).
        self._turn: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    async def __aenter__(self) -> AsyncStream:
        # Started here, on the loop's thread, as stream() starts on the caller's:
        # its worker processes are forked now (a few milliseconds), where the
        # program may still have one thread.  Started from a helper thread, the
        # program always had two, so it never forked: map ran in this process,
        # and a map holding the GIL stalled the event loop.
        self._stream.__enter__()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Item:
        async with self._lock():
            return await self._next()

    def _lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._turn is None or self._turn[0] is not loop:
            self._turn = (loop, asyncio.Lock())
        return self._turn[1]

    async def _next(self) -> Item:
        waiting = self._waiting
        if waiting is None:
            item = self._stream.ready()
            if item is not NOT_YET:
                if item is None:
                    raise StopAsyncIteration
                assert isinstance(item, Item)
                return item
            # StopIteration cannot cross a Future: the thread says None instead.
            waiting = self._waiter.submit(next, self._stream, None)
            self._waiting = waiting
        try:
            taken = await _in_this_loop(waiting)
        except asyncio.CancelledError:
            # A timeout, or this loop ending: the thread's outcome stays in
            # self._waiting for the next __anext__, in this loop or another.
            raise
        except BaseException:
            self._waiting = None  # the run's error, or a failed item's (on_error="raise")
            raise
        self._waiting = None
        if taken is None:
            raise StopAsyncIteration
        return taken

    async def aclose(self) -> None:
        # On a thread of its own: a wait for the next item may be under way
        # on the waiting thread, and the close is what ends it.
        closed, closing = _on_a_thread(self._stream.close)
        await closed
        self._waiter.stop()
        # Gone before we return: a stream started next would see their threads
        # and fall back to one worker (no fork with other threads running).
        await _ended(closing)
        await self._waiter.ended()

    @property
    def report(self) -> Any:
        return self._stream.report

    def __del__(self) -> None:
        # Left without aclose() (a break out of `async for`): the waiting thread
        # must not outlive the stream.  The stream closes when collected, unless
        # a wait is under way: that wait holds it (and its workers) until an
        # item comes, so it is closed now, off the loop's thread.
        waiter = getattr(self, "_waiter", None)
        if waiter is None:
            return
        waiter.stop()
        if getattr(self, "_waiting", None) is not None:
            threading.Thread(target=self._stream.close, daemon=True).start()


def astream(urls: Iterable[str | Row] | None = None, **kwargs: Any) -> AsyncStream:
    """:func:`stream` as an async iterator; the same arguments."""
    return AsyncStream(stream(urls, **kwargs))


class _Waiter:
    """A daemon thread that runs an async stream's waits, one after another, each
    outcome a future of no event loop (awaited in whichever loop asks next, see
    :func:`_in_this_loop`).  (A daemon: a wait nobody collects never holds up
    the exit.)"""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, call: Callable[..., T], *args: object) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        # Running from now on: it cannot be cancelled, so the outcome always
        # lands in it (a cancelled future would refuse it: an item lost).
        future.set_running_or_notify_cancel()
        if self._thread is None:  # started once, at the first wait
            self._thread = threading.Thread(target=self._run, name="swarmget-astream", daemon=True)
            self._thread.start()
        self._jobs.put((future, call, args))
        return future

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, call, args = job
            try:
                result = call(*args)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

    def stop(self) -> None:
        self._jobs.put(None)  # after the wait under way, if any

    async def ended(self) -> None:
        if self._thread is not None:
            await _ended(self._thread)


_Job = tuple["concurrent.futures.Future[Any]", Callable[..., Any], tuple[object, ...]]


def _in_this_loop(outcome: concurrent.futures.Future[T]) -> asyncio.Future[T]:
    """``outcome`` as a future of the running loop.  Not asyncio.wrap_future:
    a cancelled wrapper cancels what it wraps, and the outcome must survive
    the loop that first waited for it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    future.add_done_callback(_retrieved)

    def copy(done: concurrent.futures.Future[T]) -> None:
        error = done.exception()
        _settle(loop, future, None if error is not None else done.result(), error)

    outcome.add_done_callback(copy)  # at once, here, if the outcome is in
    return future


def _on_a_thread(call: Callable[[], object]) -> tuple[asyncio.Future[None], threading.Thread]:
    """``call()`` on a daemon thread of its own: its outcome as a future of the
    running loop, and the thread."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            _settle(loop, future, None, exc)
        else:
            _settle(loop, future, None, None)

    thread = threading.Thread(target=run, name="swarmget-astream-close", daemon=True)
    thread.start()
    return future, thread


async def _ended(thread: threading.Thread, within: float = 2.0) -> None:
    """Let ``thread`` finish (it has settled its future: microseconds), without
    blocking the loop; give up after ``within`` seconds."""
    deadline = time.monotonic() + within
    while thread.is_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.001)


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[T],
    result: T | None,
    error: BaseException | None,
) -> None:
    def apply() -> None:
        if future.done():
            return  # cancelled meanwhile (the loop shutting down)
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
        loop.call_soon_threadsafe(apply)


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark an outcome nobody awaited (the caller stopped) as seen: no warning at exit."""
    if not future.cancelled():
        future.exception()
