"""A worker process: one Engine fed with rows over a pipe, reporting back over it.

The pipe is registered with the engine's own event loop, so waiting for rows
never blocks transfers in flight: a batch that arrives wakes the loop and
goes straight into the engine.  What the engine reports (finished rows,
resumable parts) is batched and sent to the driver ten times a second, with
what is in flight, or sooner when a batch grows large or holds a quarter of
the rows the worker has (see :meth:`PipeEvents.finished`).

If the driver goes away (the pipe reaches EOF, or Linux's parent-death signal
arrives) or tells us to stop (SIGTERM), the worker stops as on Ctrl-C: files
already complete are published and reported, parts in flight are kept for
resuming, and nothing is left half-written at a final name.  A worker that
outlives its driver by ORPHAN_GRACE seconds all the same (stuck in C code,
where no Python signal handler runs) kills itself.  SIGUSR1 stops it
the same way after a run-stopping error elsewhere (a full disk), keeping only
the parts worth resuming.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from types import FrameType
from typing import Final

from swarmget.engine.core import Engine
from swarmget.errors import SwarmgetError
from swarmget.loop import EVENT_READ
from swarmget.options import Options
from swarmget.parallel.backend import (
    Done,
    Finished,
    NoMoreRows,
    Partial,
    Progress,
    Release,
    Rows,
    Stopped,
    done_of,
    is_plain,
)
from swarmget.parallel.deathsig import parent_death_signal
from swarmget.report import FileResult
from swarmget.sinks.base import Assignment, Sink
from swarmget.sinks.memory import pickle_values

REPORT_INTERVAL: Final = 0.1  # seconds between Progress messages
REPORT_BATCH: Final = 512  # results that make a Progress message go at once
# An orphaned worker (its driver died) gets as long to stop as asked, keeping
# its parts, as the driver gives a worker it stops (fork.STOP_WAIT); then it
# ends itself.  The parent is looked at once a second, by a sleeping thread.
ORPHAN_GRACE: Final = 10.0
ORPHAN_CHECK: Final = 1.0


class PipeEvents:
    """Batches the engine's events into Progress messages to the driver."""

    def __init__(self, conn: Connection, worker: int) -> None:
        self._conn = conn
        self._worker = worker
        self._results: list[FileResult] = []
        self._partials: list[Partial] = []
        self.engine: Engine | None = None
        # The pipe broke under a send: the driver died (a SIGKILL) before its
        # end of the pipe read as EOF here.  The worker stops as on EOF.
        self.driver_gone = False

    def finished(self, result: FileResult) -> None:
        results = self._results
        results.append(result)
        pending = len(results)
        if pending >= REPORT_BATCH:
            self.flush()
            return
        # Send sooner when a quarter of the rows this worker holds are done: the
        # driver deals more only as it hears of these, so a small window (a
        # stream's prefetch, the end of a list) must not wait a whole interval
        # per round trip.  Large file runs still send every 512 results or 0.1 s.
        engine = self.engine
        if engine is not None and pending * 4 >= engine.backlog() + pending:
            self.flush()

    def partial(self, row: Assignment, validator: str | None, total: int | None) -> None:
        self._partials.append((row.key, validator, total))

    def flush(self) -> None:
        if self.driver_gone:
            self._results, self._partials = [], []  # nobody to tell: a rerun redoes them
            return
        engine = self.engine
        active, in_flight = engine.active() if engine is not None else (0, 0)
        parked = engine.parked() if engine is not None else 0
        waiting = engine.waiting() if engine is not None and not self._results else None
        results: list[FileResult] = []
        done: list[Done] = []
        for result in self._results:
            if is_plain(result):
                done.append(done_of(result))
            else:
                results.append(result)
        message = Progress(
            self._worker, results, self._partials, active, in_flight, parked, waiting, done
        )
        self._results, self._partials = [], []
        pickle_values(message.results)
        data = ForkingPickler.dumps(message)
        try:
            self._conn.send_bytes(data)  # what Connection.send does, after the pickling
        except OSError:
            # Raised here, it cut the engine's turn (or its abort) short with a
            # traceback; the loop stops between turns instead (worker_main).
            self.driver_gone = True


class PipeFeed:
    """Loop handler for the pipe from the driver: rows in, or the end of them."""

    def __init__(self, conn: Connection, engine: Engine) -> None:
        self._conn = conn
        self._engine = engine
        # "Is a message waiting?" as one C call: Connection.poll() builds a
        # selector and registers the pipe each time (~2 us, at least twice a
        # message).  An ended pipe is reported too (POLLHUP): recv() then
        # raises EOFError, as after Connection.poll().
        self._readable = select.poll()
        self._readable.register(conn.fileno(), select.POLLIN)

    def handle_io(self, mask: int) -> None:
        try:
            while self._readable.poll(0):
                message = self._conn.recv()
                if isinstance(message, Rows):
                    self._engine.add([Assignment.from_tuple(fields) for fields in message.rows])
                elif isinstance(message, Release):
                    for token in message.tokens:
                        self._engine.sink.release(token)
                elif isinstance(message, NoMoreRows):
                    # The pipe stays registered, so that the driver's death is
                    # still noticed (EOF) until we finish.
                    self._engine.close_input()
        except (EOFError, OSError):
            raise KeyboardInterrupt from None  # the driver is gone: stop as on Ctrl-C


