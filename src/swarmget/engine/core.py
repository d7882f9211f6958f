"""The engine: planned rows in, requests on pooled connections, outcomes out.

Theory of operation
-------------------
The engine is the downloading half of a run, one per process.  It is fed
planned rows (:class:`~swarmget.sinks.base.Assignment`, made by the driver's
planner) with :meth:`Engine.add`, and reports each row's outcome once through
its :class:`~swarmget.engine.events.EngineEvents`.  It is composed of parts
that each do one job:

* intake (here): rows wait in a deque; at most ``2 * concurrency`` (at least
  256) are in memory as jobs at once, so memory does not grow with the input;
* the :class:`~swarmget.engine.scheduler.Scheduler` (pure bookkeeping) says
  which transfer goes on which connection; the engine carries out its actions
  (:meth:`Engine._execute`);
* connections (``engine/connection.py`` and subclasses) move bytes and report
  through the small :class:`~swarmget.engine.owner.ConnectionOwner` protocol,
  which the engine implements;
* outcomes (:meth:`Engine.ended`): a verdict per transfer becomes a published
  file, a followed redirect, a retry after a backoff, or a failed row;
* the sink (:class:`~swarmget.sinks.base.Sink`) owns where bytes go.

Requests made during a loop turn are sent together at its end, and the files
finished in a turn are published together after that (:meth:`_end_turn`):
the server works on the next files while we rename the finished ones.

A reused keep-alive connection that turns out to be closed by the server gets
the request again on a fresh connection once, without counting an attempt.
Every row ends as exactly one result, except when the run is interrupted or
stopped by a fatal error: rows in flight then get none (the planner knows
them, and a rerun redoes them), and their parts are kept.
"""

from __future__ import annotations

import hashlib
import mmap
import socket
from collections import deque
from collections.abc import Iterable
from typing import Final, TextIO

from swarmget.engine.classify import connect_failure
from swarmget.engine.connection import (
    ACTIVE,
    CONNECTING,
    HANDSHAKING,
    TUNNELLING,
    HTTPConnection,
    deadline_exceeded,
)
from swarmget.engine.events import EngineEvents
from swarmget.engine.https import HTTPSConnection
from swarmget.engine.job import Job, Transfer
from swarmget.engine.owner import ConnectionOwner
from swarmget.engine.pool import (
    DIRECT,
    FORWARD_PROXY,
    TUNNEL,
    HostPool,
    PooledConnection,
    retire_idle,
)
from swarmget.engine.retry import BURST, REDIRECT, RESTART, STALE, RetryPolicy, Stalled
from swarmget.engine.scheduler import (
    Action,
    Close,
    Defer,
    Dial,
    Fail,
    Resolve,
    Scheduler,
    Start,
    WakeAt,
)
from swarmget.engine.tunnel import TunnelHTTPSConnection
from swarmget.engine.urls import (
    Location,
    Origin,
    UrlSplitter,
    redact,
    redact_failure,
    redact_text,
    split_url,
)
from swarmget.engine.verdicts import ACCEPT, Verdict, resume_validator
from swarmget.engine.verdicts import REDIRECT as REDIRECTED
from swarmget.engine.verdicts import RESTART as RESTARTED
from swarmget.errors import ErrorCode, TransferError
from swarmget.loop import EventLoop
from swarmget.net.address import Address
from swarmget.net.connect import start_connect
from swarmget.net.dns import LazyResolver, make_resolver
from swarmget.net.eyeballs import HappyEyeballs
from swarmget.net.proxy import proxy_settings
from swarmget.net.tls import ClientTLS
from swarmget.options import SECRET_FIELDS, Options
from swarmget.protocol import ResponseHead
from swarmget.protocol.request import RequestTemplate, header_lines
from swarmget.report import FileResult, Waiting
from swarmget.sinks.base import Assignment, Hasher, Sink, Writer
from swarmget.sinks.files import OutputError

# One receive buffer per event loop.  Large because on a fast link the socket
# always holds more than a read takes, and each read reopens the TCP window a
# little: at 256 KiB the client sent 17 window updates per MiB and spent a third
# of its CPU on them (1 GiB over loopback: 0.98 s and 0.92 s of CPU; at 4 MiB
# 0.66 s, ahead of curl's 1.05 s).  Pages are touched only as far as a read
# fills them, so a run of small files pays nothing for the size.
RECV_BUFFER_SIZE: Final = 4 * 1024 * 1024
# Pools kept before idle ones are retired (engine/pool.py, retire_idle): enough
# that the hosts of a run's recent rows keep their addresses and TLS sessions.
POOL_LIMIT: Final = 4096
# How far rows parked on pushed-back hosts may stretch the intake window, in windows.
PARKED_WINDOWS: Final = 4
# How far rows waiting for their own host may stretch it (Engine._held_back):
# enough rows of a slow host for the fast ones among them to go by (each costs
# the engine and the driver ~1 KB), and how often they are counted (every pool).
HELD_BACK_LIMIT: Final = 8192
HELD_BACK_EVERY: Final = 0.05
# A host's rows count as held back once the first in its queue came in this
# long ago: a fast host turns its queue over in milliseconds, and stretching
# the window for it would only hold more of its rows in memory.
HELD_BACK_AFTER: Final = 1.0
# Requests wait for the end of the loop turn (see engine/connection.py), but no
# more than this many: a long turn then costs the first of them at most ~3 ms.
SEND_BATCH: Final = 32
# Bodies at least this large keep their part on failure and resume with Range.
RESUME_MIN_BYTES: Final = 1 << 20

# What a connection waits on, as Engine.waiting says it (after a count: "3 connecting to").
CONNECTING_TO: Final = "connecting to"
LOOKING_UP: Final = "looking up the address of"
BACKING_OFF: Final = "backing off from"  # rows waiting out a retry delay or a 429 pause
NOT_DUE: Final = float("inf")  # the next try of a wait on a connection: none is due
_WAITING_STAGES: Final = {
    CONNECTING: CONNECTING_TO,
    TUNNELLING: "connecting through the proxy to",
    HANDSHAKING: "in TLS handshake with",
}


def _not_retried(error: TransferError, pool: HostPool) -> TransferError:
    """``error`` of a row that would have been retried but for its host, given up
    (by this very failure, perhaps): said, or the row reads as failed at its
    first attempt despite --retries, for no reason given."""
    why = pool.given_up_why or (pool.given_up.message if pool.given_up is not None else "")
    return TransferError(error.code, f"{error.message}; not retried: {why}")


