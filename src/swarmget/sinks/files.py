"""Files on disk: each body is written to a part, renamed into place only when complete.

Theory of operation
-------------------
A file at its final name is always whole: a crash, a kill or a failed transfer
leaves at most a part, and parts live where no output name can reach:
``<out>/.swarmget/parts/<key>``, named by the row's identity (``sinks/plan.py``).
So a list that holds both ``x`` and ``x.part``, or a user's own ``data.part``
in the output dir, can never be mixed up with our temporary files, we never
delete a file we did not create, and the next run finds a kept part by the
row's key alone.  ``.swarmget`` is reserved: no planned path may enter it.

A part that may be continued has its version beside it
(``<key>.version``: the ETag or Last-Modified its bytes came with), written
by the worker before the first byte of each whole body.  The journal learns
the validator too, but from the driver, up to a second later: a kill in
between left the journal naming the bytes of the version before (a server
that changed the file, then served the old one again, had its rest spliced
onto them).  A part is continued only when both say the same.

Parts are opened with ``O_NOFOLLOW`` (a symlink planted at the part's name is
never followed), and the parent directories of final paths are created once
and checked to resolve inside the output directory, so no row can write
outside it.  :meth:`FileSink.publish` moves a batch of finished parts into
place; the planner recorded each path before the row was dealt out, so a file
at a planned path is known to be ours whatever moment a crash comes.

Between the check of a directory and the publish of a file into it there is
the whole download: a directory swapped meanwhile for a symlink to elsewhere
must not take the file there.  Each checked directory's identity (device and
inode) is kept, and the publish looks again (one ``stat``) before it moves the
part; a directory that changed is checked anew.

A part is renamed to its final name only if no file is there
(``renameat2(RENAME_NOREPLACE)``, else a link then an unlink), unless
``--overwrite`` (then renamed over whatever is there), so a file
that appeared at the path while the row downloaded (someone else's: the
planner found the path free) fails the row with ``exists``, as a file there
before the run would have, rather than being replaced.  On file systems
without hard links it is a rename after a look.  A final name on another
file system than the parts (a mount point inside the output dir) is reached
by a copy beside it (``.swarmget-<part>``, the row's own name: a kill's
leftover goes when the row is done again), moved into place the same way.

The state directory (``.swarmget``) and what is in it are ours alone: a
symlink there (planted, or left by a tool) would take the journal, the
manifest and the parts elsewhere, so :func:`state_dir` refuses one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Final

from swarmget.errors import ErrorCode, TransferError
from swarmget.sinks.base import Assignment, Hasher, Sink, Writer
from swarmget.sinks.noreplace import rename_noreplace

STATE_DIR: Final = ".swarmget"
PARTS_DIR: Final = "parts"
VERSION_SUFFIX: Final = ".version"  # beside a part: the validator of its bytes
COPY_PREFIX: Final = ".swarmget-"  # a part's copy beside its final name (another file system)
_VERSION_LIMIT: Final = 1 << 20  # more than a response head may hold (protocol/http11.py)
_OPEN_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# The mode every file of ours is created with, less the umask, as curl, wget
# and Python's open() do: 0o644 made the files of a group sharing a dataset
# (umask 002) writable by their owner alone, and a teammate's rerun could not
# write the journal.  (Spill files are private: 0o600.)
FILE_MODE: Final = 0o666
# link() errors of file systems that have no hard links (FAT, some FUSE and SMB).
_NO_LINKS: Final = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK})
# Errors that will hit every other file too: the run should stop, not grind on.
FATAL_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


class OutputError(TransferError):
    """Writing an output file failed; ``fatal`` when no other file can succeed either."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(ErrorCode.IO, message)
        self.fatal = fatal

    def _arguments(self) -> tuple[str, bool]:
        return (self.message, self.fatal)


class OutOfDescriptors(OutputError):
    """No file descriptor was free (EMFILE/ENFILE): a moment's shortage, so the
    row is retried (engine/retry.py), not failed and not fatal."""

    def __init__(self, message: str) -> None:
        super().__init__(message, False)

    def _arguments(self) -> tuple[str]:  # type: ignore[override]
        return (self.message,)


