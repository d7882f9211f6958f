"""Reading input rows lazily from URLs, files and stdin.

Theory of operation
-------------------
:func:`read_rows` is a generator over a list of *sources*.  A source is a URL
given directly (anything containing ``://``), ``-`` for stdin, or a path.  The
format of a path comes from its name (``.csv``, ``.tsv``, ``.jsonl``/``.ndjson``,
each optionally ``.gz``-compressed; ``.parquet``/``.pq``, or a file whose first
bytes are Parquet's, whatever its name: :mod:`~swarmget.sources.parquet`);
when the name says nothing (``.txt``, no suffix, stdin) the first non-blank
line that is not a ``#`` comment decides (comments before a table or JSONL
are refused: only plain lists have them):

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
typo in the third file of a long run does not surface hours later.

After that there are two kinds of trouble, and the line between them is
whether the input *as a whole* can be read:

* The input cannot be read, or is not what it claims to be: an I/O error, a
  truncated or corrupt gzip stream, a first non-blank line that is not UTF-8
  text (or holds NUL bytes: a binary file, UTF-16, an ``.xlsx``, an ``.xz``),
  a CSV/TSV header without a ``url`` column, a JSONL input whose first line
  is not a JSON object.  That raises :class:`~swarmget.errors.UsageError`
  naming the input and, where there is one, the line, and the run stops
  (exit status 2).  The first line is the verdict on the whole input: a file
  whose first line is binary is not a list with one bad row.  (A text line
  with a few bytes that are not UTF-8, a Latin-1 letter, is text: one bad
  row, on the first line as on any other.)
* One row is malformed: bad quoting, a broken JSON line, an invalid column,
  a missing ``url``, a line that is not UTF-8 in the middle of a list.  That
  row is yielded with ``problem`` set (see :mod:`~swarmget.sources.formats`)
  and fails alone with ``bad_row``; the rows after it are read as usual.  In
  a list of millions, one mangled line (a bad merge, a Latin-1 character)
  must not cost the rest, and the manifest names its line for the fix.

Nothing is skipped silently except blank lines and ``#`` comments in plain
lists.  A URL that is present but not a valid http(s) URL is *not* an input
error either: it is yielded like any other and fails on its own with
``bad_url``.

Bytes, not text
---------------
Files and stdin are read as bytes, so that both are read the same way: a
stream that starts with the gzip magic is decompressed whatever its name
(``cat list.jsonl.gz | swarmget -``, a ``<(curl ...)`` pipe), then decoded as
UTF-8 (a BOM is dropped) with ``surrogateescape``, so that an undecodable
byte costs its own line and no other: lines are split on ``\n``, ``\r`` and
``\r\n`` as the csv module wants.  (``sys.stdin`` as text decodes as the
locale says: in a C, POSIX or C.UTF-8 locale -- containers, CI -- and in
UTF-8 mode that is ``surrogateescape`` with nobody checking the result, so
undecodable bytes went on as URLs; in other locales it is strict, and one
bad byte ended the run.)
"""

from __future__ import annotations

import codecs
import enum
import errno
import gzip
import io
import itertools
import os
import re
import stat
import sys
import zlib
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import IO, Any, BinaryIO, Final, TextIO, TypeGuard, cast

from swarmget.errors import UsageError
from swarmget.sources.fields import is_text, why_not_text
from swarmget.sources.formats import (
    BYTE_ERRORS,
    header_for,
    parse_delimited,
    parse_jsonl,
    parse_text,
)
from swarmget.sources.parquet import MAGIC, parse_parquet
from swarmget.sources.rows import Row, hide_password, strip_url

STDIN = "-"
STDIN_NAME = "<stdin>"

_GZIP_MAGIC = b"\x1f\x8b"
# Characters one line may hold: far above any URL or row (a long caption is a
# few KB), far below what takes a machine's memory.
MAX_LINE: Final = 16 << 20

