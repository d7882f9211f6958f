"""Between the run (a background thread) and the caller's loop: the item queue.

Theory of operation
-------------------
The supervisor runs on a thread of its own and hands every outcome to
:class:`Delivery.deliver`; the caller's ``for`` loop takes items with
:meth:`Delivery.take`.  One condition variable guards it all.  Three bounds:

* **prefetch**: rows taken from the input and not yet consumed are at most
  ``prefetch`` (:meth:`room` paces the supervisor's reading);
* **bytes**: bodies held here ahead of the caller, plus those still in the
  workers' arenas, stay within ``max_buffer_bytes``.  A body in a worker's
  arena is copied into ``bytes`` only when it fits; until then it waits in
  the arena, and the arena being full makes the workers spill new bodies to
  files.  So a slow consumer costs disk, not memory.  The one exception keeps
  ``ordered=True`` from deadlocking: the very item the caller waits for is
  always copied.  Once the run has ended (the workers too: the arenas are
  mapped here as well), the caller's :meth:`take` copies them, as it comes
  to them;
* **order**: ``ordered=True`` yields in the order rows were read, else in
  completion order.

Every row read yields exactly one outcome (ok, failed, or a bad row), and
rows are numbered as they are read (their ``key``, see StreamPlanner), so the
ordered queue never waits for a row that will not come.
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import Final

from swarmget.engine.urls import redact
from swarmget.errors import TransferError
from swarmget.parallel.backend import Backend
from swarmget.report import FileResult, Report
from swarmget.sinks.memory import ARENA, BYTES, SPILL, VALUE, Arena, Budget
from swarmget.streaming.items import Item
from swarmget.streaming.spill import SpillDir

ON_ERROR: Final = ("yield", "skip", "raise")
FAST_POLL: Final = 0.005  # seconds, while bodies wait for room
NOT_YET: Final = object()  # take(block=False): nothing ready yet


class ItemError(TransferError):
    """A failed item, raised by a stream with ``on_error="raise"``: its ``code``
    and ``message``, and which item it is (``index``, and ``url`` without its
    password).  In completion order, ``http_404: HTTP 404`` alone did not say
    which URL failed."""

    def __init__(self, code: str, message: str, url: str = "", index: int = -1) -> None:
        super().__init__(code, message)
        self.url = url
        self.index = index

    def __str__(self) -> str:
        if not self.url:
            return super().__str__()
        return f"{self.code}: {self.message} (item {self.index}: {self.url})"

    def _arguments(self) -> tuple[str, str, str, int]:
        return (self.code, self.message, self.url, self.index)


class Delivery:
    def __init__(
        self,
        *,
        ordered: bool,
        prefetch: int,
        on_error: str,
        budget: Budget,
        arenas: list[Arena] | None,
        backend: Backend,
        spill: SpillDir | None = None,
    ) -> None:
        self._ordered = ordered
        self._spill = spill  # a spilled item's file is the item's (spill.adopt)
        self._prefetch = prefetch
        self._on_error = on_error
        self._budget = budget  # bytes held here (and, inline, in flight) ahead of the caller
        self._arenas = arenas
        self._backend = backend
        self._cond = threading.Condition()
        self._ready: deque[Item] = deque()  # completion order
        self._by_key: dict[int, Item] = {}  # ordered=True
        self._next = 0  # ordered=True: the key (read order) the caller waits for
        self._waiting: list[FileResult] = []  # arena bodies waiting for room
        self._consumed = 0  # outcomes the caller took (or skipped)
        self._closing = False
        self._done = False
        self._starved = False  # room() found none: the supervisor waits for the caller
        self._error: BaseException | None = None
        self.report: Report | None = None  # the run's totals, once it has ended

    # -- the supervisor's side (its thread) ------------------------------------------

    def room(self, taken: int) -> int:
        """``taken``: rows the supervisor has read from the input so far."""
        self._copy_waiting()
        room = max(0, self._prefetch - (taken - self._consumed))
        self._starved = room == 0
        return room

    def deliver(self, results: list[FileResult]) -> None:
        items: list[tuple[int, Item]] = []
        for result in results:
            payload = result.payload
            if result.ok and isinstance(payload, tuple) and payload[0] == ARENA:
                self._waiting.append(result)
                continue
            items.append((result.key, self._item(result)))
        self._queue(items)
        if self._waiting:
            self._copy_waiting()

    def stopping(self) -> bool:
        return self._closing

    def worker_died(self, worker: int) -> None:
        """Its bodies waiting in its arena are copied out now, whatever the budget:
        the worker started in its place shares that memory and begins with all of
        it free (its first bodies overwrote them, and releasing them later freed
        the new worker's own slots)."""
        if self._waiting:
            with self._cond:
                self._copy(dead=worker)

    def wait(self) -> float:
        return FAST_POLL if self._waiting else 0.1

    def finished(self, error: BaseException | None = None, report: Report | None = None) -> None:
        """The run has ended: with its ``report``, or with ``error``."""
        with self._cond:
            # Bodies still in the arenas stay there (the driver maps them too):
            # take() copies each as the caller comes to it.  Copied all at once
            # here, they held the arenas' half of the budget a second time.
            self._error = self._error or error
            self.report = report
            self._done = True
            self._cond.notify_all()

    def _item(self, result: FileResult) -> Item:
        if not result.ok:
            return Item(
                result.index, result.url, False, http_status=result.http_status,
                error=result.error, message=result.message,
            )  # fmt: skip
        payload = result.payload
        item = Item(result.index, result.url, True, http_status=result.http_status)
        if isinstance(payload, tuple) and payload:
            kind = payload[0]
            if kind == BYTES:
                item.data = payload[1]
            elif kind == SPILL:
                item = Item(
                    result.index, result.url, True, http_status=result.http_status,
                    path=Path(payload[1]),
                )  # fmt: skip
                if self._spill is not None:
                    self._spill.adopt(item, payload[1])
            elif kind == VALUE:
                item.value = payload[1]
        return item

    def _copy_waiting(self) -> None:
        """Bodies in the workers' arenas, into bytes, as far as the byte budget lets."""
        if not self._waiting:
            return
        with self._cond:
            self._copy(force_next=True)

    def _copy_after_the_run(self) -> bool:
        """The run has ended and the caller waits: bodies from the arenas, as far as
        the budget lets, and at least one (the next, when ordered); True if any."""
        return self._copy(force_next=True, force_one=True) > 0

    def _copy(
        self, *, force_next: bool = False, force_one: bool = False, dead: int | None = None
    ) -> int:
        """Copy what the budget lets (and the forced item); the number queued.
        ``dead``: copy all that worker's bodies (and only them), releasing none."""
        keep: list[FileResult] = []
        released: dict[int, list[int]] = {}
        items: list[tuple[int, Item]] = []
        for result in sorted(self._waiting, key=lambda r: r.key):
            payload = result.payload
            assert isinstance(payload, tuple)
            worker: int = payload[1]
            offset: int = payload[2]
            length: int = payload[3]
            if dead is not None and worker != dead:
                keep.append(result)
                continue
            head_of_line = force_next and self._ordered and result.key == self._next
            forced = head_of_line or worker == dead or (force_one and not items and not keep)
            if not (forced or self._budget.take(length)):
                keep.append(result)
                continue
            if forced:
                self._budget.force(length)  # no room check: see the module docstring
            assert self._arenas is not None
            data = bytes(self._arenas[worker].view[offset : offset + length])
            if worker != dead:
                released.setdefault(worker, []).append(offset)
            item = self._item(result)
            item.data = data
            items.append((result.key, item))
        self._waiting = keep
        if not self._done:  # the workers have ended, and the backend is closed
            for worker, tokens in released.items():
                self._backend.release(worker, tokens)
        self._queue_locked(items)
        return len(items)

    def _queue(self, items: list[tuple[int, Item]]) -> None:
        if items:
            with self._cond:
                self._queue_locked(items)

    def _queue_locked(self, items: list[tuple[int, Item]]) -> None:
        if not items:
            return
        if self._closing:
            # Nobody will take them (take() returns None once closing): their
            # files go now, not when this Delivery is collected.
            for _, item in items:
                item.close()
            return
        if self._ordered:
            for key, item in items:
                self._by_key[key] = item
        else:
            self._ready.extend(item for _, item in items)
        self._cond.notify_all()

    # -- the caller's side --------------------------------------------------------------

    def take(self, block: bool = True) -> Item | object | None:
        """The next item for the caller (None: there are no more; NOT_YET: none is
        ready and ``block`` is False); raises the run's error.  A failed item is
        returned with ``on_error="raise"`` too: the caller raises it (see
        :func:`raise_failed`), and the stream goes on if the caller does."""
        with self._cond:
            while True:
                if self._closing:
                    # Before the queue: items still in it after a close() are
                    # not the caller's any more (their spill files are gone).
                    return None
                item = self._pop()
                if item is not None:
                    self._consumed += 1
                    if self._starved:
                        # The supervisor waits for room to read more rows: tell it
                        # now, not at the end of its 0.1 s poll (a small prefetch
                        # cost ~0.1 s an item).
                        self._starved = False
                        self._backend.wake()
                    self._give_back(item)
                    if item.ok or self._on_error != "skip":
                        return item
                    continue
                if self._done and self._waiting and self._copy_after_the_run():
                    continue
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                if self._done:
                    return None
                if not block:
                    return NOT_YET
                self._cond.wait(0.1)  # a timeout keeps Ctrl-C prompt

    def raise_failed(self, item: Item) -> Item:
        """``item``, or with ``on_error="raise"`` and a failed item, its error."""
        if not item.ok and self._on_error == "raise":
            raise ItemError(item.error or "error", item.message or "", redact(item.url), item.index)
        return item

    def _pop(self) -> Item | None:
        if self._ordered:
            item = self._by_key.pop(self._next, None)
            if item is not None:
                self._next += 1
            return item
        return self._ready.popleft() if self._ready else None

    def _give_back(self, item: Item) -> None:
        """An item leaves for the caller: it no longer counts against the budget."""
        if item.data is not None:
            self._budget.give(len(item.data))

    def close(self) -> None:
        with self._cond:
            self._closing = True
            # Items still queued are not the caller's (take() returns None from
            # now on): their spill files go now.  Those handed out stay theirs.
            dropped = list(self._ready) + list(self._by_key.values())
            self._ready.clear()
            self._by_key.clear()
            self._cond.notify_all()
        for item in dropped:
            item.close()
