"""One engine per worker process, fed over pipes: the backend of ``workers > 1``.

fork, not spawn: cheap, and it does not re-import the caller's main module
(spawn does, which breaks scripts without an ``if __name__ == "__main__"``
guard).  It is also Python's own default on Linux.  Workers touch no lock a
caller's thread could hold (they log nothing, print nothing).

A worker that dies without a word (a crash, the OOM killer) shows up as a
:class:`~swarmget.parallel.backend.Died` event when its pipe ends; the driver
fails the rows it had not reported and may :meth:`ForkBackend.replace` it.
Ctrl-C: :meth:`ForkBackend.stop` sends every worker SIGTERM and waits for it
to keep its parts and send its last results, which a following poll returns.
After a run-stopping error it sends SIGUSR1 instead: the same, but only the
parts worth resuming stay (the disk may be full).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import select
import signal
import socket
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Final

from swarmget.errors import SwarmgetError
from swarmget.options import Options
from swarmget.parallel.backend import (
    Died,
    Event,
    Finished,
    NoMoreRows,
    Progress,
    Release,
    Rows,
    Stopped,
)
from swarmget.parallel.brokenpipe import broken_pipes_raise
from swarmget.parallel.worker import WORKER_SIGNALS, worker_main
from swarmget.sinks.base import Assignment, Sink
from swarmget.sinks.memory import unpickle_values

STOP_WAIT: Final = 10.0  # seconds a stopped worker gets to clean up before SIGKILL

# Every worker process started here and not closed yet (see _forget_in_child).
_ours: weakref.WeakSet[BaseProcess] = weakref.WeakSet()


def _forget_in_child() -> None:
    """A child the caller forks with a bare ``os.fork()`` inherits multiprocessing's
    list of its parent's children, our workers among them; when that child
    exits, multiprocessing terminates every daemonic process on the list (its
    atexit hook), so each of the caller's forks cost a running download its
    workers.  Ours are not the child's: off its list they go."""
    children: set[BaseProcess] | None = getattr(multiprocessing.process, "_children", None)
    if children is not None:
        children.difference_update(_ours)
    _ours.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forget_in_child)


def _exited(process: BaseProcess) -> bool:
    """Has ``process`` ended?  Asked of its sentinel (a pipe that closes when the
    process does), not of waitpid: a caller that ignores SIGCHLD (SIG_IGN), or
    reaps every child in its own handler, leaves waitpid nothing to report,
    and multiprocessing then calls an ended worker alive forever."""
    if process.exitcode is not None:
        return True
    try:
        return bool(select.select([process.sentinel], [], [], 0)[0])
    except (OSError, ValueError):  # closed already
        return True


def _wait_for(process: BaseProcess, within: float) -> None:
    """Wait up to ``within`` seconds for ``process`` to end.  Not ``join``: it
    waits on the sentinel alone, and a child the worker forked (a stream's
    ``map`` may) holds a copy of it open, so join waited the whole time for a
    worker long dead.  :func:`_exited` also asks waitpid."""
    deadline = time.monotonic() + within
    while process.exitcode is None and time.monotonic() < deadline:
        try:
            if select.select([process.sentinel], [], [], 0.01)[0]:
                # Ended: join reaps it now (a zombie unreaped, close() could not
                # free its descriptors).
                process.join(within)
                return
        except (OSError, ValueError):  # closed already
            return


def _close(process: BaseProcess) -> None:
    """Free ``process``'s descriptors now (it sits in a reference cycle: a
    program with the collector off got four more descriptors every run)."""
    _ours.discard(process)
    # ValueError: still running as multiprocessing sees it -- someone else
    # reaped it (see _exited), or it has not ended yet; its sentinel closes
    # with the Process object then.
    with contextlib.suppress(ValueError):
        process.close()


class _Slot:
    __slots__ = ("conn", "ended", "fd", "process", "readable")

    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.fd = conn.fileno()
        self.ended = False  # it said Finished/Stopped, or its pipe ended
        # "Is another message waiting?" for this pipe alone, one C call
        # (Connection.poll() builds a selector and registers the pipe each time).
        self.readable = select.poll()
        self.readable.register(self.fd, select.POLLIN)


