"""Run options: one immutable value shared by the API, the CLI and the engine.

Defaults are chosen for "many files from a few hosts, politely":

* ``concurrency=128`` connections in total: enough to saturate a 1 Gbit/s link
  with 50 KB files at 20 ms RTT, small enough not to exhaust file descriptors.
* ``per_host=32``: a single origin never gets more than this many connections.
* ``timeout=30`` s for connect and for silence while reading.
* HTTPS certificates are verified against the system store (or the
  ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` that replace it), plus ``cacert``;
  ``insecure=True`` turns verification off, with a warning.
* ``dns_servers=()``: the system's name servers (``/etc/resolv.conf``); set
  them ("1.2.3.4", "1.2.3.4:5353", "[::1]:53") to bypass it, as tests do.
* ``proxy=None``: proxies from ``http_proxy`` / ``https_proxy`` / ``all_proxy``
  (and ``no_proxy``) when ``trust_env``, as curl reads them; a URL
  (``http://[user:pass@]host:port``) for both schemes; ``""`` for none.
  ``no_proxy`` (a comma list, ``*`` for all) replaces ``$no_proxy`` when set.
  See ``net/proxy.py``.
* ``deadline=None``: a file may take an hour in total, or, when its body is
  announced longer than an hour takes at 256 KiB/s (900 MiB), as long as its
  length takes at that rate (a 20 GiB model gets 22 hours, not the hour that
  cut it at 5 MB/s, as no peer would); a number is a strict limit, as ``curl
  -m``.  With ``min_speed=1024`` B/s averaged over ``min_speed_window=30`` s: a
  server that stalls is cut by ``timeout``; one that drip-feeds a byte at a time
  is cut by the speed rule; nothing can hang a run.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import numbers
import os
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any, ClassVar, Final

from swarmget.errors import UsageError
from swarmget.net.proxy import parse_proxy_url


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    concurrency: int = 128
    per_host: int = 32
    timeout: float = 30.0
    deadline: float | None = None  # seconds per file; None: AUTO_DEADLINE (deadline_for)
    min_speed: int = 1024
    min_speed_window: float = 30.0
    max_size: int | None = None
    retries: int = 3
    # Give a host up after this many failed connections, or pauses for 429, in a row; 0: never.
    host_failures: int = 5
    overwrite: bool = False
    dedupe: bool = False  # fetch each distinct URL once; other rows get a link to its file
    workers: int = 0  # processes, each with its own event loop; 0 = one per CPU
    max_redirects: int = 10
    allow_downgrade: bool = False  # follow https -> http redirects
    hash: str | None = None  # "sha256" or "md5": record each file's digest in the manifest
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    user_agent: str = "swarmget/0.1"
    dns_servers: tuple[str, ...] = ()
    cacert: str | None = None  # a PEM CA file trusted on top of the system store
    insecure: bool = False  # do not verify TLS certificates (warns once on stderr)
    proxy: str | None = None  # http://[user:pass@]host:port; None: from the environment
    no_proxy: str | None = None  # hosts that go direct; None: from the environment
    trust_env: bool = True  # read the proxy environment variables

    # With no deadline given: what a file may take (see the module docstring).
    AUTO_DEADLINE: ClassVar[float] = 3600.0
    AUTO_DEADLINE_RATE: ClassVar[int] = 256 * 1024  # bytes/s

    def __post_init__(self) -> None:
        servers: object = self.dns_servers  # callers pass lists, or one bare string
        servers = (servers,) if isinstance(servers, str) else tuple(self.dns_servers)
        object.__setattr__(self, "dns_servers", servers)
        for server in self.dns_servers:
            check_dns_server(server)
        for name in _WHOLE_FIELDS:
            value = getattr(self, name)
            if value is not None or name != "max_size":
                object.__setattr__(self, name, _whole(name, value))
        if not isinstance(self.headers, Mapping):
            raise UsageError("headers must be a mapping of names to values")
        for name, value in (*self.headers.items(), ("User-Agent", self.user_agent)):
            check_header(name, value)
        # One field per name, whatever the case: {"host": .., "Host": ..} sent
        # two Host lines (a 400 by RFC 9112 3.2), {"X-A": .., "x-a": ..} only one.
        object.__setattr__(self, "headers", combine_headers(self.headers.items()))
        for flag, number in (
            ("--timeout", self.timeout),
            ("--deadline", self.first_deadline),
            ("min_speed_window", self.min_speed_window),
        ):
            # NaN passes every "< 0" test and then compares false with everything:
            # a NaN timeout never fired.  (Counts and sizes are whole numbers by
            # now, see _whole: a NaN --max-size refused every file.)
            given: object = number  # as the caller passed it: not narrowed by the types
            if isinstance(given, bool) or not isinstance(given, numbers.Real):
                raise UsageError(f"{flag} must be a number, not {given!r}")
            if not math.isfinite(given):
                raise UsageError(f"{flag} must be a finite number, not {number!r}")
        if self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        if self.per_host < 1:
            raise UsageError("--per-host must be at least 1")
        if self.timeout <= 0:
            raise UsageError("--timeout must be positive")
        if self.first_deadline <= 0:
            raise UsageError("--deadline must be positive")
        if self.min_speed < 0:
            raise UsageError("--min-speed must be >= 0 (0 = no minimum)")
        if self.min_speed_window <= 0:
            raise UsageError("min_speed_window must be positive (seconds)")
        if self.max_size is not None and self.max_size < 0:
            raise UsageError("--max-size must be >= 0")
        if self.hash not in (None, "sha256", "md5"):
            raise UsageError("--hash must be sha256 or md5")
        if self.max_redirects < 0:
            raise UsageError("--max-redirects must be >= 0")
        if self.workers < 0:
            raise UsageError("--workers must be >= 0 (0 = one per CPU)")
        if self.retries < 0:
            raise UsageError("--retries must be >= 0")
        if self.host_failures < 0:
            raise UsageError("--host-failures must be >= 0 (0 = never give a host up)")
        if self.proxy:
            parse_proxy_url(self.proxy)  # raises UsageError naming --proxy

    @property
    def first_deadline(self) -> float:
        """A file's deadline until the length of its body is known."""
        return self.AUTO_DEADLINE if self.deadline is None else self.deadline

    @property
    def long_file_rate(self) -> int:
        """With no deadline given, a body announced longer than ``first_deadline``
        takes at this rate (bytes/s) gets the time it does take; 0: none does."""
        return self.AUTO_DEADLINE_RATE if self.deadline is None else 0

    def check_environment(self) -> None:
        """Check what the options point at, outside themselves: the proxy environment
        variables (when ``trust_env``) and the ``cacert`` file.  Raises UsageError
        naming the variable or the file, so a mistake fails before a run starts."""
        from swarmget.net.proxy import proxy_settings

        proxy_settings(self.proxy, self.no_proxy, self.trust_env)
        if self.cacert is not None:
            from swarmget.net.tls import client_context

            client_context(self.cacert)  # a missing or non-PEM file

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> Options:
        """Build from keyword arguments, rejecting unknown names with a clear error."""
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - set(defaults))
        if unknown:
            raise UsageError(
                f"unknown option(s): {', '.join(unknown)}{_did_you_mean(unknown, defaults)}"
            )
        # None is "the default" (``workers=None``, as stream() takes it), for an
        # option whose default is something else.
        given = {k: v for k, v in kwargs.items() if v is not None or defaults[k] is None}
        for name, value in given.items():
            given[name] = _checked_type(name, value)
        return cls(**given)