# surrogateescape that also counts the bytes it escapes, so that the text
# parser knows when it must look for them (see formats.parse_text).
_ERRORS = "swarmget-surrogateescape"
_escape = codecs.lookup_error("surrogateescape")


def _count_and_escape(exc: UnicodeError) -> tuple[str | bytes, int]:
    BYTE_ERRORS.count += 1
    return _escape(exc)


codecs.register_error(_ERRORS, _count_and_escape)

# What a first line that is not text most likely is, by its first bytes.
_NOT_TEXT_HINTS = (
    # UTF-32's byte order marks first: the little-endian one starts as UTF-16's.
    (b"\xff\xfe\x00\x00", "it is UTF-32 text: save it as UTF-8"),
    (b"\x00\x00\xfe\xff", "it is UTF-32 text: save it as UTF-8"),
    (b"\xff\xfe", "it is UTF-16 text: save it as UTF-8"),
    (b"\xfe\xff", "it is UTF-16 text: save it as UTF-8"),
    (b"PK\x03\x04", "it is a zip archive: an Excel workbook? save it as CSV"),
    (b"BZh", "it looks bzip2-compressed: only gzip is read as it is, bzcat it"),
    (b"\xfd7zXZ\x00", "it is xz-compressed: only gzip is read as it is, xzcat it"),
    (b"\x28\xb5\x2f\xfd", "it is zstd-compressed: only gzip is read as it is, zstdcat it"),
    (MAGIC, "it is a Parquet file: give its path (Parquet is read from its end, a pipe has none)"),
)
_NOT_TEXT_HINT = "swarmget reads UTF-8 text, plain or gzip-compressed"


class Format(enum.Enum):
    TEXT = "text"
    CSV = "csv"
    TSV = "tsv"
    JSONL = "jsonl"
    PARQUET = "parquet"


_SUFFIX_FORMATS = {
    ".csv": Format.CSV,
    ".tsv": Format.TSV,
    ".tab": Format.TSV,
    ".jsonl": Format.JSONL,
    ".ndjson": Format.JSONL,
    ".parquet": Format.PARQUET,
    ".pq": Format.PARQUET,
}


def read_rows(
    sources: Sequence[str | os.PathLike[str]],
    *,
    stdin: TextIO | BinaryIO | None = None,
) -> Iterator[Row]:
    """Yield the rows of every source in order; see the module docstring.

    ``stdin`` replaces :data:`sys.stdin` for the ``-`` source (tests,
    embedding): a binary stream is read like a file (gzip sniffed, UTF-8
    decoded), a text stream or any iterable of lines as it is.  Raises
    :class:`~swarmget.errors.UsageError` for unreadable input; malformed rows
    are yielded with ``problem`` set.
    """
    counter = itertools.count()
    check_sources(sources)
    for source in sources:
        if isinstance(source, str) and source == STDIN:
            yield from _read_stdin(stdin, counter)
        elif is_url(source):
            yield Row(next(counter), strip_url(source))
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
    # A header without a url column (``image_url,caption``): read as a plain
    # list, each row went out as a URL with its other columns glued on.  As a
    # table, it is refused for the column it lacks, as a .csv file is.  So is
    # one separated by ';' (a spreadsheet's CSV in many locales): ``url;path``
    # was a bad_url row and every row after it went out as ``URL;path``.
    for delimiter, table in (("\t", Format.TSV), (",", Format.CSV), (";", Format.CSV)):
        cells = _cells(text, delimiter)
        if len(cells) >= 2 and all(_HEADER_CELL.fullmatch(cell) for cell in cells):
            return table
    return Format.TEXT


# A column name as people write them: a word, maybe with spaces, dots or dashes.
_HEADER_CELL: Final = re.compile(r"[a-z_][a-z0-9_ .-]*")


def _cells(line: str, delimiter: str) -> list[str]:
    # A plain split, not the csv module: a header that needs quoting around
    # the word "url" is not a header a human wrote for us.
    return [cell.strip().strip('"').strip().lower() for cell in line.split(delimiter)]


