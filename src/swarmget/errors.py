"""One exception root and the stable error codes that land in the manifest.

Every failure a user can see carries a short code (``http_404``, ``timeout``,
``truncated`` ...).  The codes are part of the public interface: they are
documented in the README, written to ``manifest.jsonl`` and meant to be grepped
for, so never rename one.  Exceptions pickle cleanly (worker processes send them
across process boundaries): each is made again from its constructor's
arguments (``self.args``, or a subclass's own ``_arguments``), then given what
was set on it since (its ``report``).  :func:`warn` says what is not an error.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any, Final, TextIO


def warn(text: str, out: TextIO | None = None) -> None:
    """Say ``text`` (a whole warning line) on ``out``, stderr by default, if it can
    be said: a program without a usable stderr (None, closed, a broken pipe)
    still runs.  (The CLI's own ``say`` also silences a broken stream for good;
    a library must leave the caller's descriptors alone.)"""
    out = out if out is not None else sys.stderr
    if out is None:
        return
    with contextlib.suppress(OSError, ValueError):  # ValueError: a closed file object
        out.write(text)
        out.flush()


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` naming the caller's line: the first frame outside this
    package.  A ``stacklevel`` cannot: the public names are wrappers (lazy
    imports, ``swarmget/__init__.py``), and in the compiled build our own
    functions have no Python frames, so the count of frames to skip differs by
    build and by entry point."""
    frame = sys._getframe(0)  # the nearest Python frame (ours may be C)
    while frame.f_back is not None and _ours(frame.f_globals.get("__name__")):
        frame = frame.f_back
    module_globals = frame.f_globals
    warnings.warn_explicit(
        message,
        category,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=module_globals.get("__name__"),
        registry=module_globals.setdefault("__warningregistry__", {}),
    )


def _ours(module: object) -> bool:
    return isinstance(module, str) and (module == "swarmget" or module.startswith("swarmget."))


class ErrorCode:
    """The stable error codes.  ``http_<status>`` is built by :func:`http_code`."""

    TIMEOUT: Final = "timeout"  # connect, idle-read or total deadline expired
    CONNECT: Final = "connect"  # TCP connect refused / unreachable / reset before a response
    DNS: Final = "dns"  # host name did not resolve
    TRUNCATED: Final = "truncated"  # connection ended before the body was complete
    PROTOCOL: Final = "protocol"  # malformed or over-limit response
    TOO_LARGE: Final = "too_large"  # body larger than --max-size
    BAD_URL: Final = "bad_url"  # not an absolute http(s) URL
    BAD_PATH: Final = "bad_path"  # output path would leave the output directory
    EXISTS: Final = "exists"  # a file not made by swarmget is already at the path
    IO: Final = "io"  # writing the output file failed (disk full, permissions)
    TLS: Final = "tls"  # TLS handshake or record-layer failure
    TLS_VERIFY: Final = "tls_verify"  # certificate verification failed
    TOO_MANY_REDIRECTS: Final = "too_many_redirects"
    BAD_REDIRECT: Final = "bad_redirect"
    CHECKSUM: Final = "checksum"
    SIZE_MISMATCH: Final = "size_mismatch"
    CANCELLED: Final = "cancelled"  # --dedupe: the row this copy shares did not finish
    BAD_ROW: Final = "bad_row"  # a malformed input row (its line number is in the message)
    CRASHED: Final = "crashed"  # the worker processes downloading the row died, twice
    MAP_ERROR: Final = "map_error"  # stream(map=fn): fn raised, or its value did not pickle

    ALL: Final = frozenset(
        {
            TIMEOUT, CONNECT, DNS, TRUNCATED, PROTOCOL, TOO_LARGE, BAD_URL, BAD_PATH,
            EXISTS, IO, TLS, TLS_VERIFY, TOO_MANY_REDIRECTS, BAD_REDIRECT, CHECKSUM,
            SIZE_MISMATCH, CANCELLED, BAD_ROW, CRASHED, MAP_ERROR,
        }
    )  # fmt: skip


def http_code(status: int) -> str:
    """The error code for a final HTTP status that is not a success."""
    return f"http_{status}"


class SwarmgetError(Exception):
    """Root of every exception swarmget raises on purpose.

    An error that stopped a run (a full disk, say) carries the run's
    :class:`~swarmget.report.Report` so far as ``report``.
    """

    # Attributes are set in __init__ and codes are properties, not class-level
    # defaults: mypyc compiles this class, and an unpickled compiled exception
    # would lack a default (unpickling calls __init__, which always sets them).

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.report: Any = None

    @property
    def code(self) -> str:
        return "error"

    def _arguments(self) -> tuple[Any, ...]:
        """What the constructor takes to make this error again (a subclass whose
        constructor takes other arguments than ``self.args`` says its own)."""
        return self.args

    def __reduce__(self) -> tuple[Any, ...]:
        # The constructor's arguments, then what was set on the error since
        # (BaseException.__setstate__ sets it again): ``report``, which a run
        # that stopped attaches, notes, any attribute.  A subclass's own
        # __reduce__ of its arguments alone lost them, and a compiled class
        # keeps its attributes outside the instance __dict__ that Exception's
        # own __reduce__ would carry.
        state = dict(getattr(self, "__dict__", None) or {})
        state["report"] = self.report
        return (type(self), self._arguments(), state)

    def __str__(self) -> str:
        if self.args:
            return str(self.args[0])
        # Looked up as Python does: compiled by mypyc, a native read of the
        # property from a method of this class crashed the interpreter (SIGSEGV:
        # str(UsageError()), and the traceback of an uncaught one, in mypyc 1.x).
        code: str = getattr(self, "code")  # noqa: B009
        return code


class UsageError(SwarmgetError):
    """Bad options or unreadable input: the CLI exits with status 2."""

    @property
    def code(self) -> str:
        return "usage"


class TransferError(SwarmgetError):
    """One file failed; ``code`` is one of :class:`ErrorCode` or ``http_<n>``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self._code = code
        self.message = message

    @property
    def code(self) -> str:
        return self._code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ProtocolError(TransferError):
    """The server sent something that is not valid HTTP/1.1, or exceeded a limit.

    The connection it arrived on is never reused.
    """

    def __init__(self, message: str, code: str = ErrorCode.PROTOCOL) -> None:
        super().__init__(code, message)

    def _arguments(self) -> tuple[str, str]:
        return (self.message, self.code)
