"""Reading one HTTP/1.1 response at a time, with the body passed through untouched.

Theory of operation
-------------------
llhttp (through httptools) reads every response head: we never interpret a
status line or a field's syntax ourselves.  What we *do* own is where the bytes
go, because that is the hot path of the whole product, and how far we bend for
servers that break the rules, because a download tool is judged by the files it
gets.  curl is the yardstick: ``tests/test_curl_replies.py`` replays replies
from curl's own test suite and checks that we save what curl saves, byte for
byte, or fail where it fails.

* **Head.**  Bytes are gathered until the empty line that ends the head (at
  most :data:`MAX_HEADER_BYTES`).  The empty line, and the line before it, may
  end in CRLF or in a bare LF (RFC 9112 section 2.2: a recipient MAY take a
  single LF as a line end; curl, browsers and aiohttp do), so :func:`head_end`
  looks for ``LF CRLF`` and ``LF LF``; line ends before the status line (a
  server's stray CRLF after an earlier response) are skipped first, as llhttp
  skips them, so they never end a head.  The head goes to a fresh, *strict*
  ``httptools.HttpResponseParser``, which checks it thoroughly (no NUL, no bare
  CR, a valid status line and field names, one Content-Length...).  Nearly
  every server passes and pays nothing for the rest of this paragraph (the
  first look even searches only for CRLFCRLF: a strict reading refuses any bare
  LF, so when it accepts the block, that was the end).  A head llhttp refuses
  goes to :func:`swarmget.protocol.head.repair`, which undoes what RFC 9112
  lets a recipient undo -- bare LF line ends, obs-fold, whitespace lines after
  the status line, a Content-Length repeated with one value -- and llhttp reads
  the result again with a single leniency, ``lenient_chunked_length``
  (Transfer-Encoding together with Content-Length: Transfer-Encoding wins, RFC
  9112 section 6.3, and the connection is not reused).  We use no other flag
  for heads: ``lenient_headers`` would also let NUL and control bytes through,
  and the line-end flags are not needed once the head is rewritten.  Whatever
  llhttp still refuses, and any exception at all that comes out of it, is a
  :class:`ProtocolError`.  We add the limits llhttp does not have: head size,
  number of fields, how many ``1xx`` interim responses we sit through; a
  ``101`` is a :class:`ProtocolError` (we never ask to switch protocols), and
  so are two ``Location`` fields that differ (curl, Chrome and Firefox refuse
  them too: which target would be meant?).
* **Body framed by Content-Length, or by the connection closing.**  llhttp is
  not involved: the parser hands ``memoryview`` slices of the caller's receive
  buffer straight to the ``on_body`` callback, so a 50 KB image travels from
  ``recv_into`` to ``os.write`` without a single copy.
* **Chunked body.**  :class:`_ChunkReader` reads the chunk framing by curl's
  rules, and hands the chunks' data on as slices of the input (no copy).
  llhttp read it until this session, but it refuses mid-body what curl and
  RFC 9112 accept (a bare LF after a later chunk size, ``6; a=b``, odd trailer
  fields), with no way to hand over where it stopped: a body that failed after
  most of it had come.  One reader gives one verdict, whatever the head
  looked like.  It costs about 0.4 us a chunk more than llhttp's C (compiled;
  less than llhttp's copy of the data for chunks of 8 KiB and more).
* **Other transfer codings** (``gzip``, ``deflate``) are undone by
  :class:`swarmget.protocol.codings.Decoder`, bounded by ``max_decoded``; an
  unknown one, or ``chunked`` anywhere but last, is a :class:`ProtocolError`:
  never a file saved still encoded.  (Content-Encoding is not framing: we ask
  for ``identity`` and save what comes, as curl does without ``--compressed``.)

One response per parser: the connection creates a new :class:`ResponseParser`
for each request (that costs about a microsecond).  Bytes that arrive after a
complete response are never a next response (we do not pipeline), so they make
the connection unusable: :attr:`ResponseParser.reusable` turns False.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Final

import httptools

from swarmget.engine.urls import hide_userinfo
from swarmget.errors import ErrorCode, ProtocolError, TransferError
from swarmget.protocol.codings import Decoder, plan_codings
from swarmget.protocol.head import MAX_CONTENT_LENGTH, repair, transfer_codings

# curl's limit on a response head (MAX_HTTP_RESP_HEADER_SIZE); heads with many
# cookies or long CSP fields run past 64 KiB, which we refused, and curl reads.
MAX_HEADER_BYTES: Final = 300 * 1024
# Limits of our own (curl has none): they bound the work a hostile head makes.
MAX_HEADER_FIELDS: Final = 1000
MAX_INFORMATIONAL: Final = 100
# The first look for the end of the head copies at most this much of the
# segment; typical heads are a few hundred bytes and the rest is body.
_HEAD_PROBE: Final = 8192
_FIRST_PROBE: Final = 1024  # the first look, when nothing is pending: most heads fit
# A chunk-size line, extensions included: curl sets no limit of its own; this
# only bounds what one line may hold in memory.
_MAX_CHUNK_LINE: Final = 65536
_LINE_PROBE: Final = 256  # how much is copied at a time to find a chunk line's end

_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _DONE = range(5)
# _ChunkReader states: a size line, data, the line end after data, trailer lines.
_SIZE, _DATA, _DATA_END, _TRAILER, _END = range(5)
_HEX: Final = b"0123456789abcdefABCDEF"
_SIZE_PROBE: Final = 24  # CRLF, 16 hex digits, CRLF: a size line without extensions

BodyCallback = Callable[[memoryview | bytes], None]
HeadCallback = Callable[["ResponseHead"], None]


def head_end(data: bytes | bytearray, start: int = 0) -> int:
    """Where the head in ``data`` ends (just past its empty line), or -1 if not yet.

    The empty line is CRLF or a bare LF, after a line ended by either: so the
    head ends at the first ``LF CRLF`` or ``LF LF``, whichever comes first.
    Failing both, at ``LF CR CR LF`` (more CRs too): the lines of a head
    written as ``CR CR LF``, as a Windows text-mode CGI writes CRLF.
    ``start`` is where to begin looking (a line end found before it is not
    looked at again).
    """
    crlf = data.find(b"\n\r\n", start)
    lf = data.find(b"\n\n", start, crlf + 2 if crlf >= 0 else len(data))
    found = lf + 2 if lf >= 0 else crlf + 3 if crlf >= 0 else -1
    limit = found if found >= 0 else len(data)
    # An empty line of two or more CRs ends in CR CR LF, three bytes wholly at
    # or after ``start - 2`` if its LF came after the last look: so each is
    # found once however the head arrives in pieces (no rescanning of CR runs).
    at = data.find(b"\r\r\n", max(0, start - 2), limit)
    while at >= 0:
        line_start = data.rfind(b"\n", 0, at) + 1
        # A line of CRs only, after another line (not the status line).
        if line_start and data.count(b"\r", line_start, at + 2) == at + 2 - line_start:
            return at + 3
        at = data.find(b"\r\r\n", at + 1, limit)
    return found


def _check_locations(block: bytes | bytearray) -> None:
    """Refuse a head with two Location fields that disagree.

    Which one would be meant?  curl (its test 772), Chrome
    (``ERR_RESPONSE_HEADERS_MULTIPLE_LOCATION``) and Firefox all refuse such a
    response, whatever its status, and so do we: following either target, or
    saving a body the server framed so oddly, could be the wrong file.  The same
    value repeated is one value.  Called only when a cheap count of the raw head
    finds the name more than once.
    """
    values = set()
    for line in bytes(block).split(b"\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.lower() == b"location":
            values.add(value.strip(b" \t\r"))
    if len(values) > 1:
        # Each without its user:password (a message goes to the manifest and the
        # terminal), then cut: a cut first could leave a password with no "@"
        # to recognise it by.
        shown = [hide_userinfo(value.decode("latin-1"))[:60] for value in sorted(values)]
        raise ProtocolError(f"conflicting Location headers: {', '.join(shown)}")


def _check_status_start(pending: bytes | bytearray) -> None:
    """Refuse a reply whose first bytes cannot begin an HTTP/1.x status line (an
    SSH banner, an HTTP/0.9 body, another protocol): waiting for its head to end,
    or retrying it as cut short, cannot turn it into one (curl: "Received
    HTTP/0.9 when not allowed")."""
    start = bytes(pending[:16]).lstrip(b"\r\n")[:5].upper()  # curl: any case
    if start and not _STATUS_START.startswith(start):
        line = bytes(pending).lstrip(b"\r\n").split(b"\n", 1)[0][:40]
        if len(pending) >= 4 and pending[0] == 0 and pending[1] == 0 and pending[3] == 4:
            # A frame header (a 24-bit length under 256, type 4: SETTINGS), what
            # an HTTP/2 server sends first, ignoring that we asked for HTTP/1.1.
            raise ProtocolError(f"the server answered in HTTP/2, not HTTP/1.x: {line!r}")
        if _begins_tls_record(pending):
            # A TLS server behind an http:// URL: our request is no ClientHello,
            # and some servers answer it with an alert record (0x15) before closing.
            raise ProtocolError(
                f"the server answered in TLS, not plain HTTP (is it an https:// server?): {line!r}"
            )
        raise ProtocolError(f"not an HTTP/1.x reply: {line!r}")


_STATUS_START: Final = b"HTTP/"


def _begins_tls_record(pending: bytes | bytearray) -> bool:
    """An alert (0x15) or handshake (0x16) record header of TLS 1.x (0x03 0x00-0x04),
    as far as it came (two bytes already cannot begin "HTTP/")."""
    if len(pending) < 2 or pending[0] not in (0x15, 0x16) or pending[1] != 3:
        return False
    return len(pending) == 2 or pending[2] <= 4


class ConnectionClosed(TransferError):
    """The peer closed before sending a single byte of the response.

    On a reused keep-alive connection this usually means the server timed the
    connection out just as we sent: the engine retries such a request once on a
    fresh connection without counting an attempt.
    """

    def __init__(self, message: str = "connection closed before the response started") -> None:
        super().__init__(ErrorCode.CONNECT, message)

    def _arguments(self) -> tuple[str]:
        return (self.message,)


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


class _Fields:
    """What httptools calls for a head: only ``on_header``."""

    __slots__ = ("headers", "on_header")

    # httptools looks each callback up once per parser; a name that is missing
    # costs a raised and caught AttributeError, one that is None costs nothing.
    on_body: ClassVar[None] = None
    on_chunk_complete: ClassVar[None] = None
    on_chunk_header: ClassVar[None] = None
    on_headers_complete: ClassVar[None] = None
    on_message_begin: ClassVar[None] = None
    on_message_complete: ClassVar[None] = None
    on_status: ClassVar[None] = None

    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        # llhttp calls this once per field, from C.  The dict's own __setitem__
        # runs no Python frame, where a method cost one per field (~1 us of
        # the ~7 us a whole 50 KB response used to cost us).
        self.on_header = self.headers.__setitem__


class _Framing:
    """How the body of a head is delimited, read from its framing fields."""

    __slots__ = ("chunked", "codings", "length", "reusable")

    def __init__(self) -> None:
        self.chunked = False
        self.codings: list[bytes] = []  # transfer codings to undo, besides chunked
        self.length: int | None = None
        self.reusable = True


def _framing(
    block: bytes | bytearray,
    lowered: bytes | bytearray,
    headers: dict[bytes, bytes],
    repaired: bool,
) -> _Framing:
    """The body framing of a head llhttp accepted (so its Content-Length is one
    number); ``lowered`` is ``block`` in lower case."""
    framing = _Framing()
    content_length = headers.get(b"Content-Length")  # the spelling nearly all use
    transfer_encoding: bytes | None = None
    # llhttp refuses Content-Length with Transfer-Encoding unless repaired.
    if content_length is None or repaired:
        for name, value in headers.items():
            size = len(name)
            if size == 14 and name.lower() == b"content-length":
                content_length = value
            elif size == 17 and name.lower() == b"transfer-encoding":
                transfer_encoding = value
    if transfer_encoding is None:
        if content_length is not None:
            framing.length = _length(content_length)
        return framing
    # Transfer-Encoding overrides Content-Length (RFC 9112 section 6.3), and a
    # reply with both is not one to keep a connection for.
    framing.reusable = content_length is None
    # One field, however its name is spelt (two may differ in case only, and
    # the dict holds them apart: the last one seen is not the whole story).
    if transfer_encoding == b"chunked" and lowered.count(b"transfer-encoding") == 1:
        framing.chunked = True  # the usual case: one field, one coding
        return framing
    framing.chunked, framing.codings = plan_codings(transfer_codings(block))
    if framing.codings and not framing.chunked:
        framing.reusable = False  # the body ends when the connection does
    if not framing.codings and not framing.chunked and content_length is not None:
        framing.length = _length(content_length)  # only identity: Content-Length frames it
    return framing


def _persistent(parser: httptools.HttpResponseParser, headers: dict[bytes, bytes]) -> bool:
    """Is the connection kept after this response (RFC 9112 9.3)?  For an empty
    body: llhttp completes that message with its head, and ``should_keep_alive()``
    answers False once a message is complete (every empty 200 or 302 cost a new
    connection, and over https a handshake)."""
    tokens = {
        token.strip()
        for name, value in headers.items()
        if name.lower() == b"connection"
        for token in value.lower().split(b",")
    }
    if b"close" in tokens:
        return False
    return parser.get_http_version() != "1.0" or b"keep-alive" in tokens


def _length(value: bytes) -> int:
    """A Content-Length llhttp has accepted (digits, maybe with whitespace) as a number."""
    try:
        length = int(value)
    except ValueError:
        raise ProtocolError(f"invalid Content-Length {value[:40]!r}") from None
    if length > MAX_CONTENT_LENGTH:  # llhttp takes up to 2**64 - 1
        raise ProtocolError(f"Content-Length {length} is too large")
    return length


class _ChunkReader:
    """The chunked framing of a body (RFC 9112 section 7.1), read as curl reads it.

    Line ends CRLF or a bare LF; 1 to 16 hex digits, then optional blanks and
    extensions (not interpreted); trailer fields read and dropped.  Chunk data
    goes to ``sink`` as slices of the input.  ``extra``: bytes came after the
    end of the body.

    Where curl 7.88 is laxer than RFC 9112 we refuse (``protocol``), on
    purpose: anything but blanks or ``;`` after the digits (``5zz``, ``5 5``:
    curl reads the 5 and skips the rest), and more than one CR before a line's
    LF (``5\r\r\n``, or after chunk data).  A size line two parsers read two
    ways is how a request is smuggled past a proxy, and a refusal never saves
    wrong bytes; no server we know of sends either.
    """

    __slots__ = (
        "_cr", "_gathered", "_line", "_remaining", "_state", "_trailer_bytes", "extra", "sink",
    )  # fmt: skip

    def __init__(self, sink: BodyCallback) -> None:
        self.extra = False
        self.sink = sink
        self._gathered: memoryview | bytearray | None = None  # chunk data for the sink
        self._state = _SIZE
        self._line = bytearray()  # a line split across segments, so far
        self._remaining = 0  # data bytes left in the current chunk
        self._cr = False  # the CR after chunk data has been seen
        self._trailer_bytes = 0

    def feed(self, view: memoryview) -> bool:
        """Read ``view``; True once the body has ended.  The data of every chunk
        in it goes to the sink in one call: small chunks (a server flushing each
        line) cost a write each, a million syscalls for 1 MB in 1-byte chunks."""
        try:
            return self._feed(view)
        finally:
            gathered = self._gathered
            if gathered is not None:
                self._gathered = None
                self.sink(gathered if isinstance(gathered, memoryview) else memoryview(gathered))

    def _gather(self, data: memoryview) -> None:
        """Hold ``data`` for the sink: the first slice as it is (one large chunk
        costs no copy), later ones copied after it."""
        gathered = self._gathered
        if gathered is None:
            self._gathered = data
        elif isinstance(gathered, bytearray):
            gathered += data
            self._gathered = gathered  # the same object; said for the compiled build's sake
        else:
            joined = bytearray(gathered)
            joined += data
            self._gathered = joined

    def _feed(self, view: memoryview) -> bool:
        pos = 0
        size = len(view)
        while pos < size:
            state = self._state
            if state == _DATA:
                take = min(self._remaining, size - pos)
                stop = pos + take
                self._gather(view[pos:stop])
                pos = stop
                self._remaining -= take
                if not self._remaining:
                    self._state = _DATA_END
                continue
            after = -1
            if state == _DATA_END or (state == _SIZE and not self._line):
                # The usual case: the line end after the data and the next size
                # line are whole in this read, read from one small copy.
                after = self._next_size(view, pos, state == _DATA_END)
                if after < 0 and state == _DATA_END:
                    pos = self._data_end(view[pos], pos)  # the general rules: a byte
                    continue
            if after < 0:  # the general rules: a line (a size, a trailer field)
                after = self._take_line(view, pos)
                if after < 0:
                    return False
                self._line_done()
            pos = after
            if self._state == _END:
                self.extra = pos < size
                return True
        return False

    def _next_size(self, view: memoryview, pos: int, data_end: bool) -> int:
        """``[CR]LF`` (after data) and a bare size line ``HEX [CR]LF``, whole in
        ``view[pos:]``: taken, returning the position after them; else -1 (and
        nothing taken)."""
        probe = bytes(view[pos : pos + _SIZE_PROBE])
        start = 0
        if data_end:
            if probe[:2] == b"\r\n" and not self._cr:
                start = 2
            elif probe[:1] == b"\n":
                start = 1
            else:
                return -1
        lf = probe.find(b"\n", start)
        if lf <= start:  # no line end here, or an empty line: the general rules
            return -1
        # An index, not probe[lf - 1 : lf]: mypyc's bytes slice takes a negative
        # start as a negative size (SystemError) where Python gives b"".
        end = lf - 1 if probe[lf - 1] == 13 else lf
        digits = probe[start:end]
        if not digits or len(digits) > 16 or digits.lstrip(_HEX):
            return -1  # extensions, spaces, junk: the general rules decide
        remaining = int(digits, 16)
        if remaining > MAX_CONTENT_LENGTH:
            return -1
        self._remaining = remaining
        self._cr = False
        self._state = _DATA if remaining else _TRAILER
        return pos + lf + 1

    def _data_end(self, byte: int, pos: int) -> int:
        """After chunk data: an optional CR, then LF."""
        if byte == 10:
            self._state = _SIZE
            self._cr = False
        elif byte == 13 and not self._cr:
            self._cr = True
        else:
            raise ProtocolError("chunk data is not followed by a line end")
        return pos + 1

    def _take_line(self, view: memoryview, pos: int) -> int:
        """Add ``view[pos:]`` up to its first LF to the line; returns past the LF or -1."""
        size = len(view)
        while pos < size:
            stop = min(size, pos + _LINE_PROBE)
            probe = bytes(view[pos:stop])
            lf = probe.find(b"\n")
            if lf >= 0:
                self._line += probe[:lf]
                return pos + lf + 1
            self._line += probe
            pos = stop
            limit = _MAX_CHUNK_LINE if self._state == _SIZE else MAX_HEADER_BYTES
            if len(self._line) + self._trailer_bytes > limit:
                raise ProtocolError("chunk-size line or trailer too long")
        return -1

    def _line_done(self) -> None:
        """A whole line has been taken (up to its LF): a chunk size or a trailer field."""
        line = bytes(self._line)
        self._line.clear()
        if self._state == _SIZE:
            self._size_line(line)
        else:
            self._trailer_line(line)

    def _size_line(self, line: bytes) -> None:
        """``1*HEXDIG [BWS] [; extensions]``, ended by LF or CRLF (curl's rules)."""
        if line.endswith(b"\r"):
            line = line[:-1]
        digits = line
        if not line or len(line) > 16 or line.lstrip(_HEX):  # more than bare digits
            digits = line.partition(b";")[0].rstrip(b" \t")
            if not digits or len(digits) > 16 or digits.lstrip(_HEX) or _bad_line(line):
                raise ProtocolError(f"invalid chunk size line {line[:40]!r}")
        self._remaining = int(digits, 16)
        if self._remaining > MAX_CONTENT_LENGTH:
            raise ProtocolError(f"chunk size {digits[:40]!r} is too large")
        self._state = _DATA if self._remaining else _TRAILER

    def _trailer_line(self, line: bytes) -> None:
        """A trailer field, read and dropped; the empty line ends the body."""
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            self._state = _END
            return
        if _bad_line(line) or (b":" not in line and line[:1] not in (b" ", b"\t")):
            raise ProtocolError(f"invalid trailer field {line[:40]!r}")
        self._trailer_bytes += len(line) + 2
        if self._trailer_bytes > MAX_HEADER_BYTES:
            raise ProtocolError(f"chunked trailer is larger than {MAX_HEADER_BYTES} bytes")


def _bad_line(line: bytes) -> bool:
    """A NUL or a CR left in a line: refused, as curl refuses them in fields (curl
    7.88 skips a chunk extension unread, NUL and CR included; we do not)."""
    return b"\r" in line or b"\x00" in line


class ResponseParser:
    """Parses one response to a GET; body bytes go to ``on_body``.

    ``feed(view)`` returns True once the response is complete.  ``feed_eof()``
    tells that the peer closed; it returns True when that completes a
    close-delimited body and raises :class:`TransferError` (``truncated``) or
    :class:`ConnectionClosed` otherwise.  Any malformed input raises
    :class:`ProtocolError`; nothing else escapes except what the callbacks
    raise.  ``max_decoded`` bounds a body with a transfer coding to undo
    (``gzip``...): past that many decoded bytes ``feed`` raises ``too_large``.
    """

    __slots__ = (
        "_chunks",
        "_codings",
        "_decoder",
        "_head_len",
        "_line_ends",
        "_max_decoded",
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

    def __init__(
        self, on_head: HeadCallback, on_body: BodyCallback, max_decoded: int | None = None
    ) -> None:
        self._on_head = on_head
        self._on_body = on_body
        self._max_decoded = max_decoded
        self._state = _HEAD
        self._pending = bytearray()
        self._remaining = 0
        self._chunks: _ChunkReader | None = None
        self._codings: list[bytes] | None = None  # transfer codings to undo
        self._decoder: Decoder | None = None
        self._head_len = 0  # how much of the last block _parse_head was given is the head
        self._line_ends = 0  # CRs and LFs skipped before status lines (_skip_line_ends)
        self.head: ResponseHead | None = None
        self.informational = 0  # 1xx responses skipped so far
        self.received = 0  # body bytes received (before undoing any transfer coding)
        self.reusable = False  # meaningful once complete

    @property
    def complete(self) -> bool:
        return self._state == _DONE

    @property
    def announced(self) -> int | None:
        """The body's length while a Content-Length body is read (None otherwise),
        for messages that say how much of it came."""
        return self.received + self._remaining if self._state == _LENGTH else None

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

    def proves_its_end(self) -> bool:
        """Does a body that ends with the connection carry its own end (a gzip or
        deflate transfer coding whose stream has ended)?  Then a TLS connection
        closed without close_notify did not cut it (https.py)."""
        decoder = self._decoder
        return self._state == _UNTIL_CLOSE and decoder is not None and decoder.complete

    def feed_eof(self) -> bool:
        state = self._state
        if state == _DONE:
            return True
        if state == _UNTIL_CLOSE:
            self._finish_decoding(ErrorCode.TRUNCATED)
            self._state = _DONE
            self.reusable = False
            return True
        if state == _HEAD and not self.started:
            raise ConnectionClosed()
        if state == _HEAD:
            _check_status_start(self._pending)
            raise TransferError(ErrorCode.TRUNCATED, "connection closed inside the response head")
        if state == _LENGTH:
            raise TransferError(
                ErrorCode.TRUNCATED,
                f"connection closed after {self.received} of {self.announced} body bytes",
            )
        raise TransferError(
            ErrorCode.TRUNCATED,
            f"connection closed before the last chunk ({self.received} bytes received)",
        )

    # -- head -----------------------------------------------------------------

    def _feed_head(self, view: memoryview) -> bool:
        if not self._pending:
            view = self._skip_line_ends(view)
            if not len(view):
                return False
            # The usual case: the whole head is in the first few hundred bytes
            # of this segment.  Copy just that much and parse it from there.
            # A CRLF head ends at the first CRLFCRLF: llhttp's strict reading
            # refuses any bare LF, so when it accepts the block, that was the end
            # (else _parse_head looks again, for LF ends too).
            probe = bytes(view[:_FIRST_PROBE])
            crlf = probe.find(b"\r\n\r\n")
            head_len = crlf + 4 if crlf >= 0 else head_end(probe)
            if head_len >= 0:
                head = self._parse_head(probe[:head_len])
                view = view[self._head_len :]
                if head is not None:
                    return self._start_body(head, view)
                if not len(view):
                    return False
        while True:
            pending = self._pending
            old = len(pending)
            if not old:
                view = self._skip_line_ends(view)  # before the head that follows a 1xx
                if not len(view):
                    return False
            # Look at a small probe first: the head almost always ends inside it,
            # and only the probe is copied; the body stays in the caller's buffer.
            taken = min(len(view), _HEAD_PROBE)
            pending += view[:taken]
            head_len = head_end(pending, max(0, old - 3))
            if head_len < 0 and taken < len(view):
                room = MAX_HEADER_BYTES + 4 - len(pending)
                if room > 0:
                    more = min(len(view) - taken, room)
                    pending += view[taken : taken + more]
                    taken += more
                    head_len = head_end(pending, max(0, old - 3))
            if head_len < 0:
                if len(pending) > MAX_HEADER_BYTES:
                    raise ProtocolError(f"response head is larger than {MAX_HEADER_BYTES} bytes")
                _check_status_start(pending)
                return False
            if head_len > MAX_HEADER_BYTES + 4:
                raise ProtocolError(f"response head is larger than {MAX_HEADER_BYTES} bytes")
            head = self._parse_head(pending[:head_len])  # a copy: the rare slow path
            pending.clear()
            view = view[head_len - old :]
            if head is None:  # a 1xx interim response: the real one follows
                if not len(view):
                    return False
                continue
            return self._start_body(head, view)

    def _skip_line_ends(self, view: memoryview) -> memoryview:
        """``view`` past the CRs and LFs before a status line: empty lines a server
        sent after an earlier response (or a 1xx), which llhttp skips too.  Kept
        in the head, they ended it (``head_end`` found their LF LF): the same
        reply was read when it came in one piece and refused when split.  They
        count towards the head's size limit."""
        size = len(view)
        skipped = 0
        while skipped < size and view[skipped] in (10, 13):
            skipped += 1
        if not skipped:
            return view
        self._line_ends += skipped
        if self._line_ends > MAX_HEADER_BYTES:
            raise ProtocolError(f"more than {MAX_HEADER_BYTES} bytes of empty lines, no response")
        return view[skipped:]

    def _parse_head(self, block: bytes | bytearray) -> ResponseHead | None:
        """Parse the head ``block`` ends with; None for a 1xx.  Sets ``_head_len``.

        ``block`` runs to the first CRLFCRLF, or to its real end (:func:`head_end`):
        if llhttp refuses it as it is, the real end is looked for, and the head
        (only as long as that) is repaired and read again.
        """
        fields = _Fields()
        parser = httptools.HttpResponseParser(fields)
        repaired = False
        try:
            parser.feed_data(block)
            self._head_len = len(block)
            if block.startswith(b"HTTP/2.0"):
                # llhttp reads the version; we read such a head as HTTP/1.0 (head.py).
                raise ValueError("HTTP/2.0 in an HTTP/1.1 reply")
        except Exception as exc:  # llhttp's errors, and HttpParserUpgrade for a 101
            end = head_end(block)
            if 0 <= end < len(block):
                block = block[:end]  # an LF head ended before the CRLFCRLF we found
            self._head_len = len(block)
            parser, fields, block = _reread(parser, block, exc)
            repaired = True
        if not block.startswith(b"HTTP/1.") and not block.lstrip(b"\r\n").startswith(b"HTTP/1."):
            # llhttp also reads RTSP/1.0, ICE/1.0 and HTTP/0.9 status lines: not
            # an HTTP/1.x reply to our request (curl refuses them too).
            line = bytes(block.lstrip(b"\r\n").split(b"\n", 1)[0][:40])
            raise ProtocolError(f"not an HTTP/1.x status line: {line!r}")
        if b"\x00" in block:  # llhttp lets one through in a reason phrase; curl does not
            raise ProtocolError("NUL byte in the response head")
        # Lines, not distinct names: repeated fields count too.  The status
        # line and the empty line make two of them.
        if block.count(b"\n") - 2 > MAX_HEADER_FIELDS:
            raise ProtocolError(f"response has more than {MAX_HEADER_FIELDS} header fields")
        status = parser.get_status_code()
        if status < 100:  # "000", "099": no class to read it by (RFC 9110 15)
            raise ProtocolError(f"invalid status code {status:03d}")
        if 100 <= status < 200:
            self._interim(status)
            return None
        headers = fields.headers
        lowered = block.lower()  # names in any spelling (two may differ in case only)
        if lowered.count(b"location:") > 1:
            _check_locations(block)
        content_length = headers.get(b"Content-Length")  # the spelling nearly all use
        if content_length is not None and not repaired:
            # The usual case.  llhttp has checked that the value is one number,
            # and that there is no Transfer-Encoding with it.
            length = _length(content_length)
            keep_alive = parser.should_keep_alive() if length else _persistent(parser, headers)
            return ResponseHead(status, headers, length, False, keep_alive)
        framing = _framing(block, lowered, headers, repaired)
        self._codings = framing.codings
        if framing.length == 0:
            keep_alive = framing.reusable and _persistent(parser, headers)
        else:
            keep_alive = framing.reusable and bool(parser.should_keep_alive())
        return ResponseHead(status, headers, framing.length, framing.chunked, keep_alive)

    def _interim(self, status: int) -> None:
        """A 1xx: skipped (the final response follows), unless it is a 101."""
        if status == 101:
            # We never ask to switch protocols; llhttp would hand us the connection.
            raise ProtocolError("unexpected 101 Switching Protocols")
        self.informational += 1
        if self.informational > MAX_INFORMATIONAL:
            raise ProtocolError(f"more than {MAX_INFORMATIONAL} interim 1xx responses")

    def _start_body(self, head: ResponseHead, rest: memoryview) -> bool:
        self.head = head
        self.reusable = head.keep_alive
        self._on_head(head)
        if head.status in (204, 304) or (head.content_length == 0 and not head.chunked):
            self._state = _DONE
            if len(rest):
                self.reusable = False
            return True
        if self._codings:
            decoder = Decoder(self._codings, self._on_body, self._max_decoded)
            self._decoder = decoder
            self._on_body = decoder.write
        if head.chunked:
            self._state = _CHUNKED
            self._chunks = _ChunkReader(self._count_body)
            return self._feed_chunked(rest) if len(rest) else False
        if head.content_length is not None:
            self._state = _LENGTH
            self._remaining = head.content_length
        else:
            self._state = _UNTIL_CLOSE
            self.reusable = False
        return self.feed(rest) if len(rest) else False

    # -- chunked and coded bodies ------------------------------------------------

    def _count_body(self, body: memoryview | bytes) -> None:
        self.received += len(body)
        self._on_body(body)

    def _feed_chunked(self, view: memoryview) -> bool:
        chunks = self._chunks
        assert chunks is not None
        if not chunks.feed(view):
            return False
        self._finish_decoding(ErrorCode.PROTOCOL)
        self._state = _DONE
        if chunks.extra:
            self.reusable = False  # bytes after the response
        return True

    def _finish_decoding(self, code: str) -> None:
        decoder = self._decoder
        if decoder is not None:
            decoder.finish(code)


def _reread(
    refused: httptools.HttpResponseParser, block: bytes | bytearray, error: Exception
) -> tuple[httptools.HttpResponseParser, _Fields, bytes]:
    """llhttp's second reading of a head it refused, repaired; ProtocolError if no good."""
    if refused.get_status_code() == 101:
        raise ProtocolError("unexpected 101 Switching Protocols")
    repaired = _repair(block, str(error) or type(error).__name__)
    fields = _Fields()
    parser = httptools.HttpResponseParser(fields)
    try:
        parser.set_dangerous_leniencies(lenient_chunked_length=True)
        parser.feed_data(repaired)
    except Exception as exc:
        if parser.get_status_code() == 101:
            raise ProtocolError("unexpected 101 Switching Protocols") from None
        raise ProtocolError(f"malformed response head: {exc}") from None
    return parser, fields, repaired


def _repair(block: bytes | bytearray, error: str) -> bytes:
    """``block`` as :func:`swarmget.protocol.head.repair` rewrites it, errors ours."""
    try:
        return repair(block)
    except ProtocolError:
        raise
    except Exception:  # a block too broken to even split: llhttp's word stands
        raise ProtocolError(f"malformed response head: {error}") from None


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
