from __future__ import annotations

import dataclasses
from typing import Final

# What is trimmed from both ends of a URL: the C0 controls and the space, as the
# WHATWG URL parser trims (curl trims nothing).  Not str.strip()'s whitespace:
# a no-break space or an ideographic space at the end is part of the name
# (``/file%C2%A0``), and trimming it requested another file.
URL_SPACE: Final = "".join(map(chr, range(0x21)))


def strip_url(text: str) -> str:
    """``text`` without the C0 controls and spaces at its ends (see URL_SPACE)."""
    return text.strip(URL_SPACE)


def hide_password(source: str) -> str:
    """``user:pass@host/x`` (a URL without its scheme: a row, or a source read
    as a path) as ``user:***@host/x``: no message or record may show a
    password.  Everything from the first ``:`` to the last ``@`` goes, as a
    password may hold ``/`` or ``@`` itself."""
    at = source.rfind("@")
    colon = source.find(":", 0, at) if at > 0 else -1
    if colon < 0:
        return source
    return source[: colon + 1] + "***" + source[at:]


# The longest URL swarmget sends (engine/urls.py): nginx and Apache answer 414
# past 8 KB of request line, so a longer one is no URL of a file anyone serves.
# The reader refuses longer ones as it reads them (sources/fields.py), and so
# longer paths: carried on, a list of 15 MB URLs held 4.5 GB in the driver.
MAX_URL: Final = 1 << 16


# init=False and an __init__ of our own: mypyc compiles a hand-written
# __init__, while the one dataclasses generates runs as interpreted Python,
# and a Row is made per input line: on a plain list that was half the time.
@dataclasses.dataclass(slots=True, init=False)
class Row:
    """One input row.  ``index`` is its 0-based position across all sources.

    ``problem`` is set on a row the input could not be read as (bad quoting,
    broken JSON, an invalid column, text that is not UTF-8): it is the message
    naming the input and line, and the row fails with ``bad_row`` without being
    downloaded.  ``url`` is then the row's URL if one could be read, else the
    line itself (stripped, at most 200 characters), so the manifest shows
    which row it was.
    """

    index: int
    url: str
    path: str | None = None  # explicit output path (relative to the output dir)
    sha256: str | None = None
    md5: str | None = None
    size: int | None = None
    problem: str | None = None  # why the row is malformed; None for a good row

    def __init__(
        self,
        index: int,
        url: str,
        path: str | None = None,
        sha256: str | None = None,
        md5: str | None = None,
        size: int | None = None,
        problem: str | None = None,
    ) -> None:
        self.index = index
        self.url = url
        self.path = path
        self.sha256 = sha256
        self.md5 = md5
        self.size = size
        self.problem = problem

    def as_tuple(self) -> RowTuple:
        """The fields in order: how rows cross a process pipe (a tuple pickles
        about eight times faster than the dataclass)."""
        return (self.index, self.url, self.path, self.sha256, self.md5, self.size, self.problem)


RowTuple = tuple[int, str, str | None, str | None, str | None, int | None, str | None]
