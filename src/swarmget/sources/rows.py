from __future__ import annotations

import dataclasses


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
