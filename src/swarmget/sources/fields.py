"""Checking the columns of one input row and turning them into a :class:`Row`.

CSV cells arrive as strings and JSONL values as whatever JSON holds, so one
function, :func:`build_row`, takes a mapping of column name to raw value and
applies the same rules to both:

* ``url`` must be present and non-empty.  It is *not* checked further: a
  syntactically bad URL (``ftp://x``, ``not a url``) is one row that fails with
  ``bad_url`` later, not a reason to stop a run of millions.
* ``path``, ``sha256``, ``md5`` and ``size`` are optional; an empty string or
  JSON ``null`` means absent, because spreadsheets and ``jq`` emit those for
  "no value".
* digests are lower-cased and must be hex of the right length; ``size`` is a
  non-negative integer (a JSON number or a string of ASCII digits).

Problems raise :class:`FieldError` with a message that says *what* is wrong;
the caller knows *where* (file and line) and adds that.
"""

from __future__ import annotations

from collections.abc import Mapping

from swarmget.sources.rows import Row

COLUMNS = ("url", "path", "sha256", "md5", "size")

_HEX = frozenset("0123456789abcdef")
_DIGITS = frozenset("0123456789")
_DIGEST_LENGTHS = {"sha256": 64, "md5": 32}


class FieldError(ValueError):
    """A column value is unusable; the message names the column."""


def build_row(index: int, fields: Mapping[str, object]) -> Row:
    """Validate the known columns in ``fields`` (other keys are ignored)."""
    url = fields.get("url")
    if not isinstance(url, str) and url is not None:
        raise FieldError(f"'url' must be a string, got {_json_type(url)}")
    url = url.strip() if url else ""
    if not url:
        raise FieldError("missing or empty 'url' field")
    return Row(
        index,
        url,
        path=_optional_text(fields.get("path"), "path"),
        sha256=_digest(fields.get("sha256"), "sha256"),
        md5=_digest(fields.get("md5"), "md5"),
        size=_size(fields.get("size")),
    )


def _optional_text(value: object, column: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise FieldError(f"{column!r} must be a string, got {_json_type(value)}")
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
    # bool is an int subclass; `"size": true` is a mistake, not a size of 1.
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise FieldError(f"'size' must be >= 0, got {value}")
        return value
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        # int() alone would also take "1_000", "+5" and non-ASCII digits.
        if _DIGITS.issuperset(text):
            try:
                return int(text)
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
