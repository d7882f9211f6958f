"""Name resolution with c-ares, driven by our own event loop.

Theory of operation
-------------------
c-ares is a DNS stub resolver that never blocks: it owns a few UDP (and, for
truncated answers, TCP) sockets and reports through ``sock_state_cb`` which of
them it wants to read or write.  Given that callback, pycares 5 starts no event
thread of its own, so each c-ares socket is registered with the EventLoop under
a tiny :class:`_AresSocket` handler that calls ``Channel.process_fd``, and
c-ares's retransmissions are driven by one loop timer re-armed from
``Channel.timeout()`` after every interaction.  Queries, answers and timeouts
are ordinary loop events: nothing waits and nothing crosses a thread.

Why c-ares rather than ``getaddrinfo`` on threads (:class:`ThreadedResolver`,
kept as the fallback): a thousand hosts cost a thousand small UDP exchanges
instead of a queue of blocked threads; every answer carries its records' TTLs,
so we cache for as long as the zone says, clamped to ``[min_ttl, max_ttl]``
(TTL 0 zones and ``/etc/hosts`` entries would otherwise cost a query per
connection; a day-long TTL should not pin us to an address a CDN has moved
away from).

**How long a lookup may take.**  c-ares sends a query again after ``timeout``,
doubling the wait each round (less a random part), and takes only the answer
to its latest query.
So a name server that needs 1.5 s (a cold recursive lookup through a slow
zone) is only heard in the round whose wait is longer than that: with a fixed
1 s and two tries (1 + 2 s), such a server failed every name while curl and
getaddrinfo waited for it.  :func:`lookup_budget` fits the rounds into the
run's ``--timeout`` instead (1, 2, 4, 8 s: 15 s of the default 30), so DNS, like
the connect, is bounded by ``--timeout``, and a lost packet is still asked
again after 1 s.

c-ares reads ``/etc/hosts`` before asking DNS, or the file named by
``$CARES_HOSTS`` when that is set (the c-ares convention; tests use it).

Answers are cached per host name, whatever the port, the ``cached`` most recently
used at most (:data:`~swarmget.net.address.ANSWERS_CACHED`); concurrent lookups
of one name share one query.  A name is known by its
:func:`~swarmget.net.address.name_key` (``X.test`` is ``x.test``, ``x.test.``
another lookup) and asked for as the lookup's first asker spelled it.  Failures
(NXDOMAIN, timeouts) are cached for ``negative_ttl``: long enough that a
broken host's thousand files do not ask a thousand times, short enough that a
long run asks again after a DNS blip.  Two failures are not the name's: a
malformed reply (c-ares then fails every
query pending on that server connection, the other hosts' too) and a refused
one; and "no data" just after a malformed reply (the culprit failed the A
query of a name whose AAAA query found no records).  A name that met one is
asked once more before its failure counts, one such name at a time: asked
together, the culprit's second reply would fail the others' second queries as
it did their first.  And a name server that stopped answering altogether is
noticed, as ``--host-failures``
notices a dead host: after ``DEAD_AFTER`` lookups in a row time out with no
answer between them, lookups fail at once for ``negative_ttl`` (then one goes
out again): a list over thousands of hosts no longer crawls at one lookup budget a host.

**c-ares's own cache.**  c-ares 1.34 also keeps every answer it receives, for
its TTL (up to an hour), and a "no such record" answer (the AAAA of an
IPv4-only host, most hosts) for an hour whatever its SOA says; pycares 5 has no
way to turn that cache off (``ARES_OPT_QUERY_CACHE``).  Ours answers repeats
already, so c-ares's only grew: ~2.6 KB a name, 100,000 names ~260 MB.  So a
channel serves ``names_per_channel`` names, then a fresh one takes over; the old
one is closed, its cache with it, once its last query is answered.

**An IPv6-only answer.**  c-ares asks A and AAAA together and answers when
both are done.  When the AAAA query is lost but the A one answered, it gives up
on the AAAA after the first wait; the other way round, it kept the AAAA answer
until its A query had used every retransmission (11 s of the default
``--timeout``).  So a name still unanswered one and a half first waits on
(c-ares is done with a lost AAAA query by then) is asked for its IPv6 addresses
alone, and when c-ares's cache has them (the AAAA answer is in: no packet goes
out) they are used; the full answer, or the A query's timeout, comes later and
does not replace them.  Only a cached answer counts: one that took a trip to a
slow name server would leave a dual-stack name with its IPv6 addresses only.
(That trip, one AAAA lookup more, its retransmissions included, is what a name
still unanswered then costs.)

**Names in flight.**  The engine keeps up to 256 lookups going (as many as
connections), and name servers that cap a client (dnsmasq: 150 queries) drop
what they cannot take: at a cap of 50, 2,000 names that resolve lost 40 to 130
of them to ``dns`` timeouts.  So names are sent as TCP sends packets: 16 at
first, one more an answer but at most twice as many a detection window (1.5
first waits: slow start), then, after the first loss, one more a round of
answers; and half as many as are in flight when more than a tenth of recent
lookups were lost, at most once a first wait.  A lookup counts as lost when it
is still unanswered after 1.5 first waits (c-ares sent it again) while a name
sent after it was answered within the first wait: the server answers, and
dropped ours.  A slow name, or a slow name server (every lookup seconds), is
overtaken by nothing, or rarely, and cuts nothing.  The other names wait their
turn in order, unsent.

Callbacks never run inside :meth:`AresResolver.resolve`: c-ares answers from
its hosts file or its own cache synchronously, so delivery goes through
``loop.call_soon``, as in the threaded resolver.
"""

