"""How many worker processes a run uses, and what share of the options each gets."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import threading

from swarmget.errors import UsageError
from swarmget.options import Options


def worker_count(options: Options) -> int:
    """How many processes a run uses.

    ``workers`` when set, else ``$SWARMGET_WORKERS``, else one per CPU this
    process may run on -- but only while the calling process has a single
    thread: forking a threaded program is unsafe, and the alternative (spawn)
    re-imports the caller's main module, which a script without an
    ``if __name__ == "__main__"`` guard does not survive.  Never more than
    ``concurrency``, and always one in a daemonic process (a PyTorch
    DataLoader's workers, a ``Pool``'s): multiprocessing forbids it children.
    """
    if multiprocessing.current_process().daemon:
        return 1
    wanted = options.workers or _env_workers()
    if not wanted:
        wanted = _usable_cpus() if threading.active_count() == 1 else 1
    return max(1, min(wanted, options.concurrency))


def worker_options(options: Options, workers: int) -> Options:
    """Each worker's share: its own event loop, ``concurrency`` and ``per_host`` split."""
    return dataclasses.replace(
        options,
        workers=1,
        concurrency=max(1, options.concurrency // workers),
        per_host=max(1, options.per_host // workers),
    )


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
