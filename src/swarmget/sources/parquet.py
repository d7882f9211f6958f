"""Parquet input: the URL lists datasets are shipped as (``pip install swarmget[datasets]``).

A Parquet file is read as a CSV with a header is: the columns swarmget knows
(``url``, ``path``, ``sha256``, ``md5``, ``size``; any case, so LAION's ``URL``
is ``url``) are taken, every other column (captions, licences, widths) is
never read from disk, and one bad value fails its row alone with
``bad_row``, named by its row number in the file.  Two Parquet habits are
read as meant: a binary column holding text (decoded as UTF-8, bad bytes
found as in a text list), and a ``size`` column pandas wrote as floats
because it has gaps (``12.0`` is 12, NaN is no size).

Memory: rows are read a batch at a time (:data:`BATCH_ROWS`) from one row
group at a time, and only the known columns are decoded, so a list of any
length costs about one row group's URLs, whatever the file holds besides.

pyarrow is imported only when a Parquet input is met: the core install stays
four small wheels, and without pyarrow the run stops at once saying how to
get it.  A Parquet file is read from its end (its footer says where the
columns are), so it must be a file, by its path or on stdin redirected from
it (``swarmget - < list.parquet``): a pipe cannot be one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, BinaryIO, Final

from swarmget.errors import UsageError
from swarmget.sources.fields import COLUMNS, FieldError, build_row, printable, usable_url
from swarmget.sources.rows import Row

MAGIC: Final = b"PAR1"  # the first (and last) four bytes of every Parquet file
BATCH_ROWS: Final = 8192


def parse_parquet(path: str | BinaryIO, name: str, counter: Iterator[int]) -> Iterator[Row]:
    """The rows of the Parquet file at ``path``, or in the seekable binary file
    ``path`` (stdin redirected from a file); ``name`` is how messages call it."""
    parquet, arrow_error = _pyarrow_parquet(name)
    # What pyarrow raises for a file it cannot read: ArrowInvalid is a
    # ValueError, but ArrowNotImplementedError (a schema it does not know,
    # say an integer wider than 64 bits) is a RuntimeError, ArrowTypeError a
    # TypeError...: all are ArrowException.
    unreadable = (OSError, ValueError, arrow_error)
    try:
        source = parquet.ParquetFile(path)
    except unreadable as exc:
        raise UsageError(
            f"cannot read input {name!r}: not a readable Parquet file ({_said(exc)})"
        ) from None
    try:
        columns = _known_columns(list(source.schema_arrow.names), name)
        number = 0
        for batch in _batches(source, list(columns.values())):
            for values in batch.to_pylist():
                number += 1
                yield _row(
                    next(counter),
                    {known: values[spelled] for known, spelled in columns.items()},
                    name,
                    number,
                )
    except unreadable as exc:  # a damaged column chunk, a truncated file
        raise UsageError(f"cannot read input {name!r}: {_said(exc)}") from None
    finally:
        source.close()


def _said(exc: Exception) -> str:
    """pyarrow's message on one line: some are several ("Couldn't deserialize
    thrift: ...\nDeserializing page header failed.\n"), which broke the
    usage error's line in two, its end on a line of its own."""
    return printable(" ".join(str(exc).split()))


def _batches(source: Any, columns: list[str]) -> Iterator[Any]:
    """The file's batches, asked for one row group at a time: one
    ``iter_batches`` over the whole file keeps memory it read ahead (RSS grew
    with the file, ~40 MiB a million rows of a LAION-like list), one per row
    group gives it back when the group is done."""
    for group in range(source.num_row_groups):
        yield from source.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns)


def _pyarrow_parquet(name: str) -> tuple[Any, type[Exception]]:
    """pyarrow.parquet, and the base class of pyarrow's errors."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise UsageError(
            f"input {name!r} is a Parquet file: reading it needs pyarrow "
            "(pip install 'swarmget[datasets]')"
        ) from None
    return pyarrow.parquet, pyarrow.ArrowException


def _known_columns(names: list[str], name: str) -> dict[str, str]:
    """Each known column, lower-cased, to its name in the file.  Two spellings of
    one column, or no ``url`` column, stop the run, as a CSV header's would."""
    columns: dict[str, str] = {}
    for column in names:
        known = column.strip().lower()
        if known not in COLUMNS:
            continue
        if known in columns:
            raise UsageError(
                f"input {name!r}: column {known!r} appears more than once "
                f"({columns[known]!r} and {column!r})"
            )
        columns[known] = column
    if "url" not in columns:
        found = ", ".join(repr(column) for column in names[:10])
        more = ", ..." if len(names) > 10 else ""
        raise UsageError(f"input {name!r} has no 'url' column (columns found: {found}{more})")
    return columns


def _row(index: int, fields: dict[str, object], name: str, number: int) -> Row:
    for column, value in fields.items():
        if isinstance(value, bytes):
            # A binary column (writers that do not mark text as UTF-8): its
            # bytes as the text ones would be read, bad UTF-8 found by build_row.
            fields[column] = value.decode("utf-8", "surrogateescape")
        elif isinstance(value, float) and column == "size":
            # pandas writes an integer column with gaps as floats, a gap as NaN.
            if math.isnan(value):
                fields[column] = None
            elif value.is_integer():
                fields[column] = int(value)
    try:
        return build_row(index, fields)
    except FieldError as exc:
        raw = fields.get("url")
        url = usable_url(fields) or ("" if raw is None else printable(str(raw)[:200])[:200])
        return Row(index, url, problem=printable(f"input {name!r}, row {number}: {exc}"))