def worker_main(
    conn: Connection,
    inherited: list[Connection],
    worker: int,
    make_sink: Callable[[int], Sink],
    options: Options,
    forked_by_main_thread: bool = True,
) -> None:
    global _wake, _sink
    # A forked worker holds copies of the driver's pipe ends (its own and its
    # siblings'); while any copy is open, no pipe reports EOF when the driver
    # dies.  Close them first.
    for other in inherited:
        other.close()
    # What the driver made before the fork lives as long as we do: out of the
    # collector's sight, a collection neither scans it (the first ones here
    # went through the whole inherited heap) nor writes to its pages (each
    # write a copy of a page shared with the driver).
    gc.freeze()
    _forget_callers_signals()
    _one_torch_thread()
    # Ctrl-C, and SIGHUP when the terminal closes, reach the whole process
    # group; the driver decides, and tells us with SIGTERM (or dies, and Linux
    # sends it), so a worker never dies halfway through its own cleanup.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGUSR1, _stop_dropping_parts)
    # A write to a server that reset the connection, or to a driver that is
    # gone, is an error to handle, as in any Python program: a caller that
    # restored SIGPIPE's default handed it to us, and a worker died of it.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # Blocked until now (ForkBackend._spawn), or by the caller: a signal that
    # came meanwhile is handled here, by the handlers above.  SIGPIPE too (the
    # driver's run blocks it, parallel/brokenpipe.py): ignored, as above, but
    # not blocked in what map starts (a `cmd | head` in a shell of its own).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (*WORKER_SIGNALS, signal.SIGPIPE))
    events = PipeEvents(conn, worker)
    engine: Engine | None = None
    message: Finished | Stopped
    try:
        _end_if_orphaned()
        _terminate_with_parent(forked_by_main_thread)
        engine = _new_engine(make_sink(worker), options, events)
        events.engine = engine
        engine.loop.add(conn.fileno(), EVENT_READ, PipeFeed(conn, engine))
        _report_periodically(engine, events)
        _wake, _sink = engine.loop.wake, engine.sink
        _sink.stops_by_request = True  # a KeyboardInterrupt of map's own is its error
        while not engine.finished:
            if _stop_requested or events.driver_gone:
                raise KeyboardInterrupt  # here, between loop turns: see _stop
            engine.step()
        if engine.fatal is not None:
            engine.abort(keep_parts=False)
            message = Stopped(worker, engine.fatal)
        else:
            message = Finished(worker)
    except KeyboardInterrupt:
        if engine is not None:
            engine.abort(keep_parts=not _drop_parts)
        message = Stopped(worker)
    except SwarmgetError as exc:
        message = Stopped(worker, exc)
    # Stopping already: a SIGTERM now (the driver stopping everyone after a
    # fatal error) must not cut the last report short with a traceback.  A
    # worker stuck here is still killed by the driver after its grace period.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    _send_last(conn, events, message)
    if engine is not None:
        engine.close()
    _leave()


def _new_engine(sink: Sink, options: Options, events: PipeEvents) -> Engine:
    """This worker's engine (the driver warns, not it), or a SwarmgetError that
    stops the run: without the memory or descriptors for an engine, every
    worker dies the same way, and each death was a traceback and its rows
    dealt again, until every row of the run had failed with crashed."""
    try:
        return Engine(sink, options, events, warn_to=io.StringIO())
    except (MemoryError, OSError) as exc:
        failed = exc if isinstance(exc, OSError) else None
        memory = failed is None or failed.errno == errno.ENOMEM
        why = "out of memory" if memory or failed is None else (failed.strerror or str(failed))
        hint = " (too little memory, ulimit -v?); with workers=1 swarmget needs less"
        raise SwarmgetError(
            f"a worker process could not start downloading: {why}{hint if memory else ''}"
        ) from None


def _leave() -> None:
    """End this worker now that its last report is sent.  Returning would end it
    as multiprocessing does, which first joins every non-daemon thread: one a
    stream's ``map`` had started (a library's, a forgotten timer) kept the
    worker alive until the driver killed it, and every stream whose map did so
    ended 1.5 s late.  Nothing of ours is left to run (there are no atexit
    hooks in a forked child; only the output buffers to write out)."""
    for out in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if out is not None:
                out.flush()
    os._exit(0)


# The signals a worker gets from its driver (see ForkBackend.stop), or with
# its process group.
WORKER_SIGNALS: Final = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)


def _forget_callers_signals() -> None:
    """A forked worker starts with the caller's signal set-up, none of which is
    meant for it: the caller's Python handlers (a SIGTERM the driver sends a
    worker would run the caller's graceful shutdown here), its wake-up fd (an
    asyncio program's self-pipe: the worker's signals would wake the
    caller's loop, whose handlers then ran in the caller, once per worker),
    and its blocked signals (a worker that cannot take SIGTERM waits for
    SIGKILL, seconds later: worker_main unblocks them once its own handlers
    are in).  Signals ignored stay ignored (SIGPIPE above all:
    a write to a closed socket must be an error, not the end of the worker)."""
    with contextlib.suppress(ValueError):  # not the main thread: nothing set then
        signal.set_wakeup_fd(-1)
    for signum in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):  # SIGKILL, SIGSTOP, ...
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)


