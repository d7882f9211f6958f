"""Which transfer goes on which connection, and when to open or close one.

Theory of operation
-------------------
Pure bookkeeping, in the manner of httpcore's connection pool: every method
updates counts and queues and returns a list of *actions* for the engine to
carry out (:class:`Start` a transfer on a kept-alive connection, :class:`Dial`
a new connection, :class:`Close` one, :class:`Resolve` a host name,
:class:`Fail` a transfer, :class:`Defer` the rest to the next loop turn).
Nothing here touches a socket or a clock: the caller passes ``now``, so the
rules can be tested without either (tests/test_scheduler.py).

The rules:

* Connections are capped twice: ``concurrency`` in total and ``per_host`` per
  origin.  A connection that finishes a transfer takes the next queued one of
  its origin at once (no trip through the selector); with nothing queued it
  goes idle in its pool, unless another origin is starved for a slot, in which
  case it is closed to make room.
* A transfer marked ``fresh`` (it met a dead kept-alive connection) goes on a
  brand-new connection: an idle one is closed to make room if the host has
  none, and neither an idle connection nor one that just finished a response
  takes it (either may be as dead as the first).
* An idle connection is asked :meth:`~swarmget.engine.pool.PooledConnection.looks_closed`
  before it is reused (the connection peeks at its socket): a close the server
  sent while it idled, not yet seen by the loop, retires it instead of costing
  the next transfer an attempt.
* New connections start at most ``CONNECT_SLICE`` per loop turn.  A
  non-blocking connect still costs the kernel ~50-100 us (on loopback the
  whole handshake runs in our context), so starting 200 in one go held every
  first request back ~20 ms; in slices, the first requests go out while later
  connections are still being made.
* A host whose name does not resolve fails its queued transfers at once, until
  the negative answer goes stale.
* Lookups in flight are capped too (``max_resolving``: as many as connections,
  within [16, 256]): a list over thousands of hosts asked for every one with a
  queued row at once, and name servers that cap their clients (dnsmasq: 150)
  dropped the rest, failing resolvable hosts with ``dns``.  Pools wait for a
  lookup slot in order; a background refresh waits for a free one.
* Push-back: a host that answers 429 (too many requests) is paused
  (:meth:`Scheduler.pushed_back`): nothing new goes to it until the wait is
  over, when a :class:`WakeAt` brings the scheduler back to it: its
  Retry-After, else the backoff's ceiling for the refused row's attempts or
  for the host's rows refused at their first in a row (``push_backs``),
  whichever is more (RetryPolicy.push_back): each probe may be another row
  at its first, and a host refusing everything for 10 s was paused 0.5 s
  or 1 s each time and given up within 6 s.  Requests
  already sent finish; the queued rows wait without spending an attempt.
  Pausing only the row that was told (as curl, aria2c and our round 1 do)
  sent every other queued row into the same refusal, each spending an
  attempt on it, and hammered a rate-limited host at full concurrency.  After
  a pause the host gets one request (the refused row first) until it is
  answered with anything but 429 (a request that ends unanswered is replaced,
  :meth:`Scheduler.request_lost`): a limiter that lets a few through per second
  refused the whole ``per_host`` burst that went out at the wake.  Requests
  still under way from before the pause do not hold the probe back.
  After ``host_failures`` pauses in a row with no other answer, the host is
  given up like a dead one (its rows fail ``http_429``): a host that refuses
  everything would otherwise hold its rows for as long as it kept refusing.
  Rows queued for a paused host are :meth:`Scheduler.parked`: the engine's
  intake and the driver's dealing leave them out of their windows (up to a
  bound), so the other hosts' rows keep coming meanwhile.  A 503 pauses only
  its row: it may be one URL's trouble.
* Politeness after push-back, AIMD as in TCP's congestion control (and as
  polite crawlers do): a pause alone did not teach us the host's pace.  After
  the probe was answered the whole queue went out again at ``per_host``, most
  of it was refused again, and each refusal cost its row an attempt (a host
  letting 5 requests a second through failed 8 of 30 rows, after 61
  refusals).  So a host that pushes back is allowed fewer requests under way
  at once, ``HostPool.limit``:

  - *Multiplicative decrease* (:meth:`Scheduler.slow_down`): when a pause
    begins (429; not for a 503, even with a Retry-After: it may be one URL's
    trouble, and one URL answering it on every retry halved a host serving
    thousands of others four times), the limit
    becomes half of what the host had under way (as TCP halves its flight
    size, not a window it was not using; the probe after a pause halves the
    limit itself), at least 1.  Once per round of requests, as a pause is:
    a refusal of a request sent before the last decrease tells nothing new.
  - *Slow start* after a pause, as TCP after a timeout: the halved value is
    a threshold, and the host starts again from the probe, one request; each
    answer adds one up to the threshold.  Jumping straight back to it sent a
    limiter that had just refilled a burst as big as it (12 of 30 rows), most
    of it refused again.
  - *Additive increase* (:meth:`Scheduler.host_answered`): past the
    threshold, ``limit`` answers below 500 (while not paused) raise the
    limit by one: about one more request under way per round trip at that
    rate.  At ``per_host`` the host is un-throttled again.
  - What the limit counts is requests *awaiting their answer* (the head),
    sent since the last decrease (``HostPool.unanswered``): a rate limiter
    meters requests, not bodies.  A long download under way, or the probe
    whose head said 200 and whose body is still coming, does not hold the
    queue back (as the probe itself is not held back by what was under way
    before the pause); ``per_host`` still caps the connections.  A request
    that ends unanswered (a timeout, a reset) stops counting
    (:meth:`Scheduler.request_lost`); one lost where nobody tells us (a
    kept-alive connection found dead) is let go when its connection is: the
    count never exceeds the connections busy.
  - ``limit`` 0 means un-throttled (``per_host`` applies): the hot path (a
    connection's head, :meth:`Scheduler.released`,
    :meth:`Scheduler.host_answered`) pays one attribute check for it, so a
    host that never pushes back is served exactly as before.
* Pacing (:meth:`Scheduler._pace`): a rate limiter meters requests per
  second, and even one request at a time is as fast as the host answers
  (hundreds a second on a near host): every round after a pause ran into
  it again.  A host letting 2 requests a second through refused each row
  twice on average, and 1 or 2 rows of 30 ran out of attempts
  (``http_429``).  So a host that pushes back having
  let some requests through since its last pause began is *paced*: its
  requests go out ``HostPool.spacing`` seconds apart, the time that round
  took per request it let through, its pause included: the pace it showed
  it keeps.  Each answer below 500 shortens the spacing by 3% (the host is
  probed for more, as the additive increase does), and under a millisecond
  pacing ends.  Not from a round that let nothing through (the probe
  refused: the pause was too short, and pauses grow).  Nor is the spacing
  doubled at each push-back, as TCP halves its window: with a tenth of a
  host's URLs answering 429 every time, doubling would outgrow the easing
  (2 x 0.97^10 > 1) up to a request a minute; set from the pace shown, it
  settles near a third of the pause.
* Circuit breaker: after ``host_failures`` connect failures or timeouts in a
  row on one host, with no response in between, the host is given up: its
  queued and future transfers fail at once with the last error, so a dead
  host costs one ``--timeout``, not one per row.  Connections that could not
  be made to a proxy count for the proxy, across all the origins behind it.
  A TLS handshake reset or closed by the server (``HandshakeLost``) counts
  too, but a burst of them counts once: one that began before the last one
  counted was under way with it (a loaded server resetting the ``per_host``
  handshakes it got at once is not a dead host; one resetting every
  handshake still is, after ``host_failures`` bursts).

A connection being closed keeps its slot counted until the engine reports it
closed (:meth:`Scheduler.closed`), but not as available: ``closing`` counts
slots already promised to someone else.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from swarmget.engine.classify import HandshakeLost
from swarmget.engine.job import Transfer
from swarmget.engine.pool import HostPool, PooledConnection
from swarmget.errors import ErrorCode, TransferError
from swarmget.net.address import Address
from swarmget.protocol import ConnectionClosed

CONNECT_SLICE: Final = 32
# Pacing (Scheduler._pace): the longest spacing between two requests to a host,
# what each answer leaves of it, and the shortest worth keeping.
MAX_SPACING: Final = 60.0
SPACING_EASE: Final = 0.97
MIN_SPACING: Final = 0.001
MIN_RESOLVING: Final = 16
MAX_RESOLVING: Final = 256
# Failures that count towards giving up a host: it does not answer.
BREAKER_CODES: Final = frozenset({ErrorCode.CONNECT, ErrorCode.TIMEOUT})


class Action:
    __slots__ = ()


class Start(Action):
    """Send ``transfer`` on ``conn``, an open connection of its origin."""

    __slots__ = ("conn", "transfer")

    def __init__(self, conn: PooledConnection, transfer: Transfer) -> None:
        self.conn = conn
        self.transfer = transfer


class Dial(Action):
    """Open a new connection for ``pool``; ``transfer`` goes on it."""

    __slots__ = ("pool", "transfer")

    def __init__(self, pool: HostPool, transfer: Transfer) -> None:
        self.pool = pool
        self.transfer = transfer


class Close(Action):
    __slots__ = ("conn",)

    def __init__(self, conn: PooledConnection) -> None:
        self.conn = conn


class Resolve(Action):
    __slots__ = ("pool",)

    def __init__(self, pool: HostPool) -> None:
        self.pool = pool


class Fail(Action):
    __slots__ = ("error", "transfer")

    def __init__(self, transfer: Transfer, error: TransferError) -> None:
        self.transfer = transfer
        self.error = error


class Defer(Action):
    """Call :meth:`Scheduler.dispatch_deferred` in the next loop turn."""

    __slots__ = ()


class WakeAt(Action):
    """Call :meth:`Scheduler.wake` for ``pool`` at loop time ``until``, when its
    push-back ends or, a paced host, when its next request may go."""

    __slots__ = ("pool", "until")

    def __init__(self, pool: HostPool, until: float) -> None:
        self.pool = pool
        self.until = until


class Scheduler:
    __slots__ = (
        "_closing",
        "_dead_proxies",
        "_dead_proxy_whys",
        "_deferred",
        "_idle",
        "_naming",
        "_parked",
        "_proxy_failures",
        "_slice_connects",
        "_slice_turn",
        "_starved",
        "closing",
        "concurrency",
        "host_failures",
        "max_resolving",
        "open",
        "paused",
        "per_host",
        "resolving",
        "stopping",
    )

    def __init__(self, concurrency: int, per_host: int, host_failures: int = 5) -> None:
        self.concurrency = concurrency
        self.per_host = per_host
        self.host_failures = host_failures  # 0: never give a host up
        self.open = 0  # connections (and dials) open, all pools
        self.closing = 0  # of those, being closed to free their slot
        self.stopping = False  # stopped (a fatal error, abort, close): reuse nothing, start nothing
        self._closing: set[PooledConnection] = set()
        self._idle: dict[PooledConnection, None] = {}  # all idle connections, oldest first
        self._starved: dict[HostPool, None] = {}  # pools waiting for a global slot
        self._deferred: dict[HostPool, None] = {}  # pools waiting for the next connect slice
        self._slice_turn = -1.0  # the ``now`` of the turn _slice_connects counts
        self._slice_connects = 0
        self.max_resolving = max(MIN_RESOLVING, min(concurrency, MAX_RESOLVING))
        self.resolving = 0  # lookups in flight, all pools
        self._naming: dict[HostPool, None] = {}  # pools waiting for a lookup slot
        # The circuit breaker of proxies (host, port): connections to it that
        # failed in a row, and the error of a proxy given up.
        self._proxy_failures: dict[tuple[str, int], int] = {}
        self._dead_proxies: dict[tuple[str, int], TransferError] = {}
        self._dead_proxy_whys: dict[tuple[str, int], str] = {}  # HostPool.given_up_why
        self.paused: dict[HostPool, None] = {}  # pools pushed back, until their pause is over
        # Transfers queued on paused pools, kept as they come and go: parked() is
        # asked once per row finished, and summing over thousands of paused
        # hosts each time made a large crawl quadratic.
        self._parked = 0

    # -- transfers in ------------------------------------------------------------------

    def submit(
        self, pool: HostPool, transfer: Transfer, now: float, front: bool = False
    ) -> list[Action]:
        if front:
            pool.queue.appendleft(transfer)
        else:
            pool.queue.append(transfer)
        if pool.paused_until and pool in self.paused:
            self._parked += 1
        return self._dispatched(pool, now)

    def unqueue(self, pool: HostPool, transfers: list[Transfer]) -> None:
        """Take ``transfers`` out of ``pool``'s queue: the engine fails them (their
        --deadline ran out while the host's name was looked up)."""
        gone = {id(transfer) for transfer in transfers}
        kept = [transfer for transfer in pool.queue if id(transfer) not in gone]
        if pool.paused_until and pool in self.paused:
            self._parked -= len(pool.queue) - len(kept)
        pool.queue.clear()
        pool.queue.extend(kept)

    def dispatch_deferred(self, now: float) -> list[Action]:
        deferred, self._deferred = self._deferred, {}
        actions: list[Action] = []
        for pool in deferred:
            self._dispatch(pool, now, actions)
        return actions

    # -- connections: done, idle, gone ---------------------------------------------------

    def released(self, conn: PooledConnection, reusable: bool, now: float) -> list[Action]:
        """``conn`` finished its transfer: give it the next one, park it, or close it."""
        pool = conn.pool
        if not reusable or self.stopping:
            return [self._close(conn)]
        if (
            pool.queue
            and pool.given_up is None
            and not pool.queue[0].fresh
            and pool.paused_until == 0.0
            and not pool.probing
            and (not pool.limit or self._unanswered(pool) < pool.limit)
            and (not pool.spacing or now >= pool.next_send)
        ):
            self._sent(pool, now)
            return [Start(conn, pool.queue.popleft())]
        if self._starved:
            return [self._close(conn)]
        conn.idle_since = now
        pool.idle.append(conn)
        self._idle[conn] = None
        if not pool.queue:
            return []
        return self._dispatched(pool, now)  # the next transfer must have a new connection

    def closed(self, conn: PooledConnection, now: float) -> list[Action]:
        """``conn`` is closed (by us or by the server): its slot is free."""
        pool = conn.pool
        if conn in self._idle:
            del self._idle[conn]
            pool.idle.remove(conn)
        if conn in self._closing:
            self._closing.discard(conn)
            self.closing -= 1
            pool.closing -= 1
        return self._slot_freed(pool, now)

    def dial_failed(self, pool: HostPool, now: float) -> list[Action]:
        """A :class:`Dial` did not produce a connection."""
        return self._slot_freed(pool, now)

    def idle_connections(self) -> list[PooledConnection]:
        return list(self._idle)

    # -- hosts: names and health ---------------------------------------------------------

    def resolved(
        self,
        pool: HostPool,
        addresses: list[Address] | None,
        error: TransferError | None,
        refresh_at: float,
        now: float,
    ) -> list[Action]:
        pool.resolving = False
        self.resolving -= 1
        pool.refresh_at = refresh_at
        # A refresh that fails keeps the addresses that worked: a DNS blip
        # should not fail a host we are using.
        if addresses is not None or pool.addresses is None:
            pool.addresses = addresses
            pool.dns_error = error
        actions: list[Action] = []
        self._dispatch(pool, now, actions)
        while self._naming and self.resolving < self.max_resolving:
            waiting = next(iter(self._naming))
            del self._naming[waiting]
            if waiting.queue:
                self._dispatch(waiting, now, actions)
        return actions

    def host_failed(
        self,
        pool: HostPool,
        error: TransferError,
        *,
        dialling: bool = False,
        started: float = float("inf"),
        now: float = 0.0,
    ) -> list[Action]:
        """A transfer on ``pool`` failed (at loop time ``now``); maybe give the host
        up (the circuit breaker).

        ``dialling``: the connection itself was never made.  Through a proxy
        that is the proxy's failure, whatever the origin: a dead proxy is given
        up as a dead host is, for every origin behind it (counted per origin,
        a thousand origins behind a black-holed proxy each paid their own
        timeouts and retries)."""
        if error.code not in BREAKER_CODES or pool.given_up is not None:
            return []
        adopted: list[Action] = []
        if dialling and self._behind_dead_proxy(pool, adopted):
            return adopted  # its proxy was given up already: counted again nowhere
        if isinstance(error, ConnectionClosed):
            # Accepted, then closed or reset before answering: a host that is up
            # and drops some connections (a burst of parallel ones failing at
            # once gave a flaky host up) is not a dead one.
            return []
        if pool.answered_at >= started:
            # The host answered since this attempt began (``started``): it is up.
            # Five stalled URLs that began together timed out together, "in a
            # row", and a host serving 90 files a second was given up.
            return []
        if not self.host_failures:
            return []
        if isinstance(error, HandshakeLost):
            if started < pool.handshake_lost_at:
                return []  # of the burst already counted
            pool.handshake_lost_at = now
        actions: list[Action] = []
        if dialling and pool.proxy is not None:
            proxy = pool.connect_to
            failures = self._proxy_failures[proxy] = self._proxy_failures.get(proxy, 0) + 1
            if failures >= self.host_failures:
                why = (
                    f"proxy {pool.via} given up after {failures} "
                    "failed connections in a row (--host-failures)"
                )
                self._dead_proxies[proxy] = self._give_up(pool, error, why, actions)
                self._dead_proxy_whys[proxy] = why
                return actions
        pool.consecutive_failures += 1
        if pool.consecutive_failures < self.host_failures:
            return []
        why = (
            f"host {pool.host_port} given up after "
            f"{pool.consecutive_failures} failed connections in a row (--host-failures)"
        )
        self._give_up(pool, error, why, actions)
        return actions

    @staticmethod
    def load_status(pool: HostPool, status: int, key: int) -> int:
        """``status`` as it speaks of the host's load: a 503 to a second row in a
        row (no other answer between) is read as a 429.  A 503 may be one URL's
        trouble (one file's backend down), and then pauses only its row; but
        nginx's limit_req and limit_conn refuse with 503 by default, no
        Retry-After, and the queue went on into the limiter at --per-host (a
        third of the rows failed http_503).  From a host that has pushed back
        and is still slowed down (or probed), any 503 is read so: the row that
        began each run of them spent an attempt on it, and some ran out.
        Asked once per response head and again when its transfer ends: the
        same answer both times."""
        if status != 503:
            pool.refused_503 = -1
            return status
        if pool.refused_503 < 0:
            pool.refused_503 = key
        if pool.refused_503 != key or pool.limit or pool.probing:
            return 429
        return status

    def host_answered(self, pool: HostPool, now: float = 0.0, status: int = 200) -> list[Action]:
        """The host sent a response head (``status``): it is up, and unless that
        was a 429 it is no longer pushing back (the queue may go out again)."""
        pool.consecutive_failures = 0
        pool.answered_at = now
        if pool.proxy is not None and self._proxy_failures:
            self._proxy_failures.pop(pool.connect_to, None)
        if status == 429:
            return []
        pool.push_backs = 0
        if status < 500:
            pool.accepted += 1
            if pool.spacing:
                self._ease(pool)
        if pool.probing:
            # The probe's answer is counted towards the ramp when its transfer
            # ends (the engine reports a probe's head, then its end).
            pool.probing = pool.probe_out = False
            return self._dispatched(pool, now)
        if pool.limit and self._ramped_up(pool, status):
            return self._dispatched(pool, now)
        return []

    def head_came(self, pool: HostPool, status: int, started: float, now: float) -> list[Action]:
        """A response head came from a host being probed or throttled, for a
        request sent at loop time ``started``: the request is answered (if
        that was the probe's, the queue goes on now, not when its body ends)."""
        answered = self._answered(pool, started)
        if pool.probing and status != 429:
            return self.host_answered(pool, now, status)
        actions: list[Action] = []
        if answered and pool.queue:
            # Next turn: a short body ends in this one, and its connection
            # takes the next request itself (released) rather than idling
            # beside a new one.  A long body's does not: another goes then.
            self._defer(pool, actions)
        return actions

    def request_lost(
        self, pool: HostPool, now: float, started: float = float("inf")
    ) -> list[Action]:
        """A request to ``pool`` sent at loop time ``started`` ended with no
        answer (a timeout, a reset, a failed connect): it no longer counts
        against a throttled host's limit, and if it was the probe after a
        pause, another goes out."""
        answered = self._answered(pool, started)
        if pool.probing and pool.probe_out:
            pool.probe_out = False
            return self._dispatched(pool, now)
        if answered and pool.queue:
            return self._dispatched(pool, now)
        return []

    @staticmethod
    def _answered(pool: HostPool, started: float) -> bool:
        """Count a request sent at loop time ``started`` as no longer awaiting its
        answer; False if it was not counted (un-throttled, or sent before the
        last decrease, whose count began at 0)."""
        if not pool.limit or started < pool.slowed_at or not pool.unanswered:
            return False
        pool.unanswered -= 1
        return True

    def _ramped_up(self, pool: HostPool, status: int) -> bool:
        """Count an answer of a throttled host: below its threshold, each one
        allows one more request under way (slow start); past it, every
        ``limit`` of them (the additive increase).  A 5xx is no sign the host
        keeps up, nor is an answer while it is paused (to a request sent
        before it pushed back)."""
        if status >= 500 or pool.paused_until:
            return False
        if pool.limit < pool.threshold:
            pool.limit += 1
            return True
        pool.ramp += 1
        if pool.ramp < pool.limit:
            return False
        pool.ramp = 0
        pool.limit += 1
        if pool.limit >= self.per_host:
            pool.limit = 0  # all the way back: un-throttled
        return True

    def slow_down(self, pool: HostPool, now: float, started: float = float("inf")) -> None:
        """``pool``'s host pushed back on a request sent at loop time ``started``:
        allow it half the requests it had under way (the multiplicative
        decrease; see the module docstring), unless that request went out
        before the last decrease, which answered the same round already."""
        if started < pool.slowed_at:
            return
        pool.slowed_at = now
        pool.ramp = 0
        pool.unanswered = 0  # what is under way now does not hold back what comes next
        had = pool.limit or self.per_host
        if not pool.probing:  # a probe is under way alone by our choice, not the host's
            had = min(had, self._busy(pool))
        pool.limit = pool.threshold = max(1, had // 2)
        if pool.limit >= self.per_host:
            pool.limit = 0  # per_host 1: already as slow as we go

    @staticmethod
    def _pace(pool: HostPool, now: float) -> None:
        """``pool``'s host pushed back, having let some requests
        through since its last pause began: space them out at the pace it
        showed (see the module docstring)."""
        pool.spacing = min(MAX_SPACING, (now - pool.pause_began) / pool.accepted)

    @staticmethod
    def _ease(pool: HostPool) -> None:
        """A paced host answered: allow it a little more (see the module docstring)."""
        pool.spacing *= SPACING_EASE
        if pool.spacing < MIN_SPACING:
            pool.spacing = 0.0

    @staticmethod
    def _busy(pool: HostPool) -> int:
        """Requests under way (or connections being made) to ``pool``'s host."""
        return pool.open - pool.closing - len(pool.idle)

    def _unanswered(self, pool: HostPool) -> int:
        """Requests sent to a throttled host since its last decrease, not yet
        answered: never more than are under way (one that ended unanswered
        unbeknown to us, on a kept-alive connection found dead, is let go)."""
        return min(pool.unanswered, self._busy(pool))

    def pushed_back(
        self,
        pool: HostPool,
        until: float,
        now: float,
        error: TransferError,
        started: float = float("inf"),
        first: bool = True,
    ) -> list[Action]:
        """The host asked us to slow down (429, failing with ``error``, for a request
        sent at loop time ``started``): send it nothing new before loop time
        ``until``.  A refusal of a request sent before the latest pause began
        tells nothing new (a burst refused one by one, however slowly, is one
        pause): it neither pauses again nor counts towards giving up.

        Nor does a row refused again (not ``first``; the engine queues it behind
        the others, so the next probe is another row): a host that refuses
        some URLs every time while it serves the others was given up on those
        alone, failing the rest unasked.  It takes ``host_failures`` rows in a
        row, each refused at its first 429, with no answer between them."""
        actions: list[Action] = []
        if pool.given_up is not None or started < pool.pause_began:
            return actions
        if pool.paused_until == 0.0:
            if pool.accepted and pool.pause_began >= 0:
                self._pace(pool, now)
            pool.pause_began = now
            pool.accepted = 0
            self.slow_down(pool, now, started)
            if pool.limit:  # slow start: from the probe up to the halved limit
                pool.threshold, pool.limit = pool.limit, 1
            if first:
                pool.push_backs += 1
            if self.host_failures and pool.push_backs >= self.host_failures:
                why = (
                    f"host {pool.host_port} given up: {pool.push_backs} "
                    "rows in a row refused with 429 Too Many Requests (--host-failures)"
                )
                self._give_up(pool, error, why, actions)
                return actions
        if until > pool.paused_until:
            pool.paused_until = until
            if pool not in self.paused:
                self.paused[pool] = None
                self._parked += len(pool.queue)
            actions.append(WakeAt(pool, until))
        return actions

    def _end_pause(self, pool: HostPool) -> None:
        pool.paused_until = 0.0
        self._unpause(pool)
        pool.probing = True
        pool.probe_out = False

    def _unpause(self, pool: HostPool) -> None:
        if pool in self.paused:
            del self.paused[pool]
            self._parked -= len(pool.queue)

    def parked(self) -> int:
        """Rows queued for hosts that are pushed back: they wait, and should not
        keep other hosts' rows out of the engine meanwhile (Engine._refill).
        While a pool is paused its queue only grows (submit) or is failed whole
        (_fail_queue): nothing is sent to it."""
        return self._parked

    def held_back(self, pools: Iterable[HostPool], since: float) -> int:
        """Rows queued for hosts at their ``per_host`` limit while connections are
        to spare, behind a row that came in before loop time ``since``: each
        waits for its own slow host alone, however many others could take it
        (Engine.parked).  Paused hosts' rows are :meth:`parked` already."""
        if self.open - self.closing >= self.concurrency:
            return 0  # every connection is busy: rows wait for any, not for their host
        per_host = self.per_host
        return sum(
            len(pool.queue)
            for pool in pools
            if pool.queue
            and not pool.paused_until
            and (
                pool.spacing
                or (
                    self._unanswered(pool) >= pool.limit
                    if pool.limit
                    else pool.open - pool.closing >= per_host
                )
            )
            and pool.queue[0].job.admitted < since
        )

    def wake(self, pool: HostPool, until: float, now: float) -> list[Action]:
        """The pause that was to end at ``until`` is over, unless a later one replaced
        it: one request goes out, the rest once the host answers it (probing)."""
        if until == pool.pace_wake:  # pacing's timer: the next request may go
            pool.pace_wake = 0.0
            return self._dispatched(pool, now)
        if pool.paused_until != until:
            return []  # replaced by a later pause, or already over (see _dispatch)
        self._end_pause(pool)
        return self._dispatched(pool, now)

    def dead_proxy(self, pool: HostPool) -> TransferError | None:
        """The error of ``pool``'s proxy, if it was given up."""
        return self._dead_proxies.get(pool.connect_to) if pool.proxy is not None else None

    def give_up(self, pool: HostPool, cause: TransferError, why: str) -> list[Action]:
        """Give ``pool``'s host up now, ``cause`` having shown ``why``: its queued
        and future transfers fail with both."""
        actions: list[Action] = []
        if pool.given_up is None:
            self._give_up(pool, cause, why, actions)
        return actions

    def _give_up(
        self, pool: HostPool, cause: TransferError, why: str, actions: list[Action]
    ) -> TransferError:
        error = TransferError(cause.code, f"{cause.message}; {why}")
        self._retire(pool, error, why, actions)
        return error

    def _retire(
        self, pool: HostPool, error: TransferError, why: str, actions: list[Action]
    ) -> None:
        """``pool`` is given up with ``error``: no pause to wait out, its queue failed."""
        pool.mark_given_up(error, why)
        self._unpause(pool)
        self._fail_queue(pool, error, actions)

    # -- the rules ---------------------------------------------------------------------

    def _behind_dead_proxy(self, pool: HostPool, actions: list[Action]) -> bool:
        """If ``pool``'s proxy was given up, so is the pool, with the proxy's error.

        A failed dial behind a dead proxy (one of those its giving up cut short,
        say) is not counted again: counted, each gave the proxy up anew, every
        message nesting the last one's ("given up after 3 ...; after 4 ...")."""
        dead = self.dead_proxy(pool) if self._dead_proxies else None
        if dead is None:
            return False
        self._retire(pool, dead, self._dead_proxy_whys.get(pool.connect_to, ""), actions)
        return True

    def _dispatch(self, pool: HostPool, now: float, actions: list[Action]) -> None:
        if pool.given_up is None and self._behind_dead_proxy(pool, actions):
            return
        if pool.given_up is not None:
            self._fail_queue(pool, pool.given_up, actions)
            return
        if pool.addresses is None:
            if pool.dns_error is not None and now < pool.refresh_at:
                self._fail_queue(pool, pool.dns_error, actions)
            elif pool.resolving or pool in self._naming:
                pass
            elif self.resolving < self.max_resolving:
                self._resolve(pool, now, actions)
            else:
                self._naming[pool] = None  # its turn comes as lookups end
            return
        if pool.paused_until:
            if pool.paused_until > now:
                return  # pushed back: WakeAt comes back to the queue
            # Over, though its WakeAt may come later in this turn (the refused
            # row's retry timer, set first, comes first): probe from now.
            self._end_pause(pool)
        if (
            pool.refresh_at <= now
            and not pool.resolving
            and pool.queue
            and self.resolving < self.max_resolving
        ):
            self._resolve(pool, now, actions)  # in the background; connects use what we have
        queue = pool.queue
        while queue and not self.stopping:
            if self._holding_back(pool, now, actions):
                return
            if queue[0].fresh:
                # Its kept-alive connection had been closed by the server: this
                # one goes out on a new connection, not on another old one (which
                # may be just as dead), making room by closing an idle one.
                if pool.idle and pool.open - pool.closing >= self.per_host:
                    actions.append(self._close(pool.idle[0]))
            elif pool.idle:
                conn = self._take_idle(pool, actions)
                if conn is not None:
                    actions.append(Start(conn, queue.popleft()))
                    self._sent(pool, now)
                continue
            if pool.open - pool.closing >= self.per_host:
                return
            if self.open - self.closing >= self.concurrency and not self._evict_idle(actions):
                self._starved[pool] = None
                return
            if not self._connect_slot(pool, now, actions):
                return
            transfer = queue.popleft()
            transfer.fresh = False
            pool.open += 1
            self.open += 1
            actions.append(Dial(pool, transfer))
            self._sent(pool, now)

    def _holding_back(self, pool: HostPool, now: float, actions: list[Action]) -> bool:
        """Must ``pool``'s next request wait, since the host pushed back?"""
        if pool.probe_out:
            return True  # after a pause, one request, until it is answered
        if pool.limit and self._unanswered(pool) >= pool.limit:
            return True  # throttled since it pushed back: an answer brings us back
        if pool.spacing and now < pool.next_send:
            self._pace_wake(pool, actions)
            return True  # paced: its timer brings us back
        return False

    @staticmethod
    def _sent(pool: HostPool, now: float) -> None:
        """A request is going to ``pool``'s host: the probe, if it is probed; one
        awaiting its answer, if it is throttled; the next no sooner than its
        spacing, if it is paced."""
        pool.probe_out = pool.probing
        if pool.limit:
            pool.unanswered += 1
        if pool.spacing:
            pool.next_send = now + pool.spacing

    @staticmethod
    def _pace_wake(pool: HostPool, actions: list[Action]) -> None:
        """Arm the timer that sends a paced host's next request (one at a time)."""
        if pool.pace_wake != pool.next_send:
            pool.pace_wake = pool.next_send
            actions.append(WakeAt(pool, pool.next_send))

    def _dispatched(self, pool: HostPool, now: float) -> list[Action]:
        """The actions :meth:`_dispatch` takes for ``pool`` now."""
        actions: list[Action] = []
        self._dispatch(pool, now, actions)
        return actions

    def _resolve(self, pool: HostPool, now: float, actions: list[Action]) -> None:
        pool.resolving = True
        pool.resolving_since = now
        self.resolving += 1
        actions.append(Resolve(pool))

    def _slot_freed(self, pool: HostPool, now: float) -> list[Action]:
        pool.open -= 1
        self.open -= 1
        actions: list[Action] = []
        if pool.queue:
            self._dispatch(pool, now, actions)
        while self._starved and self.open - self.closing < self.concurrency:
            starved = next(iter(self._starved))
            del self._starved[starved]
            self._dispatch(starved, now, actions)
        return actions

    def _connect_slot(self, pool: HostPool, now: float, actions: list[Action]) -> bool:
        """May ``pool`` start a connection in this loop turn (see CONNECT_SLICE)?"""
        if now != self._slice_turn:
            self._slice_turn, self._slice_connects = now, 0
        if self._slice_connects < CONNECT_SLICE:
            self._slice_connects += 1
            return True
        self._defer(pool, actions)
        return False

    def _defer(self, pool: HostPool, actions: list[Action]) -> None:
        """Dispatch ``pool`` in the next loop turn."""
        if not self._deferred:
            actions.append(Defer())
        self._deferred[pool] = None

    def _take_idle(self, pool: HostPool, actions: list[Action]) -> PooledConnection | None:
        """The pool's most recently parked connection, if the server has not closed
        it meanwhile (a close that came while it idled, not yet seen by the loop:
        sending on it would cost the transfer an attempt); else None, and it closes."""
        conn = pool.idle[-1]
        if conn.looks_closed():
            actions.append(self._close(conn))  # out of the idle lists, its slot counted free
            return None
        pool.idle.pop()
        del self._idle[conn]
        return conn

    def _evict_idle(self, actions: list[Action]) -> bool:
        if not self._idle:
            return False
        actions.append(self._close(next(iter(self._idle))))
        return True

    def _close(self, conn: PooledConnection) -> Close:
        """Take ``conn`` out of the idle lists; its slot counts as free from now."""
        pool = conn.pool
        if conn in self._idle:
            del self._idle[conn]
            pool.idle.remove(conn)
        if conn not in self._closing:
            self._closing.add(conn)
            self.closing += 1
            pool.closing += 1
        return Close(conn)

    def _fail_queue(self, pool: HostPool, error: TransferError, actions: list[Action]) -> None:
        if pool in self.paused:
            self._parked -= len(pool.queue)
        # A row never sent, where the host was given up for the others' sake: say so.
        unsent = pool.unsent if error is pool.given_up else None
        while pool.queue:
            transfer = pool.queue.popleft()
            if unsent is not None and not transfer.retry.attempts:
                actions.append(Fail(transfer, unsent))
            else:
                actions.append(Fail(transfer, error))
