"""The engine: turns rows into jobs, jobs into requests on pooled connections.

Theory of operation
-------------------
Input is pulled lazily: the engine keeps at most ``2 * concurrency`` (at least
256) jobs in memory (queued, in flight or waiting to retry) and reads the next
row only when one finishes, so a list of 100 million URLs costs the same memory
as one of a thousand.

Connections are capped twice: ``concurrency`` in total and ``per_host`` per
origin.  A connection that finishes a job takes the next queued job of its
origin at once (no trip through the selector); with nothing queued it goes idle
in its pool, unless another origin is starved for a connection slot, in which
case it is closed to make room.  Jobs wait in their origin's queue while no
connection may be opened.

Failures go through :class:`~swarmget.engine.retry.RetryPolicy`; a retry waits
on a loop timer, so it never blocks other transfers.  A reused keep-alive
connection that turns out to be closed by the server gets the request again on
a fresh connection once, without counting an attempt.

Every row ends as exactly one manifest record.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import TextIO

from swarmget.engine.connection import ACTIVE, IDLE, HTTPConnection, connect_error
from swarmget.engine.https import HTTPSConnection
from swarmget.engine.job import Job, Origin, Redirected, RestartTransfer, UrlSplitter, split_url
from swarmget.engine.pool import HostPool, request_tail
from swarmget.engine.resume import ResumeState
from swarmget.engine.retry import RetryPolicy
from swarmget.engine.tunnel import TunnelHTTPSConnection
from swarmget.errors import ErrorCode, TransferError, UsageError
from swarmget.loop import EventLoop
from swarmget.manifest import ManifestWriter
from swarmget.net.connect import start_connect
from swarmget.net.dns import Address, LazyResolver, make_resolver
from swarmget.net.eyeballs import HappyEyeballs
from swarmget.net.proxy import proxy_settings
from swarmget.net.tls import ClientTLS
from swarmget.options import Options
from swarmget.report import FileResult, ProgressListener, Report, Snapshot
from swarmget.sinks.files import OutputDir, OutputError, PartFile
from swarmget.sinks.naming import NameAllocator
from swarmget.sources.rows import Row

RECV_BUFFER_SIZE = 256 * 1024
CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
PROGRESS_INTERVAL = 0.1
_CONNECTION_TYPES = {"http": HTTPConnection, "https": HTTPSConnection}
MANIFEST_FLUSH_INTERVAL = 1.0
# Requests wait for the end of the loop turn (see engine/connection.py), but no
# more than this many: a long turn then costs the first of them at most ~3 ms.
SEND_BATCH = 32
# New connections started per loop turn.  A non-blocking connect still costs
# the kernel ~50-100 us (on loopback the whole handshake runs in our context),
# so starting 200 in one go held every first request back ~20 ms; in slices,
# the first requests go out while later connections are still being made.
CONNECT_SLICE = 32


class Engine:
    def __init__(
        self,
        rows: Iterator[Row | None],
        out_dir: str | os.PathLike[str],
        options: Options,
        *,
        progress: ProgressListener | None = None,
        loop: EventLoop | None = None,
        names_allocated: bool = False,
        fresh_dir: bool | None = None,
        warn_to: TextIO | None = None,
        compact_journal: bool = True,
    ) -> None:
        """``rows`` may yield None for "no row yet" (then call :meth:`refill` later).

        ``names_allocated``: every row's ``path`` was already allocated by a
        parent process (swarmget.parallel) and is used as is.  ``fresh_dir``
        overrides the check for an output dir that started empty.
        ``compact_journal=False`` leaves compaction to whoever runs last (a
        worker must not rewrite a journal its siblings are still appending to).
        """
        self.options = options
        # Everything that can fail on bad input comes first, before any
        # descriptor is opened, so a failing constructor leaks nothing.
        self.output = OutputDir(out_dir)
        self.names = NameAllocator()
        self.policy = RetryPolicy(retries=options.retries)
        self.tls = ClientTLS(
            options.cacert, options.insecure, warn_to=warn_to
        )  # the run's one SSLContext
        # None unless some origin may go through a proxy (net/proxy.py): the
        # direct path checks only that.
        self.proxies = proxy_settings(options.proxy, options.no_proxy, options.trust_env)
        self.resume = ResumeState(self.output.root, options, fresh_dir)  # what earlier runs did
        self._names_allocated = names_allocated
        self._compact_journal = compact_journal
        self._split = UrlSplitter().split
        self.manifest = ManifestWriter(self.output.root)
        self.loop = loop or EventLoop()
        self._own_loop = loop is None
        servers = options.dns_servers
        self.resolver = LazyResolver(
            self.loop, lambda: make_resolver(self.loop, servers=servers), eager=bool(servers)
        )
        self.dialing: set[HappyEyeballs] = set()  # connects racing several addresses
        self.report = Report(manifest=self.manifest.path)
        self.progress = progress
        self._rows = rows
        self._input_done = False
        self._input_error: UsageError | None = None
        self.rows_seen = 0
        self._in_memory = 0  # jobs read and not yet recorded
        self._target = max(256, 2 * options.concurrency)
        self.pools: dict[tuple[str, str, int], HostPool] = {}
        self.connections: set[HTTPConnection] = set()
        self._idle: dict[HTTPConnection, None] = {}  # all idle connections, oldest first
        self._starved: dict[HostPool, None] = {}  # pools waiting for a global slot
        self._deferred: dict[HostPool, None] = {}  # pools waiting for the next connect slice
        self._slice_turn = -1.0  # loop.now of the turn _slice_connects counts
        self._slice_connects = 0
        self.keepalive_idle = 55.0  # close our idle connections before typical servers do
        user_headers = dict(options.headers)
        # Credentials go only to the first origin of each job (see follow_redirect).
        credentials = {k: v for k, v in user_headers.items() if k.lower() in CREDENTIAL_HEADERS}
        self.credential_headers = "".join(f"{k}: {v}\r\n" for k, v in credentials.items()).encode(
            "latin-1"
        )
        self._headers = {
            "User-Agent": options.user_agent,
            "Accept": "*/*",
            "Accept-Encoding": "identity",
            **{k: v for k, v in user_headers.items() if k not in credentials},
        }
        self._recv_buffer = bytearray(RECV_BUFFER_SIZE)
        self.recv_view = memoryview(self._recv_buffer)
        self._fatal: OutputError | None = None
        self._to_publish: list[tuple[FileResult, PartFile]] = []  # complete, not yet renamed
        self._outbox: list[HTTPConnection] = []  # requests to send at the end of this turn
        self._end_turn_scheduled = False
        self._started_at = 0.0

    # -- running -------------------------------------------------------------------

    def run(self) -> Report:
        loop = self.loop
        self._started_at = loop.now = loop.time()
        if self.progress is not None:
            self.progress.start()
            self._tick_progress()
        sweep = min(self.options.timeout, self.options.min_speed_window, self.options.deadline) / 4
        self._sweep_interval = min(1.0, max(0.02, sweep))
        loop.call_later(self._sweep_interval, self._sweep)
        loop.call_later(MANIFEST_FLUSH_INTERVAL, self._flush_manifest)
        try:
            self._refill()
            while not self._finished():
                loop.run_once()
        except BaseException:
            self._abort()
            raise
        finally:
            self.report.elapsed = loop.time() - self._started_at
            self._shutdown()
        if (
            self._fatal is None
            and self._input_error is None
            and self.resume.needs_compaction
            and self._compact_journal
        ):
            self.manifest.compact()
        if self.progress is not None:
            self.progress.finish(self.report)
        if self._fatal is not None:
            raise self._fatal
        if self._input_error is not None:
            raise self._input_error
        return self.report

    def _finished(self) -> bool:
        return self._in_memory == 0 and (self._input_done or self._fatal is not None)

    def _shutdown(self) -> None:
        for conn in list(self.connections):
            conn.close()
        for dial in self.dialing:
            dial.cancel()
        self.dialing.clear()
        self.manifest.close()
        self.resolver.close()
        if self._own_loop:
            self.loop.close()

    def _abort(self) -> None:
        """Interrupted: stop without recording in-flight rows (a rerun redoes them).

        Their ``.part`` files stay: a rerun continues the large ones that have a
        validator with Range, and overwrites the others from zero.
        """
        self._input_done = True
        if self._to_publish:  # these are complete: keep them
            self._publish()
        for conn in list(self.connections):
            if conn.part is not None:
                conn.part.abort(keep=True)
                conn.part = None
            conn.job = None
            conn.close()

    # -- input ----------------------------------------------------------------------

    def _refill(self) -> None:
        while self._in_memory < self._target and not self._input_done:
            if self._fatal is not None:
                return
            try:
                row = next(self._rows)
                if row is None:
                    return  # none available yet; the source calls refill() when it has more
            except StopIteration:
                self._input_done = True
                return
            except UsageError as exc:
                # Bad input mid-stream: finish what is in flight, then report it.
                self._input_error = exc
                self._input_done = True
                return
            self.rows_seen += 1
            self._in_memory += 1
            job = self._make_job(row)
            if job is not None:
                self._enqueue(job)

    def refill(self) -> None:
        """More input is available (for sources that yielded None)."""
        self._refill()

    def _make_job(self, row: Row) -> Job | None:
        try:
            origin, target, host_header = self._split(row.url)
            rel = row.path if self._names_allocated and row.path else self.names.allocate(row)
            final = self.output.final_path(rel)
            job = Job(row, origin, target, rel, final)
            if self.resume.already_done(job):
                self._in_memory -= 1
                self.report.skipped += 1
                return None
        except TransferError as exc:
            self._record(FileResult(row.url, None, "failed", error=exc.code, message=exc.message))
            return None
        if origin not in self.pools:
            self.pools[origin] = self._new_pool(origin, host_header)
        if self.proxies is not None:
            self._proxy_target(job)
        return job

    def _new_pool(self, origin: Origin, host_header: str) -> HostPool:
        tail = request_tail(host_header, self._headers)
        scheme, host, port = origin
        proxy = self.proxies.for_origin(scheme, host, port) if self.proxies is not None else None
        if proxy is None:
            return HostPool(origin, tail, _CONNECTION_TYPES[scheme])
        if scheme == "https":
            return HostPool(origin, tail, TunnelHTTPSConnection, proxy)
        # Plain http through the proxy: the proxy reads the absolute-form target
        # and our Proxy-Authorization; the Host header stays the origin's.
        if proxy.authorization is not None:
            tail = tail[:-2] + f"Proxy-Authorization: {proxy.authorization}\r\n\r\n".encode()
        pool = HostPool(origin, tail, HTTPConnection, proxy)
        pool.target_prefix = f"http://{host_header}"
        return pool

    def _proxy_target(self, job: Job) -> None:
        prefix = self.pools[job.origin].target_prefix
        if prefix:
            job.target = prefix + job.target

    def follow_redirect(self, job: Job) -> None:
        target, job.redirect_to = job.redirect_to, None
        assert target is not None
        try:
            origin, path, host_header = split_url(target)
        except TransferError as exc:
            self.finish_failure(job, TransferError(ErrorCode.BAD_REDIRECT, exc.message))
            return
        job.redirects += 1
        job.attempts -= 1  # a hop is not a retry
        if origin != job.origin:
            job.cross_origin = True  # credentials stay with the first origin
        job.url, job.origin, job.target = target, origin, path
        job.resume_from = 0
        if origin not in self.pools:
            self.pools[origin] = self._new_pool(origin, host_header)
        if self.proxies is not None:
            self._proxy_target(job)
        self._enqueue(job)

    # -- scheduling -------------------------------------------------------------------

    def _enqueue(self, job: Job, front: bool = False) -> None:
        pool = self.pools[job.origin]
        if front:
            pool.queue.appendleft(job)
        else:
            pool.queue.append(job)
        self._dispatch(pool)

    def _dispatch(self, pool: HostPool) -> None:
        if pool.addresses is None:
            if pool.dns_error is not None and self.loop.now < pool.refresh_at:
                while pool.queue:
                    self.finish_failure(pool.queue.popleft(), pool.dns_error)
            elif not pool.resolving:
                self._resolve(pool)
            return
        queue = pool.queue
        per_host = self.options.per_host
        while queue:
            if pool.idle and queue[0].fresh:
                # A job that met a dead or junk-carrying kept-alive connection goes
                # on a brand-new one: close an idle connection to make room.
                pool.idle[0].close()
            if pool.idle:
                conn = pool.idle.pop()
                del self._idle[conn]
                self._begin(conn, queue.popleft())
                continue
            if pool.open >= per_host:
                return
            if self._open_count() >= self.options.concurrency and not self._evict_idle():
                self._starved[pool] = None
                return
            if not self._connect_slot(pool):
                return
            self._connect(pool, queue.popleft())

    def _connect_slot(self, pool: HostPool) -> bool:
        """May ``pool`` start a connection in this loop turn (see CONNECT_SLICE)?"""
        now = self.loop.now
        if now != self._slice_turn:
            self._slice_turn, self._slice_connects = now, 0
        if self._slice_connects < CONNECT_SLICE:
            self._slice_connects += 1
            return True
        if not self._deferred:
            self.loop.call_soon(self._dispatch_deferred)
        self._deferred[pool] = None
        return False

    def _dispatch_deferred(self) -> None:
        deferred, self._deferred = self._deferred, {}
        for pool in deferred:
            self._dispatch(pool)

    def _resolve(self, pool: HostPool) -> None:
        pool.resolving = True
        host, port = pool.connect_to
        self.resolver.resolve(host, port, lambda a, e: self._resolved(pool, a, e))

    def _resolved(
        self, pool: HostPool, addresses: list[Address] | None, error: TransferError | None
    ) -> None:
        pool.resolving = False
        host, port = pool.connect_to
        # Ask again when the answer's TTL runs out.  A refresh that fails keeps the
        # addresses that worked: a DNS blip should not fail a host we are using.
        pool.refresh_at = max(self.resolver.expires(host, port), self.loop.now + 1.0)
        if addresses is not None or pool.addresses is None:
            pool.addresses = addresses
            pool.dns_error = error
        self._dispatch(pool)
        self._refill()

    def _evict_idle(self) -> bool:
        if not self._idle:
            return False
        conn = next(iter(self._idle))
        conn.close()  # connection_closed() removes it from the idle maps
        return True

    def _begin(self, conn: HTTPConnection, job: Job) -> None:
        self._count_attempt(job)
        conn.start(job)

    def _count_attempt(self, job: Job) -> None:
        if job.first_start == 0.0:
            job.first_start = self.loop.now
        job.attempts += 1

    def _connect(self, pool: HostPool, job: Job) -> None:
        addresses = pool.addresses
        assert addresses
        self._count_attempt(job)
        job.fresh = False
        if pool.refresh_at <= self.loop.now and not pool.resolving:
            self._resolve(pool)  # in the background; this connect uses what we have
        if len(addresses) > 1:
            self._dial(pool, job, addresses)
            return
        sock, err = start_connect(addresses[0])
        if err != 115:  # not EINPROGRESS: failed at once
            self.finish_failure(job, connect_error(pool, err))
            self.loop.call_soon(self._refill)  # as in _slot_freed: no release() follows
            return
        conn = pool.connection_type(self, pool, sock, job)
        pool.open += 1
        self.connections.add(conn)

    def _dial(self, pool: HostPool, job: Job, addresses: list[Address]) -> None:
        """Race the addresses (net/eyeballs.py); the first to connect becomes the connection."""
        dial = HappyEyeballs(
            self.loop,
            addresses,
            lambda sock, error: self._dialed(dial, pool, job, sock, error),
            timeout=self.options.timeout,
        )
        pool.open += 1
        self.dialing.add(dial)
        dial.start()

    def _dialed(
        self,
        dial: HappyEyeballs,
        pool: HostPool,
        job: Job,
        sock: socket.socket | None,
        error: TransferError | None,
    ) -> None:
        self.dialing.discard(dial)
        if sock is None:
            assert error is not None
            pool.open -= 1
            self.finish_failure(job, error)
            self._slot_freed(pool)
            return
        # Already connected: the connection finds it writable on the next turn
        # and goes on as after any connect.
        self.connections.add(pool.connection_type(self, pool, sock, job))

    def _open_count(self) -> int:
        return len(self.connections) + len(self.dialing)

    def release(self, conn: HTTPConnection, reusable: bool) -> None:
        """A connection finished its job: give it the next one, park it, or close it."""
        if not reusable or self._fatal is not None:
            conn.close()
        else:
            pool = conn.pool
            if pool.queue:
                self._begin(conn, pool.queue.popleft())
            elif self._starved:
                conn.close()
            else:
                conn.state = IDLE
                conn.last_activity = self.loop.now
                pool.idle.append(conn)
                self._idle[conn] = None
        self._refill()

    def connection_closed(self, conn: HTTPConnection) -> None:
        self.connections.discard(conn)
        pool = conn.pool
        pool.open -= 1
        if conn in self._idle:
            del self._idle[conn]
            pool.idle.remove(conn)
        self._slot_freed(pool)

    def _slot_freed(self, pool: HostPool) -> None:
        """One of ``pool``'s connections is gone: its queue, then starved pools, may open one."""
        if pool.queue:
            self._dispatch(pool)
        while self._starved and self._open_count() < self.options.concurrency:
            starved = next(iter(self._starved))
            del self._starved[starved]
            self._dispatch(starved)
        # A failed connect records its job without passing through release():
        # read more rows, else a run whose connects all fail stops after the
        # first window of rows.  Soon, not now: we may be inside _refill already.
        self.loop.call_soon(self._refill)

    # -- outcomes ---------------------------------------------------------------------

    def finish_success(self, job: Job, status: int, part: PartFile) -> None:
        """Journal the file as done, then move it into place (see manifest.py for why)."""
        elapsed_ms = int((self.loop.now - job.first_start) * 1000)
        digests = part.digests() if part.hashers else None
        result = FileResult(
            job.row.url, job.rel_path, "ok", status, part.written, None, job.attempts,
            elapsed_ms, digests=digests, final_url=job.final_url,
        )  # fmt: skip
        part.close()
        # Files finished in this loop turn are journaled with one write, then
        # renamed into place: see _publish.
        self._to_publish.append((result, part))
        self._end_turn_soon()

    def queue_send(self, conn: HTTPConnection) -> None:
        """``conn`` has a request to send: it goes with the others at the end of the turn."""
        outbox = self._outbox
        outbox.append(conn)
        if len(outbox) >= SEND_BATCH:
            self._send_outbox()
        else:
            self._end_turn_soon()

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
        encode = self.manifest.encode
        self.manifest.write_lines([encode(result) for result, _ in batch])
        for result, part in batch:
            try:
                part.publish()
            except OutputError as exc:
                part.abort()
                if exc.fatal:
                    self._fatal = exc
                result = FileResult(
                    result.url, None, "failed", result.http_status, 0, exc.code,
                    result.attempts, result.elapsed_ms, exc.message,
                )  # fmt: skip
                self.manifest.write(result)
            self._in_memory -= 1
            self.report.add(result)

    def finish_failure(
        self,
        job: Job,
        error: TransferError,
        status: int | None = None,
        retry_after: float | None = None,
        *,
        stale: bool = False,
    ) -> None:
        if isinstance(error, OutputError) and error.fatal:
            self._fatal = error
        if isinstance(error, Redirected):
            self.follow_redirect(job)
            return
        if isinstance(error, RestartTransfer):
            job.resume_from = 0
            job.attempts -= 1
            self.loop.call_soon(self._enqueue, job, True)
            return
        if stale and job.stale_retries == 0:
            job.stale_retries = 1
            job.fresh = True
            job.attempts -= 1  # a dead kept-alive connection is not the server's failure
            # Synchronously, so it is first in line when the connection's slot frees.
            self._enqueue(job, True)
            return
        if self._fatal is None and self.policy.should_retry(error.code, job.attempts):
            delay = self.policy.delay(job.attempts, retry_after)
            self.loop.call_later(delay, self._enqueue, job, True)
            return
        elapsed_ms = int((self.loop.now - job.first_start) * 1000) if job.first_start else 0
        self._record(
            FileResult(
                job.row.url,
                None,
                "failed",
                status,
                0,
                error.code,
                job.attempts,
                elapsed_ms,
                error.message,
                final_url=job.final_url,
            )
        )

    def _record(self, result: FileResult) -> None:
        self._in_memory -= 1
        self.manifest.write(result)
        self.report.add(result)

    # -- periodic work ------------------------------------------------------------------

    def _sweep(self) -> None:
        now = self.loop.now
        for conn in list(self.connections):
            conn.check(now)
        self.loop.call_later(self._sweep_interval, self._sweep)

    def _flush_manifest(self) -> None:
        self.manifest.flush()
        self.loop.call_later(MANIFEST_FLUSH_INTERVAL, self._flush_manifest)

    def snapshot(self) -> Snapshot:
        in_flight = 0
        active = 0
        for conn in self.connections:
            if conn.state == ACTIVE:
                active += 1
                if conn.part is not None:
                    in_flight += conn.part.written
        report = self.report
        return Snapshot(
            done=report.total + report.skipped,  # skipped rows are finished rows too
            failed=report.failed,
            bytes=report.bytes + in_flight,
            elapsed=self.loop.now - self._started_at,
            rows_seen=self.rows_seen,
            input_done=self._input_done,
            active=active,
        )

    def _tick_progress(self) -> None:
        assert self.progress is not None
        self.progress.update(self.snapshot())
        self.loop.call_later(PROGRESS_INTERVAL, self._tick_progress)
