"""Reading input rows lazily from URLs, files and stdin.

Theory of operation
-------------------
:func:`read_rows` is a generator over a list of *sources*.  A source is a URL
given directly (anything containing ``://``), ``-`` for stdin, or a path.  The
format of a path comes from its name (``.csv``, ``.tsv``, ``.jsonl``/``.ndjson``,
each optionally ``.gz``-compressed); when the name says nothing (``.txt``, no
suffix, stdin) the first non-blank line decides:

* starts with ``{`` (or ``[``, so a JSON array gets a clear "expected a JSON
  object" error instead of becoming a heap of ``bad_url`` rows) -> JSONL;
* has a tab or a comma and one of its fields is ``url`` (and no ``://``, so
  a URL is never mistaken for a header) -> TSV or CSV;
* is exactly ``url`` -> a one-column CSV (``csvcut -c url`` writes that, and
  ``url`` on its own is never a download);
* anything else -> one URL per line.

Rows are numbered by one counter across all sources, so ``Row.index`` is the
position in the whole input.  Nothing is read ahead beyond one line (the
sniffed one), which keeps memory flat for lists of a hundred million URLs.

Failing early and clearly
-------------------------
At the first ``next()``, before any row is produced, every path is checked
(exists, is not a directory, can be opened, a ``.gz`` really is gzip), so a
typo in the third file of a long run does not surface hours later.  Reading
errors later on (I/O errors, truncated gzip, invalid UTF-8, malformed lines)
become :class:`~swarmget.errors.UsageError` naming the input and, where there
is one, the line.  Nothing is skipped silently except blank lines and ``#``
comments in plain lists.

A URL that is present but not a valid http(s) URL is *not* an input error: it
is yielded like any other and fails on its own with ``bad_url``.
"""

from __future__ import annotations

import enum
import errno
import gzip
import itertools
import os
import stat
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TextIO

from swarmget.errors import UsageError
from swarmget.sources.formats import parse_delimited, parse_jsonl, parse_text
from swarmget.sources.rows import Row

STDIN = "-"
STDIN_NAME = "<stdin>"

_GZIP_MAGIC = b"\x1f\x8b"


class Format(enum.Enum):
    TEXT = "text"
    CSV = "csv"
    TSV = "tsv"
    JSONL = "jsonl"


_SUFFIX_FORMATS = {
    ".csv": Format.CSV,
    ".tsv": Format.TSV,
    ".tab": Format.TSV,
    ".jsonl": Format.JSONL,
    ".ndjson": Format.JSONL,
}


def read_rows(
    sources: Sequence[str | os.PathLike[str]], *, stdin: TextIO | None = None
) -> Iterator[Row]:
    """Yield the rows of every source in order; see the module docstring.

    ``stdin`` replaces :data:`sys.stdin` for the ``-`` source (tests, embedding).
    Raises :class:`~swarmget.errors.UsageError` for unreadable or malformed input.
    """
    counter = itertools.count()
    check_sources(sources)
    for source in sources:
        if isinstance(source, str) and source == STDIN:
            yield from _read_stdin(stdin, counter)
        elif isinstance(source, str) and "://" in source:
            yield Row(next(counter), source.strip())
        else:
            yield from _read_path(os.fspath(source), counter)


def format_from_name(path: str) -> Format | None:
    """The format a file name announces, or None when it must be sniffed."""
    stem, suffix = os.path.splitext(path.lower())
    if suffix == ".gz":
        suffix = os.path.splitext(stem)[1]
    return _SUFFIX_FORMATS.get(suffix)


def sniff(first_line: str) -> Format:
    """Guess the format of an input from its first non-blank line."""
    text = first_line.strip().lstrip("\ufeff")
    if text.startswith(("{", "[")):
        return Format.JSONL
    if "://" in text:
        return Format.TEXT  # a URL, even one with ",url," in it, is not a header
    if "\t" in text and "url" in _cells(text, "\t"):
        return Format.TSV
    if "," in text and "url" in _cells(text, ","):
        return Format.CSV
    if text.lower() == "url":
        return Format.CSV
    return Format.TEXT


