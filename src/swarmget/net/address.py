"""Addresses: what a name resolves to, and IP literals that need no lookup.

Its own module so that both resolvers (``net/dns.py``, ``net/ares.py``) and the
connection code share it without importing each other.
"""

from __future__ import annotations

import socket
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Generic, TypeVar

from swarmget.errors import ErrorCode, TransferError

Address = tuple[int, tuple[object, ...]]  # (family, sockaddr)
# How a resolver answers: (addresses, None) or (None, error), on the loop thread.
ResolveCallback = Callable[[list[Address] | None, TransferError | None], None]


Key = TypeVar("Key")
Answer = TypeVar("Answer")
# Answers a resolver keeps.  Its cache only spares the name server (the engine's
# pools keep their own addresses), so it needs the names of recent rows, not of
# the whole list: four times the engine's pool limit (POOL_LIMIT), ~0.5 KB each
# (~8 MB).  Bounded by count, not only by TTL: a list over millions of hosts
# meets ~2,000 new names a second, and 300 s TTLs alone kept 600,000 of them.
ANSWERS_CACHED: Final = 16384


class AnswerCache(Generic[Key, Answer]):
    """A resolver's answers, each with the loop time it goes stale; at most
    ``limit`` of them, the least recently used forgotten first.

    Every call is O(1) (amortised for ``put``): a lookup is on every new row's path.
    """

    __slots__ = ("_answers", "_limit")

    def __init__(self, limit: int = ANSWERS_CACHED) -> None:
        self._answers: OrderedDict[Key, tuple[float, Answer]] = OrderedDict()
        self._limit = max(1, limit)

    def __len__(self) -> int:
        return len(self._answers)

    def fresh(self, key: Key, now: float) -> Answer | None:
        """The answer for ``key`` while it is fresh at ``now`` (then it counts as used)."""
        cached = self._answers.get(key)
        if cached is None or cached[0] <= now:
            return None
        self._answers.move_to_end(key)
        return cached[1]

    def expires(self, key: Key) -> float:
        """Loop time at which the answer for ``key`` goes stale (0.0: none kept)."""
        cached = self._answers.get(key)
        return cached[0] if cached is not None else 0.0

    def put(self, key: Key, expires: float, answer: Answer, now: float) -> None:
        """Keep ``answer`` until ``expires``, as the most recently used."""
        answers = self._answers
        answers[key] = (expires, answer)
        answers.move_to_end(key)
        while len(answers) > self._limit:
            answers.popitem(last=False)
        # Stale answers at the least recently used end go too (each goes once, so
        # O(1) amortised): a run of short TTLs then keeps what is fresh, not the limit.
        while len(answers) > 1 and next(iter(answers.values()))[0] <= now:
            answers.popitem(last=False)


def name_key(host: str) -> str:
    """How a resolver knows ``host`` in its cache and among its lookups in flight:
    lower-cased (``V4.Test`` and ``v4.test`` are one lookup; what goes to the
    name server is still the name as the first asker gave it).

    A trailing dot stays: ``v4.test.`` and ``v4.test`` are not one lookup.
    The name without the dot goes through the resolver's search domains and
    is found in a hosts file, the fully qualified one is neither (c-ares and
    glibc alike), so one answer for both made a row's answer depend on which
    spelling an earlier row used: ``fromhosts.test.`` first, its NXDOMAIN was
    cached for ``fromhosts.test`` too."""
    return host.lower()


def bare_host(host: str) -> str:
    """``host`` without an IPv6 zone id (``fe80::1%eth0`` -> ``fe80::1``): what the
    ``Host`` header, the certificate check and ``inet_pton`` see."""
    return host.partition("%")[0] if ":" in host else host


def ip_literal(host: str) -> Address | None:
    """(family, (bare address,)) when ``host`` is an IPv4/IPv6 literal, else None.
    An IPv6 zone id stays on the address (``fe80::1%eth0``) for :func:`sockaddr`."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    address = bare_host(bare)
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, address)
        except (OSError, ValueError):
            continue
        return (family, (bare,))
    return None


def literal_addresses(host: str, port: int) -> list[Address] | None:
    """The one address of an IP literal ``host`` (no lookup needed), else None."""
    literal = ip_literal(host)
    if literal is None:
        return None
    family, (bare,) = literal
    return [(family, sockaddr(family, str(bare), port))]


def sockaddr(family: int, bare: str, port: int) -> tuple[object, ...]:
    """The ``connect()`` address for an IP in ``family``; an IPv6 zone id
    (``%eth0`` or ``%2``) becomes the scope id."""
    if family != socket.AF_INET6:
        return (bare, port)
    address, _, zone = bare.partition("%")
    return (address, port, 0, scope_id(zone)) if zone else (bare, port, 0, 0)


def scope_id(zone: str) -> int:
    """The interface index a zone id names; 0 for an interface this machine does
    not have, so that connect() fails as curl's does ("Invalid argument")."""
    if zone.isdigit():
        return int(zone)
    try:
        return socket.if_nametoindex(zone)
    except OSError:
        return 0


def unusable(family: int, ip: str) -> str | None:
    """Why ``ip``, an address a name resolved to, cannot be a server's (None: it can be).

    Name servers and hosts files that block a name answer 0.0.0.0 or ``::``,
    which Linux connects to as this machine: a blocked host's files came from
    whatever local server listened on the port.  Multicast, broadcast and
    reserved IPv4 addresses, and IPv6 link-local ones (which need an interface
    a DNS answer cannot name), fail at the connect with "Network is
    unreachable" or "Invalid argument", naming neither the address nor why.
    """
    try:
        packed = socket.inet_pton(family, ip)
    except (OSError, ValueError):
        return None
    if family == socket.AF_INET6:
        if packed[:12] == _V4_MAPPED:
            return unusable(socket.AF_INET, socket.inet_ntop(socket.AF_INET, packed[12:]))
        if not any(packed):
            return "the unspecified address, the answer for a blocked name"
        if packed[0] == 0xFF:
            return "a multicast address"
        if packed[0] == 0xFE and packed[1] & 0xC0 == 0x80:
            return "a link-local address, which needs an interface named"
        return None
    first = packed[0]
    if not any(packed):
        return "the unspecified address, the answer for a blocked name"
    if first == 0:
        return "in 0.0.0.0/8, which is no host's"
    if 224 <= first < 240:
        return "a multicast address"
    if packed == b"\xff\xff\xff\xff":
        return "the broadcast address"
    if first >= 240:
        return "a reserved address"
    return None


_V4_MAPPED: Final = b"\x00" * 10 + b"\xff\xff"


def unusable_answer(host: str, rejected: list[tuple[str, str]]) -> TransferError:
    """The ``dns`` error of a name that resolved only to ``rejected`` (ip, why) addresses."""
    shown = "; ".join(f"{ip} ({why})" for ip, why in rejected[:3])
    more = f" and {len(rejected) - 3} more" if len(rejected) > 3 else ""
    return TransferError(
        ErrorCode.DNS,
        f"cannot resolve {host!r}: it resolved only to addresses no server can have: {shown}{more}",
    )
