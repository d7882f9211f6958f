"""Parsers for the three input formats: plain URL lists, CSV/TSV and JSONL.

Each parser takes an iterator of text lines (line endings still attached),
the input's display name for messages, and a shared counter that hands out
row indices, so indices run on across several inputs without the reader
renumbering anything.  Parsers are generators: nothing is read ahead beyond
what the ``csv`` module buffers for one record.

Malformed rows
--------------
One bad row must not stop a run of millions, nor hide the rows after it.  A
row that cannot be read is yielded as ``Row(index, url, problem=message)``:
it takes its index like any row, ``message`` names the input and the line
(``input 'list.csv', line 7: not valid CSV: ...``), and ``url`` is the row's
URL when one could be read (a JSONL object with a good ``url`` and a bad
``sha256``), else the line itself, stripped and clipped to 200 characters.
The engine fails such a row with ``bad_row``.  Per format:

* text: a line that is not valid UTF-8, or longer than any URL a server
  takes (:data:`~swarmget.sources.rows.MAX_URL`).  (Every other line is a
  URL, however wrong; blank lines and ``#`` comments are skipped and take
  no index.)
* JSONL: a line that is not JSON, or not a JSON object; a column that is
  invalid (:mod:`~swarmget.sources.fields`).  Blank lines are skipped.
* CSV/TSV: bad quoting; more non-empty fields than the header has (most
  likely an unquoted delimiter inside a URL: taking the first cells would
  quietly download something else); a column that is invalid.  Blank
  records (``,,,``) are skipped.

What is *not* one bad row is an input that is the wrong thing as a whole, and
the first non-blank line is where that shows: a CSV/TSV header that is not
valid or names no ``url`` column, or a JSONL input whose first line is not a
JSON object (a JSON array, pretty-printed JSON) raise
:class:`~swarmget.errors.UsageError`.

CSV needs care, because a quote opens a field that may span lines, and an
unclosed quote would swallow the lines after it into one record.  A quoted
field that spans lines is read as the csv module reads it (RFC 4180), in any
column: the value keeps its line break (a URL or path then loses one at its
ends, as it loses spaces), and the row's line is the record's first.  A
record that spans lines *and* is wrong is one bad row for its first line,
and the lines after that are read again as records of their own, so the
good rows an unclosed quote swallowed come back.  Wrong is: bad quoting, too
many fields, a url that is nothing but a line break (two stray quotes on two
lines make that), or a value in a column swarmget reads with a URL (``://``)
after its line break: an unclosed quote in a column we read that a later
quote happened to close has taken in the rows between, and every row holds a
URL.  Lines with no URL are no rows to bring back: a size or digest with a
line break inside is one row, as the csv module reads it, which fails for its
bad size or digest (read again, its second line was a row of its own, made
up).  The one case this cannot see is a stray quote that a later quote
closes right before a delimiter or a line end with no URL between them (in
an ignored column, with or without one): that is a legal multi-line field,
and it is read as one.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from swarmget.errors import UsageError
from swarmget.sources.fields import (
    COLUMNS,
    FieldError,
    build_row,
    is_text,
    printable,
    too_long,
    usable_url,
    why_not_text,
)
from swarmget.sources.rows import MAX_URL, Row, strip_url

RAW_LIMIT = 200  # characters of a bad line kept as its row's url


class ByteErrors:
    """How many undecodable bytes the inputs have had: the reader's codec error
    handler counts them (see :func:`parse_text`)."""

    def __init__(self) -> None:
        self.count = 0


BYTE_ERRORS: Final = ByteErrors()


def parse_text(
    lines: Iterable[str], name: str, counter: Iterator[int], byte_errors: int = -1
) -> Iterator[Row]:
    """One URL per line; blank lines and ``#`` comments are skipped.

    This is the hot path for huge lists, so it does the least possible work per
    line: one strip, one test, one Row.  A line with bytes that are not UTF-8
    is a bad row, but looking for them costs a method call per line (a tenth
    of the loop, compiled), so it is done only when needed: ``byte_errors`` is
    ``BYTE_ERRORS.count`` from before the input was decoded, and while the
    count stays the same no line has such a byte and none is checked.  (-1:
    check every line, for text that was not decoded by the reader.)
    """
    errors = BYTE_ERRORS
    lineno = 0
    for line in lines:
        lineno += 1  # noqa: SIM113 -- compiled, a native int; enumerate() boxes one per line
        url = strip_url(line)
        if url and url[0] != "#" and not url.isspace():  # a line of other spaces: blank
            if errors.count != byte_errors and not is_text(url):
                problem = f"not valid UTF-8 ({why_not_text(line)})"
                yield bad_row(next(counter), name, lineno, problem, None, url)
            elif len(url) > MAX_URL:
                yield bad_row(next(counter), name, lineno, too_long("url", url), None, url)
            else:
                yield Row(next(counter), url)


class _Objects:
    """JSON objects as dicts, noting the keys the last one had twice.

    ``json.loads`` keeps the last of two equal keys and says nothing, so
    ``{"url": a, "url": b}`` went to b, as silently as ``url`` and ``URL``
    once did (see :func:`_lower_keys`).  The line's own object is the last
    one the decoder makes (nested ones come first), so ``twice`` is its own."""

    def __init__(self) -> None:
        self.twice: list[str] = []

    def make(self, pairs: list[tuple[str, object]]) -> dict[str, object]:
        value = dict(pairs)
        self.twice = [] if len(value) == len(pairs) else _repeated(pairs)
        return value


def _repeated(pairs: list[tuple[str, object]]) -> list[str]:
    seen: set[str] = set()
    repeated: list[str] = []
    for key, _ in pairs:
        if key in seen:
            repeated.append(key)
        seen.add(key)
    return repeated


def parse_jsonl(lines: Iterable[str], name: str, counter: Iterator[int]) -> Iterator[Row]:
    """One JSON object per line with ``url`` and the optional columns."""
    first = True
    # One decoder an input (json.loads(line, object_pairs_hook=...) makes one a
    # line), and its own: inputs may be read on two threads at once.
    objects = _Objects()
    decoder = json.JSONDecoder(object_pairs_hook=objects.make)
    # For a line with an integer of more digits than int() reads (4,300): it is
    # read as the float it is, as 1e400 is (a column swarmget does not read may
    # hold it; a size fails as no whole number).  The line failed, or the whole
    # input on its first line, saying to call sys.set_int_max_str_digits().
    long_ints = json.JSONDecoder(object_pairs_hook=objects.make, parse_int=_long_int)
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        value, problem = _decoded(line, decoder)
        if problem == _LONG_INT:
            value, problem = _decoded(line, long_ints)
        if not problem and not isinstance(value, dict):
            kind = "an array" if isinstance(value, list) else type(value).__name__
            problem = f"expected a JSON object, got {kind}"
        if problem:
            if first:
                raise _at(name, lineno, f"{problem}; {_JSONL_HINT}")
            yield bad_row(next(counter), name, lineno, problem, None, line)
            continue
        first = False
        assert isinstance(value, dict)
        index = next(counter)
        known: dict[str, object] | None = None
        try:
            # Always, not only without "url": {"url": a, "URL": b} went to a, and
            # {"url": a, "PATH": p} lost its path, neither said.
            known = _lower_keys(value, objects.twice)  # "URL", as a CSV header may say it too
            row = build_row(index, known)
        except FieldError as bad_field:  # not `exc`: mypyc gives a name one type per function
            # Two urls: the row is named by its line, not by one of them.
            url = usable_url(known) if known is not None else None
            row = bad_row(index, name, lineno, str(bad_field), url, line)
        yield row


# What _decoded says of a line with an integer too long for int().
_LONG_INT: Final = "not valid JSON: an integer too long"


def _decoded(line: str, decoder: json.JSONDecoder) -> tuple[object, str]:
    """The JSON value of ``line``, or what is wrong with it."""
    try:
        return decoder.decode(line), ""
    except json.JSONDecodeError as exc:
        return None, _json_problem(exc, line)
    except ValueError:  # an int too long for int()
        return None, _LONG_INT
    except RecursionError:
        return None, "not valid JSON: nested too deeply"


def _long_int(digits: str) -> int | float:
    try:
        return int(digits)
    except ValueError:
        return float(digits)


def _lower_keys(fields: dict[str, object], twice: list[str]) -> dict[str, object]:
    """The known columns of ``fields``, named in lower case (``URL``, ``Path``).
    Two spellings of one column (``url`` and ``URL``), or the same one twice
    (``twice``: the keys the line had more than once), are an error, as in a
    CSV header: which one was meant cannot be told, and taking either is a guess."""
    for key in twice:
        if key.lower() in COLUMNS:
            raise FieldError(f"column {key.lower()!r} appears more than once ({key!r} twice)")
    lowered: dict[str, object] = {}
    spelled: dict[str, str] = {}
    for key, value in fields.items():
        column = key.lower()
        if column in COLUMNS:
            if column in lowered:
                raise FieldError(
                    f"column {column!r} appears more than once ({spelled[column]!r} and {key!r})"
                )
            lowered[column] = value
            spelled[column] = key
    return lowered


_JSONL_HINT = (
    "the input is read as JSON Lines, one JSON object per line "
    "(jq -c '.[]' turns a JSON array into that, jq -c . pretty-printed JSON)"
)


def _json_problem(exc: json.JSONDecodeError, line: str) -> str:
    # exc.colno counts the line ending as a line of its own.
    column = min(exc.pos, len(line.rstrip("\r\n"))) + 1
    return f"not valid JSON: {exc.msg} (column {column})"


class _Lines:
    """The csv module's input, which keeps the lines of the record being read,
    so that those of a failed record can be read again, and numbers them.

    The lines to read again are always the ones right before the next unread
    line, so one counter numbers every line, read again or not.
    """

    def __init__(self, lines: Iterable[str]) -> None:
        self._lines = iter(lines)
        self._again: list[str] = []  # lines to hand out again, the next one last
        self.lineno = 0  # the number of the last line handed out
        self.record: list[str] = []  # the lines of the record being read

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        line = self._again.pop() if self._again else next(self._lines)
        self.lineno += 1
        self.record.append(line)
        return line

    def start(self) -> int:
        """The number of the record's first line."""
        return self.lineno - len(self.record) + 1

    def read_again(self) -> None:
        """Hand out the record's lines after its first again, as the next lines."""
        self._again.extend(reversed(self.record[1:]))
        self.lineno -= len(self.record) - 1
        del self.record[1:]


