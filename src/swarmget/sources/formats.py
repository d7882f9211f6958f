"""Parsers for the three input formats: plain URL lists, CSV/TSV and JSONL.

Each parser takes an iterator of text lines (line endings still attached),
the input's display name for error messages, and a shared counter that hands
out row indices, so indices run on across several inputs without the reader
renumbering anything.  Parsers are generators: nothing is read ahead beyond
what the ``csv`` module buffers for one record.

Errors are :class:`~swarmget.errors.UsageError` naming the input and line:
the rows of one list are usually produced by one script, so a bad line is
almost always a systematic mistake that the user wants to fix before a run,
not a single row to skip.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator

from swarmget.errors import UsageError
from swarmget.sources.fields import COLUMNS, FieldError, build_row
from swarmget.sources.rows import Row


def parse_text(lines: Iterable[str], counter: Iterator[int]) -> Iterator[Row]:
    """One URL per line; blank lines and ``#`` comments are skipped.

    This is the hot path for huge lists, so it does the least possible work per
    line: one strip, one test, one Row.
    """
    for line in lines:
        url = line.strip()
        if url and url[0] != "#":
            yield Row(next(counter), url)


def parse_jsonl(lines: Iterable[str], name: str, counter: Iterator[int]) -> Iterator[Row]:
    """One JSON object per line with ``url`` and the optional columns."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            # exc.colno counts the line ending as a line of its own.
            column = min(exc.pos, len(line.rstrip("\r\n"))) + 1
            raise _at(name, lineno, f"not valid JSON: {exc.msg} (column {column})") from None
        except RecursionError:
            raise _at(name, lineno, "not valid JSON: nested too deeply") from None
        if not isinstance(value, dict):
            kind = "an array" if isinstance(value, list) else type(value).__name__
            raise _at(name, lineno, f"expected a JSON object, got {kind}")
        try:
            row = build_row(next(counter), value)
        except FieldError as exc:
            raise _at(name, lineno, str(exc)) from None
        yield row


def parse_delimited(
    lines: Iterable[str], name: str, counter: Iterator[int], delimiter: str
) -> Iterator[Row]:
    """CSV (``delimiter=","``) or TSV (``"\\t"``) with a header row naming a ``url`` column."""
    # strict: a stray quote such as `"http://h/a"x` is an error instead of
    # being glued silently into a different URL.  skipinitialspace: in
    # `a, "b, c"` the quotes are quotes (cells are stripped anyway).
    records = csv.reader(lines, delimiter=delimiter, strict=True, skipinitialspace=True)
    try:
        header = _first_record(records)
        if header is None:
            return  # an empty file is an empty list, not an error
        columns = _column_positions(header, name)
        width = len(header)
        for record in records:
            if not any(cell.strip() for cell in record):
                continue  # blank line, or the ",,,," rows spreadsheets leave at the end
            if len(record) > width and any(cell.strip() for cell in record[width:]):
                # Most likely an unquoted delimiter inside a URL: taking the
                # first cells would quietly download something else.
                problem = f"{len(record)} fields but the header has {width}"
                raise _at(name, records.line_num, problem)
            fields = {col: record[i] for col, i in columns.items() if i < len(record)}
            try:
                row = build_row(next(counter), fields)
            except FieldError as exc:
                raise _at(name, records.line_num, str(exc)) from None
            yield row
    except csv.Error as bad:  # not `exc`: mypyc gives a name one type per function
        kind = "TSV" if delimiter == "\t" else "CSV"
        raise _at(name, records.line_num, f"not valid {kind}: {bad}") from None


def _first_record(records: Iterator[list[str]]) -> list[str] | None:
    for record in records:
        if any(cell.strip() for cell in record):
            return record
    return None


def _column_positions(header: list[str], name: str) -> dict[str, int]:
    """Map each known column to its position; other columns are ignored."""
    positions: dict[str, int] = {}
    for i, cell in enumerate(header):
        column = cell.strip().lower()
        if column not in COLUMNS:
            continue
        if column in positions:
            raise UsageError(f"input {name!r}: column {column!r} appears more than once")
        positions[column] = i
    if "url" not in positions:
        found = ", ".join(repr(_clip(cell)) for cell in header[:10])
        more = ", ..." if len(header) > 10 else ""
        raise UsageError(
            f"input {name!r} has no 'url' column (columns found: {found}{more}); "
            "the first line must name the columns, e.g. url,path"
        )
    return positions


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _at(name: str, lineno: int, problem: str) -> UsageError:
    return UsageError(f"input {name!r}, line {lineno}: {problem}")
