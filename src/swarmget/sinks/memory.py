"""Bodies for the caller instead of files: memory, shared memory, or a spill file.

Theory of operation
-------------------
The streaming iterator (``swarmget/streaming/``) gives the caller each URL's
bytes.  Its sink, :class:`MemorySink`, picks a writer when a response head
says how long the body will be:

* **In a worker process** (``workers > 1``) the body goes into the worker's
  :class:`Arena`: one anonymous shared mapping per worker, made by the driver
  before it forks, so the same pages are mapped in both processes.  The
  writer copies each slice of the receive buffer into its slot (the one copy
  there must be: the receive buffer is reused), and the driver copies the slot
  once into the ``bytes`` the caller gets, then hands the slot back
  (:meth:`MemorySink.release`).  Nothing is pickled, nothing crosses a pipe
  but ``(offset, length)``.
* **In the driver's own process** (``workers=1``, the engine on a thread) the
  body goes into a buffer of its announced length, which becomes the
  item's ``bytes`` when complete, without a copy (:class:`BufferWriter`).
* **A body of unknown length** (chunked, or ended by the close) starts in a
  provisional share: in a worker, an arena slot of up to :data:`PROVISIONAL`
  bytes that shrinks to the body when it ends (:class:`GrowingArenaWriter`);
  in the driver's process, a buffer charged to the budget as it grows.
* **Anything that does not fit** -- larger than the arena's free space, or
  than what the byte budget has left, or of unknown length and growing past
  its share -- goes to a file under the stream's spill directory
  (:class:`SpillWriter`).  The loop cannot stop reading a socket mid-body, so
  the budget is enforced where a body starts: what cannot fit is spilled, and
  a body of unknown length that outgrows its share is moved to a file.

With ``map``, the caller's function runs here, in the process that downloaded
the item, when the item is published; only its value travels on, and the body
is dropped (a spill file removed) right after.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import mmap
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from swarmget.errors import ErrorCode, TransferError
from swarmget.report import FileResult
from swarmget.sinks.base import Assignment, Hasher, Sink, Writer
from swarmget.sinks.files import io_error

# A body of unknown length starts in a slot this big (at most a quarter of the
# arena's free space; none below the minimum): most such bodies are dataset
# files of tens or hundreds of KB, and a larger one moves to a spill file.
PROVISIONAL: Final = 1 << 20
MIN_PROVISIONAL: Final = 1 << 16
_SPILL_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC

# Payloads, as results carry them to the driver (FileResult.payload):
ARENA: Final = "arena"  # ("arena", worker, offset, length): a slot of a worker's arena
BYTES: Final = "bytes"  # ("bytes", data): the body itself (same process)
SPILL: Final = "spill"  # ("spill", path): a file in the spill directory
VALUE: Final = "value"  # ("value", value): what map returned
PICKLED: Final = "pickled"  # ("pickled", bytes): a VALUE on its way from a worker


class Arena:
    """Shared memory for one worker's bodies, with a first-fit allocator.

    Made before the fork (an anonymous ``MAP_SHARED`` mapping is inherited),
    so the driver reads a slot the worker wrote without any copy in between.
    Only the worker allocates; the driver only reads and sends releases.
    """

    __slots__ = ("_ends", "_sizes", "_starts", "size", "view")

    def __init__(self, size: int) -> None:
        self.size = size
        self.view = memoryview(mmap.mmap(-1, max(size, mmap.PAGESIZE)))
        self._starts = [0]  # free extents, sorted by start
        self._ends = [size]
        self._sizes: dict[int, int] = {}  # allocated slot -> its length

    def allocate(self, length: int) -> int | None:
        """The offset of a free slot of ``length`` bytes, or None when none is free."""
        length = max(length, 1)
        for i, start in enumerate(self._starts):
            if self._ends[i] - start >= length:
                if self._ends[i] - start == length:
                    del self._starts[i], self._ends[i]
                else:
                    self._starts[i] = start + length
                self._sizes[start] = length
                return start
        return None

    def release(self, offset: int) -> None:
        length = self._sizes.pop(offset, 0)
        if not length:
            return
        end = offset + length
        i = bisect.bisect_left(self._starts, offset)
        starts, ends = self._starts, self._ends
        if i > 0 and ends[i - 1] == offset:  # joins the extent before it
            if i < len(starts) and starts[i] == end:  # ...and the one after
                ends[i - 1] = ends[i]
                del starts[i], ends[i]
            else:
                ends[i - 1] = end
        elif i < len(starts) and starts[i] == end:
            starts[i] = offset
        else:
            starts.insert(i, offset)
            ends.insert(i, end)

    def shrink(self, offset: int, length: int) -> None:
        """Keep only the first ``length`` bytes of the slot at ``offset``; free the rest."""
        old = self._sizes.get(offset, 0)
        length = max(length, 1)
        if length >= old:
            return
        self._sizes[offset] = length
        self._sizes[offset + length] = old - length  # the tail, as a slot of its own...
        self.release(offset + length)  # ...freed, and joined to its neighbours

    @property
    def free(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends, strict=True))


class Budget:
    """Body bytes held in memory ahead of the caller, all of them (thread-safe)."""

    __slots__ = ("_lock", "limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def force(self, n: int) -> None:
        """Hold ``n`` more bytes even past the limit (one item that must move)."""
        with self._lock:
            self.used += n

    def give(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)


class Slot:
    """A slot of a worker's arena, as a writer fills it."""

    __slots__ = ("arena", "length", "offset", "view", "worker")

    def __init__(self, arena: Arena, worker: int, offset: int, length: int) -> None:
        self.arena = arena
        self.worker = worker
        self.offset = offset
        self.length = length
        self.view = arena.view[offset : offset + length]

    def payload(self, written: int) -> tuple[str, int, int, int]:
        return (ARENA, self.worker, self.offset, written)

    def free(self) -> None:
        self.view.release()
        self.arena.release(self.offset)