# The csv module refuses a field over 128 KiB, even in a column we never read (a
# long caption, an embedded thumbnail): the row failed.  Raised once, for the
# process (raising it harms no one), to a size no real field reaches; it still
# bounds what an unclosed quote makes us hold before its lines are read again.
FIELD_LIMIT: Final = 4 << 20


def _reader(feed: _Lines, delimiter: str) -> Iterator[list[str]]:
    if csv.field_size_limit() < FIELD_LIMIT:
        csv.field_size_limit(FIELD_LIMIT)
    # strict: a stray quote such as `"http://h/a"x` is an error instead of
    # being glued silently into a different URL.  skipinitialspace: in
    # `a, "b, c"` the quotes are quotes (cells are stripped anyway).
    return csv.reader(feed, delimiter=delimiter, strict=True, skipinitialspace=True)


def parse_delimited(
    lines: Iterable[str], name: str, counter: Iterator[int], delimiter: str
) -> Iterator[Row]:
    """CSV (``delimiter=","``) or TSV (``"\\t"``) with a header row naming a ``url`` column."""
    kind = "TSV" if delimiter == "\t" else "CSV"
    feed = _Lines(lines)
    records = _reader(feed, delimiter)
    try:
        header = _first_record(records)
    except csv.Error as bad_header:  # not `exc`: mypyc gives a name one type per function
        blank = next((i for i, line in enumerate(feed.record) if line.strip()), 0)
        start = feed.start() + blank
        raise _at(name, start, f"the header is not valid {kind}: {bad_header}") from None
    if header is None:
        return  # an empty file is an empty list, not an error
    columns = _column_positions(header, name, delimiter)
    width = len(header)
    while True:
        feed.record.clear()
        record: list[str] = []
        failed = ""
        try:
            record = next(records)
        except StopIteration:
            return
        except csv.Error as bad:
            failed = f"not valid {kind}: {bad}"
            records = _reader(feed, delimiter)  # a fresh one: never trust a failed reader
        plain = None
        if delimiter == "\t" and (failed or len(feed.record) > 1):
            plain = _plain_tsv(feed.record[0], columns)
        if plain is not None:
            # TSV seldom quotes: a caption that begins with a quote (`"Best"
            # laptop`, or one never closed) is text, not quoting.  Read as
            # such, its line is a row; a record run on over lines would take
            # the next rows into a caption.
            record = plain
            if len(feed.record) > 1:
                feed.read_again()
                records = _reader(feed, delimiter)
            failed = ""
        if failed:
            problem = failed
        else:
            problem = _record_problem(record, columns, width, len(feed.record) > 1)
            # Blank: a blank line, or the ",,,," rows spreadsheets leave at the end.
            # Not a "record" of nothing but a line break in a column we read:
            # that is two lines with an unclosed quote each (`"` then `"`), and
            # _record_problem has made it a bad row.
            if not problem and not any(cell.strip() for cell in record):
                continue
        start = feed.start()
        first_line = feed.record[0] if feed.record else ""
        if problem:
            if len(feed.record) > 1:
                problem += f" (the record runs on to line {feed.lineno}: is a quote not closed?)"
                feed.read_again()
            yield bad_row(next(counter), name, start, problem, None, first_line)
            continue
        fields = {col: record[i] for col, i in columns.items() if i < len(record)}
        index = next(counter)
        try:
            row = build_row(index, fields)
        except FieldError as bad_field:
            row = bad_row(index, name, start, str(bad_field), usable_url(fields), first_line)
        yield row


