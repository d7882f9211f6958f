"""Output names: a safe file name for every row, and nothing outside the output dir.

Two kinds of name reach the file system:

* a **default name** made from the URL (:func:`default_name`).  The URL is
  attacker-controlled (any server can redirect us, any list can be scraped),
  so the name is sanitised until it can only be a single, visible, ordinary
  file name: one component, no separators, no control characters, not ``.``
  or ``..``, no leading dot, at most 200 bytes.  200 rather than the usual 255
  leaves room for the ``-N`` collision suffix and for sinks that add their own
  temporary suffix.
* an **explicit path** from the input's ``path`` column (:func:`confine`).  It
  may have directories, so it is validated rather than rewritten: anything
  that could leave the output directory, or that a user would not expect to
  be taken literally, fails that row with ``bad_path`` instead of being
  guessed at.

:class:`NameAllocator` turns rows into unique paths for one run.  A name that
is already taken gets ``-1``, ``-2`` ... before its extension, in input order,
so re-running the same input gives the same names (resume depends on that).
An explicit path is that path or none: a second row asking for it fails with
``exists`` (renamed, it would not be where the input says), as does one that
needs a directory where this run already put a file.  A default name goes
past the explicit paths of the rows planned with it (a batch), so an
earlier row's URL does not take a later row's path from it.

Memory is one set entry per allocated name plus a counter per *colliding*
base name; the counter makes a million ``image.jpg`` linear, not quadratic.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
import sys
from typing import Final

from swarmget.errors import ErrorCode, TransferError
from swarmget.sources.rows import Row

MAX_NAME_BYTES = 200  # default names; see the module docstring
MAX_COMPONENT_BYTES = 255  # NAME_MAX on every file system we care about
PATH_MAX: Final = 4096  # Linux's, its NUL included
RESERVED = ".swarmget"  # the run's state directory at the top of the output dir
FALLBACK_NAME = "index"  # for URLs whose path is empty or ends in "/"

# C0, DEL, C1, lone surrogates (which cannot be encoded as a file name), and
# the bidirectional controls that make a name display as another one
# ("invoice\u202egpj.exe" shows as "invoiceexe.jpg"), and the line and
# paragraph separators (a name that reads as two lines).
_CONTROLS = (
    r"\x00-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
)
_CONTROL = re.compile(f"[{_CONTROLS}]")
_UNSAFE = re.compile(f"[{_CONTROLS}/\\\\]")
# The file system's encoding: UTF-8 nearly everywhere (Python's UTF-8 mode
# makes it so even in the C locale), but a locale such as ISO-8859-1 cannot
# spell 日本.bin, and a name it cannot spell failed at the very end, when the
# finished file was renamed into place.
_FS_ENCODING: Final = sys.getfilesystemencoding()
_FS_ERRORS: Final = sys.getfilesystemencodeerrors()
_FS_UTF8: Final = codecs.lookup(_FS_ENCODING).name == "utf-8"
_MAX_EXT_CHARS = 16  # longer "extensions" are just part of the name
_DOUBLE_EXTS = (".tar",)  # a.tar.gz -> a-1.tar.gz, not a.tar-1.gz


def default_name(url: str) -> str:
    """A safe file name from the last segment of ``url``'s path."""
    segment = _last_segment(url)
    if not segment.isprintable():
        # A raw tab or line break is not part of the URL: the request leaves it
        # out (urlsplit, as browsers do), and so does the name.
        segment = segment.replace("\t", "").replace("\n", "").replace("\r", "")
    name = _unquoted(segment) if "%" in segment else segment
    # isprintable() is a cheap pre-check: it is False for every character
    # _UNSAFE matches except the two separators.
    if not name.isprintable() or "/" in name or "\\" in name:
        # Replace rather than delete, so distinct names stay distinct-looking.
        name = _UNSAFE.sub("_", name)
    # Leading dots would hide the file (and make "." / ".." / ".swarmget");
    # trailing dots and spaces are silently dropped by Windows and SMB shares.
    name = name.lstrip(".").rstrip(". ")
    if not _FS_UTF8 and not name.isascii():
        name = "".join(ch if _spelled(ch) else "_" for ch in name)
    name = _truncate_name(name, MAX_NAME_BYTES)
    return name or FALLBACK_NAME