def _cells(line: str, delimiter: str) -> list[str]:
    # A plain split, not the csv module: a header that needs quoting around
    # the word "url" is not a header a human wrote for us.
    return [cell.strip().strip('"').strip().lower() for cell in line.split(delimiter)]


def check_sources(sources: Iterable[str | os.PathLike[str]]) -> None:
    """Raise UsageError now for any source that is certain to fail later.

    :func:`read_rows` calls this at its first ``next()``; the CLI may call it
    earlier to fail before setting anything else up.
    """
    stdin_count = 0
    for source in sources:
        if isinstance(source, str) and source == STDIN:
            stdin_count += 1
        elif not (isinstance(source, str) and "://" in source):
            _check_path(os.fspath(source))
    if stdin_count > 1:
        raise UsageError("'-' (stdin) can be given as an input only once")


def _check_path(path: str) -> None:
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        # Only regular files are opened here: opening a FIFO can block or steal
        # its writer, and `<(command)` inputs are pipes.
        if not stat.S_ISREG(info.st_mode):
            return
        with open(path, "rb") as f:
            magic = f.read(2) if path.lower().endswith(".gz") else b""
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if magic and magic != _GZIP_MAGIC:
        raise UsageError(f"cannot read input {path!r}: not a gzip file (the name ends in .gz)")


def _read_path(path: str, counter: Iterator[int]) -> Iterator[Row]:
    compressed = path.lower().endswith(".gz")
    try:
        with _open_text(path, compressed) as lines:
            yield from _parse(lines, path, format_from_name(path), counter)
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc, _first_bad_line(path, compressed)) from None
    except (OSError, EOFError, zlib.error) as exc:
        raise _unreadable(path, exc) from None


def _read_stdin(stdin: TextIO | None, counter: Iterator[int]) -> Iterator[Row]:
    stream = sys.stdin if stdin is None else stdin
    if stream is None:  # pythonw, or a daemon with stdin closed
        raise UsageError("cannot read input '-': there is no stdin")
    try:
        yield from _parse(stream, STDIN_NAME, None, counter)
    except UnicodeDecodeError as exc:
        raise _not_utf8(STDIN_NAME, exc, None) from None
    except OSError as exc:
        raise _unreadable(STDIN_NAME, exc) from None


def _open_text(path: str, compressed: bool) -> TextIO:
    # utf-8-sig drops a BOM (Excel writes one); newline="" is what the csv
    # module needs, and the other parsers strip line endings themselves.
    if compressed:
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _parse(
    lines: Iterable[str], name: str, fmt: Format | None, counter: Iterator[int]
) -> Iterator[Row]:
    if fmt is None:
        fmt, lines = _sniff_lines(iter(lines))
    if fmt is Format.TEXT:
        return parse_text(lines, counter)
    if fmt is Format.JSONL:
        return parse_jsonl(lines, name, counter)
    return parse_delimited(lines, name, counter, "\t" if fmt is Format.TSV else ",")


def _sniff_lines(lines: Iterator[str]) -> tuple[Format, Iterator[str]]:
    """Read up to the first non-blank line, decide the format, put the lines back."""
    head: list[str] = []
    for line in lines:
        if not head:
            line = line.lstrip("\ufeff")  # stdin is not opened as utf-8-sig
        head.append(line)
        if line.strip():
            return sniff(line), itertools.chain(head, lines)
    return Format.TEXT, iter(head)


def _first_bad_line(path: str, compressed: bool) -> int | None:
    """Find the line that failed to decode: the text layer decodes in chunks,
    so the line count at the time of the error can be far off."""
    try:
        with gzip.open(path, "rb") if compressed else open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    return lineno
    except (OSError, EOFError, zlib.error):
        pass
    return None


def _not_utf8(name: str, exc: UnicodeDecodeError, lineno: int | None) -> UsageError:
    where = f"input {name!r}, line {lineno}" if lineno else f"input {name!r}"
    return UsageError(f"{where}: not valid UTF-8 text ({exc.reason})")


def _unreadable(name: str, exc: BaseException) -> UsageError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return UsageError(f"cannot read input {name!r}: {reason or type(exc).__name__}")