def is_url(source: object) -> TypeGuard[str]:
    """Is ``source`` a URL given directly (anything containing ``://``), not a path?"""
    return isinstance(source, str) and "://" in source


def is_pipe(source: str | os.PathLike[str]) -> bool:
    """Is ``source`` a path to something other than a file or a directory (a
    FIFO, ``<(command)``'s ``/dev/fd/63``, a terminal, a socket), whose writer
    may be slow or not there yet?  Reading one blocks until its writer writes."""
    if is_url(source) or (isinstance(source, str) and source == STDIN):
        return False
    try:
        mode = os.stat(source).st_mode
    except (OSError, ValueError):
        return False  # reading it fails with its own message
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def input_files(
    sources: Iterable[str | os.PathLike[str]],
    stdin: TextIO | BinaryIO | None = None,
    within: str | os.PathLike[str] | None = None,
) -> frozenset[tuple[int, int]]:
    """``(st_dev, st_ino)`` of every file the run reads its rows from: the list
    files (what opening the path opens, through any symlink), and stdin when
    it is a file (``swarmget - < out/urls.txt``).  The planner never writes
    over or removes one of these (sinks/plan.py): by identity, as the same
    file may be named ``out/urls.txt``, ``./out/../out/urls.txt``, through a
    symlink, or by a hard link of another name.  A source that cannot be
    stat'ed is left out: reading it fails with its own message.

    ``within``: only the files a path under that directory can lead to: one
    that lies in it, or one with other hard links (they may be anywhere).  A
    list kept elsewhere, the usual case, then costs the planner nothing per
    row (it compares each row's file against these, sinks/plan.py)."""
    found: set[tuple[int, int]] = set()
    inside = _real_dir(within) if within is not None else None
    for source in sources:
        try:
            if isinstance(source, str) and source == STDIN:
                stream = sys.stdin if stdin is None else stdin
                if stream is None:
                    continue
                descriptor = stream.fileno()
                info = os.fstat(descriptor)
                where = f"/proc/self/fd/{descriptor}"  # Linux names the file it is
            elif is_url(source):
                continue
            else:
                info = os.stat(source)
                where = os.fspath(source)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            continue  # closed, or no descriptor (a list of lines in a test)
        if not stat.S_ISREG(info.st_mode):
            continue
        if inside is not None and info.st_nlink == 1 and not _lies_in(where, inside):
            continue
        found.add((info.st_dev, info.st_ino))
    return frozenset(found)


def _real_dir(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fsdecode(os.fspath(path)))


def _lies_in(path: str, directory: str) -> bool:
    """Is the file ``path`` opens inside ``directory`` (a real path)?  When it
    cannot be told (no /proc), say yes: the check then runs as before."""
    try:
        real = os.path.realpath(path, strict=True)
    except (OSError, ValueError):
        return True
    if not real.startswith("/"):
        return True  # /proc/self/fd of a pipe or socket: "pipe:[...]", not a file
    return real == directory or real.startswith(directory.rstrip("/") + "/")


def check_sources(sources: Iterable[str | os.PathLike[str]]) -> None:
    """Raise UsageError now for any source that is certain to fail later.

    :func:`read_rows` calls this at its first ``next()``; the CLI may call it
    earlier to fail before setting anything else up.
    """
    stdin_count = 0
    for source in sources:
        if isinstance(source, str) and source == STDIN:
            stdin_count += 1
        elif not is_url(source):
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
    # Its header and first row now: a second file without a url column must
    # not be found out after every row of the first one was downloaded.
    rows = _read_path(path, itertools.count())
    try:
        next(rows, None)
    finally:
        rows.close()


def _read_path(path: str, counter: Iterator[int]) -> Generator[Row, None, None]:
    fmt = format_from_name(path)
    try:
        byte_errors = BYTE_ERRORS.count
        with open(path, "rb") as raw:
            # By its name, or by its first bytes whatever its name (a .txt, none).
            parquet = fmt is Format.PARQUET or _starts_as_parquet(raw)
            if parquet:
                _check_parquet_file(raw, path)
            else:
                with _decode(raw) as lines:
                    yield from _parse(lines, path, fmt, counter, byte_errors)
    except (OSError, EOFError, zlib.error) as exc:
        raise _unreadable(path, exc) from None
    if parquet:
        yield from parse_parquet(path, path, counter)