class ForkBackend:
    def __init__(
        self,
        make_sink: Callable[[int], Sink],
        shares: list[Options],
        *,
        stop_wait: float = STOP_WAIT,
    ) -> None:
        self.workers = len(shares)
        # How long a stopped worker gets before SIGKILL: a run to files lets it
        # report and keep its parts; a stream has nothing to keep, and its
        # close() must not wait 10 s for a map stuck in a long C call.
        self._stop_wait = stop_wait
        self._make_sink = make_sink
        self._shares = shares  # each worker's options (parallel/workers.py)
        workers = self.workers
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        self._method = method
        self._context: Any = multiprocessing.get_context(method)
        self._slots: list[_Slot | None] = [None] * workers
        self._pending: list[Event] = []  # drained by stop(), returned by the next poll
        self._started = False
        # wake(): a byte here ends a poll() at once (a stream's caller made room
        # for more rows; a deferred Ctrl-C).  Non-blocking: a full pair is awake.
        # Socket objects, not raw descriptors: a wake() from another thread after
        # close() fails on the closed object, never writing into a descriptor
        # number reused meanwhile.
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        # Every live worker's pipe and the wake socket, registered once: poll()
        # runs a thousand times a second in a stream, and multiprocessing's
        # wait() builds a selector and registers every descriptor each time.
        self._poller = select.poll()
        self._poller.register(self._wake_read.fileno(), select.POLLIN)
        self._by_fd: dict[int, int] = {}  # a live worker's pipe -> the worker

    def start(self) -> None:
        if self._started:
            return  # a stream starts its workers early, in the caller's thread
        self._started = True
        for worker in range(self.workers):
            try:
                self._spawn(worker)
            except OSError as exc:
                # The system's limit of processes (EAGAIN), or memory: the
                # workers started so far end now, none left running or unreaped.
                self.stop()
                self.close()
                why = exc.strerror or str(exc)
                raise SwarmgetError(
                    f"cannot start worker process {worker + 1} of {self.workers}: {why} "
                    "(the limit of processes?); with workers=1 swarmget runs in this process alone"
                ) from None

    def _spawn(self, worker: int) -> None:
        parent_end, child_end = self._context.Pipe()
        # With fork the child inherits every driver end made so far: it closes
        # them (spawn passes nothing it is not given, so the list is moot).
        inherited = [s.conn for s in self._slots if s is not None] + [parent_end]
        process = self._context.Process(
            target=worker_main,
            args=(
                child_end,
                inherited if self._method == "fork" else [],
                worker,
                self._make_sink,
                self._shares[worker],
                threading.current_thread() is threading.main_thread(),
            ),
            daemon=True,
        )
        # A stop signal sent to a worker that has just started (Ctrl-C moments
        # after the run began) waits, blocked, for the worker's own handlers:
        # before them it ran the driver's, whose KeyboardInterrupt came out of
        # multiprocessing's bootstrap as a traceback.  The worker unblocks it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_SIGNALS)
        try:
            process.start()
        except BaseException:
            parent_end.close()
            child_end.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _ours.add(process)
        child_end.close()
        old = self._slots[worker]
        if old is not None:
            self._ended(old)
            old.conn.close()
            _close(old.process)
        slot = self._slots[worker] = _Slot(process, parent_end)
        self._poller.register(slot.fd, select.POLLIN)
        self._by_fd[slot.fd] = worker

    def send(self, worker: int, rows: list[Assignment]) -> bool:
        return self._send(worker, Rows([row.as_tuple() for row in rows]))

    def end(self, worker: int) -> None:
        self._send(worker, NoMoreRows())

    def release(self, worker: int, tokens: list[int]) -> None:
        self._send(worker, Release(tokens))

    def _send(self, worker: int, message: Rows | NoMoreRows | Release) -> bool:
        # A worker may end at any moment and its pipe then breaks.  That is not
        # our error to raise: poll() reports how it ended.
        slot = self._slots[worker]
        if slot is None or slot.ended:
            return False
        try:
            # Also called from a stream's caller (its items let go of memory):
            # a worker that just died must not kill it with SIGPIPE.
            with broken_pipes_raise():
                slot.conn.send(message)
        except OSError:
            return False
        return True

    def wake(self) -> None:
        # Safe in a signal handler and from any thread: one write of one byte.
        with contextlib.suppress(OSError):  # full: already awake
            self._wake_write.send(b"\0")

    def poll(self, timeout: float) -> list[Event]:
        if self._pending:
            events, self._pending = self._pending, []
            return events
        if not self._by_fd:
            return []
        received: list[Event] = []
        try:
            # Rounded up: rounded to the nearest millisecond, the last half
            # millisecond before the supervisor's next tick was poll(0) after
            # poll(0), a busy loop (a 2,000-item stream made 150 to 770 such
            # empty polls, of 700 to 1,500 in all; now none).
            ready = self._poller.poll(max(0, math.ceil(timeout * 1000)))
        except InterruptedError:  # pragma: no cover - PEP 475 retries; a handler raised
            return received
        for fd, _ in ready:
            worker = self._by_fd.get(fd)
            if worker is not None:
                self._receive(worker, received)
            else:
                with contextlib.suppress(OSError):
                    self._wake_read.recv(4096)
        return received

    def _ended(self, slot: _Slot) -> None:
        """It said Finished or Stopped, or its pipe ended: no more polling for it."""
        slot.ended = True
        if self._by_fd.pop(slot.fd, None) is not None:
            self._poller.unregister(slot.fd)

    def _live(self) -> list[tuple[int, _Slot]]:
        return [(w, s) for w, s in enumerate(self._slots) if s is not None and not s.ended]

    def _receive(self, worker: int, events: list[Event]) -> None:
        slot = self._slots[worker]
        assert slot is not None
        try:
            while True:
                message = slot.conn.recv()
                if isinstance(message, Progress):
                    unpickle_values(message.results)
                events.append(message)
                if isinstance(message, Finished | Stopped):
                    self._ended(slot)
                    return
                if not slot.readable.poll(0):
                    return
        except (EOFError, OSError):
            self._ended(slot)
            slot.process.join(5)
            events.append(Died(worker, slot.process.exitcode))
        except Exception as exc:
            # A report that does not unpickle here (a map value that pickled in
            # the worker but will not load: its rows are unknown).  The books
            # only balance if that worker's rows are settled as lost: end it.
            self._ended(slot)
            _kill(slot.process)
            why = f"its report could not be read ({type(exc).__name__}: {exc})"
            events.append(Died(worker, slot.process.exitcode, why))

    def replace(self, worker: int) -> bool:
        slot = self._slots[worker]
        if slot is not None:
            slot.process.join(1)
        try:
            self._spawn(worker)
        except OSError:
            return False
        return True

    def stop(self, keep_parts: bool = True) -> None:
        """Interrupt every worker (SIGTERM: it stops as on Ctrl-C, keeping its parts;
        SIGUSR1: as after a fatal error, keeping only those worth resuming), then
        wait for it.

        Its last messages are read while we wait (a worker blocked on a full
        pipe would otherwise never exit), and kept for the next poll().
        """
        signum = signal.SIGTERM if keep_parts else signal.SIGUSR1
        for _, slot in self._live():
            pid = slot.process.pid
            if not _exited(slot.process) and pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
        deadline = time.monotonic() + self._stop_wait
        events: list[Event] = []
        while True:
            live = {slot.conn: worker for worker, slot in self._live()}
            left = deadline - time.monotonic()
            if not live or left <= 0:
                break
            for conn in wait(list(live), timeout=left):
                assert isinstance(conn, Connection)
                self._receive(live[conn], events)
        for maybe in self._slots:
            if maybe is not None:
                _kill(maybe.process)
        self._pending.extend(events)

    def close(self) -> None:
        for worker, slot in enumerate(self._slots):
            if slot is None:
                continue
            _wait_for(slot.process, self._stop_wait)
            _kill(slot.process)
            self._ended(slot)
            slot.conn.close()
            _close(slot.process)
            self._slots[worker] = None  # closed: a second close() passes it by
        self._wake_read.close()
        self._wake_write.close()


def _kill(process: BaseProcess) -> None:
    """SIGKILL ``process`` unless it has ended, and wait for it.  Never a signal to a
    process that ended already: reaped by someone else, its PID may be another
    program's now."""
    if not _exited(process):
        process.kill()
        process.join()
