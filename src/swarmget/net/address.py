"""Addresses: what a name resolves to, and IP literals that need no lookup.

Its own module so that both resolvers (``net/dns.py``, ``net/ares.py``) and the
connection code share it without importing each other.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, TypeVar

from swarmget.errors import TransferError

Address = tuple[int, tuple[object, ...]]  # (family, sockaddr)
# How a resolver answers: (addresses, None) or (None, error), on the loop thread.
ResolveCallback = Callable[[list[Address] | None, TransferError | None], None]


Key = TypeVar("Key")
PURGE_FLOOR = 1024  # answers a resolver's cache holds before its first purge


def unexpired(cache: dict[Key, Any], now: float) -> tuple[dict[Key, Any], int]:
    """A resolver cache (values start with their expiry time) without the answers
    that expired by ``now``, and the size at which to purge it next: twice what
    is left, so the purges cost O(1) per answer and a run over a million hosts
    keeps what its TTLs keep, not every name it ever resolved."""
    kept = {key: entry for key, entry in cache.items() if entry[0] > now}
    return kept, max(PURGE_FLOOR, 2 * len(kept))


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