def _starts_as_parquet(binary: io.BufferedReader) -> bool:
    return binary.peek(len(MAGIC))[: len(MAGIC)] == MAGIC


def _check_parquet_file(raw: io.BufferedReader, path: str) -> None:
    """A list named or known as Parquet must be a file pyarrow can seek in."""
    if not stat.S_ISREG(os.fstat(raw.fileno()).st_mode):
        raise UsageError(
            f"cannot read input {path!r}: a Parquet file is read from its end, "
            "so it must be a file (not a pipe)"
        )
    if raw.peek(len(_GZIP_MAGIC))[: len(_GZIP_MAGIC)] == _GZIP_MAGIC:  # a .parquet.gz
        raise UsageError(
            f"cannot read input {path!r}: not a readable Parquet file "
            "(it is gzip-compressed: gunzip it first)"
        )


def _read_stdin(stdin: TextIO | BinaryIO | None, counter: Iterator[int]) -> Iterator[Row]:
    stream = sys.stdin if stdin is None else stdin
    if stream is None:  # pythonw, or a daemon with stdin closed
        raise UsageError("cannot read input '-': there is no stdin")
    try:
        binary = _bytes_of(stream)
        if binary is None:  # text already (io.StringIO, an iterable of lines)
            yield from _parse(cast(Iterable[str], stream), STDIN_NAME, None, counter, -1)
            return
        if _starts_as_parquet(binary) and binary.seekable():
            # `swarmget - < list.parquet`: a file on stdin can be read from its
            # end (from a pipe, the first line's check says to give its path).
            yield from parse_parquet(binary, STDIN_NAME, counter)
            return
        byte_errors = BYTE_ERRORS.count
        lines = _decode(binary)
        try:
            yield from _parse(lines, STDIN_NAME, None, counter, byte_errors)
        finally:
            # Close what we added (a gzip layer), never stdin itself.
            if isinstance(lines.buffer, gzip.GzipFile):
                lines.close()
            else:
                lines.detach()
    except (OSError, EOFError, zlib.error) as exc:
        raise _unreadable(STDIN_NAME, exc) from None


def _bytes_of(stream: IO[Any]) -> io.BufferedReader | None:
    """The binary stream under ``stream`` (sys.stdin's ``buffer``), or None."""
    binary: object = stream
    if not isinstance(binary, (io.BufferedIOBase, io.RawIOBase)):
        binary = getattr(stream, "buffer", None)
        if not isinstance(binary, (io.BufferedIOBase, io.RawIOBase)):
            return None
    if isinstance(binary, io.BufferedReader):
        return binary
    return io.BufferedReader(cast(Any, binary))  # for peek(): io.BytesIO has none


def _decode(binary: io.BufferedReader) -> io.TextIOWrapper:
    """The lines of ``binary``: gunzipped if it starts with the gzip magic, then
    UTF-8 with ``surrogateescape``, counted (see the module docstring).

    The text layer closes the gzip layer, which never closes ``binary``.
    """
    head = binary.peek(2)[:2]
    # A pipe may hand over a single byte first; no text starts with \x1f.
    if head[:1] == b"\x1f" and head[1:2] in (b"\x8b", b""):
        source: io.BufferedIOBase = gzip.GzipFile(fileobj=binary, mode="rb")
    else:
        source = binary
    # utf-8-sig drops a BOM (Excel writes one); newline="" is what the csv
    # module needs, and the other parsers strip line endings themselves.
    return io.TextIOWrapper(cast(Any, source), encoding="utf-8-sig", errors=_ERRORS, newline="")


