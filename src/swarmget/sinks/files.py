"""Files on disk: written as ``NAME.part``, renamed into place only when complete.

A file at its final name is therefore always whole: a crash, a kill or a failed
transfer leaves at most a ``.part`` next to it.  Parts are opened with
``O_NOFOLLOW`` so a symlink planted at the part's name is never followed, and
parent directories are created once and checked to resolve inside the output
directory, so no row can write outside it.
"""

from __future__ import annotations

import contextlib
import errno
import os

from swarmget.errors import ErrorCode, TransferError

PART_SUFFIX = ".part"
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
# Errors that will hit every other file too: the run should stop, not grind on.
FATAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


class OutputError(TransferError):
    """Writing an output file failed; ``fatal`` when no other file can succeed either."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(ErrorCode.IO, message)
        self.fatal = fatal

    def __reduce__(self) -> tuple[type[OutputError], tuple[str, bool]]:
        return (OutputError, (self.message, self.fatal))


def _io_error(action: str, path: str, exc: OSError) -> OutputError:
    return OutputError(f"cannot {action} {path}: {exc.strerror}", exc.errno in FATAL_ERRNOS)


class PartFile:
    """One output file being written.  ``write`` takes memoryviews without copying."""

    __slots__ = ("fd", "final", "part", "written")

    def __init__(self, final: str) -> None:
        self.final = final
        self.part = final + PART_SUFFIX
        self.written = 0
        try:
            self.fd = os.open(self.part, _OPEN_FLAGS, 0o644)
        except OSError as exc:
            self.fd = -1
            raise _io_error("create", self.part, exc) from None

    def write(self, data: memoryview | bytes) -> None:
        size = len(data)
        try:
            n = os.write(self.fd, data)
            while n < len(data):  # rare: a short write on a regular file
                data = memoryview(data)[n:]
                n = os.write(self.fd, data)
        except OSError as exc:
            raise _io_error("write", self.part, exc) from None
        self.written += size

    def commit(self) -> None:
        """Close and rename into place."""
        fd, self.fd = self.fd, -1
        try:
            os.close(fd)
            os.rename(self.part, self.final)
        except OSError as exc:
            raise _io_error("finish", self.final, exc) from None

    def abort(self, keep: bool = False) -> None:
        """Close; remove the part unless ``keep`` (for resuming later)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)
        if not keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.part)


class OutputDir:
    """The output directory: maps relative output paths to absolute ones safely."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.realpath(os.fspath(root))
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise _io_error("create output directory", self.root, exc) from None
        self._dirs: set[str] = {self.root}

    def final_path(self, rel: str) -> str:
        """Absolute final path for a confined relative path; creates parent dirs."""
        path = f"{self.root}/{rel}"
        parent = path.rpartition("/")[0]
        if parent not in self._dirs:
            self._make_parent(parent)
        return path

    def _make_parent(self, parent: str) -> None:
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise _io_error("create directory", parent, exc) from None
        # A directory (or a symlink) that already existed could point elsewhere.
        real = os.path.realpath(parent)
        if real != self.root and not real.startswith(self.root + "/"):
            raise TransferError(ErrorCode.BAD_PATH, f"{parent} resolves outside the output dir")
        self._dirs.add(parent)
