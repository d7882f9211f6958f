"""Stream downloads into the caller's pipeline: :func:`stream`, :func:`astream`, :class:`Item`.

See :mod:`swarmget.streaming.core` for how it works.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Any

from swarmget.sources.rows import Row
from swarmget.streaming.core import Stream
from swarmget.streaming.delivery import NOT_YET
from swarmget.streaming.items import Item

__all__ = ["AsyncStream", "Item", "Stream", "astream", "stream"]


# The function users call is the class itself: one signature, documented once
# (Stream's docstring).
stream = Stream


class AsyncStream(AsyncIterator[Item]):
    """:func:`stream` for asyncio: ``async with`` / ``async for``; never blocks the loop.

    The downloading runs on the stream's own thread and processes; an item that
    is ready is returned at once, and waiting for one happens on a worker
    thread (``asyncio.to_thread``), so the event loop keeps running.
    """

    def __init__(self, stream: Stream) -> None:
        self._stream = stream

    async def __aenter__(self) -> AsyncStream:
        await asyncio.to_thread(self._stream.__enter__)  # forking can take a moment
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self._stream.close)

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Item:
        item = self._stream.ready()
        if item is NOT_YET:
            # StopIteration cannot cross a Future: the thread says None instead.
            item = await asyncio.to_thread(next, self._stream, None)
        if item is None:
            raise StopAsyncIteration
        assert isinstance(item, Item)
        return item

    async def aclose(self) -> None:
        await asyncio.to_thread(self._stream.close)

    @property
    def report(self) -> Any:
        return self._stream.report


def astream(urls: Iterable[str | Row], **kwargs: Any) -> AsyncStream:
    """:func:`stream` as an async iterator; the same arguments."""
    return AsyncStream(stream(urls, **kwargs))
