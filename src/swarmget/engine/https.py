"""HTTPS: an :class:`HTTPConnection` with a TLS layer between its socket and its parser.

Theory of operation
-------------------
The TCP connect is the plain one.  When it completes, the connection wraps its
socket (``net/tls.py``: the run's one context, the origin's last TLS session)
and enters ``HANDSHAKING``; OpenSSL then reads and writes the non-blocking
socket itself, and this class only says when:

* **Handshake.**  ``do_handshake()`` on each event until it stops raising
  ``SSLWantReadError`` (wait for readability) or ``SSLWantWriteError`` (wait
  for writability too); then the request goes out through the shared ``start``.
* **In.**  On a readable event, ``read`` decrypts record after record straight
  into the engine's receive buffer, side by side, and the parser gets them in
  one go, so a 50 KB body is one parser call and one ``os.write``.  OpenSSL
  reads the socket for us, and the only copy of the plaintext is the one into
  our buffer.  Reading goes on until OpenSSL needs more from the kernel
  (``SSLWantReadError``), even past the end of the response: bytes a server
  sent after it (a stray second answer) are found then, and make the
  connection unfit to reuse -- stopping at the response's end, the next
  request would have gone out with them still unread, and taken them for its
  answer.  Where OpenSSL reads ahead (``net/openssl.py``: up to 64 KiB a
  ``read()``, where it would otherwise read each record's header and body
  apart) it may hold bytes the kernel no longer reports as readable, so a
  connection that yields to the others before that point puts itself back
  on the loop (``call_soon``).
* **Out.**  A request is one ``write``; should the socket not take it
  (``SSLWantWriteError``), the same bytes are written again once it is
  writable, as OpenSSL requires.
* **The end of the stream.**  close_notify reads as 0 bytes (a clean EOF that
  may complete a close-delimited body), and a TCP close without it raises
  ``SSLEOFError``, which is ``truncated`` once the response has begun.

While idle in the pool, a readable event is not necessarily the server going
away: TLS 1.3 session tickets and key updates are records without data, so the
connection stays unless the read yields data or an end.  The origin's TLS
session is saved when a response completes, by then TLS 1.3 tickets (sent after
the handshake) have surely been read, so reconnects to the origin resume
instead of redoing the full handshake.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable

from swarmget.engine.classify import (
    EXCHANGE,
    HANDSHAKE,
    NOT_TLS_HINT,
    HandshakeLost,
    unanswered_hello,
)
from swarmget.engine.connection import (
    ACTIVE,
    CONNECTING,
    HANDSHAKING,
    IDLE,
    MAX_READS_PER_EVENT,
    PEEK,
    HTTPConnection,
    peer_closed,
)
from swarmget.engine.job import Transfer
from swarmget.errors import ErrorCode, TransferError
from swarmget.loop import EVENT_READ, EVENT_WRITE
from swarmget.net.tls import record_reader

# The largest TLS record's plaintext: keep this much room to read a whole one.
_MAX_RECORD = 16 * 1024
_SAVED = object()  # HTTPSConnection._offered once its session has been saved


class HTTPSConnection(HTTPConnection):
    __slots__ = (
        "_offered",
        "_read",
        "_read_ahead",
        "_reply_start",
        "_tls",
        "_watching",
        "_write",
    )

    def looks_closed(self) -> bool:
        # Bytes may be a TLS record without data (a late session ticket): the
        # TLS layer reads it with the next response.  Only an end counts here.
        return peer_closed(self.sock, unasked_bytes_end_it=False)

    # -- handshake ------------------------------------------------------------------

    def _established(self, transfer: Transfer) -> None:
        pool = self.pool
        host = pool.host
        try:
            self._tls, self.sock = self.owner.tls.wrap(self.sock, host, pool.tls_session)
        except (OSError, ValueError) as exc:  # ValueError: a host name ssl will not send
            self._fail(TransferError(ErrorCode.TLS, f"cannot start TLS with {host}: {exc}"))
            return
        self._offered: object = pool.tls_session  # or _SAVED
        self._read = record_reader(self._tls)
        self._read_ahead = self.owner.tls.read_ahead
        self._write: Callable[[bytes | memoryview], int] = self._tls.write
        self._watching = EVENT_WRITE  # as the connect left it
        # The server's first bytes, peeked before OpenSSL reads them: do they
        # begin a TLS record?  (What came before our hello is no reply to it.)
        self._reply_start = b""
        self.state = HANDSHAKING
        self._handshake()

    def _handshake(self) -> None:
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(EVENT_READ | EVENT_WRITE)
            return
        except OSError as exc:  # ssl.SSLError, or the socket's own (a reset)
            self._fail(self._classify(exc, HANDSHAKE))
            return
        self._watch(EVENT_READ)
        transfer = self.transfer
        assert transfer is not None
        self.start(transfer)

    def _classify(self, exc: BaseException, stage: int) -> TransferError:
        error = super()._classify(exc, stage)
        if isinstance(error, HandshakeLost) and stage == HANDSHAKE and self._no_tls_reply():
            return unanswered_hello(error)
        return error

    def _setup_error(self, message: str) -> TransferError:
        error = super()._setup_error(message)
        # Connected, hello sent, and nothing TLS back after all this time: the
        # server is up but not speaking TLS (a plain-HTTP server waits for the
        # rest of a request line that never comes).
        if self.state == HANDSHAKING and self._no_tls_reply():
            return TransferError(error.code, f"{error.message}, no TLS reply {NOT_TLS_HINT}")
        return error

    def _no_tls_reply(self) -> bool:
        """Did the server answer our hello with nothing that begins a TLS record?

        No cipher alone does not tell: a handshake cut or timed out halfway (a
        ServerHello cut short, or coming a byte a second) has none either.  (An
        offered session names its cipher from the start: no hint then, and a
        server that gave us a session does speak TLS.)"""
        if self._tls.cipher() is not None:
            return False
        first = self._reply_start
        # A handshake record (0x16) or an alert (0x15), of TLS 1.x (0x03):
        # one byte of it is enough to say the server may well be speaking TLS.
        looks_tls = first[:1] in (b"\x16", b"\x15") and first[1:2] in (b"", b"\x03")
        return not looks_tls

    def _peek_reply(self) -> bool:
        """Note the server's first bytes, left for OpenSSL to read; False when the
        connection failed instead (the peek took its error: OpenSSL will not see it)."""
        try:
            # socket.socket's own recv: the public fallback's SSLSocket refuses flags.
            self._reply_start = socket.socket.recv(self.sock, 2, PEEK)
        except BlockingIOError:
            pass
        except OSError as exc:  # a reset
            self._transport_error(exc)
            return False
        return True

    def _watch(self, events: int) -> None:
        if events != self._watching:
            self._watching = events
            self.owner.loop.modify(self.fd, events, self)

    # -- sending --------------------------------------------------------------------

    def _send(self, data: bytes, on_error: Callable[[OSError], None]) -> bool:
        """Encrypt and send ``data``; if the socket cannot take it now, the same bytes
        wait in ``_pending_out`` for writability.  False if the connection failed."""
        try:
            self._write(data)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
            self._pending_out = memoryview(data)
        except OSError as exc:
            on_error(exc)
            return False
        return True

    def _flush_tls(self) -> None:
        """Writable: write the request OpenSSL could not send before (again, all of it)."""
        out = self._pending_out
        assert out is not None
        # Writable again: the server read some of it, which is not silence
        # for --timeout (see HTTPConnection._stalled).
        self.last_activity = self.owner.loop.now
        try:
            self._write(out)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
            return
        except OSError as exc:
            self._transport_error(exc)
            return
        self._pending_out = None
        self.owner.loop.modify(self.fd, EVENT_READ, self)

    # -- events ---------------------------------------------------------------------

    def _on_io(self, mask: int) -> None:
        state = self.state
        if state == ACTIVE:
            if mask & EVENT_WRITE:
                if self._pending_out is not None:
                    self._flush_tls()
                elif self._watching & EVENT_WRITE:
                    self._watch(EVENT_READ)  # a read that had to write: read again
                    mask |= EVENT_READ
            if mask & EVENT_READ and self.state == ACTIVE:
                self._readable()
        elif state == HANDSHAKING:
            if mask & EVENT_READ and not self._reply_start and not self._peek_reply():
                return
            self._handshake()
        elif state == IDLE:
            self._idle_event()
        elif state == CONNECTING:
            self._connected()

    def _readable(self) -> None:
        owner = self.owner
        buffer = owner.recv_view
        parser = self.parser
        assert parser is not None
        room = len(buffer) - _MAX_RECORD
        # Bytes came: that is activity, even when they are only part of a record
        # (a 16 KiB record over a slow link takes many events to decrypt).
        self.last_activity = owner.loop.now
        for _ in range(MAX_READS_PER_EVENT):  # then the other connections' turn
            filled, eof, error = self._decrypt(buffer, room)
            try:
                done = parser.feed(buffer[:filled]) if filled else False
                if not done and isinstance(error, ssl.SSLEOFError) and parser.proves_its_end():
                    eof, error = True, None  # no close_notify, but the coding ended
                if not done and eof:
                    done = parser.feed_eof()
            except Exception as exc:
                self._feed_failed(exc)
                return
            if done:
                self._save_session()
                # Reused only when drained: a buffer filled to the brim may have
                # left the next record unread, perhaps a stray answer that the
                # connection's next request would take for its own.
                drained = filled < room
                reusable = parser.reusable and drained and not eof and error is None
                self._complete(reusable=reusable)
                return
            if error is not None:
                self._transport_error(error)
                return
            if filled < room:
                return  # drained
        if self._read_ahead:
            # The other connections' turn, but what OpenSSL read ahead is not
            # the kernel's to report: this connection comes back by itself.
            owner.loop.call_soon(self._read_on, self.transfer)

    def _decrypt(self, buffer: memoryview, room: int) -> tuple[int, bool, OSError | None]:
        """Decrypt records side by side into ``buffer`` until OpenSSL needs more
        from the kernel (or ``room`` is used), to be parsed and written in one
        go: (bytes decrypted, close_notify seen, the error that ended the stream)."""
        read = self._read
        size = len(buffer)
        filled = 0
        while filled < room:
            try:
                n = read(size - filled, buffer[filled:] if filled else buffer)
            except ssl.SSLWantReadError:
                break  # nothing more for now: epoll says when there is
            except ssl.SSLWantWriteError:
                # A renegotiation's handshake message waits for room in the
                # socket: go on when it is writable.
                self._watch(EVENT_READ | EVENT_WRITE)
                break
            except OSError as exc:  # SSLEOFError: a TCP close without close_notify
                return filled, False, exc
            if not n:
                return filled, True, None  # close_notify: a clean end of the stream
            filled += n
        return filled, False, None

    def _read_on(self, transfer: Transfer | None) -> None:
        if self.state == ACTIVE and self.transfer is transfer:
            self._readable()

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
