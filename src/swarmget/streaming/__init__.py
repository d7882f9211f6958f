"""Stream downloads into the caller's pipeline: :func:`stream`, :func:`astream`, :class:`Item`.

See :mod:`swarmget.streaming.core` for how it works.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import Any

from swarmget.sources.rows import Row
from swarmget.streaming.core import Stream
from swarmget.streaming.delivery import NOT_YET
from swarmget.streaming.items import Item

__all__ = ["AsyncStream", "Item", "Stream", "astream", "stream"]


def stream(
    urls: Iterable[str | Row],
    *,
    map: Callable[[Item], Any] | None = None,
    ordered: bool = False,
    prefetch: int = 256,
    max_buffer_bytes: int = 256 << 20,
    spill_dir: str | os.PathLike[str] | None = None,
    on_error: str = "yield",
    workers: int | None = None,
    progress: bool = False,
    **download_options: Any,
) -> Stream:
    """Every URL's bytes, as :class:`Item`\\ s, while the next ones download.

    ``urls`` is any iterable of URL strings or :class:`~swarmget.sources.Row`
    (read lazily).  ``map=fn`` runs ``fn(item)`` in the worker process that
    downloaded the item, and only its value comes back (``item.value``); an
    exception in ``fn`` fails the item with ``map_error``.  ``ordered`` yields
    in input order (else in completion order).  ``prefetch`` bounds the items
    downloading or waiting ahead of the caller, ``max_buffer_bytes`` the bytes
    they hold in memory, all processes together; bodies beyond it go to files
    under ``spill_dir`` (a temporary directory by default), removed when the
    item is dropped or the stream closed.  ``on_error``: ``"yield"`` failed
    items (``item.ok`` False), ``"skip"`` them, or ``"raise"``
    :class:`~swarmget.TransferError` when the loop reaches one.  ``workers``:
    processes, one per CPU by default.  Every option of
    :func:`swarmget.download` applies (concurrency, per_host, retries,
    timeouts, checksums, TLS, proxies).  Use it in a ``with`` block (or call
    ``close()``) so an early exit stops the downloads at once::

        with swarmget.stream(urls, map=decode) as items:
            for item in items:
                train_on(item.value)
    """
    return Stream(
        urls, map=map, ordered=ordered, prefetch=prefetch, max_buffer_bytes=max_buffer_bytes,
        spill_dir=spill_dir, on_error=on_error, workers=workers, progress=progress,
        **download_options,
    )  # fmt: skip


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