def _parse(
    lines: Iterable[str],
    name: str,
    fmt: Format | None,
    counter: Iterator[int],
    byte_errors: int,
) -> Iterator[Row]:
    head, rest = _head(_bounded(lines, name), past_comments=fmt is None)
    lineno, first = head[-1] if head else (0, "")
    if head:
        _check_text(first, lineno, name)
    if fmt is None:
        fmt = sniff(first) if head else Format.TEXT
        if fmt is not Format.TEXT:
            _check_no_comment(head, name, fmt)
    lines = _again(head, rest)
    if fmt is Format.TEXT:
        if head:
            _check_not_tabbed(first, lineno, name)
        return parse_text(lines, name, counter, byte_errors)
    if fmt is Format.JSONL:
        return parse_jsonl(lines, name, counter)
    return parse_delimited(lines, name, counter, "\t" if fmt is Format.TSV else ",")


def _bounded(lines: Iterable[str], name: str) -> Iterator[str]:
    """``lines``, none longer than MAX_LINE, none starting with a BOM.

    A file of one endless line (a binary file with no newline in it,
    /dev/zero) was read whole, until memory ran out.  Such a line ends the
    input with a UsageError, as other unreadable input does (what was read
    before it is done)."""
    for line in _lines_of(lines, name):
        if line[:1] == "\ufeff":
            # Files joined with cat, each saved with a BOM (Windows): a BOM
            # mid-file failed its row (bad_url, bad_row) though the row was fine;
            # and a text stdin= was not decoded as utf-8-sig at all.
            line = line.lstrip("\ufeff")
        yield line


def _lines_of(lines: Iterable[str], name: str) -> Iterator[str]:
    readline = getattr(lines, "readline", None)
    if readline is None:  # a text stdin= given as lines: the caller's, as they are
        yield from lines
        return
    for lineno in itertools.count(1):
        line = readline(MAX_LINE)
        if not line:
            return
        if len(line) >= MAX_LINE and line[-1] not in "\r\n":
            raise UsageError(
                f"input {name!r}, line {lineno}: longer than {MAX_LINE >> 20} Mi characters "
                "(not a list of URLs or rows)"
            )
        yield line


# Comment lines looked past for the line a sniffed input is known by, and
# their characters (a comment line may be 16 Mi of them).
_HEAD_COMMENTS: Final = 1000
_HEAD_COMMENT_CHARS: Final = 1 << 20


def _head(lines: Iterator[str], past_comments: bool) -> tuple[list[tuple[int, str]], Iterator[str]]:
    """The non-blank lines up to the first non-blank one (the one that is
    sniffed and checked), each with its line number, and the rest.

    ``past_comments``: up to the first line that is not a ``#`` comment either
    (at most :data:`_HEAD_COMMENTS` of them).  A sniffed input that opened with
    a comment was taken for a plain list whatever came next: a CSV header after
    it became a bad_url row, and every row went out as a URL with ``,path``
    glued on.

    Blank lines are counted, not kept (:func:`_again` gives them back): an
    input opening with a billion of them (a gzip bomb of newlines) held every
    one in memory, 750 MB for 20 MB of ``\r\n``."""
    head: list[tuple[int, str]] = []
    looked = 0  # characters of comments looked past
    for lineno, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        head.append((lineno, line))
        comment = past_comments and text[0] == "#"
        if not comment or len(head) > _HEAD_COMMENTS or looked > _HEAD_COMMENT_CHARS:
            break
        looked += len(line)
    return head, lines


def _again(head: list[tuple[int, str]], rest: Iterator[str]) -> Iterator[str]:
    """The lines :func:`_head` took, then the rest: each blank one it counted
    as an empty line (what it holds is nothing to a parser; that it is a line
    is, for the line numbers)."""
    number = 0
    for lineno, line in head:
        while number < lineno - 1:
            number += 1
            yield "\n"
        number = lineno
        yield line
    yield from rest


