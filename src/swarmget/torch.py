"""``swarmget.torch.URLDataset``: URLs as a PyTorch ``IterableDataset``.

Install with ``pip install 'swarmget[torch]'``.

Theory of operation
-------------------
A ``DataLoader`` with ``num_workers=K`` runs the dataset's ``__iter__`` in K
loader processes; under ``torch.distributed`` (or ``RANK``/``WORLD_SIZE`` in
the environment) there are R ranks of those.  Each of the R x K copies takes
the rows whose position ``p`` in the epoch's order has
``p % (R*K) == rank*K + worker``: disjoint shares whose union is every input
exactly once.  Each copy streams its share with :func:`swarmget.stream` and
``workers=1``: its own event loop on a thread of the loader process (loader
processes are daemonic and may not start processes of their own; the
loader's K processes already give the parallelism), so ``map`` runs in the
loader process too.  The K copies share ``concurrency`` and ``per_host`` as
a stream's worker processes do: each takes its part, and together they keep
the limits (each has at least one connection, though).

``shuffle=True`` orders the rows by a permutation drawn from ``seed`` and the
epoch (:meth:`URLDataset.set_epoch`): reproducible, and new every epoch.  It
needs the whole list (a sequence); without shuffling any iterable works, read
lazily.  A shuffled epoch streams with ``ordered=True`` (unless asked
otherwise): completion order would make it neither reproducible nor the drawn
permutation.

The epoch and the count of failures live in shared memory
(:mod:`multiprocessing` values, inherited by the loader processes whether
forked or spawned): ``set_epoch`` in the main process reaches loader workers
that persist between epochs (``persistent_workers=True``), and
``dataset.failed`` in the main process counts the failures of every loader
worker of this machine.  Failed items are skipped; the first few are also
reported through :mod:`warnings`, per process.

At the interpreter's exit, multiprocessing ends the loader workers (daemonic
processes) with SIGTERM, which runs none of their clean-up: a stream still
open there (``persistent_workers=True``, a loop left early) kept its spill
folder.  So their folders carry the dataset's group in their name
(:func:`swarmget.streaming.spill.sweep_group`), and the process that made the
dataset removes them at its exit, once multiprocessing has ended its children.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import numbers
import os
import random
import secrets
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any

from swarmget.api import refuse_single_url, row_of
from swarmget.errors import UsageError
from swarmget.options import Options, check_yes_no
from swarmget.parallel.workers import worker_shares
from swarmget.sources.rows import Row
from swarmget.streaming import Item, Stream, stream
from swarmget.streaming.core import STREAM_ARGUMENTS
from swarmget.streaming.spill import sweep_group

try:
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("swarmget.torch needs PyTorch: pip install 'swarmget[torch]'") from exc

WARN_FAILURES = 5  # failures reported through warnings, per process
# multiprocessing runs exit finalisers of a negative priority after it has
# ended and joined the daemonic children (multiprocessing.util._exit_function).
AFTER_CHILDREN = -100


def _check_arguments(
    map: Callable[[Item], Any] | None, shuffle: object, seed: object, options: dict[str, Any]
) -> None:
    """A typo or a bad value fails when the dataset is made, naming what was
    passed: iterating happens in every loader worker, where it came out as a
    worker's traceback (and ``shuffle=1`` as "ordered must be True or False")."""
    check_yes_no("shuffle", shuffle)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise UsageError(f"seed must be a whole number, not {seed!r}")
    if "sources" in options:
        # Every loader worker would read all of them: each input K times over.
        raise UsageError(
            "URLDataset does not take sources=: every loader worker would read "
            "all of them; pass the rows as urls (list(swarmget.sources.read_rows([...])))"
        )
    if options.get("workers") not in (None, 1):
        raise UsageError(
            "URLDataset streams with one event loop per loader worker: "
            "use DataLoader(num_workers=...) for more"
        )
    # The stream's own checks (on_error, prefetch, map, ordered, progress,
    # spill_dir and every download option), with the messages a stream gives:
    # a Stream that is made but never started opens, forks and reads nothing.
    Stream((), map=map, **options).close()


