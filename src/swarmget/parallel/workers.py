"""How many worker processes a run uses, and what share of the options each gets."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import threading

from swarmget.errors import UsageError
from swarmget.options import Options

# A list this short is done by one process before a second would have started
# (a fork costs ~5 ms and ~20 MB): a program calling download() on small
# batches paid 12 ms a call instead of 2.
FEW_ROWS = 256


def worker_count(options: Options, rows: int | None = None) -> int:
    """How many processes a run uses (``rows``: the list's length, if known).

    ``workers`` when set, else ``$SWARMGET_WORKERS``, else one per CPU this
    process may run on -- but only while the calling process has a single
    thread: forking a threaded program is unsafe, and the alternative (spawn)
    re-imports the caller's main module, which a script without an
    ``if __name__ == "__main__"`` guard does not survive.  Never more than
    ``concurrency`` or ``per_host`` (each worker needs one connection of each
    to share, and a host's limit is a promise to the host: ``--per-host 1``
    with two workers opened two connections to it), and always one in a
    daemonic process (a PyTorch DataLoader's workers, a ``Pool``'s):
    multiprocessing forbids it children.
    """
    if multiprocessing.current_process().daemon:
        return 1
    wanted = options.workers or _env_workers()
    if not wanted:
        few = rows is not None and rows < FEW_ROWS
        wanted = _usable_cpus() if threading.active_count() == 1 and not few else 1
    return max(1, min(wanted, options.concurrency, options.per_host))


def worker_shares(options: Options, workers: int) -> list[Options]:
    """Each worker's options: its own event loop, and its share of ``concurrency``
    and ``per_host``.  The shares add up to the limits exactly (3 over two
    workers is 2 and 1; flooring gave 1 and 1), each at least 1 (see
    :func:`worker_count`)."""
    return [
        dataclasses.replace(
            options,
            workers=1,
            concurrency=_share(options.concurrency, workers, index),
            per_host=_share(options.per_host, workers, index),
        )
        for index in range(workers)
    ]


def _share(total: int, workers: int, index: int) -> int:
    return max(1, total // workers + (1 if index < total % workers else 0))


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