def _unquoted(segment: str) -> str:
    """``segment`` with its %-escapes decoded as UTF-8, but those that are not
    UTF-8 (``%ff``) kept as they are written: decoded to U+FFFD they made
    ``a%fe.jpg`` and ``a%ff.jpg`` one name, and the name said nothing of
    either (curl -O keeps every escape; browsers keep the ones that are not
    UTF-8, as here).  The rest of the segment is left as it is."""
    return _ESCAPES.sub(_decoded_run, segment)


_ESCAPES = re.compile("(?:%[0-9A-Fa-f]{2})+")  # a run of escapes: one UTF-8 text


def _decoded_run(match: re.Match[str]) -> str:
    written = match.group()
    raw = bytes.fromhex(written.replace("%", ""))  # byte i is written[3i:3i+3]
    parts: list[str] = []
    start = 0
    while start < len(raw):
        try:
            parts.append(raw[start:].decode("utf-8"))
            break
        except UnicodeDecodeError as exc:
            bad, end = start + exc.start, start + exc.end
            parts.append(raw[start:bad].decode("utf-8"))
            parts.append(written[3 * bad : 3 * end])
            start = end
    return "".join(parts)


def _spelled(text: str) -> bool:
    """Can the file system's encoding spell ``text``?"""
    try:
        text.encode(_FS_ENCODING, _FS_ERRORS)
    except UnicodeEncodeError:
        return False
    return True


def confine(path: str, max_bytes: int = PATH_MAX - 1) -> str:
    """Validate an explicit relative output path; return it normalised.

    Raises :class:`TransferError` with code ``bad_path`` when the path is empty,
    absolute, has a ``..`` component, a backslash or a control character, names
    a directory (ends in ``/`` or ``/.``), starts with the reserved
    ``.swarmget`` directory, has a component longer than 255 bytes, or is
    longer than ``max_bytes`` (what PATH_MAX leaves after the output dir: the
    kernel refused it only after the row's directories had been made).
    """
    if not path:
        raise _bad_path(path, "is empty")
    if not path.isprintable() and _CONTROL.search(path):
        raise _bad_path(path, "contains a control character")
    if "\\" in path:
        # On Windows it is a separator, so "a\\..\\..\\x" would escape there.
        raise _bad_path(path, "contains a backslash")
    if path.startswith("/"):
        raise _bad_path(path, "is absolute")
    raw = path.split("/")
    if ".." in raw:
        raise _bad_path(path, "has a '..' component")
    if raw[-1] in ("", "."):
        raise _bad_path(path, "names a directory, not a file")
    parts = [part for part in raw if part and part != "."]
    if not _FS_UTF8 and not path.isascii() and not _spelled(path):
        raise _bad_path(path, f"cannot be spelled in this system's file names ({_FS_ENCODING})")
    # At any depth: a directory of the output dir may be another run's output
    # dir, whose journal and parts are there.  lower(): case-insensitive file systems.
    if any(part.lower() == RESERVED for part in parts):
        raise _bad_path(path, f"is inside a reserved {RESERVED!r} directory")
    # Fast path: no character needs more than 4 bytes in UTF-8.
    if len(path) * 4 > MAX_COMPONENT_BYTES and any(
        len(part.encode()) > MAX_COMPONENT_BYTES for part in parts
    ):
        raise _bad_path(path, f"has a component longer than {MAX_COMPONENT_BYTES} bytes")
    normal = "/".join(parts)  # measured as made: "./" * 2000 + "a" is "a"
    if len(normal) * 4 > max_bytes and len(normal.encode()) > max_bytes:
        raise _bad_path(path, f"is longer than {max_bytes} bytes (PATH_MAX, with the output dir)")
    return normal


