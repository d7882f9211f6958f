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
owner sends the queued requests together at the end of the loop turn, or as
soon as ``SEND_BATCH`` of them wait (:meth:`send_queued`).  One burst of
requests wakes a busy server once and lets it read them all in one
``epoll_wait``, where a request sent the moment each response ends wakes it
every time: on the nginx benchmark that cut our CPU per file by a quarter, in
kernel time on both sides.  The delay is at most one loop turn.

Each readable event is one ``recv_into`` into the owner's shared receive
buffer (one buffer for the whole loop: only one connection runs at a time), and
the ``ResponseParser`` passes body slices of that buffer straight to the
transfer's :class:`~swarmget.sinks.base.Writer`.  Nothing here allocates per
read beyond the memoryview slice itself.

What a response means is not decided here: the head goes to
:func:`~swarmget.engine.verdicts.judge`, and the verdict (plus, on failure,
the error :func:`~swarmget.engine.classify.classify` made of whatever was
raised) goes to the owner with :meth:`ConnectionOwner.ended`.  Anything at all
that goes wrong while reading -- a malformed reply, an unexpected exception --
ends the transfer with a code and closes this connection; it never escapes
into the loop.

Timeouts are not timers: the owner sweeps all connections a few times a second
and calls :meth:`HTTPConnection.check`, which compares ``loop.now`` with the
connection's timestamps.  That keeps the per-read cost at one attribute store.

HTTPS is the subclass in ``engine/https.py``: after the TCP connect it runs the
TLS handshake (state ``HANDSHAKING``) before the first request, and puts a TLS
layer between the socket and the parser; the socket itself stays plain, so
sends, timeouts and the pool are shared.
"""

from __future__ import annotations

import fcntl
import socket
import sys
import termios
from collections.abc import Callable
from typing import Final

from swarmget.engine.classify import CONNECT, EXCHANGE, classify
from swarmget.engine.job import Transfer
from swarmget.engine.owner import ConnectionOwner
from swarmget.engine.pool import HostPool, PooledConnection
from swarmget.engine.retry import Stalled
from swarmget.engine.verdicts import (
    ACCEPT,
    FAIL,
    MAX_DISCARD,
    MAX_DISCARD_SECONDS,
    Verdict,
    judge,
)
from swarmget.errors import ErrorCode, ProtocolError, TransferError
from swarmget.loop import EVENT_READ, EVENT_WRITE
from swarmget.net.connect import connect_result
from swarmget.protocol import ConnectionClosed, ResponseHead, ResponseParser
from swarmget.sinks.base import Writer

# Connection states.  TUNNELLING: waiting for an http proxy's answer to
# CONNECT (engine/tunnel.py).
CONNECTING: Final = 0
HANDSHAKING: Final = 1
ACTIVE: Final = 2
IDLE: Final = 3
CLOSED: Final = 4
TUNNELLING: Final = 5
# Close our idle connections before typical servers do (nginx: 75 s, Apache: 5 s
# and then it is the server that closes, which we notice).
KEEPALIVE_IDLE: Final = 55.0
_SETUP_STATES: Final = {
    CONNECTING: "connect",
    TUNNELLING: "connect through the proxy",
    HANDSHAKING: "connect and TLS handshake",
}


PEEK: Final = socket.MSG_PEEK | socket.MSG_DONTWAIT
# The ioctl that tells how many bytes a TCP socket still holds to send or to see
# acknowledged (Linux's SIOCOUTQ, which is TIOCOUTQ); 0 where there is none.
_OUTQ: Final = getattr(termios, "TIOCOUTQ", 0)


def peer_closed(sock: socket.socket, *, unasked_bytes_end_it: bool) -> bool:
    """Peek at an idle connection's socket (one syscall; reads nothing): has the
    server closed it (end of file, an error), or sent bytes unasked?"""
    try:
        peeked = sock.recv(1, PEEK)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    return not peeked or unasked_bytes_end_it


def deadline_exceeded(deadline: float, during: str = "") -> TransferError:
    """The error of a row that ran past ``--deadline`` (never retried: see core.py),
    ``during`` its connection's setup ("connect", ...) or after."""
    message = f"deadline of {deadline:g}s exceeded"
    return TransferError(ErrorCode.TIMEOUT, f"{message} during the {during}" if during else message)


