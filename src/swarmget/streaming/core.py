"""``swarmget.stream()``: the bytes of every URL, inside the caller's own loop.

Theory of operation
-------------------
A stream is a run like ``download()`` -- the same supervisor, backends and
engines -- with three parts swapped:

* the planner (:class:`StreamPlanner`) names nothing and keeps no journal: a
  row's identity is its index, and a bad row or URL is an item that failed;
* the sink is :class:`~swarmget.sinks.memory.MemorySink`: bodies go to memory
  (shared with the driver when they are downloaded in worker processes), or
  to files in the spill directory when they do not fit;
* the outcomes go to a :class:`~swarmget.streaming.delivery.Delivery`, the queue
  the caller's ``for`` loop reads, which also paces the run (``prefetch``).

The supervisor runs on a daemon thread, so downloading (and ``map``, in the
worker processes) goes on while the caller works on the items it has.  Worker
processes are forked in the caller's thread before that thread starts, so a
fork never copies a half-held lock of ours.

Ending early is as safe as finishing: leaving the ``with``, :meth:`Stream.close`,
dropping the iterator, Ctrl-C, or the interpreter exiting all stop the run,
end the workers, and remove the spill files, within a second or two -- but
those of items the caller still holds, which go with their items
(:mod:`swarmget.streaming.spill`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import numbers
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, Final

from swarmget.engine.urls import UrlSplitter, redact, redact_failure
from swarmget.errors import ErrorCode, TransferError, UsageError
from swarmget.options import Options, check_yes_no
from swarmget.parallel.backend import Backend
from swarmget.parallel.fork import ForkBackend
from swarmget.parallel.inline import InlineBackend
from swarmget.parallel.supervisor import BATCH, Supervisor
from swarmget.parallel.workers import worker_count, worker_shares
from swarmget.report import FileResult, ProgressListener, Report, check_progress
from swarmget.sinks.base import Assignment
from swarmget.sinks.files import OutputError
from swarmget.sinks.memory import Arena, Budget, MemorySink
from swarmget.sinks.plan import PlanBatch
from swarmget.sources.rows import Row
from swarmget.streaming.delivery import ON_ERROR, Delivery
from swarmget.streaming.items import Item, body_item
from swarmget.streaming.spill import SpillDir

# Seconds close() waits for the run's thread.  With one process, ``map`` runs on
# that thread and a call already running cannot be cut short: close() returns
# after this, and the thread ends (a daemon) as soon as that call returns.
STOP_WAIT: Final = 2.0
# ... and a worker process, told to stop, before it is killed: within STOP_WAIT,
# so that close() returns with the workers gone even when map is in a long C
# call that never looks at signals.  (A stream keeps no parts to save.)
WORKER_STOP_WAIT: Final = 1.5
_open_streams: weakref.WeakSet[Stream] = weakref.WeakSet()


class StreamPlanner:
    """Plans rows for a stream: no names, no journal; a bad row is a failed item.

    A row's key is its place in the order rows were read (0, 1, 2...):
    ``ordered=True`` yields by it, whatever the rows' own indices are (a
    shuffled or sharded list keeps its indices, see swarmget.torch).
    """

    def __init__(self) -> None:
        self._split = UrlSplitter().split
        self._read = 0

    def plan(self, rows: list[Row]) -> PlanBatch:
        batch = PlanBatch([], [])
        for row in rows:
            key = self._read
            self._read += 1
            try:
                if row.problem:
                    raise TransferError(ErrorCode.BAD_ROW, row.problem)
                self._split(row.url)
            except TransferError as exc:
                url, message = redact_failure(redact(row.url), exc)
                batch.results.append(
                    FileResult(
                        url,
                        None,
                        "failed",
                        None,
                        0,
                        exc.code,
                        0,
                        0,
                        message,
                        index=row.index,
                        key=key,
                    )
                )
                continue
            batch.assignments.append(
                Assignment(row.index, key, row.url, None, row.sha256, row.md5, row.size)
            )
        return batch

    def record(self, results: list[FileResult]) -> list[FileResult]:
        return []

    def partial(self, key: int, validator: str | None, total: int | None) -> None:
        pass

    def redeal(self, rows: list[Assignment]) -> None:
        pass  # a dead worker's bodies died with it

    def out_of_room(self) -> OutputError | None:
        return None  # no journal: no room of its own to run out of

    def commit(self) -> None:
        pass

    def finish(self, interrupted: bool, whole: bool = False) -> None:
        pass


def worker_sink(
    spill_dir: str, arenas: list[Arena], map_fn: Callable[[Item], Any] | None, worker: int
) -> MemorySink:
    """The sink of worker process ``worker`` (make_sink for ForkBackend)."""
    arena = arenas[worker]
    return MemorySink(spill_dir, worker=worker, arena=arena, map_fn=map_fn, make_item=_make_item)


def _make_item(
    index: int, url: str, payload: object, arena: Arena | None, http_status: int | None
) -> Item:
    return body_item(index, url, payload, arena, http_status)


# Stream's own arguments (beside urls and map); the rest are download options.
STREAM_ARGUMENTS: Final = frozenset(
    {"sources", "ordered", "prefetch", "max_buffer_bytes", "spill_dir", "on_error", "workers",
     "progress"}
)  # fmt: skip


class Stream(Iterator[Item]):
    """Every URL's bytes, as :class:`Item`\\ s, while the next ones download
    (``swarmget.stream(...)``): a context manager and an iterator of items.

    ``urls`` is any iterable of URL strings or :class:`~swarmget.sources.Row`
    (read lazily).  ``map=fn`` runs ``fn(item)`` in the worker process that
    downloaded the item, and only its value comes back (``item.value``, so it
    must pickle); an exception in ``fn``, or a value that does not pickle, fails
    the item with ``map_error``.  ``ordered`` yields in input order (else in
    completion order).  ``prefetch`` bounds the items
    downloading or waiting ahead of the caller, ``max_buffer_bytes`` the bytes
    they hold in memory, all processes together; bodies beyond it go to files
    under ``spill_dir`` (a temporary directory by default), removed when the
    item is dropped (closing the stream removes those it never handed out).
    ``on_error``: ``"yield"`` failed items (``item.ok`` False), ``"skip"`` them, or ``"raise"``
    :class:`~swarmget.TransferError` when the loop reaches one.  ``workers``:
    processes, one per CPU by default.  Every option of
    :func:`swarmget.download` applies (concurrency, per_host, retries,
    timeouts, checksums, TLS, proxies), and ``sources`` (input files, ``-``,
    URLs, read before ``urls``, which may then be None), and its rule for
    indices (``item.index``: a Row's own, or numbered on from the highest so
    far; a Row at or below an index swarmget numbered is a UsageError);
    ``progress=True`` shows the live display (or give a listener, as to
    :func:`swarmget.download`).  Use it in a ``with`` block (or
    call ``close()``) so an early exit stops the downloads at once::

        with swarmget.stream(urls, map=decode) as items:
            for item in items:
                train_on(item.value)
    """

    def __init__(
        self,
        urls: Iterable[str | Row] | None = None,
        *,
        sources: Sequence[str] | None = None,
        map: Callable[[Item], Any] | None = None,
        ordered: bool = False,
        prefetch: int = 256,
        max_buffer_bytes: int = 256 << 20,
        spill_dir: str | os.PathLike[str] | None = None,
        on_error: str = "yield",
        workers: int | None = None,
        progress: bool | ProgressListener = False,
        **options: Any,
    ) -> None:
        from swarmget.api import input_rows

        if on_error not in ON_ERROR:
            raise UsageError(f"on_error must be one of {', '.join(ON_ERROR)}, not {on_error!r}")
        if not _whole(prefetch) or prefetch < 1:
            raise UsageError(f"prefetch must be a whole number, at least 1, not {prefetch!r}")
        if not _whole(max_buffer_bytes) or max_buffer_bytes < 0:
            raise UsageError(
                f"max_buffer_bytes must be a whole number of bytes >= 0, not {max_buffer_bytes!r}"
            )
        if map is not None and not callable(map):
            # Caught here, not as a map_error on every item.
            raise UsageError(f"map must be a function of one item, not {map!r}")
        check_yes_no("ordered", ordered)
        check_progress(progress)
        if workers is not None:
            options["workers"] = workers
        self._options = Options.from_kwargs(options)
        self._rows = input_rows(urls, sources)
        self._map = map
        self._ordered = ordered
        self._prefetch = int(prefetch)
        self._limit = int(max_buffer_bytes)
        self._spill_parent = _spill_parent(spill_dir)
        self._on_error = on_error
        self._progress = progress
        self._started = False
        self._closed = False
        # Two threads each taking the first item both started the run (the
        # second found _started set and no Delivery yet: an AssertionError).
        # Held while starting and closing; re-entrant for a close() from a
        # finaliser that runs on this thread meanwhile.
        self._lifecycle = threading.RLock()
        # The process the stream belongs to: a child forked from the caller's
        # program inherits the object (and the exit hook), not the workers or
        # the spill files, and must not end or remove them.
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._delivery: Delivery | None = None
        self._display: Any = None
        self._spill: SpillDir | None = None
        self.spill_dir: str | None = None
        # Set before the start, names the spill folder so that another process
        # can find it (swarmget.torch: the dataset's maker sweeps its loader
        # workers' folders at its exit, spill.sweep_group).
        self.spill_group: str = ""

    # -- starting -----------------------------------------------------------------------

    def _start(self) -> None:
        if not self._started:  # set last: once True, a Delivery and a thread exist
            with self._lifecycle:
                self._start_once()

    def _start_once(self) -> None:
        if self._started:
            return  # another thread started it while this one waited
        if self._closed:
            raise UsageError("this stream is closed")
        self._launch()
        self._started = True

    def _launch(self) -> None:
        from swarmget.api import fit_concurrency

        # As download() does: sockets beyond the limit of open files would fail
        # items with "Too many open files" (said once, concurrency lowered).
        self._options = fit_concurrency(self._options)
        self._spill = SpillDir(self._spill_parent, self.spill_group)
        self.spill_dir = self._spill.path
        backend: Backend | None = None
        try:
            backend, budget, arenas = self._backend()
            self._delivery = Delivery(
                ordered=self._ordered, prefetch=self._prefetch, on_error=self._on_error,
                budget=budget, arenas=arenas, backend=backend, spill=self._spill,
            )  # fmt: skip
            supervisor = self._supervisor(backend)
        except BaseException:
            # A Ctrl-C (or any error) after the workers were forked: they end
            # now, not when the collector happens to free their pipes.
            if backend is not None:
                _end_workers(backend)
            self._delivery = None
            self._spill.remove()
            raise
        # The thread is given what it drives, never the Stream itself: a caller
        # who breaks out of a bare `for` and drops the stream must let it be
        # collected, so that __del__ stops the run (a running thread holding
        # the stream would keep the workers alive until the interpreter exits).
        self._thread = threading.Thread(
            target=_drive, args=(supervisor, self._delivery),
            name="swarmget-stream", daemon=True,
        )  # fmt: skip
        _open_streams.add(self)
        self._thread.start()

    def _backend(self) -> tuple[Backend, Budget, list[Arena] | None]:
        options = self._options
        workers = worker_count(options)
        assert self.spill_dir is not None
        if workers > 1:
            # Half the byte budget for bodies in the workers' arenas, half for
            # bodies here waiting for the caller (stream/delivery.py).
            arenas = _arenas(self._limit, workers)
            make = functools.partial(worker_sink, self.spill_dir, arenas, self._map)
            shares = worker_shares(options, workers)
            backend = ForkBackend(make, shares, stop_wait=WORKER_STOP_WAIT)
            try:
                backend.start()  # fork now, in the caller's thread, before ours starts
                return backend, Budget(self._limit // 2), arenas
            except BaseException:
                _end_workers(backend)  # those forked before a Ctrl-C, say
                raise
        budget = Budget(self._limit)
        spill_dir, fn = self.spill_dir, self._map

        def make_sink(worker: int) -> MemorySink:
            sink = MemorySink(spill_dir, budget=budget, map_fn=fn, make_item=_make_item)
            # map runs on the stream's thread (_drive), never the main thread,
            # where Python raises a Ctrl-C: a KeyboardInterrupt here is map's
            # own, and fails its item, as in a worker process (it ended the
            # whole stream).  The caller's Ctrl-C comes in the caller's thread,
            # and closes the stream there.
            sink.stops_by_request = True
            return sink

        return InlineBackend(make_sink, options), budget, None

    def _supervisor(self, backend: Backend) -> Supervisor:
        progress: ProgressListener | None = None
        if self._progress is True:
            from swarmget.progress import make_progress

            self._display = progress = make_progress(sys.stderr)
        elif self._progress:
            progress = self._progress  # the caller's own listener, as download() takes one
        assert self._delivery is not None
        backlog = 2 * max(1, self._options.concurrency // max(1, backend.workers)) + BATCH
        return Supervisor(
            self._rows, StreamPlanner(), backend, backlog_limit=backlog, progress=progress,
            delivery=self._delivery,
        )  # fmt: skip

    @property
    def report(self) -> Report | None:
        """The run's totals, once it has ended (None before)."""
        return self._delivery.report if self._delivery is not None else None

    # -- iterating ----------------------------------------------------------------------

    def __iter__(self) -> Stream:
        self._start()
        return self

    def __next__(self) -> Item:
        self._start()
        delivery = self._delivery
        assert delivery is not None
        if self._closed:
            raise StopIteration  # close() removed the spill files: no item may follow
        try:
            item = delivery.take()
        except BaseException:
            self.close()
            raise
        if item is None:
            self._wind_up()
            raise StopIteration
        assert isinstance(item, Item)
        if self.closed:
            # close() came from another thread while this item was being taken.
            item.close()
            raise StopIteration
        # on_error="raise": this item's error, and the stream goes on if the
        # caller catches it (it used to close, and the loop ended silently).
        return delivery.raise_failed(item)

    def ready(self) -> Item | object | None:
        """The next item if one is ready now, without waiting (NOT_YET otherwise);
        None once the stream has ended or was closed."""
        self._start()
        delivery = self._delivery
        assert delivery is not None
        if self._closed:
            return None
        item = delivery.take(block=False)
        if item is None:
            self._wind_up()
        if isinstance(item, Item):
            return delivery.raise_failed(item)
        return item

    # -- ending -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called: the stream yields nothing more."""
        return self._closed

    def __enter__(self) -> Stream:
        if self._closed:
            # Entered again after close(): the block would see no items, silently.
            raise UsageError("this stream is closed")
        self._start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop downloading, end the workers, remove the spill files.  Safe to repeat."""
        with self._lifecycle:  # not while another thread is starting the run
            if self._closed:
                return
            self._closed = True
        try:
            if os.getpid() != self._pid:
                return  # a forked copy: the stream is its parent's
            self._wind_up()
        finally:
            # Only now: a close under way on another thread (a dropped astream's)
            # may be cut short by the interpreter's exit, and the exit hook must
            # still find the stream and remove its folder.
            _open_streams.discard(self)

    def remove_spill_folder(self) -> None:
        """Remove the spill folder, the files of items still held too (the
        interpreter is exiting).  Their files were left to their items'
        finalisers, but weakref.finalize's own exit hook may have run before
        ours: it sets finalisers off for good, so the items the run delivered
        after it kept their files, and the folder stayed in /tmp."""
        if self._spill is not None:
            self._spill.remove()

    def _wind_up(self) -> None:
        """End the run and remove the spill files, but those of the items the
        caller still holds: each goes when its item is dropped (the folder with
        the last), or at the interpreter's exit.  At close(), and as soon as
        every item has been handed out: a stream kept after its loop
        (``items = stream(...)``, no ``with``) kept its empty folder until it
        was dropped."""
        self._end_run()
        if self._spill is not None:
            self._spill.close()

    def _end_run(self) -> None:
        """Stop the run and wait for its thread (the workers end with it)."""
        if self._delivery is not None:
            self._delivery.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT)
        if self._display is not None:
            self._display.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()


def _drive(supervisor: Supervisor, delivery: Delivery) -> None:
    """The stream's thread: the run, then the end of the items (with the run's
    report, or its error)."""
    report: Report | None = None
    error: BaseException | None = None
    try:
        report = supervisor.run()
    except BaseException as exc:
        error = exc
    finally:
        delivery.finished(error, report)


def _spill_parent(spill_dir: object) -> str | None:
    """``spill_dir`` as a path (None: the temporary directory); not a bare TypeError."""
    if spill_dir is None:
        return None
    try:
        parent: str | bytes = os.fspath(spill_dir)  # type: ignore[call-overload]
    except TypeError:
        raise UsageError(f"spill_dir must be a path, not {spill_dir!r}") from None
    if isinstance(parent, bytes):
        raise UsageError(f"spill_dir must be a str path, not bytes {parent!r}")
    return parent


def _whole(value: object) -> bool:
    """An integer (numpy's too), not a bool or a float."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _arenas(limit: int, workers: int) -> list[Arena]:
    """Each worker's arena: its share of half the byte budget, but never more
    than its share of half the machine's memory (a "no limit" budget such as
    1 << 40 would ask for a mapping the kernel refuses; bodies beyond an arena
    wait in the worker or spill, as at any budget)."""
    share = limit // (2 * workers)
    with contextlib.suppress(ValueError, OSError, AttributeError):
        share = min(
            share, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (2 * workers)
        )
    try:
        return [Arena(share) for _ in range(workers)]
    except OSError as exc:
        raise UsageError(
            f"max_buffer_bytes={limit}: cannot map {share} bytes of shared memory "
            f"for each of {workers} workers ({exc.strerror}); give a smaller budget"
        ) from None


def _end_workers(backend: Backend) -> None:
    """Stop a backend whose run never began: its workers end, none left behind."""
    with contextlib.suppress(Exception):
        backend.stop()
    backend.close()


@atexit.register
def _close_open_streams() -> None:
    """The interpreter is exiting: no stream may leave workers or spill files behind."""
    for stream in list(_open_streams):
        stream.close()
        stream.remove_spill_folder()
