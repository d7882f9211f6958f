"""Name resolution that never blocks the loop.

:func:`make_resolver` picks the resolver, in one place: the c-ares one
(:mod:`swarmget.net.ares`: record TTLs, no threads) when pycares imports, else
:class:`ThreadedResolver`, described here.

``getaddrinfo`` blocks, sometimes for seconds (a slow or dead DNS server), so it
runs on a small pool of resolver threads; the answer comes back to the loop
thread through ``loop.call_soon_threadsafe``.  Answers are cached per
``(host, port)`` for ``ttl`` seconds (getaddrinfo does not tell us the record's
TTL), failures for ``negative_ttl``, the ``cached`` most recently used at most;
concurrent lookups of one name share one query.  A host is known by
:func:`~swarmget.net.address.name_key` (``X.test`` is ``x.test``, ``x.test.``
another lookup), and looked up as the first asker spelled it.  IP literals skip all of it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from swarmget.errors import ErrorCode, TransferError, UsageError
from swarmget.loop import EventLoop
from swarmget.net.address import (
    ANSWERS_CACHED,
    Address,
    AnswerCache,
    ResolveCallback,
    ip_literal,
    literal_addresses,
    name_key,
    unusable,
    unusable_answer,
)

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor


class Resolver(Protocol):
    def resolve(self, host: str, port: int, callback: ResolveCallback) -> None:
        """Call ``callback(addresses, None)`` or ``callback(None, error)`` later, on the loop."""

    def expires(self, host: str, port: int) -> float:
        """Loop time at which the cached answer goes stale (0.0 when nothing is cached)."""

    def close(self) -> None: ...


def make_resolver(
    loop: EventLoop, *, servers: tuple[str, ...] = (), timeout: float = 30.0
) -> Resolver:
    """The resolver the engine uses: c-ares when available, else getaddrinfo on threads.

    ``servers`` ("1.2.3.4", "1.2.3.4:5353", "[::1]:53") replaces the system's
    name servers; only c-ares can do that.  ``timeout`` (``--timeout``) bounds
    one c-ares lookup, its retransmissions included.
    """
    try:
        from swarmget.net.ares import AresResolver
    except ImportError:
        if servers:
            raise UsageError("--dns-server needs pycares (pip install pycares)") from None
        return ThreadedResolver(loop)
    return AresResolver(loop, servers=servers, within=timeout)


class LazyResolver:
    """Answers IP literals itself and makes the real resolver on the first name.

    Importing pycares (and with it idna) costs ~25 ms, paid again by every
    forked worker, and setting up a channel reads resolv.conf: a waste on a run
    whose URLs are all IP literals, and a delay before its first connect.
    ``make`` builds the real resolver; with ``eager`` (explicit DNS servers,
    whose mistakes must be reported before the run starts) it is built now.
    """

    def __init__(self, loop: EventLoop, make: Callable[[], Resolver], *, eager: bool) -> None:
        self._loop = loop
        self._make = make
        self._real: Resolver | None = make() if eager else None

    def resolve(self, host: str, port: int, callback: ResolveCallback) -> None:
        literal = literal_addresses(host, port)
        if literal is not None:
            self._loop.call_soon(callback, literal, None)
            return
        if self._real is None:
            self._real = self._make()
        self._real.resolve(host, port, callback)

    def expires(self, host: str, port: int) -> float:
        if ip_literal(host) is not None:
            return float("inf")
        return self._real.expires(host, port) if self._real is not None else 0.0

    def close(self) -> None:
        if self._real is not None:
            self._real.close()


class ThreadedResolver:
    def __init__(
        self,
        loop: EventLoop,
        *,
        workers: int = 4,
        ttl: float = 300.0,
        negative_ttl: float = 30.0,
        cached: int = ANSWERS_CACHED,
    ) -> None:
        self._loop = loop
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._executor: ThreadPoolExecutor | None = None
        self._workers = workers
        self._cache: AnswerCache[
            tuple[str, int], tuple[list[Address] | None, TransferError | None]
        ] = AnswerCache(cached)
        self._waiting: dict[tuple[str, int], list[ResolveCallback]] = {}

    def resolve(self, host: str, port: int, callback: ResolveCallback) -> None:
        """Call ``callback(addresses, None)`` or ``callback(None, error)`` on the loop thread."""
        literal = literal_addresses(host, port)
        if literal is not None:
            self._loop.call_soon(callback, literal, None)
            return
        key = (name_key(host), port)
        cached = self._cache.fresh(key, self._loop.now)
        if cached is not None:
            self._loop.call_soon(callback, cached[0], cached[1])
            return
        waiters = self._waiting.get(key)
        if waiters is not None:
            waiters.append(callback)
            return
        self._waiting[key] = [callback]
        if self._executor is None:
            # Imported here: concurrent.futures pulls in logging (~13 ms), and
            # this resolver is only the fallback for a missing pycares.
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="swarmget-dns")
        self._executor.submit(self._lookup, key, host)

    def expires(self, host: str, port: int) -> float:
        if ip_literal(host) is not None:
            return float("inf")
        return self._cache.expires((name_key(host), port))

    def _lookup(self, key: tuple[str, int], host: str) -> None:
        # Runs on a resolver thread: touch nothing but the arguments.
        port = key[1]
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            error = TransferError(ErrorCode.DNS, f"cannot resolve {host!r}: {exc.strerror}")
            self._loop.call_soon_threadsafe(self._done, key, None, error)
            return
        except (OSError, UnicodeError) as exc:
            error = TransferError(ErrorCode.DNS, f"cannot resolve {host!r}: {exc}")
            self._loop.call_soon_threadsafe(self._done, key, None, error)
            return
        seen: set[tuple[object, ...]] = set()
        addresses: list[Address] = []
        rejected: list[tuple[str, str]] = []
        for family, _type, _proto, _canon, sockaddr in infos:
            why = unusable(family, str(sockaddr[0]))
            if why is not None:
                rejected.append((str(sockaddr[0]), why))
            elif sockaddr not in seen:
                seen.add(sockaddr)
                addresses.append((family, tuple(sockaddr)))
        if not addresses and rejected:
            error = unusable_answer(host, rejected)
            self._loop.call_soon_threadsafe(self._done, key, None, error)
            return
        self._loop.call_soon_threadsafe(self._done, key, addresses, None)

    def _done(
        self, key: tuple[str, int], addresses: list[Address] | None, error: TransferError | None
    ) -> None:
        ttl = self._ttl if error is None else self._negative_ttl
        now = self._loop.now
        self._cache.put(key, now + ttl, (addresses, error), now)
        for callback in self._waiting.pop(key, []):
            callback(addresses, error)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
