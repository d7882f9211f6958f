"""Which proxy, if any, carries a request: ``--proxy``, ``$http_proxy`` & co, ``no_proxy``.

Theory of operation
-------------------
A run decides once, before it starts, where each origin's connections go; the
engine asks :meth:`ProxySettings.for_origin` when it creates an origin's pool
and never again, so a run with no proxy pays nothing per request
(:func:`proxy_settings` returns None then, and the engine checks only that).

* **Where the proxy comes from.**  An explicit ``proxy`` (``--proxy URL``)
  serves both schemes; ``""`` means "no proxy", whatever the environment says.
  Otherwise, with ``trust_env`` (the default), the environment is read as curl
  and Python's urllib read it: ``http_proxy`` for http URLs, ``https_proxy`` for
  https URLs, ``all_proxy`` for either when the scheme's own is unset; the
  lower-case name wins over the upper-case one; empty values count as unset.
  ``HTTP_PROXY`` is ignored when ``REQUEST_METHOD`` is set: under CGI it holds
  the *client's* ``Proxy:`` header ("httpoxy"), as urllib and requests treat it.
* **Proxy URLs.**  ``http://[user:password@]host[:port]``; a URL without a
  scheme is taken as http, and without a port as port 1080, both as curl does.
  User and password are percent-decoded and sent as ``Proxy-Authorization:
  Basic``.  Only http proxies exist here (no TLS to the proxy, no SOCKS): any
  other scheme is never a silent direct connection.  Given with ``--proxy``,
  it is a :class:`UsageError` naming the option.  Found in the environment
  (set for other programs, often a SOCKS proxy in ``all_proxy``), it fails
  only the rows that would go through it, each with ``connect`` and a
  message that says how to go direct (as requests fails each request); an
  http-only list never sees an unusable ``https_proxy``, nor a list every
  host of which ``no_proxy`` exempts.
* **no_proxy** (``--no-proxy`` or ``$no_proxy``/``$NO_PROXY``, the option
  winning even when empty): comma- or space-separated; ``*`` alone turns proxies
  off; a name matches itself and every name under it (``example.com`` and
  ``.example.com`` both match ``example.com`` and ``www.example.com``, not
  ``notexample.com``); IP addresses and CIDR networks (``10.0.0.0/8``, ``::1``)
  match IP-literal hosts; ``host:port`` limits an entry to one port.  As with
  curl, names are not resolved for matching, and ``localhost``/127.0.0.1 are
  proxied like any other host unless listed.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from urllib.parse import unquote_to_bytes, urlsplit

from swarmget.errors import UsageError

DEFAULT_PROXY_PORT = 1080  # curl's, for a proxy URL without a port
_SEPARATORS = re.compile(r"[\s,]+")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclasses.dataclass(frozen=True, slots=True)
class Proxy:
    """An http proxy: where to connect, and the ``Proxy-Authorization`` value if any."""

    host: str
    port: int
    authorization: str | None = None  # "Basic <base64 of user:password>"
    source: str = "--proxy"  # where it was configured, for messages
    # Set: not a proxy we can use (from the environment); why, for the rows
    # that would have gone through it.
    problem: str | None = None

    def __str__(self) -> str:
        """``host:port``: what messages show (never the credentials)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_proxy_url(text: str, source: str = "--proxy") -> Proxy | None:
    """The :class:`Proxy` for ``text``, None for an empty string; UsageError if unusable."""
    text = text.strip()
    if not text:
        return None
    url = text if "://" in text else f"http://{text}"
    shown = _redact(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        # The parser's reason quotes pieces of the URL: of the password, maybe.
        reason = "a user:password part is hidden" if "@" in url else str(exc)
        raise UsageError(f"{source} {shown!r}: invalid proxy URL ({reason})") from None
    scheme = parts.scheme.lower()
    if scheme != "http":
        raise UsageError(
            f"{source} {shown!r}: {scheme}:// proxies are not supported (only http://)"
        )
    host = parts.hostname
    if not host:
        raise UsageError(f"{source} {shown!r}: the proxy URL has no host")
    authorization = None
    if parts.username is not None:
        # The bytes the escapes spell, as for an origin's user:password@
        # (engine/urls.py): ``caf%E9`` is Latin-1, not U+FFFD.
        pair = unquote_to_bytes(parts.username) + b":" + unquote_to_bytes(parts.password or "")
        authorization = "Basic " + base64.b64encode(pair).decode("ascii")
    return Proxy(host, port or DEFAULT_PROXY_PORT, authorization, source)


def _redact(url: str) -> str:
    """``url`` with everything before its last ``@`` hidden, fit for an error
    message: a proxy URL has no path worth showing, and a password with an
    unescaped ``/`` or ``?`` in it would end the authority early."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    return f"{scheme}{sep}{rest}"


class NoProxy:
    """A parsed ``no_proxy`` list: which hosts go direct even when a proxy is set."""

    __slots__ = ("everything", "names", "networks")

    def __init__(self, text: str) -> None:
        self.everything = False
        self.names: list[tuple[str, int | None]] = []
        self.networks: list[tuple[IPNetwork, int | None]] = []
        if text.strip() == "*":
            self.everything = True  # as curl: "*" alone; in a list it matches nothing
            return
        for token in _SEPARATORS.split(text.strip()):
            if token and token != "*":
                self._add(token)

    def _add(self, token: str) -> None:
        host, port = token, None
        if token.startswith("["):  # [IPv6] or [IPv6]:port
            host, _, rest = token[1:].partition("]")
            port = _port(rest[1:]) if rest.startswith(":") else None
        elif token.count(":") == 1:  # name:port or IPv4:port (a bare IPv6 has more colons)
            host, _, rest = token.partition(":")
            port = _port(rest)
        try:
            self.networks.append((ipaddress.ip_network(host, strict=False), port))
        except ValueError:
            name = host.lower().strip(".")
            if name:
                self.names.append((name, port))

    def matches(self, host: str, port: int) -> bool:
        if self.everything:
            return True
        host = host.lower().rstrip(".")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return any(
                (host == name or host.endswith("." + name)) and want in (None, port)
                for name, want in self.names
            )
        return any(
            address.version == net.version and address in net and want in (None, port)
            for net, want in self.networks
        )


def _port(text: str) -> int | None:
    return int(text) if text.isdigit() else None


class ProxySettings:
    """The run's proxies per scheme and its ``no_proxy`` list."""

    __slots__ = ("http", "https", "no_proxy")

    def __init__(self, http: Proxy | None, https: Proxy | None, no_proxy: NoProxy) -> None:
        self.http = http
        self.https = https
        self.no_proxy = no_proxy

    def for_origin(self, scheme: str, host: str, port: int) -> Proxy | None:
        """The proxy for connections to this origin, or None to connect directly."""
        proxy = self.https if scheme == "https" else self.http
        if proxy is None or self.no_proxy.matches(host, port):
            return None
        return proxy


def proxy_settings(
    proxy: str | None,
    no_proxy: str | None = None,
    trust_env: bool = True,
    environ: Mapping[str, str] | None = None,
) -> ProxySettings | None:
    """The run's proxy settings, or None when no request can use a proxy.

    Raises :class:`UsageError` for a proxy URL (option or environment) we cannot use.
    """
    env = os.environ if environ is None else environ
    if proxy is not None:
        http = https = parse_proxy_url(proxy, "--proxy")
    if no_proxy is None:
        no_proxy = _first_set(env, ("no_proxy", "NO_PROXY")) if trust_env else ""
    rules = NoProxy(no_proxy or "")
    if rules.everything:
        return None  # before the environment's proxies are read: none is used
    if proxy is None:
        if not trust_env:
            return None
        http = _proxy_from_env(env, "http")
        https = _proxy_from_env(env, "https")
    if http is None and https is None:
        return None
    return ProxySettings(http, https, rules)


def _proxy_from_env(env: Mapping[str, str], scheme: str) -> Proxy | None:
    names = [f"{scheme}_proxy", f"{scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY"]
    if scheme == "http" and "REQUEST_METHOD" in env:
        names.remove("HTTP_PROXY")  # under CGI it is the client's Proxy: header (httpoxy)
    for name in names:
        value = env.get(name, "").strip()
        if value:
            try:
                return parse_proxy_url(value, f"${name}")
            except UsageError as exc:
                # Set for other programs: it fails only the rows it would carry.
                problem = (
                    f"cannot use {exc}; set no_proxy for these hosts, or go direct "
                    "with --proxy '' (proxy='' in Python)"
                )
                return Proxy("", 0, source=f"${name}", problem=problem)
    return None


def _first_set(env: Mapping[str, str], names: tuple[str, ...]) -> str:
    for name in names:
        value = env.get(name, "")
        if value.strip():
            return value
    return ""
