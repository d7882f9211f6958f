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
Explicit paths are suffixed the same way as default names: a collision is
then visible in the manifest rather than a failed row, and no data is lost.
The one collision that cannot be suffixed away -- a path that needs a
directory where this run already put a file -- fails with ``exists``.

Memory is one set entry per allocated name plus a counter per *colliding*
base name; the counter makes a million ``image.jpg`` linear, not quadratic.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from swarmget.errors import ErrorCode, TransferError
from swarmget.sources.rows import Row

MAX_NAME_BYTES = 200  # default names; see the module docstring
MAX_COMPONENT_BYTES = 255  # NAME_MAX on every file system we care about
RESERVED = ".swarmget"  # the run's state directory at the top of the output dir
FALLBACK_NAME = "index"  # for URLs whose path is empty or ends in "/"

# C0, DEL, C1, and lone surrogates (which cannot be encoded as a file name).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff/\\]")
_MAX_EXT_CHARS = 16  # longer "extensions" are just part of the name
_DOUBLE_EXTS = (".tar",)  # a.tar.gz -> a-1.tar.gz, not a.tar-1.gz


def default_name(url: str) -> str:
    """A safe file name from the last segment of ``url``'s path."""
    segment = _last_segment(url)
    name = unquote(segment, errors="replace") if "%" in segment else segment
    # isprintable() is a cheap pre-check: it is False for every character
    # _UNSAFE matches except the two separators.
    if not name.isprintable() or "/" in name or "\\" in name:
        # Replace rather than delete, so distinct names stay distinct-looking.
        name = _UNSAFE.sub("_", name)
    # Leading dots would hide the file (and make "." / ".." / ".swarmget");
    # trailing dots and spaces are silently dropped by Windows and SMB shares.
    name = name.lstrip(".").rstrip(". ")
    name = _truncate_name(name, MAX_NAME_BYTES)
    return name or FALLBACK_NAME


def confine(path: str) -> str:
    """Validate an explicit relative output path; return it normalised.

    Raises :class:`TransferError` with code ``bad_path`` when the path is empty,
    absolute, has a ``..`` component, a backslash or a control character, names
    a directory (ends in ``/`` or ``/.``), starts with the reserved
    ``.swarmget`` directory, or has a component longer than 255 bytes.
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
    if parts[0].lower() == RESERVED:  # lower(): case-insensitive file systems
        raise _bad_path(path, f"is inside the reserved {RESERVED!r} directory")
    # Fast path: no character needs more than 4 bytes in UTF-8.
    if len(path) * 4 > MAX_COMPONENT_BYTES and any(
        len(part.encode()) > MAX_COMPONENT_BYTES for part in parts
    ):
        raise _bad_path(path, f"has a component longer than {MAX_COMPONENT_BYTES} bytes")
    return "/".join(parts)


class NameAllocator:
    """Hands out a unique relative output path per row, deterministically."""

    def __init__(self) -> None:
        self._taken: set[str] = set()  # every path handed out
        self._dirs: set[str] = set()  # directories implied by explicit paths
        self._next_suffix: dict[str, int] = {}  # only for names that collided

    def allocate(self, row: Row) -> str:
        """The output path for ``row``: ``row.path`` if given, else from the URL.

        Raises :class:`TransferError` (``bad_path`` or ``exists``) when the row
        cannot have a path; the run goes on with the next row.
        """
        if row.path is None:
            return self._claim(default_name(row.url))
        path = confine(row.path)
        parents = _parents(path)
        for parent in parents:
            if parent in self._taken:
                raise TransferError(
                    ErrorCode.EXISTS,
                    f"output path {path!r} needs directory {parent!r}, "
                    "which is already a file in this run",
                )
        claimed = self._claim(path)
        self._dirs.update(parents)
        return claimed

    def __len__(self) -> int:
        return len(self._taken)

    def _claim(self, name: str) -> str:
        if name not in self._taken and name not in self._dirs:
            self._taken.add(name)
            return name
        # Resume counting where the last collision on this name stopped; a
        # candidate can still be taken (an input that lists "a-1.jpg" itself),
        # so keep going until a free one turns up.
        n = self._next_suffix.get(name, 1)
        candidate = with_suffix(name, n)
        while candidate in self._taken or candidate in self._dirs:
            n += 1
            candidate = with_suffix(name, n)
        self._next_suffix[name] = n + 1
        self._taken.add(candidate)
        return candidate


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


def _parents(path: str) -> list[str]:
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