class ArenaWriter(Writer):
    """A body of announced length, straight into its arena slot."""

    __slots__ = ("slot",)

    def __init__(self, slot: Slot, hashers: dict[str, Hasher] | None) -> None:
        super().__init__(hashers)
        self.slot = slot

    def write(self, data: memoryview | bytes) -> None:
        slot = self.slot
        end = self.written + len(data)
        if end > slot.length:
            raise TransferError(ErrorCode.PROTOCOL, "the body is longer than announced")
        slot.view[self.written : end] = data
        self._hash(data)
        self.written = end

    def finish(self) -> None:
        self.payload = self.slot.payload(self.written)

    def abort(self, keep: bool = False) -> None:
        self.slot.free()


class OverflowWriter(Writer):
    """A body of uncertain size, held in memory while it fits its share and moved
    to a spill file when it outgrows it: the loop cannot stop reading mid-body.

    Subclasses say where the memory is: :meth:`_hold` keeps more bytes (or says
    they do not fit, changing nothing), :meth:`_held` is what is kept so far,
    :meth:`_let_go` frees it, :meth:`_finish_held` makes the payload from it.
    """

    __slots__ = ("_spill", "_spill_path")

    def __init__(self, spill_path: str, hashers: dict[str, Hasher] | None) -> None:
        super().__init__(hashers)
        self._spill: SpillWriter | None = None
        self._spill_path = spill_path

    def write(self, data: memoryview | bytes) -> None:
        spill = self._spill
        if spill is None:
            if self._hold(data):
                self.written += len(data)
                self._hash(data)
                return
            spill = SpillWriter(self._spill_path, None)  # we hash, not it
            spill.write(self._held())
            self._let_go()
            self._spill = spill
        spill.write(data)
        self.written += len(data)
        self._hash(data)

    def finish(self) -> None:
        if self._spill is not None:
            self._spill.finish()
            self.payload = self._spill.payload
        else:
            self._finish_held()

    def abort(self, keep: bool = False) -> None:
        if self._spill is not None:
            self._spill.abort()
        else:
            self._let_go()

    def _hold(self, data: memoryview | bytes) -> bool:
        raise NotImplementedError

    def _held(self) -> memoryview:
        raise NotImplementedError

    def _let_go(self) -> None:
        raise NotImplementedError

    def _finish_held(self) -> None:
        raise NotImplementedError


