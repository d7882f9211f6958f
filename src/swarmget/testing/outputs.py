"""Where a run keeps its temporary state, for tests that look at it."""

from __future__ import annotations

import contextlib
import os
import unittest
from collections.abc import Iterator
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


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` (``"1m"``, ``"64k"``; None: tmpfs's default) mounted at
    ``path`` for the ``with`` block: a full (or read-only) disk on demand.  Where
    mounting is not allowed (not root), the test is skipped (unittest.SkipTest,
    which pytest honours)."""
    path.mkdir()
    option = f"-o size={size} " if size else ""
    if os.geteuid() != 0 or os.system(f"mount -t tmpfs {option}tmpfs {path} 2>/dev/null"):
        raise unittest.SkipTest(f"needs root to mount a tmpfs ({size or 'any size'})")
    try:
        yield path
    finally:
        os.system(f"umount -l {path}")  # lazily: a test's open files must not keep it