def _why_not_retried(error: TransferError, pool: HostPool | None, wait: str) -> TransferError:
    """``error`` of a row that would have been retried, saying why it is not:
    its host was given up (by this very failure, perhaps), or ``wait``, the
    wait before the retry, outlasts the row's --deadline.  Unsaid, the row
    reads as failed at its first attempt despite --retries, for no reason given."""
    if pool is not None and pool.given_up is not None:
        return error if _says_given_up(error, pool) else _not_retried(error, pool)
    if "deadline" in error.message:
        return error  # the deadline itself ended it ("deadline of 20s exceeded")
    return TransferError(error.code, f"{error.message}; not retried: {wait} is past --deadline")


def _refusals(transfer: Transfer, pool: HostPool, error: TransferError) -> int:
    """What a 429's pause grows with (RetryPolicy.push_back): the refused row's
    attempts, or the host's rows in a row refused at their first request, this
    one included (Scheduler.pushed_back counts them), whichever is more."""
    first = transfer.retry.count(error.code) == 1
    return max(transfer.retry.attempts, pool.push_backs + first)


def _asked_wait(retry_after: float | None, wait: float) -> str:
    """The wait before a retry, for a message: the server's own Retry-After
    (not the cap we would have waited at most), or our backoff."""
    if retry_after is not None:
        # Whole seconds from 100 on: an HTTP-date years ahead is not "2.3e+09 s".
        return (
            f"Retry-After {retry_after:.0f} s"
            if retry_after >= 100
            else f"Retry-After {retry_after:g} s"
        )
    return f"the backoff of {wait:.3g} s"


# A wait as Engine.waiting weighs it: (since, stage, host, rows, next try due).
Wait = tuple[float, str, str, int, float]


def _says_given_up(error: TransferError, pool: HostPool) -> bool:
    """Is ``error`` the one ``pool``'s giving up fails its rows with (the host's,
    or "not requested: ..." for a row never sent, so never tried: not retried
    says nothing more of it)?"""
    return error is pool.given_up or error is pool.unsent


def _shown(stage: str, pool: HostPool, since: float) -> Wait:
    """A wait as the display shows it: one connecting through a proxy waits on the
    proxy, whichever host it is for."""
    if stage == CONNECTING_TO and pool.proxy is not None:
        return since, "connecting to proxy", pool.via, 1, NOT_DUE
    return since, stage, pool.host_port, 1, NOT_DUE


def _waiting_stage(conn: HTTPConnection) -> str:
    """What ``conn`` waits on, "" when it waits on nothing (idle, closed)."""
    state = conn.state
    if state == ACTIVE:
        parser = conn.parser
        return (
            "receiving from" if parser is not None and parser.started else "awaiting a reply from"
        )
    return _WAITING_STAGES.get(state, "")


def _request_headers(options: Options) -> tuple[bytes, dict[str, str]]:
    """(the credential header lines, every other header of each request).

    Credentials go only to the first origin of each job (see Job.move_to).
    """
    user_headers = dict(options.headers)
    # A Host of the user's first (it replaces ours, see RequestTemplate), then
    # the credentials: both only for each job's first origin.
    credentials = {k: v for k, v in user_headers.items() if k.lower() == "host"}
    credentials.update((k, v) for k, v in user_headers.items() if k.lower() in SECRET_FIELDS)
    headers = {"User-Agent": options.user_agent, "Accept": "*/*", "Accept-Encoding": "identity"}
    for name, value in user_headers.items():
        if name not in credentials:
            # The user's spelling replaces ours ("user-agent" sent a second one).
            for ours in [k for k in headers if k.lower() == name.lower()]:
                del headers[ours]
            headers[name] = value
    return header_lines(credentials), headers