from __future__ import annotations

import collections
import math
import os
import socket
from collections.abc import Callable

import pycares

from swarmget.errors import ErrorCode, TransferError, UsageError
from swarmget.loop import EVENT_READ, EVENT_WRITE, EventLoop, Timer
from swarmget.net.address import (
    ANSWERS_CACHED,
    Address,
    AnswerCache,
    ResolveCallback,
    ip_literal,
    literal_addresses,
    name_key,
    sockaddr,
    unusable,
    unusable_answer,
)

_BAD = pycares.ARES_SOCKET_BAD
# ARES_AI_ENVHOSTS in ares.h: read the hosts file named by $CARES_HOSTS.
# pycares 5 does not export the constant.
_ENVHOSTS = 1 << 8
# The longest we sleep between two looks at c-ares's timers while queries are
# pending (ares_timeout() caps its answer with it).
_MAX_TIMER = 1.0

# Statuses that are not the name's answer: asked once more (see the docstring).
_ASK_AGAIN = frozenset({pycares.errno.ARES_EBADRESP, pycares.errno.ARES_ECONNREFUSED})
# A name whose A query a malformed reply failed, while its AAAA query found no
# records (most names), is reported as "no data": in that case, too.
_NODATA = pycares.errno.ARES_ENODATA
_POISON_WINDOW = 1.0  # seconds after a malformed reply in which "no data" is suspect
DEAD_AFTER = 20  # lookups timed out in a row: the name server is not answering
FIRST_WAIT = 1.0  # seconds before c-ares first asks again (a lost UDP packet)
# Names asked on one c-ares channel before a fresh channel takes them over (see
# the docstring): c-ares's own cache then holds at most this many names' answers
# (~1.3 KB a record, two a name: ~2.7 MB), for a channel set up (resolv.conf
# read, new sockets) every this many names.
NAMES_PER_CHANNEL = 1024
# Names asked at once, at most, and at first and at least (see the docstring):
# the engine's own cap (MAX_RESOLVING, MIN_RESOLVING).  16 names are 32
# queries, within what name servers that cap a client take.
MAX_IN_FLIGHT = 256
MIN_IN_FLIGHT = 16
# When more than _CROWDED of recent lookups (an average over the last
# ~1/_LATE_WEIGHT) were lost (see the docstring), the name server is dropping
# queries; a few slow names are not that.
_LATE_WEIGHT = 1 / 32
_CROWDED = 0.1
_V6_AFTER = 1.5  # first waits after which a name unanswered is asked for its IPv6 addresses

BareAddress = tuple[int, str]  # (family, ip), before a port is attached
_Answer = tuple[list[BareAddress] | None, TransferError | None]