def _did_you_mean(unknown: list[str], known: Iterable[str]) -> str:
    """The known option a misspelt one is closest to, said as a hint ("" if none
    is close): ``concurency=8`` was refused without naming ``concurrency``."""
    import difflib

    for name in unknown:
        close = difflib.get_close_matches(name, list(known), n=1)
        if close:
            return f" (did you mean {close[0]}?)"
    return ""


# Yes/no options take a bool: ``overwrite="false"`` is a true value, and it
# replaced a user's file (the compiled build refused it with a TypeError that
# named no option).
_YES_NO_FIELDS = frozenset({"overwrite", "dedupe", "allow_downgrade", "insecure", "trust_env"})
_TEXT_FIELDS = frozenset({"user_agent", "hash", "proxy", "no_proxy"})


def check_yes_no(name: str, value: object) -> None:
    if not isinstance(value, bool):  # "no" is a true value
        raise UsageError(f"{name} must be True or False, not {value!r}")


def _checked_type(name: str, value: object) -> object:
    """``value`` for option ``name`` if it is of the option's kind (a path may be
    any path-like), else a UsageError naming the option."""
    if name in _YES_NO_FIELDS:
        check_yes_no(name, value)
    elif name in _TEXT_FIELDS:
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{name} must be a string, not {value!r}")
    elif name == "cacert" and value is not None:
        if not isinstance(value, (str, os.PathLike)):
            raise UsageError(f"cacert must be a path, not {value!r}")
        return os.fsdecode(os.fspath(value))
    elif name == "dns_servers" and not isinstance(value, str):
        servers = (
            tuple(value) if isinstance(value, Iterable) and not isinstance(value, bytes) else None
        )
        if servers is None or not all(isinstance(server, str) for server in servers):
            raise UsageError(f"dns_servers must be addresses as strings, not {value!r}")
        return servers
    return value


