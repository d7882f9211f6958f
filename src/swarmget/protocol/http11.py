"""Reading one HTTP/1.1 response at a time, with the body passed through untouched.

Theory of operation
-------------------
llhttp (through httptools) is the parser: we never interpret a status line or a
header ourselves.  What we *do* own is where the bytes go, because that is the
hot path of the whole product:

* **Head.**  Bytes are gathered until the blank line that ends the header block
  (at most :data:`MAX_HEADER_BYTES`), and exactly that block is fed to a fresh
  ``httptools.HttpResponseParser``.  llhttp validates it strictly (duplicate or
  non-numeric Content-Length, Content-Length together with Transfer-Encoding,
  NUL or bare CR in a value, a bad status line...).  We add the limits llhttp
  does not have: header block size, number of fields, and how many ``1xx``
  interim responses we sit through.
* **Body framed by Content-Length, or by the connection closing.**  llhttp is
  not involved: the parser hands ``memoryview`` slices of the caller's receive
  buffer straight to the ``on_body`` callback, so a 50 KB image travels from
  ``recv_into`` to ``os.write`` without a single copy.
* **Chunked body.**  The same llhttp parser that read the head continues with
  the chunk framing; its ``on_body`` bytes go to the callback.

One response per parser: the connection creates a new :class:`ResponseParser`
for each request (that costs about a microsecond).  Bytes that arrive after a
complete response are never a next response (we do not pipeline), so they make
the connection unusable: :attr:`ResponseParser.reusable` turns False.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import httptools

from swarmget.errors import ErrorCode, ProtocolError, TransferError

MAX_HEADER_BYTES: Final = 64 * 1024
MAX_HEADER_FIELDS: Final = 100
MAX_INFORMATIONAL: Final = 16
# The first look for the end of the head copies at most this much of the
# segment; typical heads are a few hundred bytes and the rest is body.
_HEAD_PROBE: Final = 8192
_FIRST_PROBE: Final = 1024  # the first look, when nothing is pending: most heads fit

_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _DONE = range(5)

BodyCallback = Callable[[memoryview | bytes], None]
HeadCallback = Callable[["ResponseHead"], None]


class ConnectionClosed(TransferError):
    """The peer closed before sending a single byte of the response.

    On a reused keep-alive connection this usually means the server timed the
    connection out just as we sent: the engine retries such a request once on a
    fresh connection without counting an attempt.
    """

    def __init__(self, message: str = "connection closed before the response started") -> None:
        super().__init__(ErrorCode.CONNECT, message)

    def __reduce__(self) -> tuple[type[ConnectionClosed], tuple[str]]:
        return (ConnectionClosed, (self.message,))


class ResponseHead:
    """Status and headers of a final (non-1xx) response."""

    __slots__ = ("chunked", "content_length", "headers", "keep_alive", "status")

    def __init__(
        self,
        status: int,
        headers: dict[bytes, bytes],
        content_length: int | None,
        chunked: bool,
        keep_alive: bool,
    ) -> None:
        self.status = status
        # name as received -> value, in arrival order; a name repeated with the
        # same spelling keeps its last value (none we read may be repeated).
        self.headers = headers
        self.content_length = content_length  # None when not framed by length
        self.chunked = chunked
        self.keep_alive = keep_alive

    def get(self, name: bytes) -> bytes | None:
        """The last value of header ``name`` (lower-case), or None."""
        size = len(name)
        headers = self.headers
        for key in reversed(headers):
            if len(key) == size and key.lower() == name:
                return headers[key]
        return None

    def __repr__(self) -> str:
        return f"<ResponseHead {self.status} length={self.content_length} chunked={self.chunked}>"


class _Callbacks:
    """httptools callbacks for one response: the head, then a chunked body if any."""

    __slots__ = (
        "began",
        "body_sink",
        "complete",
        "extra",
        "headers",
        "on_header",
    )

    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        # llhttp calls this once per field, from C.  The dict's own __setitem__
        # runs no Python frame, where a method cost one per field (~1 us of
        # the ~7 us a whole 50 KB response used to cost us).
        self.on_header = self.headers.__setitem__
        self.began = False
        self.complete = False
        self.extra = False
        self.body_sink: BodyCallback | None = None

    def on_message_begin(self) -> None:
        if self.began:
            # A second message in the same stream: bytes after the response.
            self.extra = True
            raise _StopParsing
        self.began = True

    def on_body(self, body: bytes) -> None:
        sink = self.body_sink
        if sink is None:  # pragma: no cover - only chunked bodies reach llhttp
            raise _StopParsing
        sink(body)

    def on_message_complete(self) -> None:
        self.complete = True


class _StopParsing(Exception):
    pass


class ResponseParser:
    """Parses one response to a GET; body bytes go to ``on_body``.

    ``feed(view)`` returns True once the response is complete.  ``feed_eof()``
    tells that the peer closed; it returns True when that completes a
    close-delimited body and raises :class:`TransferError` (``truncated``) or
    :class:`ConnectionClosed` otherwise.  Any malformed input raises
    :class:`ProtocolError`.
    """

    __slots__ = (
        "_chunk_state",
        "_llhttp",
        "_on_body",
        "_on_head",
        "_pending",
        "_remaining",
        "_state",
        "head",
        "informational",
        "received",
        "reusable",
    )

    def __init__(self, on_head: HeadCallback, on_body: BodyCallback) -> None:
        self._on_head = on_head
        self._on_body = on_body
        self._state = _HEAD
        self._pending = bytearray()
        self._remaining = 0
        self._llhttp: httptools.HttpResponseParser | None = None
        self._chunk_state: _Callbacks | None = None
        self.head: ResponseHead | None = None
        self.informational = 0  # 1xx responses skipped so far
        self.received = 0  # body bytes delivered to on_body
        self.reusable = False  # meaningful once complete

    @property
    def complete(self) -> bool:
        return self._state == _DONE

    @property
    def started(self) -> bool:
        """True once any byte of the response has arrived."""
        return self.head is not None or bool(self._pending) or self.informational > 0

    def feed(self, view: memoryview) -> bool:
        state = self._state
        if state == _LENGTH:
            # The hot path: a slice of the receive buffer, straight through.
            size = len(view)
            remaining = self._remaining
            if size < remaining:
                self._remaining = remaining - size
                self.received += size
                self._on_body(view)
                return False
            if size > remaining:
                self.reusable = False
                view = view[:remaining]
            self._remaining = 0
            self.received += remaining
            if remaining:
                self._on_body(view)
            self._state = _DONE
            return True
        if state == _HEAD:
            return self._feed_head(view)
        if state == _CHUNKED:
            return self._feed_chunked(view)
        if state == _UNTIL_CLOSE:
            self.received += len(view)
            self._on_body(view)
            return False
        # _DONE: anything more is junk after the response.
        if len(view):
            self.reusable = False
        return True

    def feed_eof(self) -> bool:
        state = self._state
        if state == _DONE:
            return True
        if state == _UNTIL_CLOSE:
            self._state = _DONE
            self.reusable = False
            return True
        if state == _HEAD and not self.started:
            raise ConnectionClosed()
        if state == _HEAD:
            raise TransferError(ErrorCode.TRUNCATED, "connection closed inside the response head")
        if state == _LENGTH:
            raise TransferError(
                ErrorCode.TRUNCATED,
                f"connection closed after {self.received} of "
                f"{self.received + self._remaining} body bytes",
            )
        raise TransferError(
            ErrorCode.TRUNCATED,
            f"connection closed before the last chunk ({self.received} bytes received)",
        )

    # -- head -----------------------------------------------------------------

    def _feed_head(self, view: memoryview) -> bool:
        if not self._pending:
            # The usual case: the whole head is in the first few hundred bytes
            # of this segment.  Copy just that much and parse it from there.
            probe = bytes(view[:_FIRST_PROBE])
            end = probe.find(b"\r\n\r\n")
            if end >= 0:
                head_len = end + 4
                head = self._parse_head(probe[:head_len])
                view = view[head_len:]
                if head is not None:
                    return self._start_body(head, view)
                if not len(view):
                    return False
        while True:
            pending = self._pending
            old = len(pending)
            # Look at a small probe first: the head almost always ends inside it,
            # and only the probe is copied; the body stays in the caller's buffer.
            taken = min(len(view), _HEAD_PROBE)
            pending += view[:taken]
            end = pending.find(b"\r\n\r\n", max(0, old - 3))
            if end < 0 and taken < len(view):
                room = MAX_HEADER_BYTES + 4 - len(pending)
                if room > 0:
                    more = min(len(view) - taken, room)
                    pending += view[taken : taken + more]
                    taken += more
                    end = pending.find(b"\r\n\r\n", max(0, old - 3))
            if end < 0:
                if len(pending) > MAX_HEADER_BYTES:
                    raise ProtocolError(f"response head is larger than {MAX_HEADER_BYTES} bytes")
                return False
            head_len = end + 4
            if head_len > MAX_HEADER_BYTES:
                raise ProtocolError(f"response head is larger than {MAX_HEADER_BYTES} bytes")
            head = self._parse_head(pending[:head_len])  # a copy: the rare slow path
            pending.clear()
            view = view[head_len - old :]
            if head is None:  # a 1xx interim response: the real one follows
                if not len(view):
                    return False
                continue
            return self._start_body(head, view)

    def _parse_head(self, block: bytes | bytearray) -> ResponseHead | None:
        """Parse one whole header block (it ends with the blank line)."""
        # Lines, not distinct names: repeated fields count too.  The status
        # line and the blank line make two of them.
        if block.count(b"\n") - 2 > MAX_HEADER_FIELDS:
            raise ProtocolError(f"response has more than {MAX_HEADER_FIELDS} header fields")
        collector = _Callbacks()
        parser = httptools.HttpResponseParser(collector)
        try:
            parser.feed_data(block)
        except httptools.HttpParserError as exc:
            raise ProtocolError(f"malformed response head: {exc}") from None
        headers = collector.headers
        status = parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                raise ProtocolError("unexpected 101 Switching Protocols")
            self.informational += 1
            if self.informational > MAX_INFORMATIONAL:
                raise ProtocolError(f"more than {MAX_INFORMATIONAL} interim 1xx responses")
            return None
        # llhttp has already checked the framing fields (one Content-Length, all
        # digits, not together with Transfer-Encoding); here we only read them.
        content_length = headers.get(b"Content-Length")  # the spelling nearly all use
        transfer_encoding = None
        if content_length is None:
            for name, value in headers.items():
                size = len(name)
                if size == 14 and name.lower() == b"content-length":
                    content_length = value
                elif size == 17 and name.lower() == b"transfer-encoding":
                    transfer_encoding = value
        chunked = False
        length: int | None = None
        if transfer_encoding is not None:
            chunked = transfer_encoding.lower().split(b",")[-1].strip() == b"chunked"
        elif content_length is not None:
            length = int(content_length)
        head = ResponseHead(status, headers, length, chunked, parser.should_keep_alive())
        if chunked:
            self._llhttp = parser
            self._chunk_state = collector
        return head

    def _start_body(self, head: ResponseHead, rest: memoryview) -> bool:
        self.head = head
        self.reusable = head.keep_alive
        self._on_head(head)
        if head.status in (204, 304) or (head.content_length == 0 and not head.chunked):
            self._state = _DONE
            if len(rest):
                self.reusable = False
            return True
        if head.chunked:
            self._state = _CHUNKED
            assert self._chunk_state is not None
            self._chunk_state.body_sink = self._count_body
            return self._feed_chunked(rest) if len(rest) else False
        if head.content_length is not None:
            self._state = _LENGTH
            self._remaining = head.content_length
        else:
            self._state = _UNTIL_CLOSE
            self.reusable = False
        return self.feed(rest) if len(rest) else False

    # -- chunked --------------------------------------------------------------

    def _count_body(self, body: memoryview | bytes) -> None:
        self.received += len(body)
        self._on_body(body)

    def _feed_chunked(self, view: memoryview) -> bool:
        llhttp, state = self._llhttp, self._chunk_state
        assert llhttp is not None and state is not None
        try:
            llhttp.feed_data(view)
        except httptools.HttpParserCallbackError as exc:
            if not state.extra:
                # Our own body sink failed (disk full, too large...): surface
                # that error, not llhttp's wrapper around it.
                cause = exc.__context__
                if isinstance(cause, Exception):
                    raise cause from None
                raise ProtocolError(f"chunked body: {exc}") from None
        except httptools.HttpParserError as exc:
            raise ProtocolError(f"malformed chunked body: {exc}") from None
        if state.complete:
            self._state = _DONE
            if state.extra:
                self.reusable = False
            return True
        return False


class ConnectResponseParser(ResponseParser):
    """A proxy's answer to ``CONNECT``: the head only (RFC 9110, 9.3.6).

    After a 2xx head the connection is a tunnel, so nothing that follows is a
    body: ``feed`` returns True at the end of the head and :attr:`extra` counts
    the bytes that came with it.  Those already belong to the tunnel (for TLS,
    where the client speaks first, there can be none).  After any other status
    the connection is closed, so a body is never read.
    """

    __slots__ = ("extra",)

    def __init__(self) -> None:
        super().__init__(_ignore, _ignore)
        self.extra = 0

    def _start_body(self, head: ResponseHead, rest: memoryview) -> bool:
        self.head = head
        self.extra = len(rest)
        self.reusable = False
        self._state = _DONE
        return True


def _ignore(_: object) -> None:
    pass


def build_request(target: str, host: str, extra_headers: bytes) -> bytes:
    """The bytes of a GET request.  ``extra_headers`` is CRLF-terminated lines."""
    return b"".join(
        (
            b"GET ",
            target.encode("ascii"),
            b" HTTP/1.1\r\nHost: ",
            host.encode("idna") if not host.isascii() else host.encode("ascii"),
            b"\r\n",
            extra_headers,
            b"\r\n",
        )
    )
