"""URLs as the engine needs them: origin, request target, Host header, credentials.

The URL of a row is attacker-controlled (lists are scraped, servers redirect),
so everything that goes on the wire is checked or escaped here: the scheme
must be http(s), the request target is percent-encoded until it can only be
one printable ASCII token (a URL can never inject a header), and
``user:password@`` becomes a ``Authorization: Basic`` header for that origin
only (as curl does), never part of what is sent or recorded in clear:
:func:`redact` removes the password from every URL that reaches the manifest,
a message or a log.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from typing import Final
from urllib.parse import quote, unquote, unquote_to_bytes, urlsplit

from swarmget.errors import ErrorCode, TransferError
from swarmget.net.address import bare_host
from swarmget.sources.rows import MAX_URL, hide_password, strip_url

Origin = tuple[str, str, int]  # (scheme, host, port): the key of a connection pool

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Characters allowed unescaped in a request target; anything else (spaces,
# controls, non-ASCII) is percent-encoded so a URL can never inject a header.
_SAFE_TARGET = "/?#[]@!$&'()*+,;=:%-._~"
# What a host name may not hold: controls, space, DEL, and the characters curl's
# URL parser refuses in one (lib/urlapi.c, hostname_check).
_BAD_HOST = re.compile(r"[\x00-\x20\x7f/:#?!@{}\[\]\\$'\"^`*<>=;,+&()%|]")
_ZONE = re.compile(r"[A-Za-z0-9._~-]+")  # an IPv6 zone id (fe80::1%eth0)
# Controls inside a URL (its ends are trimmed): urlsplit silently drops tabs and
# line breaks (``/a.jpg<TAB>a cat`` became ``/a.jpga cat``), and the other
# controls were escaped and sent.  curl refuses all of them, as http.client does.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_NAMES: Final = {"\t": "a tab", "\n": "a line break", "\r": "a carriage return"}


class Location:
    """A parsed absolute http(s) URL: where to connect and what to ask for."""

    __slots__ = ("authorization", "host_header", "origin", "target")

    def __init__(
        self, origin: Origin, target: str, host_header: str, authorization: str | None
    ) -> None:
        self.origin = origin
        self.target = target  # the request target (path and query), safe to send
        self.host_header = host_header
        # "Basic ..." from user:password@ in the URL, for this origin only.
        self.authorization = authorization


ORIGINS_CACHED: Final = 4096  # scheme://authority prefixes a UrlSplitter remembers


class UrlSplitter:
    """:func:`split_url` with a cache per ``scheme://authority/`` prefix.

    Bulk lists put thousands of URLs on one origin; parsing the authority once
    per origin instead of once per URL takes ``urlsplit`` off the per-file path.
    """

    def __init__(self) -> None:
        self._origins: dict[str, Location] = {}

    def split(self, url: str) -> Location:
        cut = url.find("/", url.find("://") + 3) if "://" in url else -1
        if cut > 0 and ("?" in url[:cut] or "#" in url[:cut]):
            # ``http://h?q=/a``: the authority ends at the ``?``, and the ``/`` is
            # the query's.  Cached under ``http://h?q=``, the next URL with that
            # prefix (``http://h?q=/b``) would be sent as ``GET /b``.
            cut = -1
        if cut > 0 and len(url) <= MAX_URL:
            known = self._origins.get(url[:cut])
            if known is not None:
                target = url[cut:]
                if "#" in target:
                    target = target.partition("#")[0]
                if (
                    target.isascii()
                    and target.isprintable()
                    and " " not in target
                    and "/." not in target
                ):
                    return Location(known.origin, target, known.host_header, known.authorization)
        location = split_url(url)
        if cut > 0 and url[:cut].isascii():
            if len(self._origins) >= ORIGINS_CACHED:
                # A list over many hosts: a cache, not a record of every host
                # (memory must not grow with the list); start it afresh.
                self._origins.clear()
            self._origins[url[:cut]] = location
        return location


def _too_long(url: str) -> TransferError:
    """A URL over MAX_URL: servers refuse far shorter ones (414).  Sent, a 50 MB
    one went out four times, and its message repeated all of it."""
    shown = redact(url[:80])
    return TransferError(
        ErrorCode.BAD_URL,
        f"URL is {len(url):,} characters long (at most {MAX_URL:,}): {shown!r}...",
    )


def split_url(url: str) -> Location:
    """Parse an absolute http(s) URL; raises TransferError ``bad_url``."""
    if len(url) > MAX_URL:
        raise _too_long(url)
    if not url.isascii():
        try:
            url.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: bytes that were never text
            shown = url.encode("utf-8", "backslashreplace").decode("ascii", "replace")
            raise TransferError(ErrorCode.BAD_URL, f"URL is not valid text: {shown!r}") from None
    stripped = strip_url(url)
    control = control_inside(stripped)
    if control is not None:
        raise TransferError(ErrorCode.BAD_URL, _control_message(control, url))
    try:
        parts = urlsplit(stripped)
        port = parts.port
    except ValueError as exc:
        raise TransferError(ErrorCode.BAD_URL, f"invalid URL {redact(url)!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise TransferError(ErrorCode.BAD_URL, f"not an http(s) URL: {redact(url)!r}")
    host = parts.hostname
    if not host:
        raise TransferError(
            ErrorCode.BAD_URL, f"URL has no host: {redact(url)!r}{_slashes_hint(stripped)}"
        )
    _check_brackets(parts.netloc.rpartition("@")[2], host, url)
    host = wire_host(host, url)
    default = _DEFAULT_PORTS[scheme]
    if port is None:
        port = default
    elif port == 0:  # nothing can be reached there; it is not "the default port"
        raise TransferError(ErrorCode.BAD_URL, f"port 0 in URL {redact(url)!r}")
    target = parts.path or "/"
    if "/." in target:
        target = remove_dot_segments(target)
    if parts.query or "?" in stripped.partition("#")[0]:
        # An empty query (``a.jpg?``) is sent as it is, as curl sends it (and as
        # UrlSplitter's cached path did: the same row went out two ways).
        target = f"{target}?{parts.query}"
    if not (target.isascii() and target.isprintable()) or " " in target:
        target = quote(target, safe=_SAFE_TARGET)
    # An IPv6 literal in brackets, without its zone id: the zone names an
    # interface of this machine, which means nothing to the server (RFC 6874).
    host_header = f"[{bare_host(host)}]" if ":" in host else host
    if port != default:
        host_header = f"{host_header}:{port}"
    authorization = None
    if parts.username is not None:
        # The bytes the escapes spell, whatever their encoding (``p%E4ss`` is
        # Latin-1): decoded as UTF-8 first, they became U+FFFD and the wrong
        # credentials.  Unescaped non-ASCII text goes as its UTF-8.
        user = unquote_to_bytes(parts.username)
        password = unquote_to_bytes(parts.password or "")
        token = base64.b64encode(user + b":" + password).decode("ascii")
        authorization = f"Basic {token}"
    return Location((scheme, host, port), target, host_header, authorization)


# "http:" followed by other than two forward slashes: "http:/h/x", "http:///h/x", "http:\\h".
_ODD_SLASHES: Final = re.compile(r"(?i)https?:(?!//(?!/))[/\\]*[^/\\]")


def _slashes_hint(url: str) -> str:
    """Why a URL such as ``http:///h/x`` has no host, said, since the host is
    there to see (browsers and curl take it; a list that holds it is damaged)."""
    if _ODD_SLASHES.match(url) is None:
        return ""
    return " (a host comes after exactly two slashes: http://host/...)"


def control_inside(text: str) -> str | None:
    """What the first control character in ``text`` is ("a tab"), or None when it has none."""
    control = _CONTROL.search(text)
    if control is None:
        return None
    return _CONTROL_NAMES.get(control.group(), f"control character U+{ord(control.group()):04X}")


def _control_message(control: str, url: str) -> str:
    hint = " (a TSV list without a header line?)" if control == _CONTROL_NAMES["\t"] else ""
    return f"{control} inside the URL {redact(url)!r}{hint}"


def _check_brackets(authority: str, host: str, url: str) -> None:
    """Brackets in the authority hold an IPv6 address and nothing else: urlsplit
    reads ``[::1]]:80`` as ``[::1]:80`` and ``[v1.x]`` as the name ``v1.x``
    (curl refuses both)."""
    if "[" not in authority and "]" not in authority:
        return
    inside, _, after = authority.partition("]")
    if (
        not inside.startswith("[")
        or inside.count("[") != 1
        or "[" in after
        or "]" in after
        or after[:1] not in ("", ":")
    ):
        raise TransferError(ErrorCode.BAD_URL, f"junk around the IPv6 address: {redact(url)!r}")
    if ":" not in host:
        raise TransferError(ErrorCode.BAD_URL, f"not an IPv6 address in brackets: {redact(url)!r}")


def remove_dot_segments(path: str) -> str:
    """``path`` without its ``.`` and ``..`` segments (RFC 3986 section 5.2.4), as
    curl and browsers send it: ``/a/b/../c/./d`` is ``/a/c/d``, and ``/../c`` is
    ``/c`` (nginx answers 400 to a path that climbs above the root)."""
    segments = path.split("/")
    out: list[str] = []
    for segment in segments[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    if segments[-1] in (".", ".."):
        out.append("")  # ``/a/b/..`` is the directory ``/a/``
    return "/" + "/".join(out)


def wire_host(host: str, url: str) -> str:
    """``host`` as DNS, TLS and the ``Host`` header take it: ASCII, an international
    name in its IDNA form (``xn--...``, as curl sends it), and nothing a host name
    cannot hold (curl's list: controls, spaces, ``/ # ? @ % ...``), which would
    otherwise reach the wire or the resolver.  ``url`` is for the message."""
    if ":" in host:  # an IPv6 literal: urlsplit has checked its brackets
        address, percent, zone = host.partition("%")
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise TransferError(
                ErrorCode.BAD_URL, f"invalid IPv6 address {host!r} in {redact(url)!r}"
            ) from None
        if not percent:
            return host
        # A zone id is written ``%25eth0`` (RFC 6874: the ``%`` itself escaped);
        # curl also takes a bare ``%eth0``.  It travels as ``fe80::1%eth0`` to the
        # resolver (which turns it into the socket's scope id) and nowhere else.
        if zone.startswith("25"):
            zone = zone[2:]
        if not _ZONE.fullmatch(zone):
            raise TransferError(ErrorCode.BAD_URL, f"invalid IPv6 zone in {redact(url)!r}")
        return f"{address}%{zone}"
    if "%" in host:
        # ``http://%67ood.test/`` is good.test to curl and browsers (WHATWG
        # percent-decodes a host); what it decodes to is checked below.
        try:
            host = unquote(host, errors="strict").lower()
        except UnicodeDecodeError:
            raise TransferError(
                ErrorCode.BAD_URL,
                f"host {host!r} escapes bytes that are not UTF-8: {redact(url)!r}",
            ) from None
    if not host.isascii():
        try:
            host = idna_host(host)
        except UnicodeError as exc:
            raise TransferError(
                ErrorCode.BAD_URL,
                f"host {host!r} is not a valid international domain name ({exc}): {redact(url)!r}",
            ) from None
    bad = _BAD_HOST.search(host)
    if bad is not None:
        raise TransferError(
            ErrorCode.BAD_URL,
            f"host {host!r} holds {bad.group()!r}, which no host name can: {redact(url)!r}",
        )
    return ipv4_normalize(host) or host


def idna_host(host: str) -> str:
    """An international name in the ASCII form curl and browsers send: IDNA2008
    with UTS #46 non-transitional mapping (``faß.de`` is ``xn--fa-hia.de``; the
    standard library's IDNA2003 codec made it ``fass.de``, another domain).  A
    name IDNA2008 refuses but IDNA2003 takes (symbols, emoji: curl falls back
    the same way) goes by the codec.  Raises UnicodeError for neither."""
    import idna  # only for non-ASCII hosts: its tables take a while to import

    try:
        return idna.encode(host, uts46=True, transitional=False).decode("ascii")
    except idna.IDNAError:
        return host.encode("idna").decode("ascii")


_IPV4_PART = re.compile(r"0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*")


def ipv4_normalize(host: str) -> str | None:
    """``host`` as a dotted-quad IPv4 address if it is one in any of the forms
    curl reads (``127.1``, ``0x7f.0.0.1``, ``0177.0.0.1``, ``2130706433``: one to
    four parts, each decimal, octal with a leading 0 or hex with 0x, the last
    filling the bytes left), else None: a name.

    The resolver read these otherwise (c-ares takes ``0177`` as decimal 177): the
    same URL reached another machine than with curl, and ``127.1`` went to DNS.
    """
    parts = host.split(".")
    if len(parts) > 4:
        return None
    values: list[int] = []
    for part in parts:
        if not _IPV4_PART.fullmatch(part):
            return None
        if part[:2] in ("0x", "0X"):
            values.append(int(part[2:], 16))
        elif len(part) > 1 and part[0] == "0":
            values.append(int(part, 8))
        else:
            values.append(int(part))
    *leading, last = values
    if any(value > 0xFF for value in leading) or last >= 1 << (8 * (4 - len(leading))):
        return None  # curl: then it is a name
    address = last
    for place, value in enumerate(leading):
        address |= value << (8 * (3 - place))
    return str(ipaddress.IPv4Address(address))


def redact(url: str) -> str:
    """``url`` without the password of a ``user:password@`` part (``user:***@``)."""
    if "@" not in url:
        return url
    start = url.find("://")
    if start < 0:
        # No scheme: a row that is a URL without one (user:secret@host/x), a
        # bad_url, whose password may hold a "/" (sources/rows.py); a user name
        # alone (a token) is hidden below, the authority beginning the text.
        hidden = hide_password(url)
        if hidden != url:
            return hidden
        start = 0
    else:
        start += 3
    end = len(url)
    for stop in "/?#":
        found = url.find(stop, start)
        if 0 <= found < end:
            end = found
    at = url.rfind("@", start, end)
    if at < 0:
        return url
    colon = url.find(":", start, at)
    if colon < 0:
        # A user name alone is often the secret (an API token: https://TOKEN@host/).
        return f"{url[:start]}***{url[at:]}"
    return f"{url[: colon + 1]}***{url[at:]}"


def hide_userinfo(url: str) -> str:
    """``url`` -- any URL text, parsed or not, absolute or ``//host`` -- without its
    ``user:password@`` part (``***@``), for a message.

    Unlike :func:`redact`, it does not trust the first ``/`` to end the
    authority: a password may hold an unencoded ``/`` (``u:pa/ss@h``).  An
    ``@`` after the first ``/`` is taken for the path's (``/@scope/pkg``)
    unless a ``user:`` comes before that ``/`` and is not a port.
    """
    slashes = url.find("//")
    at = url.rfind("@")
    if slashes < 0 or at < slashes:
        return url
    start = slashes + 2
    end = min((i for i in (url.find(c, start) for c in "/?#") if i >= 0), default=len(url))
    in_authority = url.rfind("@", start, end)
    if in_authority >= 0 and _host_and_port(url, in_authority + 1, end):
        at = in_authority  # what the URL itself sends as user:password (or a token)
    elif in_authority < 0 and _host_and_port(url, start, end):
        # No @ before the first "/", and what is there reads as a host (and a
        # port): the @ is the path's or the query's.
        return url
    # Else a password holding a "/" put the @ past the first "/" (what is before
    # it, a "user:pass", is no host:port): all of it up to the last @ goes.
    return f"{url[:start]}***{url[at:]}"


def _host_and_port(url: str, start: int, end: int) -> bool:
    """Does ``url[start:end]`` read as a host with at most a numeric port (a name,
    or an [IPv6] literal, whose colons are its own)?"""
    bracket = url.rfind("]", start, end)
    colon = url.find(":", bracket + 1 if bracket >= 0 else start, end)
    return colon < 0 or url[colon + 1 : end].isdigit()


_URL_IN_TEXT: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()]*@[^\s'\"<>()]*")


def redact_text(text: str) -> str:
    """``text`` (a message) with the ``user:password@`` of every URL it quotes hidden:
    a last guard, for messages built from URLs that :func:`hide_userinfo` did
    not see first (those that quote one should use it: a quote or a space in a
    password ends what this can recognise as a URL)."""
    if "@" not in text:
        return text
    return _URL_IN_TEXT.sub(_hide_match, text)


def _hide_match(match: re.Match[str]) -> str:
    return hide_userinfo(match.group(0))


def redact_failure(url: str, error: TransferError) -> tuple[str, str]:
    """The (already :func:`redact`-ed) URL of a row that failed before any request,
    and the message of ``error``, as they may be shown.  A URL that did not
    parse (``bad_url``) may still hold a password: one with an unencoded ``/``,
    ``?`` or ``#`` breaks the URL where :func:`redact` looks for it (it reads as
    a port, a path), so here everything up to the URL's last ``@`` goes; and
    the parser's reason quotes pieces of it, so the message says less."""
    message = error.message
    if error.code != ErrorCode.BAD_URL:
        return url, message
    start = url.find("://")
    at = url.rfind("@")
    if start < 0 or at < start:
        return url, message
    start += 3
    colon = url.find(":", start, at)
    end = min((i for i in (url.find(c, start) for c in "/?#") if i >= 0), default=len(url))
    if colon < 0 or colon > end or url[colon + 1 : end].isdigit():
        # No "user:" before the path, or only a port there: the @ is the
        # path's or the query's (http://h:99999/@user/x), not a password's end.
        return url, message
    return f"{url[:start]}***{url[at:]}", "invalid URL (a user:password part is hidden)"
