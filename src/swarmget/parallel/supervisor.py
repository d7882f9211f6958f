"""The supervisor: reads and plans rows, deals them to a backend, keeps the records.

Theory of operation
-------------------
A run is one supervisor and one :class:`~swarmget.parallel.backend.Backend`.
The supervisor does what must be done once, in input order, in one process:

* reads the rows lazily (it is the only reader of stdin or the input files);
* plans them (:class:`~swarmget.sinks.plan.FilePlanner`): identity, output
  name, resume, skip -- the same checks whatever the number of workers;
* deals the planned rows out in batches, each split so that the workers'
  backlogs end level, and keeps every backlog bounded (memory stays flat
  however long the input);
* records every outcome the workers report in the journal, sums the report
  and the progress, and writes the manifest when the run ends.

It knows which rows each worker holds, so a worker that dies without a word
costs exactly its unreported rows: they fail with ``crashed`` (a rerun
retries them) and a new worker takes its place.  Ctrl-C: the backend stops
every worker (each keeps its parts and reports what it finished), the
supervisor records what came in and writes the manifest, then re-raises.  A
run-stopping error in one worker (a full disk) stops the others the same way,
except that they keep only the parts worth resuming, as that worker did.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator
from typing import Final, Protocol

from swarmget.engine.urls import redact
from swarmget.errors import ErrorCode, SwarmgetError
from swarmget.parallel.backend import (
    Backend,
    Died,
    Done,
    Event,
    Finished,
    Progress,
    Stopped,
    plain_result,
)
from swarmget.parallel.brokenpipe import broken_pipes_raise
from swarmget.parallel.interrupts import TurnInterrupts
from swarmget.report import (
    FileResult,
    ProgressListener,
    Report,
    Snapshot,
    Waiting,
    longest_waiting,
)
from swarmget.sinks.base import Assignment
from swarmget.sinks.files import OutputError
from swarmget.sinks.plan import PlanBatch
from swarmget.sources.background import BackgroundRows
from swarmget.sources.rows import Row

BATCH: Final = 256  # rows per message: big enough to amortise pickling, small for balance
TICK: Final = 0.1  # seconds between progress updates
DEAL_SLICE: Final = 0.05  # seconds of planning before the loop's other work has a turn
# Seconds between journal commits: a kill costs at most this many seconds of
# outcomes (those rows are downloaded again; their paths are safe in the plan log).
COMMIT_INTERVAL: Final = 1.0
MAX_REPLACEMENTS: Final = 16  # workers started in place of dead ones, per run


class Planner(Protocol):
    """The driver side of a sink (``sinks/plan.py``)."""

    def plan(self, rows: list[Row]) -> PlanBatch: ...
    def record(self, results: list[FileResult]) -> list[FileResult]: ...
    def partial(self, key: int, validator: str | None, total: int | None) -> None: ...
    def redeal(self, rows: list[Assignment]) -> None:
        """``rows`` go out again, their worker dead: undo what it may have left."""
        ...

    def commit(self) -> None: ...
    def out_of_room(self) -> OutputError | None:
        """Why the run must stop now for lack of room for its records (None: it
        need not)."""
        ...

    def finish(self, interrupted: bool, whole: bool = False) -> None: ...


class Delivery(Protocol):
    """Where a run's outcomes go besides the journal and the report: the streaming
    iterator's queue (``stream/``).  It also paces the run: rows are only taken
    from the input while the consumer has room for them."""

    def room(self, taken: int) -> int:
        """How many more rows may be taken from the input now (``taken`` so far)."""
        ...

    def deliver(self, results: list[FileResult]) -> None: ...

    def stopping(self) -> bool:
        """The consumer is gone: stop the run."""
        ...

    def wait(self) -> float:
        """The longest the supervisor may wait for events before asking again."""
        ...

    def worker_died(self, worker: int) -> None:
        """``worker`` is dead and another is about to take its place (and its memory)."""
        ...


class NoDelivery:
    """A run to files: outcomes go to the journal only, and nothing paces it."""

    def room(self, taken: int) -> int:
        return 1 << 62

    def deliver(self, results: list[FileResult]) -> None:
        pass

    def stopping(self) -> bool:
        return False

    def wait(self) -> float:
        return TICK

    def worker_died(self, worker: int) -> None:
        pass


class _Worker:
    __slots__ = (
        "active",
        "done",
        "ended",
        "gone",
        "in_flight",
        "outstanding",
        "parked",
        "sent",
        "suspects",
        "waiting",
    )

    def __init__(self) -> None:
        self.sent = 0  # rows dealt to it
        self.done = 0  # rows it reported
        self.active = 0
        self.in_flight = 0
        self.parked = 0  # of the rows it holds, those waiting for a host that pushed back
        self.waiting: Waiting | None = None  # what it waits on longest (Progress.waiting)
        self.ended = False  # told there are no more rows
        self.gone = False  # finished, stopped or dead: deal it nothing more
        # Rows dealt and not reported: what a crash would cost.
        self.outstanding: dict[int, Assignment] = {}
        self.suspects: set[int] = set()  # the keys of the suspect group it holds (_died)

    @property
    def backlog(self) -> int:
        """Rows dealt, not reported, and not parked on a pushed-back host (those
        wait for it, and must not keep the worker from getting others)."""
        return self.sent - self.done - self.parked


class Supervisor:
    def __init__(
        self,
        rows: Iterator[Row],
        planner: Planner,
        backend: Backend,
        *,
        backlog_limit: int,
        progress: ProgressListener | None = None,
        delivery: Delivery | None = None,
    ) -> None:
        self._rows = rows
        self._planner = planner
        self._backend = backend
        self._backlog_limit = backlog_limit
        self._progress = progress
        self._bytes_shown = 0  # Snapshot.bytes never goes down (see _tick)
        self._delivery: Delivery = delivery if delivery is not None else NoDelivery()
        self._workers = [_Worker() for _ in range(backend.workers)]
        self.report = Report()
        self._seen = 0
        self._input_done = False
        self._input_error: Exception | None = None
        self._fatal: SwarmgetError | None = None
        self._turn = 0  # deals so far (ties in level_shares go round-robin)
        self._replacements = 0
        self._redealt: set[int] = set()  # keys dealt again after their worker died
        # Groups of rows in two deaths, each to a worker holding no other group,
        # halved at each death until the row that causes them is alone (_died).
        self._suspects: collections.deque[list[Assignment]] = collections.deque()
        self._started = 0.0
        self._first: list[Row] = []  # read before the backend starts
        self._interrupts = TurnInterrupts(self._wake_backend)

    # -- the run -----------------------------------------------------------------------

    def run(self) -> Report:
        try:
            # The engine's sockets (one process) and the workers' pipes are
            # written in this thread: see parallel/brokenpipe.py.
            with broken_pipes_raise():
                return self._run()
        except KeyboardInterrupt as exc:
            # What finished before the stop goes with it (the CLI's --json
            # prints it, as after a run-stopping error), even before the run began.
            attach_report(exc, self.report)
            raise
        finally:
            if isinstance(self._rows, BackgroundRows):
                self._rows.close()  # its thread stops taking the caller's rows

    def _run(self) -> Report:
        self._started = time.monotonic()
        # Bad input fails here, before any process starts (a stream's workers
        # may be running already: they are stopped).
        try:
            self._first = self._take_first(min(BATCH, self._delivery.room(0)))
        except BaseException:  # Ctrl-C while the input was read
            self._abandon()
            raise
        if self._input_error is not None and not self._first:
            self._abandon()
            raise self._input_error
        if not self._first and not self._input_done:
            self._abandon()  # a stream closed before its input gave a row
            return self.report
        if self._progress is not None:
            try:
                self._progress.start()
            except BaseException:  # the caller's listener: the output dir is let go
                self._abandon()
                raise
        try:
            return self._run_begun()
        except BaseException as exc:
            # Whatever stops a run once it began (a listener's exception, a
            # bug) carries what finished, as a run-stopping error does: a
            # listener whose finish raised lost the report of a whole run.
            attach_report(exc, self.report)
            raise

    def _run_begun(self) -> Report:
        """The run, from its first deal to its manifest and the listener's finish."""
        interrupted = False
        with self._interrupts:
            try:
                self._backend.start()
                self._loop()
                self._tick(time.monotonic())  # the display ends on the true totals
            except KeyboardInterrupt:
                interrupted = True
                self._stop()
                raise
            except OutputError as exc:
                self._fatal = self._fatal or exc
                self._stop()
            except BaseException:
                # Anything else (a progress listener's exception, a bug): the
                # workers stop and report what they finished, so the manifest
                # lists every file on disk, and the exception goes on.
                interrupted = True
                self._stop()
                raise
            finally:
                try:
                    self._finish(interrupted)
                finally:
                    # Once, however the run ended (interrupted, a fatal error,
                    # the input raising): a listener's start has its finish.
                    # It comes after the manifest is written: one that raises
                    # leaves the journal and the manifest whole.
                    self._finish_listener()
            self._interrupts.check()  # a Ctrl-C while the manifest was written: now
        # Each with what finished before it (_run attaches the report; the
        # CLI's --json prints it).
        if self._fatal is not None:
            raise self._fatal
        if self._input_error is not None:
            raise self._input_error
        return self.report

    def _finish_listener(self) -> None:
        """The progress listener's finish.  An exception of its own goes on (the
        caller's bug), with the error that stopped the run (a full disk, bad
        input), held until now and so in no chain, as its context: it was told
        nowhere."""
        if self._progress is None:
            return
        try:
            self._progress.finish(self.report)
        except BaseException as exc:
            stopped = self._fatal or self._input_error
            if stopped is not None and exc.__context__ is None and exc is not stopped:
                exc.__context__ = stopped
            raise

    def _loop(self) -> None:
        next_tick = next_commit = 0.0
        delivery, interrupts = self._delivery, self._interrupts
        while not self._done():
            if delivery.stopping():
                self._stop()
                return
            more = self._deal()
            now = time.monotonic()
            wait = 0.0 if more else max(0.0, min(delivery.wait(), next_tick - now))
            interrupts.in_turn = True  # a Ctrl-C now waits for the turn's end
            try:
                events = self._backend.poll(wait)
            finally:
                interrupts.in_turn = False
            for event in events:
                self._handle(event)
            interrupts.check()  # after the events: what finished is recorded
            if self._must_stop():
                self._stop()
                return
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + TICK
                if now >= next_commit:
                    next_commit = now + COMMIT_INTERVAL
                    self._planner.commit()
                    if self._must_stop():
                        self._stop()
                        return
                self._tick(now)

    def _must_stop(self) -> bool:
        """A fatal error, or the journal had to write on the room kept for its last
        commit (a full disk: see Journal.out_of_room)."""
        self._fatal = self._fatal or self._planner.out_of_room()
        return self._fatal is not None

    def _wake_backend(self) -> None:
        self._backend.wake()

    def _done(self) -> bool:
        return self._input_done and all(w.gone for w in self._workers)

    def _finish(self, interrupted: bool) -> None:
        self.report.elapsed = time.monotonic() - self._started
        # A signal now would cut the manifest short (the old one stayed, with a
        # temporary file beside it): it waits until the manifest is written.
        self._interrupts.finishing = True
        try:
            # Every row of the input read and ended: only then is a row the
            # journal has from an earlier list known not to be one of this one.
            ended = self._fatal is None and self._input_error is None
            self._planner.finish(interrupted, not interrupted and ended and self._input_done)
        except OutputError as exc:
            self._fatal = self._fatal or exc
        finally:
            self._interrupts.finishing = False
            self._backend.close()

    def _abandon(self) -> None:
        """The run ends before it began: let go of the journal and of any worker."""
        try:
            self._planner.finish(interrupted=True)
        finally:
            try:
                self._backend.stop()
            finally:
                self._backend.close()

    def _stop(self) -> None:
        """Interrupted, or a fatal error: stop every worker, keep what they finished
        (and, after a fatal error, only the parts worth resuming: the disk may be full)."""
        self._backend.stop(keep_parts=self._fatal is None)
        for event in self._backend.poll(0.0):
            if isinstance(event, Progress):
                self._handle(event)
        for worker in self._workers:
            worker.gone = True

    # -- rows out ----------------------------------------------------------------------

    def _deal(self) -> bool:
        """Plan and send rows while the workers have room; True when it stopped for
        time with more to do (the loop comes straight back, after its own work)."""
        until = time.monotonic() + DEAL_SLICE
        while self._first or (
            not self._input_done
            and self._lowest_backlog() < self._backlog_limit
            and self._delivery.room(self._seen) > 0
        ):
            if time.monotonic() >= until:
                # Rows skipped as done fill no backlog: a rerun with nothing to
                # do read its whole list here, and committed, showed progress
                # and heard Ctrl-C only at the end (its open transaction grew
                # by every row).
                return True
            if self._first:
                rows, self._first = self._first, []
            else:
                rows = self._take(min(BATCH, self._delivery.room(self._seen)))
            if not rows:
                break  # none has arrived yet from a slow producer (or the input ended)
            batch = self._planner.plan(rows)
            self.report.skipped += batch.skipped
            self._add_results(batch.results)
            self._send(batch.assignments)
        if self._suspects:
            self._deal_suspects()
        if self._input_done and not self._suspects:
            for index, worker in enumerate(self._workers):
                if not worker.ended and not worker.gone:
                    worker.ended = True
                    self._backend.end(index)
        return False

    def _deal_suspects(self) -> None:
        """A group of suspect rows to each live worker that holds none (see _died)."""
        for index, worker in enumerate(self._workers):
            if not self._suspects:
                return
            if worker.gone or worker.ended:
                continue
            if any(key in worker.outstanding for key in worker.suspects):
                continue
            group = self._suspects.popleft()
            worker.suspects = {row.key for row in group}
            self._planner.redeal(group)
            self._send_to(index, worker, [_from_scratch(row) for row in group])

    def _lowest_backlog(self) -> int:
        live = [w.backlog for w in self._workers if not w.gone]
        return min(live, default=self._backlog_limit)

    def _take_first(self, count: int) -> list[Row]:
        """The run's first rows, waiting for at least one (none: the input is
        empty, or a stream was closed first).  A stream's supervisor runs on a
        thread of its own, its workers started: it waits on the rows' thread
        (BackgroundRows.wait), and gives up when the stream is closed.  Reading
        the first row here, in the caller's generator, it waited for as long as
        that gave nothing, and a Ctrl-C left it and the workers running."""
        source = self._rows
        if isinstance(self._delivery, NoDelivery) or not isinstance(source, BackgroundRows):
            return self._take(count, wait=True)  # download(): before any fork (background.py)
        while not self._delivery.stopping():
            rows = self._take(count)
            if rows or self._input_done:
                return rows
            source.wait(self._delivery.wait())
        return []

    def _take(self, count: int, wait: bool = False) -> list[Row]:
        """Up to ``count`` rows.  From a slow producer (BackgroundRows) only what
        has arrived, waiting (``wait``) only for the first row of the run."""
        source = self._rows
        rows: list[Row] = []
        try:
            if isinstance(source, BackgroundRows):
                rows = source.take(count, wait=wait)
            else:
                while len(rows) < count:
                    rows.append(next(source))
        except StopIteration:
            self._input_done = True
        except Exception as exc:
            # Bad input mid-stream (ours: a UsageError naming the line; or
            # whatever the caller's iterable raised): finish what is in
            # flight, then raise it, as the iterable itself would have.
            self._input_error = exc
            self._input_done = True
        self._seen += len(rows)
        return rows

    def _send(self, assignments: list[Assignment]) -> None:
        # Not to a worker told the input has ended: it is finishing its backlog
        # and would never take these (rows dealt again after a death were lost).
        live = [(i, w) for i, w in enumerate(self._workers) if not w.gone and not w.ended]
        if not live or not assignments:
            return
        shares = level_shares([w.backlog for _, w in live], len(assignments), self._turn)
        self._turn += 1
        for (index, worker), chunk in zip(live, _interleave(assignments, shares), strict=True):
            if chunk:
                self._send_to(index, worker, chunk)

    def _send_to(self, index: int, worker: _Worker, chunk: list[Assignment]) -> None:
        for assignment in chunk:
            worker.outstanding[assignment.key] = assignment
        worker.sent += len(chunk)
        if not self._backend.send(index, chunk):
            worker.gone = True  # poll() will say how it ended

    # -- events in ---------------------------------------------------------------------

    def _handle(self, event: Event) -> None:
        worker = self._workers[event.worker]
        if isinstance(event, Progress):
            worker.active, worker.in_flight = event.active, event.in_flight
            worker.parked = event.parked
            worker.waiting = event.waiting
            # Parts first: a large file can begin and end between two messages.
            for key, validator, total in event.partials:
                self._planner.partial(key, validator, total)
            results = event.results
            for result in results:
                worker.outstanding.pop(result.key, None)
            if event.done:
                results = self._plain_results(worker, event.done) + results
            worker.done += len(results)
            self._add_results(results)
        elif isinstance(event, Finished):
            worker.gone = True
            worker.active = worker.in_flight = 0
            worker.waiting = None
        elif isinstance(event, Stopped):
            if event.error is not None:
                worker.gone = True
                self._fatal = self._fatal or event.error
                return
            # Stopped by a signal.  Sent to the whole process group (Ctrl-C,
            # `timeout`, `kill -TERM -PGID`), it reached us too: our handler,
            # deferred to the end of this turn, says how the run stops (130 or
            # 143), so run it now.
            self._interrupts.check()
            # Only the worker was signalled (a stray kill, an OOM killer's
            # SIGTERM): as if it had died, its rows fail as `crashed` and
            # another worker takes its place; the run goes on.
            self._died(event.worker, None, "it was stopped by a signal")
        elif isinstance(event, Died):
            self._died(event.worker, event.exitcode, event.why)

    def _plain_results(self, worker: _Worker, done: list[Done]) -> list[FileResult]:
        """The FileResults of rows ``worker`` reported as plain ``ok`` (see Done)."""
        outstanding = worker.outstanding
        results: list[FileResult] = []
        for entry in done:
            row = outstanding.pop(entry[0], None)
            if row is None:
                # Every row a worker reports was dealt to it and is outstanding
                # until reported: one that is not cannot be rebuilt, and must not
                # vanish from the manifest without a word: the run stops, saying so.
                problem = f"a worker reported a row it was not sent (key {entry[0]})"
                self._fatal = self._fatal or SwarmgetError(problem)
                continue
            results.append(plain_result(row, entry))
        return results

    def _died(self, index: int, exitcode: int | None, why: str = "") -> None:
        """A worker vanished: start another in its place, and deal what it held again.

        A row is failed with ``crashed`` only when it is named as the cause: a
        row in its first death is dealt again as any row; one in its second
        becomes a suspect: the suspects of a death go out as a group, to a worker
        holding no other group, at its full concurrency (a worker killed twice
        by the OOM killer costs nothing more); a group met by a death is halved,
        and a group of one is the row that causes them.  (Failing every row at
        the first death failed rows that had not even begun: 1,432 of a
        3,000-row run for one worker killed by the OOM killer; failing every
        row in its second death failed 112 rows for one map that segfaults.)"""
        worker = self._workers[index]
        held = list(worker.outstanding.values())
        redealt = self._redealt
        group = [a for a in held if a.key in worker.suspects]
        culprit = group if len(group) == 1 else []
        halves = [group[: len(group) // 2], group[len(group) // 2 :]] if len(group) > 1 else []
        suspects = [a for a in held if a.key in redealt and a.key not in worker.suspects]
        again = [a for a in held if a.key not in redealt]
        message = f"the worker process died (exit code {exitcode}) while downloading this row"
        if why:
            message = f"the worker process was stopped while downloading this row: {why}"
        # Before its replacement starts writing to the memory they share.
        self._delivery.worker_died(index)
        fresh = _Worker()
        self._workers[index] = fresh
        if self._replacements < MAX_REPLACEMENTS and self._backend.replace(index):
            self._replacements += 1
        else:
            fresh.gone = True
        lost = culprit
        if any(not w.gone and not w.ended for w in self._workers):
            redealt.update(a.key for a in again)
            self._planner.redeal(again)
            self._send([_from_scratch(a) for a in again])
            self._suspects.extend(g for g in (suspects, *halves) if g)
            self._deal_suspects()
        else:
            lost = group + suspects + again + [a for g in self._suspects for a in g]
            self._suspects.clear()
        self._add_results([_crashed(a, message) for a in lost])
        if fresh.gone and all(w.gone for w in self._workers) and not self._input_done:
            self._fatal = SwarmgetError(
                f"worker processes keep dying (exit code {exitcode}); the run stopped"
            )

    def _add_results(self, results: list[FileResult]) -> None:
        if not results:
            return
        # Recording may settle more rows (--dedupe: those that waited for these).
        more = self._planner.record(results)
        report = self.report
        for result in results:
            report.add(result)
        for result in more:
            report.add(result)
        self._delivery.deliver(results + more if more else results)

    def _tick(self, now: float) -> None:
        if self._progress is None:
            return
        report = self.report
        workers = self._workers
        # The highest so far: bytes of a transfer that fails (then is retried, or
        # resumed from its part) leave the in-flight sum, and a display's byte
        # rate went below zero.
        received = report.received + sum(w.in_flight for w in workers)
        self._bytes_shown = max(self._bytes_shown, received)
        self._progress.update(
            Snapshot(
                done=report.total + report.skipped,  # skipped rows are finished rows too
                failed=report.failed,
                bytes=self._bytes_shown,
                elapsed=now - self._started,
                rows_seen=self._seen,
                input_done=self._input_done,
                active=sum(w.active for w in workers),
                waiting=longest_waiting([w.waiting for w in workers]),
            )
        )


def attach_report(exc: BaseException, report: Report) -> None:
    """Give ``exc`` the run's ``report`` as ``exc.report``, unless it has one: a
    caller's exception may hold a ``report`` of its own, and one of a class
    that takes no attributes goes on without it."""
    if getattr(exc, "report", None) is None:
        with contextlib.suppress(AttributeError, TypeError):
            exc.report = report  # type: ignore[attr-defined]


def level_shares(backlogs: list[int], rows: int, start: int = 0) -> list[int]:
    """How many of ``rows`` each worker gets so the highest backlog is as low as it
    can be: the lowest backlogs are filled up first.  The rows left over when
    the level cannot be split evenly go one each, round-robin from ``start``.

    Whole batches to one worker at a time would leave the last batch's worth of
    imbalance at the end of the input: 2,000 rows in batches of 256 gave one
    worker 1,024 and the other 976, and at 100 connections each the first then
    needed an 11th round of requests where 10 would do.
    """
    order = sorted(range(len(backlogs)), key=backlogs.__getitem__)
    # Raise the level over the sorted backlogs until the rows run out.
    level = backlogs[order[0]]
    filled = 1  # how many of the lowest workers are at ``level``
    left = rows
    while filled < len(order) and left >= (backlogs[order[filled]] - level) * filled:
        left -= (backlogs[order[filled]] - level) * filled
        level = backlogs[order[filled]]
        filled += 1
    level += left // filled
    left %= filled  # fewer than ``filled``: one more each for that many of them
    shares = [0] * len(backlogs)
    for i in order[:filled]:
        shares[i] = level - backlogs[i]
    for i in sorted(order[:filled], key=lambda i: (i - start) % len(backlogs))[:left]:
        shares[i] += 1
    return shares


def _interleave(assignments: list[Assignment], shares: list[int]) -> list[list[Assignment]]:
    """``assignments`` dealt in turn, ``shares[i]`` of them to worker ``i``.

    In turn, not in slices: rows that sit together in a list are often alike (one
    slow host, the big files of a sorted list), and a slice of them gave one
    worker all the slow rows while the other idled (1.7x the wall time).
    """
    chunks: list[list[Assignment]] = [[] for _ in shares]
    left = list(shares)
    count = len(shares)
    turn = 0
    for assignment in assignments:
        while not left[turn]:
            turn = turn + 1 if turn + 1 < count else 0
        chunks[turn].append(assignment)
        left[turn] -= 1
        turn = turn + 1 if turn + 1 < count else 0
    return chunks


def _crashed(row: Assignment, message: str) -> FileResult:
    # redact: the row's URL as given may hold user:password (every other
    # outcome's record is redacted where it is made).
    return FileResult(
        redact(row.url), None, "failed", None, 0, ErrorCode.CRASHED, 0, 0, message,
        index=row.index, key=row.key,
    )  # fmt: skip


def _from_scratch(row: Assignment) -> Assignment:
    """``row`` to be dealt again after its worker died: from byte 0, since the dead
    worker may have written more of its part than the plan said was there."""
    if not row.resume_from:
        return row
    return Assignment(row.index, row.key, row.url, row.path, row.sha256, row.md5, row.size)
