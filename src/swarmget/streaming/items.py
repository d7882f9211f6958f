"""One downloaded URL as the caller's loop sees it: :class:`Item`."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarmget.errors import TransferError
from swarmget.sinks.memory import ARENA, BYTES, SPILL, Arena


class Item:
    """One URL's outcome: its bytes (in memory or in a spill file), or its error.

    ``data`` is the body as ``bytes`` (None when it was spilled to ``path``, or
    failed); ``value`` is what ``map`` returned (then neither the body nor its
    file comes along).  An item is always true, whatever its length: test
    ``item.ok`` for success.  A spilled item's file is removed when the item is
    dropped or :meth:`close`\\ d (or at the interpreter's exit): closing the
    stream removes only the files of items it never handed out.
    """

    __slots__ = (
        "__weakref__",
        "_remove",
        "data",
        "error",
        "http_status",
        "index",
        "message",
        "ok",
        "path",
        "url",
        "value",
    )

    def __init__(
        self,
        index: int,
        url: str,
        ok: bool,
        *,
        http_status: int | None = None,
        error: str | None = None,
        message: str | None = None,
        data: bytes | None = None,
        path: Path | None = None,
        value: Any = None,
    ) -> None:
        self.index = index  # the row's position in the input
        self.url = url
        self.ok = ok
        self.http_status = http_status
        self.error = error  # the manifest's error code, when not ok
        self.message = message
        self.data = data
        self.path = path
        self.value = value
        self._remove: weakref.finalize | None = None  # type: ignore[type-arg]
        if path is not None:
            self.remove_file_with(remove_spill_file, str(path), os.getpid())

    def read(self) -> bytes:
        """The body, from memory or from the spill file; a failed item raises its error."""
        if not self.ok:
            raise TransferError(self.error or "error", self.message or "")
        if self.data is not None:
            return self.data
        if self.path is not None:
            try:
                return self.path.read_bytes()
            except FileNotFoundError:
                raise ValueError(
                    f"this item's body was spilled to {self.path}, which is gone "
                    "(removed by something other than this item)"
                ) from None
        # Not b"": an empty body is data == b"".  Silence here was a wrong answer.
        raise ValueError(
            "this item has no body: it was closed, or map took it (only map's value comes back)"
        )

    def remove_file_with(self, remove: Callable[..., object] | None, *args: object) -> None:
        """Who removes this item's spill file: ``remove(*args)`` when the item is
        dropped or closed (None: nobody here, its owner removes it).  Replaces the
        remover it had."""
        if self._remove is not None:
            self._remove.detach()
        self._remove = None if remove is None else weakref.finalize(self, remove, *args)

    def close(self) -> None:
        """Let go of the body now: the spill file goes, ``data`` and ``path`` are dropped."""
        self.data = None
        if self._remove is not None:
            self._remove()
            self._remove = None
            self.path = None

    def __bool__(self) -> bool:
        # Without it, __len__ decided: an ok item with an empty body, or with
        # map's value (no body here), was falsy and `if item:` skipped it.
        return True

    def __len__(self) -> int:
        if self.data is not None:
            return len(self.data)
        if self.path is not None:
            with contextlib.suppress(OSError):
                return self.path.stat().st_size
        return 0

    def __repr__(self) -> str:
        state = "ok" if self.ok else f"failed {self.error}"
        return f"<Item {self.index} {state} {self.url}>"


def remove_spill_file(path: str, owner: int) -> None:
    """Remove a spill file, in the process that made the item only: a copy of it in
    a child forked from the caller's program is not the file's owner."""
    if os.getpid() != owner:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)


def body_item(
    index: int, url: str, payload: object, arena: Arena | None, http_status: int | None
) -> Item:
    """The item ``map`` gets, in the worker: the body from wherever the sink put it,
    and what the caller's item says of it (its http_status was None here)."""
    data: bytes | None = None
    path: Path | None = None
    if isinstance(payload, tuple) and payload:
        kind = payload[0]
        if kind == BYTES:
            data = payload[1]
        elif kind == ARENA and arena is not None:
            offset, length = payload[-2], payload[-1]
            data = bytes(arena.view[offset : offset + length])
        elif kind == SPILL:
            path = Path(payload[1])
    item = Item(index, url, True, http_status=http_status, data=data, path=path)
    item.remove_file_with(None)  # the sink removes the file itself, after map
    return item