# Counts and sizes: whole numbers (a numpy integer, or a float such as 1e6 that is one).
_WHOLE_FIELDS = (
    "concurrency",
    "per_host",
    "min_speed",
    "max_size",
    "retries",
    "host_failures",
    "workers",
    "max_redirects",
)


# Sizes in bytes, which take "10M" as the CLI's flags do (its parser, parse_size).
_SIZE_FIELDS = frozenset({"max_size", "min_speed"})


def _whole(name: str, value: object) -> int:
    if isinstance(value, str) and name in _SIZE_FIELDS:
        try:
            return parse_size(value)
        except ValueError as bad:
            raise UsageError(f"{name}: {bad}") from None
    if not isinstance(value, bool):  # True is an int, but not a count
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
    flag = "--" + name.replace("_", "-")
    kind = (
        "a whole number of bytes or a size such as '10M'"
        if name in _SIZE_FIELDS
        else "a whole number"
    )
    raise UsageError(f"{flag} must be {kind}, not {value!r}")


# A unit as 10M, 10MB, 10MiB or 10Mi (the IEC prefix alone, as Kubernetes writes
# it: "1GiB" passed and "1Gi" was an invalid size); "ib" without a unit is none.
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgt])i?)?b?\s*", re.IGNORECASE)
_SIZE_SCALE = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """A number of bytes as the CLI's --max-size and --min-speed take it, and the
    API's max_size and min_speed too: ``512`` -> 512, ``512k`` -> 524288,
    ``1.5G`` -> 1610612736 (powers of 1024), rounded to whole bytes; else a
    ValueError saying why.  A fraction of a byte is an error, not 0: ``--max-size
    0.5`` read as 0 failed every file with too_large."""
    match = _SIZE_RE.fullmatch(text)
    if match is None:
        raise ValueError(
            f"invalid size {text!r} (use bytes or a k/M/G/T suffix, e.g. 512k, 10M, 1.5G)"
        )
    number, suffix = match.groups("")
    exact = Fraction(number) * _SIZE_SCALE[suffix.lower()]  # exact: no float rounding
    if exact.denominator != 1 and not suffix:
        raise ValueError(
            f"invalid size {text!r} (a fraction of a byte; give whole bytes, or a unit: 0.5M)"
        )
    if 0 < exact < 1:
        raise ValueError(f"invalid size {text!r} (less than one byte)")
    return round(exact)


HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token
# What a field value may not hold (RFC 9110 5.5): controls other than a tab.
# CR and LF would end the line and start a header of the value's choosing.
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


# Request fields swarmget must write itself: given by the user, they would break
# the framing of a kept-alive connection (nginx read a "Content-Length: 5" GET's
# next request as its body) or contradict the ranges it asks for.
_NO_BODY = "a GET carries no body, and the field would frame the next request"
_RANGES = "swarmget asks for byte ranges itself (resuming a part)"
_OURS: Final = {
    "content-length": _NO_BODY,
    "transfer-encoding": _NO_BODY,
    "expect": _NO_BODY,
    "upgrade": "swarmget speaks HTTP/1.1 on its connections, and refuses a 101",
    "range": _RANGES,
    "if-range": _RANGES,
}


# The fields that carry credentials: never quoted in a message, and kept by
# the engine apart from the other headers (engine/core.py).
SECRET_FIELDS: Final = frozenset({"authorization", "cookie", "proxy-authorization"})


def shown_header(name: object, value: object) -> str:
    """``Name: value`` as a message may quote it: the value of a credential
    hidden (``Authorization: ***``), as a URL's password is.  A token with a
    stray control character in it (a CR from a Windows file, read into
    ``$TOKEN``) was printed whole, into a CI log."""
    if isinstance(name, str) and name.strip().lower() in SECRET_FIELDS:
        return f"{name}: ***"
    return f"{name}: {value}"


def check_header(name: str, value: str) -> None:
    """A request header the user gave: a token for a name, one line of Latin-1
    text (as ``http.client`` and requests encode it) for a value; raise UsageError."""
    shown = shown_header(name, value)
    if not (isinstance(name, str) and HEADER_NAME.fullmatch(name)):
        raise UsageError(f"invalid header {shown!r} (the name must be an HTTP token)")
    if not isinstance(value, str):
        raise UsageError(f"invalid header {shown!r} (the value must be text)")
    bad = _BAD_VALUE.search(value)
    if bad is not None:
        raise UsageError(
            f"invalid header {shown!r} (a line break or control character: "
            f"{bad.group()!r} at character {bad.start() + 1} of the value)"
        )
    try:
        value.encode("latin-1")
    except UnicodeEncodeError as exc:
        raise UsageError(
            f"invalid header {shown!r} (only Latin-1 text can be sent in a header: "
            f"{value[exc.start]!r} at character {exc.start + 1} of the value)"
        ) from None
    why = _OURS.get(name.lower())
    if why is not None:
        raise UsageError(f"header {shown!r} cannot be given: {why}")
    if not value and name.lower() == "host":
        # An empty value takes the header away (curl's "Name:"); an HTTP/1.1
        # request without Host is refused by every server (400).
        raise UsageError(f"header {shown!r} cannot be given: HTTP/1.1 requires a Host")


