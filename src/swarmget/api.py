"""The Python API: ``swarmget.download(urls, dest, **options) -> Report``."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from swarmget.engine.core import Engine
from swarmget.loop.core import raise_nofile_limit
from swarmget.options import Options
from swarmget.parallel import run_parallel, worker_count
from swarmget.report import ProgressListener, Report
from swarmget.sources.rows import Row


def _rows_from(urls: Iterable[str | Row], start: int = 0) -> Iterator[Row]:
    for index, item in enumerate(urls, start):
        if isinstance(item, Row):
            yield item
        else:
            yield Row(index, str(item))


def download(
    urls: Iterable[str | Row] | None,
    dest: str | os.PathLike[str],
    *,
    sources: Sequence[str] | None = None,
    progress: ProgressListener | None = None,
    **options: Any,
) -> Report:
    """Download every URL into directory ``dest`` and return the :class:`Report`.

    ``urls`` is any iterable of URL strings or :class:`~swarmget.sources.Row`
    objects (read lazily); ``sources`` are input files / ``-`` / URLs as on the
    command line.  Keyword options are the fields of :class:`~swarmget.Options`.
    Each row's outcome is also written to ``dest/.swarmget/manifest.jsonl``.
    """
    opts = Options.from_kwargs(options)
    rows: Iterator[Row] = iter(())
    if sources:
        from swarmget.sources.reader import read_rows

        rows = read_rows(list(sources))
    if urls is not None:
        rows = itertools.chain(rows, _rows_from(urls))
    # Each connection is a file descriptor, and so is each file being written.
    raise_nofile_limit(2 * opts.concurrency + 64)
    workers = worker_count(opts)
    if workers > 1:
        return run_parallel(rows, dest, opts, workers, progress)
    return Engine(rows, dest, opts, progress=progress).run()
