"""Spare room on the output disk, kept for the journal's last commit.

A full disk stops a run (sinks/files.py), and the rows that finished since the
journal's last commit must still be written, or the rerun fetches them all
again.  SQLite rolls a transaction back when its commit meets a full disk, so
by the time we learn of it the rows are gone from the journal, and the space
to write them again is what the downloads just used up.  So the journal keeps
some space aside for the length of a run: a file of :data:`RESERVE_BYTES`
(less on a small disk) in ``.swarmget``, allocated when the run starts,
removed when the journal needs its room (or the run ends).  The same trick as
a database's "ballast file".

Best effort throughout: a disk too full for a reserve, or a file system that
cannot allocate one, runs without it, as before.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

RESERVE_NAME: Final = "reserve"
# What a commit writes beyond the room the WAL file already has (its frames
# are overwritten from the start after each checkpoint, every 4 MiB): up to
# the dirty pages of the page cache.  At most a share of what is free (the
# room goes back to the disk when the run ends; on a small disk the WAL file
# is small too, and the whole transaction needs room).  On tmpfs, allocating
# and freeing costs ~0.4 ms per MiB.
RESERVE_BYTES: Final = 4 << 20
_SHARE_OF_FREE: Final = 4
_SMALLEST: Final = 64 << 10
_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


class Reserve:
    """The spare room of one output disk (see the module docstring)."""

    def __init__(self, state: str) -> None:
        self.path = os.path.join(state, RESERVE_NAME)
        self.size = 0
        self.free()  # one a killed run left: its room counts as free below
        with contextlib.suppress(OSError):
            disk = os.statvfs(state)
            size = min(RESERVE_BYTES, disk.f_bavail * disk.f_frsize // _SHARE_OF_FREE)
            if size >= _SMALLEST:
                self._allocate(size)

    def _allocate(self, size: int) -> None:
        fd = os.open(self.path, _FLAGS, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # the blocks themselves, not a sparse file
            self.size = size
        except OSError:
            self.free()
        finally:
            os.close(fd)

    def free(self) -> bool:
        """Give the room back to the disk; False if there was none to give."""
        had = self.size > 0
        self.size = 0
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        return had