class AppearedMeanwhile(TransferError):
    """A file not ours appeared at a row's path while the row downloaded."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.EXISTS, message)

    def _arguments(self) -> tuple[str]:
        return (self.message,)


def io_error(action: str, path: str, exc: OSError, elsewhere: bool = False) -> OutputError:
    """``elsewhere``: ``path`` is on another file system than the output dir (a
    mount inside it): that one being full or read-only stops no other row."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return OutOfDescriptors(f"cannot {action} {path}: {exc.strerror}")
    fatal = exc.errno in FATAL_ERRNOS and not elsewhere
    return OutputError(f"cannot {action} {path}: {exc.strerror}{_why(exc)}", fatal)


def _why(exc: OSError) -> str:
    """What a bare strerror leaves to guess.  EFBIG's "File too large" read as a
    limit of swarmget's (Python ignores SIGXFSZ, so a write past ``ulimit -f``
    fails with it rather than killing the process)."""
    if exc.errno == errno.EFBIG:
        return (
            ": over the largest file allowed here"
            " (ulimit -f, or the file system's own limit, such as FAT32's 4 GiB)"
        )
    return ""


def state_dir(root: str) -> str:
    """``<root>/.swarmget``, made if missing; a symlink there or in it is refused."""
    state = os.path.join(root, STATE_DIR)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(state)
        if stat.S_ISLNK(os.lstat(state).st_mode):
            raise _symlinked(state)
        with os.scandir(state) as entries:
            for entry in entries:
                if entry.is_symlink():
                    raise _symlinked(entry.path)
    except OSError as exc:
        raise io_error("create", state, exc) from None
    return state


def _symlinked(path: str) -> OutputError:
    return OutputError(
        f"{path} is a symbolic link: swarmget keeps its state only in a real directory "
        "inside the output dir (remove the link)",
        True,
    )


def part_name(key: int) -> str:
    return f"{key:016x}"


def version_path(part: str) -> str:
    """Where the version of ``part``'s bytes is kept (see the module docstring)."""
    return part + VERSION_SUFFIX