def _one_torch_thread() -> None:
    """Run PyTorch on one thread here, as PyTorch's own DataLoader workers do.

    A caller that used torch before the fork leaves its OpenMP thread pool
    behind in the parent: the forked copy waits for threads it does not have,
    and a ``map`` calling torch hung for good (a futex wait, every worker).
    One thread per worker is also the right share of the CPUs.  Torch is never
    imported here (a caller without it pays nothing), and a torch that refuses
    does not stop the worker.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return
    # A half-imported or unusual torch: the worker runs as it is.
    with contextlib.suppress(Exception):
        torch.set_num_threads(1)


def _report_periodically(engine: Engine, events: PipeEvents) -> None:
    def tick() -> None:
        events.flush()
        engine.loop.call_later(REPORT_INTERVAL, tick)

    engine.loop.call_later(REPORT_INTERVAL, tick)


def _send_last(conn: Connection, events: PipeEvents, message: Finished | Stopped) -> None:
    try:
        events.flush()
        conn.send(message)
    except OSError:
        pass  # the driver is gone; a rerun redoes what it did not hear of
    finally:
        conn.close()


# Set by a stop signal; the main loop raises KeyboardInterrupt at the next turn.
# Not raised in the handler itself: that would land at any bytecode -- between
# creating a part file and taking note of it (an orphan part no cleanup knows
# of), or in the cleanup of a worker already on its way out (a second signal:
# a traceback).  The handler wakes the loop instead.  The one exception is the
# caller's map function, which may run for minutes (a stream closed early must
# not wait for it): it gets the KeyboardInterrupt, as on Ctrl-C in any program.
_stop_requested = False
_wake: Callable[[], None] | None = None
_sink: Sink | None = None


def _stop(signum: int, frame: FrameType | None) -> None:
    global _stop_requested
    _stop_requested = True
    if _sink is not None:
        _sink.stop_requested = True  # before looking at mapping: see run_map
    if _sink is not None and _sink.mapping:
        raise KeyboardInterrupt  # inside the caller's map: nothing of ours is half done
    wake = _wake
    if wake is not None:
        wake()


# Set by SIGUSR1: the run hit a fatal error elsewhere (a full disk), so give the
# space of parts not worth resuming back, as the worker that hit it does.  (A
# flag, not a KeyboardInterrupt subclass: mypyc cannot compile one.)
_drop_parts = False


def _stop_dropping_parts(signum: int, frame: FrameType | None) -> None:
    global _drop_parts
    _drop_parts = True
    _stop(signum, frame)


def _end_if_orphaned() -> None:
    """Start a thread that ends this worker if it outlives its driver.

    The stop that keeps parts for resuming (SIGTERM, or the pipe's EOF) is
    Python code on the main thread, and it waits for that thread: a ``map``
    stuck in C code (a lock that never comes free, a wait with SIGTERM
    blocked) never gets there, and two such workers ran on as orphans for
    10+ minutes after their driver was killed, deaf to SIGTERM.  The thread
    sleeps, so it costs nothing per row, and it needs no signal to run.
    """
    parent = multiprocessing.parent_process()
    parent_pid = parent.pid if parent is not None and parent.pid is not None else os.getppid()
    watch = threading.Thread(
        target=_watch_parent, args=(parent_pid,), name="swarmget-orphan-watch", daemon=True
    )
    # No thread to be had (the limit of processes, ulimit -u, counts threads;
    # or no memory for its stack): the worker downloads without this watch.
    # The driver's death still ends it (the pipe's EOF, the parent-death
    # signal); only a map stuck in C code would outlive it.  Dying here
    # instead failed every row of the run with crashed.
    with contextlib.suppress(RuntimeError):
        watch.start()


def _watch_parent(parent_pid: int) -> None:
    # A dead parent's children are given to another (init, or a subreaper).
    while os.getppid() == parent_pid:
        time.sleep(ORPHAN_CHECK)
    time.sleep(ORPHAN_GRACE)  # the normal stop, parts kept, ends us first
    os.kill(os.getpid(), signal.SIGKILL)


def _terminate_with_parent(forked_by_main_thread: bool) -> None:
    """Ask Linux for SIGTERM when the driver dies (even by SIGKILL, even mid-transfer).

    The pipe's EOF tells us too, but only when the loop looks at it; a worker
    that outlived its driver would race the user's next run in the same dir.
    Linux ties the request to the thread that forked us, not to the process:
    forked by another thread (a stream started in a thread that then ended),
    the signal came when that thread ended, the driver alive, and the stream's
    rows failed as crashed.  Then the pipe's EOF alone tells us.
    """
    ask = parent_death_signal() if forked_by_main_thread else None
    if ask is not None:  # not Linux, or not the main thread: the pipe's EOF stops us
        ask()
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before we asked
        raise KeyboardInterrupt
