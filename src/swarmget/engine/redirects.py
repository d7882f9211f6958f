"""Where a redirect may lead: only http(s), within a hop limit, no silent downgrade."""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urljoin, urlsplit

from swarmget.engine.job import Job
from swarmget.engine.urls import control_inside, hide_userinfo
from swarmget.errors import ErrorCode, TransferError
from swarmget.options import Options
from swarmget.sources.rows import strip_url

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# Followed only when they name a Location, as curl -L follows them: 300
# (Multiple Choices: the Location is the server's preferred choice, RFC 9110
# section 15.4.1) and the 3xx codes with no meaning of their own, read as 300
# (section 15).  Not 304 (no body to follow), nor 305 and 306 (Use Proxy,
# deprecated for what following it could do).
OPTIONAL_REDIRECTS: Final = frozenset(range(300, 400)) - REDIRECT_STATUSES - {304, 305, 306}
# "http:" and what follows it, the slashes (and backslashes) apart.
_SPECIAL: Final = re.compile(r"(?i)(https?):([/\\]*)(.*)", re.DOTALL)
# "//", "http://?q", "https://#f": an authority that names no host.
_NO_HOST: Final = re.compile(r"(?i)(?:https?:)?//(?:[/?#]|$)")


def redirect_target(job: Job, location: bytes, options: Options) -> str:
    """The URL a 3xx sends ``job`` to, or a ``bad_redirect``/``too_many_redirects`` error."""
    # Messages quote the Location without its user:password (never the parser's
    # reason either, which may quote a piece of it).
    text = location_text(location)
    if job.redirects >= options.max_redirects:
        shown = hide_userinfo(text)
        raise TransferError(
            ErrorCode.TOO_MANY_REDIRECTS,
            f"more than {options.max_redirects} redirects (last to {shown!r})",
        )
    control = control_inside(text)
    if control is not None:
        # urljoin drops tabs and line breaks without a word: "/a<TAB>b.jpg" asked
        # for /ab.jpg, another file, and saved it as this row's.  curl refuses
        # such a Location, as we refuse such a URL in a list (bad_url).
        raise TransferError(
            ErrorCode.BAD_REDIRECT,
            f"redirect to a URL with {control} inside it ({hide_userinfo(text)!r})",
        )
    form = _authority_form(text, job.origin[0])
    if _NO_HOST.match(form):
        # urljoin takes the page's host for the missing one: "http://?q" asked
        # the page itself with another query, "http://" looped.  curl refuses.
        raise TransferError(
            ErrorCode.BAD_REDIRECT, f"redirect to a URL with no host ({hide_userinfo(text)!r})"
        )
    try:
        target = resolve_reference(job.url, form)
        scheme = urlsplit(target).scheme.lower()
    except ValueError as exc:  # e.g. "http://[not-an-address]/": urlsplit checks brackets
        shown = hide_userinfo(text)
        reason = f": {exc}" if shown == text else ""
        raise TransferError(
            ErrorCode.BAD_REDIRECT, f"redirect to an invalid URL ({shown!r}){reason}"
        ) from None
    if scheme not in ("http", "https"):
        # file:, ftp:, data:... are never followed, and nothing local is read.
        raise TransferError(ErrorCode.BAD_REDIRECT, f"redirect to a {scheme or 'relative'} URL")
    if job.origin[0] == "https" and scheme == "http" and not options.allow_downgrade:
        raise TransferError(
            ErrorCode.BAD_REDIRECT,
            f"redirect from https to http refused ({hide_userinfo(target)}); "
            "--allow-downgrade permits it",
        )
    return target


def resolve_reference(base: str, reference: str) -> str:
    """``reference`` resolved against ``base`` (RFC 3986 section 5.2), where urljoin
    differs: it reads an empty query as none, so ``?`` took the base's query
    (the page asked for again, where a server dropping a token or a tracking
    query meant another URL) and ``x?`` lost its ``?``, which a URL in a list
    keeps.  And the result keeps the base's fragment when the reference has
    none of its own (RFC 9110 section 10.2.2), as browsers keep it."""
    head, hash_mark, _ = reference.partition("#")
    if head.startswith("?"):
        # The base's path with the reference's query, however empty.
        target = base.partition("#")[0].partition("?")[0] + reference
    else:
        target = urljoin(base, reference)
        if "?" in head and "?" not in target.partition("#")[0]:
            path, mark, fragment = target.partition("#")
            target = f"{path}?{mark}{fragment}"
    if not hash_mark and "#" in base and "#" not in target:
        target += "#" + base.partition("#")[2]
    return target


def _authority_form(text: str, scheme: str) -> str:
    """``text`` as browsers (the WHATWG URL standard) and curl read an http(s) URL
    with too many, too few or backward slashes: ``http:///host/x`` and
    ``http:\\\\host\\x`` name ``host``, and so does ``https:/host/x`` from a page on
    http.  urljoin read them as paths on the current host (with whatever
    user:password they held, in the path).  Only ``http:/x`` and ``http:x`` from
    a page on http stay relative, as the standard has them; ``///host/x``, which
    urljoin read as the path ``/host/x``, names ``host`` too (curl agrees)."""
    match = _SPECIAL.match(text)
    if match is None:
        if text.startswith("///"):
            return "//" + text.lstrip("/")
        return text
    given, slashes, rest = match.groups()
    if given.lower() == scheme and len(slashes) < 2:
        return text
    if slashes == "//":
        return text  # the usual form
    return f"{given}://{rest}"


def location_text(location: bytes) -> str:
    """A ``Location`` value as the URL text it means.

    Servers send non-ASCII in it raw.  Mostly that is UTF-8, which browsers and
    curl read as such: ``/caf\xc3\xa9.jpg`` is ``/café.jpg``, requested as
    ``/caf%C3%A9.jpg`` (engine/urls.py percent-encodes the target as UTF-8).
    Bytes that are not UTF-8 (an old server's Latin-1) are kept as they came,
    each non-ASCII byte percent-encoded: the server gets its own bytes back.
    Reading every value as Latin-1, as we used to, requested UTF-8 names as
    ``/caf%C3%83%C2%A9.jpg``: a 404 for a file that is there.
    """
    try:
        text = location.decode("utf-8")
    except UnicodeDecodeError:
        text = "".join(chr(b) if b < 0x80 else f"%{b:02X}" for b in location)
    return strip_url(text)
