"""Per-origin bookkeeping: queued transfers, idle keep-alive connections, addresses.

An origin reached through an http proxy keeps its own pool (the same origin
never mixes proxied and direct connections: the choice is made once per origin
for the whole run); only ``connect_to`` (what is resolved and dialled), the
kind of connection and the request template differ.  So ``per_host`` still
counts connections per target origin, and connections to the proxy are not
shared between origins.

:class:`PooledConnection` is what the scheduler knows of a connection: its
pool, and that it can start a transfer or be closed.  The HTTP connection
classes derive from it, so this module (and the scheduler) never import them.
"""

from __future__ import annotations

import ssl
from collections import deque
from typing import Final

from swarmget.engine.job import Transfer
from swarmget.engine.urls import Origin
from swarmget.errors import TransferError
from swarmget.net.address import Address
from swarmget.net.proxy import Proxy
from swarmget.protocol.request import RequestTemplate

# How a pool's connections are made.
DIRECT: Final = 0
FORWARD_PROXY: Final = 1  # plain http through an http proxy (absolute-form targets)
TUNNEL: Final = 2  # https through an http proxy's CONNECT tunnel


class PooledConnection:
    """The scheduler's view of a connection (see the module docstring)."""

    __slots__ = ("idle_since", "pool")

    def __init__(self, pool: HostPool) -> None:
        self.pool = pool
        self.idle_since = 0.0

    def start(self, transfer: Transfer) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def looks_closed(self) -> bool:
        """Has the peer closed this idle connection (or sent on it unasked)?"""
        return False