def lookup_budget(timeout: float, servers: int = 1) -> tuple[float, int]:
    """c-ares's first wait and number of tries, all rounds within ``timeout`` seconds.

    Round ``k`` asks each of the ``servers`` in turn, waiting ``first * 2**k`` for
    each, so ``n`` tries take ``servers * first * (2**n - 1)`` (three servers in
    resolv.conf made a 30 s budget 38 s).
    """
    servers = max(1, servers)
    first = min(FIRST_WAIT, timeout / servers)
    tries = max(1, int(math.log2(timeout / (first * servers) + 1) + 1e-9))
    return first, tries


class _AresSocket:
    """Loop handler for one c-ares socket: hand readiness back to c-ares."""

    __slots__ = ("channel", "fd")

    def __init__(self, channel: _Channel, fd: int) -> None:
        self.channel = channel
        self.fd = fd

    def handle_io(self, mask: int) -> None:
        fd = self.fd
        channel = self.channel
        channel.resolver._process(
            channel, fd if mask & EVENT_READ else _BAD, fd if mask & EVENT_WRITE else _BAD
        )


class _Channel:
    """A c-ares channel, its sockets on the loop and its queries in flight."""

    __slots__ = ("cares", "closed", "loop", "names", "pending", "resolver", "sockets")

    def __init__(
        self,
        resolver: AresResolver,
        loop: EventLoop,
        servers: tuple[str, ...] | list[str],
        timeout: float,
        tries: int,
    ) -> None:
        self.resolver = resolver
        self.loop = loop
        self.sockets: dict[int, _AresSocket] = {}
        self.closed = False
        self.pending = 0  # queries c-ares has not answered yet
        self.names = 0  # names asked on it
        self.cares = pycares.Channel(
            sock_state_cb=self._sock_state,
            timeout=timeout,
            tries=tries,
            servers=list(servers) or None,
        )

    def close(self) -> None:
        # Cancel on the loop thread first, so that c-ares drops its sockets
        # through _sock_state while we may still touch the loop; the channel is
        # then destroyed on pycares's shutdown thread, which must find nothing
        # of ours to call.
        self.cares.cancel()
        self.closed = True
        for fd in self.sockets:
            self.loop.remove(fd)
        self.sockets.clear()
        self.cares.close()

    def _sock_state(self, fd: int, readable: int, writable: int) -> None:
        if self.closed:
            return  # pycares's shutdown thread closing the sockets: not ours to touch
        events = (EVENT_READ if readable else 0) | (EVENT_WRITE if writable else 0)
        handler = self.sockets.get(fd)
        if not events:
            if handler is not None:
                del self.sockets[fd]
                self.loop.remove(fd)
        elif handler is None:
            handler = self.sockets[fd] = _AresSocket(self, fd)
            self.loop.add(fd, events, handler)
        else:
            self.loop.modify(fd, events, handler)


