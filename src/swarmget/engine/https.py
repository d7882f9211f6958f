"""HTTPS: an :class:`HTTPConnection` whose socket becomes a non-blocking ``SSLSocket``.

Theory of operation
-------------------
The TCP connect is the plain one.  When it completes, the socket is wrapped
(``net/tls.py``, the run's one context, the origin's last TLS session) and the
connection enters ``HANDSHAKING``: every readiness event calls
``do_handshake()`` again, and the loop registration follows what OpenSSL asks
for next (``SSLWantReadError`` -> readable, ``SSLWantWriteError`` -> writable).
The request goes out only after the handshake, through the shared ``start``.

Reading is where TLS differs from TCP, so this class has its own loop (and the
plain one stays untouched):

* ``recv_into`` returns at most one TLS record (16 KB) per call, and decrypted
  bytes can wait inside OpenSSL with no epoll event to announce them, so a
  short read proves nothing: we read until ``SSLWantReadError``.  The records
  are decrypted side by side into the receive buffer and parsed in one go, so
  a 50 KB body costs one parser call and one ``os.write``, not four.
* The end of the stream: close_notify reads as 0 bytes (a clean EOF that may
  complete a close-delimited body); a TCP close without it raises
  ``SSLEOFError``, which is ``truncated`` once the response has begun.

While idle in the pool, a readable event is not necessarily the server going
away: TLS 1.3 session tickets and key updates are records without data.  We
read once; ``SSLWantReadError`` means it was one of those and the connection
stays.  The origin's TLS session is saved when a response completes, by then
TLS 1.3 tickets (sent after the handshake) have surely been read, so reconnects
to the origin resume instead of redoing the full handshake.
"""

from __future__ import annotations

import ssl

from swarmget.engine.connection import ACTIVE, CONNECTING, HANDSHAKING, IDLE, HTTPConnection
from swarmget.engine.job import Job
from swarmget.errors import ErrorCode, TransferError
from swarmget.loop import EVENT_READ, EVENT_WRITE
from swarmget.net.tls import record_reader, tls_error
from swarmget.protocol import ConnectionClosed

# The largest TLS record's plaintext: keep this much room to read a whole one.
_MAX_RECORD = 16 * 1024
_SAVED = object()  # HTTPSConnection._offered once its session has been saved


class HTTPSConnection(HTTPConnection):
    __slots__ = ("_events", "_offered", "_read", "_read_wants_write", "_tls")

    # -- handshake ------------------------------------------------------------------

    def _established(self, job: Job) -> None:
        pool = self.pool
        host = pool.origin[1]
        try:
            tls = self.engine.tls.wrap(self.sock, host, pool.tls_session)
            self._offered: object = pool.tls_session  # or _SAVED
        except (OSError, ValueError) as exc:  # ValueError: a host name ssl will not send
            self._fail(TransferError(ErrorCode.TLS, f"cannot start TLS with {host}: {exc}"))
            return
        self.sock = self._tls = tls
        self._read = record_reader(tls)
        self._events = EVENT_WRITE  # as registered for the connect
        self._read_wants_write = False
        self.state = HANDSHAKING
        self._handshake()

    def _handshake(self) -> None:
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._want(EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._want(EVENT_WRITE)
            return
        except ssl.SSLError as exc:
            self._fail(tls_error(exc, self.pool.origin[1], handshake=True))
            return
        except OSError as exc:  # reset or refused mid-handshake: a connection failure
            self._transport_error(exc)
            return
        self._want(EVENT_READ)
        job = self.job
        assert job is not None
        self.start(job)

    def _want(self, events: int) -> None:
        if events != self._events:
            self._events = events
            self.engine.loop.modify(self.fd, events, self)

    # -- events ---------------------------------------------------------------------

    def handle_io(self, mask: int) -> None:
        state = self.state
        if state == ACTIVE:
            if mask & EVENT_WRITE:
                if self._pending_out is not None:
                    self._send_pending()
                if self._read_wants_write and self.state == ACTIVE:
                    self._read_wants_write = False
                    if self._pending_out is None:  # else _send_pending drops WRITE later
                        self.engine.loop.modify(self.fd, EVENT_READ, self)
                    self._readable()
                    return
            if mask & EVENT_READ and self.state == ACTIVE:
                self._readable()
        elif state == HANDSHAKING:
            self._handshake()
        elif state == IDLE:
            self._idle_event()
        elif state == CONNECTING:
            self._connected()

    def _readable(self) -> None:
        engine = self.engine
        buffer = engine.recv_view
        parser = self.parser
        assert parser is not None
        read = self._read
        size = len(buffer)
        room = size - _MAX_RECORD
        while True:
            # Gather records until OpenSSL and the kernel run dry (SSLWantReadError)
            # or the buffer is nearly full, then parse and write them in one go: a
            # 50 KB body is four records, and one os.write beats four.
            filled = 0
            eof = False
            error: OSError | None = None
            while filled < room:
                try:
                    n = read(size - filled, buffer[filled:] if filled else buffer)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLWantWriteError:
                    # OpenSSL must send something (a key update) before reading on.
                    self._read_wants_write = True
                    engine.loop.modify(self.fd, EVENT_READ | EVENT_WRITE, self)
                    break
                except OSError as exc:
                    error = exc
                    break
                if not n:
                    eof = True  # close_notify: a clean end of the stream
                    break
                filled += n
            try:
                if filled:
                    self.last_activity = engine.loop.now
                    done = parser.feed(buffer[:filled])
                else:
                    done = False
                if not done and eof:
                    done = parser.feed_eof()
            except TransferError as exc:
                self._fail(exc)
                return
            if done:
                self._save_session()
                self._complete(reusable=parser.reusable and not eof and error is None)
                return
            if error is not None:
                self._transport_error(error)
                return
            if filled < room:
                return  # drained for now

    def _save_session(self) -> None:
        # Once per connection, and only while the pool still holds the session
        # this connection started with: of the first burst of connections (all
        # offered none) one saves, and each reconnect refreshes it (a TLS 1.3
        # ticket may be single-use).  Reading ``session`` costs ~0.2 ms: it
        # serializes and reparses the session, certificate included.
        pool = self.pool
        if pool.tls_session is not self._offered:
            return
        self._offered = _SAVED  # never the pool's: later responses here return above
        session = self._tls.session
        if session is not None:
            pool.tls_session = session

    def _send_pending(self) -> None:
        super()._send_pending()
        if self._pending_out is None and self._read_wants_write:
            self.engine.loop.modify(self.fd, EVENT_READ | EVENT_WRITE, self)

    def _idle_event(self) -> None:
        try:
            self._tls.recv_into(self.engine.recv_view)
        except ssl.SSLWantReadError:
            return  # a record without data (session ticket, key update): still usable
        except OSError:
            pass
        self.close()  # data while idle, close_notify, or the TCP connection ended

    # -- failures -------------------------------------------------------------------

    def _transport_error(self, exc: OSError) -> None:
        if not isinstance(exc, ssl.SSLError):
            super()._transport_error(exc)
            return
        parser = self.parser
        if isinstance(exc, ssl.SSLEOFError):
            if parser is not None and parser.started:
                self._fail(
                    TransferError(
                        ErrorCode.TRUNCATED,
                        "TLS connection closed without close_notify after "
                        f"{parser.received} body bytes",
                    )
                )
            else:
                self._fail(ConnectionClosed("server closed the TLS connection before responding"))
            return
        self._fail(tls_error(exc, self.pool.origin[1], handshake=False))