class HostPool:
    __slots__ = (
        "accepted",
        "addresses",
        "answered_at",
        "closing",
        "connect_label",
        "connect_to",
        "consecutive_failures",
        "dns_error",
        "given_up",
        "given_up_why",
        "handshake_lost_at",
        "idle",
        "kind",
        "limit",
        "next_send",
        "open",
        "origin",
        "pace_wake",
        "pause_began",
        "paused_until",
        "probe_out",
        "probing",
        "proxy",
        "push_backs",
        "queue",
        "ramp",
        "refresh_at",
        "refused_503",
        "resolving",
        "resolving_since",
        "reuse_broken",
        "slowed_at",
        "spacing",
        "template",
        "threshold",
        "tls_session",
        "unanswered",
        "unsent",
        "via",
        "via_source",
    )

    def __init__(
        self, origin: Origin, template: RequestTemplate, kind: int, proxy: Proxy | None = None
    ) -> None:
        self.origin = origin
        self.template = template
        self.kind = kind
        self.proxy = proxy
        # For messages: the proxy as host:port, and with where it was configured.
        self.via = str(proxy) if proxy is not None else ""
        self.via_source = f"{proxy} ({proxy.source})" if proxy is not None else ""
        # Where connections go: the origin, or its proxy.
        self.connect_to = (proxy.host, proxy.port) if proxy else (origin[1], origin[2])
        host, port = self.connect_to
        # In a failed connect's message, "connect to h:443 failed" (as curl
        # names host and port): the name may lead to an address not expected.
        self.connect_label = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.queue: deque[Transfer] = deque()
        self.idle: list[PooledConnection] = []  # most recently used last
        self.open = 0  # connections of this origin, connecting, active or idle
        self.closing = 0  # of those, being closed to free their slot
        self.addresses: list[Address] | None = None
        self.dns_error: TransferError | None = None
        self.resolving = False
        self.resolving_since = 0.0  # loop time the lookup in flight began
        self.refresh_at = 0.0  # loop time when the addresses (or dns_error) go stale
        # The last TLS session a connection got here: the next one resumes it.
        self.tls_session: ssl.SSLSession | None = None
        # Circuit breaker: connect failures and timeouts in a row, and the error
        # every remaining transfer fails with once the host is given up.
        self.consecutive_failures = 0
        self.answered_at = -1.0  # loop time of the host's last response
        self.handshake_lost_at = -1.0  # loop time of the last lost handshake counted
        self.given_up: TransferError | None = None
        # Why, without the error that tipped it ("host h:443 given up after 5
        # failed connections in a row ..."): for a row not retried because of it.
        self.given_up_why = ""
        # The same, for the rows that never went out when the host was given up
        # after trying it ("not requested: ..."), so the manifest says so.
        self.unsent: TransferError | None = None
        self.paused_until = 0.0  # push-back: nothing new goes out before (Scheduler.pushed_back)
        self.pause_began = -1.0  # loop time the latest pause began
        self.push_backs = 0  # rows in a row refused at their first request, no other answer between
        self.probing = False  # after a pause: one request, until it is answered
        self.probe_out = False  # that one request has gone out
        # Politeness (AIMD, see the scheduler's docstring): requests allowed under way
        # since the host pushed back, 0 for the run's per_host: one attribute check.
        self.limit = 0
        self.ramp = 0  # answers counted towards the next +1 of ``limit``
        self.threshold = 0  # below this, each answer adds one to ``limit`` (slow start)
        self.slowed_at = -1.0  # loop time ``limit`` was last lowered
        self.unanswered = 0  # requests sent since then, their answer not yet come
        self.refused_503 = -1  # the row whose 503 began those in a row (Scheduler.load_status)
        # Pacing (Scheduler._pace): seconds between requests (0: not paced), when
        # the next may go, the timer armed for it (0: none), and answers since
        # the latest pause began (the pace the host showed).
        self.spacing = self.next_send = self.pace_wake = 0.0
        self.accepted = 0
        # A kept-alive connection met silence (no byte of an answer before --timeout):
        # keep-alive broken without a close; from then on, one request a connection.
        self.reuse_broken = False

    def mark_given_up(self, error: TransferError, why: str) -> None:
        """The host (or its proxy) is given up with ``error``, ``why`` being the
        reason without the error that tipped it ("" when not known)."""
        self.given_up = error
        self.given_up_why = why
        # Rows that never went out say so, wherever the giving up came from: a
        # row queued behind a dead proxy read as a failed connect of its own.
        self.unsent = TransferError(error.code, f"not requested: {error.message}")

    @property
    def host(self) -> str:
        return self.origin[1]

    @property
    def host_port(self) -> str:
        """The host for messages, with its port unless the scheme's own (one
        address may serve many origins, each given up alone)."""
        scheme, host, port = self.origin
        shown = f"[{host}]" if ":" in host else host
        return shown if port == (443 if scheme == "https" else 80) else f"{shown}:{port}"

    def __repr__(self) -> str:
        scheme, host, port = self.origin
        via = f" via {self.proxy}" if self.proxy else ""
        return f"<HostPool {scheme}://{host}:{port}{via} open={self.open} queued={len(self.queue)}>"


# Hosts given up whose pools were retired, remembered at most (see retire_idle).
GIVEN_UP_LIMIT: Final = 65536


def is_idle(pool: HostPool) -> bool:
    """Nothing open, closing, queued, being resolved or paused: forgetting the pool loses
    only what it caches (addresses, which the resolver caches too; a TLS session)."""
    return (
        pool.open == 0
        and pool.closing == 0
        and not pool.queue
        and not pool.resolving
        and pool.paused_until == 0.0  # a pause must outlast its refused row's wait
    )


def retire_idle(
    pools: dict[Origin, HostPool], keep: int, given_up: dict[Origin, TransferError]
) -> None:
    """Forget the oldest idle pools until at most ``keep`` are left (busy ones stay).

    A list spread over a million hosts must not keep a million pools (about 6 KB
    each with a TLS session): memory is not to grow with the list.  The one
    thing a pool knows that must outlast it -- its host was given up, so its
    other rows fail at once -- goes to ``given_up``, itself bounded.
    """
    for origin in list(pools):
        if len(pools) <= keep:
            break
        pool = pools[origin]
        if is_idle(pool):
            del pools[origin]
            if pool.given_up is not None:
                given_up[origin] = pool.given_up
    if len(given_up) > GIVEN_UP_LIMIT:
        newest = list(given_up.items())[len(given_up) // 2 :]
        given_up.clear()
        given_up.update(newest)
