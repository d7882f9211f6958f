"""Running one engine per core: the parent reads, names and deals out the rows.

Theory of operation
-------------------
One Python process tops out at one core, so a run uses ``workers`` processes
(one per CPU by default), each with its own event loop and its own share of
``--concurrency`` and ``--per-host``.  The parent does what must be done once,
in input order:

* reads the rows lazily (it is the only reader of stdin or the input files);
* allocates every output name, so names are unique across workers and the
  same input always gives the same names, whatever the number of workers;
* deals rows out in batches, each split so that the workers' backlogs end
  level, and keeps every backlog bounded (memory stays flat however long
  the input);
* sums the workers' progress for the display, and merges their reports.

Workers append to the same journal (each record is one ``write`` on an
``O_APPEND`` file, so lines never interleave); the parent compacts it at the
end.  Ctrl-C: the parent tells every worker to stop (SIGTERM), waits for them
to keep their ``.part`` files and close the journal, then re-raises.  If the
parent is killed, the workers see their pipe close and stop the same way.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from swarmget.engine.job import UrlSplitter
from swarmget.engine.resume import is_fresh
from swarmget.errors import SwarmgetError, TransferError, UsageError
from swarmget.manifest import ManifestWriter
from swarmget.net.tls import INSECURE_WARNING
from swarmget.options import Options
from swarmget.parallel.worker import worker_main
from swarmget.report import ProgressListener, Report, Snapshot
from swarmget.sinks.files import OutputDir
from swarmget.sinks.naming import NameAllocator
from swarmget.sources.rows import Row, RowTuple

BATCH = 256  # rows per message: big enough to amortise pickling, small for balance
PROGRESS_INTERVAL = 0.1


def worker_count(options: Options) -> int:
    """How many processes a run uses.

    ``workers`` when set, else ``$SWARMGET_WORKERS``, else one per CPU this
    process may run on -- but only while the calling process has a single
    thread: forking a threaded program is unsafe, and the alternative (spawn)
    re-imports the caller's main module, which a script without an
    ``if __name__ == "__main__"`` guard does not survive.  Never more than
    ``concurrency``.
    """
    wanted = options.workers or _env_workers()
    if not wanted:
        wanted = _usable_cpus() if threading.active_count() == 1 else 1
    return max(1, min(wanted, options.concurrency))


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1


def _env_workers() -> int:
    value = os.environ.get("SWARMGET_WORKERS", "").strip()
    if not value:
        return 0
    if not value.isdigit():
        raise UsageError(f"SWARMGET_WORKERS must be a whole number, not {value!r}")
    return int(value)


@dataclasses.dataclass(slots=True)
class _Worker:
    process: BaseProcess
    conn: Connection
    sent: int = 0  # rows dealt to it
    done: int = 0
    failed: int = 0
    bytes: int = 0
    active: int = 0
    ended: bool = False  # told there are no more rows, or gone: deal it nothing more
    result: tuple[Any, ...] | None = None  # its final message

    @property
    def backlog(self) -> int:
        return self.sent - self.done


def _share(total: int, workers: int) -> int:
    return max(1, total // workers)


class _Dealer:
    """Reads rows and allocates their names, in input order, in the parent."""

    def __init__(self, rows: Iterator[Row]) -> None:
        self._rows = rows
        self._names = NameAllocator()
        self._split = UrlSplitter().split
        self.seen = 0
        self.done = False
        self.error: UsageError | None = None

    def take(self, count: int) -> list[RowTuple]:
        """Up to ``count`` named rows, as tuples (see worker.py)."""
        batch: list[RowTuple] = []
        while len(batch) < count and not self.done:
            try:
                row = next(self._rows)
            except StopIteration:
                self.done = True
                break
            except UsageError as exc:
                self.error = exc
                self.done = True
                break
            self.seen += 1
            batch.append(self._name(row))
        return batch

    def _name(self, row: Row) -> RowTuple:
        # Same order as Engine._make_job: a row whose URL is bad takes no name
        # (its worker fails it with bad_url); one whose path is bad is sent
        # unnamed too, and its worker fails it with the same bad_path error.
        try:
            self._split(row.url)
            path = self._names.allocate(row)
        except TransferError:
            return row.as_tuple()
        return (row.index, row.url, path, row.sha256, row.md5, row.size)


def run_parallel(
    rows: Iterator[Row],
    dest: str | os.PathLike[str],
    options: Options,
    workers: int,
    progress: ProgressListener | None = None,
) -> Report:
    root = OutputDir(dest).root
    fresh = is_fresh(root)
    dealer = _Dealer(rows)
    first = dealer.take(BATCH)  # bad input fails here, before any process starts
    if dealer.error is not None and not first:
        raise dealer.error
    share = dataclasses.replace(
        options,
        workers=1,
        concurrency=_share(options.concurrency, workers),
        per_host=_share(options.per_host, workers),
    )
    # Workers report progress every 0.1 s; the backlog must outlast that at
    # full speed (~5,000 rows/s per worker on loopback) or they idle.
    backlog_limit = 2 * share.concurrency + 8 * BATCH
    # fork: cheap, and it does not re-import the caller's main module (spawn
    # does, which breaks scripts without an ``if __name__ == "__main__"``
    # guard).  It is also Python's own default on Linux.  Workers touch no lock
    # a caller's thread could hold (they log nothing, print nothing).
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context: Any = multiprocessing.get_context(method)
    pool: list[_Worker] = []
    started = time.monotonic()
    if options.insecure:
        sys.stderr.write(INSECURE_WARNING)  # once for the run, not once per worker
    if progress is not None:
        progress.start()
    try:
        for _ in range(workers):
            parent_end, child_end = context.Pipe()
            # With fork the child inherits every parent end made so far: it closes
            # them (spawn passes nothing it is not given, so the list is moot).
            inherited = [w.conn for w in pool] + [parent_end] if method == "fork" else []
            process = context.Process(
                target=worker_main,
                args=(child_end, inherited, root, share, fresh),
                daemon=True,
            )
            process.start()
            child_end.close()
            pool.append(_Worker(process, parent_end))
        _deal(pool, first, 0)
        _supervise(pool, dealer, backlog_limit, progress, started)
    except BaseException:
        _stop_all(pool)
        raise
    finally:
        for worker in pool:
            worker.conn.close()
    report = _merge(pool, root, started)
    if dealer.error is not None:
        raise dealer.error
    if progress is not None:
        progress.finish(report)
    return report


def _deal(pool: list[_Worker], batch: list[RowTuple], start: int) -> None:
    """Split ``batch`` among the live workers so that their backlogs end level.

    Whole batches to one worker at a time would leave the last batch's worth
    of imbalance at the end of the input: 2,000 rows in batches of 256 gave one
    worker 1,024 and the other 976, and at 100 connections each the first then
    needs an 11th round of requests where 10 would do.  Ties in the remainder
    go round-robin from ``start`` (the caller counts its deals).
    """
    live = [worker for worker in pool if not worker.ended]
    if not live or not batch:
        return  # no rows, or every worker has gone (the run fails with their results)
    counts = level_shares([worker.backlog for worker in live], len(batch), start)
    taken = 0
    for worker, count in zip(live, counts, strict=True):
        if count:
            chunk = batch[taken : taken + count]
            taken += count
            if _send(worker, chunk):
                worker.sent += count


def level_shares(backlogs: list[int], rows: int, start: int = 0) -> list[int]:
    """How many of ``rows`` each worker gets so the highest backlog is as low as it
    can be: the lowest backlogs are filled up first.  The rows left over when
    the level cannot be split evenly go one each, round-robin from ``start``."""
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


def _send(worker: _Worker, message: list[RowTuple] | None) -> bool:
    """Send rows (None: no more rows) to ``worker``; False if it has gone.

    A worker may end at any moment (an error in its start-up, a crash), and its
    pipe then breaks.  That is not our error to raise: the worker's own result
    (read by _receive) says what happened, and it is dealt nothing more.
    """
    try:
        worker.conn.send(message)
    except OSError:
        worker.ended = True
        return False
    return True


def _supervise(
    pool: list[_Worker],
    dealer: _Dealer,
    backlog_limit: int,
    progress: ProgressListener | None,
    started: float,
) -> None:
    turn = 1  # run_parallel dealt the first batch
    next_progress = 0.0
    while any(worker.result is None for worker in pool):
        while (
            not dealer.done
            and min((w.backlog for w in pool if not w.ended), default=backlog_limit) < backlog_limit
        ):
            _deal(pool, dealer.take(BATCH), turn)
            turn += 1
        if dealer.done:
            for worker in pool:
                if not worker.ended:
                    worker.ended = True
                    _send(worker, None)
        for conn in wait([w.conn for w in pool if w.result is None], timeout=PROGRESS_INTERVAL):
            worker = next(w for w in pool if w.conn is conn)
            _receive(worker)
        now = time.monotonic()
        if progress is not None and now >= next_progress:
            next_progress = now + PROGRESS_INTERVAL
            progress.update(
                Snapshot(
                    done=sum(w.done for w in pool),
                    failed=sum(w.failed for w in pool),
                    bytes=sum(w.bytes for w in pool),
                    elapsed=now - started,
                    rows_seen=dealer.seen,
                    input_done=dealer.done,
                    active=sum(w.active for w in pool),
                )
            )


def _receive(worker: _Worker) -> None:
    try:
        while worker.conn.poll():
            message = worker.conn.recv()
            if message[0] == "progress":
                _, worker.done, worker.failed, worker.bytes, worker.active = message
            else:
                worker.result = message
                worker.ended = True  # it reads no more rows
                return
    except (EOFError, OSError):
        worker.process.join(5)
        worker.result = ("crashed", worker.process.exitcode)
        worker.ended = True


def _stop_all(pool: list[_Worker]) -> None:
    """Interrupted: ask every worker to stop cleanly, then wait for it."""
    for worker in pool:
        if worker.process.is_alive():
            worker.process.terminate()  # SIGTERM: the worker aborts like on Ctrl-C
    for worker in pool:
        worker.process.join(10)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()


def _merge(pool: list[_Worker], root: str, started: float) -> Report:
    report: Report | None = None
    compact = False
    fatal: SwarmgetError | None = None
    for worker in pool:
        worker.process.join()
        result = worker.result or ("crashed", worker.process.exitcode)
        if result[0] == "report":
            _, part, needs_compaction = result
            compact = compact or needs_compaction
            if report is None:
                report = part
            else:
                report.merge(part)
        elif result[0] == "error":
            fatal = fatal or result[1]
        elif result[0] == "interrupted":
            raise KeyboardInterrupt
        else:
            fatal = fatal or SwarmgetError(f"a worker process died (exit code {result[1]})")
    if fatal is not None:
        raise fatal
    assert report is not None
    report.elapsed = time.monotonic() - started
    if compact:
        ManifestWriter(root).compact()
    return report