class NameStore:
    """Where a :class:`NameAllocator` remembers what it handed out.

    :class:`MemoryNames` keeps sets in memory (about 95 bytes a name); the
    planner's store (``sinks/plan.py``) keeps them in the run's journal on
    disk, so that names cost no memory however long the list.
    """

    def taken(self, name: str) -> bool:
        """Is ``name`` a path already handed out (as a file)?"""
        raise NotImplementedError

    def is_dir(self, name: str) -> bool:
        """Is ``name`` a directory implied by a path already handed out?"""
        raise NotImplementedError

    def claim(self, name: str, parents: list[str]) -> None:
        """Hand out ``name``; ``parents`` are the directories it implies."""
        raise NotImplementedError

    def reserved(self, name: str) -> bool:
        """Is ``name`` kept for a row still to come (so a default name goes past it)?"""
        return False

    def asked_for(self, name: str) -> bool:
        """Is ``name`` the explicit path of a row planned with this one, or a
        directory such a path needs?  A default name goes past it: the input's
        path is that path or none (a row whose default name came first took it,
        and the row that named it failed)."""
        return False

    def next_suffix(self, name: str) -> int:
        """Where to start counting ``-N`` suffixes for ``name`` (1 when unknown)."""
        raise NotImplementedError

    def set_next_suffix(self, name: str, n: int) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class MemoryNames(NameStore):
    def __init__(self) -> None:
        self._taken: set[str] = set()  # every path handed out
        self._dirs: set[str] = set()  # directories implied by explicit paths
        self._next_suffix: dict[str, int] = {}  # only for names that collided

    def taken(self, name: str) -> bool:
        return name in self._taken

    def is_dir(self, name: str) -> bool:
        return name in self._dirs

    def claim(self, name: str, parents: list[str]) -> None:
        self._taken.add(name)
        if parents:
            self._dirs.update(parents)

    def next_suffix(self, name: str) -> int:
        return self._next_suffix.get(name, 1)

    def set_next_suffix(self, name: str, n: int) -> None:
        self._next_suffix[name] = n

    def __len__(self) -> int:
        return len(self._taken)


class NameAllocator:
    """Hands out a unique relative output path per row, deterministically."""

    def __init__(self, store: NameStore | None = None, root: str = "") -> None:
        self.store = store if store is not None else MemoryNames()
        self.root = root
        # What PATH_MAX leaves a relative path in the output dir ``root``.
        self.max_bytes = PATH_MAX - 1 - len(os.fsencode(root)) - 1

    def candidate(self, row: Row) -> str:
        """The path ``row`` asks for before collisions: confined, or from the URL."""
        return default_name(row.url) if row.path is None else confine(row.path, self.max_bytes)

    def allocate(self, row: Row, candidate: str | None = None) -> str:
        """The output path for ``row``: ``row.path`` if given, else from the URL.

        Raises :class:`TransferError` (``bad_path`` or ``exists``) when the row
        cannot have a path; the run goes on with the next row.  ``candidate``
        is :meth:`candidate`'s answer, when the caller already has it.
        """
        name = candidate if candidate is not None else self.candidate(row)
        if row.path is None:
            return self._claim(name, [])
        # A path the input gives is that path or none: never renamed to "-1".
        # (The planner has already freed it from an earlier run's row that may
        # give it up, see FilePlanner._take_explicit.)
        if self.store.taken(name):
            raise TransferError(
                ErrorCode.EXISTS, f"output path {name!r} is another row's in this input"
            )
        if self.store.is_dir(name):
            raise TransferError(
                ErrorCode.EXISTS,
                f"output path {name!r} is a directory that other rows' files are in",
            )
        parents = parents_of(name)
        for parent in parents:
            if self.store.taken(parent) and not self._directory_on_disk(parent):
                raise TransferError(
                    ErrorCode.EXISTS,
                    f"output path {name!r} needs directory {parent!r}, which is another row's file",
                )
        self.store.claim(name, parents)  # free, as checked: never suffixed
        return name

    def __len__(self) -> int:
        return len(self.store)

    def _directory_on_disk(self, path: str) -> bool:
        """Is ``path`` a real directory in the output dir (not a symlink)?  The
        row that claimed it as a file failed then (a directory was in its way),
        and it is no reason to fail the rows that go in it.  Asked only on a
        conflict: no file system call on the usual path."""
        return bool(self.root) and is_directory(os.path.join(self.root, path))

    def _claim(self, name: str, parents: list[str]) -> str:
        store = self.store
        if not self._used(name):
            store.claim(name, parents)
            return name
        # Resume counting where the last collision on this name stopped.  That
        # one can still be taken: the input listed "a-1.jpg" itself, or earlier
        # runs handed out a-1 ... a-N (the count starts cold in each run, and
        # one name repeated a million times is common: "image.jpg").  Then
        # gallop to a free suffix and bisect back to the first free one after
        # the taken run: log(N) lookups, not N.
        n = store.next_suffix(name)
        if self._used(with_suffix(name, n)):
            low, step = n, 1
            high = low + step
            while self._used(with_suffix(name, high)):
                low, step = high, step * 2
                high = low + step
            while high - low > 1:
                middle = (low + high) // 2
                if self._used(with_suffix(name, middle)):
                    low = middle
                else:
                    high = middle
            n = high  # seen free
        candidate = with_suffix(name, n)
        store.set_next_suffix(name, n + 1)
        store.claim(candidate, parents)
        return candidate

    def _used(self, name: str) -> bool:
        store = self.store
        return (
            store.taken(name) or store.is_dir(name) or store.reserved(name) or store.asked_for(name)
        )