class AresResolver:
    """Same interface as :class:`~swarmget.net.dns.ThreadedResolver`."""

    def __init__(
        self,
        loop: EventLoop,
        *,
        servers: tuple[str, ...] | list[str] = (),
        timeout: float = 1.0,
        tries: int = 2,
        within: float | None = None,
        min_ttl: float = 5.0,
        max_ttl: float = 3600.0,
        negative_ttl: float = 10.0,
        cached: int = ANSWERS_CACHED,
        names_per_channel: int = NAMES_PER_CHANNEL,
        max_in_flight: int = MAX_IN_FLIGHT,
        min_in_flight: int = MIN_IN_FLIGHT,
    ) -> None:
        self._loop = loop
        self._min_ttl = min_ttl
        self._max_ttl = max_ttl
        self._negative_ttl = negative_ttl
        self._names_per_channel = names_per_channel
        self._closed = False
        self._timer: Timer | None = None
        self._cache: AnswerCache[str, _Answer] = AnswerCache(cached)
        # Below, ``host`` is a name's key (name_key), as in the cache; the name
        # a lookup in flight sends, as its first asker gave it, is kept here.
        self._names: dict[str, str] = {}
        self._waiting: dict[str, list[tuple[int, ResolveCallback]]] = {}
        self._asked_again: set[str] = set()  # names given a second query
        self._again: collections.deque[str] = collections.deque()  # ... waiting for it
        self._asking_again: str | None = None  # ... having it now
        self._timeouts = 0  # lookups timed out in a row, with no answer between
        # Names asked at once (see the docstring): a limit cut when lookups time
        # out while others are answered, grown back one a round of answers.
        self._max_in_flight = max_in_flight
        self._min_in_flight = min(min_in_flight, max_in_flight)
        self._limit = float(self._min_in_flight)
        self._in_flight = 0  # names sent whose lookups are not over
        self._queued: collections.deque[str] = collections.deque()  # ... waiting to be sent
        self._sent_at: dict[str, float] = {}  # loop time each name in flight was sent
        self._prompt_sent = -math.inf  # ... the latest-sent name answered within the first wait
        self._late = 0.0  # share of recent lookups overtaken (see _overtaken)
        self._next_cut = 0.0  # loop time before which the limit is not cut again
        self._doubling = True  # until the first cut: TCP's slow start
        self._window_ends = 0.0  # loop time the limit may double again
        self._window_cap = self._limit  # ... and the most it may grow to until then
        self._dead_until = 0.0  # loop time until which lookups fail at once
        self._poisoned_until = 0.0  # loop time until which "no data" may be a malformed reply's
        self._retired: list[_Channel] = []  # replaced, answering their last queries
        # Names asked, with the loop time from which their IPv6 addresses alone
        # are asked for (see the docstring), in query order: due ones first.
        self._v6_due: collections.deque[tuple[float, str]] = collections.deque()
        self._v6_answered: set[str] = set()  # ... and given to the waiters that way
        self._v6_asking: str | None = None  # the name asked so, during that call
        self._servers = servers
        if within is not None:  # a lookup's retransmissions fill at most this many seconds
            timeout, tries = lookup_budget(within, len(servers) or 1)
        self._budget = (timeout, tries)
        self._channel = self._first_channel()
        asked = len(self._channel.cares.servers)  # resolv.conf's, when none were given
        if within is not None and asked > 1 and not servers:
            self._budget = lookup_budget(within, asked)
            self._channel.close()
            self._channel = self._first_channel()

    def _first_channel(self) -> _Channel:
        try:
            return self._new_channel()
        except pycares.AresError as exc:
            self._closed = True
            raise UsageError(f"bad DNS server list {list(self._servers)!r}: {exc}") from None

    def _new_channel(self) -> _Channel:
        timeout, tries = self._budget
        return _Channel(self, self._loop, self._servers, timeout, tries)

    # -- the public interface -------------------------------------------------------

    def resolve(self, host: str, port: int, callback: ResolveCallback) -> None:
        """Call ``callback(addresses, None)`` or ``callback(None, error)`` on the loop thread."""
        loop = self._loop
        literal = literal_addresses(host, port)
        if literal is not None:
            loop.call_soon(callback, literal, None)
            return
        key = name_key(host)
        cached = self._cache.fresh(key, loop.now)
        if cached is not None:
            loop.call_soon(callback, _with_port(cached[0], port), cached[1])
            return
        waiters = self._waiting.get(key)
        if waiters is not None:
            waiters.append((port, callback))
            return
        if loop.now < self._dead_until:
            error = TransferError(
                ErrorCode.DNS,
                f"cannot resolve {host!r}: the name server is not answering "
                f"({self._timeouts} lookups in a row timed out)",
            )
            loop.call_soon(callback, None, error)
            return
        self._waiting[key] = [(port, callback)]
        self._names[key] = host
        if self._in_flight < self._limit:
            self._send(key)
        else:
            self._queued.append(key)  # its turn comes as lookups end

    def expires(self, host: str, port: int) -> float:
        """Loop time at which the cached answer for ``host`` goes stale (0.0: none)."""
        if ip_literal(host) is not None:
            return float("inf")
        return self._cache.expires(name_key(host))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # first: the queries cancelled now are answered no more
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for channel in self._channels():
            channel.close()
        self._retired.clear()
        self._waiting.clear()
        self._names.clear()
        self._queued.clear()

    # -- names in flight (see the docstring) ----------------------------------------

    def _send(self, host: str) -> None:
        self._in_flight += 1
        self._sent_at[host] = self._loop.now
        self._query(host)

    def _send_queued(self) -> None:
        queued = self._queued
        while queued and self._in_flight < self._limit and not self._closed:
            host = queued.popleft()
            if host in self._waiting:
                self._send(host)

    def _lookup_over(self, host: str) -> None:
        """Count ``host``'s lookup out of those in flight, and grow their limit
        unless it was overtaken."""
        self._in_flight -= 1
        sent = self._sent_at.pop(host, None)
        if sent is None:
            return  # overtaken (counted then)
        if self._loop.now - sent <= self._budget[0]:
            self._prompt_sent = max(self._prompt_sent, sent)
            self._late -= self._late * _LATE_WEIGHT
        self._grow()

    def _overtaken(self, host: str) -> None:
        """``host`` is still unanswered past c-ares's first wait (its query was
        sent again): if a name sent after it was answered within it, the name
        server answers, and dropped ours.  Names that are just slow overtake
        none, and a slow name server's none at all: those cut nothing."""
        sent = self._sent_at.get(host)
        if sent is None or self._prompt_sent <= sent:
            return
        del self._sent_at[host]
        self._late += (1.0 - self._late) * _LATE_WEIGHT
        self._doubling = False  # as TCP's slow start ends at the first loss
        now = self._loop.now
        if self._late > _CROWDED and now >= self._next_cut:
            # Fewer names at once, as TCP does; once a first wait: the lookups
            # of one burst that were dropped are one signal.
            self._limit = max(float(self._min_in_flight), self._in_flight / 2)
            self._next_cut = now + self._budget[0]

    def _grow(self) -> None:
        """One name more an answer, at most twice the limit a detection window
        (TCP's slow start, its rounds as long as a drop takes to show), until
        the first cut; then one more a round of answers."""
        limit = self._limit
        if self._doubling:
            now = self._loop.now
            if now >= self._window_ends:
                self._window_cap = 2 * limit
                self._window_ends = now + _V6_AFTER * self._budget[0]
            limit = min(limit + 1, self._window_cap)
        else:
            limit += 1 / limit
        self._limit = min(float(self._max_in_flight), limit)

    # -- c-ares plumbing ------------------------------------------------------------

    def _query(self, host: str) -> None:
        if self._closed:
            return  # asked again after close()
        channel = self._channel_for_a_name()
        try:
            self._getaddrinfo(channel, host, socket.AF_UNSPEC, self._answered)
        except (ValueError, UnicodeError, RuntimeError) as exc:
            error = TransferError(ErrorCode.DNS, f"cannot resolve {self._asked(host)!r}: {exc}")
            self._loop.call_soon(self._done, host, None, error, self._negative_ttl)
            return
        self._v6_due.append((self._loop.now + _V6_AFTER * self._budget[0], host))
        self._arm_timer()

    def _ask_v6_alone(self) -> None:
        """Ask for the IPv6 addresses alone of the names waiting that long (see the docstring)."""
        due, now = self._v6_due, self._loop.now
        while due and due[0][0] <= now:
            host = due.popleft()[1]
            if host in self._waiting and host not in self._v6_answered:
                self._overtaken(host)  # now, not when it ends: the limit acts sooner
                self._ask_v6(host)

    def _ask_v6(self, host: str) -> None:
        self._v6_asking = host  # c-ares answers from its cache within the call
        try:
            self._getaddrinfo(self._channel, host, socket.AF_INET6, self._v6_alone)
        except (ValueError, UnicodeError, RuntimeError):
            pass  # the full lookup answers for it
        finally:
            self._v6_asking = None

    def _getaddrinfo(
        self,
        channel: _Channel,
        host: str,
        family: socket.AddressFamily,
        answered: Callable[[_Channel, str, pycares.AddrInfoResult | None, int | None], None],
    ) -> None:
        """Ask ``channel`` for ``host``'s addresses of ``family``; ``answered`` gets
        the result (raises what c-ares raises for a name it cannot ask for)."""
        flags = _ENVHOSTS if os.environ.get("CARES_HOSTS") else 0
        channel.pending += 1
        try:
            channel.cares.getaddrinfo(
                self._asked(host),
                None,
                family=family,
                type=socket.SOCK_STREAM,
                flags=flags,
                callback=lambda result, status: answered(channel, host, result, status),
            )
        except BaseException:
            channel.pending -= 1
            raise

    def _settled(self, channel: _Channel) -> bool:
        """A query of ``channel`` was answered: False once the resolver is closed.
        A retired channel is closed after its last answer."""
        channel.pending -= 1
        if self._closed:
            return False
        if not channel.pending and channel is not self._channel:
            self._loop.call_soon(self._close_retired, channel)  # not from inside c-ares
        return True

    def _v6_alone(
        self,
        channel: _Channel,
        host: str,
        result: pycares.AddrInfoResult | None,
        status: int | None,
    ) -> None:
        if not self._settled(channel):
            return
        cached = host == self._v6_asking
        if not cached or status is not None or result is None or host not in self._waiting:
            return
        bare, ttl, _ = self._addresses(result)
        if bare:
            self._v6_answered.add(host)
            self._loop.call_soon(self._done, host, bare, None, ttl)

    def _answered(
        self,
        channel: _Channel,
        host: str,
        result: pycares.AddrInfoResult | None,
        status: int | None,
    ) -> None:
        # Called by c-ares, on the loop thread, from inside process_fd /
        # getaddrinfo / cancel.
        if not self._settled(channel):
            return
        if status == pycares.errno.ARES_EBADRESP:
            self._poisoned_until = self._loop.now + _POISON_WINDOW
        if status == _NODATA and host not in self._asked_again:
            # Decided once c-ares has said all it has to say now: the malformed
            # reply that makes this suspect may be reported after it.
            self._loop.call_soon(self._no_data, host)
            return
        if status in _ASK_AGAIN and host not in self._asked_again:
            self._loop.call_soon(self._ask_again, host)  # not from inside c-ares
            return
        # An A query lost when the AAAA one was answered: the server answers.
        self._count_timeout(status == pycares.errno.ARES_ETIMEOUT and host not in self._v6_answered)
        if status is not None or result is None:
            reason = _strerror(status) if status is not None else "no answer"
            if status == pycares.errno.ARES_EBADNAME:
                reason = _bad_name(self._asked(host)) or reason
            error = TransferError(ErrorCode.DNS, f"cannot resolve {self._asked(host)!r}: {reason}")
            self._loop.call_soon(self._done, host, None, error, self._negative_ttl)
            return
        bare, ttl, rejected = self._addresses(result)
        if not bare:
            error = (
                unusable_answer(self._asked(host), rejected)
                if rejected
                else TransferError(
                    ErrorCode.DNS, f"cannot resolve {self._asked(host)!r}: no addresses"
                )
            )
            self._loop.call_soon(self._done, host, None, error, self._negative_ttl)
            return
        self._loop.call_soon(self._done, host, bare, None, ttl)

    def _addresses(
        self, result: pycares.AddrInfoResult
    ) -> tuple[list[BareAddress], float, list[tuple[str, str]]]:
        """An answer's distinct usable addresses, how long to keep them, and the
        addresses left out as no server's (ip, why: see ``unusable``)."""
        bare: list[BareAddress] = []
        rejected: list[tuple[str, str]] = []
        ttl = self._max_ttl
        for node in result.nodes:
            raw = node.addr[0]
            ip = raw.decode("ascii") if isinstance(raw, bytes) else raw
            why = unusable(node.family, ip)
            if why is not None:
                rejected.append((ip, why))
            elif (node.family, ip) not in bare:
                bare.append((node.family, ip))
            ttl = min(ttl, node.ttl)
        for cname in result.cnames:
            ttl = min(ttl, cname.ttl)
        return bare, max(self._min_ttl, ttl), rejected

    def _no_data(self, host: str) -> None:
        if self._closed:
            return
        if self._loop.now < self._poisoned_until:
            self._ask_again(host)
            return
        self._count_timeout(False)
        error = TransferError(
            ErrorCode.DNS, f"cannot resolve {self._asked(host)!r}: {_strerror(_NODATA)}"
        )
        self._done(host, None, error, self._negative_ttl)

    def _ask_again(self, host: str) -> None:
        """A second query for ``host``, in its turn (one name at a time)."""
        self._asked_again.add(host)
        self._again.append(host)
        self._ask_next_again()

    def _ask_next_again(self) -> None:
        if self._asking_again is None and self._again and not self._closed:
            host = self._asking_again = self._again.popleft()
            self._query(host)

    def _asked(self, host: str) -> str:
        """The name a lookup of ``host`` (a key) sends, and its errors quote."""
        return self._names.get(host, host)

    def _count_timeout(self, timed_out: bool) -> None:
        if not timed_out:
            self._timeouts = 0  # the server answered (an NXDOMAIN is an answer)
            return
        self._timeouts += 1
        if self._timeouts >= DEAD_AFTER:
            self._dead_until = self._loop.now + self._negative_ttl

    def _done(
        self, host: str, bare: list[BareAddress] | None, error: TransferError | None, ttl: float
    ) -> None:
        if self._closed:
            return
        self._asked_again.discard(host)
        if host == self._asking_again:
            self._asking_again = None
            self._ask_next_again()
        if host not in self._waiting and host in self._v6_answered:
            # Answered already with its IPv6 addresses alone (see the docstring).
            self._v6_answered.discard(host)
            if error is not None:  # the A query's timeout: keep those addresses
                self._names.pop(host, None)
                return
        now = self._loop.now
        self._cache.put(host, now + ttl, (bare, error), now)
        if host not in self._v6_answered:  # else its full answer is still to come
            self._names.pop(host, None)
        # The waiters get this answer, not the cache's: it may be forgotten by
        # the time they ask (another answer pushed it out).
        waiters = self._waiting.pop(host, None)
        if waiters is None:
            return
        self._lookup_over(host)
        for port, callback in waiters:
            callback(_with_port(bare, port), error)
        self._send_queued()

    # -- channels: a fresh one every names_per_channel names (see the docstring) ------

    def _channels(self) -> list[_Channel]:
        return [self._channel, *self._retired]

    def _channel_for_a_name(self) -> _Channel:
        channel = self._channel
        if channel.names >= self._names_per_channel:
            try:
                fresh = self._new_channel()
            except pycares.AresError:
                # resolv.conf unreadable for a moment: the channel we have still works.
                channel.names = 0
                return channel
            self._channel = fresh
            if channel.pending:
                self._retired.append(channel)
            else:
                channel.close()
            channel = fresh
        channel.names += 1
        return channel

    def _close_retired(self, channel: _Channel) -> None:
        if channel in self._retired and not channel.pending:
            self._retired.remove(channel)
            channel.close()

    def _process(self, channel: _Channel, read_fd: int, write_fd: int) -> None:
        if self._closed or channel.closed:
            return
        channel.cares.process_fd(read_fd, write_fd)
        self._arm_timer()

    def _on_timer(self) -> None:
        self._timer = None
        if self._closed:
            return
        for channel in self._channels():
            if channel.pending:  # lets c-ares retransmit or give up on due queries
                channel.cares.process_fd(_BAD, _BAD)
        self._ask_v6_alone()
        self._arm_timer()

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closed:
            return
        delay = min(
            (_next_timeout(channel) for channel in self._channels() if channel.pending),
            default=None,
        )
        if delay is not None and self._v6_due:
            delay = min(delay, max(0.0, self._v6_due[0][0] - self._loop.now))
        if delay is not None:
            self._timer = self._loop.call_at(self._loop.time() + delay, self._on_timer)


def _next_timeout(channel: _Channel) -> float:
    """Seconds until c-ares wants to look at ``channel``'s queries (at most _MAX_TIMER)."""
    delay: float = channel.cares.timeout(_MAX_TIMER)  # type: ignore[no-untyped-call]
    return delay


def _bad_name(name: str) -> str | None:
    """What DNS does not allow in ``name`` (c-ares says only "Misformatted domain name")."""
    labels = name.removesuffix(".").split(".")
    longest = max(labels, key=len)
    if len(longest) > 63:
        return f"a label of {len(longest)} characters, where DNS allows 63"
    if len(name.removesuffix(".")) > 253:
        return f"a name of {len(name.removesuffix('.'))} characters, where DNS allows 253"
    return None


def _strerror(status: int) -> str:
    text = pycares.errno.strerror(status)
    return text.decode("ascii", "replace") if isinstance(text, bytes) else text


def _with_port(bare: list[BareAddress] | None, port: int) -> list[Address] | None:
    if bare is None:
        return None
    return [(family, sockaddr(family, ip, port)) for family, ip in bare]