class URLDataset(IterableDataset[Any]):  # type: ignore[misc]
    """Yields ``map(item)`` for every URL, or ``{"index", "url", "data"}`` without map."""

    def __init__(
        self,
        urls: Iterable[str | Row],
        map: Callable[[Item], Any] | None = None,
        *,
        shuffle: bool = False,
        seed: int = 0,
        **stream_options: Any,
    ) -> None:
        super().__init__()
        refuse_single_url(urls, sources=False)
        if iter(urls) is urls:
            # Each epoch, and each loader worker, reads the URLs anew: an
            # iterator gave its rows to the first epoch and nothing after.
            raise UsageError(
                "URLDataset reads its URLs again each epoch: give a collection "
                "(a list, a tuple), not an iterator or a generator"
            )
        _check_arguments(map, shuffle, seed, stream_options)
        if shuffle and not isinstance(urls, Sequence):
            # Iterators were refused above: this is a set, a NumPy array, a
            # dict's keys, which the message called "an iterator".
            raise UsageError(
                "shuffle=True needs a sequence of URLs (a list: list(urls) will do), "
                f"not a {type(urls).__name__}"
            )
        self.urls = urls
        self.map = map
        self.shuffle = shuffle
        self.seed = seed
        self._options = stream_options
        # Shared memory (see the docstring), made in the spawn context: its lock
        # may then go to loader workers however they start (a fork context's
        # lock refuses to be sent to a spawned or forkserver worker, and the
        # DataLoader failed with multiprocessing_context="spawn").
        shared = multiprocessing.get_context("spawn")
        self._epoch: Any = shared.Value("q", 0)
        self._failures: Any = shared.Value("q", 0)
        self._warned = 0  # failures reported through warnings by this process
        self._spill_group = _sweep_at_exit(stream_options.get("spill_dir"))

    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    @property
    def failed(self) -> int:
        """Items skipped because they failed, in every loader worker of this machine."""
        return int(self._failures.value)

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (with ``shuffle=True``) from the next iteration on."""
        self._epoch.value = epoch

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if get_spawning_popen() is None:
            # Pickled for anything but a new process (copy.deepcopy, pickle.dumps):
            # shared memory cannot go there; a copy of its values can.
            state["_epoch"] = _Number(self.epoch)
            state["_failures"] = _Number(self.failed)
        return state

    def __iter__(self) -> Iterator[Any]:
        share, count = _share()
        rows = self._rows(share, count)
        options = dict(self._options)
        options.setdefault("ordered", self.shuffle)
        options.update(_loader_worker_limits(options))
        # One event loop here, never worker processes (see the module's
        # docstring); set, not passed beside the options: a workers=1 of the
        # caller's own was given twice (a TypeError at every iteration).
        options["workers"] = 1
        items = stream(rows, map=self.map, **options)
        items.spill_group = self._spill_group
        with items:
            for item in items:
                if not item.ok:
                    self._failed(item)
                    continue
                if self.map is not None:
                    yield item.value
                else:
                    yield {"index": item.index, "url": item.url, "data": item.read()}
                    item.close()

    def _rows(self, share: int, count: int) -> Iterator[Row]:
        """This copy's rows, in this epoch's order, keeping their input index."""
        order: Iterable[int]
        if self.shuffle:
            assert isinstance(self.urls, Sequence)
            positions = list(range(len(self.urls)))
            random.Random(f"{self.seed}:{self.epoch}").shuffle(positions)
            order = positions
            for p, i in enumerate(order):
                if p % count == share:
                    yield _row(i, self.urls[i])
            return
        for i, url in enumerate(self.urls):
            if i % count == share:
                yield _row(i, url)

    def _failed(self, item: Item) -> None:
        with self._failures.get_lock():
            self._failures.value += 1
        self._warned += 1
        if self._warned <= WARN_FAILURES:
            warnings.warn(
                f"swarmget.torch: skipped {item.url}: {item.error}: {item.message}",
                RuntimeWarning,
                stacklevel=3,
            )


def _sweep_at_exit(spill_dir: Any) -> str:
    """A new spill group for a dataset's streams, whose abandoned folders this
    process removes at its exit, after its loader workers have ended (see the
    module's docstring)."""
    group = secrets.token_hex(4)
    parent = os.path.abspath(
        os.fspath(spill_dir) if spill_dir is not None else tempfile.gettempdir()
    )
    multiprocessing.util.Finalize(
        None, sweep_group, args=(parent, group), exitpriority=AFTER_CHILDREN
    )
    return group


class _Number:
    """A shared value's stand-in in a copy that cannot share memory."""

    def __init__(self, value: int) -> None:
        self.value = value
        self._lock = threading.Lock()

    def get_lock(self) -> threading.Lock:
        return self._lock

    def __getstate__(self) -> int:
        return self.value

    def __setstate__(self, value: int) -> None:
        self.value = value
        self._lock = threading.Lock()


def _row(position: int, url: object) -> Row:
    """The row of ``urls`` item ``position``.  A Row keeps its own index, as
    stream() keeps it: it was replaced by the position, and a caller's
    indices (a shard of a larger list, keys into its captions) came back as
    0, 1, 2... -- samples joined to the wrong labels, silently.  Other items
    are numbered by their position, and read as stream() reads them: bytes
    decoded (their str() was "b'http://...'", a bad_url: every item of a
    binary column skipped), None a bad_row."""
    if isinstance(url, Row):
        return url
    return row_of(position, url)


def _loader_worker_limits(options: dict[str, Any]) -> dict[str, int]:
    """This loader worker's share of ``concurrency`` and ``per_host`` (given or
    default), as ``workers=N`` shares them between its processes: each of K
    loader workers took the whole, and ``per_host=1`` with ``num_workers=4``
    opened 4 connections to the host at once.  The shares add up to the limits
    exactly, each at least 1: a limit below ``num_workers`` cannot be kept
    (one connection per loader worker).  Ranks are not counted: each is a
    program of its own, often on another machine."""
    info = get_worker_info()
    if info is None or info.num_workers <= 1:
        return {}
    download = {k: v for k, v in options.items() if k not in STREAM_ARGUMENTS}
    mine = worker_shares(Options.from_kwargs(download), info.num_workers)[info.id]
    return {"concurrency": mine.concurrency, "per_host": mine.per_host}


def _share() -> tuple[int, int]:
    """(this copy's share, how many copies): ranks x loader workers."""
    rank, world = _rank()
    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return rank * workers + worker, world * workers


def _rank() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover
        pass
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None and rank.isdigit() and world.isdigit():
        return int(rank), int(world)
    return 0, 1