class GrowingArenaWriter(OverflowWriter):
    """A body of unknown length (chunked, or ended by the close) in a provisional
    arena slot, shrunk to the body when it ends."""

    __slots__ = ("slot",)

    def __init__(self, slot: Slot, spill_path: str, hashers: dict[str, Hasher] | None) -> None:
        super().__init__(spill_path, hashers)
        self.slot = slot

    def _hold(self, data: memoryview | bytes) -> bool:
        end = self.written + len(data)
        if end > self.slot.length:
            return False
        self.slot.view[self.written : end] = data
        return True

    def _held(self) -> memoryview:
        return self.slot.view[: self.written]

    def _let_go(self) -> None:
        self.slot.free()

    def _finish_held(self) -> None:
        slot = self.slot
        slot.arena.shrink(slot.offset, self.written)
        self.payload = slot.payload(self.written)


class BufferWriter(OverflowWriter):
    """A body in this process's memory, charged to the byte budget as it grows.

    Held in a ``BytesIO``, not a ``bytearray``: the ``bytes`` the caller gets
    had to be copied from a bytearray when the body ended, so for a moment a
    body cost twice its size, beyond the budget (a 200 MB body peaked at
    434 MB).  CPython's ``BytesIO.getvalue()`` hands over its own buffer when
    nothing else refers to it, and a buffer grown by ``write`` is resized in
    place (``realloc``), so the body is in memory once.  A body of announced
    length gets its whole buffer at the start: no resize at all.
    """

    __slots__ = ("_budget", "_buffer", "_reserved")

    def __init__(
        self,
        budget: Budget,
        reserved: int,
        spill_path: str,
        hashers: dict[str, Hasher] | None,
    ) -> None:
        super().__init__(spill_path, hashers)
        self._budget = budget
        self._reserved = reserved  # budget bytes taken for this body so far
        self._buffer = _buffer_of(reserved)

    def _hold(self, data: memoryview | bytes) -> bool:
        need = self.written + len(data) - self._reserved
        if need > 0:
            if not self._budget.take(max(need, 1 << 16)):
                return False
            self._reserved += max(need, 1 << 16)
        self._buffer.write(data)
        return True

    def _held(self) -> memoryview:
        return self._buffer.getbuffer()[: self.written]

    def _let_go(self) -> None:
        self._budget.give(self._reserved)
        self._reserved = 0
        self._buffer = io.BytesIO()

    def _finish_held(self) -> None:
        buffer, self._buffer = self._buffer, io.BytesIO()
        buffer.truncate(self.written)  # a body shorter than its room (never, for a whole one)
        data = buffer.getvalue()  # the buffer itself, not a copy (see the class docstring)
        # What stays charged is exactly the body; the caller gives it back.
        self._budget.give(self._reserved - len(data))
        self._reserved = len(data)
        self.payload = (BYTES, data)


def _buffer_of(length: int) -> io.BytesIO:
    """An empty ``BytesIO`` whose buffer already has room for ``length`` bytes:
    writing one byte at the end sizes it once (the zeros it leaves are written
    over), and the position goes back to the start."""
    buffer = io.BytesIO()
    if length > 0:
        buffer.seek(length - 1)
        buffer.write(b"\0")
        buffer.seek(0)
    return buffer