def _check_no_comment(head: list[tuple[int, str]], name: str, fmt: Format) -> None:
    """A table or JSONL input sniffed past a comment: refused, saying where.
    Comments are a plain list's alone (a CSV's ``#`` line is a row)."""
    for lineno, line in head:
        if line.strip()[:1] == "#":
            kind = "JSON Lines" if fmt is Format.JSONL else f"a {fmt.name} list"
            raise UsageError(
                f"input {name!r}, line {lineno}: a '#' comment, but the input is {kind} "
                f"(line {head[-1][0]}), and only a plain list of URLs may have comments: "
                "remove the comment lines"
            )


def _check_text(line: str, lineno: int, name: str) -> None:
    """The first non-blank line must be text: if it is not, the input is not."""
    if is_text(line) and "\x00" not in line and not _archive(line):
        return
    if _eight_bit_text(line):
        return  # a text line with a Latin-1 letter: that row fails alone, as later ones do
    try:
        raw = line.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that was not a byte: a text stdin=
        raw = b""
    hint = next((text for magic, text in _NOT_TEXT_HINTS if raw.startswith(magic)), _NOT_TEXT_HINT)
    if hint == _NOT_TEXT_HINT and _utf16_without_bom(raw):
        hint = "it looks like UTF-16 text without a byte order mark: save it as UTF-8"
    if not is_text(line):
        problem = f"not valid UTF-8 ({why_not_text(line)})"
    elif "\x00" in line:
        column = line.index("\x00") + 1
        problem = f"not text (a NUL byte at column {column})"
    else:
        problem = "not text (an archive's first bytes)"
    raise UsageError(f"input {name!r}, line {lineno}: {problem}; {hint}")


def _utf16_without_bom(raw: bytes) -> bool:
    """Do ``raw``'s first characters have every other byte NUL (``h\\0t\\0``
    or ``\\0h\\0t``), as ASCII text in UTF-16 has?  Such a file said only "a NUL
    byte at column 2"."""
    if len(raw) < 4:
        return False
    little = raw[1] == 0 == raw[3] and raw[0] != 0 and raw[2] != 0
    big = raw[0] == 0 == raw[2] and raw[1] != 0 and raw[3] != 0
    return little or big


def _check_not_tabbed(line: str, lineno: int, name: str) -> None:
    """A plain list whose first line is a URL and other columns split by tabs is
    a TSV without its header line: CC12M's ``url<TAB>caption``, Conceptual
    Captions' ``caption<TAB>url``.  Each row would fail as a URL with a tab in
    it (millions of ``bad_url``), so the input is refused at once, saying what
    it needs."""
    cells = line.strip().split("\t")
    if len(cells) < 2 or not any("://" in cell for cell in cells):
        return
    where = "after" if "://" in cells[0] else "before"
    header = header_for(cells, "\t")
    raise UsageError(
        f"input {name!r}, line {lineno}: a tab {where} the URL: a TSV list without its "
        f"header line? Add one naming the columns, such as {header} "
        "(a plain list has one URL a line)"
    )


# The code points surrogateescape reads the bytes 0x80-0xff that are not UTF-8
# as (chr(): mypyc takes no surrogate in a string literal).
_ESCAPED_FIRST: Final = chr(0xDC80)
_ESCAPED_LAST: Final = chr(0xDCFF)
_ESCAPED_LATIN1_LETTERS: Final = chr(0xDCC0)  # the byte 0xc0, where Latin-1's letters start


def _eight_bit_text(line: str) -> bool:
    """Is ``line`` text with a few bytes that are not UTF-8 (Latin-1 letters),
    rather than binary: at most one such byte in four, never three side by side
    (``informação`` has two),
    no NUL or other control but tab, no magic of a known binary format, and a
    first byte that is printable ASCII or a Latin-1 letter (``\xc9tiquette``)?
    A URL list with such a letter on its first line was refused whole, though
    the same line further down fails alone (``bad_row``)."""
    escaped = sum(1 for char in line if _is_escaped(char))
    if not escaped or escaped * 4 > len(line) or not _text_start(line[:1]):
        return False
    run = 0
    for char in line:
        run = run + 1 if _is_escaped(char) else 0
        if run == 3:
            return False  # JPEG's \xff\xd8\xff: no Latin-1 word has three in a row
    if _archive(line):
        return False
    raw = line.encode("utf-8", "surrogateescape")
    if any(raw.startswith(magic) for magic, _ in _NOT_TEXT_HINTS):
        return False
    return all(char == "\t" or (char >= " " and char != "\x7f") for char in line.rstrip("\r\n"))


