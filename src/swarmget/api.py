"""The Python API: ``swarmget.download(urls, dest, **options) -> Report``."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import os
import sys
from collections.abc import Collection, Iterable, Iterator, Sequence, Sized
from typing import Any, TextIO

from swarmget.errors import UsageError, warn, warn_at_caller
from swarmget.loop.core import raise_nofile_limit
from swarmget.manifest import manifest_path
from swarmget.net.tls import INSECURE_WARNING
from swarmget.options import Options, check_output_dir
from swarmget.parallel.backend import Backend
from swarmget.parallel.fork import ForkBackend
from swarmget.parallel.inline import InlineBackend
from swarmget.parallel.supervisor import BATCH, Supervisor
from swarmget.parallel.workers import worker_count, worker_shares
from swarmget.report import ProgressListener, Report, check_progress
from swarmget.sinks.files import FileSink
from swarmget.sinks.plan import FilePlanner
from swarmget.sources.background import ITERATOR_ROWS, BackgroundRows, private_stdin
from swarmget.sources.fields import FieldError, build_row
from swarmget.sources.rows import Row, strip_url

# Each connection is a file descriptor, and so is each file being written;
# the rest is for the loop, the journal, DNS and pipes.
FDS_PER_CONNECTION = 2
FDS_SPARE = 64
FDS_MINIMUM = 32


def input_rows(urls: Iterable[str | Row] | None, sources: object) -> Iterator[Row]:
    """The rows of a run: ``sources`` (files, ``-``, URLs; checked here, see
    :func:`source_list`) first, then ``urls``."""
    # ``is not None``: sources=0 or "" was taken for no sources at all, where
    # download() refused them.
    return listed_input_rows(urls, source_list(sources) if sources is not None else None)


def listed_input_rows(urls: Iterable[str | Row] | None, sources: list[str] | None) -> Iterator[Row]:
    """:func:`input_rows` of ``sources`` already checked by :func:`source_list`
    (download() needs the list itself, and checked it once).

    Every row has its own index (the manifest's key, and what results are
    matched by): see :func:`_then` for how indices are given and why a Row
    whose index may be another row's raises :class:`UsageError`.
    """
    refuse_single_url(urls)
    rows: Iterator[Row] = iter(())
    if sources:
        from swarmget.sources.reader import STDIN, is_pipe, read_rows

        stdin = private_stdin() if STDIN in sources else None
        rows = read_rows(sources, stdin=stdin)
        if stdin is not None or any(map(is_pipe, sources)):
            # A pipe or a terminal: its writer may be slow, and the run must
            # not wait for a batch of lines to start (sources/background.py);
            # nor may the rows of a file before a named pipe (`a.txt
            # <(crawler)`, a FIFO nobody has opened yet) wait for its lines.
            rows = BackgroundRows(rows, owned=stdin)
    if urls is not None:
        in_memory = isinstance(urls, Collection)  # a list, a tuple, an array: read at once
        rows = _then(rows, urls)
        if not in_memory:
            # An iterator or a generator may be slow (a crawler, a queue): read
            # in the run's thread, the first downloads waited for 256 of its
            # rows, and one that waited for our items never got them -- nor
            # were the workers' reports read meanwhile (sources/background.py).
            rows = BackgroundRows(rows, ahead=ITERATOR_ROWS)
    return rows


def source_list(sources: object) -> list[str]:
    """``sources=`` as a list of paths (str or path-like, kept as given) or URLs;
    else a TypeError naming it (an int raised "'int' object is not iterable", a
    list of ints "expected str, bytes or os.PathLike object", from inside the
    reader)."""
    if isinstance(sources, str | bytes):
        raise TypeError("swarmget: `sources` must be a list of paths or URLs, not a string")
    if not _iterable(sources):
        raise TypeError(
            f"swarmget: `sources` must be a list of paths or URLs, not {type(sources).__name__}"
        )
    listed: list[Any] = list(sources)  # type: ignore[call-overload]
    for source in listed:
        if not isinstance(source, str | os.PathLike):
            raise TypeError(
                f"swarmget: `sources` must be a list of paths or URLs, not one holding {source!r}"
            )
    return listed


def refuse_single_url(urls: object, sources: bool = True) -> None:
    """A str is an iterable too: its characters were taken for URLs.  ``sources``:
    may the caller name a list file with ``sources=`` instead (URLDataset: no)?"""
    if isinstance(urls, str | bytes | bytearray):
        instead = ", or sources=[path] for a list file" if sources else ""
        raise TypeError(
            "swarmget: `urls` must be an iterable of URLs, not a single "
            f"{type(urls).__name__}: pass [url] for one URL{instead}"
        )
    if urls is not None and not _iterable(urls):
        # Else the run began (its output dir made and locked) and the first
        # read of the rows raised "'int' object is not iterable" from inside.
        raise TypeError(
            f"swarmget: `urls` must be an iterable of URLs (a list), not {type(urls).__name__}"
        )


def _iterable(value: object) -> bool:
    """Whether ``iter(value)`` works (an ``Iterable`` check misses classes with
    only ``__getitem__``, which iter() takes)."""
    try:
        iter(value)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True


def _then(first: Iterator[Row], urls: Iterable[object]) -> Iterator[Row]:
    """``first``'s rows, then ``urls``, no two of them with one index.

    swarmget numbers the rows of ``sources`` and the ``urls`` items that are
    not Rows: each takes the index after the highest one so far (0, 1, 2 ...
    when no Row gives its own).  A Row keeps the index it gives, in any order
    (a shuffled epoch gives its dataset's), but it must be above every index
    swarmget gave before it: at or below one, it may be that row's, and two
    rows of one index clash in the manifest and in the results.  Checking
    only that keeps memory flat (no set of a hundred million indices), at the
    cost of refusing a Row index that falls between two numbered rows without
    being either's.  That the Rows' own indices differ is the caller's to see to.
    """
    highest = -1  # the highest index so far, given or assigned
    assigned: int | None = None  # the highest index swarmget assigned, if any
    for row in first:
        highest = assigned = row.index  # the reader numbers them from 0
        yield row
    for position, item in enumerate(urls):
        if isinstance(item, str):
            highest += 1
            assigned = highest
            # Surrounding whitespace is never part of a URL, and lines read from
            # a file object keep their "\n": the default name became "a.jpg_".
            yield Row(highest, strip_url(item))
        elif isinstance(item, Row):
            index = _own_index(item.index, position, assigned)
            highest = max(highest, index)
            yield _checked(item, index)
        else:
            highest += 1
            assigned = highest
            yield row_of(highest, item)


def _own_index(index: object, position: int, assigned: int | None) -> int:
    """A Row's own ``index`` (``urls`` item ``position``), as an int; raise unless
    it is above ``assigned``, the highest index swarmget gave a row (see
    :func:`_then`).  Any int will do when swarmget has numbered none, negative too."""
    if not isinstance(index, int):
        # What a compiled Row refuses when it is made; said alike uncompiled.
        raise TypeError(f"swarmget: urls item {position}: a Row's index must be an int")
    # A bool is an int; a compiled Row stores True as 1, and so does this.
    index = int(index)
    if not -(1 << 63) <= index < 1 << 63:
        # The journal's column (SQLite INTEGER): it raised OverflowError, raw.
        raise UsageError(f"urls item {position}: a Row's index must fit in 64 bits, not {index}")
    if assigned is not None and index <= assigned:
        raise UsageError(
            f"urls item {position} is a Row with index {index}, which may be another "
            f"row's: swarmget numbered the rows without an index of their own (those "
            f"of sources=, URL strings) up to {assigned} so far; give every item "
            f"a Row with its own index, or number yours above {assigned}"
        )
    return index


def _checked(row: Row, index: int) -> Row:
    """A caller's Row, held to the rules a CSV or JSONL row is (sources/fields.py):
    a url that is not a str failed the whole run, and a sha256 in upper case, a
    size given as "1000", failed good files after their download.  ``index``:
    its index as an int (see :func:`_own_index`)."""
    if row.problem:
        return row if type(row.index) is int else Row(index, row.url, problem=row.problem)
    fields: dict[str, object] = {
        "url": row.url, "path": row.path, "sha256": row.sha256, "md5": row.md5, "size": row.size
    }  # fmt: skip
    try:
        return build_row(index, fields)
    except FieldError as bad:
        url = row.url if isinstance(row.url, str) else repr(row.url)[:200]
        return Row(index, url, problem=f"input item {index}: {bad}")


# Not URLs, whatever str() makes of them: a mistake in the caller's list.
_NOT_URLS = (type(None), int, float, dict, list, tuple, set, frozenset)


def row_of(index: int, item: object) -> Row:
    """A row from an item that is not a str: bytes are decoded (UTF-8; bytes that
    are not UTF-8 fail as bad_url, shown escaped); URL objects (yarl, httpx,
    furl...) are taken by their str(); None, numbers and containers fail the row
    (``bad_row``) with a message naming what they are."""
    if isinstance(item, bytes | bytearray | memoryview):
        return Row(index, strip_url(bytes(item).decode("utf-8", "surrogateescape")))
    if isinstance(item, _NOT_URLS):
        text = repr(item)
        shown = text if len(text) <= 200 else text[:197] + "..."
        what = "None" if item is None else f"of type {type(item).__name__}"
        problem = f"input item {index} is {what}, not a URL (a str, bytes or swarmget.sources.Row)"
        return Row(index, shown, problem=problem)
    return Row(index, strip_url(str(item)))


def _descriptors_in_use() -> int:
    """How many descriptors this process has open (Linux: /proc; else a guess)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir opened
    except OSError:
        return 3


def fit_concurrency(options: Options, warn_to: TextIO | None = None) -> Options:
    """Options whose concurrency fits the descriptor limit (lowered, said once, if not)."""
    # What the calling program holds already counts: 480 files open under a
    # limit of 512 left room for 16 sockets, not the 224 planned for, and the
    # rest failed (or socket() raised out of the run).
    in_use = _descriptors_in_use()
    wanted = FDS_PER_CONNECTION * options.concurrency + FDS_SPARE + in_use
    limit = raise_nofile_limit(wanted)
    if limit >= wanted:
        return options
    free = limit - in_use
    if free < FDS_MINIMUM:
        # Not even the journal, the pipes and one connection: say so now, not as
        # "cannot read input: Too many open files" from whatever fails first.
        held = f", {in_use} of them open already" if in_use > 8 else ""
        raise UsageError(
            f"the limit of open files is {limit} (ulimit -n){held}; "
            f"swarmget needs at least {FDS_MINIMUM} free"
        )
    # The spare is for the journal, pipes, the resolver and the standard streams:
    # a fixed 64 of a small limit (64 or less) left room for one connection.
    spare = min(FDS_SPARE, max(FDS_MINIMUM // 2, free // 4))
    fits = max(1, (free - spare) // FDS_PER_CONNECTION)
    held = f" with {in_use} open already" if in_use > 8 else ""
    warn(
        f"swarmget: warning: --concurrency {options.concurrency} needs {wanted} file "
        f"descriptors but the limit is {limit} (ulimit -n){held}; "
        f"using --concurrency {fits}\n",
        warn_to,
    )
    return dataclasses.replace(options, concurrency=fits, per_host=min(options.per_host, fits))


def file_sink(root: str, worker: int, *, replace: bool = False) -> FileSink:
    """Every worker writes files under ``root`` (make_sink for the backends);
    ``replace`` (``--overwrite``): over whatever is at a path."""
    return FileSink(root, replace=replace)


def download(
    urls: Iterable[str | Row] | None,
    dest: str | bytes | os.PathLike[str] | os.PathLike[bytes],
    *,
    sources: Sequence[str] | None = None,
    progress: ProgressListener | bool | None = None,
    **options: Any,
) -> Report:
    """Download every URL into directory ``dest`` and return the :class:`Report`.

    ``urls`` is any iterable of URL strings (bytes: UTF-8) or
    :class:`~swarmget.sources.Row` objects (read lazily); ``sources`` are input
    files / ``-`` / URLs as on the command line, read first.  Every row has an
    index of its own: a Row keeps the one it gives, the other rows are numbered
    on from the highest so far, and a Row whose index is at or below one that
    swarmget numbered (the rows of ``sources``, say, from 0) raises
    :class:`~swarmget.UsageError` when it is read.  Keyword options are
    the fields of :class:`~swarmget.Options`.  Each row's outcome is also written
    to ``dest/.swarmget/manifest.jsonl``.  ``progress=True`` shows the live
    display the CLI shows (on stderr); a ProgressListener of yours gets its
    snapshots instead.
    """
    if not isinstance(dest, str | bytes | os.PathLike):
        # os.fspath's TypeError named no argument: "expected str, bytes or os.PathLike object".
        raise TypeError(f"swarmget: `dest` must be a path (the output directory), not {dest!r}")
    opts = fit_concurrency(Options.from_kwargs(options))
    check_progress(progress)
    if progress is True:
        from swarmget.progress import make_progress

        progress = make_progress(sys.stderr)
    elif progress is False:
        progress = None
    if sources is not None:
        # A list: read twice below, and a generator would be empty the second time.
        sources = source_list(sources)
    rows = listed_input_rows(urls, sources)
    report = run_download(
        rows,
        dest,
        opts,
        progress,
        known_rows=_known_rows(urls, sources),
        inputs=_inputs(sources, dest),
    )
    if report.total + report.skipped == 0:
        warn_at_caller("swarmget.download: the input has no rows")
    return report


def _inputs(
    sources: Sequence[str] | None, dest: str | bytes | os.PathLike[str] | os.PathLike[bytes]
) -> frozenset[tuple[int, int]]:
    """The files ``sources`` reads that a path in ``dest`` may lead to, by
    identity (st_dev, st_ino): no row may replace one."""
    if not sources:
        return frozenset()
    from swarmget.sources.reader import input_files

    return input_files(sources, within=os.fsdecode(dest))


def _known_rows(urls: object, sources: Sequence[str] | None) -> int | None:
    """How many rows a run has, when that is known before reading them: a list
    (not an iterator), and sources that are all URLs (``swarmget URL -o out``)."""
    count = 0
    if urls is not None:
        if not isinstance(urls, Sized):
            return None
        count = len(urls)
    if sources:
        from swarmget.sources.reader import is_url

        if not all(is_url(source) for source in sources):
            return None  # a file or stdin: read later
        count += len(sources)
    return count


def run_download(
    rows: Iterator[Row],
    dest: str | bytes | os.PathLike[str] | os.PathLike[bytes],
    options: Options,
    progress: ProgressListener | None = None,
    *,
    known_rows: int | None = None,
    inputs: frozenset[tuple[int, int]] = frozenset(),
) -> Report:
    """Plan ``rows`` into ``dest`` and download them with one engine per worker
    (``known_rows``: how many rows there are, when the caller knows; ``inputs``:
    the (st_dev, st_ino) of the files the rows are read from, which no row may
    replace or remove)."""
    root = os.fsdecode(os.fspath(dest))  # a bytes path too, as os functions take
    check_output_dir(root)
    if os.path.exists(root) and not os.path.isdir(root):
        raise UsageError(f"the output directory {root!r} exists and is not a directory")
    planner = FilePlanner(root, options, inputs=inputs)
    try:
        make_sink = functools.partial(file_sink, planner.root, replace=options.overwrite)
        workers = worker_count(options, known_rows)
        backend: Backend
        if workers > 1:
            shares = worker_shares(options, workers)
            backend = ForkBackend(make_sink, shares)
            # Workers report every 0.1 s; the backlog must outlast that at full
            # speed (~5,000 rows/s per worker on loopback) or they idle.
            backlog_limit = 2 * shares[0].concurrency + 8 * BATCH
            if options.insecure:
                warn(INSECURE_WARNING)  # once for the run, not once per worker
        else:
            backend = InlineBackend(make_sink, options)
            backlog_limit = max(2 * options.concurrency, BATCH) + BATCH
    except BaseException:
        planner.finish(interrupted=True)
        raise
    supervisor = Supervisor(rows, planner, backend, backlog_limit=backlog_limit, progress=progress)
    supervisor.report.manifest = manifest_path(planner.root)
    with fewer_collections():
        return supervisor.run()


# Young objects the cyclic collector lets pile up before it runs, during a
# download (CPython's default: 700).  The driver makes several short-lived
# objects a row (rows, plans, results) and holds thousands of rows in flight,
# so at the default it ran a collection every ~100 rows: 2,800 instructions a
# row, 4% of the driver's work (callgrind, W1).  Almost none of it is cyclic
# garbage, which is all a later collection delays.
DOWNLOAD_GC_THRESHOLD = 10_000


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the collector's first threshold for the block, then put it back (the
    caller's process is ours only for the length of the call)."""
    before = gc.get_threshold()
    if before[0] == 0 or before[0] >= DOWNLOAD_GC_THRESHOLD:
        yield  # collection off, or already rarer: the caller's choice stands
        return
    gc.set_threshold(DOWNLOAD_GC_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        if gc.get_threshold()[0] == DOWNLOAD_GC_THRESHOLD:  # unless changed meanwhile
            gc.set_threshold(*before)