class SpillWriter(Writer):
    """A body in a file of the spill directory (no rename: the path is the item's)."""

    __slots__ = ("fd", "path")

    def __init__(self, path: str, hashers: dict[str, Hasher] | None) -> None:
        super().__init__(hashers)
        self.path = path
        try:
            self.fd = os.open(path, _SPILL_FLAGS, 0o600)
        except OSError as exc:
            raise io_error("create", path, exc) from None

    def write(self, data: memoryview | bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
        except OSError as exc:
            raise io_error("write", self.path, exc) from None
        self._hash(data)
        self.written += len(data)

    def finish(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
        self.payload = (SPILL, self.path)

    def abort(self, keep: bool = False) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class MapSlices:
    """Runs ``map`` on finished items a slice of time at a time, between loop turns.

    The function holds the process (the GIL) while it runs, so running it on a
    whole batch of finished items at once would leave every connection of this
    event loop unserved meanwhile: the next requests would go out late, and
    downloading would stop overlapping with mapping.  Instead finished items
    wait here, and each loop turn maps for at most ``SLICE`` seconds after
    handling the sockets; their results are reported as they are mapped.
    """

    SLICE: Final = 0.005

    def __init__(self, sink: MemorySink, events: Any, loop: Any) -> None:
        self._sink = sink
        self._events = events
        self._loop = loop
        self._queue: deque[FileResult] = deque()
        self._scheduled = False

    @property
    def busy(self) -> bool:
        return bool(self._queue)

    def finished(self, result: FileResult) -> None:
        if not result.ok:
            self._events.finished(result)
            return
        self._queue.append(result)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def partial(self, row: Assignment, validator: str | None, total: int | None) -> None:
        self._events.partial(row, validator, total)

    def _run(self) -> None:
        self._scheduled = False
        queue, sink, events = self._queue, self._sink, self._events
        started = time.monotonic()
        deadline = started + self.SLICE
        while queue:
            result = queue.popleft()
            sink.run_map(result)
            events.finished(result)
            now = time.monotonic()
            if now - started >= self.SLICE:
                # A slow function: its value goes to the caller now, not after
                # the next item's (a fast one's waits for the usual report).
                events.flush()
            if now >= deadline:
                break
            started = now
        if queue:
            self._scheduled = True
            self._loop.call_soon(self._run)


def map_failed(result: FileResult, message: str) -> None:
    """``result`` fails with ``map_error``: the caller's function raised, or what it
    returned cannot reach the caller."""
    result.status = "failed"
    result.path = None
    result.error = ErrorCode.MAP_ERROR
    result.message = message
    result.payload = None


def pickle_values(results: list[FileResult]) -> None:
    """In a worker, before its report is sent: each ``map`` value pickled on its
    own, so that one that cannot be sent, or cannot be loaded in the driver, fails
    its own item (see :func:`unpickle_values`), not the report it came in."""
    for result in results:
        payload = result.payload
        if type(payload) is tuple and payload[0] == VALUE:
            try:
                result.payload = (PICKLED, pickle.dumps(payload[1], pickle.HIGHEST_PROTOCOL))
            except Exception as exc:
                map_failed(
                    result,
                    "map returned a value that cannot be sent back from the worker process "
                    f"(it must pickle): {describe(exc)}",
                )


def unpickle_values(results: list[FileResult]) -> None:
    """In the driver: each value loaded on its own.  One that pickled but will not
    load (an exception class whose ``__init__`` wants other arguments) failed a
    whole report: a hundred rows lost as ``crashed``; now its item fails with
    ``map_error``."""
    for result in results:
        payload = result.payload
        if type(payload) is tuple and payload[0] == PICKLED:
            try:
                result.payload = (VALUE, pickle.loads(payload[1]))
            except Exception as exc:
                map_failed(
                    result,
                    "map returned a value that pickles but cannot be loaded back "
                    f"(unpickling it failed): {describe(exc)}",
                )


def describe(exc: BaseException) -> str:
    """``"Name: text"`` for an exception of the caller's, whose ``__str__`` may raise too."""
    try:
        text = str(exc)
    except Exception as inner:
        text = f"(its text could not be made: {type(inner).__name__})"
    return f"{type(exc).__name__}: {text}"


class MemorySink(Sink):
    """Bodies for the streaming iterator (see the module docstring)."""

    def __init__(
        self,
        spill_dir: str,
        *,
        worker: int = 0,
        arena: Arena | None = None,
        budget: Budget | None = None,
        map_fn: Callable[[Any], Any] | None = None,
        make_item: Callable[..., Any] | None = None,
    ) -> None:
        self.spill_dir = spill_dir
        self.worker = worker
        self.arena = arena
        self.budget = budget if budget is not None else Budget(1 << 62)
        self.map_fn = map_fn
        self.make_item = make_item  # builds the Item map_fn gets (streaming/items.py)
        self._mapper: MapSlices | None = None
        self._spilled = 0
        self.mapping = False  # the caller's function is running (worker.py's stop signal)
        self.stop_requested = False  # worker.py's stop signal came
        self.stops_by_request = False  # set in a worker process, or on a stream's thread

    def open(
        self, job: Assignment, start: int, length: int | None, hashers: dict[str, Hasher] | None
    ) -> Writer:
        arena = self.arena
        if arena is not None and length is not None:
            offset = arena.allocate(length)
            if offset is not None:
                return ArenaWriter(Slot(arena, self.worker, offset, length), hashers)
        elif arena is not None:
            # Unknown length: a provisional slot, a share of what is free.
            provisional = min(PROVISIONAL, arena.free // 4)
            offset = arena.allocate(provisional) if provisional >= MIN_PROVISIONAL else None
            if offset is not None:
                slot = Slot(arena, self.worker, offset, provisional)
                return GrowingArenaWriter(slot, self._spill_path(job), hashers)
        else:
            reserved = length if length is not None else 0
            if self.budget.take(reserved):
                return BufferWriter(self.budget, reserved, self._spill_path(job), hashers)
        return SpillWriter(self._spill_path(job), hashers)

    def _spill_path(self, job: Assignment) -> str:
        self._spilled += 1
        return os.path.join(self.spill_dir, f"{job.index:012d}-{os.getpid()}-{self._spilled}")

    def publish(self, done: list[tuple[Assignment, Writer]]) -> list[TransferError | None]:
        return [None] * len(done)  # the payload goes on with the result; map comes later

    def events_for(self, events: Any, loop: Any) -> Any:
        if self.map_fn is None:
            return events
        self._mapper = MapSlices(self, events, loop)
        return self._mapper

    @property
    def busy(self) -> bool:
        return self._mapper is not None and self._mapper.busy

    def run_map(self, result: FileResult) -> None:
        """Run the caller's function on ``result``'s body, here; only its value goes on."""
        fn, make_item = self.map_fn, self.make_item
        assert fn is not None and make_item is not None
        payload = result.payload
        item = make_item(result.index, result.url, payload, self.arena, result.http_status)
        try:
            self.mapping = True  # inside the try: a stop signal here still cleans up
            if self.stop_requested:
                # The signal came between two calls (mapping was False, so it only
                # set the flag): the next call would have run to its end, seconds
                # after close() was asked for.  (Set before mapping is read there,
                # and read after mapping is set here: no gap between the two.)
                raise KeyboardInterrupt
            result.payload = (VALUE, fn(item))
        except KeyboardInterrupt as exc:
            # Ctrl-C, or the driver stopping this worker (parallel/worker.py).
            # In a worker process only a stop signal is one: SIGINT is ignored
            # there, so one map raised itself fails its item, as SystemExit does
            # (and on a stream's own thread, where no Ctrl-C arrives: core.py).
            if self.stop_requested or not self.stops_by_request:
                raise
            map_failed(result, describe(exc))
        except BaseException as exc:  # sys.exit() or a BaseException of the caller's own:
            map_failed(result, describe(exc))  # that item fails, not the worker
        finally:
            self.mapping = False
            item.close()
            self._drop(payload)

    def _drop(self, payload: object) -> None:
        """The body is no longer needed (map has run): free its slot, file or budget."""
        if not isinstance(payload, tuple):
            return
        if payload[0] == ARENA and self.arena is not None:
            self.arena.release(payload[2])
        elif payload[0] == BYTES:
            self.budget.give(len(payload[1]))
        elif payload[0] == SPILL:
            with contextlib.suppress(OSError):
                os.unlink(payload[1])

    def release(self, token: int) -> None:
        if self.arena is not None:
            self.arena.release(token)