def _plain_tsv(line: str, columns: Mapping[str, int]) -> list[str] | None:
    """A TSV line's cells, split at every tab (a cell quoted whole loses its
    quotes); None if a quote is left in a column we read: that one is malformed."""
    cells = line.rstrip("\r\n").split("\t")
    for i, cell in enumerate(cells):
        text = cell.strip()
        if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
            cells[i] = text[1:-1].replace('""', '"')
    if any(i < len(cells) and '"' in cells[i] for i in columns.values()):
        return None
    return cells


def _record_problem(
    record: list[str], columns: Mapping[str, int], width: int, multiline: bool
) -> str:
    """What makes a parsed record unusable as a whole ("" if nothing does)."""
    if len(record) > width and any(cell.strip() for cell in record[width:]):
        return f"{len(record)} fields but the header has {width}"
    if multiline:
        return _line_break_problem(record, columns, width)
    return ""


def _line_break_problem(record: list[str], columns: Mapping[str, int], width: int) -> str:
    """Why a record that spans lines is a quote gone wrong rather than values
    with line breaks in them ("" if it is not): see the module docstring.

    A record found wrong is read again line by line, each line a row, so it is
    found wrong only where its later lines hold rows: a URL after the break.
    Else it is one row, as the csv module reads it: a size "10\n0" read again
    made its second line, `0"`, a row of its own (and a size that holds a
    break fails its row as any bad size does)."""
    for column, i in columns.items():
        if i < len(record) and _has_break(record[i]):
            # As the row reads it, a break at an end is let by.  A url cell that
            # begins with one and then is a URL alone ("\nhttp://...") is a
            # wrapped URL, not two rows.  Anything else with a URL after a
            # break -- in another column, or with a field of the next line
            # before it ("\np2,http://...") -- is the next line's, taken in by a
            # quote opened at the end of this one.
            value = record[i]
            stripped = value.strip()
            wrapped = column == "url" and _a_url_alone(stripped)
            if _url_after_break(stripped if wrapped else value):
                return f"{column!r} has a line break with a URL after it"
            # A url that is nothing but a line break is two stray quotes, each
            # on a line of its own, not a row with no URL.
            if column == "url" and not stripped:
                return f"{column!r} has a line break"
    return ""