class _Abandon(Exception):
    """Unwinds the parser after a verdict that ends the transfer at its head."""


# Full buffers read for one readable event before the loop's other connections
# and its clock get a turn (8 MiB with the engine's 4 MiB buffer): a body
# arriving faster than we parse it held the loop for seconds, past --deadline,
# stalling every other transfer.  (epoll is level-triggered: what is left is
# reported again at once.)
MAX_READS_PER_EVENT: Final = 2


class HTTPConnection(PooledConnection):
    __slots__ = (
        "_pending_out",
        "_queued",
        "_unsent",
        "discarded",
        "fd",
        "last_activity",
        "owner",
        "parser",
        "served",
        "sock",
        "speed_window",
        "started",
        "state",
        "transfer",
        "verdict",
        "window_bytes",
        "window_start",
        "writer",
    )

    def __init__(
        self, owner: ConnectionOwner, pool: HostPool, sock: socket.socket, transfer: Transfer
    ) -> None:
        super().__init__(pool)
        self.owner = owner
        self.sock = sock
        self.fd = sock.fileno()
        self.state = CONNECTING
        self.transfer: Transfer | None = transfer
        self.parser: ResponseParser | None = None
        self.verdict: Verdict | None = None  # judged from the head of the current response
        self.discarded = 0  # body bytes of the current response read only to be dropped
        self.writer: Writer | None = None  # where the current body goes (its transfer's)
        self.served = 0  # responses completed on this connection
        self._pending_out: memoryview | None = None
        self._queued: bytes | None = None  # a request start() made, sent at the end of the turn
        self._unsent = 0  # request bytes the kernel held at the last sweep (_note_draining)
        now = owner.loop.now
        self.started = now  # when the current connect or request began
        self.last_activity = now
        self.window_start = now
        self.window_bytes = 0
        self.speed_window = owner.options.min_speed_window  # see Transfer.speed_window
        owner.loop.add(self.fd, EVENT_WRITE, self)

    # -- events -------------------------------------------------------------------

    def handle_io(self, mask: int) -> None:
        try:
            self._on_io(mask)
        except Exception as exc:
            self._crashed(exc)

    def _crashed(self, exc: Exception) -> None:
        """Something nobody foresaw went wrong: fail this transfer, drop the connection."""
        if self.state == CLOSED:
            raise exc  # not ours: it happened after we were done
        if self.transfer is not None:
            self._fail(self._classify(exc, EXCHANGE))
        else:
            self.close()

    def _on_io(self, mask: int) -> None:
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
        if err:
            pool = self.pool
            error = classify(
                OSError(err, ""), CONNECT, host=pool.connect_label, via=pool.via_source
            )
            self._fail(error)
            return
        transfer = self.transfer
        assert transfer is not None
        self._established(transfer)

    def _established(self, transfer: Transfer) -> None:
        """TCP is up: plain HTTP sends the request now (HTTPS handshakes first)."""
        self.owner.loop.modify(self.fd, EVENT_READ, self)
        self.state = ACTIVE
        self.start(transfer)

    def start(self, transfer: Transfer) -> None:
        """Queue the request for ``transfer`` (the connection must be connected)."""
        owner = self.owner
        self.state = ACTIVE
        self.transfer = transfer
        # max_decoded: a gzip/deflate transfer coding cannot inflate past --max-size.
        self.parser = ResponseParser(
            self._on_head, self._on_body, max_decoded=owner.options.max_size
        )
        self.verdict = None
        self.writer = None
        self.discarded = 0
        now = owner.loop.now
        self.started = self.last_activity = self.window_start = now
        self.window_bytes = 0
        self.speed_window = transfer.speed_window or owner.options.min_speed_window
        job = transfer.job
        template = self.pool.template
        credentials = b""
        if not job.cross_origin:
            credentials = owner.credentials
        elif template.host_omitted:
            credentials = template.own_host  # the user's Host was for the first origin
        if job.authorization is not None and (job.cross_origin or not owner.user_authorizes):
            credentials += f"Authorization: {job.authorization}\r\n".encode("latin-1")
        if transfer.ranged:
            self._queued = template.render(
                job.target,
                byte_range=transfer.range_header(),
                validator=job.validator,
                credentials=credentials,
            )
        else:
            self._queued = template.render(job.target, credentials=credentials)
        owner.queue_send(self)

    def send_queued(self) -> None:
        """Send the request :meth:`start` queued (called by the owner at the end of a turn)."""
        request = self._queued
        if request is None or self.state != ACTIVE:
            return  # the connection failed or was closed in the same turn
        self._queued = None
        if self._send(request, self._transport_error) and self._pending_out is not None:
            self.owner.loop.modify(self.fd, EVENT_READ | EVENT_WRITE, self)

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
        if sent:
            # The server is reading a request too big for the socket at once:
            # that is not silence, for --timeout (see _stalled).
            self.last_activity = self.owner.loop.now
        if sent < len(out):
            self._pending_out = out[sent:]
            return
        self._pending_out = None
        self.owner.loop.modify(self.fd, EVENT_READ, self)

    def _readable(self) -> None:
        owner = self.owner
        buffer = owner.recv_view
        parser = self.parser
        assert parser is not None
        for _ in range(MAX_READS_PER_EVENT):
            try:
                n = self.sock.recv_into(buffer)
            except BlockingIOError:
                return
            except OSError as exc:
                self._transport_error(exc)
                return
            self.last_activity = owner.loop.now
            try:
                done = parser.feed(buffer[:n]) if n else parser.feed_eof()
            except Exception as exc:
                self._feed_failed(exc)
                return
            if done:
                # Reused only when drained: a full buffer may have left bytes
                # unread (a stray answer the next request would take for its own).
                self._complete(reusable=parser.reusable and 0 < n < len(buffer))
                return
            if n < len(buffer):
                return  # drained for now; a full buffer means more is likely waiting

    def _idle_event(self) -> None:
        # Readable while idle: the server closed (or sent junk).  Either way, done.
        self.close()

    # -- parser callbacks -----------------------------------------------------------

    def _on_head(self, head: ResponseHead) -> None:
        transfer = self.transfer
        assert transfer is not None
        verdict = judge(transfer, head, self.owner.options, self.pool.proxy)
        if head.status == 408 and self.served:
            # A 408 on a kept-alive connection is, as a rule, the server timing
            # out the idle connection as our request went out: it answers no
            # request of ours.  Again on a fresh one, as for a stale close, not
            # counted (Go's client does the same); a 408 there is the server's.
            verdict.stale = True
        self.verdict = verdict
        pool = self.pool
        if pool.probing or pool.limit:  # after a push-back (Scheduler.head_came)
            self.owner.answered(pool, head.status, self.started, transfer.job.row.key)
        if verdict.kind == ACCEPT:
            transfer.job.total = verdict.total
            writer = self.owner.open_writer(transfer, verdict, head)
            transfer.writer = writer
            # A part that is whole already: the body is read to keep the
            # connection (or abandoned, past MAX_DISCARD), not written.
            self.writer = None if verdict.complete else writer
        elif not verdict.discard:
            raise _Abandon  # not worth reading the body: end now, close the connection

    def _on_body(self, data: memoryview | bytes) -> None:
        writer = self.writer
        if writer is not None:
            writer.write(data)
            limit = self.owner.options.max_size
            if limit is not None and writer.written > limit:
                raise TransferError(ErrorCode.TOO_LARGE, f"body exceeds --max-size {limit}")
            return
        # An error page or a redirect's body, read only to keep the connection:
        # past MAX_DISCARD (a chunked one has no length to judge by) it is
        # cheaper to close.
        self.discarded += len(data)
        if self.discarded > MAX_DISCARD:
            raise _Abandon

    # -- outcomes -----------------------------------------------------------------

    def _complete(self, reusable: bool) -> None:
        transfer, verdict = self.transfer, self.verdict
        assert transfer is not None and verdict is not None
        if self._pending_out is not None:
            # The server answered before it had all of the request (RFC 9112
            # allows it): the rest is still to go, and the next request would
            # be written into the middle of it.  Over TLS OpenSSL would even go
            # on from the unsent request's offset into the next one's bytes.
            reusable = False
        if self.pool.template.closes or self.pool.reuse_broken:
            # The request said "Connection: close" (--header), or this host went
            # silent on a reused connection before (HostPool.reuse_broken).
            reusable = False
        self.transfer = self.parser = self.verdict = self.writer = None
        self.served += 1
        # Idle until the owner gives it the next transfer (start) or closes it:
        # an event now is the server's, not part of a response (see _on_io).
        self.state = IDLE
        owner = self.owner
        owner.ended(self, transfer, verdict)
        owner.released(self, reusable)

    def _feed_failed(self, exc: Exception) -> None:
        """The parser, a verdict or the writer stopped this response."""
        verdict = self.verdict
        if isinstance(exc, _Abandon) and verdict is not None:
            self._end(verdict)
            return
        self._fail(self._classify(exc, EXCHANGE))

    def _classify(self, exc: BaseException, stage: int) -> TransferError:
        """``exc`` as the error this transfer fails with (engine/classify.py)."""
        parser = self.parser
        return classify(
            exc,
            stage,
            host=self.pool.host,
            started=parser is not None and parser.started,
            received=parser.received if parser is not None else 0,
            announced=parser.announced if parser is not None else None,
            reused=self.served > 0,
            via=self.pool.via,
        )

    def _fail(self, error: TransferError) -> None:
        """The current transfer failed on this connection; the connection is not reused."""
        verdict = self.verdict
        if verdict is not None and verdict.kind != ACCEPT:
            # The head decided already (an error status, a redirect): its body
            # was only being read to keep the connection, and how that ends --
            # stalled, cut -- changes nothing but the connection.
            self._end(verdict)
            return
        parser = self.parser
        head = parser.head if parser is not None else None
        # On a reused connection, a close or junk before our response's head
        # is most likely left over from the previous exchange, and silence
        # (not a byte of an answer in --timeout) a keep-alive the server, or a
        # box on the way, dropped without a word: try once more on a fresh
        # connection before blaming the server.
        stale = self.served > 0 and (
            isinstance(error, ConnectionClosed)
            or (isinstance(error, ProtocolError) and head is None)
            or (isinstance(error, Stalled) and (parser is None or not parser.started))
        )
        status = head.status if head is not None else 0
        retry_after = verdict.retry_after if verdict is not None else None
        self._end(Verdict(FAIL, status, error=error, retry_after=retry_after, stale=stale))

    def _end(self, verdict: Verdict) -> None:
        """End the current transfer with ``verdict`` and close the connection."""
        transfer = self.transfer
        self.transfer = self.parser = self.verdict = self.writer = None
        if transfer is not None:
            self.owner.ended(self, transfer, verdict)
        self.close()

    def _transport_error(self, exc: OSError) -> None:
        self._fail(self._classify(exc, EXCHANGE))

    def check(self, now: float) -> None:
        """Called by the owner's sweep: enforce connect/idle timeouts, deadline, min speed."""
        state = self.state
        options = self.owner.options
        if state == IDLE:
            if now - self.idle_since > KEEPALIVE_IDLE:
                self.close()
            return
        if state == CLOSED:
            return
        deadline = self._deadline()  # the file's (a long body's may be longer)
        if state in _SETUP_STATES:
            # The deadline too: a connect, tunnel or handshake that is never
            # answered otherwise ran a whole --timeout past it.
            if self._past_deadline(now, deadline):
                self._fail(self._setup_past_deadline(deadline))
            elif now - self.started > options.timeout:
                self._fail(self._setup_timed_out(options.timeout))
            return
        verdict = self.verdict
        if verdict is not None and verdict.kind != ACCEPT:
            if now - self.started > MAX_DISCARD_SECONDS:
                self._end(verdict)  # a body read only to be dropped: not worth the wait
            return
        if verdict is None and _OUTQ:
            self._note_draining(now)
        if now - self.last_activity > options.timeout:
            self._fail(self._stalled(options.timeout))
            return
        if self._past_deadline(now, deadline):
            self._fail(deadline_exceeded(deadline))
            return
        window = now - self.window_start
        if options.min_speed and window >= self.speed_window:
            parser = self.parser
            received = parser.received if parser is not None else 0
            rate = (received - self.window_bytes) / window
            if rate < options.min_speed:
                self._fail(Stalled(self._too_slow(options.min_speed, rate, window)))
                return
            self.window_start = now
            self.window_bytes = received
            self.speed_window = options.min_speed_window

    def _too_slow(self, min_speed: int, rate: float, window: float) -> str:
        head = self.parser.head if self.parser is not None else None
        if head is None:
            # Only body bytes count, so a head (or 1xx responses) sent a few
            # bytes at a time read as "0 B/s", which said nothing of why.
            return f"slower than --min-speed {min_speed} B/s (no response head after {window:.0f}s)"
        return f"slower than --min-speed {min_speed} B/s ({rate:.0f} B/s over {window:.0f}s)"

    def _past_deadline(self, now: float, deadline: float) -> bool:
        # The deadline is the file's, from its first attempt: not this request's
        # (a chain of slow redirects, or retries, each got the whole deadline).
        transfer = self.transfer
        began = transfer.job.first_start if transfer is not None else 0.0
        return now - (began or self.started) > deadline

    def _deadline(self) -> float:
        """The file's deadline (a long body's may be longer: Job.deadline)."""
        transfer = self.transfer
        if transfer is not None:
            return transfer.job.deadline
        return self.owner.options.first_deadline

    def _stalled(self, limit: float) -> Stalled:
        """Nothing came, and nothing of ours went, for ``limit`` seconds (--timeout)."""
        if self._pending_out is not None:
            # Not a silent server: one that would not take our request.
            return Stalled(f"the request could not be sent: the server read nothing for {limit:g}s")
        return Stalled(f"no data for {limit:g}s")

    def _setup_timed_out(self, limit: float) -> TransferError:
        what = _SETUP_STATES[self.state]
        if self.state == CONNECTING and not self.pool.via:
            what = f"connect to {self.pool.connect_label}"  # as a failed race says it
        return self._setup_error(f"{what} timed out after {limit:g}s")

    def _setup_past_deadline(self, deadline: float) -> TransferError:
        return self._setup_error(deadline_exceeded(deadline, _SETUP_STATES[self.state]).message)

    def _setup_error(self, message: str) -> TransferError:
        """The ``timeout`` a connection still being set up fails with (HTTPS adds a hint)."""
        return TransferError(ErrorCode.TIMEOUT, message)

    def _note_draining(self, now: float) -> None:
        """A server still taking our request in is not silent either: the bytes
        the kernel holds for it went down since the last sweep.  Once the last
        send() returns, the kernels' buffers still hold megabytes of a big
        request, which a slow reader takes a while to drain, and meanwhile no
        writable event comes to say so (_flush_out)."""
        try:
            held = int.from_bytes(fcntl.ioctl(self.fd, _OUTQ, bytes(4)), sys.byteorder)
        except OSError:
            return
        if 0 < held < self._unsent:
            self.last_activity = now
        self._unsent = held

    def abandon_unanswered(self, error: TransferError) -> None:
        """Fail the transfer of a connection still being set up (connecting,
        through its proxy's tunnel, in its TLS handshake), or whose request has
        had no byte of answer yet: its host was given up meanwhile, and waiting
        out its own --timeout would only cost time."""
        state = self.state
        silent = self.verdict is None and self.last_activity == self.started
        if state in _SETUP_STATES or (state == ACTIVE and silent):
            self._fail(error)

    def looks_closed(self) -> bool:
        # Bytes nobody asked for (a 408 some servers send before they close)
        # mean the connection cannot carry a request.
        return peer_closed(self.sock, unasked_bytes_end_it=True)

    def close(self) -> None:
        if self.state == CLOSED:
            return
        self.state = CLOSED
        self.owner.loop.remove(self.fd)
        self.sock.close()
        self.owner.closed(self)
