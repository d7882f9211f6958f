"""Checking the columns of one input row and turning them into a :class:`Row`.

CSV cells arrive as strings and JSONL values as whatever JSON holds, so one
function, :func:`build_row`, takes a mapping of column name to raw value and
applies the same rules to both:

* ``url`` must be present and non-empty.  It is *not* checked as a URL: a
  syntactically bad URL (``ftp://x``, ``not a url``) is one row that fails with
  ``bad_url`` later, not a reason to stop a run of millions.  Only one longer
  than :data:`~swarmget.sources.rows.MAX_URL` (or a ``path`` that long) fails
  here: no server takes it, and carried on whole it cost its size several
  times over in memory.
* ``path``, ``sha256``, ``md5`` and ``size`` are optional; an empty string or
  JSON ``null`` means absent, because spreadsheets and ``jq`` emit those for
  "no value".
* digests are lower-cased and must be hex of the right length; ``size`` is a
  non-negative integer (a JSON number or a string of ASCII digits; a whole
  float, ``12.0`` or ``"12.0"``, as pandas writes a column with gaps, is 12).
* ``url`` and ``path`` must be valid text.  Inputs are decoded with
  ``surrogateescape``, so bytes that are not UTF-8 arrive as lone surrogates
  (and JSON can spell one, ``"\\ud800"``); such a value can be neither
  requested nor written to the manifest.  Columns swarmget does not read are
  not looked at, whatever their bytes.

Problems raise :class:`FieldError` with a message that says *what* is wrong;
the caller knows *where* (file and line) and adds that.  :func:`is_text`,
:func:`printable` and :func:`why_not_text` are the helpers the parsers use
for text that is not valid.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Final

from swarmget.sources.rows import MAX_URL, Row, strip_url

COLUMNS = ("url", "path", "sha256", "md5", "size")

_HEX = frozenset("0123456789abcdef")
_DIGITS = frozenset("0123456789")
_WHOLE_FLOAT: Final = re.compile(r"(?<=[0-9])\.0+\Z")
_DIGEST_LENGTHS = {"sha256": 64, "md5": 32}


class FieldError(ValueError):
    """A column value is unusable; the message names the column."""


def build_row(index: int, fields: Mapping[str, object]) -> Row:
    """Validate the known columns in ``fields`` (other keys are ignored)."""
    url = fields.get("url")
    if not isinstance(url, str) and url is not None:
        raise FieldError(f"'url' must be a string, got {_json_type(url)}")
    url = strip_url(url) if url else ""
    if not url:
        raise FieldError("missing or empty 'url' field")
    if not is_text(url):
        raise FieldError(_not_text("url", url))
    if len(url) > MAX_URL:
        raise FieldError(too_long("url", url))
    return Row(
        index,
        url,
        path=_optional_text(fields.get("path"), "path"),
        sha256=_digest(fields.get("sha256"), "sha256"),
        md5=_digest(fields.get("md5"), "md5"),
        size=_size(fields.get("size")),
    )


def usable_url(fields: Mapping[str, object]) -> str | None:
    """The row's URL if :func:`build_row` would accept it, else None.

    A row rejected for another column still names its URL in the manifest.
    """
    url = fields.get("url")
    if isinstance(url, str):
        url = strip_url(url)
        if url and is_text(url) and len(url) <= MAX_URL:
            return url
    return None


def is_text(text: str) -> bool:
    """True unless ``text`` holds lone surrogates (bytes that were not UTF-8)."""
    if text.isascii():  # O(1): CPython knows it from the string's kind
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def too_long(column: str, value: str) -> str:
    """What is wrong with a url or path longer than :data:`MAX_URL`: no server
    takes such a URL, no file system such a path (PATH_MAX is 4096 bytes)."""
    shown = printable(_clip(value))
    return f"{column!r} is {len(value):,} characters long (at most {MAX_URL:,}): '{shown}'"


def why_not_text(text: str) -> str:
    """Where :func:`is_text` fails: ``"byte 0xe9 at column 13"``."""
    for column, char in enumerate(text, 1):
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for one byte
            return f"byte 0x{code - 0xDC00:02x} at column {column}"
        if 0xD800 <= code <= 0xDFFF:  # from JSON's "\ud800", say
            return f"lone surrogate U+{code:04X} at column {column}"
    return "no invalid character"


def printable(text: str) -> str:
    """``text`` with undecodable bytes shown as ``\\xff`` (and lone surrogates
    as ``\\ud800``), so that it can be written as UTF-8: to the manifest, to a
    terminal."""
    if is_text(text):
        return text
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _not_text(column: str, value: str) -> str:
    # Quoted by hand: repr() would double the backslashes printable() adds.
    return f"{column!r} is not valid UTF-8: '{printable(_clip(value))}'"


def _optional_text(value: object, column: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise FieldError(f"{column!r} must be a string, got {_json_type(value)}")
    if not is_text(value):
        raise FieldError(_not_text(column, value))
    if len(value) > MAX_URL:
        raise FieldError(too_long(column, value))
    # Surrounding blanks are almost always an artefact of ", " separators or
    # hand-edited files; a file name that really starts with a space is not
    # worth the confusion.
    return value.strip() or None


def _digest(value: object, column: str) -> str | None:
    text = _optional_text(value, column)
    if text is None:
        return None
    digest = text.lower()
    want = _DIGEST_LENGTHS[column]
    if len(digest) != want or not _HEX.issuperset(digest):
        raise FieldError(f"{column!r} must be {want} hex digits, got {_clip(text)!r}")
    return digest


def _size(value: object) -> int | None:
    # pandas writes an integer column with gaps as floats: 12.0 in JSON and
    # "12.0" in a CSV (a gap as null, or an empty cell), as it does in Parquet.
    # Every row of such a list failed for its size, which was meant as 12.
    if isinstance(value, float) and (math.isnan(value) or value.is_integer()):
        value = None if math.isnan(value) else int(value)
    # bool is an int subclass; `"size": true` is a mistake, not a size of 1.
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise FieldError(f"'size' must be >= 0, got {value}")
        return value
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        digits = _WHOLE_FLOAT.sub("", text) if "." in text else text  # "12.0": pandas' floats
        # int() alone would also take "1_000", "+5" and non-ASCII digits.
        if digits and _DIGITS.issuperset(digits):
            try:
                return int(digits)
            except ValueError:  # more digits than int() agrees to parse
                pass
        raise FieldError(f"'size' must be a whole number of bytes, got {_clip(text)!r}")
    if value is None:
        return None
    raise FieldError(f"'size' must be a whole number of bytes, got {_json_type(value)}")


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if isinstance(value, float):
        return f"the number {value!r}"
    return names.get(type(value), type(value).__name__)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