class Engine(ConnectionOwner):
    def __init__(
        self,
        sink: Sink,
        options: Options,
        events: EngineEvents,
        *,
        loop: EventLoop | None = None,
        warn_to: TextIO | None = None,
    ) -> None:
        self.options = options
        self.sink = sink
        # Everything that can fail on bad options comes first, before any
        # descriptor is opened, so a failing constructor leaks nothing.
        self.policy = RetryPolicy(retries=options.retries)
        self.tls = ClientTLS(options.cacert, options.insecure, warn_to=warn_to)
        # None unless some origin may go through a proxy (net/proxy.py).
        self.proxies = proxy_settings(options.proxy, options.no_proxy, options.trust_env)
        self.loop = loop or EventLoop()
        self._own_loop = loop is None
        self.resolver = self._resolver(options)
        self.events = sink.events_for(events, self.loop)
        self.scheduler = Scheduler(options.concurrency, options.per_host, options.host_failures)
        self.pools: dict[Origin, HostPool] = {}
        # Pools whose queued transfers wait for the host's name: the sweep ends
        # those past their --deadline (_expire_unnamed).
        self._unnamed: dict[HostPool, None] = {}
        self.connections: set[HTTPConnection] = set()
        # Connects racing several addresses, and the pool each is for.
        self.dialing: dict[HappyEyeballs, HostPool] = {}
        self._split = UrlSplitter().split
        self.credentials, self._headers = _request_headers(options)
        self.user_authorizes = any(name.lower() == "authorization" for name in options.headers)
        self._own_host = not any(k.lower() == "host" for k in options.headers)
        # An anonymous map, not a bytearray: CPython zeroes a bytearray, which
        # would make all 4 MiB resident in every worker before the first read.
        self._recv_buffer = mmap.mmap(-1, RECV_BUFFER_SIZE)
        self.recv_view = memoryview(self._recv_buffer)
        self._rows: deque[Assignment] = deque()
        self._input_done = False
        self.in_memory = 0  # jobs started and not yet reported
        self._held = 0  # rows waiting for their own busy host (_held_back), as last counted
        self._held_at = -1.0  # loop time of that count
        self._window = max(256, 2 * options.concurrency)
        self._pool_limit = max(POOL_LIMIT, 2 * (self._window + options.concurrency))
        self._given_up: dict[Origin, TransferError] = {}  # hosts of retired pools
        # Transfers waiting out their retry delay (on a timer, in no queue), as
        # Engine.waiting weighs them: a run whose rows all wait says so.
        self._backing_off: dict[Transfer, Wait] = {}
        self.fatal: OutputError | None = None
        self._to_publish: list[tuple[Transfer, FileResult]] = []  # complete, not yet published
        self._outbox: list[HTTPConnection] = []  # requests to send at the end of this turn
        self._end_turn_scheduled = False
        self._first_deadline = options.first_deadline
        self._long_file_rate = options.long_file_rate
        sweep = min(options.timeout, options.min_speed_window, self._first_deadline) / 8
        self._sweep_interval = min(1.0, max(0.02, sweep))
        self._sweeping = False

    def _resolver(self, options: Options) -> LazyResolver:
        servers, timeout = options.dns_servers, options.timeout
        loop = self.loop
        try:
            return LazyResolver(
                loop,
                lambda: make_resolver(loop, servers=servers, timeout=timeout),
                eager=bool(servers),
            )
        except BaseException:
            if self._own_loop:
                loop.close()  # a bad --dns-server: leave no socket behind
            raise

    # -- feeding and running ----------------------------------------------------------

    def add(self, rows: Iterable[Assignment]) -> None:
        """More planned rows to download."""
        self._rows.extend(rows)
        self._refill()

    def close_input(self) -> None:
        """No more rows will come: the engine is finished once these are."""
        self._input_done = True

    @property
    def finished(self) -> bool:
        if self.fatal is not None:
            return True
        return self._input_done and self.in_memory == 0 and not self._rows and not self.sink.busy

    def step(self, max_wait: float = 1.0) -> None:
        """One loop turn: wait for events (at most ``max_wait``), handle them."""
        if not self._sweeping:
            self._sweeping = True
            self.loop.now = self.loop.time()
            self.loop.call_later(self._sweep_interval, self._sweep)
        self.loop.run_once(max_wait)

    def run(self) -> None:
        """Run until every row added so far (and closed with close_input) is done."""
        while not self.finished:
            self.step()
        if self.fatal is not None:
            raise self.fatal

    def backlog(self) -> int:
        """Rows given to this engine and not yet reported."""
        return len(self._rows) + self.in_memory

    def abort(self, *, keep_parts: bool = True) -> None:
        """Stop without reporting rows in flight (a rerun redoes them).

        Interrupted (``keep_parts``): every part stays; a rerun continues the
        large ones that have a validator with Range, and overwrites the others
        from zero.  Stopped by a fatal error: only the parts worth resuming
        stay (the disk is full: give back what we can).  Files that are
        complete are published first.
        """
        self._input_done = True
        # Nothing new may start: closing the connections below frees their
        # slots, which the scheduler would give to the transfers queued behind.
        self.scheduler.stopping = True
        self._rows.clear()
        if self._to_publish:
            self._publish()
        for conn in list(self.connections):
            transfer = conn.transfer
            conn.transfer = None
            if transfer is not None:
                if keep_parts:
                    self._drop_writer(transfer, keep=True)
                else:
                    self._keep_or_drop_part(transfer)
            conn.close()

    def close(self) -> None:
        self.scheduler.stopping = True  # as in abort()
        for conn in list(self.connections):
            conn.close()
        for dial in self.dialing:
            dial.cancel()
        self.dialing.clear()
        self.resolver.close()
        self.sink.close()
        if self._own_loop:
            self.loop.close()

    def active(self) -> tuple[int, int]:
        """(transfers receiving, body bytes received by them so far): for progress.
        A resumed part's bytes from an earlier run are not received ones."""
        active = in_flight = 0
        for conn in self.connections:
            if conn.state == ACTIVE:
                active += 1
                writer, transfer = conn.writer, conn.transfer
                if writer is not None:
                    carried = transfer.job.carried if transfer is not None else 0
                    in_flight += max(0, writer.written - carried)
        return active, in_flight

    def waiting(self) -> Waiting | None:
        """What this engine has waited on longest: the connections at one stage on
        one host, with the oldest's silence.  For a progress display that has seen
        nothing finish for a while; a pass over the connections, called with each
        progress message that has no results (~10 a second), never per event."""
        # The host as the display names it.
        waits = [_shown(CONNECTING_TO, pool, dial.started) for dial, pool in self.dialing.items()]
        # A first lookup holds its host's rows back (a refresh does not: the
        # addresses it had still serve).
        waits.extend(
            (pool.resolving_since, LOOKING_UP, pool.host_port, 1, NOT_DUE)
            for pool in self.pools.values()
            if pool.resolving and pool.addresses is None
        )
        for conn in self.connections:
            stage = _waiting_stage(conn)
            if stage:
                waits.append(_shown(stage, conn.pool, conn.last_activity))
        waits.extend(self._backing_off.values())
        # Rows queued on a host that pushed back (429) wait for its pause to end.
        waits.extend(
            (pool.pause_began, BACKING_OFF, pool.host_port, len(pool.queue), pool.paused_until)
            for pool in self.scheduler.paused
            if pool.queue
        )
        if not waits:
            return None
        since, stage, host, _, _ = min(waits)
        # Counted as shown (workers' waits are summed alike: Supervisor).
        same = [other for other in waits if other[1] == stage and other[2] == host]
        now = self.loop.now
        due = min(other[4] for other in same)
        next_try_in = max(0.0, due - now) if due != NOT_DUE else None
        count = sum(other[3] for other in same)
        return Waiting(count, stage, host, max(0.0, now - since), next_try_in)

    # -- intake -----------------------------------------------------------------------

    def parked(self) -> int:
        """Rows waiting for hosts that pushed back (429), up to PARKED_WINDOWS
        windows, and for hosts busy to their ``per_host`` limit, up to
        HELD_BACK_LIMIT rows: as far as they may stretch the intake window (and
        the driver's backlog for this worker)."""
        parked = self.scheduler.parked()
        if parked:
            parked = min(parked, PARKED_WINDOWS * self._window)
        return parked + min(self._held_back(), HELD_BACK_LIMIT)

    def _held_back(self) -> int:
        """Rows queued for hosts at their connection limit while others could be
        opened.  A slow host's queue filled the window and every other host's
        rows waited behind it: 10,000 rows of a fast host, dealt between those
        of a host answering in 5 s on 4 connections, would have taken hours.
        Counted at most every HELD_BACK_EVERY seconds: it looks at every pool."""
        now = self.loop.now
        if now - self._held_at >= HELD_BACK_EVERY:
            self._held_at = now
            held = self.scheduler.held_back(self.pools.values(), now - HELD_BACK_AFTER)
            if held > self._held and self._rows:
                # Counted between two refills (the worker's report asks): rows
                # waiting to come in may come in now, not when a row next ends.
                self.loop.call_soon(self._refill)
            self._held = held
        return self._held

    def _refill(self) -> None:
        rows = self._rows
        # Rows parked on a pushed-back host do not hold the others out: a list
        # whose every fourth row is on a rate-limited host stalled whole while
        # that host's rows filled the window, pause after pause.
        window = self._window + self.parked()
        while rows and self.in_memory < window and self.fatal is None:
            row = rows.popleft()
            self.in_memory += 1
            try:
                location = self._split(row.url)
            except TransferError as exc:
                self._record(Job(row, Location(("", "", 0), "", "", None), 0.0), exc)
                continue
            job = Job(row, location, self._first_deadline)
            job.admitted = self.loop.now
            self._submit(Transfer(job, start=row.resume_from))

    def _submit(self, transfer: Transfer, front: bool = False) -> None:
        job = transfer.job
        pool = self.pools.get(job.origin)
        if pool is None:
            pool = self._add_pool(job.origin, job.host_header)
        if pool.addresses is None:
            # The row's clock starts now, not at its first connect: a name server
            # that never answers kept a row a whole --timeout past its --deadline
            # (curl -m counts the lookup too).  A retry's clock runs already.
            if job.first_start == 0.0 and job.naming_since == 0.0:
                job.naming_since = self.loop.now
            self._unnamed[pool] = None
        self._execute(self.scheduler.submit(pool, transfer, self.loop.now, front))

    def _add_pool(self, origin: Origin, host_header: str) -> HostPool:
        pools = self.pools
        if len(pools) >= self._pool_limit:
            # Busy pools are at most the window's rows plus the connections:
            # half the limit, so this runs once per that many new hosts.
            retire_idle(pools, self._pool_limit // 2, self._given_up)
        pool = pools[origin] = self._new_pool(origin, host_header)
        if pool.given_up is None and origin in self._given_up:
            pool.mark_given_up(self._given_up[origin], "")  # why: in the error itself
        return pool

    def _new_pool(self, origin: Origin, host_header: str) -> HostPool:
        scheme, host, port = origin
        proxy = self.proxies.for_origin(scheme, host, port) if self.proxies is not None else None
        if proxy is None:
            return HostPool(origin, self._template(host_header), DIRECT)
        if proxy.problem is not None:
            # The environment names a proxy we cannot use: its rows fail at once.
            pool = HostPool(origin, self._template(host_header), DIRECT)
            pool.given_up = TransferError(ErrorCode.CONNECT, proxy.problem)
            return pool
        if scheme == "https":
            return HostPool(origin, self._template(host_header), TUNNEL, proxy)
        # Plain http through the proxy: the proxy reads the absolute-form target
        # and our Proxy-Authorization; the Host header stays the origin's.
        template = self._template(
            host_header,
            target_prefix=f"http://{host_header}",
            proxy_authorization=proxy.authorization,
        )
        return HostPool(origin, template, FORWARD_PROXY, proxy)

    def _template(
        self, host_header: str, target_prefix: str = "", proxy_authorization: str | None = None
    ) -> RequestTemplate:
        return RequestTemplate(
            host_header,
            self._headers,
            target_prefix=target_prefix,
            proxy_authorization=proxy_authorization,
            omit_host=not self._own_host,
        )

    # -- carrying out the scheduler's actions -----------------------------------------

    def _execute(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Start):
                self._count_attempt(action.transfer)
                action.conn.start(action.transfer)
            elif isinstance(action, Dial):
                self._dial(action.pool, action.transfer)
            elif isinstance(action, Close):
                action.conn.close()
            elif isinstance(action, Resolve):
                self._resolve(action.pool)
            elif isinstance(action, Fail):
                self._failed(action.transfer, action.error)
            elif isinstance(action, Defer):
                self.loop.call_soon(self._dispatch_deferred)
            elif isinstance(action, WakeAt):
                delay = action.until - self.loop.now
                self.loop.call_later(delay, self._wake, action.pool, action.until)

    def answered(self, pool: HostPool, status: int, started: float, key: int) -> None:
        # A head came on a host probed or throttled after a push-back: the
        # queue goes on then, not when the body ends.
        status = self.scheduler.load_status(pool, status, key)
        self._execute(self.scheduler.head_came(pool, status, started, self.loop.now))

    def _wake(self, pool: HostPool, until: float) -> None:
        self._execute(self.scheduler.wake(pool, until, self.loop.now))

    def _dispatch_deferred(self) -> None:
        self._execute(self.scheduler.dispatch_deferred(self.loop.now))

    def _count_attempt(self, transfer: Transfer) -> None:
        _start_clock(transfer.job, self.loop.now)
        transfer.retry = transfer.retry.started()

    def _resolve(self, pool: HostPool) -> None:
        host, port = pool.connect_to
        self.resolver.resolve(host, port, lambda a, e: self._resolved(pool, a, e))

    def _resolved(
        self, pool: HostPool, addresses: list[Address] | None, error: TransferError | None
    ) -> None:
        host, port = pool.connect_to
        now = self.loop.now
        if error is not None and pool.via_source:
            # The name that failed is the proxy's: "cannot resolve 'proxy.corp'"
            # beside a URL of another host sent people to look at the origin.
            error = TransferError(error.code, f"proxy {pool.via_source}: {error.message}")
        for transfer in pool.queue:
            _named(transfer.job, now)  # a wait for a connection from here on: not counted
        self._unnamed.pop(pool, None)
        # Ask again when the answer's TTL runs out.
        refresh_at = max(self.resolver.expires(host, port), self.loop.now + 1.0)
        self._execute(self.scheduler.resolved(pool, addresses, error, refresh_at, self.loop.now))
        self._refill()

    def _dial(self, pool: HostPool, transfer: Transfer) -> None:
        addresses = pool.addresses
        assert addresses
        self._count_attempt(transfer)
        if len(addresses) > 1:
            self._race(pool, transfer, addresses)
            return
        sock, err = start_connect(addresses[0])
        if err != 115:  # not EINPROGRESS: failed at once
            failure = connect_failure(err, pool.via_source, pool.connect_label)
            self._dial_failed(pool, transfer, failure)
            return
        assert sock is not None
        self._connected(pool, sock, transfer)

    def _race(self, pool: HostPool, transfer: Transfer, addresses: list[Address]) -> None:
        """Race the addresses (net/eyeballs.py); the first to connect becomes the connection."""
        started = self.loop.now

        def dialed(sock: socket.socket | None, error: TransferError | None) -> None:
            self.dialing.pop(dial, None)
            if sock is None:
                assert error is not None
                self._dial_failed(pool, transfer, error, started)
                return
            # Already connected: the connection finds it writable on the next
            # turn and goes on as after any connect.
            self._connected(pool, sock, transfer)

        where = f" to proxy {pool.via_source}" if pool.via_source else ""
        # A failed race names where it went, "connect to h:443 failed" (as curl).
        target = where or f" to {pool.connect_label}"
        dial = HappyEyeballs(
            self.loop, addresses, dialed, timeout=self.options.timeout, where=target
        )
        self.dialing[dial] = pool
        dial.start()
        # The race's own limit is --timeout; the row's --deadline may come first.
        ends = transfer.job.first_start + transfer.job.deadline
        if ends < self.loop.now + self.options.timeout:
            error = deadline_exceeded(transfer.job.deadline, f"connect{where}")
            self.loop.call_at(ends, dial.abandon, error)  # once over, a no-op

    def _dial_failed(
        self,
        pool: HostPool,
        transfer: Transfer,
        error: TransferError,
        started: float = float("inf"),
    ) -> None:
        # The breaker first: a host (or proxy) given up fails the transfer now.
        self._host_failed(pool, error, True, started)
        self._execute(self.scheduler.dial_failed(pool, self.loop.now))
        self._failed(transfer, error)
        self.loop.call_soon(self._refill)

    def _connected(self, pool: HostPool, sock: socket.socket, transfer: Transfer) -> None:
        kind = pool.kind
        conn: HTTPConnection
        if kind == TUNNEL:
            conn = TunnelHTTPSConnection(self, pool, sock, transfer)
        elif pool.origin[0] == "https":
            conn = HTTPSConnection(self, pool, sock, transfer)
        else:
            conn = HTTPConnection(self, pool, sock, transfer)
        self.connections.add(conn)

    # -- what connections report (ConnectionOwner) -------------------------------------

    def queue_send(self, conn: PooledConnection) -> None:
        assert isinstance(conn, HTTPConnection)
        outbox = self._outbox
        outbox.append(conn)
        if len(outbox) >= SEND_BATCH:
            self._send_outbox()
        else:
            self._end_turn_soon()

    def open_writer(self, transfer: Transfer, verdict: Verdict, head: ResponseHead) -> Writer:
        job = transfer.job
        if verdict.start == 0 and transfer.start:
            transfer.start = 0  # the server ignored our Range: the whole body comes
        if verdict.start < job.carried:
            job.carried = verdict.start  # an earlier run's bytes are written over
        length = head.content_length if not head.chunked and not verdict.complete else None
        rate = self._long_file_rate
        if rate and length is not None and length > job.deadline * rate:
            job.deadline = length / rate  # a long file, and no --deadline given
        writer = self.sink.open(job.row, verdict.start, length, self._hashers_for(job.row))
        if verdict.start == 0 and self.sink.resumable:
            try:
                self._note_resumable(job, head, writer)
            except BaseException:
                writer.abort()  # not the transfer's yet: nothing else would close it
                raise
        return writer

    def released(self, conn: PooledConnection, reusable: bool) -> None:
        self._execute(self.scheduler.released(conn, reusable, self.loop.now))
        self._refill()

    def closed(self, conn: PooledConnection) -> None:
        assert isinstance(conn, HTTPConnection)
        self.connections.discard(conn)
        self._execute(self.scheduler.closed(conn, self.loop.now))
        # A failed connect records its job without passing through released():
        # read more rows soon (not now: we may be inside _refill already).
        self.loop.call_soon(self._refill)

    def ended(self, conn: PooledConnection, transfer: Transfer, verdict: Verdict) -> None:
        kind = verdict.kind
        pool = conn.pool
        status = verdict.status
        if status:
            status = self.scheduler.load_status(pool, status, transfer.job.row.key)
            self._execute(self.scheduler.host_answered(pool, self.loop.now, status))
        if kind == ACCEPT:
            self._succeeded(transfer, verdict)
        elif kind == REDIRECTED:
            location = verdict.location
            assert location is not None
            self._follow(transfer, location, verdict.status)
        elif kind == RESTARTED:
            assert verdict.error is not None
            self._restart(transfer, verdict.error, verdict.status)
        else:
            assert isinstance(conn, HTTPConnection)
            dialling = conn.state == CONNECTING
            self._transfer_failed(pool, transfer, verdict, status, dialling, conn.started)

    # -- outcomes -----------------------------------------------------------------------

    def _succeeded(self, transfer: Transfer, verdict: Verdict) -> None:
        job = transfer.job
        writer = transfer.writer
        assert writer is not None
        row = job.row
        end = verdict.end
        if end is not None and writer.written != end:
            self._ended_wrong(transfer, writer.written, end, verdict.status)
            return
        try:
            writer.verify(row.size, row.expected_digests())
            writer.finish()
        except TransferError as exc:
            self._drop_writer(transfer, keep=False)
            transfer.start = 0  # its part is gone with the bytes that failed the check
            self._failed(transfer, exc, verdict.status)
            return
        result = FileResult(
            redact(row.url), row.path, "ok", verdict.status, writer.written, None,
            transfer.retry.attempts, self._elapsed_ms(job),
            digests=writer.digests() if writer.hashers else None,
            final_url=_redacted(job.final_url), index=row.index, key=row.key,
            reused=job.carried,
        )  # fmt: skip
        # Rows finished in this loop turn are published together: see _end_turn.
        self._to_publish.append((transfer, result))
        self._end_turn_soon()

    def _ended_wrong(self, transfer: Transfer, written: int, end: int, status: int) -> None:
        """A body of no stated length (close-delimited or chunked) that did not end
        where it had to (a 206's ``Content-Range``; a 200 of the version whose
        length an earlier reply announced): short, it is a cut (the part is kept,
        to go on from); long, the server cannot be trusted: again from zero."""
        if written < end:
            error = TransferError(
                ErrorCode.TRUNCATED, f"the response ended at byte {written} of {end}"
            )
            self._keep_or_drop_part(transfer)
            self._failed(transfer, error, status)
            return
        error = TransferError(
            ErrorCode.PROTOCOL, f"the response ran past byte {end}, where it was to end"
        )
        self._restart(transfer, error, status)

    def _restart(self, transfer: Transfer, error: TransferError, status: int) -> None:
        """Again from byte zero, without a Range; not the server's failure, so not
        counted as an attempt.  A request that had no Range fails with ``error``:
        asked again, the same question got the same answer thousands of times a
        second until --deadline (a 206 to a plain GET whose lengths disagree)."""
        self._drop_writer(transfer, keep=False)
        if not transfer.ranged:
            self._failed(transfer, error, status)
            return
        transfer.start = 0
        transfer.retry = transfer.retry.forgiven(RESTART)
        self.loop.call_soon(self._submit, transfer, True)

    def _follow(self, transfer: Transfer, target: str, status: int) -> None:
        job = transfer.job
        try:
            location = split_url(target)
        except TransferError as exc:  # recorded with the redirect's status, as other bad_redirects
            # The parser's reason may quote a piece of a password (one with a
            # "/" reads as a port): redact_failure says less then.
            _, message = redact_failure(target, exc)
            self._failed(transfer, TransferError(ErrorCode.BAD_REDIRECT, message), status)
            return
        job.move_to(target, location)
        # transfer.start stays: a kept part continues at the redirect's target
        # (a CDN, a presigned URL), checked by If-Range and the 206's validator.
        transfer.retry = transfer.retry.forgiven(REDIRECT)  # a hop is not a retry
        self._submit(transfer)

    def _transfer_failed(
        self,
        pool: HostPool,
        transfer: Transfer,
        verdict: Verdict,
        status: int,
        dialling: bool = False,
        started: float = float("inf"),
    ) -> None:
        """``status``: the verdict's, as it speaks of the host's load (Scheduler.load_status)."""
        error = verdict.error
        assert error is not None
        if isinstance(error, OutputError) and error.fatal:
            self._stop(error)
        if error.code == ErrorCode.TOO_LARGE:
            self._drop_part(transfer)
        else:
            self._keep_or_drop_part(transfer)
        if verdict.stale and isinstance(error, Stalled):
            self._stop_reusing(pool)
        if verdict.stale and self._may_retry_stale(transfer):
            # A dead kept-alive connection is not the server's failure: again,
            # on a new connection (so not twice in a row), first in line when a
            # slot frees.
            transfer.retry = transfer.retry.forgiven(STALE)
            transfer.fresh = True
            self._submit(transfer, front=True)
            # A probe after a pause goes again, first; a throttled host's slot is free.
            self._execute(self.scheduler.request_lost(pool, self.loop.now, started))
            return
        self._host_failed(pool, error, dialling, started)
        self._failed(transfer, error, status, verdict.retry_after, started)

    def _may_retry_stale(self, transfer: Transfer) -> bool:
        """Whether ``transfer`` may go again, free, after a dead kept-alive connection.

        Once per attempt, since each retry may meet another dead one (a server
        that closes after every reply, unannounced), and once per redirect hop
        too: the hop's request goes at once on the connection that brought the
        3xx, which such a server has just closed (its first request had met one
        already, and the row failed under --retries 0).
        """
        retry = transfer.retry
        return retry.count(STALE) <= self.policy.retries + retry.count(REDIRECT)

    def _stop_reusing(self, pool: HostPool) -> None:
        """A kept-alive connection to ``pool`` went silent: each connection there
        serves one request from now on, and those idle now are closed (each
        would cost the next request a --timeout of its own)."""
        if pool.reuse_broken:
            return
        pool.reuse_broken = True
        for conn in list(pool.idle):
            conn.close()

    def _host_failed(
        self, pool: HostPool, error: TransferError, dialling: bool, started: float
    ) -> None:
        """Tell the circuit breaker; if it gives the host (or its proxy) up now, the
        connects still under way to it fail at once: each waited out its own
        --timeout, and a black-holed host cost two timeouts, not one."""
        alive = pool.given_up is None
        self._execute(
            self.scheduler.host_failed(
                pool, error, dialling=dialling, started=started, now=self.loop.now
            )
        )
        given_up = pool.given_up
        if not alive or given_up is None:
            return
        proxy_down = self.scheduler.dead_proxy(pool) is not None

        def behind(other: HostPool) -> bool:
            return other is pool or (proxy_down and other.connect_to == pool.connect_to)

        for conn in [c for c in self.connections if behind(c.pool)]:
            conn.abandon_unanswered(given_up)
        for dial in [d for d, other in self.dialing.items() if behind(other)]:
            dial.abandon(given_up)

    def _failed(
        self,
        transfer: Transfer,
        error: TransferError,
        status: int = 0,
        retry_after: float | None = None,
        started: float = float("inf"),
    ) -> None:
        """``transfer`` failed: retry it after a backoff, or record its row as failed.
        ``started``: when its request went out (a refusal from before a pause is old news)."""
        job = transfer.job
        transfer.retry = transfer.retry.failed(error)
        pool = self.pools.get(job.origin)
        pause = self._host_pause(transfer, pool, error, status, retry_after)
        front = True  # a retry goes before the rows that have not been tried yet
        push_back: list[Action] = []
        said = False  # the message already says why the row is not retried
        if pause is not None and pause >= self._first_deadline:
            # No row may wait that long (--deadline): waiting would only delay
            # every queued row's failure.  The host is given up at once.
            assert pool is not None
            past = f"{_asked_wait(retry_after, pause)} is past --deadline"
            push_back = self.scheduler.give_up(
                pool, error, f"host {pool.host_port} given up: {past}"
            )
            # Not retried for its own Retry-After: it says so itself.
            error = TransferError(error.code, f"{error.message}; {past}")
            said = True
        elif pause is not None:
            # The host asked every row to wait, not only this one; it may also
            # be given up now (too many pauses in a row).  Its timer is set
            # after this row's retry timer: at the same moment the refused row
            # goes first, not behind the queue it was refused ahead of.
            assert pool is not None
            now = self.loop.now
            self._forgive_burst(transfer, pool, started)
            # A row refused again goes behind the others: the next probe is
            # another row, which tells whether the host refuses everything or
            # only some URLs (only first refusals count towards giving it up).
            front = transfer.retry.count(error.code) == 1
            push_back = self.scheduler.pushed_back(
                pool, now + pause, now, error, started, first=front
            )
        elif not status and pool is not None:
            push_back = self.scheduler.request_lost(pool, self.loop.now, started)
        if self.fatal is None:
            time_left = job.deadline - (self.loop.now - job.first_start)
            delay = self.policy.wait(transfer.retry, error, retry_after)
            if delay is not None and delay < time_left and (pool is None or pool.given_up is None):
                self._retry_later(transfer, error, delay, front, pool)
                self._execute(push_back)
                return
            if delay is not None and not said:
                error = _why_not_retried(error, pool, _asked_wait(retry_after, delay))
            elif delay is None and self.policy.asks_too_long(error, retry_after):
                error = self._too_long_asked(error, transfer, retry_after, time_left, pool)
        self._execute(push_back)
        self._record(job, error, status, transfer)

    def _host_pause(
        self,
        transfer: Transfer,
        pool: HostPool | None,
        error: TransferError,
        status: int,
        retry_after: float | None,
    ) -> float | None:
        """How long ``transfer``'s failure pauses its whole host (None: only its row
        waits; see RetryPolicy.push_back).  Not at all for a 503 read as push-back
        that asks for more than we wait: its row fails at once, and the host
        paused for our cap held every other row two minutes for a wait nobody took."""
        if not status or pool is None or self.policy.asks_too_long(error, retry_after):
            return None
        return self.policy.push_back(status, _refusals(transfer, pool, error), retry_after)

    def _forgive_burst(self, transfer: Transfer, pool: HostPool, started: float) -> None:
        """A 429 to a request under way when its host had said stop (the
        pause's own refusal came first, ``started`` is before it) is one
        refusal of the whole burst, which the scheduler counts as neither a
        pause nor a step towards --host-failures: it costs the row no attempt
        either (the row did nothing wrong, the rate did).  Each pause begins
        with a refusal that does count, so a host refusing everything still
        uses rows' attempts up; and at most --retries of these per row (none
        with --retries 0: "no retries" holds)."""
        if started < pool.pause_began and transfer.retry.count(BURST) < self.policy.retries:
            transfer.retry = transfer.retry.forgiven(BURST)

    def _too_long_asked(
        self,
        error: TransferError,
        transfer: Transfer,
        retry_after: float | None,
        time_left: float,
        pool: HostPool | None,
    ) -> TransferError:
        """``error``, saying it is not retried because the server asked for a
        longer wait than swarmget's (when that is why: a retry was left), or
        than the row's --deadline leaves."""
        policy = self.policy
        if not policy.should_retry(error.code, transfer.retry.attempts):
            return error
        cap = policy.retry_after_cap
        asked = _asked_wait(retry_after, cap)
        if retry_after is not None and retry_after >= time_left:
            return _why_not_retried(error, pool, asked)
        return TransferError(
            error.code, f"{error.message}; not retried: {asked} is more than the {cap:g} s we wait"
        )

    def _retry_later(
        self,
        transfer: Transfer,
        error: TransferError,
        delay: float,
        front: bool,
        pool: HostPool | None,
    ) -> None:
        """Submit ``transfer`` again in ``delay`` seconds; meanwhile it is backing off."""
        now = self.loop.now
        if isinstance(error, Stalled) and self.options.min_speed:
            # A slow host gets two min-speed windows for the row in all: the
            # retry's window is what is left of the second (retry.py).
            window = self.options.min_speed_window
            spent = now - transfer.job.first_start
            transfer.speed_window = max(window / 4, 2 * window - spent - self._sweep_interval)
        host = pool.host_port if pool is not None else transfer.job.origin[1]
        self._backing_off[transfer] = (now, BACKING_OFF, host, 1, now + delay)
        self.loop.call_later(delay, self._retry_now, transfer, front)

    def _retry_now(self, transfer: Transfer, front: bool) -> None:
        del self._backing_off[transfer]
        job = transfer.job
        if job.redirects:
            # A kept part goes along: whatever the redirects lead to this
            # time, If-Range and the 206's validator check it is the same file.
            job.back_to_start(self._split(job.row.url))
        self._submit(transfer, front)

    def _record(
        self,
        job: Job,
        error: TransferError,
        status: int = 0,
        transfer: Transfer | None = None,
    ) -> None:
        row = job.row
        attempts = transfer.retry.attempts if transfer is not None else 0
        self.in_memory -= 1
        self.events.finished(
            FileResult(
                redact(row.url),
                None,
                "failed",
                status or None,
                0,
                error.code,
                attempts,
                self._elapsed_ms(job),
                _redact_message(error.message, row.url) + self._kept_part_note(job, transfer),
                final_url=_redacted(job.final_url),
                index=row.index,
                key=row.key,
            )
        )

    def _kept_part_note(self, job: Job, transfer: Transfer | None) -> str:
        """What a failed row leaves to resume, for its message: "no data for 30s"
        alone said neither that most of a big file had come nor that it was
        kept, so a stall at 99% read as a loss, not as a rerun's head start."""
        if transfer is None or not transfer.start or not self.sink.resumable:
            return ""
        of = "" if job.total is None else f" of {job.total}"
        return f"; {transfer.start}{of} bytes are kept: run again to resume"

    def _keep_or_drop_part(self, transfer: Transfer) -> None:
        """Keep a failed large part to continue with Range (same entity only)."""
        writer = transfer.writer
        if writer is None:
            return
        job = transfer.job
        keep = (
            self.sink.resumable and job.validator is not None and writer.written >= RESUME_MIN_BYTES
        )
        transfer.start = writer.written if keep else 0
        self._drop_writer(transfer, keep)
        if not keep and job.validator is not None and self.sink.resumable:
            # The part is gone, so the validator offers nothing to continue:
            # the journal (and the manifest's record) must not keep it.
            job.validator = None
            self.events.partial(job.row, None, None)

    def _drop_part(self, transfer: Transfer) -> None:
        """No part stays for a file over --max-size: a rerun under the same limit
        is refused it again, and one under a larger limit starts from zero.
        That includes a part kept from before (an earlier attempt or run) that
        the refused response never opened, and the validator that offered it
        for continuing (the journal's, told as a new body's would be)."""
        job = transfer.job
        if transfer.writer is not None:
            self._drop_writer(transfer, keep=False)
        elif transfer.start:
            self.sink.drop_part(job.row)
        transfer.start = 0
        if job.validator is not None and self.sink.resumable:
            job.validator = None
            self.events.partial(job.row, None, None)

    def _drop_writer(self, transfer: Transfer, keep: bool) -> None:
        writer = transfer.writer
        transfer.writer = None
        if writer is not None:
            writer.abort(keep=keep)

    def _note_resumable(self, job: Job, head: ResponseHead, writer: Writer) -> None:
        """A whole body is starting: its validator is the one a later part must match.

        A large body with a strong validator: the driver records it, so a later
        run can resume.  Any other body voids the validator an earlier body (or
        run) left: the part now holds these bytes, and continuing it with the old
        one would splice two versions of the file.  The writer keeps it with the
        bytes first: the driver's journal hears of it up to a second later."""
        validator = resume_validator(head) if self._large(head) else None
        if validator is None and job.validator is None:
            return
        job.validator = validator
        writer.holds_version(validator)
        self.events.partial(job.row, validator, head.content_length if validator else None)

    @staticmethod
    def _large(head: ResponseHead) -> bool:
        """May this body be worth continuing?  One of a stated length if it is
        at least RESUME_MIN_BYTES; a chunked one of any (it has no length to
        judge by, and its missing last chunk tells a cut from an end, which a
        body read to the close cannot): only a part of RESUME_MIN_BYTES is kept,
        though (:meth:`_keep_or_drop_part`)."""
        length = head.content_length
        if length is None:
            return head.chunked
        return length >= RESUME_MIN_BYTES

    def _hashers_for(self, row: Assignment) -> dict[str, Hasher] | None:
        """Digests to compute while streaming: the row's checksums and ``--hash``."""
        wanted = self.options.hash
        if row.sha256 is None and row.md5 is None and not wanted:
            return None
        names = set(row.expected_digests())
        if wanted:
            names.add(wanted)
        return {name: hashlib.new(name) for name in sorted(names)}

    def _elapsed_ms(self, job: Job) -> int:
        """From the first attempt; for a row that never had one (its name did not
        resolve: seconds, recorded as 0), from when the engine took it."""
        start = job.first_start or job.admitted
        return int((self.loop.now - start) * 1000) if start else 0

    def _stop(self, error: OutputError) -> None:
        """A run-stopping error (the disk is full): start nothing more."""
        if self.fatal is None:
            self.fatal = error
            self.scheduler.stopping = True

    # -- the end of a loop turn ----------------------------------------------------------

    def _send_outbox(self) -> None:
        outbox, self._outbox = self._outbox, []
        for conn in outbox:
            conn.send_queued()

    def _end_turn_soon(self) -> None:
        if not self._end_turn_scheduled:
            self._end_turn_scheduled = True
            self.loop.call_soon(self._end_turn)

    def _end_turn(self) -> None:
        """Once per loop turn with work: send the queued requests, then publish files.

        Requests first, so the server works on the next files while we rename
        the finished ones (see connection.py on why requests wait for this).
        """
        self._end_turn_scheduled = False
        self._send_outbox()
        if self._to_publish:
            self._publish()

    def _publish(self) -> None:
        batch, self._to_publish = self._to_publish, []
        done: list[tuple[Assignment, Writer]] = []
        for transfer, _ in batch:
            writer = transfer.writer
            assert writer is not None
            done.append((transfer.job.row, writer))
        errors = self.sink.publish(done)
        for (transfer, result), error in zip(batch, errors, strict=True):
            writer = transfer.writer
            transfer.writer = None
            self.in_memory -= 1
            if writer is not None:
                result.payload = writer.payload
            if error is not None:
                if isinstance(error, OutputError) and error.fatal:
                    self._stop(error)
                result = FileResult(
                    result.url, None, "failed", result.http_status, 0, error.code,
                    result.attempts, result.elapsed_ms, error.message,
                    index=result.index, key=result.key,
                )  # fmt: skip
            self.events.finished(result)

    # -- periodic work ------------------------------------------------------------------

    def _sweep(self) -> None:
        now = self.loop.now
        for conn in list(self.connections):
            conn.check(now)
        if self._unnamed:
            self._expire_unnamed(now)
        self.loop.call_later(self._sweep_interval, self._sweep)

    def _expire_unnamed(self, now: float) -> None:
        """Fail the transfers whose --deadline ran out while their host's name
        was looked up (or waited for a lookup): the resolver's own limit is
        --timeout, and a thread's getaddrinfo has none of ours at all.  The
        lookup goes on; its answer serves the host's later rows."""
        for pool in list(self._unnamed):
            if pool.addresses is not None or not pool.queue:
                del self._unnamed[pool]
                continue
            late = [t for t in pool.queue if now - _clock_start(t.job, now) > t.job.deadline]
            if not late:
                continue
            self.scheduler.unqueue(pool, late)
            for transfer in late:
                _start_clock(transfer.job, now)  # what its elapsed time counts from
                self._failed(transfer, deadline_exceeded(transfer.job.deadline, "name resolution"))


def _named(job: Job, now: float) -> None:
    """``job`` waits for a name no longer (if it did): the wait is added up."""
    if job.naming_since != 0.0:
        job.named_for += now - job.naming_since
        job.naming_since = 0.0


def _start_clock(job: Job, now: float) -> None:
    """Start the row's --deadline clock if it has not started: at ``now``, less
    the time it waited for names before (the lookup counts, as with curl -m)."""
    if job.first_start == 0.0:
        _named(job, now)
        job.first_start = now - job.named_for


def _clock_start(job: Job, now: float) -> float:
    """When the row's --deadline clock started: its first attempt, less the time
    it waited for names before it; ``now`` if it neither started nor waits."""
    if job.first_start != 0.0:
        return job.first_start
    if job.naming_since != 0.0:
        return job.naming_since - job.named_for
    return now


def _redacted(url: str | None) -> str | None:
    return redact(url) if url is not None else None


def _redact_message(message: str, url: str) -> str:
    """A message may quote the URL, or a redirect's target: never with a password."""
    safe = redact(url)
    if safe != url:
        message = message.replace(url, safe)
    return redact_text(message)