def is_directory(path: str) -> bool:
    """A directory, not a symlink to one (lstat)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def with_suffix(path: str, n: int) -> str:
    """``dir/a.jpg`` -> ``dir/a-<n>.jpg``, keeping the last component within 255 bytes."""
    head, sep, name = path.rpartition("/")
    stem, ext = split_ext(name)
    suffix = f"-{n}"
    if (len(stem) + len(ext)) * 4 + len(suffix) > MAX_COMPONENT_BYTES:  # may be too long
        stem = _truncate_bytes(stem, MAX_COMPONENT_BYTES - len(suffix) - len(ext.encode()))
    return f"{head}{sep}{stem}{suffix}{ext}"


def split_ext(name: str) -> tuple[str, str]:
    """Split a file name into stem and extension (``a.tar.gz`` -> ``a``, ``.tar.gz``).

    A leading dot is not an extension, nor is a long or blank-containing tail:
    ``v1.2 final notes`` has no extension worth keeping apart.
    """
    dot = name.rfind(".")
    if dot <= 0 or len(name) - dot > _MAX_EXT_CHARS or " " in name[dot:]:
        return name, ""
    stem, ext = name[:dot], name[dot:]
    for double in _DOUBLE_EXTS:
        if len(stem) > len(double) and stem.lower().endswith(double):
            return stem[: -len(double)], stem[-len(double) :] + ext
    return stem, ext


def _last_segment(url: str) -> str:
    """The last segment of ``url``'s path, without query and fragment.

    Hand-rolled rather than ``urlsplit``: it must accept any string (a bad URL
    still gets a safe name before it fails with ``bad_url``) and it runs once
    per row.
    """
    end = url.find("?")
    if end < 0:
        end = len(url)
    fragment = url.find("#", 0, end)
    if fragment >= 0:
        end = fragment
    start = url.find("://", 0, end)
    start = start + 3 if start >= 0 else 0
    slash = url.rfind("/", start, end)
    if slash >= 0:
        return url[slash + 1 : end]
    return "" if start else url[:end]  # "http://host" has an empty path


def _truncate_name(name: str, limit: int) -> str:
    # Fast path: no character needs more than 4 bytes in UTF-8.
    if len(name) * 4 <= limit or len(name.encode()) <= limit:
        return name
    stem, ext = split_ext(name)
    stem = _truncate_bytes(stem, limit - len(ext.encode())).rstrip(". ")
    return stem + ext if stem else _truncate_bytes(name, limit).rstrip(". ")


def _truncate_bytes(text: str, limit: int) -> str:
    """Cut ``text`` to at most ``limit`` bytes of UTF-8 without splitting a character."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[: max(limit, 0)].decode(errors="ignore")


def parents_of(path: str) -> list[str]:
    """``a/b/c.jpg`` -> ``["a", "a/b"]``."""
    parents = []
    slash = path.find("/")
    while slash >= 0:
        parents.append(path[:slash])
        slash = path.find("/", slash + 1)
    return parents


def _bad_path(path: str, problem: str) -> TransferError:
    shown = path if len(path) <= 200 else path[:200] + "..."
    return TransferError(ErrorCode.BAD_PATH, f"output path {shown!r} {problem}")