def _a_url_alone(text: str) -> bool:
    """Does ``text`` start with a scheme and hold no field delimiter (a URL cell
    on its own, not the start of the next line's fields)?"""
    head = text[:12].lower()
    return (head.startswith(("http://", "https://"))) and "," not in text and "\t" not in text


def _url_after_break(value: str) -> bool:
    """Does ``value`` hold ``://`` after its first line break?  The lines an
    unclosed quote took in are rows, and rows hold URLs; a URL or path that
    was merely wrapped does not start another one."""
    breaks = [at for at in (value.find("\n"), value.find("\r")) if at >= 0]
    return bool(breaks) and "://" in value[min(breaks) :]


def _has_break(cell: str) -> bool:
    return "\n" in cell or "\r" in cell


def _first_record(records: Iterator[list[str]]) -> list[str] | None:
    for record in records:
        if any(cell.strip() for cell in record):
            return record
    return None


def _column_positions(header: list[str], name: str, delimiter: str) -> dict[str, int]:
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
        hint = "the first line must name the columns, e.g. url,path"
        if len(header) == 1 and ";" in header[0]:
            hint = "columns separated by ';' are not read: use ',' (CSV) or tabs (TSV)"
        elif len(header) == 1 and "\t" in header[0]:
            hint = "its columns are separated by tabs: name the file .tsv (or pipe it to stdin)"
        elif len(header) == 1 and delimiter == "\t" and "," in header[0]:
            # A CSV named .tsv: "columns found: 'url,path'; ... e.g. url,path"
            # told the user to write what they had written.
            hint = "its columns are separated by commas: name the file .csv (or pipe it to stdin)"
        elif any("://" in cell for cell in header):
            # A list shipped without a header line (Conceptual Captions'
            # caption<TAB>url): "e.g. url,path" did not say the line was a row.
            hint = (
                f"the first line is a row, not a header (column {url_position(header) + 1} "
                "holds a URL): add a header line naming the columns, such as "
                + header_for(header, delimiter)
            )
        raise UsageError(
            f"input {name!r} has no 'url' column (columns found: {found}{more}); {hint}"
        )
    return positions


def header_for(cells: list[str], delimiter: str) -> str:
    """The header line a row of ``cells`` lacks, to show the user: ``url`` where
    the first URL is (the other names are the user's choice; swarmget ignores
    those columns), ``caption<TAB>url`` for Conceptual Captions' rows."""
    at = url_position(cells)
    others = len(cells) - 1
    names = [
        "url" if i == at else ("caption" if others == 1 else f"col{i + 1}")
        for i in range(len(cells))
    ]
    return ("<TAB>" if delimiter == "\t" else delimiter).join(names)


def url_position(cells: list[str]) -> int:
    """The index of the first cell holding a URL (0 if none does)."""
    return next((i for i, cell in enumerate(cells) if "://" in cell), 0)


def bad_row(index: int, name: str, lineno: int, problem: str, url: str | None, line: str) -> Row:
    """The row for a line that could not be read: see the module docstring."""
    if url is None:
        url = printable(line.strip()[:RAW_LIMIT])[:RAW_LIMIT]
    return Row(index, url, problem=printable(f"input {name!r}, line {lineno}: {problem}"))


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _at(name: str, lineno: int, problem: str) -> UsageError:
    return UsageError(f"input {name!r}, line {lineno}: {problem}")
