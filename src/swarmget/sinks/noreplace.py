"""Rename that never replaces: Linux's ``renameat2(RENAME_NOREPLACE)``.

A finished part is moved to its final name only if nothing is there (see
``sinks/files.py``).  ``link()`` then ``unlink()`` does that everywhere hard
links exist, but costs two system calls per file, and on a run of small files
the kernel's side of publishing is a visible share of the CPU per file.
``renameat2`` with ``RENAME_NOREPLACE`` does it in one, atomically.  Python
3.11 has no ``os.renameat2``, so it is called through ctypes.  Where the C
library lacks it (glibc before 2.28) or the file system refuses the flag
(some network and FUSE file systems), :func:`rename_noreplace` says so and
the caller links.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import Any, Final

_AT_FDCWD: Final = -100
_RENAME_NOREPLACE: Final = 1
# What renameat2 answers when the kernel or the file system has no such flag.
_UNSUPPORTED: Final = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})


def _find() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    # No argtypes: every argument is a Python int (a C int) or bytes (a char *),
    # which ctypes passes as they are; converting through declared argtypes
    # was most of the call's cost, paid once per file.
    function.restype = ctypes.c_int
    return function


_renameat2: Final[Any] = _find()
# What os.fsencode does, without its two Python frames per path (once per file).
_ENCODING: Final = sys.getfilesystemencoding()
_ERRORS: Final = sys.getfilesystemencodeerrors()


def rename_noreplace(source: str, target: str) -> bool:
    """Rename ``source`` to ``target`` unless ``target`` exists: True when done,
    False when this system cannot (the caller falls back on ``link``).  A file
    at ``target`` raises FileExistsError; any other failure its OSError."""
    if _renameat2 is None:
        return False
    if (
        _renameat2(
            _AT_FDCWD,
            source.encode(_ENCODING, _ERRORS),
            _AT_FDCWD,
            target.encode(_ENCODING, _ERRORS),
            _RENAME_NOREPLACE,
        )
        == 0
    ):
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), source, None, target)
