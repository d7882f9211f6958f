"""One HTTP/1.1 client connection driven by the event loop.

Theory of operation
-------------------
A connection is registered with the loop once, for writability while the TCP
connect is in flight and then for readability for the rest of its life: a
request is written with a plain ``send`` (an idle socket's send buffer is
empty, so the whole request goes at once; a short write falls back to waiting
for writability).  Staying registered for reading while idle in the pool is how
we notice a server closing a keep-alive connection before we reuse it.

:meth:`HTTPConnection.start` does not send: it queues the request, and the
engine sends the queued requests together at the end of the loop turn, or as
soon as ``SEND_BATCH`` of them wait (:meth:`send_queued`).  One burst of
requests wakes a busy server once and lets it read them all in one
``epoll_wait``, where a request sent the moment each response ends wakes it
every time: on the nginx benchmark that cut our CPU per file by a quarter, in
kernel time on both sides.  The delay is at most one loop turn.

Each readable event is one ``recv_into`` into the engine's shared receive
buffer (one buffer for the whole loop: only one connection runs at a time), and
the ``ResponseParser`` passes body slices of that buffer straight to
``PartFile.write``.  Nothing here allocates per read beyond the memoryview
slice itself.

Timeouts are not timers: the engine sweeps all connections a few times a second
and calls :meth:`HTTPConnection.check`, which compares ``loop.now`` with the
connection's timestamps.  That keeps the per-read cost at one attribute store.

HTTPS is the subclass in ``engine/https.py``: after the TCP connect it runs the
TLS handshake (state ``HANDSHAKING``) before the first request, and puts a TLS
layer between the socket and the parser; the socket itself stays plain, so
sends, timeouts and the pool are shared.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from swarmget.engine.job import Job, Redirected, RestartTransfer, content_range_ok
from swarmget.engine.redirects import REDIRECT_STATUSES, redirect_target
from swarmget.engine.retry import parse_retry_after
from swarmget.errors import ErrorCode, ProtocolError, TransferError, http_code
from swarmget.loop import EVENT_READ, EVENT_WRITE
from swarmget.net.connect import connect_result
from swarmget.protocol import ConnectionClosed, ResponseHead, ResponseParser
from swarmget.sinks.files import PartFile

if TYPE_CHECKING:
    from swarmget.engine.core import Engine
    from swarmget.engine.pool import HostPool

# TUNNELLING: waiting for an http proxy's answer to CONNECT (engine/tunnel.py).
CONNECTING, HANDSHAKING, ACTIVE, IDLE, CLOSED, TUNNELLING = range(6)
_SETUP_STATES = {
    CONNECTING: "connect",
    TUNNELLING: "connect through the proxy",
    HANDSHAKING: "connect and TLS handshake",
}
# An error response body larger than this is not worth reading to keep the
# connection: we close it instead.
_MAX_DISCARD = 256 * 1024
PROXY_AUTH_HINT = " (Proxy Authentication Required: give user:password in the proxy URL)"


class HTTPConnection:
    __slots__ = (
        "_pending_out",
        "_queued",
        "engine",
        "fd",
        "job",
        "last_activity",
        "parser",
        "part",
        "pool",
        "served",
        "sock",
        "started",
        "state",
        "window_bytes",
        "window_start",
    )

    def __init__(self, engine: Engine, pool: HostPool, sock: socket.socket, job: Job) -> None:
        self.engine = engine
        self.pool = pool
        self.sock = sock
        self.fd = sock.fileno()
        self.state = CONNECTING
        self.job: Job | None = job
        self.parser: ResponseParser | None = None
        self.part: PartFile | None = None
        self.served = 0  # responses completed on this connection
        self._pending_out: memoryview | None = None
        self._queued: bytes | None = None  # a request start() made, sent at the end of the turn
        now = engine.loop.now
        self.started = now  # when the current connect or request began
        self.last_activity = now
        self.window_start = now
        self.window_bytes = 0
        engine.loop.add(self.fd, EVENT_WRITE, self)

    # -- events -------------------------------------------------------------------

    def handle_io(self, mask: int) -> None:
        state = self.state
        if state == ACTIVE:
            if mask & EVENT_WRITE and self._pending_out is not None:
                self._send_pending()
            if mask & EVENT_READ and self.state == ACTIVE:
                self._readable()
        elif state == CONNECTING:
            self._connected()
        elif state == IDLE:
            self._idle_event()

    def _connected(self) -> None:
        err = connect_result(self.sock)
        job = self.job
        assert job is not None
        if err:
            self.job = None
            self.engine.finish_failure(job, connect_error(self.pool, err))
            self.close()
            return
        self._established(job)

    def _established(self, job: Job) -> None:
        """TCP is up: plain HTTP sends the request now (HTTPS handshakes first)."""
        self.engine.loop.modify(self.fd, EVENT_READ, self)
        self.state = ACTIVE
        self.start(job)

    def start(self, job: Job) -> None:
        """Send the request for ``job`` (the connection must be connected)."""
        engine = self.engine
        self.state = ACTIVE
        self.job = job
        self.parser = ResponseParser(self._on_head, self._on_body)
        self.part = None
        now = engine.loop.now
        self.started = self.last_activity = self.window_start = now
        self.window_bytes = 0
        tail = self.pool.request_tail
        credentials = engine.credential_headers
        if job.resume_from or (credentials and not job.cross_origin):
            extra = b"" if job.cross_origin else credentials
            if job.resume_from:
                # Continue a .part: ask for the rest, but only of the same entity.
                extra += (
                    f"Range: bytes={job.resume_from}-\r\nIf-Range: {job.validator}\r\n"
                ).encode("latin-1")
            tail = tail[:-2] + extra + b"\r\n"
        self._queued = b"GET " + job.target.encode("ascii") + tail
        engine.queue_send(self)

    def send_queued(self) -> None:
        """Send the request :meth:`start` queued (called by the engine at the end of a turn)."""
        request = self._queued
        if request is None or self.state != ACTIVE:
            return  # the connection failed or was closed in the same turn
        self._queued = None
        if self._send(request, self._transport_error) and self._pending_out is not None:
            self.engine.loop.modify(self.fd, EVENT_READ | EVENT_WRITE, self)

    def _send(self, data: bytes, on_error: Callable[[OSError], None]) -> bool:
        """Send ``data`` at once if the socket takes it; keep the rest in ``_pending_out``.

        False when the connection failed (``on_error`` has been called).  The
        caller registers for writability when something is left.
        """
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            on_error(exc)
            return False
        if sent < len(data):
            self._pending_out = memoryview(data)[sent:]
        return True

    def _send_pending(self) -> None:
        self._flush_out(self._transport_error)

    def _flush_out(self, on_error: Callable[[OSError], None]) -> None:
        """Write what is left of ``_pending_out``; back to read-only once it is all out."""
        out = self._pending_out
        assert out is not None
        try:
            sent = self.sock.send(out)
        except BlockingIOError:
            return
        except OSError as exc:
            on_error(exc)
            return
        if sent < len(out):
            self._pending_out = out[sent:]
            return
        self._pending_out = None
        self.engine.loop.modify(self.fd, EVENT_READ, self)

    def _readable(self) -> None:
        engine = self.engine
        buffer = engine.recv_view
        parser = self.parser
        assert parser is not None
        while True:
            try:
                n = self.sock.recv_into(buffer)
            except BlockingIOError:
                return
            except OSError as exc:
                self._transport_error(exc)
                return
            self.last_activity = engine.loop.now
            try:
                done = parser.feed(buffer[:n]) if n else parser.feed_eof()
            except TransferError as exc:
                self._fail(exc)
                return
            if done:
                self._complete(reusable=parser.reusable and n > 0)
                return
            if n < len(buffer):
                return  # drained for now; a full buffer means more is likely waiting

    def _idle_event(self) -> None:
        # Readable while idle: the server closed (or sent junk).  Either way, done.
        self.close()

    # -- parser callbacks -----------------------------------------------------------

    def _on_head(self, head: ResponseHead) -> None:
        job = self.job
        assert job is not None
        status = head.status
        engine = self.engine
        if status == 206:
            if not job.resume_from:
                raise TransferError(ErrorCode.PROTOCOL, "206 Partial Content to a plain GET")
            expected = content_range_ok(head.get(b"content-range"), job.resume_from)
            if not expected:
                raise RestartTransfer(
                    f"Content-Range {head.get(b'content-range')!r} does not continue "
                    f"at byte {job.resume_from}"
                )
            self._check_size(job.resume_from + (head.content_length or 0))
            self.part = PartFile(
                job.final, resume_from=job.resume_from, hashers=engine.resume.hashers_for(job)
            )
            return
        if 200 <= status < 300:
            # The whole entity: the server ignored our Range or the validator
            # changed; either way any .part is overwritten from zero.
            job.resume_from = 0
            if head.content_length is not None:
                self._check_size(head.content_length)
            self.part = PartFile(job.final, hashers=engine.resume.hashers_for(job))
            engine.resume.note_partial(job, head, engine.manifest)
            return
        if status in REDIRECT_STATUSES:
            location = head.get(b"location")
            if location is not None:
                job.redirect_to = redirect_target(job, location, engine.options)
        # An error status or a redirect: read a small body to keep the connection,
        # else give up on the connection.
        length = head.content_length
        if not head.chunked and (length is None or length > _MAX_DISCARD):
            if job.redirect_to is not None:
                raise Redirected(job.redirect_to)
            raise http_error(self.pool, status)

    def _check_size(self, total: int) -> None:
        limit = self.engine.options.max_size
        if limit is not None and total > limit:
            raise TransferError(
                ErrorCode.TOO_LARGE, f"the file has {total} bytes, over --max-size {limit}"
            )

    def _on_body(self, data: memoryview | bytes) -> None:
        part = self.part
        if part is not None:
            part.write(data)
            limit = self.engine.options.max_size
            if limit is not None and part.written > limit:
                raise TransferError(ErrorCode.TOO_LARGE, f"body exceeds --max-size {limit}")

    # -- outcomes -----------------------------------------------------------------

    def _complete(self, reusable: bool) -> None:
        job, parser, part = self.job, self.parser, self.part
        assert job is not None and parser is not None and parser.head is not None
        self.job = self.parser = self.part = None
        self.served += 1
        engine = self.engine
        status = parser.head.status
        if part is not None:
            try:
                part.verify(job.row.size, job.expected_digests())
                engine.finish_success(job, status, part)  # journals, then renames
            except TransferError as exc:
                part.abort()
                engine.finish_failure(job, exc, status)
        elif job.redirect_to is not None:
            engine.follow_redirect(job)
        else:
            retry_after = parse_retry_after(parser.head.get(b"retry-after"))
            engine.finish_failure(job, http_error(self.pool, status), status, retry_after)
        engine.release(self, reusable)

    def _fail(self, error: TransferError) -> None:
        """The current job failed on this connection; the connection is not reused."""
        job, parser, part = self.job, self.parser, self.part
        self.job = self.parser = self.part = None
        if part is not None:
            keep = job is not None and self.engine.resume.keep_part(job, part)
            part.abort(keep=keep)
        if job is not None:
            # On a reused connection, a close or junk before our response's head
            # is most likely left over from the previous exchange: try once more
            # on a fresh connection before blaming the server.
            stale = self.served > 0 and (
                isinstance(error, ConnectionClosed)
                or (isinstance(error, ProtocolError) and (parser is None or parser.head is None))
            )
            status = parser.head.status if parser is not None and parser.head else None
            retry_after = None
            if parser is not None and parser.head is not None and error.code.startswith("http_"):
                retry_after = parse_retry_after(parser.head.get(b"retry-after"))
            self.engine.finish_failure(job, error, status, retry_after, stale=stale)
        self.close()

    def _transport_error(self, exc: OSError) -> None:
        parser = self.parser
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if parser is not None and parser.started:
            self._fail(
                TransferError(ErrorCode.TRUNCATED, f"connection lost mid-response: {reason}")
            )
        elif self.served > 0 and exc.errno in (errno.ECONNRESET, errno.EPIPE):
            self._fail(ConnectionClosed(f"kept-alive connection was closed: {reason}"))
        else:
            self._fail(TransferError(ErrorCode.CONNECT, f"connection failed: {reason}"))

    def check(self, now: float) -> None:
        """Called by the engine's sweep: enforce connect/idle timeouts, deadline, min speed."""
        state = self.state
        options = self.engine.options
        if state == IDLE:
            if now - self.last_activity > self.engine.keepalive_idle:
                self.close()
            return
        if state in _SETUP_STATES:
            if now - self.started > options.timeout:
                what = _SETUP_STATES[state]
                self._fail(
                    TransferError(ErrorCode.TIMEOUT, f"{what} timed out after {options.timeout:g}s")
                )
            return
        if state != ACTIVE:
            return
        if now - self.last_activity > options.timeout:
            self._fail(TransferError(ErrorCode.TIMEOUT, f"no data for {options.timeout:g}s"))
            return
        if now - self.started > options.deadline:
            self._fail(
                TransferError(ErrorCode.TIMEOUT, f"deadline of {options.deadline:g}s exceeded")
            )
            return
        window = now - self.window_start
        if options.min_speed and window >= options.min_speed_window:
            parser = self.parser
            received = parser.received if parser is not None else 0
            rate = (received - self.window_bytes) / window
            if rate < options.min_speed:
                self._fail(
                    TransferError(
                        ErrorCode.TIMEOUT,
                        f"slower than --min-speed {options.min_speed} B/s "
                        f"({rate:.0f} B/s over {window:.0f}s)",
                    )
                )
                return
            self.window_start = now
            self.window_bytes = received

    def close(self) -> None:
        if self.state == CLOSED:
            return
        self.state = CLOSED
        self.engine.loop.remove(self.fd)
        self.sock.close()
        self.engine.connection_closed(self)


def http_error(pool: HostPool, status: int) -> TransferError:
    """``http_<status>`` for a final status that is not a success; a 407 names the proxy."""
    if status == 407 and pool.proxy is not None:
        return TransferError(http_code(407), f"HTTP 407 from proxy {pool.proxy}{PROXY_AUTH_HINT}")
    return TransferError(http_code(status), f"HTTP {status}")


def connect_error(pool: HostPool, err: int) -> TransferError:
    """``connect``: the TCP connect to the origin (or to its proxy) failed with ``err``."""
    via = f" to proxy {pool.proxy} ({pool.proxy.source})" if pool.proxy is not None else ""
    return TransferError(ErrorCode.CONNECT, f"connect{via} failed: {os.strerror(err)}")
