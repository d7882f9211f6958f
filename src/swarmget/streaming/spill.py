"""The stream's spill folder: made for one stream, removed when it closes, and
swept by a later stream if its owner died without closing it.

Bodies beyond the stream's memory budget go to files in a folder of the
stream's own (``swarmget-stream-*`` in the temporary directory, or under the
caller's ``spill_dir``).  ``close()`` and the exit hook remove it, but a
process killed outright (the OOM killer, SIGKILL) runs neither, and its spilled
bodies, gigabytes perhaps, would stay in ``/tmp`` for good.

So the owner holds an exclusive ``flock`` on a file in the folder
(:data:`OWNER`) for the stream's life.  The kernel drops the lock when the last
descriptor to it closes, which a killed process's exit does.  Each new stream
sweeps the folders beside its own: one with an owner file that nobody holds
is abandoned, and removed.  Process IDs would not do: they are reused, and
another PID namespace sharing the temporary directory (containers) sees other
numbers.  Folders without an owner file (another version's, anyone's) are
never touched, and nor is one younger than :data:`SWEEP_AFTER` (its maker may
not have taken the lock yet).

A folder may carry a *group* in its name (``swarmget-stream-<group>-*``):
:mod:`swarmget.torch` gives every loader worker of a dataset the same one, so
that the process that made the dataset can remove them at its exit
(:func:`sweep_group`).  It must: at the interpreter's exit multiprocessing
ends daemonic children, the loader workers, with SIGTERM, which runs no
clean-up of theirs, and their folders waited a minute for the next stream.

A spilled item the caller holds keeps its file (and so the folder, and its
lock) past the stream's close, until the item is dropped or closed:
``items = list(swarmget.stream(urls))`` drops the stream at once, and every
spilled item's ``read()`` failed.  :meth:`SpillDir.adopt` ties a file to its
item; :meth:`SpillDir.close` removes every other file at once, and the folder
goes with the last adopted item.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import threading
import time
from typing import Any, Final

from swarmget.errors import UsageError
from swarmget.streaming.items import remove_spill_file

PREFIX: Final = "swarmget-stream-"
OWNER: Final = ".owner"  # the file whose lock says the folder's stream is alive
SWEEP_AFTER: Final = 60.0  # seconds: a folder younger than this may be in the making


class SpillDir:
    """``SpillDir(parent, group)``: a new spill folder under ``parent`` (the
    temporary directory when None; made if missing and then left, as the
    caller's), ``group`` in its name if given, its owner lock taken.  ``path``
    is the folder; ``adopt()`` ties a file to the item that holds it,
    ``close()`` removes the rest, ``remove()`` all."""

    def __init__(self, parent: str | None, group: str = "") -> None:
        try:
            if parent is not None:
                os.makedirs(parent, exist_ok=True)
            self.path = tempfile.mkdtemp(prefix=_prefix(group), dir=parent)
        except OSError as exc:  # a file there, no permission
            raise UsageError(f"spill_dir {parent!r}: cannot make a folder there: {exc}") from None
        self._owner = _take_owner_lock(self.path)
        self._pid = os.getpid()  # a forked copy removes nothing (remove_spill_file)
        # adopt/dropped come from any thread, and dropped from the collector too,
        # which may run it on a thread that holds the lock already (in close()).
        self._lock = threading.RLock()
        self._kept: set[str] = set()  # files of items that are still around
        self._closed = False
        sweep_abandoned(os.path.dirname(self.path))

    def adopt(self, item: Any, path: str) -> None:
        """``path`` is ``item``'s file from now on: removed when the item is dropped
        or closed, not when the stream closes before that."""
        with self._lock:
            if self._closed:
                # Made after the close (a run's last moments): nobody will read it.
                remove_spill_file(path, self._pid)
                return
            self._kept.add(path)
        # The finaliser holds this SpillDir: the folder and its lock last as
        # long as any item that has a file in it.
        item.remove_file_with(self.dropped, path)

    def dropped(self, path: str) -> None:
        """An adopted item was dropped or closed: its file goes (the folder too,
        after the stream's close, with the last such file)."""
        if os.getpid() != self._pid:
            return
        remove_spill_file(path, self._pid)
        with self._lock:
            self._kept.discard(path)
            last = self._closed and not self._kept
        if last:
            self.remove()

    def close(self) -> None:
        """The stream has closed: remove every file no item holds (those of items
        never handed out, half-written bodies), and the folder if no item holds
        one.  Safe to repeat."""
        with self._lock:
            self._closed = True
            kept = set(self._kept)
        if not kept:
            self.remove()
            return
        with contextlib.suppress(OSError), os.scandir(self.path) as entries:
            for entry in entries:
                if entry.name != OWNER and entry.path not in kept:
                    remove_spill_file(entry.path, self._pid)

    def remove(self) -> None:
        """Delete the folder and what is in it (safe to repeat)."""
        if os.getpid() != self._pid:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        with self._lock:
            owner, self._owner = self._owner, None
        if owner is not None:
            os.close(owner)


def _take_owner_lock(path: str) -> int | None:
    """The descriptor holding the folder's owner lock (None where the file
    system has no locks: the folder is then never swept, as before)."""
    fd = os.open(os.path.join(path, OWNER), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(path, OWNER))
        return None
    return fd


def _prefix(group: str) -> str:
    return f"{PREFIX}{group}-" if group else PREFIX


def sweep_abandoned(parent: str) -> None:
    """Remove the spill folders under ``parent`` whose stream has died (best
    effort: a folder that cannot be read or locked is left)."""
    _sweep(parent, PREFIX, SWEEP_AFTER)


def sweep_group(parent: str, group: str) -> None:
    """Remove ``group``'s spill folders under ``parent`` whose stream has died,
    however young: the caller knows that every process that makes them has
    ended (and a live one holds its folder's lock)."""
    _sweep(parent, _prefix(group), 0.0)


def _sweep(parent: str, prefix: str, min_age: float) -> None:
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            if entry.name.startswith(prefix):
                with contextlib.suppress(OSError):
                    _remove_if_abandoned(entry, now, min_age)


def _remove_if_abandoned(entry: os.DirEntry[str], now: float, min_age: float) -> None:
    info = entry.stat(follow_symlinks=False)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return
    if now - info.st_mtime < min_age:
        return
    fd = os.open(os.path.join(entry.path, OWNER), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its owner lives
        shutil.rmtree(entry.path, ignore_errors=True)
    finally:
        os.close(fd)
