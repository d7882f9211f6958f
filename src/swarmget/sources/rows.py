from __future__ import annotations

import dataclasses


@dataclasses.dataclass(slots=True)
class Row:
    """One input row.  ``index`` is its 0-based position across all sources."""

    index: int
    url: str
    path: str | None = None  # explicit output path (relative to the output dir)
    sha256: str | None = None
    md5: str | None = None
    size: int | None = None
