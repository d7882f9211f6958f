"""A job: one input row on its way to becoming one file (or one failure)."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from swarmget.errors import ErrorCode, TransferError
from swarmget.sources.rows import Row

Origin = tuple[str, str, int]  # (scheme, host, port): the key of a connection pool

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Characters allowed unescaped in a request target; anything else (spaces,
# controls, non-ASCII) is percent-encoded so a URL can never inject a header.
_SAFE_TARGET = "/?#[]@!$&'()*+,;=:%-._~"


class UrlSplitter:
    """:func:`split_url` with a cache per ``scheme://authority/`` prefix.

    Bulk lists put thousands of URLs on one origin; parsing the authority once
    per origin instead of once per URL takes ``urlsplit`` off the per-file path.
    """

    def __init__(self) -> None:
        self._origins: dict[str, tuple[Origin, str]] = {}

    def split(self, url: str) -> tuple[Origin, str, str]:
        cut = url.find("/", url.find("://") + 3) if "://" in url else -1
        if cut > 0:
            known = self._origins.get(url[:cut])
            if known is not None:
                target = url[cut:]
                if "#" in target:
                    target = target.partition("#")[0]
                if target.isascii() and target.isprintable() and " " not in target:
                    return known[0], target, known[1]
        origin, target, host_header = split_url(url)
        if cut > 0 and len(self._origins) < 65536 and url[:cut].isascii():
            self._origins[url[:cut]] = (origin, host_header)
        return origin, target, host_header


def split_url(url: str) -> tuple[Origin, str, str]:
    """(origin, request target, Host header value) for an absolute http(s) URL."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise TransferError(ErrorCode.BAD_URL, f"invalid URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise TransferError(ErrorCode.BAD_URL, f"not an http(s) URL: {url!r}")
    host = parts.hostname
    if not host:
        raise TransferError(ErrorCode.BAD_URL, f"URL has no host: {url!r}")
    default = _DEFAULT_PORTS[scheme]
    port = port or default
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    if not (target.isascii() and target.isprintable()) or " " in target:
        target = quote(target, safe=_SAFE_TARGET)
    host_header = f"[{host}]" if ":" in host else host
    if port != default:
        host_header = f"{host_header}:{port}"
    return (scheme, host, port), target, host_header


def content_range_ok(value: bytes | None, start: int) -> bool:
    """Does ``Content-Range: bytes START-END/TOTAL`` continue exactly at ``start``?"""
    if not value or not value.startswith(b"bytes "):
        return False
    span, _, total = value[6:].partition(b"/")
    first, _, last = span.partition(b"-")
    try:
        first_i, last_i = int(first), int(last)
        total_i = None if total.strip() == b"*" else int(total)
    except ValueError:
        return False
    return first_i == start and last_i >= first_i and total_i in (None, last_i + 1)


class RestartTransfer(TransferError):
    """A resumed transfer cannot continue (mismatched Content-Range): start over from zero.

    Not the server's failure and not counted as an attempt.
    """

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.PROTOCOL, message)

    def __reduce__(self) -> tuple[type[RestartTransfer], tuple[str]]:
        return (RestartTransfer, (self.message,))


class Redirected(TransferError):
    """Not an error: the job moves to ``location`` (raised when the body is not worth reading)."""

    def __init__(self, location: str) -> None:
        super().__init__("redirect", location)
        self.location = location

    def __reduce__(self) -> tuple[type[Redirected], tuple[str]]:
        return (Redirected, (self.location,))


class Job:
    __slots__ = (
        "attempts",
        "cross_origin",
        "final",
        "first_start",
        "fresh",
        "origin",
        "redirect_to",
        "redirects",
        "rel_path",
        "resume_from",
        "row",
        "stale_retries",
        "target",
        "url",
        "validator",
    )

    def __init__(self, row: Row, origin: Origin, target: str, rel_path: str, final: str) -> None:
        self.row = row
        self.url = row.url  # the current URL: differs from row.url after a redirect
        self.redirects = 0
        self.redirect_to: str | None = None  # set by a 3xx head, followed when it completes
        self.cross_origin = False  # a redirect left the first origin: no credentials
        self.origin = origin
        self.target = target
        self.rel_path = rel_path
        self.final = final  # absolute final path
        self.attempts = 0
        self.stale_retries = 0
        self.fresh = False  # must not reuse a kept-alive connection (see Engine._dispatch)
        self.first_start = 0.0
        self.resume_from = 0  # bytes already in the .part: ask for the rest with Range
        self.validator: str | None = None  # ETag / Last-Modified for If-Range

    @property
    def final_url(self) -> str | None:
        """The URL after redirects, or None when it is the row's own."""
        return self.url if self.url != self.row.url else None

    def expected_digests(self) -> dict[str, str]:
        row = self.row
        digests = {}
        if row.sha256:
            digests["sha256"] = row.sha256
        if row.md5:
            digests["md5"] = row.md5
        return digests
