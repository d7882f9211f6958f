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
from typing import Protocol

from swarmget.errors import ErrorCode, TransferError

PART_SUFFIX = ".part"
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
# Errors that will hit every other file too: the run should stop, not grind on.
FATAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


class Hasher(Protocol):
    def update(self, data: memoryview | bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


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
    """One output file being written.  ``write`` takes memoryviews without copying.

    ``resume_from`` continues an existing ``.part`` of exactly that size (the
    bytes already there are fed to the hashers first); otherwise the part is
    created or truncated.  ``hashers`` (name -> hashlib object) see every byte,
    so checksums are verified while streaming, not by reading the file again.
    """

    __slots__ = ("fd", "final", "hashers", "part", "written")

    def __init__(
        self,
        final: str,
        *,
        resume_from: int = 0,
        hashers: dict[str, Hasher] | None = None,
    ) -> None:
        self.final = final
        self.part = final + PART_SUFFIX
        self.hashers = hashers
        self.written = 0
        self.fd = -1
        try:
            if resume_from:
                self.fd = os.open(self.part, _APPEND_FLAGS)
                if os.fstat(self.fd).st_size != resume_from:
                    raise OutputError(f"{self.part} changed size while resuming")
                if hashers:
                    self._hash_existing()
                self.written = resume_from
            else:
                self.fd = os.open(self.part, _OPEN_FLAGS, 0o644)
        except OSError as exc:
            self._close_fd()
            raise _io_error("create", self.part, exc) from None
        except OutputError:
            self._close_fd()
            raise

    def _hash_existing(self) -> None:
        assert self.hashers
        with open(self.part, "rb") as existing:
            while chunk := existing.read(1 << 20):
                for hasher in self.hashers.values():
                    hasher.update(chunk)

    def write(self, data: memoryview | bytes) -> None:
        size = len(data)
        try:
            n = os.write(self.fd, data)
            while n < len(data):  # rare: a short write on a regular file
                data = memoryview(data)[n:]
                n = os.write(self.fd, data)
        except OSError as exc:
            raise _io_error("write", self.part, exc) from None
        if self.hashers is not None:
            for hasher in self.hashers.values():
                hasher.update(data)
        self.written += size

    def digests(self) -> dict[str, str]:
        return {name: h.hexdigest() for name, h in (self.hashers or {}).items()}

    def verify(self, size: int | None, expected: dict[str, str]) -> None:
        """Raise ``size_mismatch`` / ``checksum`` when the content is not what the row says."""
        if size is not None and self.written != size:
            raise TransferError(
                ErrorCode.SIZE_MISMATCH, f"got {self.written} bytes, the input says {size}"
            )
        actual = self.digests()
        for name, want in expected.items():
            if actual.get(name) != want:
                raise TransferError(
                    ErrorCode.CHECKSUM, f"{name} is {actual.get(name)}, the input says {want}"
                )

    def commit(self) -> None:
        """Close and rename into place."""
        self.close()
        self.publish()

    def close(self) -> None:
        """Close the descriptor (the part stays; :meth:`publish` or :meth:`abort` follows)."""
        fd, self.fd = self.fd, -1
        try:
            os.close(fd)
        except OSError as exc:
            raise _io_error("finish", self.part, exc) from None

    def publish(self) -> None:
        """Rename the closed part to its final name."""
        try:
            os.rename(self.part, self.final)
        except OSError as exc:
            raise _io_error("finish", self.final, exc) from None

    def abort(self, keep: bool = False) -> None:
        """Close; remove the part unless ``keep`` (for resuming later)."""
        self._close_fd()
        if not keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.part)

    def _close_fd(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


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
