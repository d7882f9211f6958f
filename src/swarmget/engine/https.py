"""HTTPS: an :class:`HTTPConnection` with a TLS layer between its socket and its parser.

Theory of operation
-------------------
The TCP connect is the plain one.  When it completes, the connection creates an
``ssl.SSLObject`` over two memory BIOs (``net/tls.py``, the run's one context,
the origin's last TLS session) and enters ``HANDSHAKING``.  The socket stays a
plain non-blocking socket, and this class moves the ciphertext:

* **Out.**  Whatever OpenSSL writes (handshake messages, encrypted requests)
  lands in the outgoing BIO and goes to the socket with the shared ``_send``;
  a short write waits for writability like any plain send.
* **In.**  One ``recv_into`` takes everything the kernel has into the engine's
  receive buffer, which is copied into the incoming BIO; then ``read`` decrypts
  the complete records side by side into the same buffer (free again: the BIO
  holds its own copy), and the parser gets them in one go, so a 50 KB body is
  one parser call and one ``os.write``.  A partial record stays in the BIO for
  the next event.
* **The end of the stream.**  A TCP close becomes ``write_eof()``; close_notify
  reads as 0 bytes (a clean EOF that may complete a close-delimited body), and
  a TCP close without it raises ``SSLEOFError``, which is ``truncated`` once
  the response has begun.

The request goes out only after the handshake, through the shared ``start``.
While idle in the pool, a readable event is not necessarily the server going
away: TLS 1.3 session tickets and key updates are records without data, so the
connection stays unless the read yields data or an end.  The origin's TLS
session is saved when a response completes, by then TLS 1.3 tickets (sent after
the handshake) have surely been read, so reconnects to the origin resume
instead of redoing the full handshake.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from swarmget.engine.classify import EXCHANGE, HANDSHAKE, classify
from swarmget.engine.connection import ACTIVE, CONNECTING, HANDSHAKING, IDLE, HTTPConnection
from swarmget.engine.job import Transfer
from swarmget.errors import ErrorCode, TransferError
from swarmget.loop import EVENT_READ, EVENT_WRITE
from swarmget.net.tls import record_reader

# The largest TLS record's plaintext: keep this much room to read a whole one.
_MAX_RECORD = 16 * 1024
_SAVED = object()  # HTTPSConnection._offered once its session has been saved


class HTTPSConnection(HTTPConnection):
    __slots__ = ("_incoming", "_offered", "_outgoing", "_read", "_tls")

    # -- handshake ------------------------------------------------------------------

    def _established(self, transfer: Transfer) -> None:
        pool = self.pool
        host = pool.host
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        try:
            self._tls = self.owner.tls.wrap(self._incoming, self._outgoing, host, pool.tls_session)
            self._offered: object = pool.tls_session  # or _SAVED
        except (OSError, ValueError) as exc:  # ValueError: a host name ssl will not send
            self._fail(TransferError(ErrorCode.TLS, f"cannot start TLS with {host}: {exc}"))
            return
        self._read = record_reader(self._tls)
        self.state = HANDSHAKING
        self._handshake()

    def _handshake(self) -> None:
        try:
            self._tls.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        except ssl.SSLError as exc:
            self._fail(classify(exc, HANDSHAKE, host=self.pool.host))
            return
        if not self._send_tls_output(self._transport_error):
            return
        self.owner.loop.modify(
            self.fd, EVENT_READ | (EVENT_WRITE if self._pending_out is not None else 0), self
        )
        if done:
            transfer = self.transfer
            assert transfer is not None
            self.start(transfer)

    def _handshake_readable(self) -> None:
        if self._receive() is not None:
            self._handshake()

    # -- moving ciphertext ------------------------------------------------------------

    def _send(self, data: bytes, on_error: Callable[[OSError], None]) -> bool:
        """Encrypt ``data`` and send it (what is left waits in ``_pending_out``)."""
        try:
            self._tls.write(data)
        except ssl.SSLError as exc:
            on_error(exc)
            return False
        return self._send_tls_output(on_error)

    def _send_tls_output(self, on_error: Callable[[OSError], None]) -> bool:
        """Send what OpenSSL wrote to the outgoing BIO; False if the connection failed."""
        outgoing = self._outgoing
        if not outgoing.pending:
            return True
        data = outgoing.read()
        pending = self._pending_out
        if pending is not None:  # still sending earlier bytes: these go after them
            self._pending_out = memoryview(bytes(pending) + data)
            return True
        return HTTPConnection._send(self, data, on_error)

    def _receive(self) -> int | None:
        """Move what the socket has into the incoming BIO: the byte count (0 at the end
        of the stream), or None when there was nothing or the connection failed."""
        buffer = self.owner.recv_view
        try:
            n = self.sock.recv_into(buffer)
        except BlockingIOError:
            return None
        except OSError as exc:
            self._transport_error(exc)
            return None
        if n:
            self._incoming.write(buffer[:n])
        else:
            self._incoming.write_eof()
        return n

    # -- events ---------------------------------------------------------------------

    def _on_io(self, mask: int) -> None:
        state = self.state
        if mask & EVENT_WRITE and self._pending_out is not None and state in (ACTIVE, HANDSHAKING):
            self._flush_out(self._transport_error)  # back to read-only once all is out
            state = self.state
        if not mask & EVENT_READ and state != CONNECTING:
            return
        if state == ACTIVE:
            self._readable()
        elif state == HANDSHAKING:
            self._handshake_readable()
        elif state == IDLE:
            self._idle_event()
        elif state == CONNECTING:
            self._connected()

    def _readable(self) -> None:
        owner = self.owner
        buffer = owner.recv_view
        parser = self.parser
        assert parser is not None
        received = self._receive()
        if received is None:
            return
        read = self._read
        incoming = self._incoming
        size = len(buffer)
        room = size - _MAX_RECORD
        while True:
            # Decrypt the records the BIO holds side by side into the buffer (until
            # it is nearly full), then parse and write them in one go.
            filled = 0
            eof = False
            error: ssl.SSLError | None = None
            while filled < room and (incoming.pending or incoming.eof or not received):
                try:
                    n = read(size - filled, buffer[filled:] if filled else buffer)
                except ssl.SSLWantReadError:
                    break  # the rest of a record is still on its way
                except ssl.SSLError as exc:
                    error = exc
                    break
                if not n:
                    eof = True  # close_notify: a clean end of the stream
                    break
                filled += n
            try:
                if filled:
                    self.last_activity = owner.loop.now
                    done = parser.feed(buffer[:filled])
                else:
                    done = False
                if not done and eof:
                    done = parser.feed_eof()
            except Exception as exc:
                self._feed_failed(exc)
                return
            if done:
                self._save_session()
                self._complete(
                    reusable=parser.reusable and not eof and error is None and received > 0
                )
                return
            if error is not None:
                self._transport_error(error)
                return
            if self._outgoing.pending and not self._send_tls_output(self._transport_error):
                return  # OpenSSL answered something (a key update) and the send failed
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

    def _idle_event(self) -> None:
        received = self._receive()
        if received is None:
            return
        if received:
            buffer = self.owner.recv_view
            try:
                self._read(len(buffer), buffer)
            except ssl.SSLWantReadError:
                return  # a record without data (session ticket, key update): still usable
            except OSError:
                pass
        self.close()  # data while idle, close_notify, or the TCP connection ended

    # -- failures -------------------------------------------------------------------

    def _transport_error(self, exc: OSError) -> None:
        self._fail(self._classify(exc, HANDSHAKE if self.state == HANDSHAKING else EXCHANGE))