def _is_escaped(char: str) -> bool:
    return _ESCAPED_FIRST <= char <= _ESCAPED_LAST


def _text_start(char: str) -> bool:
    """Printable ASCII, or a byte that is a Latin-1 letter (0xc0-0xff); binary
    formats' magic starts with other high bytes (PNG's \x89)."""
    return " " <= char < "\x7f" or _ESCAPED_LATIN1_LETTERS <= char <= _ESCAPED_LAST


def _archive(line: str) -> bool:
    """Does ``line`` begin a bzip2 stream or a zip archive?  Their first line can be
    valid UTF-8 (in about one bzip2 file in a hundred the block's CRC holds a line
    break), and was then read as a list of garbage URLs."""
    return (
        (line.startswith("BZh") and line[3:4].isdigit() and line[4:10] == "1AY&SY")
        or line.startswith("PK\x03\x04")
        or line.startswith("PAR1")  # Parquet, from a pipe (a file is read as one)
    )


def _unreadable(name: str, exc: BaseException) -> UsageError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    hint = ""
    if isinstance(exc, FileNotFoundError):
        hint = missing_path_hint(name)
    elif isinstance(exc, IsADirectoryError):
        hint = directory_hint(name)
    return UsageError(
        f"cannot read input {hide_password(name)!r}: {reason or type(exc).__name__}{hint}"
    )


_PATTERN_CHARACTERS: Final = frozenset("*?[")


def missing_path_hint(path: str) -> str:
    """Why a source that is not there may have been meant otherwise: a URL
    without its scheme, or a pattern (``'data/*.parquet'``) no shell expanded."""
    if _PATTERN_CHARACTERS.intersection(path):
        return (
            " (swarmget does not expand patterns: leave it unquoted for the shell to "
            "expand; in Python, sorted(glob.glob(pattern)))"
        )
    return " (a URL needs http:// or https://)"


def directory_hint(path: str) -> str:
    """What to give instead of a directory: its list files, by a pattern the
    shell expands (a Hugging Face dataset's ``data/train-00000-of-00004.parquet``
    shards).  A directory is not read as its files: which of them are the
    list (a README, a .json of metadata beside the shards?) is the user's call."""
    found = _lists_under(path, depth=2)
    if found is None:
        return " (give the list files in it as sources)"
    shown = hide_password(found)
    return (
        f" (give the list files in it as sources: {shown} unquoted, for the shell to expand;"
        f" in Python, sorted(glob.glob({shown!r})))"
    )


# Entries looked at in one directory, for directory_hint: a directory of
# a million downloaded images must not cost a scan of it.
_HINT_ENTRIES: Final = 1000


def _lists_under(directory: str, depth: int) -> str | None:
    """``<dir>/*<suffix>`` for the first directory at most ``depth`` levels down
    holding files of a list format (by name), or None."""
    try:
        with os.scandir(directory) as scan:
            entries = sorted(itertools.islice(scan, _HINT_ENTRIES), key=lambda e: e.name)
    except OSError:
        return None
    for entry in entries:
        fmt = format_from_name(entry.name)
        if fmt is not None and entry.is_file():
            stem, suffix = os.path.splitext(entry.name)
            if suffix.lower() == ".gz":
                suffix = os.path.splitext(stem)[1] + suffix
            return os.path.join(directory, "*" + suffix)
    if depth > 1:
        for entry in entries:
            if entry.is_dir() and not entry.name.startswith("."):
                found = _lists_under(entry.path, depth - 1)
                if found is not None:
                    return found
    return None