# What curl's -H "K;" sends: K with an empty value.  Written "K:  ", which is
# that (RFC 9110 5.5: the blank is not part of the value); an empty value
# would send nothing (protocol/request.py).
EMPTY_FIELD = " "

# Request fields that hold one value, not a list (RFC 9110 5.3: they may not be
# sent twice, nor their values joined): given twice, the last one given is
# sent, as an option given twice counts as last given.  Joined, "Host: a, b"
# was a Host every server must refuse (400), "Authorization: Bearer x, Bearer
# y" credentials no scheme reads.
SINGLE_VALUED: Final = frozenset(
    {
        "host",
        "authorization",
        "proxy-authorization",
        "user-agent",
        "referer",
        "from",
        "origin",
        "content-type",
        "date",
        "max-forwards",
        "if-modified-since",
        "if-unmodified-since",
    }
)


def combine_headers(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """One field per name (any case; the first spelling) from repeated headers
    (``--header`` given twice, or names in ``headers`` that differ in case).
    The values of a list field are joined with ", ", which RFC 9110 5.3 makes
    the same as sending each on a line of its own, as curl does ("; " for
    Cookie, RFC 6265 5.4: one Cookie line); a field of one value
    (:data:`SINGLE_VALUED`) keeps the last value given.  A "K:" (take K away)
    adds no value; only a K given no other way stays away."""
    values: dict[str, list[str]] = {}
    spelling: dict[str, str] = {}
    for name, value in pairs:
        values.setdefault(spelling.setdefault(name.lower(), name), []).append(value)
    return {name: _joined(name, given) for name, given in values.items()}


def _joined(name: str, given: list[str]) -> str:
    sent = [value for value in given if value.strip()]
    if sent:
        if name.lower() in SINGLE_VALUED:
            return sent[-1]
        return ("; " if name.lower() == "cookie" else ", ").join(sent)
    return EMPTY_FIELD if EMPTY_FIELD in given else ""


def check_output_dir(root: str) -> None:
    """An output directory no run may use, whatever is there; raise UsageError."""
    if not root:
        # realpath("") is the current directory: an unset $OUT must not fill it.
        raise UsageError("the output directory is an empty string")
    try:
        absolute = os.path.abspath(root)
    except OSError as exc:  # a relative path, and the current directory was removed
        raise UsageError(
            f"the output directory {root!r} is relative to the current directory, "
            f"which cannot be found: {exc.strerror}"
        ) from None
    # Our files would land beside that run's journal and parts; also as
    # resolved: through a symlink to a run's .swarmget (or into it), they did.
    for path in (absolute, os.path.realpath(absolute)):
        if any(part.lower() == ".swarmget" for part in path.split(os.sep)):
            raise UsageError(f"the output directory {root!r} is inside a run's .swarmget directory")
    if os.path.islink(root) and not os.path.exists(root):
        # makedirs then said "exists and is not a directory": the user looked for a file.
        raise UsageError(
            f"the output directory {root!r} is a symlink to {os.readlink(root)!r}, which "
            "does not exist (create that directory, or use another path)"
        )


def check_dns_server(text: str) -> None:
    """Accept ``IP``, ``IPv4:PORT`` or ``[IPv6]:PORT``, as c-ares does; raise UsageError."""
    host, port, colon = text, "", False
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise UsageError(f"--dns-server {text!r}: expected IP, IP:PORT or [IPv6]:PORT")
        port, colon = rest[1:], bool(rest)
    elif text.count(":") == 1:
        host, port = text.split(":")
        colon = True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"--dns-server {text!r}: not an IP address") from None
    # An empty port ("1.2.3.4:") too: c-ares refused it as a 'Misformatted
    # string', in a message that named neither the option nor the value's fault.
    if colon and not (port.isdigit() and 0 < int(port) < 65536):
        raise UsageError(f"--dns-server {text!r}: bad port")
    if "%" in host and text.startswith("["):
        # c-ares takes a zone id only on an address given without a port.
        raise UsageError(
            f"--dns-server {text!r}: an IPv6 address with a zone id is taken only "
            f"without brackets and port ({host}, port 53)"
        )