def part_version(part: str) -> str | None:
    """The validator ``part``'s bytes came with; None when none is recorded (a
    part of a body without one, of a kill before it was written, or of a
    swarmget before 0.2): such a part is not continued."""
    try:
        fd = os.open(version_path(part), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as recorded:
            return recorded.read(_VERSION_LIMIT).decode("utf-8", "surrogateescape")
    except OSError:
        return None


def remove_part(part: str) -> None:
    """Remove ``part`` and its version, if there (a symlink there: the link)."""
    for path in (part, version_path(part)):
        with contextlib.suppress(OSError):
            os.unlink(path)


def move_part(part: str, target: str) -> None:
    """Rename ``part`` and its version to ``target`` (the same download under
    another identity).  Raises OSError when the part cannot be moved."""
    os.replace(part, target)
    try:
        os.replace(version_path(part), version_path(target))
    except OSError:
        remove_part(target)  # no version: it cannot be continued, and would be a stray
        raise


def part_path(root: str, key: int) -> str:
    """Where the part of the row with identity ``key`` is written."""
    return os.path.join(root, STATE_DIR, PARTS_DIR, part_name(key))


def _create(part: str) -> int:
    """Open ``part`` afresh.  A symlink at its name (never ours: nothing here makes
    one) is not followed (``O_NOFOLLOW``) but removed, so that it cannot fail
    the row on every rerun."""
    try:
        return os.open(part, _OPEN_FLAGS, FILE_MODE)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    os.unlink(part)  # the link itself, not what it points at
    return os.open(part, _OPEN_FLAGS, FILE_MODE)


class PartFile(Writer):
    """One output file being written.  ``write`` takes memoryviews without copying.

    ``resume_from`` continues an existing part of exactly that size (the bytes
    already there are fed to the hashers first); otherwise the part is created
    or truncated.
    """

    __slots__ = ("fd", "final", "part", "versioned")

    def __init__(
        self,
        part: str,
        final: str,
        *,
        resume_from: int = 0,
        hashers: dict[str, Hasher] | None = None,
    ) -> None:
        super().__init__(hashers)
        self.part = part
        self.final = final
        self.fd = -1
        # A version is recorded beside the part (to remove with it): a part is
        # continued only under one (the planner checked), or holds_version wrote it.
        self.versioned = bool(resume_from)
        try:
            if resume_from:
                self.fd = os.open(part, _APPEND_FLAGS)
                if os.fstat(self.fd).st_size != resume_from:
                    raise OutputError(f"{part} changed size while resuming")
                if hashers:
                    self._hash_existing()
                self.written = resume_from
            else:
                self.fd = _create(part)
        except OSError as exc:
            self._close_fd()
            raise io_error("create", part, exc) from None
        except OutputError:
            self._close_fd()
            raise

    def _hash_existing(self) -> None:
        with open(self.part, "rb") as existing:
            while chunk := existing.read(1 << 20):
                self._hash(chunk)

    def write(self, data: memoryview | bytes) -> None:
        size = len(data)
        try:
            n = os.write(self.fd, data)
            rest = data
            while n < len(rest):  # rare: a short write on a regular file
                rest = memoryview(rest)[n:]
                n = os.write(self.fd, rest)
        except OSError as exc:
            raise io_error("write", self.part, exc) from None
        self._hash(data)  # all of it, not only what a short write left
        self.written += size

    def finish(self) -> None:
        """Close the descriptor; :meth:`FileSink.publish` renames the part."""
        fd, self.fd = self.fd, -1
        try:
            os.close(fd)
        except OSError as exc:
            raise io_error("finish", self.part, exc) from None

    def holds_version(self, validator: str | None) -> None:
        version = version_path(self.part)
        if validator is not None:
            try:
                fd = _create(version)
                try:
                    os.write(fd, validator.encode("utf-8", "surrogateescape"))
                finally:
                    os.close(fd)
            except OSError:
                pass  # no room, no descriptor: then no version, as for a body without one
            else:
                self.versioned = True
                return
        # None at all (a half-written one is none): the part is not continued,
        # which costs a rerun its bytes, never its integrity.  The download goes on.
        try:
            os.unlink(version)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a version we cannot take back may vouch for these bytes
            raise io_error("remove", version, exc) from None
        self.versioned = False

    def abort(self, keep: bool = False) -> None:
        self._close_fd()
        if not keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.part)
            self._drop_version()

    def _drop_version(self) -> None:
        if self.versioned:
            self.versioned = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(version_path(self.part))

    def publish(self, replace: bool) -> None:
        """Move the closed part to its final name: over a file there if ``replace``,
        else never (see the module docstring)."""
        try:
            try:
                self._move(self.part, replace)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                self._move_across(replace)
        except OSError as exc:
            raise io_error("finish", self.final, exc) from None
        self._drop_version()

    def _move(self, source: str, replace: bool) -> None:
        """Rename ``source`` to the final name (over a file there only if ``replace``)."""
        if replace:
            os.rename(source, self.final)
            return
        try:
            if rename_noreplace(source, self.final):
                return
            os.link(source, self.final)
        except FileExistsError:
            raise AppearedMeanwhile(
                f"{self.final} appeared while it downloaded and was not written by "
                "swarmget (use --overwrite to replace it)"
            ) from None
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            if os.path.lexists(self.final):
                raise AppearedMeanwhile(f"{self.final} appeared while it downloaded") from None
            os.rename(source, self.final)
            return
        os.unlink(source)

    def _move_across(self, replace: bool) -> None:
        """The final name is on another file system than the parts (a mount point
        inside the output dir), where no rename reaches: copy the part beside it,
        under a name of our own, and move that into place as any part.  The
        copy is removed if anything fails, so the final name still only ever
        holds a whole file."""
        temp = self._copy_beside()
        try:
            self._move(temp, replace)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        os.unlink(self.part)

    def _copy_beside(self) -> str:
        """A copy of the part in the final name's directory, named after the part.

        The name is the row's own (its part's: the row's identity), so a copy
        that a kill left there is this row's, and goes when the row is done
        again; with a new name each time, every kill during a copy left one
        behind for good.  A failure is this row's (``io``), not the run's: that
        file system being full says nothing of the one the other rows go to.
        """
        head, _, _ = self.final.rpartition("/")
        temp = f"{head}/{COPY_PREFIX}{os.path.basename(self.part)}"
        for _ in range(2):
            try:
                _copy_file(self.part, temp)
                return temp
            except FileExistsError:
                # A kill's leftover (a symlink there: the link goes, not what
                # it names).  A directory there is not ours: the row fails.
                _unlink_leftover(temp)
            except OSError as exc:
                raise OutputError(
                    f"cannot copy the download to {temp} (the final name is on another "
                    f"file system than {os.path.dirname(self.part)}): {exc.strerror}"
                ) from None
        raise OutputError(f"cannot copy the download beside {self.final}: {temp} stays there")

    def _close_fd(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def _unlink_leftover(path: str) -> None:
    """Remove the copy a kill left at ``path``.  A directory there (not ours),
    or one that cannot be removed, stays: the next attempt meets it again,
    and the row fails with ``io``."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _copy_file(source: str, target: str) -> None:
    """Copy ``source`` to ``target``, a new file (never through a symlink there)."""
    source_fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        target_fd = os.open(target, _NEW_FLAGS, FILE_MODE)
        try:
            try:
                size, offset = os.fstat(source_fd).st_size, 0
                while offset < size:
                    # In the kernel, not through Python (Linux: file to file).
                    sent = os.sendfile(target_fd, source_fd, offset, min(size - offset, 1 << 30))
                    if sent <= 0:
                        raise OSError(errno.EIO, f"{source} ended at byte {offset} of {size}")
                    offset += sent
            finally:
                os.close(target_fd)  # a network file system may report a failure only here
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(target)  # ours (O_EXCL made it): no half copy stays behind
            raise
    finally:
        os.close(source_fd)


class OutputDir:
    """The output directory: maps relative output paths to absolute ones safely."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.realpath(os.fspath(root))
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise io_error("create output directory", self.root, exc) from None
        # Directories checked to resolve inside the root -> their (device, inode).
        self._dirs: dict[str, tuple[int, int]] = {self.root: (0, 0)}
        self._device = os.stat(self.root).st_dev

    def final_path(self, rel: str) -> str:
        """Absolute final path for a confined relative path; creates parent dirs."""
        path = f"{self.root}/{rel}"
        parent = path.rpartition("/")[0]
        if parent not in self._dirs:
            self._make_parent(parent)
        return path

    def check_again(self, path: str) -> None:
        """Before a file is published at ``path`` (from :meth:`final_path`): is its
        directory still the one checked then?  One ``stat``; ``bad_path`` if it
        was swapped for a way out of the output dir meanwhile."""
        parent = path.rpartition("/")[0]
        if parent == self.root:
            return
        try:
            found = os.stat(parent)
        except OSError:
            return  # gone: the publish itself reports it
        if self._dirs.get(parent) != (found.st_dev, found.st_ino):
            self._check_inside(parent)
            self._remember(parent, found)

    def resolves_inside(self, rel: str) -> bool:
        """Does the directory of ``rel`` exist and resolve inside the root?  Asked
        before an earlier run's file is looked at or removed: a directory since
        replaced by a symlink must not lead that outside."""
        parent = f"{self.root}/{rel}".rpartition("/")[0]
        if parent in self._dirs:
            return True
        try:
            self._check_inside(parent)
            self._remember(parent, os.stat(parent))
        except (TransferError, OSError):
            return False
        return True

    def _remember(self, parent: str, found: os.stat_result) -> None:
        if len(self._dirs) < 65536:  # a cache, not a record: bounded
            self._dirs[parent] = (found.st_dev, found.st_ino)

    def _make_parent(self, parent: str) -> None:
        """Create ``parent`` (under the root) one level at a time, after checking
        that the deepest directory already there resolves inside the root.

        Not ``os.makedirs``: it follows a symlinked directory first and asks
        questions after (empty directories appeared outside the output dir
        before the check refused the path), and it recurses once per missing
        level (a path 2,000 levels deep raised ``RecursionError``)."""
        missing: list[str] = []
        existing = parent
        while existing != self.root and existing and not os.path.isdir(existing):  # follows links
            missing.append(existing)
            existing = existing.rpartition("/")[0]
        self._check_inside(existing)
        for directory in reversed(missing):
            try:
                os.mkdir(directory)
            except FileExistsError as exc:
                if not os.path.isdir(directory):  # a file where a directory must go
                    raise io_error("create directory", directory, exc) from None
            except OSError as exc:
                elsewhere = self._elsewhere(existing, exc)
                raise io_error("create directory", directory, exc, elsewhere) from None
            except ValueError:  # a NUL: the planner refuses these, but never crash on one
                raise TransferError(
                    ErrorCode.BAD_PATH, f"{directory!r} is not a valid path"
                ) from None
        if missing:
            self._check_inside(parent)  # created by someone else meanwhile, as a link
        try:
            self._remember(parent, os.stat(parent))
        except OSError as exc:
            raise io_error("create directory", parent, exc) from None

    def _elsewhere(self, directory: str, exc: OSError) -> bool:
        """Does ``exc``, met in ``directory`` (one that exists), leave the rest of
        the output dir alone?  Read-only: unless the output dir's own mount is
        (a read-only bind mount inside it has its device); full: unless its
        file system is the output dir's."""
        try:
            if exc.errno == errno.EROFS:
                return not os.statvfs(self.root).f_flag & os.ST_RDONLY
            return os.stat(directory).st_dev != self._device
        except OSError:
            return False

    def _check_inside(self, directory: str) -> None:
        """A directory (or a symlink) that already existed could point elsewhere:
        out of the output dir, or into our own state directory, whose journal
        and manifest a row's file must never replace (the planner refuses the
        name .swarmget, but a symlink of the user's, out/s -> .swarmget, made
        s/journal.sqlite3 a path a row could be given)."""
        real = os.path.realpath(directory)
        if not _within(real, self.root):
            raise TransferError(ErrorCode.BAD_PATH, f"{directory} resolves outside the output dir")
        if _within(real, f"{self.root}/{STATE_DIR}"):
            raise TransferError(
                ErrorCode.BAD_PATH,
                f"{directory} resolves into swarmget's own {STATE_DIR} directory",
            )


def _within(real: str, directory: str) -> bool:
    """Is the real path ``real`` ``directory`` itself or under it?"""
    return real == directory or real.startswith(directory + "/")


class FileSink(Sink):
    """Bodies become files under ``root`` (worker side; see the module docstring)."""

    resumable = True

    def __init__(self, root: str | os.PathLike[str], *, replace: bool = False) -> None:
        self.output = OutputDir(root)
        self.replace = replace  # --overwrite: a publish replaces what is at the path
        self.parts = os.path.join(state_dir(self.output.root), PARTS_DIR)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.parts)
        except OSError as exc:
            raise io_error("create", self.parts, exc) from None

    def open(
        self, job: Assignment, start: int, length: int | None, hashers: dict[str, Hasher] | None
    ) -> Writer:
        path = job.path
        if path is None:
            raise TransferError(ErrorCode.BAD_PATH, f"no output path was planned for {job.url}")
        final = self.output.final_path(path)
        # Not os.path.join: it is interpreted Python, and this runs once per file.
        part = f"{self.parts}/{part_name(job.key)}"
        try:
            return PartFile(part, final, resume_from=start, hashers=hashers)
        except OutputError as exc:
            raise self._unless_removed(exc) from None

    def drop_part(self, job: Assignment) -> None:
        remove_part(f"{self.parts}/{part_name(job.key)}")  # and its version

    def publish(self, done: list[tuple[Assignment, Writer]]) -> list[TransferError | None]:
        errors: list[TransferError | None] = []
        check_again, replace = self.output.check_again, self.replace
        for _, writer in done:
            assert isinstance(writer, PartFile)
            try:
                check_again(writer.final)
                writer.publish(replace)
            except TransferError as exc:  # io (an OutputError), bad_path, exists
                writer.abort()
                errors.append(self._unless_removed(exc) if isinstance(exc, OutputError) else exc)
                continue
            errors.append(None)
        return errors

    def _unless_removed(self, error: OutputError) -> OutputError:
        """``error``, or a run-stopping one when the output dir or its .swarmget
        was removed during the run: every row after it failed `io` one by one,
        for as long as the list lasted, its outcome recorded in a journal no
        longer there.  (Looked at only once a file has failed.)"""
        if error.fatal or os.path.isdir(self.parts):
            return error
        return OutputError(
            f"{error.message} (the output directory {self.output.root}, or its .swarmget "
            "folder, was removed during the run)",
            True,
        )
