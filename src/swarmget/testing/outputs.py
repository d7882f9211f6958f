"""Where a run keeps its temporary state, for tests that look at it."""

from __future__ import annotations

import os
from pathlib import Path

from swarmget.sinks.files import part_path
from swarmget.sinks.plan import row_key


def part_for(
    out: str | os.PathLike[str], url: str, path: str | None = None, occurrence: int = 0
) -> Path:
    """The part file of the row with this URL (and ``path`` column), as a Path."""
    root = os.path.realpath(os.fspath(out))
    return Path(part_path(root, row_key(url, path, occurrence)))


def parts(out: str | os.PathLike[str]) -> list[Path]:
    """Every part in the output dir (none after a clean run)."""
    folder = Path(out) / ".swarmget" / "parts"
    return sorted(folder.iterdir()) if folder.is_dir() else []
